"""Distributed training on 2 CPU processes (gloo): every strategy of chapters 11 and 12 computes what
one process computes, a failing rank ends the run with its error, and impossible requests are refused."""

import dataclasses
import datetime
import json
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

import gpuformer_lib
from gpuformer_lib import distributed as D
from gpuformer_lib import profiles

ROOT = Path(__file__).resolve().parents[1]
DATA_PARALLEL = D.worker_path("data_parallel")
MODEL_PARALLEL = D.worker_path("model_parallel")


def run(script, command, nproc=2):
    return D.launch(script, nproc, [command], backend="gloo", echo=False, timeout_s=240).results


def test_ranks_and_an_all_reduce():
    assert run(DATA_PARALLEL, "hello")["rank_sum"] == 1.0  # 0 + 1


def test_data_parallel_equals_one_process():
    """One launch checks every variant. NaiveDataParallel accumulates two micro-batches with a pause between
    them (the review's 0.218 gap came from an all-reduce finishing before the next micro-batch added to the
    same gradient); token-weighted DDP with rank 0's share mostly padding equals one process on the whole
    batch only with the token count all-reduced, and dividing by each rank's own count (the old step) makes
    the replicas diverge; the 16-bit compression hook differs by 16-bit rounding."""
    results = run(DATA_PARALLEL, "equivalence")
    assert set(results["gaps"]) == {"average_gradients", "NaiveDataParallel", "NaiveDataParallel + no_sync",
                                    "NaiveDataParallel, 2 micro-batches", "DDP", "DDP + no_sync"}
    for name, gap in results["gaps"].items():
        assert gap["gradient"] < 1e-6 and gap["loss"] < 1e-5 and gap["weights"] < 1e-5, (name, gap)
    assert results["replicas_identical"]
    uneven = results["uneven_padding"]
    assert uneven["tokens_per_rank"][0] < uneven["tokens_per_rank"][1] / 2  # really uneven
    fixed, old = uneven["token count all-reduced"], uneven["each rank's own count (the old step)"]
    assert fixed["weight_gap"] < 1e-6 and fixed["replica_spread"] == 0.0, fixed
    assert old["weight_gap"] > 1e-3 and old["replica_spread"] > 1e-3, old  # the bug the fix removed
    hook = results["bf16_hook"]
    assert 1e-6 < hook["relative_gap"] < 1e-2, hook  # 16-bit rounding: not float32's, not garbage
    assert results["zero1"]["weight_gap"] < 1e-6  # the same launch runs ZeRO-1 (chapter 11's page reads it)


def test_ddp_accumulation_through_the_step_builder_equals_one_process_with_one_all_reduce_per_step():
    """Two micro-batches per rank through make_train_step: the same weights as one process on the whole
    batch, and with no_sync half the all-reduces of a run without it (one round per step, not two)."""
    results = run(DATA_PARALLEL, "accumulation")["accumulation"]
    held, every = results["no_sync"], results["all-reduce every micro-batch"]
    assert held["weight_gap"] < 1e-5 and every["weight_gap"] < 1e-5, results
    assert len(held["all_reduces_per_step"]) == 3 and min(held["all_reduces_per_step"]) >= 1
    assert [2 * k for k in held["all_reduces_per_step"]] == every["all_reduces_per_step"]


def test_zero1_sharded_adamw_equals_one_process_with_half_the_optimizer_state():
    """ZeRO stage 1 by hand (ShardedAdamW): each rank updates its half of the flattened parameters with its own
    AdamW moments, then all-gathers. The weights equal torch.optim.AdamW on the same averaged gradients exactly
    (AdamW is elementwise) and one process on the whole batch to float32 rounding; each rank holds 8 bytes per
    parameter of its shard, half of replicated AdamW's (an odd count: the last shard padded)."""
    result = run(DATA_PARALLEL, "zero1")["zero1"]
    assert result["gap_to_replicated"] < 1e-7 and result["weight_gap"] < 1e-6, result
    psi, n = result["n_params"], result["world_size"]
    assert psi % 2 == 1 and result["shard_size"] == (psi + 1) // 2
    assert result["replicated_state_bytes"] == 8 * psi
    assert result["state_bytes_per_rank"] == [8 * result["shard_size"]] * n == [result["formula_bytes_per_rank"]] * n
    assert D.zero1_bytes_per_rank(psi, 1) == 8 * psi and D.zero1_bytes_per_rank(10, 4) == 24
    with pytest.raises(ValueError):
        D.zero1_bytes_per_rank(0, 2)


