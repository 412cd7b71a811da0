"""Checks for the exercises of the case studies (chapter 13: translation, end to end and fast).

- :func:`check_token_budget_prediction`: predict-then-measure; the speedup in real tokens per second that
  token-budget batches bring, predicted from the padding shares measured before and after, graded against the
  ratio of the real shares (the interleaved timing shown beside it, not graded).
- :func:`check_refusal_diagnosis`: diagnosis; the learner's ``diagnose(records, spread)`` says, for each row
  the table refused, whether the quality it lost is larger than the seed-to-seed spread (a real loss) or
  not (noise a stricter tolerance than the noise allows would refuse anyway).
- :func:`check_kv_cache_flop_prediction`: predict-then-measure; the ratio of decoding FLOPs without and
  with the KV cache for a number of steps S, graded from the token-pass model (S + 1) / 2 to
  ``seq2seq_decoding.decode_work``'s count, each plausible mistake (the rough S / 2, S, S^2) named.
"""

from __future__ import annotations

import math
import numbers
from typing import Callable, Mapping, Sequence

from gpuformer_lib.exercises._answers import _number
from gpuformer_lib.exercises._core import CheckResult, _describe, _report, _safe_check, _try


TOKEN_BUDGET_REL = 0.03
"""A token-budget prediction passes within 3 % of the model's ratio (rounding the padding shares)."""


def check_token_budget_prediction(predicted, measured: float | None, *, padding_random: float,
                                  padding_budget: float) -> CheckResult:
    """Grade a predicted speedup (real target tokens per second, token-budget batches over random ones) against
    the model the chapter teaches, (1 - padding_budget) / (1 - padding_random): time per step follows the padded
    slots, so real tokens per second grow by the ratio of the real shares. Graded against the model within
    rounding (:data:`TOKEN_BUDGET_REL`), each plausible mistake named; the interleaved timing (``measured``,
    optional) is shown beside it, not graded: a timing on a busy machine varies by more than separates the
    right model from the wrong ones."""
    from gpuformer_lib.exercises.predictions import distinct_mistakes, grade_model

    for name, value in (("padding_random", padding_random), ("padding_budget", padding_budget)):
        if not 0 <= value < 1:
            raise ValueError(f"{name} is a share of padded slots, 0 <= share < 1; got {value!r}")
    right = (1 - padding_budget) / (1 - padding_random)
    candidates = [
        ("the difference of the padding shares", 1 + padding_random - padding_budget,
         "The speedup is the ratio of the real shares, (1 - padding after) / (1 - padding before), not one plus "
         "the difference of the padding shares."),
        ("one over the random batches' real share", 1 / (1 - padding_random),
         f"That takes the token-budget batches as free of padding: they still pad {padding_budget:.1%} of their "
         "slots (a batch is padded to its longest sentence), so their real share is 1 - padding_budget, not 1: "
         "(1 - padding_budget) / (1 - padding_random)."),
        ("the ratio upside down", 1 / right,
         "Upside down: a speedup is the time before over the time after, so real tokens per second after over "
         "before, (1 - padding_budget) / (1 - padding_random), above 1 when the budget pads less."),
        ("the ratio of the padding shares", padding_random / padding_budget if padding_budget > 0 else 0.0,
         "That is the ratio of the padding shares; the work that counts is the real tokens: divide the real "
         "shares, (1 - padding_budget) / (1 - padding_random)."),
        ("one over the real share after", 1 / (1 - padding_budget),
         "You divided by the real share after only; the random batches' real share, 1 - padding_random, is the "
         "denominator's other half: (1 - padding_budget) / (1 - padding_random)."),
    ]
    wrong = distinct_mistakes(right, candidates, TOKEN_BUDGET_REL)
    return grade_model(
        predicted, right, quantity="speedup of token-budget batches (real tokens per second)", unit="x",
        wrong=wrong, rel=TOKEN_BUDGET_REL, measured=measured, measured_by="the interleaved timing measured",
        too_high=("A step does not only compute on padded slots, but the model the exercise asks for is the "
                  "ratio of the real shares, (1 - padding_budget) / (1 - padding_random)."),
        too_low=(f"If a step's time follows its padded tokens, real tokens per step rise from a share "
                 f"{1 - padding_random:.2f} of the slots to {1 - padding_budget:.2f}: the speedup is their ratio."),
        why_close=("A real step gains a little less: the optimizer's update, the embedding and the launches cost "
                   "the same whatever the padding, and attention's cost grows with the square of a batch's "
                   "length."))


