"""Training on several processes with ``torch.distributed``: the same code on CPU processes (gloo) and
on GPUs (NCCL).

Covers:
- :class:`DistEnv`, the environment torchrun gives each process (a dataclass read from the
  environment variables; no global state), :func:`process_group` (set-up with a timeout, always torn
  down), rank-labelled printing (:func:`rank_print`, :func:`print0`);
- :func:`launch`: run a worker under ``torchrun`` from a notebook, each rank's output labelled,
  a failure turned into one clear :class:`LaunchError` that names the rank that failed first (its exit
  code, or the signal that killed it) and the ranks that were only waiting, from what a watcher around
  each rank recorded (:mod:`gpuformer_lib.rank_ends`), asking for more GPUs than exist refused,
  every process of the job (ranks in sessions of their own included) killed when it ends, times out
  or is interrupted;
  :func:`worker_path` finds the chapters' workers inside the installed package
  (:mod:`gpuformer_lib.workers`);
- data parallel from scratch: :func:`broadcast_parameters`, :func:`average_gradients`,
  :class:`NaiveDataParallel` (hooks that all-reduce each gradient as soon as it is ready, ``no_sync``
  for accumulation), :func:`ring_all_reduce` written with point-to-point sends and
  :func:`hierarchical_all_reduce` (inside nodes, then across them), :class:`ShardedAdamW` (ZeRO stage 1:
  AdamW's moments split over the ranks, :func:`zero1_bytes_per_rank`), with the alpha-beta cost model
  (:func:`ring_allreduce_time`) and :func:`scaling`; :func:`ddp_messages` counts DDP's bucket messages;
- model parallel from scratch: :func:`gpipe_bubble` and :func:`run_gpipe` (micro-batches through
  pipeline stages on different ranks, timed with :func:`wait_for_device` around each stage's work, as
  CUDA runs asynchronously), and Megatron's :class:`ColumnParallelLinear`,
  :class:`RowParallelLinear` and :class:`TensorParallelMLP`.

The production versions (``DistributedDataParallel``, ``torch.distributed.pipelining``,
``parallelize_module``, FSDP2's ``fully_shard``) are used next to these in chapters 11 and 12, and the
tests check each against single-process training. Leaves out: the training loop itself (``train``
takes a wrapped model).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gc
import importlib.resources
import json
import math
import numbers
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from gpuformer_lib import bench, gpu, rank_ends
from gpuformer_lib.profiles import rehearsing_gpu

_TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class TooFewGPUsError(RuntimeError):
    """More processes per node were asked for than the node has GPUs."""


class LaunchError(RuntimeError):
    """A distributed run failed: the message names the rank and shows its error."""


@dataclasses.dataclass(frozen=True)
class DistEnv:
    """Who this process is in a torchrun job (read from the variables torchrun sets)."""

    rank: int
    """This process's index among all processes, 0 .. world_size - 1."""
    local_rank: int
    """Its index on this machine: which GPU it uses."""
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, environ: dict | None = None) -> "DistEnv":
        environ = os.environ if environ is None else environ
        missing = [name for name in _TORCHRUN_VARS if name not in environ]
        if missing:
            raise RuntimeError(f"not started by torchrun ({', '.join(missing)} not set): run "
                               "`torchrun --nproc_per_node=N script.py`, or distributed.launch(script) from a notebook")
        return cls(rank=int(environ["RANK"]), local_rank=int(environ["LOCAL_RANK"]),
                   world_size=int(environ["WORLD_SIZE"]), local_world_size=int(environ["LOCAL_WORLD_SIZE"]),
                   master_addr=environ["MASTER_ADDR"], master_port=int(environ["MASTER_PORT"]))


def default_backend() -> str:
    """NCCL on NVIDIA GPUs, gloo everywhere else (CPU processes)."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def check_gpus(processes_per_node: int) -> None:
    """Refuse, with what to do, to start more GPU processes on a node than it has GPUs."""
    present = torch.cuda.device_count()
    if processes_per_node > present:
        asked = f"{processes_per_node} GPU process{'es' if processes_per_node > 1 else ''} per node"
        gloo = "GPUFORMER_BACKEND=gloo for torchrun, backend='gloo' for distributed.launch"
        if present == 0:
            raise TooFewGPUsError(f"{asked} asked for, but no CUDA GPU is present: run CPU processes with the gloo "
                                  f"backend instead ({gloo})")
        raise TooFewGPUsError(f"{asked} need as many GPUs, but only {present} {'is' if present == 1 else 'are'} "
                              f"present: launch with --nproc_per_node={present} or fewer, or run CPU processes "
                              f"with the gloo backend ({gloo})")


@contextlib.contextmanager
def process_group(backend: str | None = None, timeout_s: float = 120.0) -> Iterator[tuple[DistEnv, torch.device]]:
    """Join the job torchrun started; yield ``(env, device)``; always destroy the process group.

    ``timeout_s`` bounds every collective: a rank that dies makes the others fail after it instead
    of waiting forever. With NCCL each process takes the GPU of its local rank, and the group is bound
    to it (``device_id``): NCCL creates its communicator at once instead of guessing the device at the
    first collective.
    """
    env = DistEnv.from_env()
    backend = backend or default_backend()
    if backend == "nccl":
        check_gpus(env.local_world_size)
        device = torch.device("cuda", env.local_rank)
        gpu.set_current(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, rank=env.rank, world_size=env.world_size,
                            timeout=datetime.timedelta(seconds=timeout_s),
                            device_id=device if backend == "nccl" else None)
    try:
        yield env, device
    finally:
        if dist.is_initialized():
            gc.collect()  # work objects nothing refers to go now, while the group and the interpreter live
            dist.destroy_process_group()


def rank_print(*args, **kwargs) -> None:
    """``print`` with this process's rank in front, flushed at once (so lines from ranks interleave
    whole)."""
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))
    print(f"[rank {rank}]", *args, **kwargs, flush=True)


def print0(*args, **kwargs) -> None:
    """``print`` on rank 0 only."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(*args, **kwargs, flush=True)


