"""Measurement designs of chapter 10 that can show their lesson on a GPU, the trace reader, and MFU's guard."""

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fake_clock import FakeClock
from gpuformer_lib import bench, bottlenecks
from gpuformer_lib.exercises.profiling import check_read_backs_per_step

SHIPPED_TRACE = os.path.join(os.path.dirname(__file__), "..", "notebooks", "traces", "cpu-tiny-step.json")


# --------------------------------------------------------------------------- MFU against a peak the run cannot exceed


def test_mfu_refuses_a_value_above_one_and_says_the_peak_was_too_low():
    assert bench.mfu(1e15, 2.0, 1e15) == 0.5
    with pytest.raises(bench.ImpossibleValueError, match="measured too low"):
        bench.mfu(3.22e9, 0.0353, 74.7e9)  # the first edition's 'MFU 122.0%'


def test_measured_peak_is_the_fastest_repeat_measured_once(monkeypatch):
    calls = []

    def fake(n, dtype, device, *, repeats, max_seconds):
        calls.append((n, repeats, max_seconds))
        # times per product: a busy machine makes the median slow, the fastest repeat is the peak
        return SimpleNamespace(timing=bench.Timing(times=(4.0, 1.0, 3.0) + (4.0,) * (repeats - 3), warmup=2,
                                                   number=1))

    monkeypatch.setattr(bench, "measure_matmul", fake)
    monkeypatch.setattr(bench, "_MEASURED_PEAKS", {})
    peak = bench.measured_peak_flops("cpu", torch.float32)
    assert peak == max(bench.matmul_flops(n, n, n) for n in (512, 1024)) / 1.0
    assert calls == [(512, 10, None), (1024, 10, None)]  # every repeat runs: no early stop
    assert bench.measured_peak_flops("cpu", torch.float32) == peak and len(calls) == 2  # reused, not re-measured
    with pytest.raises(ValueError, match="repeats"):
        bench.measured_peak_flops("cpu", torch.float32, repeats=5, refresh=True)


# --------------------------------------------------------------------------- a sync's cost: the baseline never waits per step


def test_sync_cost_baseline_waits_once_per_round_not_per_step(monkeypatch):
    log = []
    clock = FakeClock()
    monkeypatch.setattr(bench, "time", clock)
    monkeypatch.setattr(bench, "synchronize", lambda device=None: log.append("sync"))

    def queued():
        log.append("q")
        clock.sleep(0.010)

    def reading():
        log.append("r")
        clock.sleep(0.015)

    cost = bottlenecks.sync_cost(queued, reading, "cpu", steps=5, repeats=5, warmup=0)
    runs = [r for r in "".join("|" if x == "sync" else x for x in log).split("|") if r]
    # 5 steps back to back, then one wait; interleaved rounds, the order reversed every other round
    assert runs == ["qqqqq", "rrrrr", "rrrrr", "qqqqq"] * 2 + ["qqqqq", "rrrrr"]
    assert cost.steps == 5 and len(cost.queued.times) == 5 and len(cost.reading.times) == 5
    assert cost.ratio == pytest.approx(1.5) and cost.comparison.verdict == "slower"
    with pytest.raises(ValueError, match="repeats"):
        bottlenecks.sync_cost(queued, reading, "cpu", steps=5, repeats=2)


def _cost(queued, reading):
    timings = {"queued": bench.Timing(tuple(queued), 0, 3), "reading": bench.Timing(tuple(reading), 0, 3)}
    return bottlenecks.SyncCost(bench.Comparison("queued", "reading", timings), 3)


def test_sync_cost_words_follow_the_verdict_not_a_threshold():
    # every round 1.5x slower: a cost beyond the spread, whatever a fixed band would say
    costly = _cost([0.1] * 5, [0.15] * 5)
    assert "the wait costs time" in bottlenecks.sync_cost_words(costly, "cuda")
    # on a CPU a read waits for nothing: the time a slower reading arm costs is the call's own
    on_cpu = bottlenecks.sync_cost_words(costly, "cpu")
    assert ".item() call itself" in on_cpu and "the wait costs time" not in on_cpu
    # a 2x median with rounds on both sides of 1: within the spread, no verdict of a cost
    noisy = _cost([0.1, 0.1, 0.1, 0.1, 0.1], [0.05, 0.2, 0.2, 0.05, 0.2])
    assert noisy.ratio == pytest.approx(2.0) and noisy.comparison.verdict == "no difference we can see"
    assert "no cost we can see" in bottlenecks.sync_cost_words(noisy, "cuda")
    assert "needs a GPU" in bottlenecks.sync_cost_words(noisy, "cpu")
    assert "GPU" not in bottlenecks.sync_cost_words(noisy, "cuda")
    with pytest.raises(TypeError, match="SyncCost"):
        bottlenecks.sync_cost_words(1.15, "cpu")


# --------------------------------------------------------------------------- input stalls: the host's time only


def test_input_pipeline_times_preparation_without_a_sync(monkeypatch):
    syncs = []
    monkeypatch.setattr(bench, "synchronize", lambda device=None: syncs.append(1))
    clock = FakeClock()  # each piece of work moves it by a known amount: exact values on any load
    monkeypatch.setattr(bottlenecks, "time", clock)

    def prepare(i):
        clock.sleep(0.002)
        return torch.zeros(2, 3, dtype=torch.long)

    def step(batches):
        clock.sleep(0.02)  # stands for the device's work: must not be booked as waiting for data

    per_step, prep = bottlenecks.time_input_pipeline(step, prepare, 3, "cpu")
    assert len(syncs) == 2  # before and after the loop, never inside the data timer
    assert prep == pytest.approx(0.002) and per_step == pytest.approx(0.02 + 0.002)
    with pytest.raises(ValueError, match="CPU tensor"):
        bottlenecks.time_input_pipeline(step, lambda i: [1, 2], 1, "cpu")