def test_ring_all_reduce_and_its_timing():
    result = run(DATA_PARALLEL, "allreduce")["allreduce"]
    assert result["ring_correct"] and len(result["seconds"]) == len(result["bytes"])
    assert result["hierarchical_correct"] == {"2 nodes x 1": True, "1 nodes x 2": True}


def test_pipelines_equal_one_process():
    both = run(MODEL_PARALLEL, "gpipe")
    gpipe = both["gpipe"]
    assert [r["micro_batches"] for r in gpipe] == [1, 2, 4, 8]
    # the same launch: hand-written GPipe and 1F1B orders at p = 2, m = 8, memory measured on each rank
    memory = both["pipeline_memory"]
    assert [r["peak_in_flight"] for r in memory["GPipe"]] == [8, 8] and [r["peak_in_flight"] for r in memory["1F1B"]] == [2, 1]
    assert all(r["gradient_gap"] < 1e-6 for name in ("GPipe", "1F1B") for r in memory[name])
    assert memory["1F1B"][0]["peak_saved_bytes"] <= memory["GPipe"][0]["peak_saved_bytes"] * 2 / 8 * 1.01
    assert all(r["gradient_gap"] < 1e-6 for r in gpipe)
    assert gpipe[0]["bubble_predicted"] == 0.5 and 0.4 < gpipe[0]["idle_measured"] < 0.6  # one micro-batch: half idle
    schedules = run(MODEL_PARALLEL, "pipelining")["pipelining"]
    for name in ("GPipe", "1F1B"):
        assert schedules[name]["gradient_gap"] < 1e-6 and schedules[name]["loss_gap"] < 1e-6


def test_tensor_parallel_equals_one_process():
    results = run(MODEL_PARALLEL, "tensor")
    for name, gap in results["tensor"].items():
        assert gap < 1e-5, name
    counted = results["tensor_bytes"]  # Megatron's MLP: one all-reduce of (rows, C) forward (g), one backward (f)
    message = counted["rows"] * counted["width"] * counted["element_bytes"]
    assert counted["forward"] == [message] and counted["backward"] == [message]


def test_fsdp_equals_one_process_and_memory_matches_the_calculator():
    r = run(MODEL_PARALLEL, "fsdp")["fsdp"]
    assert r["loss_gap"] < 1e-5 and r["weight_gap"] < 1e-5
    for held in r["held_per_rank"]:
        for part in ("weights", "gradients", "optimizer"):
            assert abs(held[part] - r["calculator"][part]) <= 0.02 * r["calculator"][part], part
    # ZeRO-3's 3 Psi, counted on FSDP2's collectives: blocks gathered twice, the root (kept gathered) once
    psi, root, b = r["n_params"], r["root_params"], r["element_bytes"]
    assert r["all_gathered_bytes"] == b * (2 * (psi - root) + root) and r["reduce_scattered_bytes"] == b * psi


def test_a_two_dimensional_mesh_equals_one_process():
    result = D.launch(MODEL_PARALLEL, 4, ["mesh"], backend="gloo", echo=False, timeout_s=240).results["mesh"]
    assert result["weight_gap"] < 1e-6 and result["local_w1"] == [64, 64]  # a quarter of W1 per rank


def test_a_failing_rank_ends_the_run_with_its_error():
    with pytest.raises(D.LaunchError, match="failed on rank 1") as info:
        D.launch(DATA_PARALLEL, 2, ["fail"], backend="gloo", echo=False, timeout_s=240)
    assert "failed on purpose" in str(info.value)
    # the other rank was stopped, not left waiting: the run ended by the failure, not by the launcher's timeout
    assert "did not finish within" not in str(info.value)