def report(name: str, value) -> None:
    """Rank 0 hands a result to the notebook that launched the script (see :class:`LaunchResult`)."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        # the line and its newline in one write: print() writes them apart, and another rank's output may land
        # between the two in the pipe the ranks share
        sys.stdout.write(f"RESULT {json.dumps({name: value})}\n")
        sys.stdout.flush()


# --------------------------------------------------------------------------- launching from a notebook


@dataclasses.dataclass
class LaunchResult:
    lines: list[str]
    """Every output line, labelled '[rank r]' by the launcher."""
    results: dict
    """What rank 0 passed to :func:`report`."""
    seconds: float


def default_world_size() -> int:
    """The GPUs present, or 2 CPU processes where there is none."""
    return torch.cuda.device_count() or 2


_LABEL = re.compile(r"^\[default(\d+)\]:")
_NOISE = ("*****", "Setting OMP_NUM_THREADS")


WORKERS = ("data_parallel", "model_parallel", "translation")
"""The workers chapters 11, 12 and 13 launch, modules of :mod:`gpuformer_lib.workers`."""


def worker_path(name: str) -> Path:
    """The file of a worker shipped inside the package (``gpuformer_lib/workers/<name>.py``), for
    :func:`launch` and ``viz.show_source``: found wherever the library is installed, Colab included."""
    if name not in WORKERS:
        raise ValueError(f"no worker {name!r}: the workers are {', '.join(WORKERS)}")
    path = Path(str(importlib.resources.files("gpuformer_lib.workers") / f"{name}.py"))
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the gpuformer_lib installation is incomplete; reinstall it")
    return path


JOB_ENV = "GPUFORMER_JOB"
"""Set to a fresh id in the environment of every process a :func:`launch` starts: torchrun, its ranks and
whatever they start inherit it, so the launcher can find them all (on Linux in ``/proc/<pid>/environ``)
after torchrun is gone. torchrun puts each rank in a session of its own, so killing torchrun's process
group misses them, and once torchrun dies they are re-parented and a walk of its process tree cannot
reach them either."""


def _check_launch_args(nproc, args, backend, timeout_s, threads_per_process, extra_env) -> None:
    """Refuse, with what to pass instead, arguments that would otherwise run a different job than asked."""
    for name, value in (("nproc", nproc), ("threads_per_process", threads_per_process)):
        if value is None and name == "nproc":
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}"
                             + (" (pass None for the default world size)" if name == "nproc" else ""))
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real):
        raise TypeError(f"timeout_s must be a number of seconds, got {timeout_s!r} ({type(timeout_s).__name__})")
    if not (0 < timeout_s < math.inf):
        raise ValueError(f"timeout_s must be a positive, finite number of seconds, got {timeout_s}")
    if not isinstance(args, (list, tuple)) or not all(isinstance(a, (str, os.PathLike, int, float)) for a in args):
        raise TypeError(f"args must be a list of the script's arguments, e.g. ['hello'], got {args!r}")
    if backend is not None and backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' (CPU processes), 'nccl' (one GPU each) or None (the default), "
                         f"got {backend!r}")
    if extra_env is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in extra_env.items()):
        raise TypeError(f"extra_env must map names to strings, got {extra_env!r}")


def result_of(payload: str) -> tuple[dict, str]:
    """The JSON object of a rank's ``RESULT {...}`` line, and whatever follows it on the same line: torchrun's tee
    writes the ranks' outputs into one pipe, and a rank's next output can land on the end of another's line (CI
    saw ``Extra data`` after a complete result). Raises ``json.JSONDecodeError`` if the object itself is cut."""
    if not payload.startswith("RESULT "):
        raise ValueError(f"not a result line: {payload[:40]!r}")
    result, end = json.JSONDecoder().raw_decode(payload, len("RESULT "))
    if not isinstance(result, dict):
        raise ValueError(f"a result line holds a JSON object, got {type(result).__name__}")
    return result, payload[end:].strip()


def launch(script: str | os.PathLike, nproc: int | None = None, args: Sequence[str] = (), *,
           backend: str | None = None, timeout_s: float = 300.0, echo: bool = True, threads_per_process: int = 1,
           extra_env: dict | None = None) -> LaunchResult:
    """Run ``script`` (a worker's file, e.g. ``worker_path("data_parallel")``) under torchrun with
    ``nproc`` processes on this machine (None: :func:`default_world_size`) and wait for it.

    Each line a rank prints is shown (``echo``) and kept, labelled ``[rank r]``. If any rank fails,
    this raises :class:`LaunchError` naming the rank that failed first by itself, with its exit code or the
    signal that killed it, and its output; the others are named as waiting (stopped by torchrun, or their
    collective failed without their peer), and when every failure was a collective giving up, the rank that
    hung is blamed. If the whole job takes longer than ``timeout_s`` it is killed, and the error says which
    ranks had not finished and how the others had ended. Whatever ends the wait (success, a failing rank,
    the timeout, an interrupt), every process of the job is killed before this returns, the ranks and their
    children included (see :data:`JOB_ENV`). ``backend`` 'nccl' needs a GPU per process
    (:class:`TooFewGPUsError` otherwise); the scripts read it from ``GPUFORMER_BACKEND``.
    """
    _check_launch_args(nproc, args, backend, timeout_s, threads_per_process, extra_env)
    script = Path(script)
    if not script.is_file():
        raise FileNotFoundError(f"no script {script}: the workers live in files (a function defined in a notebook "
                                "cell cannot be started in another process); the course's are "
                                "worker_path('data_parallel'), worker_path('model_parallel') and worker_path('translation')")
    backend = backend or default_backend()
    nproc = default_world_size() if nproc is None else int(nproc)
    if backend == "nccl":
        check_gpus(nproc)
    marker = uuid.uuid4().hex
    env = {**os.environ, "GPUFORMER_BACKEND": backend, "OMP_NUM_THREADS": str(threads_per_process),
           "PYTHONUNBUFFERED": "1", **(extra_env or {}), JOB_ENV: marker}
    ends = Path(tempfile.mkdtemp(prefix="gpuformer_launch_"))
    # each rank runs under a watcher that records how it ended (rank_ends), started as a module (-m), so that
    # the package folder it lives in is not put on its path; not with -I, which a graded run's sandbox refuses
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "--tee=3",
           "--max-restarts=0", "--no-python", sys.executable, "-u", "-m", rank_ends.__name__, str(ends), str(script),
           *map(str, args)]
    started = time.perf_counter()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
    except BaseException:
        shutil.rmtree(ends, ignore_errors=True)
        raise
    timed_out = threading.Event()
    ended_by_timeout: dict[int, rank_ends.RankEnd] = {}

    def kill() -> None:
        ended_by_timeout.update(rank_ends.read_ends(ends))  # before the kill, which ends the rest
        timed_out.set()
        _stop_job(proc, marker)

    timer = threading.Timer(timeout_s, kill)
    timer.start()
    lines, results, raw = [], {}, []
    try:
        for line in proc.stdout:
            line = line.rstrip("\n")
            raw.append(line)
            match = _LABEL.match(line)
            if match:
                payload = line[match.end():]
                payload = re.sub(r"^\[rank\d+\]:\s?", "", payload)  # torch's own label on tracebacks and logs
                label = f"[rank {match.group(1)}]"
                line = payload if payload.startswith(label) else f"{label} {payload}"  # rank_print labelled it
                if payload.startswith("RESULT "):
                    result, rest = result_of(payload)
                    results.update(result)
                    if not rest:
                        continue
                    line = rest  # another rank's output, glued to the result's line in the shared pipe
            elif line.startswith(_NOISE) or not line.strip():
                continue
            lines.append(line)
            if echo and match:
                print(line, flush=True)
        proc.wait()
    finally:
        timer.cancel()
        survivors = _stop_job(proc, marker)  # also after success: a rank's child may still be running
        proc.stdout.close()
        ended = rank_ends.read_ends(ends)
        shutil.rmtree(ends, ignore_errors=True)
    seconds = time.perf_counter() - started
    left = (f"\nprocesses {survivors} of the job (marked {JOB_ENV}={marker}) could not be stopped"
            if survivors else "")
    if timed_out.is_set():
        ranks = rank_ends.explain_timeout(ended_by_timeout, nproc)
        raise LaunchError(f"{script.name} did not finish within {timeout_s:g} s and was stopped: {ranks}; "
                          "last lines:\n" + "\n".join(lines[-10:]) + left)
    if proc.returncode != 0:
        failed, what, ranks = rank_ends.explain_failure(ended, lines, nproc)
        if failed is None:  # no watcher recorded a failure (torchrun's own error?): the ranks' errors, torchrun's word
            failed, what = _failing_rank(lines, raw), f"exit code {proc.returncode}"
        error = [line for line in lines if line.startswith(f"[rank {failed}]")] if failed is not None else lines
        tail = "\n".join(([ranks] if ranks else []) + error[-12:])
        raise LaunchError(f"{script.name} failed on rank {failed if failed is not None else '?'} ({what}):\n"
                          f"{tail}{left}")
    if survivors:
        warnings.warn(left.strip(), RuntimeWarning, stacklevel=2)
    return LaunchResult(lines=lines, results=results, seconds=seconds)


def _stop_job(proc: subprocess.Popen, marker: str, wait_s: float = 10.0) -> list[int]:
    """SIGKILL torchrun (its process group) and every process that carries ``JOB_ENV=marker``, then wait
    until they are gone. Returns the pids still alive after ``wait_s`` seconds (normally none)."""
    # torchrun's pid (and group id) is its own until it is reaped; after that it may be another process's
    root = proc.pid if proc.returncode is None else None
    doomed = _job_pids(marker, root)  # before torchrun dies: the fallback's tree walk needs it alive
    if root is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(root, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while doomed:
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
        doomed = _job_pids(marker, None)  # again: one may have started another before it died
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=max(0.1, deadline - time.monotonic()))  # reap torchrun, so it is no zombie
    return sorted(doomed)


def _job_pids(marker: str, root: int | None) -> set[int]:
    """This user's live processes (zombies excluded) whose environment holds ``JOB_ENV=marker``: read
    from /proc on Linux; elsewhere (macOS) with psutil if it is installed, adding ``root``'s process
    tree; else none, leaving the process group of ``root`` as the only thing killed."""
    if _has_proc():
        needle = f"{JOB_ENV}={marker}".encode()
        return {pid for pid in _proc_pids() if needle in _proc_environ(pid).split(b"\0")}
    try:
        import psutil
    except ImportError:
        return set()
    found = []
    if root is not None:
        with contextlib.suppress(psutil.Error):
            found += psutil.Process(root).children(recursive=True)
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.environ().get(JOB_ENV) == marker:
                found.append(p)
    live = set()
    for p in found:
        with contextlib.suppress(psutil.Error):
            if p.pid != os.getpid() and p.status() != psutil.STATUS_ZOMBIE:
                live.add(p.pid)
    return live


def _has_proc() -> bool:
    """Whether processes' environments can be read from /proc (Linux)."""
    return os.path.exists("/proc/self/environ")


def _proc_pids() -> list[int]:
    """This user's processes but this one, from /proc."""
    me, uid = os.getpid(), os.getuid()
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{name}").st_uid == uid:
                    pids.append(int(name))
    return pids


def _proc_environ(pid: int) -> bytes:
    """The environment ``pid`` was started with, NUL-separated; empty for a zombie or a process gone."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _failing_rank(lines: list[str], raw: list[str]) -> int | None:
    """Where no watcher recorded how the ranks ended: the rank whose own error started the failure, one
    whose exception is not the consequence of another rank dying (:data:`rank_ends.WAITING`); else the rank
    torchrun names as root cause."""
    for line in lines:
        match = rank_ends.ERROR_LINE.match(line)
        if match and "SIGTERM" not in line and not rank_ends.WAITING.search(line):
            return int(match.group(1))
    cause = "\n".join(raw).split("Root Cause", 1)[-1]
    match = re.search(r"rank\s*:\s*(\d+)", cause)
    return int(match.group(1)) if match else None


# --------------------------------------------------------------------------- data parallel from scratch


def broadcast_parameters(model: nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s weights to every rank, so all replicas start equal."""
    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor.data, src)


