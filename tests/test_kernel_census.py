"""scripts/kernel_census.py runs (on a CPU: the tiny preset, no kernels) and each committed census (one per GPU)
agrees with the GPU suite's profiled kernel count of the same step on the same GPU."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from gpuformer_lib import gpu_results
from gpuformer_lib.tools.notebooks import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "kernel_census.py"
CENSUSES = sorted((REPO_ROOT / "bench_results").glob("kernel-census-*.json"))
DEVICES = [p.stem.removeprefix("kernel-census-") for p in CENSUSES]


def test_a_census_is_committed_for_the_devices_that_have_one():
    assert {"nvidia-h100-80gb-hbm3", "nvidia-h200"} <= set(DEVICES)


def load_script():
    spec = importlib.util.spec_from_file_location("kernel_census", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_census_runs_on_a_cpu_and_counts_what_it_dispatches():
    run = load_script().census(torch.device("cpu"), fused_optimizer=False)
    ops = run["operators"]
    assert run["kernels_per_step"] == 0 and run["dispatched_per_step"] == sum(v["dispatched"] for v in ops.values())
    assert ops["aten::mm"]["dispatched"] > 0 and ops["aten::view"]["dispatched"] > 0


@pytest.mark.parametrize("path", CENSUSES, ids=DEVICES)
def test_each_committed_census_agrees_with_the_suites_profile_on_its_gpu(path):
    census = json.loads(path.read_text())
    foreach, fused = census["runs"]
    assert not foreach["fused_optimizer"] and fused["fused_optimizer"]
    suite = gpu_results.load_results()[path.stem.removeprefix("kernel-census-")]["items"]["ch10.profile_step"]
    profiled = gpu_results.lookup(suite, "values.kernels_per_step")
    assert abs(foreach["kernels_per_step"] / profiled - 1) < 0.02, (foreach["kernels_per_step"], profiled)
    # fused AdamW launches fewer kernels than foreach AdamW; forward, loss and backward are the same
    optimizer = [sum(v["kernels"] for n, v in run["operators"].items() if "foreach" in n or "fused_adamw" in n)
                 for run in (foreach, fused)]
    assert optimizer[1] < optimizer[0]
    assert foreach["kernels_per_step"] - optimizer[0] == fused["kernels_per_step"] - optimizer[1]


@pytest.mark.parametrize("path", CENSUSES, ids=DEVICES)
def test_each_committed_launch_floor_is_a_host_bound_step_of_the_same_kernels(path):
    """At batch 1 and 16-256 tokens the step's GPU work fills only part of its time (the host issuing kernels
    sets it), and it launches the kernels the census counted at batch 4 x 1024 (within 5 %)."""
    census = json.loads(path.read_text())
    for fused, run in zip(("False", "True"), census["runs"]):
        rows = census["launch_floor"][fused]
        assert [r["seq_len"] for r in rows] == [16, 64, 256]
        for r in rows:
            assert r["gpu_busy_s"] < r["step_s_median"], r
            assert abs(r["kernels_per_step"] / run["kernels_per_step"] - 1) < 0.05, r
            assert r["seconds_per_kernel"] == r["step_s_median"] / r["kernels_per_step"]
