"""Predict-then-measure exercises: the learner predicts a number, a cell measures it, a check grades it.

The learner writes a function that predicts a number from what the chapter taught (a memory size, a
FLOP count, a time from a measured peak, a ratio). The notebook measures the same quantity on the
device that runs it and calls :func:`grade_prediction`, which passes when the prediction lies within a
stated factor of the measurement, says by how much it missed either way, and explains the gap: what a
prediction that is too high or too low usually leaves out. Topic modules wrap it with their own
tolerances and explanations (e.g. ``hardware.check_matmul_time_prediction``).

A quantity that a formula gives (bytes, FLOPs, a bubble) is graded by :func:`grade_model` instead: against the
formula, each plausible mistake named by its own hint, the measurement shown beside it but not graded, because a
tolerance band around a noisy measurement can be wider than the gap between the right model and the wrong ones.

Leaves out: the measurement (the notebook does it, with ``bench``), and exact-answer checks.
"""

from __future__ import annotations

import math
import numbers
import statistics

from gpuformer_lib.exercises._answers import _number
from gpuformer_lib.exercises._core import CheckResult, _describe, _report, _safe_check, _state


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def grade_prediction(predicted, measured, *, quantity: str, unit: str, within: float = 2.0,
                     too_high: str = "", too_low: str = "", why_close: str = "",
                     measured_by: str = "this device measured", attempts: int = 3) -> CheckResult:
    """Grade a predicted number against a measured one: a pass when measured / within <= predicted <=
    measured * within (``within`` a factor > 1). The message gives both numbers and their ratio, and
    ``too_high`` / ``too_low`` (what such a prediction leaves out) on a miss, ``why_close`` on a pass
    (what still separates the two numbers). ``measured_by`` names where the number came from (e.g.
    ``"FlopCounterMode counted"``).

    ``measured`` is a number, or a function of no arguments that measures it (a timing): then it is measured
    ``attempts`` times, whatever the prediction, and graded against the median, so that one slow timing on a busy
    machine neither fails a right answer nor, re-measured until it agrees, passes a wrong one (a measurement is
    never chosen for being close to the prediction).
    """
    within = _positive("within", within)
    if within <= 1:
        raise ValueError(f"within is a factor > 1 (2.0 accepts half to twice the measurement), got {within!r}")
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"attempts must be an int >= 1, got {attempts!r}")
    if callable(measured):
        measurements = [_positive("measured", measured()) for _ in range(attempts)]
    else:
        measurements = [_positive("measured", measured)]
    by = measured_by if len(measurements) == 1 else f"{measured_by} (median of {len(measurements)} measurements)"
    # the measurement and the tolerance are the notebook's: a bad one raises; the learner's answer never does
    return _grade(predicted, statistics.median(measurements), quantity, unit, within, too_high, too_low, why_close, by)


@_safe_check
def own_result(passed: bool, message: str, *, timed_out: bool = False, not_attempted: bool = False) -> CheckResult:
    """A result a prediction check reaches without :func:`grade_prediction` (an answer of the wrong shape, the
    learner's function that raised or ran out of time), printed and recorded in the grading log under that check's
    name as grade_prediction's results are. Such a check is not wrapped by ``_safe_check`` itself, so that a bad
    measurement, the notebook's own, raises; ``timed_out`` and ``not_attempted`` go into its log line."""
    state = _state()
    state.timed_out, state.not_attempted = timed_out, not_attempted
    return _report(passed, message)


def factor_words(ratio: float) -> str:
    """A miss as a factor for a hint: two decimals near 1 (a 4 % miss reads "1.04x", not "1.0x"), one above."""
    return f"{ratio:.2f}x" if ratio < 1.095 else f"{ratio:.1f}x"


def _amount(value: float, unit: str) -> str:
    """``value`` with its unit, for a hint (no stray space for a unitless share)."""
    return f"{value:.3g} {unit}" if unit else f"{value:.3g}"


def _in_unit(unit: str) -> str:
    return f" (in {unit})" if unit else ""


@_safe_check
def _grade(predicted, measured: float, quantity: str, unit: str, within: float, too_high: str, too_low: str,
           why_close: str, measured_by: str) -> CheckResult:
    """Predict a positive number; it passes within the stated factor of the measurement."""
    value, hint = _number(predicted)
    if hint:
        return _report(False, f"Predict a number for {quantity}{_in_unit(unit)}, not {_describe(predicted)}.")
    if not math.isfinite(value) or value <= 0:
        return _report(False, f"A {quantity} is a positive number{' of ' + unit if unit else ''}; you predicted "
                              f"{value!r}.")
    ratio = value / measured
    said = (f"You predicted {_amount(value, unit)} for {quantity}; {measured_by} {_amount(measured, unit)} "
            f"(prediction / measurement = {ratio:.2f}).")
    if 1 / within <= ratio <= within:
        return _report(True, f"{said} Within a factor of {within:g}. {why_close}".strip())
    if ratio > within:
        return _report(False, f"{said} Too high by {factor_words(ratio)}. {too_high}".strip())
    return _report(False, f"{said} Too low by {factor_words(1 / ratio)}. {too_low}".strip())


