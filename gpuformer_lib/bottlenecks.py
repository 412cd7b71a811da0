"""Finding a training step's bottleneck: timings designed so that a GPU could show the effect, and reading a
profiler trace.

Covers:

- :func:`sync_cost`: the cost of reading a value back (``loss.item()``) each step, against a baseline that
  queues ``steps`` steps back to back and waits for the device **once** at the end, in interleaved rounds
  (:func:`bench.compare`); :func:`sync_cost_words` words its verdict. (A baseline that
  synchronised after every step, as a per-repeat timer does, would pay the very wait it is compared with.)
- :func:`time_input_pipeline`: the host's batch preparation timed on the host alone, with no device
  synchronise inside the timer. (A synchronise there waits for the *previous* step's queued kernels and books
  the GPU's compute as "waiting for data".)
- reading a Chrome/Perfetto trace written by ``torch.profiler`` (``export_chrome_trace``):
  :func:`load_trace` (a relative path is also looked for in the course's notebooks folder,
  :func:`shipped_file`), :func:`profiler_steps` (the ``ProfilerStep#N`` windows), :func:`host_syncs` (the
  read-backs: ``aten::_local_scalar_dense`` under ``.item()``/``int()``/``bool()``, and on a GPU the
  ``cudaStreamSynchronize`` it waits in), :func:`busy_share` (the share of a window in which a row, e.g. a
  CUDA stream's kernels or a CPU thread's operators, is busy; the rest is idle gaps), :func:`launch_gaps`;
- :func:`record_example_trace`: the small CPU trace shipped with the book (``notebooks/traces/``).

Leaves out: predictions (``predict``), the profiler itself and the operator table (``bench.profile_steps``, ``bench.time_by_category``),
Nsight Systems (its ``.nsys-rep`` files are not Chrome traces), HTA's multi-rank analyses. Trace event format:
the Chrome Trace Event Format ("X" complete events with ``ts`` and ``dur`` in microseconds), as PyTorch's
Kineto writes it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Callable, Iterable

import torch

from gpuformer_lib import bench

# --------------------------------------------------------------------------- timings that can show the effect


@dataclasses.dataclass(frozen=True)
class SyncCost:
    """Steps queued back to back (one wait at the end) against steps that read a value back every step, timed
    in interleaved rounds: :attr:`comparison` is the reading arm judged against the queued one."""

    comparison: bench.Comparison
    steps: int

    @property
    def queued(self) -> bench.Timing:
        """Seconds per step, queued back to back: one entry per round."""
        return self.comparison.timings["queued"]

    @property
    def reading(self) -> bench.Timing:
        """Seconds per step, reading a value back after each: one entry per round."""
        return self.comparison.timings["reading"]

    @property
    def ratio(self) -> float:
        """Median reading time / median queued time (above 1: the reads cost time)."""
        return 1 / self.comparison.speedup


def sync_cost(queued_step: Callable[[], object], reading_step: Callable[[], object], device: torch.device | str,
              *, steps: int = 10, repeats: int = 5, warmup: int = 1, max_seconds: float | None = None) -> SyncCost:
    """Time ``steps`` calls of ``queued_step`` back to back with one synchronise at the end of each round, and
    the same for ``reading_step`` (which reads a value back itself, e.g. ``step().loss.item()``), in interleaved
    rounds (:func:`bench.compare`, at least 5, more while the spread is wide, ``max_seconds`` capping the extra
    ones), so a change in the machine's load meets both alike."""
    for name, value, least in (("steps", steps, 2), ("repeats", repeats, 5), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    comparison = bench.compare({"queued": queued_step, "reading": reading_step}, device=device, warmup=warmup,
                               repeats=repeats, max_repeats=3 * repeats, number=steps,
                               max_seconds=max_seconds)["reading"]
    return SyncCost(comparison, steps)


def sync_cost_words(cost: SyncCost, device_type: str) -> str:
    """The interpretation of a measured sync cost, chosen from its comparison's verdict and the device."""
    if not isinstance(cost, SyncCost):
        raise TypeError(f"sync_cost_words reads a SyncCost (bottlenecks.sync_cost), got {type(cost).__name__}")
    c = cost.comparison
    low, high = c.ratio_range
    rounds = f"the middle half of the {len(c.ratios)} rounds {1 / high:.2f}-{1 / low:.2f}x"
    on_cpu = device_type == "cpu"
    if c.verdict == "slower":
        cause = ("the .item() call itself costs that time: on a CPU every operation has finished when it returns, so "
                 "a read waits for nothing" if on_cpu else "the wait costs time")
        words = f"beyond the spread of the interleaved rounds ({rounds}): {cause}"
    elif c.verdict == "faster":
        words = (f"no cost we can see: the reading arm ran faster, beyond the spread ({rounds}), which a read "
                 "cannot cause: the machine's load changed between the arms")
    else:
        words = f"no cost we can see, within the spread of the interleaved rounds ({rounds})"
    if on_cpu:
        words += " (a CPU has no queue to drain, so the lesson of a read's wait needs a GPU)"
    return words


def time_input_pipeline(train_step: Callable[[list], object], prepare: Callable[[int], torch.Tensor],
                        n: int, device: torch.device | str,
                        to_device: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[float, float]:
    """Run ``n`` steps; batch ``i`` is built on the host by ``prepare(i)`` (CPU tensors only), copied by
    ``to_device`` (default: ``.to(device, non_blocking=True)``) and trained on by ``train_step([batch])``.

    Returns (seconds per step, host preparation seconds per step). Only ``prepare`` is timed per step, on the
    host's clock and **without a synchronise**: it does no device work, so there is nothing to wait for, and a
    synchronise would wait for the previous step's queued kernels instead. The loop as a whole is timed with one
    synchronise at the end. On a GPU the step's kernels run while the host prepares the next batch, so the GPU
    waits for data only when preparation takes longer than the GPU's step; on a CPU nothing overlaps and the
    preparation adds to every step."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    device = torch.device(device)
    copy = to_device or (lambda batch: batch.to(device, non_blocking=True))
    prep = 0.0
    bench.synchronize(device)
    started = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        batch = prepare(i)
        prep += time.perf_counter() - t0
        if not isinstance(batch, torch.Tensor) or batch.device.type != "cpu":
            raise ValueError("prepare(i) must return a CPU tensor (host-side work only); the copy to the device "
                             "is to_device's")
        train_step([copy(batch)])
    bench.synchronize(device)
    return (time.perf_counter() - started) / n, prep / n


# --------------------------------------------------------------------------- reading a trace


NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"
"""The course's notebooks folder: the shipped traces are in its ``traces/``, and chapter 10 names them relative to
it, as a kernel started there (``make lab``, the book's build) sees them."""


def shipped_file(path: str | os.PathLike) -> Path:
    """``path`` as given if it exists from the current folder, else a relative ``path`` inside the course's
    notebooks folder (:data:`NOTEBOOKS_DIR`) if it is there: chapter 10 opens ``traces/cpu-tiny-step.json``,
    which a kernel started in another folder (an IDE, ``jupyter lab`` from the repository root) would not find.
    Raises :class:`FileNotFoundError` saying where the file was looked for and where it should be."""
    given = Path(path)
    if given.exists():
        return given
    beside_notebooks = NOTEBOOKS_DIR / given
    if not given.is_absolute() and beside_notebooks.exists():
        return beside_notebooks
    where = "" if given.is_absolute() else f" nor in the course's notebooks folder ({beside_notebooks})"
    raise FileNotFoundError(
        f"{str(path)!r} was not found from the current folder ({Path.cwd()}){where}. The chapters name their files "
        f"relative to the notebooks folder ({NOTEBOOKS_DIR}) and expect the kernel to run there: start Jupyter "
        "with `make lab`, or pass the file's full path")


def load_trace(trace: str | os.PathLike | dict) -> list[dict]:
    """The complete events ("X": a name, a start ``ts`` and a duration ``dur`` in microseconds, a ``pid``/``tid``
    row and a ``cat`` such as ``cpu_op``, ``kernel``, ``cuda_runtime``, ``user_annotation``) of a Chrome trace
    (a path, found by :func:`shipped_file`, or the loaded JSON), sorted by start time."""
    if not isinstance(trace, dict):
        with open(shipped_file(trace)) as f:
            trace = json.load(f)
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise ValueError("not a Chrome trace: expected a JSON object with a 'traceEvents' list")
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]
    return sorted(complete, key=lambda e: float(e["ts"]))


def profiler_steps(events: list[dict], *, device_side: bool = False) -> list[dict]:
    """The ``ProfilerStep#N`` windows (one per recorded step of a scheduled profile), in order: the host's
    (``user_annotation``), or with ``device_side`` the same ranges as the GPU ran them (``gpu_user_annotation``,
    which a GPU trace also holds: the GPU runs a step later than the host queues it), falling back to the host's
    where the trace has none."""
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    host = [e for e in steps if e.get("cat") != "gpu_user_annotation"]
    device = [e for e in steps if e.get("cat") == "gpu_user_annotation"]
    return (device or host) if device_side else host


def _inside(e: dict, window: dict) -> bool:
    return float(window["ts"]) <= float(e["ts"]) and float(e["ts"]) + float(e["dur"]) <= float(window["ts"]) + float(
        window["dur"]) + 1e-3


SYNC_EVENT_NAMES = ("aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize",
                    "cudaEventSynchronize")
"""Events where the host waits for the device: ``aten::_local_scalar_dense`` is the one copy of a single number
to the host under ``.item()``, ``int(t)``, ``float(t)``, ``bool(t)`` (it is inside ``aten::item``; count one of
the two, not both); on a GPU it waits in a ``cudaStreamSynchronize``; ``torch.cuda.synchronize()`` shows as
``cudaDeviceSynchronize``."""


def host_syncs(events: list[dict], window: dict | None = None) -> list[dict]:
    """The read-backs of the trace (or of one window): ``aten::_local_scalar_dense`` events, one per value read
    back to the host. (Their ``cudaStreamSynchronize`` children on a GPU are the same waits, not counted again.)"""
    return [e for e in events if e.get("name") == "aten::_local_scalar_dense" and (window is None or _inside(e, window))]


def syncs_per_step(events: list[dict]) -> float:
    """Read-backs per recorded step: :func:`host_syncs` inside the ``ProfilerStep#N`` windows, averaged."""
    steps = profiler_steps(events)
    if not steps:
        raise ValueError("the trace has no ProfilerStep#N windows: record it with a schedule (bench.profile_steps)")
    return sum(len(host_syncs(events, s)) for s in steps) / len(steps)


def _union_length(intervals: Iterable[tuple[float, float]]) -> float:
    total, end = 0.0, -float("inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def busy_share(events: list[dict], window: dict, select: Callable[[dict], bool]) -> float:
    """The share of ``window``'s time covered by the events ``select`` picks (their union, clipped to the window):
    for a CUDA stream, ``lambda e: e.get('cat') == 'kernel'``; 1 - this is the share the row sat idle."""
    start, end = float(window["ts"]), float(window["ts"]) + float(window["dur"])
    if end <= start:
        raise ValueError("the window has no duration")
    spans = [(max(float(e["ts"]), start), min(float(e["ts"]) + float(e["dur"]), end)) for e in events if select(e)]
    return bench.check_fraction("busy share", _union_length((a, b) for a, b in spans if b > a) / (end - start),
                                ceiling="the window")


def top_level(events: list[dict], select: Callable[[dict], bool]) -> list[dict]:
    """The events ``select`` picks that no other picked event on the same row contains (the outermost ones)."""
    picked = sorted((e for e in events if select(e)), key=lambda e: (e.get("pid"), e.get("tid"), float(e["ts"]),
                                                                   -float(e["dur"])))
    out, ends = [], {}
    for e in picked:
        row = (e.get("pid"), e.get("tid"))
        if float(e["ts"]) + float(e["dur"]) <= ends.get(row, -float("inf")):
            continue
        out.append(e)
        ends[row] = float(e["ts"]) + float(e["dur"])
    return out


def launch_gaps(events: list[dict], window: dict, select: Callable[[dict], bool]) -> list[float]:
    """Microseconds between consecutive outermost events of a row inside ``window`` (idle gaps: on a GPU stream,
    time the GPU waited for the host's next launch)."""
    spans = [e for e in top_level(events, select) if _inside(e, window)]
    return [max(0.0, float(b["ts"]) - (float(a["ts"]) + float(a["dur"]))) for a, b in zip(spans, spans[1:])]


# --------------------------------------------------------------------------- the shipped example trace


def record_example_trace(path: str | os.PathLike, *, steps: int = 3) -> dict:
    """Record the small CPU trace the book ships: ``steps`` profiled training steps of a one-layer ``DecoderLM``
    (vocabulary 64, width 32, batch 2 x 16, SGD), built *with* the token-id check (its ``int(ids.min())`` and
    ``int(ids.max())`` are two read-backs per step) and a loop that reads the loss back with ``.item()`` every
    step (a third). Writes the trace to ``path`` with a ``gpuformer`` entry saying what it is; returns that
    entry."""
    from gpuformer_lib import speed
    from gpuformer_lib.model import DecoderLM, TransformerConfig

    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=64, d_model=32, n_heads=2, n_decoder_layers=1, d_ff=64, dropout=0.0,
                               max_len=16, check_token_ids=True)
    model = DecoderLM(config)
    # SGD: AdamW on a CPU reads each parameter's step count (a CPU scalar) with .item(), 15 reads per step
    # that would hide the loop's own; on a GPU those counts stay on the host and cost no wait
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = speed.make_train_step(model, optimizer, speed.next_token_loss)
    ids = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(0))
    losses = []
    bench.profile_steps(lambda: losses.append(step([ids]).loss.item()), wait=0, warmup=1, active=steps,
                        trace_path=path, device="cpu")
    about = {"device": "cpu", "what": f"{steps} training steps of a 1-layer DecoderLM (V=64, C=32, B x T = 2 x 16) "
             "with the token-id check and loss.item() every step: 3 read-backs per step", "torch": torch.__version__,
             "read_backs_per_step": 3}
    with open(path) as f:
        trace = json.load(f)
    trace["gpuformer"] = about
    for e in trace.get("traceEvents", []):  # shapes and ids are not needed to read it: a smaller file
        e.pop("args", None)
    with open(path, "w") as f:
        json.dump(trace, f, separators=(",", ":"))
    return about


# --------------------------------------------------------------------------- the GPU view's bound


def input_stall_words(step_s: float, prep_s: float, device_type: str) -> str:
    """What a host-side preparation time means beside the loop's time per step, chosen from the values and the
    device: on a CPU nothing overlaps; on a GPU preparation well under the step hides behind the queued work."""
    for name, value in (("step_s", step_s), ("prep_s", prep_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if step_s <= 0:
        raise ValueError("step_s must be > 0")
    share = bench.check_fraction("preparation share of the step", min(prep_s / step_s, 1.0), ceiling="the step")
    if device_type == "cpu":
        return (f"on a CPU nothing overlaps, so the preparation is simply part of every step: here {share:.1%} of "
                "it. On a GPU it would run while the GPU computes the step queued before it")
    if prep_s < 0.5 * step_s:
        return (f"the preparation ({share:.1%} of the time per step) runs on the host while the GPU computes the "
                "step queued before it: hidden, no stall")
    return (f"the preparation takes {share:.0%} of the time per step, as long as the GPU's work or longer: the GPU "
            "waits for data, and DataLoader workers (or tokenizing ahead) are the fix")