def average_gradients(model: nn.Module) -> None:
    """All-reduce every gradient and divide by the world size: each rank then holds the gradient of
    the whole global batch's mean loss (when every rank's batch is as large)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.flatten() for g in grads])  # one message instead of one per tensor
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset: offset + g.numel()].view_as(g))
        offset += g.numel()


class NaiveDataParallel(nn.Module):
    """Data parallel in a few lines: broadcast the weights once, then all-reduce each gradient
    asynchronously the moment backward has produced it (a hook per parameter), so communication
    overlaps with the rest of the backward pass; at the end of backward the all-reduces are waited for
    and averaged (:meth:`finish_gradients`, queued to run when backward finishes, and safe to call again
    before the optimizer step). DDP does the same with buckets of many gradients per message.

    Gradient accumulation: run every micro-batch but the last inside :meth:`no_sync` (as with DDP), so
    backward only accumulates locally and the last backward all-reduces the sums, once. A second backward
    while an all-reduce of the same gradient is still pending is refused: it would add to a tensor the
    collective is still summing, and reduce part of it twice (wrong gradients, silently)."""

    averages_gradients = True
    """Backward averages the gradients over the ranks (``speed.make_train_step`` reads this to all-reduce
    the token count under ``normalize_by='tokens'``)."""

    def __init__(self, module: nn.Module):
        super().__init__()
        # "run this when the backward pass ends": the autograd engine's queue_callback, which DDP itself uses;
        # torch has no public name for it
        engine = getattr(torch.autograd.Variable, "_execution_engine", None)
        self._queue_callback = getattr(engine, "queue_callback", None)
        if self._queue_callback is None:
            raise RuntimeError(f"torch {torch.__version__} has no torch.autograd.Variable._execution_engine."
                               "queue_callback, which NaiveDataParallel needs to average the gradients when "
                               "backward ends: use DistributedDataParallel")
        self.module = module
        broadcast_parameters(module)
        self._pending: list[tuple[dist.Work, Tensor]] = []
        self._pending_ids: set[int] = set()
        self._sync = True
        self._finish_queued = False
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._reduce)

    def _reduce(self, p: Tensor) -> None:
        if not self._sync:
            return  # inside no_sync: keep accumulating locally
        if id(p) in self._pending_ids:
            raise RuntimeError("a second backward pass reached a gradient whose all-reduce is still pending: "
                               "accumulate micro-batches inside `with model.no_sync():` (all but the last), or "
                               "call finish_gradients() between backward passes")
        self._pending_ids.add(id(p))
        self._pending.append((dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, async_op=True), p.grad))
        if not self._finish_queued:  # wait for them all when this backward pass ends, as DDP does
            self._finish_queued = True
            self._queue_callback(self.finish_gradients)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Hold back the all-reduce: backward inside only accumulates gradients on this rank; the first
        backward outside all-reduces the accumulated sums (one round of communication per step)."""
        before, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = before

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradients(self) -> None:
        """Wait for the all-reduces started during backward and average (a no-op when none is pending)."""
        world = dist.get_world_size()
        for work, grad in self._pending:
            work.wait()
            grad /= world
        self._pending.clear()
        self._pending_ids.clear()
        self._finish_queued = False


