"""Checks for the exercises of chapter 14 (case study: protein sequences).

- :func:`check_packing_prediction`: predict-then-measure; the ratio of real residues per second between
  packed rows and padded random batches, predicted from the padding share measured for the baseline's
  batches, graded against the model 1 / (1 - padding share); ``proteins.batching_rate_ratio`` (the two
  batchings timed interleaved) is shown beside it, not graded.
- :func:`check_padding_prediction`: predict-then-measure; the padding share of random batches at a longer
  crop, predicted from the length distribution, graded against ``proteins.padded_share_by_crop`` within x1.11
  (the median length in place of the mean, a percentage, the real share: each named).
- :func:`check_mcc`: the learner's Matthews correlation coefficient from a confusion matrix (a formula
  from the text), checked against the formula on hand cases (the majority-class classifier's empty margin
  among them) and random counts; accuracy, F1, a missing square root, a flipped sign named.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from gpuformer_lib.exercises._answers import _number
from gpuformer_lib.exercises._core import CheckResult, _report, _safe_check, _try


PACKING_REL = 0.03
"""A packing prediction passes within 3 % of the model's 1 / (1 - padding share) (rounding the share)."""


def check_packing_prediction(predicted, measured=None, *, padding_share: float) -> CheckResult:
    """Grade a predicted speedup in real residues per second (packed rows over padded random batches), given
    the padding share (0-1) of the padded batches (chapter 14 asks it at a crop of 512, where padding matters:
    at its table's crop of 128 the share is so small that 1 + share and "no gain" lie within rounding of the
    right answer), against the model the chapter teaches: a step costs the
    same per slot, so packing's all-real slots do 1 / (1 - padding share) as much useful work. Graded against
    that model within rounding (:data:`PACKING_REL`), each plausible mistake named; ``measured`` (optional: a
    number, or a function that measures it once) is shown beside the model, never graded: a timing on a busy
    machine varies by more than separates the right model from the wrong ones (a x1.3 band around it passed
    wrong answers and, graded against one timing, failed right ones)."""
    from gpuformer_lib.exercises.predictions import distinct_mistakes, grade_model

    if not 0 <= padding_share < 1:
        raise ValueError(f"padding_share is a share of padded slots, 0 <= share < 1; got {padding_share!r}")
    right = 1 / (1 - padding_share)
    candidates = [
        ("one plus the padding share", 1 + padding_share,
         "Packing does not add the padding share to the rate: the same slots per step become all real, so real "
         "residues per step grow by 1 / (1 - padding share)."),
        ("the real share", 1 - padding_share,
         "That is the share of real slots before packing, below 1: the speedup is its inverse, 1 / (1 - padding)."),
        ("the padding share itself", padding_share,
         "That is the padding share; the speedup in real residues per second is 1 / (1 - padding share)."),
        ("one over the padding share", 1 / padding_share if padding_share > 0 else 0.0,
         "One over the padding share counts the padded slots, not the real ones: 1 / (1 - padding share)."),
        ("no gain at all", 1.0,
         f"Packing gains something, not nothing: with {padding_share:.1%} of the padded batches' slots padded, a "
         f"step that costs the same per slot does 1 / (1 - {padding_share:.3f}) as much useful work when packed."),
    ]
    wrong = distinct_mistakes(right, candidates, PACKING_REL)
    shown = measured() if callable(measured) else measured
    if shown is None or abs(shown / right - 1) <= PACKING_REL:
        why_close = "The model is a step whose time follows its slots: removing the padded ones is all packing does."
    elif shown < right:
        why_close = ("Here the real step gained less: the optimizer, the masks built per batch and the host do not "
                     "scale with the slots, and the document mask turns the fast causal path into a general masked "
                     "one.")
    else:
        why_close = ("Here the real step gained more than the model: the padded step cost more per slot than the "
                     "packed one on this device, so a step's time did not follow its slots exactly.")
    return grade_model(
        predicted, right, quantity="speedup of packed rows (real residues per second)", unit="x", wrong=wrong,
        rel=PACKING_REL, measured=shown, measured_by="this device measured",
        too_high=("Packing removes only the padded slots' work: real residues per step rise by 1 / (1 - padding) at "
                  "most."),
        too_low=(f"With {padding_share:.1%} of the padded batches' slots padded, only {1 - padding_share:.3f} of a "
                 f"step's slots do useful work; packed, all of them do: a step that costs the same per slot does "
                 f"1 / (1 - {padding_share:.3f}) as much useful work. Predict from the real share."),
        why_close=why_close)


