"""The case-study harness on a toy task: a tiny language model learning repeating patterns."""

import dataclasses
import math

import pytest
import torch

from fake_clock import FakeClock
from gpuformer_lib import case_study as cs
from gpuformer_lib import speed
from gpuformer_lib.model import DecoderLM, TransformerConfig, transformer_flops
from gpuformer_lib.profiles import PROFILES, current_profile

CONFIG = TransformerConfig(vocab_size=12, d_model=32, n_heads=4, n_decoder_layers=1, d_ff=64, dropout=0.0, max_len=16,
                           tie_embeddings=False, positional="learned")
VAL = torch.cat([torch.randint(0, 12, (64, 4), generator=torch.Generator().manual_seed(99))] * 5, dim=1)[:, :13]


def toy_batches(setting, seed, epoch):
    g = torch.Generator().manual_seed(1000 * seed + epoch)
    size = setting.option("batch", 16)
    for _ in range(8):
        pattern = torch.randint(0, 12, (size, 4), generator=g)
        yield pattern.repeat(1, 4)[:, :13]  # (B, 13): 12 inputs, 12 targets


def toy_task(**changes):
    def build(setting):
        return DecoderLM(speed.model_config(CONFIG, setting.plan))

    def evaluate(model, device):
        return speed.next_token_loss(model, VAL.to(device))[0].item()

    fields = dict(name="toy patterns", build_model=build, batches=toy_batches, loss_fn=speed.next_token_loss,
                  count=lambda b: b[:, 1:].numel(), evaluate=evaluate, quality_name="validation loss",
                  higher_is_better=False, tolerance=0.05, budget=cs.Budget(tokens=16 * 12 * 48), lr=1e-2,
                  evaluations=3, flops=lambda b: float(transformer_flops(CONFIG, b.shape[0], b.shape[1] - 1)))
    fields.update(changes)
    return cs.Task(**fields)


CPU = PROFILES["cpu"] if "cpu" in PROFILES else current_profile("cpu")


def test_budget_and_task_refuse_bad_input():
    with pytest.raises(ValueError, match="exactly one"):
        cs.Budget()
    with pytest.raises(ValueError, match="exactly one"):
        cs.Budget(tokens=10, seconds=1.0)
    with pytest.raises(ValueError, match="tokens must be"):
        cs.Budget(tokens=0)
    with pytest.raises(ValueError, match="seconds must be"):
        cs.Budget(seconds=math.inf)
    with pytest.raises(ValueError, match="tolerance"):
        toy_task(tolerance=-1)
    with pytest.raises(TypeError, match="Budget"):
        toy_task(budget=100)
    with pytest.raises(ValueError, match="dtype"):  # plan_step checks its fields when it is made
        cs.plan_step("bad", dtype=torch.float64)


def test_schedule_warms_up_then_decays_to_a_tenth():
    task = toy_task(warmup=0.2, lr=1.0)
    assert task.lr_at(0.1) == pytest.approx(0.5)
    assert task.lr_at(0.2) == pytest.approx(1.0)
    assert task.lr_at(1.0) == pytest.approx(0.1)
    assert task.lr_at(0.6) == pytest.approx(0.55)


def test_settings_accumulate_and_skip_what_the_device_cannot_run():
    accs = [cs.option_step("bigger batches", batch=32), *cs.standard_accelerations(CPU)]
    rows = cs.cumulative_settings(cs.Setting(), accs, CPU, "cpu")
    names = [r[0] for r in rows]
    assert names[0] == "baseline" and names[1] == "+ bigger batches"
    last = rows[-1][1]
    assert last.option("batch") == 32 and last.plan.fused_attention and last.plan.fused_optimizer
    assert not last.plan.compile and not last.plan.tf32  # skipped on a CPU, with reasons
    reasons = {name: reason for name, _, reason in rows}
    assert "compute capability 8.0" in reasons["+ TF32 matmuls"]
    assert "GPU only" in reasons["+ torch.compile"]
    h100 = PROFILES["h100-80gb"]
    gpu_rows = cs.cumulative_settings(cs.Setting(), cs.standard_accelerations(h100), h100, "cuda")
    assert gpu_rows[-1][1].plan.dtype == torch.bfloat16 and gpu_rows[-1][1].plan.compile
    t4 = cs.standard_accelerations(PROFILES["t4"])
    assert t4[0].name.startswith("fp16") and t4[1].skip_reason(PROFILES["t4"], torch.device("cuda"))