class ShardedAdamW:
    """ZeRO stage 1 by hand: AdamW whose moments are split over the ranks (Rajbhandari et al., 2020).

    Replicated AdamW keeps two float32 moments per parameter on every rank, 8 bytes per parameter N times
    over. Here the parameters are seen as one flat vector of Ψ values, padded to N shards of
    S = ⌈Ψ/N⌉; rank r owns the shard [r S, (r+1) S): a float32 copy of those weights and an ordinary
    ``torch.optim.AdamW`` over it, so it holds 8 S bytes of moments instead of 8 Ψ. ``step()`` expects
    gradients already averaged over the ranks (DDP or :func:`average_gradients`): it updates its own
    shard from its slice of the flat gradient, then ``all_gather`` gives every rank every updated shard
    and the weights are copied back. AdamW is elementwise, so the result is the same numbers as one
    process running ``torch.optim.AdamW`` on the same gradients.

    Only all-reduce (upstream) and all-gather are used, which every backend supports. ZeRO-2 would
    reduce-scatter the gradients instead (each rank receives only its shard's average, the same bytes
    as the all-reduce, and frees the rest); ZeRO-3 shards the weights too (chapter 12)."""

    def __init__(self, params, *, group=None, **adamw_kwargs):
        self.params = [p for p in params if p.requires_grad]
        self.group = group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.numel = sum(p.numel() for p in self.params)  # Ψ
        self.shard_size = math.ceil(self.numel / self.world)  # S
        start = self.rank * self.shard_size
        flat = self._flat([p.detach() for p in self.params])
        self.shard = nn.Parameter(flat[start:start + self.shard_size].clone())
        self.optimizer = torch.optim.AdamW([self.shard], **adamw_kwargs)

    def _flat(self, tensors: list[Tensor]) -> Tensor:
        """The tensors as one vector, zero-padded to N S values."""
        flat = torch.cat([t.flatten() for t in tensors])
        return nn.functional.pad(flat, (0, self.world * self.shard_size - self.numel))

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        S, start = self.shard_size, self.rank * self.shard_size
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in self.params]
        self.shard.grad = self._flat(grads)[start:start + S].to(self.shard.dtype)
        self.optimizer.step()  # AdamW on this rank's S values only
        gathered = self.shard.new_empty(self.world * S)
        dist.all_gather(list(gathered.split(S)), self.shard.detach(), group=self.group)
        offset = 0
        for p in self.params:  # every rank now holds every updated weight
            p.copy_(gathered[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds: AdamW's two moments of its shard (the step counter,
        a scalar, left out)."""
        return sum(t.numel() * t.element_size() for s in self.optimizer.state.values()
                   for t in s.values() if torch.is_tensor(t) and t.dim() > 0)


def zero1_bytes_per_rank(n_params: int, world_size: int, bytes_per_state: int = 8) -> int:
    """Optimizer-state bytes per rank: ``bytes_per_state`` (AdamW: two float32 moments, 8) times
    ⌈Ψ / N⌉ with ZeRO-1, times Ψ replicated (``world_size`` = 1)."""
    if n_params < 1 or world_size < 1:
        raise ValueError(f"n_params and world_size must be >= 1, got {n_params} and {world_size}")
    return bytes_per_state * math.ceil(n_params / world_size)


def ring_all_reduce(tensor: Tensor) -> Tensor:
    """Sum ``tensor`` over all ranks, in place, with the ring algorithm: the tensor is cut into
    ``world_size`` chunks; in ``world_size - 1`` reduce-scatter steps each rank sends one chunk to its
    right neighbour and adds the chunk arriving from its left, after which each rank owns one fully
    summed chunk; ``world_size - 1`` all-gather steps pass the summed chunks around. Each rank sends
    2 (N - 1) / N of the tensor in all, whatever N is: the reason the ring scales."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world == 1:
        return tensor
    flat = tensor.view(-1)
    chunks = list(flat.tensor_split(world))
    right, left = (rank + 1) % world, (rank - 1) % world
    incoming = torch.empty_like(chunks[0])
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(world - 1):
            # reduce-scatter: send chunk (rank - step), receive chunk (rank - step - 1) and add it;
            # all-gather: send the summed chunk (rank + 1 - step), receive (rank - step) and keep it
            shift = 0 if phase == "reduce-scatter" else 1
            send_i, recv_i = (rank - step + shift) % world, (rank - step - 1 + shift) % world
            buffer = incoming[: chunks[recv_i].numel()]
            ops = [dist.P2POp(dist.isend, chunks[send_i].contiguous(), right),
                   dist.P2POp(dist.irecv, buffer, left)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            if phase == "reduce-scatter":
                chunks[recv_i] += buffer
            else:
                chunks[recv_i].copy_(buffer)
    return tensor


def _ring_phase(chunks: list[Tensor], ring: list[int], phase: str) -> None:
    """One phase of a ring over the global ranks ``ring`` (this rank among them), on ``len(ring)`` chunks of
    equal size, in place: 'reduce-scatter' leaves this rank (position i in the ring) owning chunk i + 1
    summed over the ring; 'all-gather' then hands every rank every summed chunk (as in :func:`ring_all_reduce`)."""
    n = len(ring)
    me = ring.index(dist.get_rank())
    right, left = ring[(me + 1) % n], ring[(me - 1) % n]
    incoming = torch.empty_like(chunks[0])
    shift = 0 if phase == "reduce-scatter" else 1
    for step in range(n - 1):
        send_i, recv_i = (me - step + shift) % n, (me - step - 1 + shift) % n
        ops = [dist.P2POp(dist.isend, chunks[send_i].contiguous(), right), dist.P2POp(dist.irecv, incoming, left)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        if phase == "reduce-scatter":
            chunks[recv_i] += incoming
        else:
            chunks[recv_i].copy_(incoming)


def hierarchical_all_reduce(tensor: Tensor, gpus_per_node: int) -> Tensor:
    """Sum ``tensor`` over all ranks, in place, in the two phases a cluster's all-reduce uses (the
    ``'two-phase'`` schedule of ``collective_costs.hierarchical_allreduce_time``), for ranks numbered
    ``node * gpus_per_node + local``: (1) a ring reduce-scatter inside each node (fast links), after which
    each rank owns one summed shard of its node; (2) a ring all-reduce of that shard across the nodes,
    among the ranks with the same local index (one NIC each: the slow links carry 1 / G of the tensor
    per rank); (3) a ring all-gather inside each node. Every rank takes part in every step."""
    world, rank = dist.get_world_size(), dist.get_rank()
    g = gpus_per_node
    if isinstance(g, bool) or not isinstance(g, int) or g < 1 or world % g:
        raise ValueError(f"gpus_per_node={gpus_per_node!r} must be an int >= 1 that divides the world size {world}")
    m = world // g
    node, local = divmod(rank, g)
    node_ring = list(range(node * g, (node + 1) * g))
    rail_ring = list(range(local, world, g))  # the ranks with this local index, one per node
    flat = tensor.reshape(-1)
    padded = torch.zeros(-(-flat.numel() // (g * m)) * g * m, dtype=flat.dtype, device=flat.device)
    padded[: flat.numel()] = flat
    shards = list(padded.view(g, -1))  # one shard per GPU of the node
    _ring_phase(shards, node_ring, "reduce-scatter")
    mine = shards[(local + 1) % g]  # the shard this rank now holds summed over its node
    pieces = list(mine.view(m, -1))  # the shard in one piece per node, for the ring across nodes
    _ring_phase(pieces, rail_ring, "reduce-scatter")
    _ring_phase(pieces, rail_ring, "all-gather")
    _ring_phase(shards, node_ring, "all-gather")
    flat.copy_(padded[: flat.numel()])
    return tensor


def ring_allreduce_time(nbytes: float, world_size: int, alpha: float, bandwidth: float) -> float:
    """The alpha-beta model of a ring all-reduce: 2 (N - 1) messages of latency ``alpha`` seconds, and
    2 (N - 1) / N of the bytes through each link at ``bandwidth`` bytes/s."""
    if world_size < 1 or bandwidth <= 0 or alpha < 0 or nbytes < 0:
        raise ValueError("need world_size >= 1, bandwidth > 0, alpha >= 0 and nbytes >= 0")
    n = world_size
    return 0.0 if n == 1 else 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes / bandwidth


def scaling(time_one: float, time_n: float, n: int) -> tuple[float, float]:
    """Speedup (time before / time after) and efficiency (speedup / n) of running on ``n`` devices.
    The first seed's 10 h on one GPU and 2.7 h on four: 3.7x, 93 %."""
    if time_one <= 0 or time_n <= 0 or n < 1:
        raise ValueError("times must be positive and n >= 1")
    speed = time_one / time_n
    return speed, speed / n


def weak_scaling(time_one: float, time_n: float, n: int) -> tuple[float, float]:
    """Speedup and efficiency of **weak** scaling, where each of ``n`` devices keeps the per-device batch (n times
    the work): ``time_one`` is a step's time on one device, ``time_n`` the same step's on ``n`` (communication
    included). Efficiency t1 / tN (1 when communication costs nothing), speedup n * t1 / tN (work per second
    against one device). A 13.5 ms step without communication and 25.2 ms with an all-reduce on 2: 54 %, 1.07x."""
    if not (time_one > 0 and time_n > 0) or n < 1:
        raise ValueError("times must be positive and n >= 1")
    efficiency = time_one / time_n
    return n * efficiency, efficiency


def comparisons_from_rounds(rounds: dict[str, Sequence[float]], baseline: str, *, warmup: int = 0
                            ) -> dict[str, bench.Comparison]:
    """:class:`gpuformer_lib.bench.Comparison` of each timed name against ``baseline``, from the per-round seconds
    a worker timed with :func:`gpuformer_lib.bench.time_interleaved` in its own process and reported as lists
    (``rounds[name][i]``: round ``i``; every list the same length, at least 5 rounds)."""
    if baseline not in rounds:
        raise ValueError(f"baseline {baseline!r} is not one of the timed names {list(rounds)}")
    lengths = {len(t) for t in rounds.values()}
    if len(rounds) < 2 or len(lengths) != 1 or lengths.pop() < 5:
        raise ValueError("need two or more names timed in the same rounds, at least 5 of them")
    timings = {name: bench.Timing(times=tuple(float(t) for t in times), warmup=warmup, number=1)
               for name, times in rounds.items()}
    return {name: bench.Comparison(baseline, name, timings) for name in rounds if name != baseline}


# --------------------------------------------------------------------------- pipeline parallel from scratch


def gpipe_bubble(stages: int, micro_batches: int) -> float:
    """Share of time each stage idles in a GPipe schedule: (p - 1) / (m + p - 1) for p stages and m
    micro-batches of equal cost (the pipeline fills and drains once per batch)."""
    if stages < 1 or micro_batches < 1:
        raise ValueError("need at least one stage and one micro-batch")
    return (stages - 1) / (micro_batches + stages - 1)


def wait_for_device(device: torch.device) -> None:
    """Wait until ``device`` has finished the work queued on it, so that a clock read next sees it done.
    A GPU runs kernels asynchronously (and an NCCL ``recv`` does not block the host): without this the
    clock measures how long the host took to queue the work. A no-op on a CPU, which computes as it goes."""
    if _asynchronous(device):
        gpu.synchronize(device)


def _asynchronous(device: torch.device) -> bool:
    """Whether work on ``device`` runs asynchronously: on a GPU, or rehearsing one (gpu's stand-ins)."""
    return device.type == "cuda" or rehearsing_gpu()


def run_gpipe(stage: nn.Module, batch: Tensor | None, targets: Tensor | None, loss_fn: Callable[[Tensor, Tensor], Tensor],
              micro_batches: int, activation_shape: Sequence[int], dtype: torch.dtype = torch.float32) -> tuple[Tensor | None, float]:
    """One GPipe training step of a pipeline whose stage ``rank`` is ``stage``: all micro-batches
    forward (each stage receives activations from the previous rank and sends its output to the
    next), then all backward in reverse (gradients flow back the same way). Rank 0 gets ``batch``,
    the last rank ``targets``; ``activation_shape`` is one micro-batch's activation between stages.
    Returns the mean loss on the last rank (None elsewhere) and the seconds this rank spent computing
    (the rest of the step it waited: the bubble). Each timed region starts and ends with
    :func:`wait_for_device`, so on a GPU it covers the kernels, not their launches."""
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    device = next(stage.parameters()).device
    synced = _asynchronous(device)  # decided once: the clock is read 4 times per micro-batch

    def clock() -> float:
        if synced:
            gpu.synchronize(device)
        return time.perf_counter()

    inputs = batch.chunk(micro_batches) if first else [None] * micro_batches
    labels = targets.chunk(micro_batches) if last else [None] * micro_batches
    saved, busy, total = [], 0.0, None
    for i in range(micro_batches):
        if first:
            x = inputs[i]
        else:
            x = torch.empty(activation_shape, dtype=dtype, device=device)
            dist.recv(x, rank - 1)
            x.requires_grad_()
        t0 = clock()  # after the activation has arrived
        y = stage(x)
        if last:
            y = loss_fn(y, labels[i]) / micro_batches
            total = y.detach() if total is None else total + y.detach()
        busy += clock() - t0
        if not last:
            dist.send(y.detach().contiguous(), rank + 1)
        saved.append((x, y))
    for x, y in reversed(saved):
        grad = None
        if not last:
            grad = torch.empty_like(y)
            dist.recv(grad, rank + 1)
        t0 = clock()
        y.backward(grad)
        busy += clock() - t0
        if not first:
            dist.send(x.grad.contiguous(), rank - 1)
    return total, busy


# --------------------------------------------------------------------------- tensor parallel from scratch


class _CopyToParallel(torch.autograd.Function):
    """Megatron's f: identity forward; all-reduce of the gradient backward (every rank used x)."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class _ReduceFromParallel(torch.autograd.Function):
    """Megatron's g: all-reduce forward (sum the partial results); identity backward."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class ColumnParallelLinear(nn.Module):
    """A linear layer whose output features are split over the ranks: rank r holds rows
    ``r * out/N ..`` of the weight and computes its slice of the output; no communication forward.
    Built from the full layer, so it starts equal to it."""

    def __init__(self, full: nn.Linear):
        super().__init__()
        world, rank = dist.get_world_size(), dist.get_rank()
        if full.out_features % world:
            raise ValueError(f"out_features={full.out_features} is not divisible by the world size {world}")
        self.weight = nn.Parameter(full.weight.detach().chunk(world, dim=0)[rank].clone())  # (out/N, in)
        self.bias = nn.Parameter(full.bias.detach().chunk(world)[rank].clone()) if full.bias is not None else None

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.linear(_CopyToParallel.apply(x), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """A linear layer whose input features are split over the ranks: rank r holds columns
    ``r * in/N ..`` of the weight, multiplies its slice of the input, and the partial outputs are
    summed with one all-reduce; the bias is added once, after the sum."""

    def __init__(self, full: nn.Linear):
        super().__init__()
        world, rank = dist.get_world_size(), dist.get_rank()
        if full.in_features % world:
            raise ValueError(f"in_features={full.in_features} is not divisible by the world size {world}")
        self.weight = nn.Parameter(full.weight.detach().chunk(world, dim=1)[rank].clone())  # (out, in/N)
        self.bias = nn.Parameter(full.bias.detach().clone()) if full.bias is not None else None

    def forward(self, x_slice: Tensor) -> Tensor:
        y = _ReduceFromParallel.apply(nn.functional.linear(x_slice, self.weight))
        return y + self.bias if self.bias is not None else y


class TensorParallelMLP(nn.Module):
    """Megatron's MLP: column-parallel first layer, the activation on each rank's slice, row-parallel
    second layer; one all-reduce forward and one backward per MLP."""

    def __init__(self, linear1: nn.Linear, linear2: nn.Linear, activation: Callable[[Tensor], Tensor] = torch.relu):
        super().__init__()
        self.linear1, self.linear2 = ColumnParallelLinear(linear1), RowParallelLinear(linear2)
        self.activation = activation

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.activation(self.linear1(x)))


# --------------------------------------------------------------------------- DDP's buckets, counted


def ddp_messages(model: nn.Module, loss_fn: Callable[[nn.Module], Tensor], bucket_cap_mb: float,
                 steps: int = 2) -> list[list[int]]:
    """The bytes of each all-reduce message DDP sends in each of ``steps`` backward passes of ``model``
    (on the CPU, in this process): one message per bucket, counted by a communication hook. Joins a
    one-process gloo group for the purpose when none is initialised (and leaves it after). The first
    pass may differ from the later ones: DDP rebuilds its buckets after the first iteration, in the order
    the gradients arrived."""
    import tempfile

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    own_group = not dist.is_initialized()
    folder = tempfile.mkdtemp(prefix="gpuformer_ddp_") if own_group else None
    if own_group:
        dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
        messages: list[list[int]] = []

        def counting(state, bucket):
            messages[-1].append(bucket.buffer().numel() * bucket.buffer().element_size())
            return default_hooks.allreduce_hook(state, bucket)

        ddp.register_comm_hook(None, counting)
        for _ in range(steps):
            messages.append([])
            loss_fn(ddp).backward()
        return messages
    finally:
        if own_group:
            dist.destroy_process_group()
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
