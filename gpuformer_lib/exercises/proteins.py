"""Checks for the exercises of chapter 14 (case study: protein sequences).

- :func:`check_packing_prediction`: predict-then-measure; the ratio of real residues per second between
  packed rows and padded random batches, predicted from the padding share measured for the baseline's
  batches, graded against the model 1 / (1 - padding share); ``proteins.batching_rate_ratio`` (the two
  batchings timed interleaved) is shown beside it, not graded.
- :func:`check_padding_prediction`: predict-then-measure; the padding share of random batches at a longer
  crop, predicted from the length distribution, graded against ``proteins.padded_share_by_crop``.
- :func:`check_mcc`: the learner's Matthews correlation coefficient from a confusion matrix (a formula
  from the text), checked against ``proteins.mcc`` on hand cases and random labels.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from gpuformer_lib.exercises._core import CheckResult, _report, _safe_check, _try


PACKING_REL = 0.03
"""A packing prediction passes within 3 % of the model's 1 / (1 - padding share) (rounding the share)."""


def check_packing_prediction(predicted, measured=None, *, padding_share: float) -> CheckResult:
    """Grade a predicted speedup in real residues per second (packed rows over padded random batches), given
    the padding share (0-1) of the baseline's batches, against the model the chapter teaches: a step costs the
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
    ]
    wrong = distinct_mistakes(right, candidates, PACKING_REL)
    shown = measured() if callable(measured) else measured
    return grade_model(
        predicted, right, quantity="speedup of packed rows (real residues per second)", unit="x", wrong=wrong,
        rel=PACKING_REL, measured=shown, measured_by="this device measured",
        too_high=("Packing removes only the padded slots' work: real residues per step rise by 1 / (1 - padding) at "
                  "most."),
        too_low=(f"With {padding_share:.1%} of the baseline's slots padded, a step that costs the same per slot "
                 f"does 1 / (1 - {padding_share:.3f}) as much useful work when packed: predict from the real share."),
        why_close=("A real step gains less: the optimizer, the masks built per batch and the host do not scale with "
                   "the slots, and the document mask turns the fast causal path into a general masked one."))


def check_padding_prediction(predicted, measured: float, *, crop: int) -> CheckResult:
    """Grade a predicted padding share (0-1) of random batches at ``crop`` against the one measured."""
    from gpuformer_lib.exercises.predictions import grade_prediction

    return grade_prediction(
        predicted, measured, quantity=f"padding share of random batches cropped to {crop}", unit="", within=1.25,
        measured_by="proteins.padded_share_by_crop counted",
        too_high=("A batch is padded to its longest member, not to the crop: with short proteins only, the batch is "
                  "short. But in a batch of 32, one protein as long as the crop is likely, so the padded length is "
                  "usually the crop."),
        too_low=("Padding share = 1 - (mean real length) / (padded length). Real lengths are min(length, crop): with "
                 "a median protein near 350 residues, most proteins are far shorter than a long crop, while almost "
                 "every batch of 32 holds one protein that fills it."),
        why_close=("Taking every batch as padded to the crop gives 1 - mean(min(L, crop)) / crop, a little above the "
                   "measurement: a few batches have no protein as long as the crop."))


def _reference_mcc(tp, tn, fp, fn) -> float:
    den = ((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)) ** 0.5
    return 0.0 if den == 0 else (tp * tn - fp * fn) / den


@_safe_check
def check_mcc(mcc_from_counts: Callable[[int, int, int, int], float]) -> CheckResult:
    """``mcc_from_counts(tp, tn, fp, fn)`` -> Matthews correlation coefficient (0 when a margin is empty)."""
    rng = np.random.default_rng(0)
    cases = [(10, 10, 0, 0), (0, 0, 10, 10), (5, 5, 5, 5), (50, 1, 0, 0), (30, 40, 20, 10)]
    cases += [tuple(int(v) for v in rng.integers(0, 50, 4)) for _ in range(20)]
    for tp, tn, fp, fn in cases:
        got, err = _try(mcc_from_counts, tp, tn, fp, fn)
        if err:
            return _report(False, err)
        want = _reference_mcc(tp, tn, fp, fn)
        if got is None or abs(float(got) - want) > 1e-9:
            hint = (" A margin of the confusion matrix is empty here: define MCC as 0, as scikit-learn does."
                    if want == 0 and (tp + fp) * (tp + fn) * (tn + fp) * (tn + fn) == 0 else
                    " MCC = (TP TN - FP FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)).")
            return _report(False, f"For TP={tp}, TN={tn}, FP={fp}, FN={fn} you gave {got!r}; expected {want:.6f}.{hint}")
    return _report(True, "MCC is a correlation between labels and predictions: 1 perfect, 0 no better than chance, -1 "
                         "inverted. Unlike accuracy it stays near 0 for a classifier that always says the majority "
                         "class, whatever the class balance.")
