"""Chapter 13 (translation case study): the token-budget speedup, the diagnosis of refused rows, the KV cache's
FLOP ratio. Measurements are the page's (CPU preset), fixed: the padding shares and the interleaved timing as
printed, the table's records as ``strict.records()`` gives them, ``decode_work``'s count for the CPU preset's
model (a count, not a timing)."""

import functools

from answer_tables import Table, Wrong
from gpuformer_lib.exercises import case_studies
from gpuformer_lib.model import TransformerConfig
from gpuformer_lib.seq2seq_decoding import decode_work

# exercise 13.1: pad["random"], pad["token_budget"] and the interleaved timing as the page printed them
PAD_RANDOM, PAD_BUDGET, MEASURED_SPEEDUP = 0.449, 0.070, 1.66
TOKEN_BUDGET = (1 - PAD_BUDGET) / (1 - PAD_RANDOM)


def grade_token_budget(answer):
    return case_studies.check_token_budget_prediction(answer, MEASURED_SPEEDUP, padding_random=PAD_RANDOM,
                                                      padding_budget=PAD_BUDGET)


def solution_token_budget(pad):
    """The notebook's solution cell, on its ``pad`` dict."""
    return (1 - pad["token_budget"]) / (1 - pad["random"])


# exercise 13.2: the page's table at tolerance 0 (one seed: every row that lost any quality is refused; two rows
# skipped on a CPU) and the seed-to-seed spread it measured
SPREAD = 0.053


def _record(step, quality, speedup, verdict, refused, skipped=None):
    """One row as ``AccelerationTable.records()`` gives it (the keys a diagnosis may read)."""
    measured = skipped is None
    return {"step": step, "skipped": skipped, "steps": 48 if measured else None, "step_ms": None, "rate": None,
            "peak_mib": None, "mfu": None, "quality": quality, "quality_spread": 0.0 if measured else None,
            "seconds": None, "time_to_quality": None, "speedup": speedup, "verdict": verdict, "seeds": 1,
            "refused_for_quality": refused}


def _refused(quality):
    return (f"no speedup reported: validation loss (nats) {quality:.3f} is {quality - 4.6484:.3f} above the "
            "baseline's 4.648, outside the tolerance of 0")


PAGE_RECORDS = [
    _record("baseline", 4.6484, 1.0, "1.00x", False),
    _record("+ token-budget batches", 4.6877, None, _refused(4.6877), True),
    _record("+ bf16 autocast", 4.6880, None, _refused(4.6880), True),
    _record("+ TF32 matmuls", None, None, "skipped: TF32 needs an NVIDIA GPU", False, skipped="TF32 needs a GPU"),
    _record("+ fused attention, no id check", 4.6880, None, _refused(4.6880), True),
    _record("+ torch.compile", None, None, "skipped: run on a GPU only", False, skipped="run on a GPU only"),
    _record("+ fused AdamW", 4.6879, None, _refused(4.6879), True),
]


def grade_diagnosis(diagnose):
    return case_studies.check_refusal_diagnosis(diagnose, PAGE_RECORDS, SPREAD)


def solution_diagnose(records, spread):
    """The notebook's solution cell."""
    base = records[0]["quality"]
    return {r["step"]: ("lost quality" if abs(r["quality"] - base) > spread else "noise")
            for r in records[1:] if r["refused_for_quality"]}


def diagnose_by(select, word=lambda gap, spread: "lost quality" if gap > spread else "noise"):
    """A diagnosis that picks its rows with ``select(record)`` and words a gap with ``word(gap, spread)``."""
    def diagnose(records, spread):
        base = records[0]["quality"]
        return {r["step"]: word(abs(r["quality"] - base), spread) for r in records[1:] if select(r)}
    return diagnose


def relative_diagnosis(records, spread):
    """The gap as a share of the baseline's loss, against the spread."""
    base = records[0]["quality"]
    return {r["step"]: "lost quality" if abs(r["quality"] - base) / base > spread else "noise"
            for r in records[1:] if r["refused_for_quality"]}


def previous_row_diagnosis(records, spread):
    """Each refused row against the measured row before it, not the baseline."""
    out, before = {}, records[0]["quality"]
    for r in records[1:]:
        if r["quality"] is None:
            continue
        if r["refused_for_quality"]:
            out[r["step"]] = "lost quality" if abs(r["quality"] - before) > spread else "noise"
        before = r["quality"]
    return out


# exercise 13.3: the CPU preset's model (translation_task.case_run), 64 test sentences of 19 source tokens, the
# 8 decoding steps the timed decoding ran: decode_work counts 5.18x
CPU_CONFIG = TransformerConfig(vocab_size=2375, src_vocab_size=4341, d_model=128, n_heads=4, n_encoder_layers=2,
                               n_decoder_layers=2, d_ff=256, dropout=0.1, max_len=24)
STEPS = 8


@functools.cache
def counted():
    return decode_work(CPU_CONFIG, 64, 19, STEPS).ratio


def grade_kv_flops(answer):
    return case_studies.check_kv_cache_flop_prediction(answer, counted(), steps=STEPS)