def test_run_counts_tokens_evaluates_on_schedule_and_learns():
    task = toy_task()
    run, model = cs.train_run(task, cs.Setting(), "cpu", CPU, seed=0, keep_model=True)
    assert run.tokens == task.budget.tokens and run.steps == 48  # 6 epochs of 8 batches of 16 x 12 tokens
    assert [c[0] for c in run.curve] == [3072, 6144, 9216]
    times = [c[1] for c in run.curve]
    assert times == sorted(times) and run.seconds == times[-1] and 0 < run.first_step_seconds < run.seconds
    first_loss = speed.next_token_loss(DecoderLM(CONFIG), VAL)[0].item()
    assert run.quality < first_loss - 0.3  # it learned to copy part of the patterns
    assert run.quality == pytest.approx(speed.next_token_loss(model.eval(), VAL)[0].item())
    assert run.peak_bytes is None  # no CUDA allocator on a CPU
    assert run.flops == pytest.approx(48 * transformer_flops(CONFIG, 16, 12))


def test_same_seed_same_quality_and_seeds_differ():
    task = toy_task(budget=cs.Budget(tokens=16 * 12 * 8), evaluations=1)
    a, _ = cs.train_run(task, cs.Setting(), "cpu", CPU, seed=0)
    b, _ = cs.train_run(task, cs.Setting(), "cpu", CPU, seed=0)
    c, _ = cs.train_run(task, cs.Setting(), "cpu", CPU, seed=1)
    assert a.quality == b.quality and a.quality != c.quality


def test_time_budget_stops_on_time(monkeypatch):
    """On a clock of the test's own, which only the batches move (1/32 s each, exact in binary): the run must
    stop at the batch that reaches the budget, exactly, however long the steps really take on a busy machine."""
    clock = FakeClock()
    monkeypatch.setattr(cs, "time", clock)

    def slow_batches(setting, seed, epoch):
        for batch in toy_batches(setting, seed, epoch):
            clock.sleep(1 / 32)
            yield batch

    task = toy_task(budget=cs.Budget(seconds=0.25), evaluations=2, batches=slow_batches)
    run, _ = cs.train_run(task, cs.Setting(), "cpu", CPU)
    assert run.seconds == 0.25 and run.steps == 8  # 8 batches of 1/32 s, not one more
    assert [seconds for _, seconds, _ in run.curve] == [0.125, 0.25]  # evaluated at half the budget and at its end


def _table(rows, tolerance=0.05):
    return cs.AccelerationTable(task="t", unit="tokens", quality_name="loss", higher_is_better=False,
                                tolerance=tolerance, device="cpu", rows=tuple(rows))


def _run(curve, seconds=None):
    return cs.Run(seed=0, steps=10, tokens=100, seconds=seconds or curve[-1][1], first_step_seconds=0.1,
                  curve=tuple(curve), peak_bytes=None, flops=None)


def test_speedup_is_time_before_over_time_after_and_refused_when_quality_is_lost():
    base = cs.Row("baseline", cs.Setting(), (_run([(50, 4.0, 2.0), (100, 8.0, 1.00)]),))
    faster = cs.Row("+ fast", cs.Setting(), (_run([(50, 1.0, 1.9), (100, 2.0, 1.02)]),))
    reached_early = cs.Row("+ early", cs.Setting(), (_run([(50, 1.0, 1.04), (100, 2.0, 0.9)]),))
    worse = cs.Row("+ broken", cs.Setting(), (_run([(50, 0.5, 2.5), (100, 1.0, 1.2)]),))
    skipped = cs.Row("+ tf32", cs.Setting(), skipped="TF32 needs a GPU")
    table = _table([base, faster, reached_early, worse, skipped])
    assert table.target == pytest.approx(1.05)
    assert table.speedup(base) == 1.0
    # interpolated: the baseline meets 1.05 at 4 + (1.05 - 2.0) / (1.0 - 2.0) * 4 = 7.8 s, the fast row at
    # 1 + (1.05 - 1.9) / (1.02 - 1.9) * 1 = 1.966 s
    assert table.time_to_quality(base) == pytest.approx(7.8)
    assert table.speedup(faster) == pytest.approx(7.8 / (1 + 0.85 / 0.88))
    assert table.speedup(reached_early) == pytest.approx(7.8 / 1.0)  # reached the target at its first evaluation
    assert table.speedup(worse) is None and "outside the tolerance of 0.05" in table.verdict(worse)
    assert table.verdict(skipped).startswith("skipped: TF32")
    assert table.final is worse  # the last row that ran
    text, page = str(table), table._repr_html_()
    assert "3.97x" in text and "no speedup reported" in text and "<table>" in page and "time to quality" in page
    higher = dataclasses.replace(table, higher_is_better=True)
    assert higher.target == pytest.approx(0.95) and higher.kept_quality(worse)


