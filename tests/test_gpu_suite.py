"""The GPU measurement suite, on the CPU: every item's code rehearsed at toy sizes under the T4 and H100
profiles, with no Jupyter package importable; the runner's caps, failures, crashes, budget and files; a run
killed during an item keeps every earlier item's results.

The suite and its worker run as subprocesses, as on a GPU node (``python -m gpuformer_lib.gpu_suite``).
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from gpuformer_lib.gpu_suite import core, runner

ROOT = Path(__file__).resolve().parents[1]
JUPYTER = ("IPython", "ipykernel", "ipywidgets", "nbformat", "nbclient", "nbval", "jupyter_client", "jupyter_core",
           "matplotlib_inline", "myst_nb", "jupyter_book")
BLOCKER = textwrap.dedent(f"""
    import importlib.abc, sys

    class _NoJupyter(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {JUPYTER!r}:
                raise ImportError(f"the GPU suite must not import {{name}} (a Jupyter package)")
            return None

    sys.meta_path.insert(0, _NoJupyter())
""")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a suite run: Jupyter packages blocked in every process (sitecustomize), one thread."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFORMER_")}
    env.update(PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]), OMP_NUM_THREADS="1", **extra)
    return env


def _suite(tmp_path, *args, timeout=240, **env):
    return subprocess.run([sys.executable, "-m", "gpuformer_lib.gpu_suite", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=_env(tmp_path, **env))


def _bench_gpu_listing() -> list[str]:
    folder = ROOT / "bench_results" / "gpu"
    return sorted(str(p.relative_to(folder)) + f" {p.stat().st_mtime_ns}" for p in folder.rglob("*")) \
        if folder.exists() else []


def test_the_list_covers_every_chapter_within_the_default_budget(tmp_path):
    done = _suite(tmp_path, "--list", timeout=120)
    assert done.returncode == 0, done.stderr
    items = core.ordered_items()
    one_gpu = [it for it in items if it.min_gpus == 1]
    assert {it.chapter for it in one_gpu} == set(range(17)), "every chapter 0-16 has an item measuring on one GPU"
    for it in items:
        assert f"{it.chapter_key}  {it.key:34s} cap {it.cap_s:5.0f} s" in done.stdout
    # the default run (300 s) expects to cover every one-GPU item on one GPU, the worker's start included
    assert sum(it.expect_s for it in one_gpu) + runner.STARTUP_S / 3 <= 300, sum(it.expect_s for it in one_gpu)
    heavy = [it.heavy for it in items]
    assert heavy == sorted(heavy), "compiles and training come after every light item"


@pytest.mark.parametrize("profile, budget", [("t4", 600), ("h100-80gb", 60)])
def test_every_item_rehearses_on_the_cpu_without_jupyter_and_writes_nothing_under_bench_results(tmp_path, profile,
                                                                                                  budget):
    """Every one-GPU item runs its code at toy sizes (on a quiet machine in about 20 s; the T4 run has a budget
    no load can exhaust, the H100 run the 60 s of the issue, within which it must also finish)."""
    before = _bench_gpu_listing()
    out = tmp_path / "out"
    done = _suite(tmp_path, "--budget", str(budget), "--out", str(out), GPUFORMER_REHEARSE=profile, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _bench_gpu_listing() == before
    folder = out / f"rehearsal-{profile}"
    summary = json.loads((folder / "suite.json").read_text())
    statuses = {row["key"]: row["status"] for row in summary["items"]}
    one_gpu = {it.key for it in core.ordered_items() if it.min_gpus == 1}
    assert {k for k, s in statuses.items() if s == "passed"} == one_gpu, statuses
    assert summary["environment"]["rehearsal"] == profile
    assert summary["seconds"] <= budget + runner.GRACE_S
    for chapter in range(17):
        data = json.loads((folder / f"ch{chapter:02d}.json").read_text())
        assert data["schema"] == core.SCHEMA and data["device"]["rehearsed_profile"] == profile
        for key, entry in data["items"].items():
            assert entry["status"] == "passed" and entry["rehearsal"] == profile, (key, entry["error"])
            assert entry["versions"]["torch"] and entry["commit"]
            for name, m in entry["measurements"].items():
                assert len(m["repeats"]) == m["n"] >= 3 and m["min"] <= m["median"] <= m["max"], (key, name)


def test_a_rehearsal_without_out_goes_to_a_temporary_folder_and_refuses_bench_results(tmp_path):
    first = core.ordered_items()[0].key
    done = _suite(tmp_path, "--only", first, GPUFORMER_REHEARSE="t4")
    assert done.returncode == 0, done.stdout + done.stderr
    where = done.stdout.strip().splitlines()[-1].split("files in ", 1)[1]
    assert Path(where).resolve().is_relative_to(Path(tempfile.gettempdir()).resolve())
    refused = _suite(tmp_path, "--out", str(ROOT / "bench_results" / "gpu"), GPUFORMER_REHEARSE="t4")
    assert refused.returncode == 2 and "must not go to" in refused.stdout


def test_on_a_cpu_it_refuses_with_a_clear_message(tmp_path):
    done = _suite(tmp_path, "--budget", "10")
    assert done.returncode == 2 and "torch.cuda.is_available() is False" in done.stdout
    assert "GPUFORMER_REHEARSE=h100-80gb" in done.stdout
    cpu = _suite(tmp_path, GPUFORMER_REHEARSE="cpu")
    assert cpu.returncode == 2 and "not a GPU profile" in cpu.stdout


TEST_ITEMS = """
import os, time
import torch
from gpuformer_lib.gpu_suite import item, runner

runner.REHEARSAL_EXPECT_S = 1e9  # these items are judged by their own estimates, rehearsed or not
runner.GRACE_S = 1.0  # and stopped 1 s past their cap, not 5

@item(0, "quick", cap_s=5, title="passes")
def quick(ctx):
    ctx.time("add", lambda: torch.ones(4) + 1)
    ctx.compare("same", ("a", lambda: torch.ones(4) * 2), ("b", lambda: torch.ones(4) + 1))
    ctx.value("answer", 42, "1", "a constant, for the test")
    ctx.target("answer_at_least_40", 42, 40)

@item(1, "raises", cap_s=5, title="fails")
def raises(ctx):
    raise RuntimeError("this item is wrong")

@item(2, "hangs", cap_s=1, title="passes its cap")
def hangs(ctx):
    time.sleep(60)

@item(3, "crashes", cap_s=5, title="kills its process")
def crashes(ctx):
    os._exit(3)

@item(4, "after", cap_s=5, title="runs after the others")
def after(ctx):
    ctx.time("mul", lambda: torch.ones(4) * 3)

@item(5, "too_long", cap_s=500, title="never fits a short budget")
def too_long(ctx):
    raise AssertionError("must be skipped")

@item(6, "budget_eater", cap_s=500, expect_s=1, title="outlasts any budget")
def budget_eater(ctx):
    time.sleep(600)

@item(11, "two_gpus", cap_s=5, title="needs two GPUs", min_gpus=2)
def two_gpus(ctx):
    raise AssertionError("must be skipped on one GPU")
"""


@pytest.fixture
def test_items(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "suite_test_items.py").write_text(TEST_ITEMS)
    return {"GPUFORMER_SUITE_ITEMS": "suite_test_items", "GPUFORMER_REHEARSE": "t4"}


def test_a_failing_hanging_or_crashing_item_is_recorded_and_the_suite_goes_on(tmp_path, test_items):
    out = tmp_path / "out"
    keys = "ch00.quick,ch01.raises,ch02.hangs,ch03.crashes,ch04.after,ch05.too_long,ch11.two_gpus"
    done = _suite(tmp_path, "--budget", "100", "--out", str(out), "--only", keys, **test_items)
    assert done.returncode == 1, done.stdout + done.stderr
    folder = out / "rehearsal-t4"
    rows = {row["key"]: row for row in json.loads((folder / "suite.json").read_text())["items"]}
    assert {k: r["status"] for k, r in rows.items()} == {
        "ch00.quick": "passed", "ch01.raises": "failed", "ch02.hangs": "failed", "ch03.crashes": "failed",
        "ch04.after": "passed", "ch05.too_long": "skipped", "ch11.two_gpus": "skipped"}
    assert "this item is wrong" in rows["ch01.raises"]["error"]
    assert "stopped at its cap of 1 s" in rows["ch02.hangs"]["error"]
    assert "exit status 3" in rows["ch03.crashes"]["error"]
    assert "would not fit" in rows["ch05.too_long"]["why"] and "needs 2 GPUs" in rows["ch11.two_gpus"]["why"]
    quick = json.loads((folder / "ch00.json").read_text())["items"]["ch00.quick"]
    assert quick["values"]["answer"] == {"value": 42.0, "unit": "1", "how": "a constant, for the test"}
    assert quick["targets"] == [{"name": "answer_at_least_40", "value": 42.0, "at_least": 40.0, "met": True}]
    same = quick["comparisons"]["same"]
    assert same["speedup"] == same["before"]["median"] / same["after"]["median"]
    assert json.loads((folder / "ch04.json").read_text())["items"]["ch04.after"]["status"] == "passed"
    assert not (folder / "ch05.json").exists()  # a skipped item writes no file, and replaces no earlier result


def test_the_budget_is_honoured_and_an_item_it_cuts_short_is_not_a_failure(tmp_path, test_items):
    out = tmp_path / "out"
    done = _suite(tmp_path, "--budget", "8", "--out", str(out), "--only", "ch00.quick,ch06.budget_eater",
                  timeout=60, **test_items)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "rehearsal-t4" / "suite.json").read_text())
    rows = {row["key"]: row for row in summary["items"]}
    assert rows["ch00.quick"]["status"] == "passed" and rows["ch06.budget_eater"]["status"] == "skipped"
    assert "the budget ran out" in rows["ch06.budget_eater"]["why"]
    assert summary["seconds"] < 8 + 1 + 5
    assert not (out / "rehearsal-t4" / "ch06.json").exists()


def test_a_run_killed_during_an_item_keeps_every_earlier_items_file(tmp_path, test_items):
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "gpuformer_lib.gpu_suite", "--out", str(out), "--budget", "100",
                             "--only", "ch00.quick,ch01.raises,ch04.after", "--pause-during", "ch04.after"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=_env(tmp_path, **test_items))
    try:
        for line in proc.stdout:
            if line.startswith("paused during ch04.after"):
                break
        else:
            pytest.fail("the run never reached ch04.after")
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    folder = out / "rehearsal-t4"
    assert sorted(p.name for p in folder.iterdir()) == ["ch00.json", "ch01.json", "suite.json"]  # no temp files
    assert json.loads((folder / "ch00.json").read_text())["items"]["ch00.quick"]["status"] == "passed"
    assert json.loads((folder / "ch01.json").read_text())["items"]["ch01.raises"]["status"] == "failed"
    rows = json.loads((folder / "suite.json").read_text())["items"]
    assert [r["key"] for r in rows] == ["ch00.quick", "ch01.raises"]


def test_a_chapter_file_keeps_the_items_not_run_this_time(tmp_path):
    path = tmp_path / "ch01.json"
    env = {"device": {"name": "X"}}
    core.merge_item(path, env, "ch01.a", {"status": "passed", "run": 1})
    core.merge_item(path, env, "ch01.b", {"status": "passed", "run": 2})
    core.merge_item(path, env, "ch01.a", {"status": "failed", "run": 3})
    assert json.loads(path.read_text())["items"] == {"ch01.a": {"status": "failed", "run": 3},
                                                     "ch01.b": {"status": "passed", "run": 2}}


def test_an_interrupted_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "ch00.json"
    core.write_json_atomic(path, {"old": True})

    def broken(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(core.json, "dump", broken)
    with pytest.raises(KeyboardInterrupt):
        core.write_json_atomic(path, {"new": True})
    assert json.loads(path.read_text()) == {"old": True} and [p.name for p in tmp_path.iterdir()] == ["ch00.json"]


def test_device_folders_and_item_names():
    assert core.device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert core.device_slug("???") == "unknown-device"
    with pytest.raises(ValueError, match="chapter"):
        core.item(17, "x", cap_s=1, title="t")
    with pytest.raises(ValueError, match="cap_s"):
        core.item(1, "x", cap_s=0, title="t")
    with pytest.raises(ValueError, match="name"):
        core.item(1, "Bad Name", cap_s=1, title="t")