def test_too_many_gpus_are_refused():
    present = torch.cuda.device_count()
    advice = "backend='gloo'" if present == 0 else f"--nproc_per_node={present}"
    with pytest.raises(D.TooFewGPUsError, match=advice):
        D.launch(DATA_PARALLEL, present + 1, ["hello"], backend="nccl")


def test_launch_errors():
    with pytest.raises(FileNotFoundError, match="cannot be started in another process"):
        D.launch(ROOT / "scripts" / "missing.py", 2)
    with pytest.raises(ValueError, match="the workers are data_parallel, model_parallel"):
        D.worker_path("pipeline")
    with pytest.raises(RuntimeError, match="not started by torchrun"):
        D.DistEnv.from_env({})
    env = D.DistEnv.from_env({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                              "MASTER_ADDR": "node0", "MASTER_PORT": "29500"})
    assert (env.rank, env.local_rank, env.world_size, env.is_main) == (3, 1, 4, False)


def test_launch_arguments_are_checked_before_anything_starts(monkeypatch, tmp_path):
    """nproc=0 used to run the default world size (`nproc or default`); bad arguments now fail with what to pass."""
    started = []
    monkeypatch.setattr(D.subprocess, "Popen", lambda cmd, **kwargs: started.append(cmd) or 1 / 0)
    script = tmp_path / "worker.py"
    script.write_text("")
    bad = [({"nproc": 0}, ValueError, "nproc must be at least 1, got 0"),
           ({"nproc": True}, TypeError, "nproc must be an int"), ({"nproc": 2.0}, TypeError, "nproc must be an int"),
           ({"timeout_s": 0}, ValueError, "timeout_s must be a positive"),
           ({"timeout_s": float("nan")}, ValueError, "timeout_s must be a positive"),
           ({"timeout_s": "60"}, TypeError, "timeout_s must be a number"),
           ({"args": "hello"}, TypeError, r"args must be a list .* \['hello'\]"),
           ({"backend": "NCCL"}, ValueError, "backend must be 'gloo'"),
           ({"threads_per_process": 0}, ValueError, "threads_per_process must be at least 1"),
           ({"extra_env": {"X": 1}}, TypeError, "extra_env must map names to strings")]
    for kwargs, error, message in bad:
        with pytest.raises(error, match=message):
            D.launch(script, **{"nproc": 2, "backend": "gloo", **kwargs})
    with pytest.raises(FileNotFoundError, match="no script"):
        D.launch(tmp_path, 2, backend="gloo")  # a folder is not a script
    assert started == []
    monkeypatch.setattr(D, "default_world_size", lambda: 3)
    with pytest.raises(ZeroDivisionError):
        D.launch(script, None, backend="gloo")  # None is the default world size
    assert "--nproc_per_node=3" in started[0]


def test_weak_scaling_efficiency_is_t1_over_tn():
    """Chapter 11's review: 13.5 ms without communication, 25.2 ms with an all-reduce after backward on 2
    processes was printed as 'efficiency 74 % (speedup 1.47x on 2)'; weak scaling's efficiency is t1 / tN."""
    speed, efficiency = D.weak_scaling(13.5e-3, 25.2e-3, 2)
    assert efficiency == pytest.approx(13.5 / 25.2) and speed == pytest.approx(2 * 13.5 / 25.2)
    assert round(speed, 2) == 1.07 and round(efficiency, 2) == 0.54
    assert D.weak_scaling(1.0, 1.0, 8) == (8.0, 1.0)  # free communication: N times the work per second
    with pytest.raises(ValueError):
        D.weak_scaling(0.0, 1.0, 2)


