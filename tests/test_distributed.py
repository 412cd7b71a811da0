"""Distributed training on 2 CPU processes (gloo): every strategy of chapters 11 and 12 computes what
one process computes, a failing rank ends the run with its error, and impossible requests are refused."""

import time
from pathlib import Path

import pytest
import torch

from gpuformer_lib import distributed as D

ROOT = Path(__file__).resolve().parents[1]
DATA_PARALLEL = ROOT / "scripts" / "data_parallel.py"
MODEL_PARALLEL = ROOT / "scripts" / "model_parallel.py"


def run(script, command, nproc=2):
    return D.launch(script, nproc, [command], backend="gloo", echo=False, timeout_s=240).results


def test_ranks_and_an_all_reduce():
    assert run(DATA_PARALLEL, "hello")["rank_sum"] == 1.0  # 0 + 1


def test_data_parallel_equals_one_process():
    results = run(DATA_PARALLEL, "equivalence")
    assert set(results["gaps"]) == {"average_gradients", "NaiveDataParallel", "DDP", "DDP + no_sync"}
    for name, gap in results["gaps"].items():
        assert gap["gradient"] < 1e-6 and gap["loss"] < 1e-5 and gap["weights"] < 1e-5, (name, gap)
    assert results["replicas_identical"]


def test_ring_all_reduce_and_its_timing():
    result = run(DATA_PARALLEL, "allreduce")["allreduce"]
    assert result["ring_correct"] and len(result["seconds"]) == len(result["bytes"])


def test_pipelines_equal_one_process():
    gpipe = run(MODEL_PARALLEL, "gpipe")["gpipe"]
    assert [r["micro_batches"] for r in gpipe] == [1, 2, 4, 8]
    assert all(r["gradient_gap"] < 1e-6 for r in gpipe)
    assert gpipe[0]["bubble_predicted"] == 0.5 and 0.4 < gpipe[0]["idle_measured"] < 0.6  # one micro-batch: half idle
    schedules = run(MODEL_PARALLEL, "pipelining")["pipelining"]
    for name in ("GPipe", "1F1B"):
        assert schedules[name]["gradient_gap"] < 1e-6 and schedules[name]["loss_gap"] < 1e-6


def test_tensor_parallel_equals_one_process():
    for name, gap in run(MODEL_PARALLEL, "tensor")["tensor"].items():
        assert gap < 1e-5, name


def test_fsdp_equals_one_process_and_memory_matches_the_calculator():
    r = run(MODEL_PARALLEL, "fsdp")["fsdp"]
    assert r["loss_gap"] < 1e-5 and r["weight_gap"] < 1e-5
    for held in r["held_per_rank"]:
        for part in ("weights", "gradients", "optimizer"):
            assert abs(held[part] - r["calculator"][part]) <= 0.02 * r["calculator"][part], part


def test_a_two_dimensional_mesh_equals_one_process():
    result = D.launch(MODEL_PARALLEL, 4, ["mesh"], backend="gloo", echo=False, timeout_s=240).results["mesh"]
    assert result["weight_gap"] < 1e-6 and result["local_w1"] == [64, 64]  # a quarter of W1 per rank


def test_a_failing_rank_ends_the_run_with_its_error():
    started = time.perf_counter()
    with pytest.raises(D.LaunchError, match="rank 1") as info:
        D.launch(DATA_PARALLEL, 2, ["fail"], backend="gloo", echo=False, timeout_s=120)
    assert "failed on purpose" in str(info.value)
    assert time.perf_counter() - started < 60  # the other rank was stopped, not left waiting


def test_too_many_gpus_are_refused():
    present = torch.cuda.device_count()
    advice = "backend='gloo'" if present == 0 else f"--nproc_per_node={present}"
    with pytest.raises(D.TooFewGPUsError, match=advice):
        D.launch(DATA_PARALLEL, present + 1, ["hello"], backend="nccl")


def test_launch_errors():
    with pytest.raises(FileNotFoundError, match="cannot be started in another process"):
        D.launch(ROOT / "scripts" / "missing.py", 2)
    with pytest.raises(RuntimeError, match="not started by torchrun"):
        D.DistEnv.from_env({})
    env = D.DistEnv.from_env({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                              "MASTER_ADDR": "node0", "MASTER_PORT": "29500"})
    assert (env.rank, env.local_rank, env.world_size, env.is_main) == (3, 1, 4, False)


def test_cost_models():
    speed, efficiency = D.scaling(10.0, 2.7, 4)  # the first seed's 10 h -> 2.7 h on 4 GPUs
    assert round(speed, 1) == 3.7 and round(efficiency, 2) == 0.93
    assert D.gpipe_bubble(4, 1) == 0.75 and D.gpipe_bubble(4, 12) == pytest.approx(3 / 15)
    assert D.ring_allreduce_time(1e9, 1, 1e-5, 1e11) == 0.0
    assert D.ring_allreduce_time(8e9, 8, 0.0, 1e11) == pytest.approx(2 * 7 / 8 * 0.08)
    assert D.ring_allreduce_time(0, 4, 1e-5, 1e11) == pytest.approx(6e-5)
    with pytest.raises(ValueError):
        D.gpipe_bubble(0, 4)
