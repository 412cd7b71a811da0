"""``make gpu-check``: everything the course runs on a GPU, checked in one command on an NVIDIA machine.

    python -m gpuformer_lib.tools.gpu_check                 # all checks, within --budget (510 s)
    python -m gpuformer_lib.tools.gpu_check --quick         # no notebooks
    python -m gpuformer_lib.tools.gpu_check --budget 3000   # time for the notebooks too

It needs only a Python with a CUDA torch, started from a clone of the course (``make gpu-check
PYTHON=python3`` on an offline GPU node: no virtual environment, no pip, no network); the library is
imported from the clone, and every process it starts (pytest, the workers, the notebooks' kernels) is
given the clone on ``PYTHONPATH``.

Items, in order: the toolchain Triton and Inductor compile with (a C compiler and ``Python.h``, checked
first: without them every compiled kernel fails, so the compiled items are skipped with that reason); the
GPU measurement suite (``python -m gpuformer_lib.gpu_suite``, :data:`SUITE_BUDGET_S` of the budget); the
``gpu``-marked tests (only the files that hold them, :func:`gpu_test_files`); the Triton kernels compiled,
not interpreted (``tests/test_kernels.py`` takes the compiled path on a GPU); the tiny training ladder end
to end; every torchrun worker on NCCL when two or more GPUs exist; every chapter notebook at its
``gpu-small`` preset, executed through nbclient on a copy (the course's notebooks are not touched), where
this Python has the Jupyter packages (otherwise one item says so and is skipped).

The whole run stays within ``--budget`` seconds (default :data:`DEFAULT_BUDGET_S`, so that ``make
gpu-check`` with Python's start fits in about 9 minutes): an item gets at most its own cap and what is left
of the budget, and an item for which too little is left is skipped, saying so (the notebooks, 20-40
minutes in all by estimate, need ``--budget`` of about 3000). Each item records pass, fail or skip, its
seconds and the tail of its output in ``bench_results/gpu-check-<gpu>.json`` (with the device and
versions), rewritten after every item through a temporary file (a run killed part-way leaves the items
done so far); the command ends with one verdict line. Exit status: 0 when no item failed, 1 when one did,
2 without a GPU.

On a machine without a CUDA GPU it exits at once, saying so: rehearse the GPU paths with
``make rehearse`` instead.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import torch

from gpuformer_lib.tools.notebooks import REPO_ROOT, NotACheckoutError, checkout_root, notebook_paths

NO_GPU_MESSAGE = ("gpu-check needs an NVIDIA GPU, and torch.cuda.is_available() is False here "
                  "(torch {version}, CUDA {cuda}). Nothing was checked. Without a GPU, `make rehearse` runs "
                  "every notebook's GPU branches on the CPU under the T4 and H100 profiles.")

DEFAULT_BUDGET_S = 510.0
"""The whole check's seconds by default: 8.5 minutes, leaving about 30 s of the 9 a GPU node gives one command
for Python, torch and CUDA to start and the report to be written. An estimate (no GPU has run it yet)."""

SUITE_BUDGET_S = 210.0
"""The GPU suite's share of the budget by default (``--suite-budget``; 0 leaves it out). The items after it
are estimated at 30-45 s (gpu-marked tests), 40-90 s (Triton compiled) and 60-120 s (the ladder's three cold
compiles) on an H100 (the GPU-readiness review of 2026-11-27, read from the code, not measured): 210 s leaves
them the rest of 510."""

NOTEBOOK_PACKAGES = ("nbformat", "nbclient", "jupyter_client", "ipykernel")
"""What executing a notebook needs beyond the library: nbclient drives a kernel that ipykernel provides."""

NOT_ON_A_GPU_NODE = ("IPython", "ipykernel", "ipywidgets", "nbformat", "nbclient", "nbconvert", "nbval",
                     "jupyter_client", "jupyter_core", "jupyter_book", "myst_nb", "traitlets", "comm",
                     "matplotlib_inline", "widgetsnbextension", "zmq", "yaml", "onnxscript", "playwright")
"""Top-level packages the course's environment has and a bare GPU node (a CUDA torch, triton, numpy, matplotlib,
pytest, onnx, onnxruntime, sacrebleu, nvidia-ml-py, pandas) lacks: the Jupyter stack, PyYAML, onnxscript and
Playwright. No file :func:`gpu_test_files` lists may import one of them when it is collected
(tests/test_gpu_check.py imports each with these blocked)."""

GPU_MARK = re.compile(r"\bmark\.gpu\b")
"""``@pytest.mark.gpu`` on a test, or ``pytestmark = pytest.mark.gpu`` on a file."""


class Skip(Exception):
    """Raised by a check that cannot run here: the item is recorded as skipped with this reason, not failed."""


@dataclasses.dataclass
class CheckResult:
    name: str
    passed: bool | None
    """True or False; None when the item was skipped (``detail`` says why): a skip is not a failure."""
    seconds: float
    detail: str = ""

    @property
    def status(self) -> str:
        return {True: "PASS", False: "FAIL", None: "SKIP"}[self.passed]


@dataclasses.dataclass
class Item:
    """One check: ``check(seconds)`` runs it within ``seconds`` and returns (passed, detail); it may raise
    :class:`Skip`. It starts only with at least ``min_s`` of the budget left, and gets at most ``cap_s``."""

    name: str
    check: Callable[[float], tuple[bool, str]]
    cap_s: float = 300.0
    min_s: float = 0.0
    skip: str | None = None
    """Set: the item is recorded as skipped with this reason, without running."""


# --------------------------------------------------------------------------- running the items


def _run(cmd: list[str], timeout: float, env: dict | None = None, cwd: Path | None = None) -> tuple[bool, str]:
    """Run ``cmd`` in a process group of its own; past ``timeout`` the whole group is killed (pytest's or the
    compiler's children too), and the output so far is kept."""
    proc = subprocess.Popen(cmd, cwd=cwd or Path.cwd(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return False, f"timed out after {timeout:.0f} s and was stopped: {' '.join(cmd)}\n{(out or '').strip()[-1800:]}"
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return proc.returncode == 0, (out or "").strip()[-2000:]


def run_checks(items: list, echo=print, budget_s: float | None = None,
               on_result: Callable[[list[CheckResult]], object] | None = None) -> list[CheckResult]:
    """Run each item (an :class:`Item`, or a ``(name, check)`` pair whose check takes no argument), in order,
    within ``budget_s`` seconds in all (None: no limit). An exception is a failure, not a crash; :class:`Skip`
    and an item that does not fit in what is left of the budget are skips. ``on_result`` gets the results
    so far after each item (the report is written there)."""
    deadline = None if budget_s is None else time.monotonic() + budget_s
    results: list[CheckResult] = []
    for entry in items:
        item = entry if isinstance(entry, Item) else Item(entry[0], lambda _s, c=entry[1]: c(), cap_s=float("inf"))
        left = float("inf") if deadline is None else deadline - time.monotonic()
        start = time.perf_counter()
        if item.skip is not None:
            passed, detail = None, item.skip
        elif left < max(item.min_s, 1.0):
            passed, detail = None, (f"not started: {max(left, 0):.0f} s of the {budget_s:.0f} s budget left, and it "
                                    f"needs at least {item.min_s:.0f} s (give --budget more)")
        else:
            try:
                passed, detail = item.check(min(item.cap_s, left))
                passed = bool(passed)
            except Skip as why:
                passed, detail = None, str(why)
            except Exception as err:  # noqa: BLE001  one broken item must not hide the others
                passed, detail = False, f"{type(err).__name__}: {err}"
        result = CheckResult(item.name, passed, round(time.perf_counter() - start, 1), detail)
        echo(f"{result.status}  {result.seconds:6.1f} s  {item.name}")
        if result.passed is not True and detail:
            echo("      " + detail[-1500:].replace("\n", "\n      "))
        results.append(result)
        if on_result is not None:
            on_result(results)
    return results


# --------------------------------------------------------------------------- what the items need


def gpu_test_files(root: Path | None = None) -> list[str]:
    """The test files (``tests/test_*.py``, relative to ``root``) that hold ``gpu``-marked tests: the only ones
    the gpu-marked item collects, since collecting the others imports Jupyter packages a GPU node lacks."""
    root = Path(REPO_ROOT if root is None else root)
    return sorted(str(path.relative_to(root)) for path in (root / "tests").glob("test_*.py")
                  if GPU_MARK.search(path.read_text(encoding="utf-8")))


def pytest_command(args: list[str]) -> list[str]:
    """pytest in this Python on ``args``, with ``-o addopts=``: pyproject's addopts name nbval's options, and
    where nbval is not installed (a GPU node) pytest stops at them before running anything."""
    return [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", "-o", "addopts=", *args]


def missing_notebook_packages() -> list[str]:
    """Which of :data:`NOTEBOOK_PACKAGES` this Python lacks."""
    return [name for name in NOTEBOOK_PACKAGES if importlib.util.find_spec(name) is None]


def compiler_problems() -> list[str]:
    """What Triton (and Inductor's GPU code, which is Triton) lacks to compile here, as Triton looks for it: a C
    compiler (``$CC``, else gcc, else clang) for the launcher it builds per kernel, and ``Python.h`` in this
    Python's include folder. Empty when both are there."""
    problems = []
    cc = os.environ.get("CC")
    if cc:
        if shutil.which(cc.split()[0]) is None:
            problems.append(f"$CC is {cc!r}, which is not found")
    elif shutil.which("gcc") is None and shutil.which("clang") is None:
        problems.append("no C compiler: neither gcc nor clang is on PATH, and $CC is not set")
    scheme = sysconfig.get_default_scheme()
    include = sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme)["include"]
    if not (Path(include) / "Python.h").is_file():
        problems.append(f"no Python.h in {include}: this Python's development headers are not installed "
                        f"(on Debian/Ubuntu: apt-get install python{sys.version_info[0]}.{sys.version_info[1]}-dev)")
    return problems


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    """Set variables for the block (a notebook's kernel inherits them when it starts), then put back the old."""
    old = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _notebook_check(path: Path, cell_timeout: float = 900.0) -> Callable[[float], tuple[bool, str]]:
    def check(seconds: float) -> tuple[bool, str]:
        import nbformat
        from nbclient import NotebookClient

        deadline = time.monotonic() + seconds
        nb = nbformat.read(path, as_version=4)
        # every cell waits at most its own limit and what is left of the notebook's time
        client = NotebookClient(nb, timeout=int(cell_timeout), kernel_name="python3",
                                timeout_func=lambda cell: max(1, int(min(cell_timeout, deadline - time.monotonic()))),
                                resources={"metadata": {"path": str(path.parent)}})
        with _environment(GPUFORMER_PRESET=os.environ.get("GPUFORMER_PRESET") or "gpu-small"):
            client.execute()  # raises CellExecutionError (naming the cell) or a timeout
        with tempfile.NamedTemporaryFile("w", suffix=f"-{path.name}", delete=False, encoding="utf-8") as f:
            nbformat.write(nb, f)
        return True, f"executed copy: {f.name}"
    return check


def _notebook_items(repo: Path | None) -> list[Item]:
    """One item per chapter notebook, or one skipped item saying why none can run here."""
    try:
        paths = notebook_paths(repo)
    except NotACheckoutError as err:
        return [Item("notebooks", lambda _s: (False, ""), skip=f"not run: {err}")]
    missing = missing_notebook_packages()
    if missing:
        return [Item(f"notebooks ({len(paths)})", lambda _s: (False, ""), skip=(
            f"not run: this Python ({sys.executable}) lacks the Jupyter packages {', '.join(missing)}, which "
            "executing a notebook needs (nbclient drives an ipykernel kernel). The GPU suite above measures what "
            "the chapters rest on without them. To run the notebooks here, install nbformat, nbclient, ipykernel "
            "and ipywidgets into this Python (chapters 7, 10 and 13-16 also need the data sets: $GPUFORMER_DATA)"))]
    return [Item(f"notebook {path.name} (gpu-small)", _notebook_check(path), cap_s=900.0, min_s=60.0)
            for path in paths]


def default_items(quick: bool = False, *, repo: Path | None = None, suite_budget_s: float = SUITE_BUDGET_S,
                  suite_out: Path | None = None) -> list[Item]:
    py = sys.executable
    try:
        root: Path | None = checkout_root(repo)
        not_a_clone = None
    except NotACheckoutError as err:
        root, not_a_clone = None, f"not run: the tests ship with the clone only. {err}"
    problems = compiler_problems()
    no_compiler = ("skipped: Triton cannot compile here (see the toolchain item): " + "; ".join(problems)
                   if problems else None)

    def toolchain(_s: float) -> tuple[bool, str]:
        if problems:
            return False, ("; ".join(problems) + ". Triton builds a C launcher for every kernel it compiles, and "
                           "torch.compile's GPU code is Triton: chapters 02, 10 and 16, the Triton kernels and the "
                           "ladder fail without them. Install gcc and the Python headers, or point $CC at a compiler")
        return True, "a C compiler and Python.h are there"

    def suite(seconds: float) -> tuple[bool, str]:
        if importlib.util.find_spec("gpuformer_lib.gpu_suite") is None:
            raise Skip("not run: this checkout has no gpuformer_lib.gpu_suite")
        budget = min(suite_budget_s, seconds - 20)  # 20 s for its start and its last write
        if budget < 30:
            raise Skip(f"not run: {seconds:.0f} s of the budget left")
        cmd = [py, "-m", "gpuformer_lib.gpu_suite", "--budget", f"{budget:.0f}"]
        if suite_out is not None:
            cmd += ["--out", str(suite_out)]
        return _run(cmd, seconds, cwd=root)

    def pytest_item(args: list[str], env: dict | None = None) -> Callable[[float], tuple[bool, str]]:
        return lambda seconds: _run(pytest_command(args), seconds, env=env, cwd=root)

    items = [Item("toolchain for Triton and Inductor (C compiler, Python.h)", toolchain)]
    if suite_budget_s > 0:
        items.append(Item("GPU measurement suite (python -m gpuformer_lib.gpu_suite)", suite,
                          cap_s=suite_budget_s + 20, min_s=50.0))
    gpu_files = gpu_test_files(root) if root is not None else []
    items.append(Item("gpu-marked tests", pytest_item(["-m", "gpu", *gpu_files]), cap_s=150.0, min_s=30.0,
                      skip=not_a_clone or (None if gpu_files else "no test file holds a gpu-marked test")))
    items.append(Item("Triton kernels compiled, against torch",
                      pytest_item(["-m", "not gpu", "tests/test_kernels.py"], env={"TRITON_INTERPRET": "0"}),
                      cap_s=150.0, min_s=30.0, skip=not_a_clone or no_compiler))
    items.append(Item("ladder, tiny preset", lambda seconds: _run([py, "-m", "gpuformer_lib.ladder", "--preset",
                                                                   "tiny"], seconds, cwd=root),
                      cap_s=240.0, min_s=60.0, skip=no_compiler))
    if torch.cuda.device_count() >= 2:
        from gpuformer_lib import distributed

        for module, commands in (("data_parallel", ("hello", "equivalence", "allreduce", "scaling")),
                                 ("model_parallel", ("gpipe", "pipelining", "tensor", "fsdp"))):
            for command in commands:
                def worker(seconds: float, m=module, c=command) -> tuple[bool, str]:
                    run = distributed.launch(distributed.worker_path(m), 2, [c], backend="nccl", echo=False,
                                             timeout_s=seconds)
                    return True, "\n".join(run.lines[-3:])
                items.append(Item(f"worker {module} {command} on NCCL", worker, cap_s=240.0, min_s=30.0))
    if not quick:
        items += _notebook_items(repo)
    return items


# --------------------------------------------------------------------------- the report


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def default_report_folder(repo: Path | None = None) -> Path:
    """``bench_results`` of the clone, or of the current folder where the library is not in one."""
    try:
        return checkout_root(repo) / "bench_results"
    except NotACheckoutError:
        return Path.cwd() / "bench_results"


def write_report(results: list[CheckResult], folder: Path | None = None, *, budget_s: float | None = None,
                 finished: bool = True, summary=None) -> Path:
    """Write the report (the results so far, while ``finished`` is False) through a temporary file and
    ``os.replace``: an interruption leaves the previous version or this one, never half a file."""
    if summary is None:
        from gpuformer_lib.device import hardware_summary

        summary = hardware_summary()
    failed = any(r.passed is False for r in results)
    report = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": summary.as_dict(),
        "budget_s": budget_s,
        "finished": finished,
        "verdict": "FAIL" if failed else ("PASS" if finished else "RUNNING"),
        "items": [{**dataclasses.asdict(r), "status": r.status} for r in results],
    }
    folder = default_report_folder() if folder is None else Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"gpu-check-{_slug(summary.gpu_name or summary.device)}.json"
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _put_library_on_children_path(repo: Path | None = None) -> None:
    """Processes started from here (pytest, the workers, the notebooks' kernels, which start in notebooks/)
    import the clone's library: ``repo`` (or the clone this process imported the library from) goes first on
    ``PYTHONPATH``. Nothing changes where the library is not in a clone (it is installed: they find it)."""
    import gpuformer_lib

    try:
        parent = str(checkout_root(repo if repo is not None else Path(gpuformer_lib.__file__).resolve().parents[1]))
    except NotACheckoutError:
        return
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != parent]
    os.environ["PYTHONPATH"] = os.pathsep.join([parent, *paths])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="leave out the notebooks")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, metavar="SECONDS",
                        help=f"the whole check's time; items that would not fit are skipped (default "
                             f"{DEFAULT_BUDGET_S:.0f})")
    parser.add_argument("--suite-budget", type=float, default=SUITE_BUDGET_S, metavar="SECONDS",
                        help=f"the GPU suite's share of the budget; 0 leaves it out (default {SUITE_BUDGET_S:.0f})")
    parser.add_argument("--repo", type=Path, default=None, metavar="DIR",
                        help="the clone of the course whose tests and notebooks to run (default: the one the "
                             "library is in)")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="where the report goes (default: the clone's bench_results); the suite's results go "
                             "to DIR/gpu")
    args = parser.parse_args(argv)
    if not args.budget > 0:
        parser.error(f"--budget must be a positive number of seconds, got {args.budget}")
    if not torch.cuda.is_available():
        print(NO_GPU_MESSAGE.format(version=torch.__version__, cuda=torch.version.cuda), file=sys.stderr)
        return 2
    _put_library_on_children_path(args.repo)
    from gpuformer_lib.device import hardware_summary

    summary = hardware_summary()
    folder = args.out or default_report_folder(args.repo)
    print(f"gpu-check on {torch.cuda.get_device_name()} x {torch.cuda.device_count()}, torch {torch.__version__}, "
          f"Python {sys.version.split()[0]} ({sys.executable}); budget {args.budget:.0f} s", flush=True)
    items = default_items(args.quick, repo=args.repo, suite_budget_s=args.suite_budget,
                          suite_out=args.out / "gpu" if args.out else None)

    def report(results: list[CheckResult], finished: bool = False) -> Path:
        return write_report(results, folder, budget_s=args.budget, finished=finished, summary=summary)

    report([])
    results = run_checks(items, echo=lambda line: print(line, flush=True), budget_s=args.budget, on_result=report)
    path = report(results, finished=True)
    failed = [r.name for r in results if r.passed is False]
    skipped = sum(r.passed is None for r in results)
    total = sum(r.seconds for r in results)
    print(f"{'ALL PASSED' if not failed else f'{len(failed)} FAILED: ' + ', '.join(failed)} "
          f"({len(results)} checks, {skipped} skipped, {total:.0f} s); report: {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