PADDING_WITHIN = 1.11
"""A padding share passes within x1.11 of the measurement. The model the solution uses, 1 - mean(min(L + 1, crop))
/ crop (every batch padded to the crop), lies above the measurement (a few batches hold no protein as long as the
crop): x1.08 on chapter 14's proteins at crop 2,048, while the median-based 1 - median / crop gives x1.15 there
(the former x1.25 band passed it)."""


def check_padding_prediction(predicted, measured: float, *, crop: int) -> CheckResult:
    """Grade a predicted padding share (0-1) of random batches at ``crop`` against the one measured, within
    :data:`PADDING_WITHIN`. A percentage instead of a share, and the real share instead of the padding share, get
    the hint that names them; a prediction too high names the median length (the usual cause) and padding past
    the crop."""
    from gpuformer_lib.exercises.predictions import _positive, grade_prediction, own_result

    measured = _positive("measured", measured)
    if not measured < 1:
        raise ValueError(f"measured is a padding share, 0 < share < 1; got {measured!r}")
    within = PADDING_WITHIN
    quantity = f"padding share of random batches cropped to {crop}"
    value, hint = _number(predicted)
    if not hint and math.isfinite(value):
        if 1 < value <= 100 and 1 / within <= (value / 100) / measured <= within:
            return own_result(False, f"You predicted {value:.3g} for the {quantity}: a percentage. Predict a share "
                                     f"between 0 and 1 ({value / 100:.3g}), not percent.")
        if value >= 1:
            return own_result(False, f"You predicted {value:.3g} for the {quantity}, but a share of the slots lies "
                                     "between 0 and 1: padded slots over all slots, 1 - (mean real length) / "
                                     "(padded length); not padding per real token, and not percent.")
        if (0 < value < 1 and 1 / within <= (1 - value) / measured <= within
                and not 1 / within <= value / measured <= within):  # a share near 0.5 can be both
            return own_result(False, f"You predicted {value:.3g} for the {quantity}: that is the real share of the "
                                     f"slots, (mean real length) / (padded length); the padding share is 1 minus it, "
                                     f"{1 - value:.3g}.")
    return grade_prediction(
        predicted, measured, quantity=quantity, unit="", within=within,
        measured_by="proteins.padded_share_by_crop counted",
        too_high=("The padding share counts slots: 1 - (mean real length) / (padded length), with the mean real "
                  "length mean(min(L + 1, crop)), not the median: the long tail of long proteins pulls the mean well "
                  "above the median (a median-based share is too high). And nothing is padded past the crop: a "
                  "batch is padded to its longest member, at most the crop, not to the longest protein of the set."),
        too_low=("Padding share = 1 - (mean real length) / (padded length). Real lengths are min(length + 1, crop) "
                 "(the END token counted): with a median protein near 350 residues, most proteins are far shorter "
                 "than a long crop, while almost every batch of 32 is padded to nearly the crop."),
        why_close=("Taking every batch as padded to the crop gives 1 - mean(min(L + 1, crop)) / crop, a little above "
                   "the measurement: a few batches have no protein as long as the crop."))


MCC_ABS = 1e-6
"""An MCC passes within 1e-6 of the formula: a float32 computation (torch's default dtype) is right too."""


def _reference_mcc(tp, tn, fp, fn) -> float:
    den = ((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)) ** 0.5
    return 0.0 if den == 0 else (tp * tn - fp * fn) / den