def _reference_diagnosis(records: Sequence[Mapping], spread: float) -> dict[str, str]:
    out = {}
    base = records[0]["quality"]
    for r in records[1:]:
        if r["skipped"] or r["quality"] is None:
            continue
        if "refused_for_quality" in r:
            if not r["refused_for_quality"]:
                continue  # kept its quality (its speedup may still be None: a seed never reached the target)
        elif r["speedup"] is not None or "outside the tolerance" not in str(r["verdict"]):
            continue  # records without the flag (older tables): read the verdict
        out[r["step"]] = "lost quality" if abs(r["quality"] - base) > spread else "noise"
    return out


def _toy_records() -> tuple[list[dict], float]:
    """A small table's records (as ``AccelerationTable.records()`` gives them) with one row of each kind: refused
    within the spread (noise), refused beyond it (lost quality), skipped, kept with a speedup, and kept without one
    (a seed never reached the target within the budget: no speedup, yet no refusal for quality). The refused rows'
    gaps (0.02, 0.05, 0.09, 0.30, 0.32 against a spread of 0.06) tell the right rule from its near misses: a gap
    just under the spread is noise (a threshold below it, say half the spread, calls it a loss), one between
    once and twice the spread is a loss (a multiple of the spread, a fixed 0.1 nats or a gap relative to the loss
    call it noise), and a row 0.32 from the baseline but 0.02 from the row before it is a loss (comparing with the
    row before calls it noise)."""
    def row(step, quality, speedup, verdict, skipped=None):
        return {"step": step, "skipped": skipped, "quality": quality, "speedup": speedup, "verdict": verdict,
                "refused_for_quality": skipped is None and "outside the tolerance" in verdict}

    refused = "no speedup reported: validation loss (nats) {q:.3f} is {g:.3f} above the baseline's 4.000, " \
              "outside the tolerance of 0.01"
    return [row("baseline", 4.0, 1.0, "1.00x"),
            row("+ a", 4.02, None, refused.format(q=4.02, g=0.02)),
            row("+ b", 4.3, None, refused.format(q=4.3, g=0.3)),
            row("+ b2", 4.32, None, refused.format(q=4.32, g=0.32)),
            row("+ c", None, None, "skipped: no GPU", skipped="no GPU"),
            row("+ d", 3.99, 1.5, "1.50x"),
            row("+ e", 4.005, None, "no speedup reported: the baseline's quality was not reached within the budget "
                                    "on every seed"),
            row("+ f", 4.05, None, refused.format(q=4.05, g=0.05)),
            row("+ g", 4.09, None, refused.format(q=4.09, g=0.09))], 0.06


DIAGNOSES = ("noise", "lost quality")
"""The two words ``diagnose`` answers a refused row with."""


def _wrong_rows_hint(records: Sequence[Mapping], extra: list, missing: list) -> str:
    """What the rows ``diagnose`` named wrongly are: the baseline, skipped rows, kept rows (with a speedup, or
    without one because a seed never reached the target), or refused rows left out."""
    by_step = {r["step"]: r for r in records}
    reasons = []
    if records and records[0]["step"] in extra:
        reasons.append(f"{records[0]['step']!r} is the baseline, the reference every row is compared with, not a "
                       "refused row")
    skipped = [name for name in extra if name in by_step and by_step[name]["skipped"]]
    if skipped:
        reasons.append(f"{', '.join(map(repr, skipped))} never ran (skipped), so it has no quality to judge")
    kept = [name for name in extra if name in by_step and not by_step[name]["skipped"]
            and name != records[0]["step"]]
    no_speedup = [name for name in kept if by_step[name]["speedup"] is None]
    if no_speedup:
        reasons.append(f"{', '.join(map(repr, no_speedup))} has no speedup because a seed never reached the target "
                       "within the budget, which is not a refusal for quality: its record says "
                       "'refused_for_quality': False")
    if len(no_speedup) < len(kept):
        reasons.append(f"{', '.join(repr(n) for n in kept if n not in no_speedup)} kept its quality (it has a "
                       "speedup)")
    if missing:
        reasons.append(f"{', '.join(map(repr, missing))} was refused for its quality and needs a diagnosis")
    return "; ".join(reasons)


