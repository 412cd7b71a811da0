"""Run the suite: items in a worker process, each within its cap, results written after each item.

The parent never touches the GPU. It starts a worker (``python -m gpuformer_lib.gpu_suite.runner --worker``),
which initialises the device, reports the environment, then runs the items the parent sends one at a time.
An item that passes its cap is stopped by killing the worker (a CUDA call cannot be interrupted otherwise);
a crashed worker is reported with its exit status. Either way the item is recorded as failed and a new worker
runs the next one. After each item its chapter's file is rewritten atomically, so a run killed at any point
keeps everything measured before.

Protocol: the worker's standard output carries one JSON object per line (``ready``, then one result per
item); everything the items print goes to its standard error, which is the parent's.
"""

from __future__ import annotations

import datetime as dt
import gc
import importlib.metadata
import json
import os
import platform
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
STARTUP_S = 90.0
"""Seconds a worker may take to import torch and initialise the device (counted in the budget)."""
REHEARSAL_EXPECT_S = 5.0
"""Under rehearsal an item runs at toy sizes: it should take a second or two, whatever its GPU estimate."""
GRACE_S = 5.0
"""Seconds past an item's cap before it is stopped: time to write its record."""


def repo_root() -> Path:
    """The course's checkout when the library runs from one, else the working directory."""
    return PACKAGE_ROOT if (PACKAGE_ROOT / "pyproject.toml").exists() else Path.cwd()


def default_out() -> Path:
    return repo_root() / "bench_results" / "gpu"


def git_commit(root: Path) -> str | None:
    """HEAD of the checkout at ``root`` with ``+dirty`` when tracked files changed; None without git."""
    if not (root / ".git").exists():
        return None
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("+dirty" if dirty else "")


# --------------------------------------------------------------------------- the worker


def _environment(device, rehearsal: str | None) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()},
        "rehearsal": rehearsal,
    }
    try:  # the installed version, without importing Triton (gpuformer_lib.kernels chooses how it is imported)
        env["versions"]["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        env["versions"]["triton"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["device"] = {"name": props.name, "sms": props.multi_processor_count,
                         "memory_gib": round(props.total_memory / 2**30, 2),
                         "compute_capability": f"{props.major}.{props.minor}", "gpu_count": torch.cuda.device_count()}
        env["device"].update(_nvml_facts(device))
        env["versions"]["driver"] = env["device"].pop("driver", None)
    else:
        from gpuformer_lib.device import hardware_summary

        env["device"] = {"name": f"rehearsal-{rehearsal}", "cpu": hardware_summary("cpu").cpu_model,
                         "rehearsed_profile": rehearsal, "gpu_count": _rehearsed_gpu_count()}
    return env


def _rehearsed_gpu_count() -> int:
    from gpuformer_lib.profiles import rehearsed_profile

    profile = rehearsed_profile()
    return profile.gpu_count if profile is not None else 0


def _nvml_facts(device) -> dict[str, Any]:
    """Clocks and the driver from NVML, where it can be read (nothing otherwise)."""
    import torch

    try:
        import pynvml
    except ImportError:
        return {}
    facts: dict[str, Any] = {}
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001  (NVML raises its own error types, and none where there is no driver)
        return {}
    try:
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        uuid = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        for key, read in (("driver", lambda: pynvml.nvmlSystemGetDriverVersion()),
                          ("max_sm_clock_mhz", lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)),
                          ("max_memory_clock_mhz",
                           lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)),
                          ("power_limit_w", lambda: pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000)):
            try:
                value = read()
                facts[key] = value.decode() if isinstance(value, bytes) else value
            except Exception:  # noqa: BLE001  (a field this GPU or driver does not report)
                pass
    except Exception:  # noqa: BLE001
        pass
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return facts


