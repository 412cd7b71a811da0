"""Checks for the exercises of the case studies (chapter 13: translation, end to end and fast).

- :func:`check_token_budget_prediction`: predict-then-measure; the speedup in real tokens per second that
  token-budget batches bring, predicted from the padding shares measured before and after, graded against the
  ratio of the real shares (the interleaved timing shown beside it, not graded).
- :func:`check_refusal_diagnosis`: diagnosis; the learner's ``diagnose(records, spread)`` says, for each row
  the table refused, whether the quality it lost is larger than the seed-to-seed spread (a real loss) or
  not (noise a stricter tolerance than the noise allows would refuse anyway).
- :func:`check_kv_cache_flop_prediction`: predict-then-measure; the ratio of decoding FLOPs without and
  with the KV cache for a number of steps, graded against ``seq2seq_decoding.decode_work``'s count.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from gpuformer_lib.exercises._core import CheckResult, _report, _safe_check, _try


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
         "the speedup is the ratio of the real shares, (1 - padding after) / (1 - padding before), not one plus "
         "the difference of the padding shares."),
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
    """A small table's records (as ``AccelerationTable.records()`` gives them) with one row of each kind."""
    def row(step, quality, speedup, verdict, skipped=None):
        return {"step": step, "skipped": skipped, "quality": quality, "speedup": speedup, "verdict": verdict,
                "refused_for_quality": skipped is None and "outside the tolerance" in verdict}

    refused = "no speedup reported: validation loss (nats) {q:.3f} is {g:.3f} above the baseline's 4.000, " \
              "outside the tolerance of 0.01"
    return [row("baseline", 4.0, 1.0, "1.00x"),
            row("+ a", 4.02, None, refused.format(q=4.02, g=0.02)),
            row("+ b", 4.3, None, refused.format(q=4.3, g=0.3)),
            row("+ c", None, None, "skipped: no GPU", skipped="no GPU"),
            row("+ d", 3.99, 1.5, "1.50x")], 0.06


@_safe_check
def check_refusal_diagnosis(diagnose: Callable[[list, float], dict], records: Sequence[Mapping],
                            spread: float) -> CheckResult:
    """``diagnose(records, spread)`` -> {row name: "noise" or "lost quality"} for each row the table refused
    for its quality (skipped rows and rows with a speedup left out). Checked on a small table first, then on
    ``records`` (``AccelerationTable.records()``) with ``spread``, the seed-to-seed spread measured."""
    for recs, spr, where in (_toy_records() + ("a small example table",), (list(records), spread, "this page's table")):
        got, err = _try(diagnose, [dict(r) for r in recs], spr)
        if err:
            return _report(False, err)
        if not isinstance(got, dict):
            return _report(False, f"diagnose should return a dict {{row name: 'noise' or 'lost quality'}}, got "
                                  f"{type(got).__name__}")
        want = _reference_diagnosis(recs, spr)
        if set(got) != set(want):
            extra, missing = sorted(set(got) - set(want)), sorted(set(want) - set(got))
            return _report(False, f"On {where}: rows refused for quality are {sorted(want)}; you named "
                                  f"{sorted(got)} (extra {extra}, missing {missing}). Take the rows whose record says "
                                  "'refused_for_quality': a row can also lack a speedup because a seed never "
                                  "reached the target, which is not a refusal for quality.")
        for name, word in want.items():
            if got[name] != word:
                return _report(False, f"On {where}: row {name!r} lost {abs(recs[[r['step'] for r in recs].index(name)]['quality'] - recs[0]['quality']):.3f} "
                                      f"nats against a seed-to-seed spread of {spr:.3f}: that is '{word}', not "
                                      f"{got[name]!r}. Compare the gap to the baseline with the spread that "
                                      "training the same row with another seed gives.")
    return _report(True, "A refused row is a claim about quality, and a claim needs its noise: a gap smaller than "
                         "what another seed gives is not evidence that the acceleration hurt. That is why the "
                         "tolerance must sit above the measured spread, and why the GPU presets train several "
                         "seeds per row.")


def check_kv_cache_flop_prediction(predicted, measured: float, *, steps: int) -> CheckResult:
    """Grade a predicted ratio of decoding FLOPs (without the KV cache / with it) for ``steps`` decoding steps
    against ``seq2seq_decoding.decode_work``'s count."""
    from gpuformer_lib.exercises.predictions import grade_prediction

    return grade_prediction(
        predicted, measured, quantity=f"decoding FLOPs without / with the KV cache over {steps} steps", unit="x",
        within=1.4, measured_by="seq2seq_decoding.decode_work counted",
        too_high=("Without the cache, step t runs the decoder (and the output layer) on all t tokens: 1 + 2 + ... "
                  "+ S = S (S + 1) / 2 token-passes against S with it, a ratio of about (S + 1) / 2, not S or S^2. "
                  "The cache does not remove the per-token work of the newest token, only the prefix's."),
        too_low=("Without the cache every step recomputes the whole prefix: step t costs t token-passes of the "
                 "decoder and of the output layer, so S steps cost S (S + 1) / 2 against S: about (S + 1) / 2, "
                 "growing with S."),
        why_close=("The ratio is about (S + 1) / 2: the prefix recomputed at every step. decode_work counts a little "
                   "more than that without the cache: the encoder memory's keys and values are projected again at "
                   "every step (once with the cache), and attention's own cost grows as t^2 per step."))
