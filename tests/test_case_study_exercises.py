"""Chapter 13's exercise checks (gpuformer_lib.exercises.case_studies) and the plan and predictors it uses
(translation_task.case_plan, bottleneck, fix_for): right answers pass, wrong ones fail with
the hint that explains the gap."""

import pytest
import torch

from gpuformer_lib import translation_task
from gpuformer_lib.device import SizePreset
from gpuformer_lib.exercises.case_studies import (check_kv_cache_flop_prediction, check_refusal_diagnosis,
                                                   check_token_budget_prediction)
from gpuformer_lib.profiles import PROFILES
from gpuformer_lib.seq2seq_decoding import decode_work
from gpuformer_lib.model import TransformerConfig


@pytest.mark.parametrize("measured", [None, 1.2, 3.0])  # a timing never decides the grade
def test_token_budget_prediction_grades_the_ratio_of_real_shares_and_names_mistakes(measured):
    kw = dict(padding_random=0.45, padding_budget=0.07)
    right = (1 - 0.07) / (1 - 0.45)
    assert check_token_budget_prediction(right, measured, **kw).passed
    assert check_token_budget_prediction(round(right, 2), measured, **kw).passed
    for wrong, words in ((1 + 0.45 - 0.07, "difference of the padding shares"), (1 / right, "Upside down"),
                         (0.45 / 0.07, "ratio of the padding shares"), (1 / (1 - 0.07), "real share after"),
                         (right * 1.5, "too high")):
        result = check_token_budget_prediction(wrong, measured, **kw)
        assert not result.passed and words in result.message, result.message
    if measured is not None:
        assert "not graded" in check_token_budget_prediction(right, measured, **kw).message
    assert not check_token_budget_prediction(None, measured, **kw).passed
    with pytest.raises(ValueError):
        check_token_budget_prediction(1.5, 1.5, padding_random=1.2, padding_budget=0.07)


def test_token_budget_mistakes_that_give_the_right_number_are_left_out():
    # equal padding before and after: the difference, the upside-down ratio and the padding shares' ratio all
    # give the right 1.0 and are left out, not an error of the check's
    assert check_token_budget_prediction(1.0, None, padding_random=0.2, padding_budget=0.2).passed


def _diagnose(records, spread):
    """Takes every measured row without a speedup as refused: wrong where a seed never reached the target."""
    base = records[0]["quality"]
    return {r["step"]: ("lost quality" if abs(r["quality"] - base) > spread else "noise") for r in records[1:]
            if not r["skipped"] and r["speedup"] is None}


def _flag_diagnose(records, spread):
    """Reads the record's refused_for_quality, and for records without it (older tables) no speedup."""
    base = records[0]["quality"]
    return {r["step"]: ("lost quality" if abs(r["quality"] - base) > spread else "noise") for r in records[1:]
            if r.get("refused_for_quality", not r["skipped"] and r["speedup"] is None)}


def test_refusal_diagnosis_compares_the_gap_with_the_seed_spread():
    records = [{"step": "baseline", "skipped": None, "quality": 4.5, "speedup": 1.0, "verdict": "1.00x"},
               {"step": "+ x", "skipped": None, "quality": 4.53, "speedup": None,
                "verdict": "no speedup reported: validation loss (nats) 4.530 is 0.030 above the baseline's 4.500, "
                           "outside the tolerance of 0"}]
    assert check_refusal_diagnosis(_flag_diagnose, records, 0.06).passed
    # the small example table has a kept row without a speedup (a seed never reached the target): not refused
    missed = check_refusal_diagnosis(_diagnose, records, 0.06)
    assert not missed.passed and "'refused_for_quality': False" in missed.message
    assert not check_refusal_diagnosis(lambda r, s: {"+ x": "lost quality"}, records, 0.06).passed  # toy and this
    every_loss = lambda recs, s: {k: "lost quality" for k in _flag_diagnose(recs, s)}
    result = check_refusal_diagnosis(every_loss, records, 0.06)
    assert not result.passed and "spread" in result.message
    assert not check_refusal_diagnosis(lambda r, s: None, records, 0.06).passed


def test_kv_cache_prediction_accepts_half_the_steps_plus_one_and_rejects_the_square():
    config = TransformerConfig(vocab_size=2000, src_vocab_size=3000, d_model=128, n_heads=4, n_encoder_layers=2,
                               n_decoder_layers=2, d_ff=256, max_len=24)
    steps = 23
    measured = decode_work(config, 64, 12, steps).ratio
    assert check_kv_cache_flop_prediction((steps + 1) / 2, measured, steps=steps).passed
    miss = check_kv_cache_flop_prediction(steps ** 2, measured, steps=steps)
    assert not miss.passed and "(S + 1) / 2" in miss.message
    assert not check_kv_cache_flop_prediction(1.0, measured, steps=steps).passed