def worker_main() -> int:
    """Run items named on standard input; answer on the original standard output, one JSON line each."""
    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # what items print goes to standard error
    sys.stdout = sys.stderr

    import torch

    from gpuformer_lib.gpu_suite.core import Context, ordered_items
    from gpuformer_lib.profiles import rehearsed_profile

    profile = rehearsed_profile()
    rehearsal = profile.name if profile is not None else None
    device = torch.device("cpu") if rehearsal else torch.device("cuda", 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.ones(1, device=device).sum().item()  # initialise the context now, not inside the first item
    items = {it.key: it for it in ordered_items()}
    gpu_count = torch.cuda.device_count() if device.type == "cuda" else _rehearsed_gpu_count()
    proto.write(json.dumps({"ready": _environment(device, rehearsal)}) + "\n")
    for line in sys.stdin:
        key, _, limit = line.strip().partition("\t")
        if not key:
            continue
        it = items[key]
        ctx = Context(device, toy=rehearsal is not None, cap_s=float(limit or it.cap_s), gpu_count=gpu_count)
        started = time.monotonic()
        status, error = "passed", None
        try:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            it.fn(ctx)
        except Exception as exc:  # noqa: BLE001  (an item's failure is recorded; the suite goes on)
            status = "failed"
            error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            error += "\n" + "".join(traceback.format_tb(exc.__traceback__)[-3:])
        finally:
            gc.collect()  # tensors held by reference cycles (a failed item's frames) would stay into the next item
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()
        proto.write(json.dumps({"key": key, "status": status, "error": error, "record": ctx.record,
                                "seconds": time.monotonic() - started}, default=float) + "\n")
    return 0


# --------------------------------------------------------------------------- the parent


class _Worker:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "gpuformer_lib.gpu_suite.runner", "--worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                                     start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.buffer = ""
        self.eof = False

    def read_line(self, timeout: float) -> str | None:
        """The next protocol line, or None at the deadline or when the worker ended."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while "\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 65536).decode("utf-8", "replace")
            if not chunk:
                self.eof = True
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split("\n", 1)
        return line

    def send(self, key: str) -> bool:
        try:
            self.proc.stdin.write(key + "\n")
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def ended(self) -> str:
        """How the worker ended ('' while it runs)."""
        if self.eof:  # its output closed: it is ending, if not yet reaped
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        code = self.proc.poll()
        if code is None:
            return ""
        return f"killed by signal {-code}" if code < 0 else f"exit status {code}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()


def _previous_seconds(path: Path) -> dict[str, float]:
    """{item: seconds} of the items that passed in the last run recorded at ``path`` (nothing if unreadable)."""
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))["items"]
        return {r["key"]: float(r["seconds"]) for r in rows if r.get("status") == "passed" and "seconds" in r}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _refusal(rehearsal: str | None) -> str | None:
    import torch

    if rehearsal is not None:
        return None
    if not torch.cuda.is_available():
        return ("the GPU suite measures an NVIDIA GPU, and torch.cuda.is_available() is False here "
                f"(torch {torch.__version__}, CUDA {torch.version.cuda}). Nothing was measured. To run every "
                "item's code on this CPU at toy sizes, rehearse a profile: GPUFORMER_REHEARSE=h100-80gb "
                "python -m gpuformer_lib.gpu_suite (its files go to a temporary folder).")
    return None


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def run(*, budget_s: float, out: Path | None, commit: str | None, only: list[str] | None = None,
        pause_during: str | None = None, echo=print) -> int:
    """Run the suite; return the exit status (0: every item that ran passed; 1: one failed; 2: refused)."""
    from gpuformer_lib.gpu_suite.core import device_slug, merge_item, ordered_items, write_json_atomic
    from gpuformer_lib.profiles import rehearsed_profile

    started = time.monotonic()
    profile = rehearsed_profile()
    rehearsal = profile.name if profile is not None else None
    if profile is not None and not profile.on_gpu:
        echo(f"GPUFORMER_REHEARSE={rehearsal} is not a GPU profile: rehearse t4, h100-80gb or another GPU's.")
        return 2
    if (why := _refusal(rehearsal)) is not None:
        echo(why)
        return 2
    if rehearsal is not None:
        if out is None:
            out = Path(tempfile.mkdtemp(prefix=f"gpu-suite-rehearsal-{rehearsal}-"))
        elif _inside(out, default_out()):
            echo(f"a rehearsal computes on the CPU: its numbers must not go to {default_out()}; give another --out")
            return 2
    out = out or default_out()
    commit = commit or git_commit(repo_root())
    items = ordered_items()
    if only:
        unknown = sorted(set(only) - {it.key for it in items})
        if unknown:
            echo(f"unknown item(s): {', '.join(unknown)}; see --list")
            return 2
        items = [it for it in items if it.key in only]

    worker: _Worker | None = None
    environment: dict[str, Any] | None = None
    summary: list[dict[str, Any]] = []
    failed = 0
    date = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    folder: Path | None = None

    def start_worker() -> str | None:
        nonlocal worker, environment, folder
        worker = _Worker()
        line = worker.read_line(min(STARTUP_S, max(1.0, budget_s - (time.monotonic() - started))))
        if line is None:
            how = worker.ended() or "no answer in time"
            worker.kill()
            worker = None
            return f"the worker did not start ({how})"
        env = json.loads(line)["ready"]
        if environment is None:
            environment = env
            folder = out / device_slug(env["device"]["name"])
        return None

    def write_summary() -> None:
        if folder is not None:
            write_json_atomic(folder / "suite.json", {
                "schema": 1, "date": date, "commit": commit, "budget_s": budget_s, "environment": environment,
                "seconds": round(time.monotonic() - started, 1), "items": summary})

    def expected_s(it) -> float:
        """How long the item should take: 1.5 x its last passing run on this device, else its own estimate."""
        seconds = previous.get(it.key)
        expected = min(it.cap_s, 1.5 * seconds) if seconds is not None else it.expect_s
        return min(expected, REHEARSAL_EXPECT_S) if environment["rehearsal"] else expected

    def skip(row: dict, why: str) -> None:
        row.update(status="skipped", why=why)
        summary.append(row)
        echo(f"  skipped  {row['key']:34s} {why}")
        write_summary()

    def why_skip(it) -> str | None:
        """Why the item cannot run now (known once a worker has reported the device), or None."""
        if it.min_gpus > environment["device"].get("gpu_count", 1):
            return f"needs {it.min_gpus} GPUs"
        left = budget_s - (time.monotonic() - started)
        if expected_s(it) > left:
            return f"would not fit: about {expected_s(it):.0f} s expected, {max(left, 0):.0f} s of the budget left"
        return None

    previous: dict[str, float] = {}
    try:
        for it in items:
            row = {"key": it.key, "title": it.title, "cap_s": it.cap_s}
            # a worker is started for the first item, and after one was stopped for an item that can run
            if worker is None and (environment is None or why_skip(it) is None):
                if (why := start_worker()) is not None:
                    echo(f"FAILED: {why}")
                    row.update(status="failed", error=why)
                    summary.append(row)
                    failed += 1
                    for rest in items[items.index(it) + 1:]:
                        summary.append({"key": rest.key, "title": rest.title, "cap_s": rest.cap_s,
                                        "status": "skipped", "why": "not run: the worker did not start"})
                    write_summary()
                    break
                if not previous:
                    previous.update(_previous_seconds(folder / "suite.json"))
            if (why := why_skip(it)) is not None:
                skip(row, why)
                continue
            left = budget_s - (time.monotonic() - started)
            limit = min(it.cap_s, left)  # the item's cap, or the end of the budget if that comes first
            t0 = time.monotonic()
            result = None
            if worker.send(f"{it.key}\t{limit}"):
                if pause_during == it.key:  # for the test that kills a run during an item
                    echo(f"paused during {it.key}")
                    time.sleep(3600)
                line = worker.read_line(limit + GRACE_S)
                result = json.loads(line) if line else None
            if result is None:
                how = worker.ended()
                worker.kill()
                worker = None
                if not how and limit < it.cap_s:  # the budget, not the item, ran out: not the item's failure
                    skip(row, f"stopped: the budget ran out after {time.monotonic() - t0:.0f} s of it")
                    continue
                why = (f"the worker ended during the item ({how})" if how else
                       f"stopped at its cap of {it.cap_s:.0f} s")
                result = {"key": it.key, "status": "failed", "error": why, "record": {},
                          "seconds": time.monotonic() - t0}
            entry = {"title": it.title, "status": result["status"], "error": result["error"],
                     "seconds": round(result["seconds"], 2), "cap_s": it.cap_s, "date": date, "commit": commit,
                     "versions": environment["versions"], "rehearsal": environment["rehearsal"], **result["record"]}
            merge_item(folder / f"{it.chapter_key}.json", environment, it.key, entry)
            row.update(status=result["status"], seconds=entry["seconds"],
                       **({"error": result["error"].splitlines()[0]} if result["error"] else {}))
            summary.append(row)
            write_summary()
            failed += result["status"] != "passed"
            mark = "ok     " if result["status"] == "passed" else "FAILED "
            echo(f"  {mark}  {it.key:34s} {entry['seconds']:6.1f} s" +
                 (f"  {result['error'].splitlines()[0]}" if result["error"] else ""))
    finally:
        if worker is not None:
            worker.close()
    ran = [r for r in summary if r["status"] != "skipped"]
    where = folder if folder is not None else out
    echo(f"{len(ran) - failed} of {len(ran)} items passed, {len(summary) - len(ran)} skipped, in "
         f"{time.monotonic() - started:.0f} s; files in {where}")
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        sys.exit(worker_main())
    sys.exit("this module is the suite's worker; run python -m gpuformer_lib.gpu_suite")