@_safe_check
def check_refusal_diagnosis(diagnose: Callable[[list, float], dict], records: Sequence[Mapping],
                            spread: float) -> CheckResult:
    """``diagnose(records, spread)`` -> {row name: "noise" or "lost quality"} for each row the table refused
    for its quality (skipped rows and rows with a speedup left out, and rows whose seed never reached the target
    within the budget: no speedup, but not refused). Checked on a small table first, then on ``records``
    (``AccelerationTable.records()``) with ``spread``, the seed-to-seed spread measured."""
    for recs, spr, where in (_toy_records() + ("a small example table",), (list(records), spread, "this page's table")):
        got, err = _try(diagnose, [dict(r) for r in recs], spr)
        if err:
            return _report(False, err)
        if not isinstance(got, dict):
            return _report(False, f"diagnose should return a dict {{row name: 'noise' or 'lost quality'}}, got "
                                  f"{type(got).__name__}")
        want = _reference_diagnosis(recs, spr)
        if set(got) != set(want):
            extra, missing = sorted(set(got) - set(want), key=str), sorted(set(want) - set(got))
            return _report(False, f"On {where}: rows refused for quality are {sorted(want)}; you named "
                                  f"{sorted(got, key=str)} (extra {extra}, missing {missing}). "
                                  f"{_wrong_rows_hint(recs, extra, missing)}. Take the rows whose record says "
                                  "'refused_for_quality': a row can also lack a speedup because a seed never "
                                  "reached the target, which is not a refusal for quality.")
        for name, word in want.items():
            if got[name] not in DIAGNOSES:
                return _report(False, f"On {where}: answer each refused row with the words 'noise' or 'lost "
                                      f"quality', not {got[name]!r} (row {name!r}).")
        for name, word in want.items():
            if got[name] != word:
                gap = abs(recs[[r['step'] for r in recs].index(name)]['quality'] - recs[0]['quality'])
                if word == "noise":
                    why = (f"smaller than the seed-to-seed spread of {spr:.3f}: training the same row with another "
                           "seed moves the loss as much, so the gap is no evidence that the acceleration hurt")
                else:
                    why = (f"larger than the seed-to-seed spread of {spr:.3f}: more than another seed would move "
                           "it, a real loss")
                return _report(False, f"On {where}: row {name!r} is {gap:.3f} nats from the baseline's loss, {why}: "
                                      f"that is '{word}', not {got[name]!r}. Compare each refused row's gap to the "
                                      "baseline (not to the row before it), in nats (not relative to the loss), with "
                                      "the spread itself: not half or twice it, not the table's tolerance, not a "
                                      "fixed number.")
    return _report(True, "A refused row is a claim about quality, and a claim needs its noise: a gap smaller than "
                         "what another seed gives is not evidence that the acceleration hurt. That is why the "
                         "tolerance must sit above the measured spread, and why the GPU presets train several "
                         "seeds per row.")


KV_CACHE_FLOP_REL = 0.03
"""A KV-cache FLOP ratio passes from 3 % below the token-pass model (S + 1) / 2 to 3 % above decode_work's count."""


def _kv_cache_flop_mistakes(steps: int, low: float, high: float, rel: float) -> dict[str, tuple[float, str]]:
    """The plausible mistakes of exercise 13.3 for ``steps`` decoding steps that can be told apart here: a value
    outside the pass band [``low``, ``high``] (widened by ``rel``) that lies more than ``2 * rel`` from every
    mistake kept before it (an answer within ``rel`` of it gets its hint unless it passes: at S = 24 the rough
    S / 2 lies just below the band and is still named)."""
    S = steps
    model = (S + 1) / 2
    candidates = [
        ("the rough S / 2", S / 2,
         f"S / 2 drops the +1: without the cache step t runs the decoder on t tokens, so {S} steps run 1 + 2 + ... "
         f"+ S = S (S + 1) / 2 token-passes against S with the cache; the ratio is (S + 1) / 2 = {model:g}, not "
         f"S / 2 = {S / 2:g} ({model / (S / 2) - 1:.0%} more at S = {S})."),
        ("S, the number of steps", float(S),
         "With the cache every step still runs its newest token through the decoder and the output layer: the "
         "cache removes the prefix's recomputation, not the step. S (S + 1) / 2 token-passes against S: a ratio of "
         "(S + 1) / 2, not S."),
        ("S squared", float(S * S),
         "S^2 takes every step as S tokens: step t recomputes the t tokens so far, not S. 1 + 2 + ... + S = "
         "S (S + 1) / 2 token-passes against S with the cache: (S + 1) / 2."),
        ("the token-passes without the cache alone", S * (S + 1) / 2,
         "S (S + 1) / 2 is the token-passes without the cache; the ratio divides them by the S token-passes with "
         "it (one per step): (S + 1) / 2."),
        ("S + 1", float(S + 1),
         "You left out the halving: 1 + 2 + ... + S = S (S + 1) / 2, half of S (S + 1); over S that is "
         "(S + 1) / 2."),
        ("the ratio upside down", 1 / model,
         "Upside down: the ratio is the FLOPs without the cache over those with it, above 1: (S + 1) / 2."),
        ("no saving at all", 1.0,
         "The cache does save work: without it step t recomputes all t tokens of the prefix, with it only the "
         "newest: S (S + 1) / 2 token-passes against S, (S + 1) / 2."),
        ("(S - 1) / 2", (S - 1) / 2,
         "(S - 1) / 2 counts 0 + 1 + ... + (S - 1) token-passes without the cache: the first step already runs one "
         "token, so it is 1 + 2 + ... + S = S (S + 1) / 2 against S, (S + 1) / 2."),
        ("the ratio in percent", 100 * model,
         f"That is the ratio in percent: a ratio is a plain number, about (S + 1) / 2 = {model:g}, not "
         f"{100 * model:g} %."),
    ]
    kept: dict[str, tuple[float, str]] = {}
    for name, value, hint in candidates:
        outside = value < low * (1 - rel) or value > high * (1 + rel)  # a pass never reaches a mistake's hint
        if value > 0 and outside and all(abs(value / other - 1) > 2 * rel for other, _ in kept.values()):
            kept[name] = (value, hint)
    return kept


