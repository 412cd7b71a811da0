"""Chapter 15 (forecasting case study): attention's FLOPs by patch length, the look-ahead of a centred window, the
EWMA's half-life. Measurements are counts, deterministic: ``attention_flops`` on ``tokens_for``'s token counts of
the one-week window (336 half-hours), ``ewma_half_life(0.94)``.

The review's wrong answer to 15.1, (24 / 8)^2 = 9, leaves out the padding patch: it fails with the hint that says
so (issue 31), as do the other plausible mistakes of 15.1 and 15.3.
"""

import math

import numpy as np
import torch

from answer_tables import Table, Wrong
from gpuformer_lib import forecasting
from gpuformer_lib.exercises import forecasting as exercises

# exercise 15.1: the notebook's cell, on the one-week window (the width, batch and layers cancel in the ratio)
CONTEXT, SHORT, LONG = forecasting.WEEK, 8, 24
N_SHORT, N_LONG = forecasting.tokens_for(CONTEXT, SHORT), forecasting.tokens_for(CONTEXT, LONG)  # 43 and 15
COUNTED = forecasting.attention_flops(N_SHORT, 64, 32, 2) / forecasting.attention_flops(N_LONG, 64, 32, 2)


def grade_patch(answer):
    return exercises.check_patch_attention_prediction(answer, COUNTED, short_patch=SHORT, long_patch=LONG,
                                                      context=CONTEXT)


def solution_trailing_mean(series, t, k):
    """The notebook's solution cell."""
    return float(np.mean(series[t - k:t]))


# exercise 15.3
LAM = 0.94


def grade_half_life(answer):
    return exercises.check_ewma_half_life_prediction(answer, exercises.ewma_half_life(LAM), lam=LAM)


TABLES = [
    Table(
        "check_patch_attention_prediction", grade_patch,
        right=((N_SHORT / N_LONG) ** 2, round((N_SHORT / N_LONG) ** 2, 1), COUNTED),
        wrong=(Wrong("(24 / 8)^2 without the padding patch (the review's 9)", (LONG / SHORT) ** 2,
                     ("padding patch", "(L - P) // P + 2")),
               Wrong("the token ratio, not squared", N_SHORT / N_LONG, ("not N_short / N_long",)),
               Wrong("the patch lengths' ratio, not squared", LONG / SHORT, ("too low", "square their ratio")),
               Wrong("the ratio in percent", 100 * COUNTED, ("ratio in percent",)),
               Wrong("upside down", (N_LONG / N_SHORT) ** 2, ("Upside down",)),
               Wrong("the cube", (N_SHORT / N_LONG) ** 3, ("not its cube",))),
    ),
    Table(
        "check_trailing_mean", exercises.check_trailing_mean,
        right=(solution_trailing_mean, lambda s, t, k: float(np.sum(s[t - k:t]) / k),
               lambda s, t, k: torch.from_numpy(s[t - k:t]).float().mean()),  # float32, torch's default
        wrong=(Wrong("the colleague's centred window", lambda s, t, k: float(np.mean(s[t - k // 2:t + k // 2 + 1])),
                     ("reads the future", "centred window")),
               Wrong("the window includes t", lambda s, t, k: float(np.mean(s[t - k + 1:t + 1])),
                     ("reads the future", "values from t on")),
               Wrong("the whole series' mean", lambda s, t, k: float(np.mean(s)), ("reads the future",)),
               Wrong("one step too early", lambda s, t, k: float(np.mean(s[t - k - 1:t - 1])),
                     ("window's ends", "t excluded")),
               Wrong("k + 1 values", lambda s, t, k: float(np.mean(s[t - k - 1:t])), ("window's ends",)),
               Wrong("the median, not the mean", lambda s, t, k: float(np.median(s[t - k:t])), ("median",))),
    ),
    Table(
        "check_ewma_half_life_prediction", grade_half_life,
        right=(math.log(0.5) / math.log(LAM), math.ceil(math.log(0.5) / math.log(LAM)), math.log(2) / (1 - LAM)),
        wrong=(Wrong("the mean age 1 / (1 - lam)", 1 / (1 - LAM), ("average age of the weights",)),
               Wrong("1 - lam as the daily decay", math.log(0.5) / math.log(1 - LAM), ("not by 0.06",)),
               Wrong("the volatility's half-life", math.log(0.5) / math.log(math.sqrt(LAM)),
                     ("volatility (a square root)",)),
               Wrong("pandas' span", 2 / (1 - LAM) - 1, ("span of pandas' ewm",)),
               Wrong("half the mean age", 1 / (2 * (1 - LAM)), ("linear decay",))),
    ),
]