def test_a_seed_that_misses_the_target_gets_no_speedup():
    base = cs.Row("baseline", cs.Setting(), (_run([(100, 8.0, 1.0)]), _run([(100, 9.0, 1.0)])))
    mixed = cs.Row("+ x", cs.Setting(), (_run([(50, 1.0, 1.0), (100, 2.0, 1.0)]), _run([(50, 1.0, 1.5), (100, 2.0, 1.5)])))
    table = _table([base, mixed], tolerance=0.3)
    assert table.kept_quality(mixed)  # the mean, 1.25, is within 0.3 of 1.0
    assert table.speedup(mixed) is None and "not reached" in table.verdict(mixed)
    assert mixed.quality_spread == pytest.approx(0.5)


def test_harness_end_to_end_keeps_models_reports_mfu_and_refuses_a_broken_step():
    task = toy_task(evaluations=2)
    sabotage = cs.Acceleration("learning rate 0 (a broken step)", lambda s: s.with_options(frozen=True))

    def build(setting):
        model = DecoderLM(speed.model_config(CONFIG, setting.plan))
        if setting.option("frozen"):
            for p in model.parameters():
                p.requires_grad_(False)
            model.lm_head.weight.requires_grad_(True)  # something to optimise, but next to nothing learns
            with torch.no_grad():
                model.lm_head.weight.mul_(0)
        return model

    task = dataclasses.replace(task, build_model=build)
    accs = [cs.plan_step("fused attention", fused_attention=True, check_token_ids=False),
            cs.plan_step("TF32", skip_reason=lambda p, d: "needs a GPU", tf32=True), sabotage]
    table, models = cs.run_case_study(task, accs, device="cpu", profile=CPU, seeds=(0, 1), keep_models=True,
                                      peak_flops=lambda s: 1e15, progress=False)
    assert [r.name for r in table.rows] == ["baseline", "+ fused attention", "+ TF32", "+ learning rate 0 (a broken step)"]
    assert set(models) == {"baseline", "+ fused attention", "+ learning rate 0 (a broken step)"}
    assert all(len(r.runs) == 2 for r in table.measured) and table.rows[2].skipped == "needs a GPU"
    assert 0 < table.baseline.mfu < 1
    assert table.kept_quality(table.rows[1])  # the fused kernel computes the same function
    broken = table.rows[3]
    assert not table.kept_quality(broken) and table.speedup(broken) is None
    records = table.records()
    assert records[3]["speedup"] is None and "no speedup reported" in records[3]["verdict"]
    assert records[2]["step_ms"] is None and records[0]["speedup"] == 1.0
    assert records[3]["refused_for_quality"] and not records[1]["refused_for_quality"]
    assert "range" in str(table)  # two seeds: the quality's range is shown
    # every row that ran was timed in the same interleaved rounds; the rates are those rounds'
    rounds = len(table.baseline.timing.times)
    assert rounds >= 5 and all(len(r.timing.times) == rounds for r in table.measured)
    assert records[1]["rate"] == pytest.approx(1 / table.rows[1].timing.median)


def test_the_table_shows_one_bar_over_its_runs(capsys):
    """Progress for a long table: one bar over rows x seeds (a skipped row is not counted), naming the row and
    seed in training, then the timing; the runs' own bars stay off."""
    task = toy_task(budget=cs.Budget(tokens=16 * 12 * 2), evaluations=1)
    accs = [cs.plan_step("fused attention", fused_attention=True, check_token_ids=False),
            cs.plan_step("TF32", skip_reason=lambda p, d: "needs a GPU", tf32=True)]
    cs.run_case_study(task, accs, device="cpu", profile=CPU, seeds=(0, 1), timing_steps=1)
    err = capsys.readouterr().err
    assert f"{task.name}: training runs" in err and "4/4" in err and "5/" not in err
    assert "+ fused attention, seed 1" in err and "timing the 2 rows interleaved" in err
    assert err.count(task.name) == err.count(f"{task.name}: training runs")  # no bar of a run's own
    cs.run_case_study(task, accs, device="cpu", profile=CPU, timing_steps=None, progress=False)
    assert capsys.readouterr().err == ""


def test_impossible_mfu_fails():
    task = toy_task(budget=cs.Budget(tokens=16 * 12 * 2), evaluations=1)
    with pytest.raises(Exception, match="MFU"):
        cs.run_case_study(task, [], device="cpu", profile=CPU, peak_flops=lambda s: 1.0, progress=False)


