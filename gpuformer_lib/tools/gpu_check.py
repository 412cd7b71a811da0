"""``make gpu-check``: everything the course runs on a GPU, checked in one command on an NVIDIA machine.

    python -m gpuformer_lib.tools.gpu_check            # all checks
    python -m gpuformer_lib.tools.gpu_check --quick    # no notebooks

Items, in order: the ``gpu``-marked tests; the Triton kernels compiled (not interpreted) against torch
(``tests/test_kernels.py`` takes the compiled path on a GPU); the tiny training ladder end to end;
every torchrun worker on NCCL when two or more GPUs exist; every chapter notebook at its ``gpu-small``
preset, executed through nbclient on a copy (the course's notebooks are not touched). Each item
records pass or fail, its seconds and the tail of its output in
``bench_results/gpu-check-<gpu>.json`` (with the device and versions), and the command ends with one
verdict line. Aim: 10 minutes on a T4, 5 on an H100.

On a machine without a CUDA GPU it exits at once, saying so: rehearse the GPU paths with
``make rehearse`` instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from gpuformer_lib.tools.notebooks import REPO_ROOT, notebook_paths

NO_GPU_MESSAGE = ("gpu-check needs an NVIDIA GPU, and torch.cuda.is_available() is False here "
                  "(torch {version}, CUDA {cuda}). Nothing was checked. Without a GPU, `make rehearse` runs "
                  "every notebook's GPU branches on the CPU under the T4 and H100 profiles.")


@dataclasses.dataclass
class CheckResult:
    name: str
    passed: bool
    seconds: float
    detail: str = ""


def _run(cmd: list[str], timeout: float, env: dict | None = None) -> tuple[bool, str]:
    try:
        out = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f} s: {' '.join(cmd)}"
    text = (out.stdout + out.stderr).strip()
    return out.returncode == 0, text[-2000:]


def run_checks(items: list[tuple[str, Callable[[], tuple[bool, str]]]], echo=print) -> list[CheckResult]:
    """Run each ``(name, check)``; a check returns (passed, detail). An exception is a failure, not a crash."""
    results = []
    for name, check in items:
        start = time.perf_counter()
        try:
            passed, detail = check()
        except Exception as err:  # noqa: BLE001  one broken item must not hide the others
            passed, detail = False, f"{type(err).__name__}: {err}"
        result = CheckResult(name, bool(passed), round(time.perf_counter() - start, 1), detail)
        echo(f"{'PASS' if result.passed else 'FAIL'}  {result.seconds:6.1f} s  {name}")
        if not result.passed:
            echo("      " + detail.replace("\n", "\n      ")[-1500:])
        results.append(result)
    return results


def _notebook_check(path: Path, timeout: int) -> Callable[[], tuple[bool, str]]:
    def check() -> tuple[bool, str]:
        import nbformat
        from nbclient import NotebookClient

        nb = nbformat.read(path, as_version=4)
        os.environ.setdefault("GPUFORMER_PRESET", "gpu-small")
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}})
        client.execute()  # raises CellExecutionError, naming the cell
        with tempfile.NamedTemporaryFile("w", suffix=f"-{path.name}", delete=False, encoding="utf-8") as f:
            nbformat.write(nb, f)
        return True, f"executed copy: {f.name}"
    return check


def default_items(quick: bool = False) -> list[tuple[str, Callable[[], tuple[bool, str]]]]:
    py = sys.executable
    items = [
        ("gpu-marked tests", lambda: _run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
                                           "tests"], 300)),
        ("Triton kernels compiled, against torch", lambda: _run(
            [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_kernels.py"], 300,
            env={"TRITON_INTERPRET": "0"})),
        ("ladder, tiny preset", lambda: _run([py, "-m", "gpuformer_lib.ladder", "--preset", "tiny"], 300)),
    ]
    if torch.cuda.device_count() >= 2:
        from gpuformer_lib import distributed

        for module, commands in (("data_parallel", ("hello", "equivalence", "allreduce", "scaling")),
                                 ("model_parallel", ("gpipe", "pipelining", "tensor", "fsdp"))):
            for command in commands:
                items.append((f"worker {module} {command} on NCCL", lambda m=module, c=command: (
                    True, str(distributed.launch(distributed.worker_path(m), 2, [c], backend="nccl").lines[-3:]))))
    if not quick:
        for path in notebook_paths():
            items.append((f"notebook {path.name} (gpu-small)", _notebook_check(path, timeout=900)))
    return items


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def write_report(results: list[CheckResult], folder: Path = REPO_ROOT / "bench_results") -> Path:
    from gpuformer_lib.device import hardware_summary

    summary = hardware_summary()
    report = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": summary.as_dict(),
        "verdict": "PASS" if all(r.passed for r in results) else "FAIL",
        "items": [dataclasses.asdict(r) for r in results],
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"gpu-check-{_slug(summary.gpu_name or summary.device)}.json"
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:  # through a temporary file: an interruption leaves the old report or the new one
        tmp.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="leave out the notebooks")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(NO_GPU_MESSAGE.format(version=torch.__version__, cuda=torch.version.cuda), file=sys.stderr)
        return 2
    print(f"gpu-check on {torch.cuda.get_device_name()} x {torch.cuda.device_count()}, torch {torch.__version__}")
    results = run_checks(default_items(args.quick))
    path = write_report(results)
    failed = [r.name for r in results if not r.passed]
    total = sum(r.seconds for r in results)
    print(f"{'ALL PASSED' if not failed else f'{len(failed)} FAILED: ' + ', '.join(failed)} "
          f"({len(results)} checks, {total:.0f} s); report: {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