def test_kv_cache_mistakes_are_named_at_every_length_a_preset_decodes(capsys):
    """At S = 24 the rough S / 2 lies just under the pass band: its hint must still name it (it once fell back to a
    generic "too low by 1.0x"); a miss of a few percent reads with two decimals."""
    for steps in (8, 17, 24):
        counted = (steps + 1) / 2 * 1.04  # decode_work counts a little more than the token-pass model
        assert not check_kv_cache_flop_prediction(steps / 2, counted, steps=steps)
        assert "S / 2 drops the +1" in capsys.readouterr().out, steps
        assert check_kv_cache_flop_prediction((steps + 1) / 2, counted, steps=steps)
    capsys.readouterr()
    # (S - 1) / 2 is named where it lies apart from S / 2 (at S = 17 they are within 6 % of each other)
    assert not check_kv_cache_flop_prediction(3.5, 4.5 * 1.04, steps=8)
    assert "(S - 1) / 2 counts" in capsys.readouterr().out
    capsys.readouterr()
    assert not check_kv_cache_flop_prediction(13.0 * 1.04 * 1.06, 13.0 * 1.04, steps=25)
    assert "too high by 1.06x" in capsys.readouterr().out


def test_case_plan_sizes_per_preset_and_refuses_a_bad_preset():
    cpu, rehearsed = PROFILES["cpu"], PROFILES["t4"]
    plan = translation_task.case_plan(cpu, SizePreset("cpu", "test"))
    assert (plan.budget_tokens, plan.seeds, plan.tolerance, plan.evaluations) == (32_000, (0,), 0.1, 4)
    toy = translation_task.case_plan(rehearsed, SizePreset("gpu-small", "test", toy=True))
    assert toy.budget_tokens < plan.budget_tokens and toy.seeds == (0,)
    assert translation_task.case_plan(rehearsed, SizePreset("gpu-small", "test")).seeds == (0, 1)
    big = translation_task.case_plan(PROFILES["h100-80gb"], SizePreset("gpu", "test"))
    assert big.budget_tokens == 2_000_000 and big.seeds == (0, 1, 2) and big.tolerance == 0.05
    with pytest.raises(ValueError, match="SizePreset"):
        translation_task.case_plan(cpu, "cpu")


def test_bottleneck_and_its_fix():
    assert translation_task.bottleneck({"attention": 3.0, "matrix products": 1.0}) == ("attention", 0.75)
    rows = ["baseline", "+ token-budget batches", "+ bf16 autocast", "+ fused attention, no id check", "+ fused AdamW"]
    assert translation_task.fix_for("attention", rows) == "+ fused attention, no id check"
    assert translation_task.fix_for("matrix products", rows) == "+ bf16 autocast"
    assert translation_task.fix_for("element-wise, norms, copies", rows) is None
    with pytest.raises(ValueError):
        translation_task.fix_for("nonsense", rows)
    with pytest.raises(ValueError):
        translation_task.bottleneck({})


def test_refusal_diagnosis_with_two_seeds_at_tolerance_zero_names_only_rows_refused_for_quality():
    """The GPU case: with 2 seeds and tolerance 0 the target is the baseline's mean, which its worse seed never
    reaches, so every row lacks a speedup; only the rows outside the tolerance are refused for quality."""
    import dataclasses

    from gpuformer_lib import case_study as cs

    def run(seed, final):
        curve = ((100, 1.0, 5.0), (200, 2.0, final))
        return cs.Run(seed=seed, steps=2, tokens=200, seconds=2.0, first_step_seconds=0.5, curve=curve,
                      peak_bytes=None, flops=None)

    rows = (cs.Row("baseline", cs.Setting(), (run(0, 4.00), run(1, 4.06))),
            cs.Row("+ kept", cs.Setting(), (run(0, 4.00), run(1, 4.04))),   # mean 4.02 <= 4.03: kept, no speedup
            cs.Row("+ worse", cs.Setting(), (run(0, 4.05), run(1, 4.09))))  # mean 4.07: refused for quality
    table = cs.AccelerationTable("toy", "tokens", "validation loss (nats)", False, 0.05, "cpu", rows)
    strict = dataclasses.replace(table, tolerance=0.0)
    records = strict.records()
    assert all(r["speedup"] is None for r in records)  # the baseline misses its own mean on one seed
    assert [r["step"] for r in records if r["refused_for_quality"]] == ["+ worse"]
    spread = table.baseline.quality_spread

    def solution(records, spread):  # the notebook's solution
        base = records[0]["quality"]
        return {r["step"]: "lost quality" if abs(r["quality"] - base) > spread else "noise"
                for r in records[1:] if r["refused_for_quality"]}

    assert check_refusal_diagnosis(solution, records, spread).passed
    assert not check_refusal_diagnosis(_diagnose, records, spread).passed  # "speedup is None" names "+ kept" too