def _mcc_mistakes(tp, tn, fp, fn) -> list[tuple[str, float | None, str]]:
    """What the usual mistakes give for one confusion matrix: (name, value or None where undefined, hint)."""
    n = tp + tn + fp + fn
    product = (tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)
    mcc = _reference_mcc(tp, tn, fp, fn)
    swapped = _reference_mcc(tp, fp, tn, fn)  # a function written as f(tp, fp, tn, fn), called as (tp, tn, fp, fn)
    return [
        ("the accuracy", (tp + tn) / n if n else None,
         "That is the accuracy, (TP + TN) / total: the share of right answers, which the majority class alone makes "
         "high. MCC correlates predictions with labels: (TP TN - FP FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN))."),
        ("the F1 score", 2 * tp / (2 * tp + fp + fn) if 2 * tp + fp + fn else None,
         "That is the F1 score, 2 TP / (2 TP + FP + FN): it never looks at the true negatives. MCC uses all four "
         "cells: (TP TN - FP FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN))."),
        ("the formula without the square root", (tp * tn - fp * fn) / product if product else None,
         "The denominator is the square root of the product of the four margins, "
         "sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)), not the product itself."),
        ("the formula with its sign flipped", -mcc if mcc else None,
         "The sign is flipped: the numerator is TP TN - FP FN (right answers' product minus wrong answers'), so a "
         "perfect classifier gives +1."),
        ("the arguments in another order", swapped if abs(swapped - mcc) > MCC_ABS else None,
         "Your function reads its arguments in another order: the check calls mcc_from_counts(tp, tn, fp, fn), in "
         "that order."),
    ]


@_safe_check
def check_mcc(mcc_from_counts: Callable[[int, int, int, int], float]) -> CheckResult:
    """``mcc_from_counts(tp, tn, fp, fn)`` -> Matthews correlation coefficient (0 when a margin is empty). The first
    case tells the usual mistakes apart (accuracy, F1, no square root, a flipped sign, the arguments in another
    order: each gets the hint that names it); the second is the majority-class classifier (every answer positive),
    whose empty margin needs the 0."""
    rng = np.random.default_rng(0)
    cases = [(30, 40, 20, 10), (30, 0, 20, 0), (10, 10, 0, 0), (0, 0, 10, 10), (5, 5, 5, 5), (50, 1, 0, 0),
             (0, 25, 0, 5)]
    cases += [tuple(int(v) for v in rng.integers(0, 50, 4)) for _ in range(20)]
    for tp, tn, fp, fn in cases:
        empty = (tp + fp) * (tp + fn) * (tn + fp) * (tn + fn) == 0
        margin_hint = (" A margin of the confusion matrix is empty here (this is a classifier that always gives the "
                       "same answer, or a test set of one class), so the denominator is 0: define MCC as 0, as "
                       "scikit-learn does.")
        got, err = _try(mcc_from_counts, tp, tn, fp, fn)
        if err:
            return _report(False, err + (margin_hint if empty else ""))
        want = _reference_mcc(tp, tn, fp, fn)
        number, bad = _number(got)
        value = None if bad else float(number)
        if value is None or not abs(value - want) <= MCC_ABS:  # a NaN is never close
            if empty:
                hint = margin_hint
            else:
                named = [h for _, v, h in _mcc_mistakes(tp, tn, fp, fn)
                         if value is not None and v is not None and abs(value - v) <= MCC_ABS]
                rounded = value is not None and abs(value - want) <= 5e-3
                hint = " " + (named[0] if named else
                              "Close, but not equal: return the value itself, not a rounded one." if rounded else
                              "MCC = (TP TN - FP FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)).")
            return _report(False, f"For TP={tp}, TN={tn}, FP={fp}, FN={fn} you gave {got!r}; expected "
                                  f"{want:.6f}.{hint}")
    return _report(True, "MCC is a correlation between labels and predictions: 1 perfect, 0 no better than chance, -1 "
                         "inverted. Unlike accuracy it stays near 0 for a classifier that always says the majority "
                         "class, whatever the class balance.")