# --------------------------------------------------------------------------- reading a trace


def synthetic_gpu_trace():
    """A stream row with three kernels and two gaps inside one step window, a host row with an .item()."""
    ev = [
        {"ph": "X", "name": "ProfilerStep#1", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "name": "aten::item", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 80, "dur": 15},
        {"ph": "X", "name": "aten::_local_scalar_dense", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 81, "dur": 13},
        {"ph": "X", "name": "cudaStreamSynchronize", "cat": "cuda_runtime", "pid": 1, "tid": 1, "ts": 82, "dur": 10},
        {"ph": "X", "name": "nvjet_hsh_256x128", "cat": "kernel", "pid": 0, "tid": 7, "ts": 10, "dur": 30},
        {"ph": "X", "name": "flash_fwd_kernel", "cat": "kernel", "pid": 0, "tid": 7, "ts": 50, "dur": 20},
        {"ph": "X", "name": "elementwise", "cat": "kernel", "pid": 0, "tid": 7, "ts": 85, "dur": 5},
        {"ph": "i", "name": "marker", "pid": 1, "tid": 1, "ts": 5},
    ]
    return {"traceEvents": ev}


def test_busy_share_gaps_and_syncs_of_a_synthetic_trace():
    events = bottlenecks.load_trace(synthetic_gpu_trace())
    assert len(events) == 7  # the instant event is not a complete one
    (window,) = bottlenecks.profiler_steps(events)
    kernels = lambda e: e.get("cat") == "kernel"  # noqa: E731
    assert bottlenecks.busy_share(events, window, kernels) == pytest.approx(0.55)  # 30 + 20 + 5 of 100 us
    assert bottlenecks.launch_gaps(events, window, kernels) == [10, 15]
    assert [e["name"] for e in bottlenecks.host_syncs(events)] == ["aten::_local_scalar_dense"]  # once, not thrice
    assert bottlenecks.syncs_per_step(events) == 1
    with pytest.raises(ValueError, match="Chrome trace"):
        bottlenecks.load_trace({"events": []})


def test_gpu_side_step_windows_are_not_counted_as_more_steps():
    trace = synthetic_gpu_trace()
    trace["traceEvents"].append({"ph": "X", "name": "ProfilerStep#1", "cat": "gpu_user_annotation", "pid": 0,
                                 "tid": 7, "ts": 10, "dur": 95})  # the same step as the GPU ran it, later
    events = bottlenecks.load_trace(trace)
    assert len(bottlenecks.profiler_steps(events)) == 1 and bottlenecks.syncs_per_step(events) == 1
    (gpu_window,) = bottlenecks.profiler_steps(events, device_side=True)
    assert gpu_window["cat"] == "gpu_user_annotation"
    assert bottlenecks.busy_share(events, gpu_window, lambda e: e.get("cat") == "kernel") == pytest.approx(55 / 95)


def test_the_shipped_trace_is_a_labelled_cpu_trace_with_three_reads_per_step():
    with open(SHIPPED_TRACE) as f:
        raw = json.load(f)
    assert raw["gpuformer"]["device"] == "cpu" and os.path.getsize(SHIPPED_TRACE) < 400_000
    events = bottlenecks.load_trace(raw)
    assert len(bottlenecks.profiler_steps(events)) == 3
    assert bottlenecks.syncs_per_step(events) == raw["gpuformer"]["read_backs_per_step"] == 3
    assert not any(e.get("cat") == "kernel" for e in events)  # no GPU row: it is a CPU's trace


def test_the_shipped_trace_is_found_when_the_kernel_runs_in_another_folder(tmp_path, monkeypatch):
    """Chapter 10 names traces/cpu-tiny-step.json relative to notebooks/; a kernel started elsewhere (an IDE,
    `jupyter lab` from the repository root) got a bare FileNotFoundError from load_trace and exercise 10.1."""
    monkeypatch.chdir(tmp_path)
    assert len(bottlenecks.profiler_steps(bottlenecks.load_trace("traces/cpu-tiny-step.json"))) == 3
    assert check_read_backs_per_step(lambda ev: bottlenecks.syncs_per_step(ev), "traces/cpu-tiny-step.json")
    (tmp_path / "traces").mkdir()  # a file of that name where the kernel runs is the learner's: it comes first
    (tmp_path / "traces" / "cpu-tiny-step.json").write_text(json.dumps({"traceEvents": []}))
    assert bottlenecks.load_trace("traces/cpu-tiny-step.json") == []
    assert bottlenecks.shipped_file("traces/cpu-tiny-step.json") == Path("traces/cpu-tiny-step.json")


def test_a_missing_trace_says_where_it_should_be_and_where_to_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as err:
        bottlenecks.load_trace("traces/no-such-step.json")
    message = str(err.value)
    assert str(tmp_path) in message and str(bottlenecks.NOTEBOOKS_DIR / "traces" / "no-such-step.json") in message
    assert "expect the kernel to run there" in message and "make lab" in message
    with pytest.raises(FileNotFoundError, match="full path"):
        bottlenecks.load_trace(tmp_path / "absent.json")


def test_input_stall_words_follow_device_and_values():
    assert "nothing overlaps" in bottlenecks.input_stall_words(0.1, 0.01, "cpu")
    assert "hidden" in bottlenecks.input_stall_words(0.1, 0.01, "cuda")
    assert "waits for data" in bottlenecks.input_stall_words(0.1, 0.09, "cuda")