TABLES = [
    Table(
        "check_token_budget_prediction", grade_token_budget,
        right=(TOKEN_BUDGET, round(TOKEN_BUDGET, 2),
               solution_token_budget({"random": PAD_RANDOM, "token_budget": PAD_BUDGET})),
        wrong=(Wrong("the budget's batches taken as unpadded (the review's 1.81)", 1 / (1 - PAD_RANDOM),
                     ("free of padding", "1 - padding_budget")),
               Wrong("one plus the difference of the padding shares", 1 + PAD_RANDOM - PAD_BUDGET,
                     ("difference of the padding shares",)),
               Wrong("upside down", 1 / TOKEN_BUDGET, ("Upside down",)),
               Wrong("the ratio of the padding shares", PAD_RANDOM / PAD_BUDGET, ("ratio of the padding shares",)),
               Wrong("one over the real share after", 1 / (1 - PAD_BUDGET), ("real share after",)),
               Wrong("the ratio in percent", 100 * TOKEN_BUDGET, ("ratio in percent",)),
               Wrong("the gain alone", TOKEN_BUDGET - 1, ("gain alone", "ratio - 1")),
               Wrong("the gain in percent", 100 * (TOKEN_BUDGET - 1), ("gain in percent",)),
               Wrong("not a number", "1.7x", ("Predict a number",))),
    ),
    Table(
        "check_refusal_diagnosis", grade_diagnosis,
        right=(solution_diagnose,
               diagnose_by(lambda r: r.get("refused_for_quality", False)),
               diagnose_by(lambda r: r["refused_for_quality"],
                           lambda gap, spread: "noise" if gap <= spread else "lost quality")),
        wrong=(Wrong("every row without a speedup", diagnose_by(lambda r: not r["skipped"] and r["speedup"] is None),
                     ("never reached the target", "'refused_for_quality': False")),
               Wrong("the comparison upside down",
                     diagnose_by(lambda r: r["refused_for_quality"],
                                 lambda gap, spread: "noise" if gap > spread else "lost quality"),
                     ("smaller than the seed-to-seed spread", "that is 'noise'")),
               Wrong("every refused row lost quality (the tolerance, not the spread)",
                     diagnose_by(lambda r: r["refused_for_quality"], lambda gap, spread: "lost quality"),
                     ("smaller than the seed-to-seed spread", "not the table's tolerance")),
               Wrong("twice the spread as the threshold",
                     diagnose_by(lambda r: r["refused_for_quality"],
                                 lambda gap, spread: "lost quality" if gap > 2 * spread else "noise"),
                     ("larger than the seed-to-seed spread", "not half or twice it")),
               Wrong("half the spread as the threshold",
                     diagnose_by(lambda r: r["refused_for_quality"],
                                 lambda gap, spread: "lost quality" if gap > spread / 2 else "noise"),
                     ("smaller than the seed-to-seed spread", "not half or twice it")),
               Wrong("a fixed 0.1 nats, whatever the spread",
                     diagnose_by(lambda r: r["refused_for_quality"],
                                 lambda gap, spread: "lost quality" if gap > 0.1 else "noise"),
                     ("larger than the seed-to-seed spread", "not a fixed number")),
               Wrong("the gap relative to the loss", relative_diagnosis, ("not relative to the loss",)),
               Wrong("the gap to the row before", previous_row_diagnosis, ("not to the row before it",)),
               Wrong("every measured row", diagnose_by(lambda r: r["quality"] is not None),
                     ("kept its quality", "has a speedup")),
               Wrong("True or False, not the words",
                     diagnose_by(lambda r: r["refused_for_quality"], lambda gap, spread: gap > spread),
                     ("the words 'noise' or 'lost quality'",)),
               Wrong("a list of names",
                     lambda records, spread: [r["step"] for r in records if r["refused_for_quality"]],
                     ("should return a dict",))),
    ),
    Table(
        "check_kv_cache_flop_prediction", grade_kv_flops,
        right=((STEPS + 1) / 2, 4.5, 5.0, 5.18),  # the solution's (S + 1) / 2 up to decode_work's count
        wrong=(Wrong("the rough S / 2 (the review's 4)", STEPS / 2, ("S / 2 drops the +1",)),
               Wrong("S", STEPS, ("(S + 1) / 2, not S", "newest token")),
               Wrong("S squared", STEPS ** 2, ("S^2 takes every step as S tokens",)),
               Wrong("the token-passes without the cache", STEPS * (STEPS + 1) / 2,
                     ("token-passes without the cache",)),
               Wrong("S + 1", STEPS + 1, ("left out the halving",)),
               Wrong("upside down", 2 / (STEPS + 1), ("Upside down",)),
               Wrong("no saving", 1.0, ("does save work",)),
               Wrong("(S - 1) / 2, the sum from 0", (STEPS - 1) / 2, ("(S - 1) / 2 counts",)),
               Wrong("the ratio in percent", 100 * (STEPS + 1) / 2, ("ratio in percent",))),
    ),
]