def check_kv_cache_flop_prediction(predicted, measured: float, *, steps: int) -> CheckResult:
    """Grade a predicted ratio of decoding FLOPs (without the KV cache / with it) for ``steps`` decoding steps:
    a pass from the token-pass model the chapter teaches, (S + 1) / 2 (S (S + 1) / 2 token-passes without the
    cache against S with it), to ``measured``, ``seq2seq_decoding.decode_work``'s count (a little more: the
    memory's keys and values projected again at every step, attention's t^2), each end widened by
    :data:`KV_CACHE_FLOP_REL` for rounding. Each plausible mistake (the rough S / 2, S, S^2, ...) gets the hint
    that names it; a x1.4 band around the count passed the rough S / 2."""
    if isinstance(measured, bool) or not isinstance(measured, numbers.Real) or not 0 < measured < math.inf:
        raise ValueError(f"measured must be a finite number > 0 (decode_work's ratio), got {measured!r}")
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    steps = int(steps)
    model = (steps + 1) / 2
    counted = float(measured)
    low, high = min(model, counted), max(model, counted)
    from gpuformer_lib.exercises.predictions import factor_words

    rel = KV_CACHE_FLOP_REL
    wrong = _kv_cache_flop_mistakes(steps, low, high, rel)
    quantity = f"decoding FLOPs without / with the KV cache over {steps} steps"
    counted_words = f"seq2seq_decoding.decode_work counted {counted:.3g} x"

    # the count and the steps are the notebook's: a bad one raised above; the learner's answer never does
    @_safe_check
    def grade(predicted) -> CheckResult:
        value, hint = _number(predicted)
        if hint:
            return _report(False, f"Predict a number for {quantity} (in x), not {_describe(predicted)}.")
        if not math.isfinite(value) or value <= 0:
            return _report(False, f"A ratio of FLOPs is a positive number; you predicted {value!r}.")
        said = f"You predicted {value:.3g} x for {quantity}"
        if low * (1 - rel) <= value <= high * (1 + rel):
            return _report(True, f"{said}: the token-pass model (S + 1) / 2 gives {model:.3g} x, {counted_words}. "
                                 "The ratio is about (S + 1) / 2: the prefix recomputed at every step. decode_work "
                                 "counts a little more than that without the cache: the encoder memory's keys and "
                                 "values are projected again at every step (once with the cache), and attention's "
                                 "own cost grows as t^2 per step.")
        for name, (wrong_value, wrong_hint) in wrong.items():
            if abs(value / wrong_value - 1) <= rel:
                return _report(False, f"{said}, which is what {name} gives; {counted_words}. {wrong_hint}")
        if value > high:
            return _report(False, f"{said}; {counted_words}: too high by {factor_words(value / high)}. Without the "
                                  "cache, step t runs the decoder (and the output layer) on all t tokens: 1 + 2 + "
                                  "... + S = S (S + 1) / 2 token-passes against S with it, a ratio of about "
                                  "(S + 1) / 2, not S or S^2. The cache does not remove the per-token work of the "
                                  "newest token, only the prefix's.")
        return _report(False, f"{said}; {counted_words}: too low by {factor_words(low / value)}. Without the cache "
                              "every step recomputes the whole prefix: step t costs t token-passes of the decoder "
                              "and of the output layer, so S steps cost S (S + 1) / 2 against S: about (S + 1) / 2, "
                              "growing with S.")

    return grade(predicted)