def test_comparisons_from_a_workers_rounds():
    rounds = {"a": [1.0] * 6, "b": [2.0] * 6, "c": [1.0, 1.0, 1.01, 0.99, 1.0, 1.0]}
    found = D.comparisons_from_rounds(rounds, "a", warmup=1)
    assert set(found) == {"b", "c"} and found["b"].speedup == 0.5 and found["b"].verdict == "slower"
    assert found["c"].verdict == "no difference we can see" and found["b"].ratios == (0.5,) * 6
    with pytest.raises(ValueError, match="baseline"):
        D.comparisons_from_rounds(rounds, "z")
    with pytest.raises(ValueError, match="at least 5"):
        D.comparisons_from_rounds({"a": [1.0] * 4, "b": [1.0] * 4}, "a")
    with pytest.raises(ValueError, match="same rounds"):
        D.comparisons_from_rounds({"a": [1.0] * 6, "b": [1.0] * 5}, "a")


def test_cost_models():
    speed, efficiency = D.scaling(10.0, 2.7, 4)  # the first seed's 10 h -> 2.7 h on 4 GPUs
    assert round(speed, 1) == 3.7 and round(efficiency, 2) == 0.93
    assert D.gpipe_bubble(4, 1) == 0.75 and D.gpipe_bubble(4, 12) == pytest.approx(3 / 15)
    assert D.ring_allreduce_time(1e9, 1, 1e-5, 1e11) == 0.0
    assert D.ring_allreduce_time(8e9, 8, 0.0, 1e11) == pytest.approx(2 * 7 / 8 * 0.08)
    assert D.ring_allreduce_time(0, 4, 1e-5, 1e11) == pytest.approx(6e-5)
    with pytest.raises(ValueError):
        D.gpipe_bubble(0, 4)


def test_the_workers_ship_inside_the_package():
    """Colab installs only the package: the workers must be in it, not in the repository's scripts/."""
    package = Path(gpuformer_lib.__file__).parent
    for name in D.WORKERS:
        path = D.worker_path(name)
        assert path.is_file() and path.parent == package / "workers", path
    setuptools = pytest.importorskip("setuptools")
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert "gpuformer_lib.workers" in setuptools.find_packages(str(ROOT), include=include)  # what a wheel holds
    assert not (ROOT / "scripts" / "data_parallel.py").exists()  # one copy, in the package


def test_a_worker_runs_as_a_module_from_anywhere(tmp_path):
    """`python -m gpuformer_lib.workers.data_parallel hello` starts its own processes, from any folder."""
    out = subprocess.run([sys.executable, "-m", "gpuformer_lib.workers.data_parallel", "hello", "--nproc", "2"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=240,
                         env={**os.environ, "GPUFORMER_BACKEND": "gloo"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all_reduce of the ranks: 1" in out.stdout


def test_the_slurm_script_runs_a_worker_module():
    text = (ROOT / "scripts" / "slurm_ddp.sbatch").read_text()
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "slurm_ddp.sbatch")]).returncode == 0
    module, command = re.search(r"-m (gpuformer_lib\.workers\.\w+) (\w+)\s*$", text).groups()
    worker = __import__(module, fromlist=["COMMANDS"])
    assert command in worker.COMMANDS


@pytest.mark.parametrize("gpus", range(1, 9))
def test_the_data_parallel_world_divides_the_workers_batch(gpus):
    from gpuformer_lib.workers import data_parallel

    profile = dataclasses.replace(profiles.PROFILES["8xh100"], gpu_count=gpus)
    world, backend = profiles.data_parallel_world(profile, data_parallel.GLOBAL_BATCH)
    assert data_parallel.GLOBAL_BATCH % world == 0  # equivalence would raise otherwise (3, 5, 6, 7 GPUs)
    assert data_parallel.GLOBAL_BATCH // world >= 2  # each rank's share splits into 2 non-empty micro-batches
    assert (world, backend) == ((2, "gloo") if gpus == 1 else ({3: 2, 5: 4, 6: 4, 7: 4}.get(gpus, gpus), "nccl"))


