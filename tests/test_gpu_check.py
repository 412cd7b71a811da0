"""`make gpu-check` without a GPU, its report when items pass, fail, crash or are skipped, its budget, and what it
needs of a GPU node: no venv, no pip, no nbval, no Jupyter package to collect the gpu-marked tests.

The node is imitated here: a ``sys.meta_path`` finder in a subprocess refuses the packages such a node lacks
(:data:`gpu_check.NOT_ON_A_GPU_NODE`), and pytest's plugin autoloading is off, so nbval's options are as unknown
as where nbval is not installed."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuformer_lib.tools import gpu_check, notebooks
from gpuformer_lib.tools.notebooks import REPO_ROOT

BLOCKER = textwrap.dedent("""
    import importlib.abc
    import sys

    BLOCKED = {blocked!r}

    class NotOnAGpuNode(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {{name!r}} (blocked: not on a GPU node)", name=name)
            return None

    sys.meta_path.insert(0, NotOnAGpuNode())
""").format(blocked=set(gpu_check.NOT_ON_A_GPU_NODE))


def _node_env(tmp_path: Path) -> dict:
    """The environment of a process that behaves, for imports, like the GPU node: a sitecustomize installs the
    blocker before anything else runs."""
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUFORMER_", "PYTEST_"))}
    return {**env, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_ROOT)]), "OMP_NUM_THREADS": "1",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def test_without_a_gpu_it_exits_at_once_saying_so(capsys):
    assert gpu_check.main([]) == 2
    err = capsys.readouterr().err
    assert "needs an NVIDIA GPU" in err and "make rehearse" in err


def test_a_failing_or_crashing_item_fails_the_verdict_and_the_others_still_run(tmp_path):
    def crash():
        raise RuntimeError("boom")

    lines = []
    results = gpu_check.run_checks([("ok", lambda: (True, "")), ("crash", crash), ("bad", lambda: (False, "why")),
                                    ("after", lambda: (True, ""))], echo=lines.append)
    assert [r.passed for r in results] == [True, False, False, True]
    assert "RuntimeError: boom" in results[1].detail
    path = gpu_check.write_report(results, tmp_path)
    report = json.loads(path.read_text())
    assert report["verdict"] == "FAIL" and [i["name"] for i in report["items"]] == ["ok", "crash", "bad", "after"]
    assert report["device"]["torch_version"] and path.name.startswith("gpu-check-")
    assert gpu_check.write_report(results[:1], tmp_path) == path and json.loads(path.read_text())["verdict"] == "PASS"


def test_the_report_is_rewritten_after_each_item_and_a_skip_is_not_a_failure(tmp_path):
    """A run killed part-way keeps the items done so far (before: the report was written only at the end)."""
    written = []

    def report(results):
        written.append(gpu_check.write_report(results, tmp_path, budget_s=60, finished=False))

    def second(_seconds):
        so_far = json.loads(written[-1].read_text())  # what a kill now would leave
        assert [i["name"] for i in so_far["items"]] == ["first"] and so_far["verdict"] == "RUNNING"
        raise gpu_check.Skip("not run: nothing to run it with")

    items = [gpu_check.Item("first", lambda s: (True, "fine")), gpu_check.Item("second", second)]
    results = gpu_check.run_checks(items, echo=lambda line: None, budget_s=60, on_result=report)
    assert [r.status for r in results] == ["PASS", "SKIP"] and results[1].detail == "not run: nothing to run it with"
    final = json.loads(gpu_check.write_report(results, tmp_path, budget_s=60).read_text())
    assert final["verdict"] == "PASS" and final["finished"] and final["items"][1]["status"] == "SKIP"
    assert not list(tmp_path.glob(".*tmp*"))  # through a temporary file, replaced


def test_the_budget_caps_each_item_and_skips_what_does_not_fit(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(gpu_check.time, "monotonic", lambda: clock[0])
    given = {}

    def spend(name, seconds_used):
        def check(seconds):
            given[name] = seconds
            clock[0] += seconds_used
            return True, ""
        return check

    items = [gpu_check.Item("a", spend("a", 70), cap_s=100), gpu_check.Item("b", spend("b", 10), cap_s=100),
             gpu_check.Item("c", spend("c", 0), min_s=30), gpu_check.Item("d", spend("d", 0), skip="said why")]
    lines = []
    results = gpu_check.run_checks(items, echo=lines.append, budget_s=100)
    assert given == {"a": 100, "b": 30}  # b got what was left, not its cap
    assert [r.status for r in results] == ["PASS", "PASS", "SKIP", "SKIP"]
    assert "20 s of the 100 s budget left" in results[2].detail and "--budget" in results[2].detail
    assert results[3].detail == "said why" and any(line.startswith("SKIP") for line in lines)


def test_a_command_past_its_time_is_stopped_with_its_children(tmp_path):
    marker = tmp_path / "child-still-running"
    (tmp_path / "child.py").write_text(f"import pathlib, time\ntime.sleep(3)\npathlib.Path({str(marker)!r}).touch()\n")
    (tmp_path / "parent.py").write_text("import subprocess, sys, time\n"
                                        "subprocess.Popen([sys.executable, 'child.py'])\n"
                                        "print('started', flush=True)\ntime.sleep(60)\n")
    passed, detail = gpu_check._run([sys.executable, "parent.py"], 1.5, cwd=tmp_path)
    assert not passed and "timed out after 2 s" in detail and "started" in detail
    import time

    time.sleep(3.5)
    assert not marker.exists()  # the whole process group was killed


def test_gpu_test_files_are_exactly_the_files_with_the_gpu_marker():
    listed = gpu_check.gpu_test_files()
    by_scan = sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "tests").glob("test_*.py")
                     if re.search(r"pytest\.mark\.gpu\b|pytestmark\s*=.*\bgpu\b", p.read_text()))
    assert listed == by_scan and "tests/test_kernels.py" in listed and "tests/test_book.py" not in listed
    items = {i.name: i for i in gpu_check.default_items(quick=True)}
    assert items["gpu-marked tests"].skip is None


def test_the_gpu_test_files_import_without_any_jupyter_package(tmp_path):
    """Each file gpu_check collects, and the conftest files pytest loads with them, imported where the Jupyter
    packages, PyYAML and onnxscript cannot be (before: eight test modules imported them at top level, and the
    gpu-marked item stopped at "8 errors during collection")."""
    files = [REPO_ROOT / "conftest.py", REPO_ROOT / "tests" / "conftest.py",
             *(REPO_ROOT / f for f in gpu_check.gpu_test_files())]
    code = textwrap.dedent(f"""
        import importlib.util, sys
        sys.path[:0] = [{str(REPO_ROOT / 'tests')!r}, {str(REPO_ROOT)!r}]
        for i, path in enumerate({[str(f) for f in files]!r}):
            spec = importlib.util.spec_from_file_location(f"collected_{{i}}", path)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
        import gpuformer_lib.tools.gpu_check  # the command itself too
        try:
            import nbformat
        except ModuleNotFoundError as err:
            assert "blocked" in str(err)
        else:
            raise SystemExit("the blocker let nbformat through")
        print("imported", i + 1)
    """)
    done = subprocess.run([sys.executable, "-c", code], env=_node_env(tmp_path), cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"imported {len(files)}" in done.stdout


def test_the_gpu_marked_item_runs_where_nbval_and_jupyter_are_missing(tmp_path):
    """gpu_check's own pytest command, as the item runs it, in a Python that behaves like the node: nbval's
    options from pyproject are unknown there (before: "unrecognized arguments", nothing ran), and only the gpu
    files are collected. Without a GPU every gpu test is skipped, which is a pass."""
    cmd = gpu_check.pytest_command(["-m", "gpu", *gpu_check.gpu_test_files()])
    assert "addopts=" in cmd
    done = subprocess.run(cmd, env=_node_env(tmp_path), cwd=REPO_ROOT, capture_output=True, text=True, timeout=540)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert re.search(r"\d+ skipped, \d+ deselected", last) and "error" not in last, out[-3000:]


def test_the_notebooks_are_one_skipped_item_where_jupyter_is_missing(monkeypatch):
    monkeypatch.setattr(gpu_check, "missing_notebook_packages", lambda: ["nbclient", "ipykernel"])
    items = gpu_check.default_items(quick=False)
    notebook_items = [i for i in items if i.name.startswith("notebook")]
    assert len(notebook_items) == 1 and "nbclient, ipykernel" in notebook_items[0].skip
    (result,) = gpu_check.run_checks(notebook_items, echo=lambda line: None)
    assert result.status == "SKIP" and "Jupyter packages" in result.detail
    monkeypatch.setattr(gpu_check, "missing_notebook_packages", lambda: [])
    items = [i for i in gpu_check.default_items(quick=False) if i.name.startswith("notebook")]
    assert len(items) == len(notebooks.notebook_paths()) and all(i.skip is None for i in items)
    assert not [i for i in gpu_check.default_items(quick=True) if i.name.startswith("notebook")]


def test_outside_a_clone_the_notebooks_and_tests_are_skipped_saying_why(monkeypatch, tmp_path):
    """A library installed into site-packages (not from a clone) has no notebooks/ beside it: the check says
    so instead of passing with zero notebooks."""
    monkeypatch.setattr(notebooks, "REPO_ROOT", tmp_path)
    items = {i.name: i for i in gpu_check.default_items(quick=False)}
    assert "no notebooks/ folder" in items["notebooks"].skip and "clone" in items["notebooks"].skip
    assert "clone" in items["gpu-marked tests"].skip and "clone" in items["Triton kernels compiled, against torch"].skip
    results = gpu_check.run_checks([items["notebooks"]], echo=lambda line: None)
    assert results[0].status == "SKIP"
    assert gpu_check.default_report_folder() == Path.cwd() / "bench_results"


def test_an_installed_library_outside_a_clone_refuses_to_find_no_notebooks(tmp_path):
    """A non-editable install: the library copied into a site-packages folder, imported from there."""
    site = tmp_path / "site-packages"
    shutil.copytree(REPO_ROOT / "gpuformer_lib", site / "gpuformer_lib",
                    ignore=shutil.ignore_patterns("__pycache__"))
    code = ("from gpuformer_lib.tools import notebooks\n"
            "try:\n    notebooks.notebook_paths()\n"
            "except notebooks.NotACheckoutError as err:\n    print('REFUSED', err)\n"
            "else:\n    print('FOUND')\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.startswith("REFUSED"), done.stdout + done.stderr
    assert str(site / "gpuformer_lib") in done.stdout and "not in a clone" in done.stdout
    assert "Run from a clone" in done.stdout and "--repo" in done.stdout
    with pytest.raises(notebooks.NotACheckoutError, match="no notebooks/ folder"):
        notebooks.notebook_paths(tmp_path)
    assert notebooks.checkout_root() == REPO_ROOT and notebooks.notebook_paths()


def test_the_toolchain_check_names_what_triton_lacks(monkeypatch, tmp_path):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(gpu_check.shutil, "which", lambda name: None)
    monkeypatch.setattr(gpu_check.sysconfig, "get_paths", lambda scheme=None: {"include": str(tmp_path)})
    problems = gpu_check.compiler_problems()
    assert any("no C compiler" in p for p in problems) and any("Python.h" in p for p in problems)
    items = {i.name: i for i in gpu_check.default_items(quick=True)}
    assert "C compiler" in items["ladder, tiny preset"].skip
    assert "C compiler" in items["Triton kernels compiled, against torch"].skip
    (result,) = gpu_check.run_checks([items["toolchain for Triton and Inductor (C compiler, Python.h)"]],
                                     echo=lambda line: None)
    assert result.status == "FAIL" and "Python.h" in result.detail
    monkeypatch.setenv("CC", "gcc-that-is-not-there")
    assert any("$CC" in p for p in gpu_check.compiler_problems())


def test_make_gpu_check_uses_the_given_python_without_venv_or_pip():
    """On an offline node the preinstalled CUDA torch is the one to use: no venv stamp, no pip install."""
    # run as CI runs it, from inside `make test`: no make settings, budget or options inherited from that make
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MAKE") and k not in ("MFLAGS", "BUDGET", "GPU_CHECK_ARGS", "PYTHON")}
    done = subprocess.run(["make", "--no-print-directory", "-n", "gpu-check", "PYTHON=python3", "BUDGET=123"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    commands = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    assert commands == ["python3 -m gpuformer_lib.tools.gpu_check --budget 123"], commands


def test_the_library_imports_from_the_clone_without_installation(tmp_path):
    """`python -m` from the clone's root puts the clone first on sys.path: that is all make gpu-check needs (here
    with site-packages' own copy, if any, out of the way: -S, then only torch's folder added back)."""
    import torch

    torch_site = str(Path(torch.__file__).resolve().parents[1])
    code = (f"import sys; sys.path.append({torch_site!r}); import runpy; sys.argv = ['gpu_check', '--help']; "
            "runpy.run_module('gpuformer_lib.tools.gpu_check', run_name='__main__')")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-S", "-c", code],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "--budget" in done.stdout, done.stdout + done.stderr


def test_main_on_a_faked_gpu_writes_the_report_and_ends_with_the_verdict(monkeypatch, tmp_path, capsys):
    from gpuformer_lib import device

    real = device.hardware_summary("cpu")
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_check.torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    monkeypatch.setattr(gpu_check.torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(device, "hardware_summary", lambda *a, **k: real)
    monkeypatch.setenv("PYTHONPATH", "elsewhere")
    seen = {}

    def fake_items(quick, *, repo, suite_budget_s, suite_out):
        seen.update(quick=quick, suite_budget_s=suite_budget_s, suite_out=suite_out)
        return [gpu_check.Item("ok", lambda s: (True, "")), gpu_check.Item("bad", lambda s: (False, "why")),
                gpu_check.Item("later", lambda s: (True, ""), min_s=1e6)]

    monkeypatch.setattr(gpu_check, "default_items", fake_items)
    assert gpu_check.main(["--quick", "--budget", "60", "--suite-budget", "30", "--out", str(tmp_path)]) == 1
    assert seen == {"quick": True, "suite_budget_s": 30.0, "suite_out": tmp_path / "gpu"}
    out = capsys.readouterr().out
    assert "budget 60 s" in out and "1 FAILED: bad (3 checks, 1 skipped" in out
    (path,) = tmp_path.glob("gpu-check-*.json")
    report = json.loads(path.read_text())
    assert report["finished"] and report["verdict"] == "FAIL" and report["budget_s"] == 60
    assert [i["status"] for i in report["items"]] == ["PASS", "FAIL", "SKIP"]
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(REPO_ROOT), "elsewhere"]  # the clone, for children
