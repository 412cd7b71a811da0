"""Chapter 14 (protein case study): the packing speedup, the padding share at a long crop, the Matthews
correlation coefficient. Measurements are the page's (CPU preset, chapter 14's proteins), fixed: the baseline's
padding share and the interleaved rate ratio as printed, ``padded_share_by_crop``'s count at crop 2,048 (a count,
deterministic, computed once from the data set and fixed here, so that no row needs the data)."""

import math

import numpy as np

from answer_tables import Table, Wrong
from gpuformer_lib.exercises import proteins

# exercise 14.1: long_pad, the padded batches' padding share at a crop of 512 (the page printed 34.3 %), and the
# interleaved rate ratio the book run measured there; at the table's crop of 128 (a share of 0.045) one plus the
# share and "no gain" lay within rounding of the right answer and passed
PADDED, MEASURED_RATIO = 0.3429145805781221, 1.54
PACKING = 1 / (1 - PADDED)


def grade_packing(answer):
    return proteins.check_packing_prediction(answer, lambda: MEASURED_RATIO, padding_share=PADDED)


# exercise 14.2: split.train of chapter 14's proteins (17,643 of them, median 348 residues, mean 459, longest
# 8,080), crop 2,048, random batches of 32: padded_share_by_crop counts 0.7229; the solution's
# 1 - mean(min(L + 1, 2048)) / 2048 gives 0.7817 (mean real length 447.1); the page's median over all proteins is 347
MEASURED_PADDING, SOLUTION_PADDING, CROP = 0.7228754660493456, 0.781715255120657, 2048
MEDIAN, MEAN, LONGEST = 347, 459.241285495664, 8080


def grade_padding(answer):
    return proteins.check_padding_prediction(answer, MEASURED_PADDING, crop=CROP)


def solution_mcc(tp, tn, fp, fn):
    """The notebook's solution cell."""
    den = ((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)) ** 0.5
    return 0.0 if den == 0 else (tp * tn - fp * fn) / den


def numpy_mcc(tp, tn, fp, fn):
    num = np.float64(tp) * tn - np.float64(fp) * fn
    den = np.sqrt(np.float64(tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return np.float64(0.0) if den == 0 else num / den


def float32_mcc(tp, tn, fp, fn):
    """The formula in torch's default dtype, float32: right, within float32's rounding."""
    import torch

    tp, tn, fp, fn = (torch.tensor(float(v)) for v in (tp, tn, fp, fn))
    den = torch.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return 0.0 if den == 0 else (tp * tn - fp * fn) / den


def no_guard(tp, tn, fp, fn):
    return (tp * tn - fp * fn) / ((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)) ** 0.5


def no_square_root(tp, tn, fp, fn):
    den = (tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)
    return 0.0 if den == 0 else (tp * tn - fp * fn) / den


def nan_on_empty_margin(tp, tn, fp, fn):
    den = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return math.nan if den == 0 else (tp * tn - fp * fn) / den


TABLES = [
    Table(
        "check_packing_prediction", grade_packing,
        right=(PACKING, round(PACKING, 2), 1.52),
        wrong=(Wrong("the real share, below 1 (the review's inverted 0.955 at crop 128)", 1 - PADDED,
                     ("share of real slots before packing", "its inverse")),
               Wrong("packing gains nothing (the review's 1.0)", 1.0, ("gains something, not nothing",)),
               Wrong("one plus the padding share", 1 + PADDED, ("does not add the padding share",)),
               Wrong("the padding share itself", PADDED, ("That is the padding share",)),
               Wrong("one over the padding share", 1 / PADDED, ("counts the padded slots",)),
               Wrong("the gain alone", PACKING - 1, ("gain alone",)),
               Wrong("the speedup in percent", 100 * PACKING, ("ratio in percent",)),
               Wrong("not a number", None, ("Predict a number",))),
    ),
    Table(
        "check_padding_prediction", grade_padding,
        right=(SOLUTION_PADDING, round(SOLUTION_PADDING, 2), 0.75, MEASURED_PADDING),
        wrong=(Wrong("the median length (the review's 0.83)", 1 - MEDIAN / CROP,
                     ("not the median", "mean real length")),
               Wrong("padded to the longest protein of the set", 1 - MEAN / (LONGEST + 1),
                     ("at most the crop", "not to the longest protein")),
               Wrong("a percentage", 100 * SOLUTION_PADDING, ("share between 0 and 1", "not percent")),
               Wrong("the real share", 1 - SOLUTION_PADDING, ("the real share of the slots", "1 minus it")),
               Wrong("padding per real token", SOLUTION_PADDING / (1 - SOLUTION_PADDING),
                     ("between 0 and 1", "not padding per real token")),
               Wrong("the real share in percent", 100 * (1 - SOLUTION_PADDING), ("between 0 and 1", "not percent"))),
    ),
    Table(
        "check_mcc", proteins.check_mcc,
        right=(solution_mcc, numpy_mcc, float32_mcc),
        wrong=(Wrong("the accuracy", lambda tp, tn, fp, fn: (tp + tn) / (tp + tn + fp + fn), ("That is the accuracy",)),
               Wrong("the F1 score", lambda tp, tn, fp, fn: 2 * tp / (2 * tp + fp + fn) if 2 * tp + fp + fn else 0.0,
                     ("F1 score", "true negatives")),
               Wrong("no square root", no_square_root, ("not the product itself",)),
               Wrong("the sign flipped", lambda tp, tn, fp, fn: -solution_mcc(tp, tn, fp, fn), ("sign is flipped",)),
               Wrong("no 0 for an empty margin", no_guard, ("margin", "define MCC as 0")),
               Wrong("NaN for an empty margin", nan_on_empty_margin, ("margin", "define MCC as 0")),
               Wrong("the arguments in another order",
                     lambda tp, fp, tn, fn: solution_mcc(tp, tn, fp, fn), ("another order",)),
               Wrong("rounded to 4 decimals", lambda tp, tn, fp, fn: round(solution_mcc(tp, tn, fp, fn), 4),
                     ("not a rounded one",))),
    ),
]