def test_nccl_process_group_binds_its_gpu(monkeypatch):
    """With NCCL each rank makes its GPU current and passes it as device_id (the communicator is created
    at once, for the right GPU); gloo passes none. torch.cuda and init_process_group are stubbed."""
    calls = {}
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.setdefault("set_device", device))
    monkeypatch.setattr(D.dist, "init_process_group", lambda backend, **kw: calls.setdefault(backend, kw))
    monkeypatch.setattr(D.dist, "is_initialized", lambda: False)
    for name, value in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                        "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(profiles.REHEARSE_ENV, raising=False)
    with D.process_group("nccl", timeout_s=5) as (env, device):
        assert device == torch.device("cuda", 1)
    assert calls["set_device"] == torch.device("cuda", 1)
    assert calls["nccl"]["device_id"] == torch.device("cuda", 1)
    assert calls["nccl"]["timeout"] == datetime.timedelta(seconds=5)
    with D.process_group("gloo") as (env, device):
        assert device == torch.device("cpu")
    assert calls["gloo"]["device_id"] is None


def test_one_gpu_refusal_names_the_gloo_backend(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(D.TooFewGPUsError, match="--nproc_per_node=1 or fewer.*GPUFORMER_BACKEND=gloo"):
        D.check_gpus(2)


def test_gpipe_waits_for_the_gpu_before_every_clock_read(monkeypatch, tmp_path):
    """On a GPU, run_gpipe must synchronize before each clock read around a stage's work, or it times
    kernel launches. Rehearsing an H100 on one gloo process; the sync and the clock record their order."""
    monkeypatch.setenv(profiles.REHEARSE_ENV, "h100-80gb")
    events = []
    real_clock = time.perf_counter
    monkeypatch.setattr(D.gpu, "synchronize", lambda device=None: events.append("sync"))
    D.dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        monkeypatch.setattr(D.time, "perf_counter", lambda: events.append("clock") or real_clock())
        stage = torch.nn.Linear(4, 4)
        loss, busy = D.run_gpipe(stage, torch.randn(8, 4), torch.randn(8, 4), torch.nn.functional.mse_loss, 2, (4, 4))
    finally:
        monkeypatch.setattr(D.time, "perf_counter", real_clock)
        D.dist.destroy_process_group()
    assert loss is not None and busy > 0
    clocks = [i for i, e in enumerate(events) if e == "clock"]
    assert len(clocks) == 8  # 2 micro-batches x (forward, backward) x (start, end)
    assert all(events[i - 1] == "sync" for i in clocks)


def test_collective_backend_gives_nccl_only_to_real_gpus_enough_for_every_process():
    h100 = profiles.PROFILES["h100-80gb"]
    node = profiles.PROFILES["8xh100"]
    assert profiles.collective_backend(profiles.PROFILES["cpu"], 2) == "gloo"
    assert profiles.collective_backend(h100, 1) == "nccl"
    assert profiles.collective_backend(h100, 2) == "gloo"  # one GPU cannot host two NCCL ranks
    assert profiles.collective_backend(node, 8) == "nccl"
    assert profiles.collective_backend(dataclasses.replace(node, rehearsal=True), 8) == "gloo"  # CPU processes
    with pytest.raises(ValueError, match="processes must be (an int )?>= 1"):  # either wording of profiles.py
        profiles.collective_backend(node, 0)


def test_fsdp_traffic_is_counted_under_either_name_torch_gives_its_collectives(monkeypatch, tmp_path):
    """FSDP2 calls all_gather_single and reduce_scatter_single from torch 2.13 on, all_gather_into_tensor and
    reduce_scatter_tensor before. The counter names none of them: it counts every public all-gather and
    reduce-scatter function this torch exports, each call once, also when one calls the other, and also one
    called through distributed_c10d. Before: a list of names (first only the 2.13 ones, an AttributeError on an
    older torch). An older torch is rehearsed by removing the new names, a newer one by adding a name; one gloo
    process."""
    from gpuformer_lib.workers.model_parallel import CountShardedCollectives

    D.dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        x, out = torch.randn(8), torch.empty(8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # 2.13 deprecates the older names
            with CountShardedCollectives() as counted:
                D.dist.all_gather_into_tensor(out, x)
                D.dist.reduce_scatter_single(output=out, input=x)
            assert (counted.gathered, counted.scattered) == (32, 32)
            real_single = D.dist.all_gather_single
            monkeypatch.setattr(D.dist, "all_gather_into_tensor",  # the old name calling the new one
                                lambda output_tensor, input_tensor, **kw: D.dist.all_gather_single(output_tensor,
                                                                                                    input_tensor, **kw))
            with CountShardedCollectives() as counted:
                D.dist.all_gather_into_tensor(output_tensor=out, input_tensor=x)
            assert counted.gathered == 32
            monkeypatch.undo()
            for name in ("all_gather_single", "reduce_scatter_single"):
                monkeypatch.delattr(D.dist, name)
            with CountShardedCollectives() as counted:
                D.dist.all_gather_into_tensor(output_tensor=out, input_tensor=x)
                D.dist.reduce_scatter_tensor(out, x)
            assert (counted.gathered, counted.scattered) == (32, 32)
            assert not hasattr(D.dist, "all_gather_single")  # put back as it found them
            monkeypatch.undo()
            assert D.dist.all_gather_single is real_single
            torch.testing.assert_close(out, x)  # the collectives ran (one rank: a copy)
            # a torch whose FSDP2 calls a name this counter has never heard of, and calls through distributed_c10d
            c10d = D.dist.distributed_c10d

            def all_gather_renamed(output_tensor, input_tensor, group=None, async_op=False):
                return real_single(output_tensor, input_tensor, group=group, async_op=async_op)

            for module in (D.dist, c10d):
                monkeypatch.setattr(module, "all_gather_renamed", all_gather_renamed, raising=False)
            monkeypatch.setattr(c10d, "__all__", [*c10d.__all__, "all_gather_renamed"])
            with CountShardedCollectives() as counted:
                D.dist.all_gather_renamed(out, input_tensor=x)
                c10d.reduce_scatter_tensor(output=out, input=x)
                D.dist.all_gather([torch.empty(8)], x)  # the list form: the list is what is gathered
            assert (counted.gathered, counted.scattered) == (64, 32)
            assert D.dist.all_gather_renamed is all_gather_renamed and c10d.all_gather_single is real_single
    finally:
        monkeypatch.undo()
        D.dist.destroy_process_group()


def test_a_result_line_with_another_ranks_output_glued_to_its_end_is_still_read():
    from gpuformer_lib.distributed import result_of

    assert result_of('RESULT {"mesh": {"weight_gap": 1e-07}}') == ({"mesh": {"weight_gap": 1e-07}}, "")
    # torchrun's tee put rank 1's next output on the end of rank 0's result line (seen in CI as 'Extra data')
    result, rest = result_of('RESULT {"mesh": {"weight_gap": 1e-07}}[rank1]: step 3 done')
    assert result == {"mesh": {"weight_gap": 1e-07}} and rest == "[rank1]: step 3 done"
    with pytest.raises(json.JSONDecodeError):
        result_of('RESULT {"mesh": {"weight_ga')  # a cut object is not guessed at
    with pytest.raises(ValueError, match="JSON object"):
        result_of("RESULT [1, 2]")


def test_a_worker_rank_leaves_without_the_interpreter_s_teardown_once_its_group_is_gone(monkeypatch):
    """run_command ends a torchrun rank with os._exit(0) after its results are reported and its process group is
    destroyed: a chapter 12 rank that had reported everything died of SIGABRT in gloo's teardown in CI."""
    import contextlib

    from gpuformer_lib import workers

    events = []

    @contextlib.contextmanager
    def group(backend, timeout_s):
        events.append("group")
        yield "env", "cpu"
        events.append("destroyed")

    class Exited(Exception):
        pass

    def exit_now(code):
        events.append(f"exit {code}")
        raise Exited

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(workers.distributed, "process_group", group)
    monkeypatch.setattr(workers.distributed, "report", lambda name, value: events.append(f"report {name}"))
    monkeypatch.setattr(workers.os, "_exit", exit_now)
    with pytest.raises(Exited):
        workers.run_command({"work": lambda env, device: events.append("work")}, "gpuformer_lib.workers.x",
                            ["work"])
    assert events == ["group", "work", "report seconds", "destroyed", "exit 0"]