def test_non_finite_quality_fails_with_a_message():
    task = toy_task(budget=cs.Budget(tokens=16 * 12 * 2), evaluations=1, evaluate=lambda m, d: float("nan"))
    with pytest.raises(cs.NonFiniteQualityError, match="validation loss = nan"):
        cs.train_run(task, cs.Setting(), "cpu", CPU)


def test_cuda_graphs_are_refused():
    with pytest.raises(ValueError, match="graph per shape"):
        cs.train_run(toy_task(), cs.Setting().with_plan(compile=True, cuda_graphs=True), "cpu", CPU)


def test_a_tolerance_below_the_seed_spread_is_named_as_the_reason():
    base = cs.Row("baseline", cs.Setting(), (_run([(100, 8.0, 1.0)]), _run([(100, 9.0, 1.2)])))  # mean 1.1
    other = cs.Row("+ x", cs.Setting(), (_run([(100, 2.0, 1.05)]), _run([(100, 2.0, 1.05)])))
    table = _table([base, other], tolerance=0.0)
    assert table.time_to_quality(base) is None  # the worse seed never reaches the mean
    assert "the baseline itself did not reach the target" in table.verdict(other)
    assert not table.records()[1]["refused_for_quality"]


def test_row_step_is_the_step_train_run_trains():
    task = toy_task()
    setting = cs.Setting()
    built = cs.row_step(task, setting, "cpu", seed=3)
    # AdamW with the task's parameter groups: weights decayed, biases and norms not
    decays = sorted({g["weight_decay"] for g in built.optimizer.param_groups})
    assert decays == [0.0, task.weight_decay]
    batch = next(iter(task.batches(setting, 3, 0)))
    first = built.step([batch]).loss.item()
    again = cs.row_step(task, setting, "cpu", seed=3)  # seeded: the same model, the same first loss
    assert again.step([batch]).loss.item() == pytest.approx(first)
    run, model = cs.train_run(task, setting, "cpu", CPU, seed=3, keep_model=True)
    fresh = cs.row_step(task, setting, "cpu", seed=3).model
    assert type(model) is type(fresh) and run.steps > 0
    with pytest.raises(ValueError, match="CUDA graphs"):
        cs.row_step(task, setting.with_plan(compile=True, cuda_graphs=True), "cpu")


def test_ratio_words_choose_from_the_value():
    assert cs.ratio_words(1.5) == "faster" and cs.ratio_words(0.5) == "slower" and cs.ratio_words(1.05) == "about as fast"
    assert cs.ratio_words(1.1) == "faster" and cs.ratio_words(1 / 1.1) == "slower"
    assert cs.ratio_words(1.12, margin=1.15, above="gain") == "about as fast"
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="ratio"):
            cs.ratio_words(bad)
    with pytest.raises(ValueError, match="margin"):
        cs.ratio_words(1.5, margin=0.9)


def test_summary_and_gain_words_follow_the_table():
    base = cs.Row("baseline", cs.Setting(), (_run([(50, 4.0, 2.0), (100, 8.0, 1.00)], seconds=8.0),))
    fast = cs.Row("+ fast", cs.Setting(), (_run([(50, 1.0, 1.9), (100, 2.0, 1.02)], seconds=2.0),))
    skipped = cs.Row("+ tf32", cs.Setting(), skipped="TF32 needs a GPU")
    broken = cs.Row("+ broken", cs.Setting(), (_run([(50, 0.5, 2.5), (100, 1.0, 1.2)], seconds=1.0),))
    s = _table([base, fast, skipped]).summary()
    speedup = 7.8 / (1 + 0.85 / 0.88)
    assert s["final"] == "+ fast" and s["speedup"] == pytest.approx(speedup) and s["rate_ratio"] == pytest.approx(4.0)
    assert "sooner" in s["speed_words"] and f"{speedup:.2f}x" in s["speed_words"]
    assert s["ttq_words"].startswith("about the same as")  # 3.97 against 4.0
    assert s["refused"] == [] and s["kept"] == ["baseline", "+ fast"]
    assert s["baseline_ttq"] == pytest.approx(7.8)
    refused = _table([base, fast, skipped, broken]).summary()
    assert refused["speedup"] is None and refused["refused"] == ["+ broken"] and "no speedup" in refused["speed_words"]
    table = _table([base, fast, skipped, broken])
    ratio, before, words = table.gain("+ broken")
    assert before == "+ fast" and ratio == pytest.approx(2.0) and words == "a clear gain"  # the skipped row passed over
    with pytest.raises(ValueError, match="not a measured row"):
        table.gain("+ tf32")


