"""Checks for the exercises of chapter 15 (case study: stock prices and forecasting).

- :func:`check_patch_attention_prediction`: predict-then-measure; the ratio of attention's FLOPs between two
  patch lengths (the token count falls as the patch grows, attention's cost with its square), graded against
  ``forecasting.attention_flops``'s count; the notebook then measures the time ratio beside it.
- :func:`check_trailing_mean`: diagnosis; a feature that read the future (a centred moving average) rewritten
  so that a forecast made at time t uses only values before t, checked with ``forecasting.check_no_lookahead``
  and against a brute-force reference.
- :func:`check_ewma_half_life_prediction`: predict-then-measure; after how many days an EWMA of squared returns
  has given half of its weight to the past, graded against the value measured from
  ``forecasting.ewma_volatility``'s response to a single shock.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from gpuformer_lib.exercises._core import CheckResult, _report, _run_limited, _safe_check, _try


PATCH_ATTENTION_REL = 0.03
"""A predicted ratio of attention FLOPs passes within 3 % of the count (rounding: the count is (N_short / N_long)^2
exactly, the width, batch and layers cancelling)."""


def check_patch_attention_prediction(predicted, counted: float, *, short_patch: int, long_patch: int,
                                     context: int) -> CheckResult:
    """Grade a predicted ratio of attention FLOPs (patches of ``short_patch`` over patches of ``long_patch`` on a
    window of ``context`` steps) against the count, within rounding (:data:`PATCH_ATTENTION_REL`), each plausible
    mistake named: (long / short)^2, which leaves out PatchTST's padding patch (x1.09 of the count at 336 steps,
    8 and 24, inside the former x1.3 band), the token ratio not squared, the square upside down, the cube."""
    from gpuformer_lib.exercises.predictions import distinct_mistakes, grade_model
    from gpuformer_lib.forecasting import tokens_for

    n_short, n_long = tokens_for(context, short_patch), tokens_for(context, long_patch)
    tokens = f"{n_short} and {n_long} tokens here (tokens_for)"
    candidates = [
        ("(long patch / short patch)^2", (long_patch / short_patch) ** 2,
         f"That leaves out PatchTST's padding patch: a window of L steps cut into patches of P (no overlap) is "
         f"(L - P) // P + 1 patches plus the padding patch, (L - P) // P + 2 tokens, not L / P: {tokens}. "
         f"Square the ratio of the token counts, ({n_short} / {n_long})^2."),
        ("the ratio of the token counts", n_short / n_long,
         f"Attention's two matrix products cost about N^2 D each for N tokens: the ratio is the square of the token "
         f"counts' ratio, ({n_short} / {n_long})^2, not N_short / N_long."),
        ("the square upside down", (n_long / n_short) ** 2,
         "Upside down: shorter patches make more tokens and more attention FLOPs; the ratio, short patches over "
         f"long, is above 1: ({n_short} / {n_long})^2."),
        ("the cube of the token counts' ratio", (n_short / n_long) ** 3,
         f"Attention's score and weighted-sum products grow with the square of the token count, N^2 D, not its "
         f"cube: ({n_short} / {n_long})^2."),
    ]
    wrong = distinct_mistakes(counted, candidates, PATCH_ATTENTION_REL)
    return grade_model(
        predicted, counted, quantity=f"attention FLOPs, patches of {short_patch} / patches of {long_patch}", unit="x",
        wrong=wrong, rel=PATCH_ATTENTION_REL,
        too_high=("Attention's two matrix products cost about N^2 D each for N tokens: the ratio is the square of the "
                  "ratio of the token counts, and a window of L steps cut into patches of P (no overlap, plus "
                  f"PatchTST's padding patch) gives (L - P) // P + 2 tokens, not L / P: {tokens}."),
        too_low=(f"Count each patch length's tokens with the padding patch, (L - P) // P + 2 ({tokens}), and square "
                 "their ratio: attention's score and weighted-sum products cost about N^2 D each, and nothing else "
                 "(the projections, the feed-forward layers) belongs in attention's FLOPs."),
        why_close=("Attention scales with the square of the token count; the projections and the feed-forward "
                   "layers scale only linearly, so the measured time ratio of a whole layer is smaller than this "
                   "FLOP ratio, the more so the shorter the sequence."))


def _reference_trailing_mean(series: np.ndarray, t: int, k: int) -> float:
    return float(np.mean(np.asarray(series, dtype=np.float64)[t - k:t]))


TRAILING_RTOL = 1e-5
"""A trailing mean passes within a relative 1e-5 of the float64 mean (a float32 computation is right too)."""


def _trailing_hint(series: np.ndarray, t: int, k: int, got: float) -> str:
    """The mistake a wrong trailing mean made, where a usual one gives it: another statistic, or a window that
    is one value off at either end."""
    window = np.asarray(series, dtype=np.float64)[t - k:t]
    close = lambda v: np.isclose(got, v, rtol=TRAILING_RTOL, atol=TRAILING_RTOL)  # noqa: E731
    if close(np.median(window)):
        return "That is the window's median; the feature is its mean, np.mean(series[t-k:t])."
    ends = [series[t - k - 1:t - 1], series[t - k + 1:t], series[t - k - 1:t]]
    if any(close(np.mean(np.asarray(w, dtype=np.float64))) for w in ends):
        return "Check the window's ends: the k values before t, series[t-k:t], t excluded."
    return ("The feature is the plain mean of the k values before t, series[t-k:t]: no weights, no other "
            "statistic, t itself excluded.")


@_safe_check
def check_trailing_mean(trailing_mean: Callable[[np.ndarray, int, int], float]) -> CheckResult:
    """``trailing_mean(series, t, k)``: the mean of the ``k`` values strictly before time ``t``, the level a
    forecast made at ``t`` may use. Checked for look-ahead and against a brute-force mean."""
    from gpuformer_lib.forecasting import check_no_lookahead

    rng = np.random.default_rng(0)
    series = np.cumsum(rng.normal(size=200))
    for t, k in ((50, 5), (120, 24), (199, 10)):
        got, err = _try(trailing_mean, series, t, k)
        if err:
            return _report(False, err)
        try:  # calls the learner's function again, on a changed series: under the time limit too
            _, hint = _run_limited(check_no_lookahead, lambda s, when: np.asarray(trailing_mean(s, when, k),
                                                                                 dtype=np.float64), series.copy(), t)
        except AssertionError:
            return _report(False, f"At t={t} your feature changed when the values from t on were changed: it reads "
                                  "the future. A centred window (t - k/2 .. t + k/2) is what a smoothing plot uses, "
                                  "not what a forecast made at t knows; take the k values before t, series[t-k:t].")
        if hint:
            return _report(False, hint)
        want = _reference_trailing_mean(series, t, k)
        if not np.isclose(float(got), want, rtol=TRAILING_RTOL, atol=TRAILING_RTOL):
            return _report(False, f"At t={t}, k={k} the mean of series[t-k:t] is {want:.6f}, you returned "
                                  f"{float(got):.6f}. {_trailing_hint(series, t, k, float(got))}")
    return _report(True, "A feature may use only what was known when the forecast is made. Centred windows, "
                         "statistics of the whole series (a mean or standard deviation that includes the test "
                         "period) and targets shifted the wrong way all leak, and a leak makes a model look better "
                         "on paper than it can ever be in use. check_no_lookahead catches all three by changing "
                         "the future and watching the features.")


def ewma_half_life(lam: float, horizon: int = 200) -> int:
    """Days after a single shock until an EWMA of squared returns (decay ``lam``) has lost half of the shock's
    effect, measured on ``forecasting.ewma_volatility``: the first day the shock's share of the variance is at
    most half its share on the day after the shock."""
    from gpuformer_lib.forecasting import ewma_volatility

    r = np.zeros(horizon)
    r[1] = 1.0  # a quiet day, then one shock: the variance first sees it on day 2
    var = ewma_volatility(r, lam) ** 2
    first = var[2]  # (1 - lam) * shock^2
    return int(np.argmax(var[2:] <= first / 2))  # whole days: ln(1/2) / ln(lam) rounded up


EWMA_MISTAKE_REL = 0.03
"""A half-life within 3 % of a plausible mistake's value (and outside the pass band) gets that mistake's hint."""


def check_ewma_half_life_prediction(predicted, measured: float, *, lam: float) -> CheckResult:
    """Grade a predicted half-life (days) of an EWMA with decay ``lam`` against the one measured (within x1.25).
    A prediction outside that band that one plausible mistake gives (the mean age 1 / (1 - lam), the half-life of
    the volatility instead of the variance, pandas' span, half the mean age, 1 - lam as the daily decay) gets the
    hint that names it."""
    import math

    from gpuformer_lib.exercises._answers import _number
    from gpuformer_lib.exercises.predictions import grade_prediction, own_result

    within = 1.25
    quantity = f"half-life of an EWMA with decay {lam}"
    mistakes = [
        ("the mean age of the weights, 1 / (1 - lam)", 1 / (1 - lam),
         f"1 / (1 - {lam}) is the average age of the weights, longer than the half-life: each day multiplies the "
         f"weight of everything older by {lam}, so half is gone after n days when {lam}^n = 1/2, "
         f"n = ln(1/2) / ln({lam})."),
        ("the volatility's half-life", math.log(0.5) / math.log(math.sqrt(lam)),
         f"That is when the shock's effect on the volatility (a square root) has halved; the exercise asks about "
         f"its weight in the variance, which falls by {lam} a day: n = ln(1/2) / ln({lam})."),
        ("pandas' span, 2 / (1 - lam) - 1", 2 / (1 - lam) - 1,
         f"That is the span of pandas' ewm (alpha = 2 / (span + 1)), a window length, not a half-life: the weight "
         f"falls by {lam} a day, half of it gone when {lam}^n = 1/2, n = ln(1/2) / ln({lam})."),
        ("half the mean age, 1 / (2 (1 - lam))", 1 / (2 * (1 - lam)),
         f"Half the mean age is the half-life of a linear decay; the EWMA's weights decay geometrically, by {lam} a "
         f"day: n = ln(1/2) / ln({lam})."),
        ("1 - lam as the daily decay", math.log(0.5) / math.log(1 - lam),
         f"The weight falls by a factor {lam} a day, not by {1 - lam:g}: n = ln(1/2) / ln({lam})."),
    ]
    value, hint = _number(predicted)
    if not hint and math.isfinite(value) and value > 0 and not 1 / within <= value / measured <= within:
        for name, wrong, wrong_hint in mistakes:
            if wrong > 0 and abs(value / wrong - 1) <= EWMA_MISTAKE_REL:
                return own_result(False, f"You predicted {value:.3g} days for the {quantity}, which is what {name} "
                                         f"gives; ewma_volatility's response to one shock measured {measured:.3g} "
                                         f"days. {wrong_hint}")
    return grade_prediction(
        predicted, measured, quantity=quantity, unit="days", within=within,
        measured_by="ewma_volatility's response to one shock measured",
        too_high=(f"Each day multiplies the weight of everything older by {lam}; half is gone after n days when "
                  f"{lam}^n = 1/2, n = ln(1/2) / ln({lam}). 1 / (1 - {lam}) is the average age of the weights, "
                  "longer than the half-life."),
        too_low=(f"Each day multiplies the weight of everything older by {lam}, so a shock's weight is {lam}^n after "
                 f"n days: half of it is gone when {lam}^n = 1/2, n = ln(1/2) / ln({lam}) trading days."),
        why_close=(f"ln(1/2) / ln({lam}): about two weeks of trading for RiskMetrics' 0.94. That memory is why the "
                   "EWMA beats the historical mean on volatility: volatility clusters over days to weeks, and "
                   "the EWMA forgets the calm (or the storm) of last year."))