def grade_model(predicted, right: float, *, quantity: str, unit: str, wrong: dict[str, tuple[float, str]],
                rel: float = 0.05, too_high: str = "", too_low: str = "", measured: float | None = None,
                measured_by: str = "", why_close: str = "") -> CheckResult:
    """Grade a predicted number against the model that gives it (``right``, from the formula), not against a
    noisy measurement: a pass within ``rel`` of it (rounding). ``wrong`` maps a plausible mistake's name to
    (the value that mistake gives, the hint that names it); a prediction within ``rel`` of one gets that hint,
    even where the mistake's value is close to a measurement. ``measured`` (optional) is shown after the
    grade, beside the model, never used to grade: the learner sees how far a real run sits from the model.
    A miss that matches no known mistake gets ``too_high`` or ``too_low``."""
    right = _positive("right", right)
    rel = _positive("rel", rel)
    for name, (value, hint) in wrong.items():
        _positive(f"the value of the wrong model {name!r}", value)
        if abs(value / right - 1) <= 2 * rel:
            raise ValueError(f"the wrong model {name!r} gives {value:.4g}, within {2 * rel:.0%} of the right "
                             f"{right:.4g}: the check could not tell them apart")
    # the model and its mistakes are the notebook's: a bad one raised above; the learner's answer never does
    return _grade_model(predicted, right, quantity, unit, wrong, rel, too_high, too_low, measured, measured_by,
                        why_close)


def distinct_mistakes(right: float, candidates, rel: float) -> dict[str, tuple[float, str]]:
    """The plausible mistakes ``candidates`` ((name, value, hint), in order of preference) as :func:`grade_model`
    takes them, keeping only those it can tell apart here: a positive value more than ``2 * rel`` from the right
    one and from every mistake kept before it (with some inputs a mistake gives the right number, or another
    mistake's, and then names nothing)."""
    kept: dict[str, tuple[float, str]] = {}
    for name, value, hint in candidates:
        if value > 0 and abs(value / right - 1) > 2 * rel and all(
                abs(value / other - 1) > 2 * rel for other, _ in kept.values()):
            kept[name] = (value, hint)
    return kept


@_safe_check
def _grade_model(predicted, right: float, quantity: str, unit: str, wrong: dict[str, tuple[float, str]],
                 rel: float, too_high: str, too_low: str, measured: float | None, measured_by: str,
                 why_close: str) -> CheckResult:
    """:func:`grade_model`'s grading of the learner's answer, recorded under the calling check's name."""
    value, hint = _number(predicted)
    if hint:
        return _report(False, f"Predict a number for {quantity}{_in_unit(unit)}, not {_describe(predicted)}.")
    if not math.isfinite(value) or value <= 0:
        return _report(False, f"A {quantity} is a positive number{' of ' + unit if unit else ''}; you predicted "
                              f"{value!r}.")
    seen = (f" ({measured_by} {_amount(measured, unit)}, shown beside the model, not graded.)"
            if measured is not None else "")
    said = f"You predicted {_amount(value, unit)} for {quantity}"
    if abs(value / right - 1) <= rel:
        return _report(True, f"{said}: the model gives {right:.3g}.{seen} {why_close}".strip())
    for name, (wrong_value, wrong_hint) in {**wrong, **_ratio_mistakes(right, unit, rel, wrong)}.items():
        if abs(value / wrong_value - 1) <= rel:
            return _report(False, f"{said}, which is what {name} gives. {wrong_hint}{seen}")
    side = too_high if value > right else too_low
    return _report(False, f"{said}; that is {'too high' if value > right else 'too low'} by "
                          f"{factor_words(max(value / right, right / value))}. {side}{seen}".strip())


def _ratio_mistakes(right: float, unit: str, rel: float, named: dict[str, tuple[float, str]]
                    ) -> dict[str, tuple[float, str]]:
    """The mistakes any ratio (``unit`` "x") can suffer, named where the check's own list does not already name
    a value there: the ratio in percent, the gain alone (ratio - 1), the gain in percent."""
    if unit != "x":
        return {}
    candidates = [("the ratio in percent", 100 * right,
                   f"That is the ratio in percent: a ratio is written as a plain number, {right:.3g} (x), not "
                   f"{100 * right:.3g} %."),
                  ("the gain in percent", 100 * (right - 1),
                   f"That is the gain in percent, 100 (ratio - 1): the exercise asks for the ratio itself, "
                   f"{right:.3g} (x); 1.5 means 50 % more."),
                  ("the gain alone, ratio - 1", right - 1,
                   f"That is the gain alone, ratio - 1: the exercise asks for the ratio itself (after / before, "
                   f"or time before / time after), {right:.3g}, which is 1 + that gain.")]
    return distinct_mistakes(right, [c for c in candidates if all(abs(c[1] / v - 1) > 2 * rel
                                                                  for v, _ in named.values())], rel)