def test_fixing_row_picks_the_first_row_that_addresses_a_category():
    fixes = (("matrix products", ("bf16", "fp16")), ("attention", ("fused attention",)))
    rows = ["baseline", "+ token-budget batches", "+ fp16 autocast", "+ bf16 autocast", "+ fused attention"]
    assert cs.fixing_row("matrix products", rows, fixes) == "+ bf16 autocast"  # the fixes' order, not the rows'
    assert cs.fixing_row("attention", rows[:3], fixes) is None
    with pytest.raises(ValueError, match="unknown profile category"):
        cs.fixing_row("loss", rows, fixes)
    assert cs.fixing_row("loss", rows, fixes, strict=False) is None


def _timed(row, seconds_per_token):
    return dataclasses.replace(row, timing=cs.bench.Timing(tuple(seconds_per_token), warmup=1, number=1))


def test_timed_rows_take_rates_and_times_to_quality_from_the_interleaved_rounds():
    # tokens to quality come from the runs' curves; seconds per token from the rounds, not from the runs' clocks
    base = _timed(cs.Row("baseline", cs.Setting(), (_run([(50, 4.0, 2.0), (100, 8.0, 1.00)], seconds=8.0),)),
                  [0.02] * 5)
    fast = _timed(cs.Row("+ fast", cs.Setting(), (_run([(50, 9.0, 1.9), (100, 99.0, 1.02)], seconds=99.0),)),
                  [0.01] * 5)
    noisy = _timed(cs.Row("+ noisy", cs.Setting(), (_run([(50, 1.0, 1.9), (100, 2.0, 1.02)], seconds=2.0),)),
                   [0.02, 0.005, 0.02, 0.005, 0.008])
    table = _table([base, fast, noisy])
    tokens_base = 50 + 50 * (2.0 - 1.05) / (2.0 - 1.0)  # interpolated to the target 1.05
    tokens_fast = 50 + 50 * (1.9 - 1.05) / (1.9 - 1.02)
    assert base.rate == pytest.approx(50) and fast.rate == pytest.approx(100)  # 1 / seconds per token
    assert base.step_seconds == pytest.approx(0.02 * 10)  # 100 tokens in 10 steps
    assert table.time_to_quality(base) == pytest.approx(tokens_base * 0.02)
    value = (tokens_base * 0.02) / (tokens_fast * 0.01)
    assert table.speedup(fast) == pytest.approx(value)  # the run's own clock (99 s) is not used
    assert table.speedup_range(fast) == pytest.approx((value, value))  # every round ran it twice as fast
    assert table.verdict(fast) == f"{value:.2f}x ({value:.2f}-{value:.2f})"
    assert table.gain("+ fast") == (pytest.approx(2.0), "baseline", "a clear gain")
    # a median gap inside the rounds' spread earns no verdict, however large the median ratio
    ratio, before, words = table.gain("+ noisy")
    assert ratio > 1.15 and before == "+ fast" and words == "within the spread of the interleaved rounds"
    summary = table.summary()
    assert summary["final"] == "+ noisy" and "about as long" in summary["speed_words"]
    assert "interleaved rounds" in table.caption() and table.records()[1]["timed_rounds"] == 5
    with pytest.raises(ValueError, match="same rounds"):
        odd = _timed(fast, [0.01] * 6)
        _table([base, odd]).comparison(odd)


def test_interleaved_row_timings_are_seconds_per_real_token_of_k_steps(monkeypatch):
    calls = {}

    def fake_interleaved(fns, **kwargs):
        for name, fn in fns.items():  # one call each: the harness's k steps
            fn()
            calls[name] = calls.get(name, 0) + 1
        return {name: cs.bench.Timing((2.0, 4.0, 3.0), warmup=1, number=1) for name in fns}

    monkeypatch.setattr(cs.bench, "time_interleaved", fake_interleaved)
    task = toy_task()
    settings = {"baseline": cs.Setting(), "+ bigger batches": cs.Setting().with_options(batch=32)}
    timings = cs.interleaved_row_timings(task, settings, "cpu", k=3)
    tokens = {"baseline": 3 * 16 * 12, "+ bigger batches": 3 * 32 * 12}  # k batches of B rows, 12 targets each
    assert calls == {"baseline": 1, "+ bigger batches": 1}
    for name, timing in timings.items():
        assert timing.times == pytest.approx(tuple(t / tokens[name] for t in (2.0, 4.0, 3.0)))
    with pytest.raises(ValueError, match="at least two"):
        cs.interleaved_row_timings(task, {"baseline": cs.Setting()}, "cpu")
    with pytest.raises(ValueError, match="k must be"):
        cs.interleaved_row_timings(task, settings, "cpu", k=0)
