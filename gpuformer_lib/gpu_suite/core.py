"""The GPU measurement suite's machinery: items, the context they measure through, result files.

An *item* measures what one chapter's lesson rests on, at GPU sizes (``toy`` sizes under rehearsal). It is a
function of a :class:`Context`, registered with :func:`item`, with a *cap*: the seconds it may take. Items
record through the context only, so every number in a result file carries its raw repeats, median and
spread (:meth:`Context.time`, :meth:`Context.compare`), or says how it was obtained (:meth:`Context.value`).

Leaves out: running items in a worker process and the command line (:mod:`gpuformer_lib.gpu_suite.runner`),
the items themselves (``gpuformer_lib/gpu_suite/items_*.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import math
import os
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

SCHEMA = 1
"""Version of the result files' layout; bumped when a field changes meaning."""


class SuiteError(RuntimeError):
    """A measurement that cannot be trusted (an impossible value, a result that disagrees with torch)."""


@dataclasses.dataclass(frozen=True)
class Item:
    """One measurement of the suite."""

    key: str
    """``chNN.name``, unique; the result file is ``chNN.json``."""
    chapter: int
    title: str
    """What it measures, one line, for ``--list``."""
    cap_s: float
    """The seconds it may take on a GPU, compiles included: the runner stops it after that."""
    fn: Callable[["Context"], None]
    min_gpus: int = 1
    """Items of chapter 11 that need two or more GPUs are skipped on one."""
    heavy: bool = False
    """Compiles (torch.compile, a CUDA C extension) or trains: runs after every light item."""
    expect_s: float | None = None
    """The seconds it should take on one H100 (default: a third of the cap). The runner starts an item only
    when the budget left covers this (or 1.5 x the item's last passing run on the same device), and stops
    it at its cap or at the end of the budget, whichever comes first."""

    def __post_init__(self):
        if self.expect_s is None:
            object.__setattr__(self, "expect_s", self.cap_s / 3)
        if not 0 < self.expect_s <= self.cap_s:
            raise ValueError(f"{self.key}: expect_s must be in (0, cap_s], got {self.expect_s!r}")

    @property
    def chapter_key(self) -> str:
        return f"ch{self.chapter:02d}"


ITEMS: dict[str, Item] = {}


def item(chapter: int, name: str, *, cap_s: float, title: str, min_gpus: int = 1, heavy: bool = False,
         expect_s: float | None = None):
    """Register the decorated ``fn(ctx)`` as the item ``chNN.name``."""
    if not (isinstance(chapter, int) and 0 <= chapter <= 16):
        raise ValueError(f"chapter must be an int 0-16, got {chapter!r}")
    if not re.fullmatch(r"[a-z0-9_]+", name):
        raise ValueError(f"an item's name is lower-case letters, digits and _, got {name!r}")
    if not 0 < cap_s <= 600:
        raise ValueError(f"cap_s must be in (0, 600] seconds, got {cap_s!r}")

    def register(fn: Callable[[Context], None]) -> Callable[[Context], None]:
        key = f"ch{chapter:02d}.{name}"
        if key in ITEMS:
            raise ValueError(f"item {key} is registered twice")
        ITEMS[key] = Item(key, chapter, title, float(cap_s), fn, min_gpus, heavy, expect_s)
        return fn

    return register


ITEMS_ENV = "GPUFORMER_SUITE_ITEMS"
"""A module to take the items from instead of the suite's own (tests use it to run items that fail, hang or
crash; a learner can point it at items of their own)."""


def ordered_items() -> list[Item]:
    """Priority order: light items by chapter, then the heavy ones (compiles, training), the quickest first, so
    that a short budget leaves out as few as it can (the CUDA C build, a minute of nvcc, comes last)."""
    importlib.import_module(os.environ.get(ITEMS_ENV) or "gpuformer_lib.gpu_suite.items")  # registers them
    return sorted(ITEMS.values(), key=lambda it: (it.heavy, it.expect_s if it.heavy else 0, it.chapter))


# --------------------------------------------------------------------------- measuring


def _finite_positive(what: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise SuiteError(f"{what}: {value!r} is not a finite, non-negative number")
    return value


def _summary(times: list[float]) -> dict[str, Any]:
    med = statistics.median(times)
    return {"repeats": [float(t) for t in times], "n": len(times), "median": med, "min": min(times),
            "max": max(times), "spread": (max(times) - min(times)) / med if med > 0 else 0.0}


class Context:
    """What an item measures with: the device, its sizes, a deadline, and the record it fills.

    ``toy`` is True under rehearsal (the CPU, sizes that run in a second); :meth:`size` picks between the
    toy and the GPU value. Every timing synchronizes the device (CUDA events on a GPU) and has warm-up calls.
    """

    def __init__(self, device: torch.device, toy: bool, cap_s: float, gpu_count: int = 1):
        self.device = device
        self.toy = toy
        self.gpu_count = gpu_count
        self.deadline = time.monotonic() + cap_s
        self.record: dict[str, Any] = {"measurements": {}, "values": {}, "comparisons": {}, "targets": [],
                                       "notes": []}

    # sizes and time
    def size(self, toy: Any, gpu: Any) -> Any:
        return toy if self.toy else gpu

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()

    def _budget(self, share: float) -> float:
        return max(0.05, self.seconds_left() * share)

    def _one_repeat(self, fn: Callable[[], object], number: int) -> float:
        """Seconds per call over one repeat of ``number`` calls: the course's timing helper, one repeat at a time
        (CUDA events on a GPU), so that the suite can interleave repeats and stop at its deadline."""
        from gpuformer_lib import bench

        return bench.time_fn(fn, device=self.device, warmup=0, repeats=1, number=number).times[0]

    def time(self, name: str, fn: Callable[[], object], *, warmup: int = 2, repeats: int = 7, number: int = 1,
             work: float | None = None, work_unit: str | None = None, share: float = 0.5) -> dict[str, Any]:
        """Seconds per call of ``fn``: ``warmup`` calls, then up to ``repeats`` repeats of ``number`` calls
        (at least 3, fewer once ``share`` of the item's remaining time is spent). With ``work`` (e.g. FLOPs or
        bytes per call) the record adds the rate ``work / median`` in ``work_unit`` per second."""
        from gpuformer_lib import bench

        for _ in range(warmup):
            fn()
        bench.synchronize(self.device)
        stop = time.monotonic() + self._budget(share)
        times: list[float] = []
        while len(times) < repeats and (len(times) < 3 or time.monotonic() < stop):
            times.append(_finite_positive(f"{name}: a repeat", self._one_repeat(fn, number)))
        entry = {"unit": "s", "warmup": warmup, "number": number, **_summary(times)}
        if work is not None:
            entry["work"] = _finite_positive(f"{name}: work", work)
            entry["work_unit"] = work_unit or "units"
            entry["rate"] = work / entry["median"] if entry["median"] > 0 else None
        self.record["measurements"][name] = entry
        return entry

    def compare(self, name: str, before: tuple[str, Callable[[], object]], after: tuple[str, Callable[[], object]],
                *, warmup: int = 2, repeats: int = 7, number: int = 1, share: float = 0.5,
                work: float | None = None, work_unit: str | None = None) -> dict[str, Any]:
        """Time two ways of doing the same work, interleaved (before, after, after, before, ...: a change in
        the machine's state meets both alike). Records both timings, speedup = before / after on the medians,
        and a verdict only when the gap exceeds the spread of both."""
        from gpuformer_lib import bench

        (label_a, fn_a), (label_b, fn_b) = before, after
        for _ in range(warmup):
            fn_a()
            fn_b()
        bench.synchronize(self.device)
        stop = time.monotonic() + self._budget(share)
        a: list[float] = []
        b: list[float] = []
        while len(a) < repeats and (len(a) < 3 or time.monotonic() < stop):
            pair = [(a, fn_a), (b, fn_b)] if len(a) % 2 == 0 else [(b, fn_b), (a, fn_a)]
            for times, fn in pair:
                times.append(_finite_positive(f"{name}: a repeat", self._one_repeat(fn, number)))
        sa, sb = _summary(a), _summary(b)
        speedup = sa["median"] / sb["median"] if sb["median"] > 0 else math.inf
        # the gap must exceed both scatters: before's fastest repeat slower than after's slowest, or the reverse
        if sa["min"] > sb["max"]:
            verdict = f"{label_b} faster"
        elif sb["min"] > sa["max"]:
            verdict = f"{label_a} faster"
        else:
            verdict = "no difference beyond the spread"
        entry = {"before": {"label": label_a, "unit": "s", **sa}, "after": {"label": label_b, "unit": "s", **sb},
                 "speedup": speedup, "speedup_is": "before median / after median", "verdict": verdict,
                 "number": number, "warmup": warmup}
        if work is not None:
            entry["work"], entry["work_unit"] = _finite_positive(f"{name}: work", work), work_unit or "units"
        self.record["comparisons"][name] = entry
        return entry

    def value(self, name: str, value: float, unit: str, how: str) -> float:
        """A number obtained once (a peak memory, a count, a ratio of recorded medians), and how."""
        value = float(value)
        if not math.isfinite(value):
            raise SuiteError(f"{name}: {value!r} is not finite")
        self.record["values"][name] = {"value": value, "unit": unit, "how": how}
        return value

    def target(self, name: str, value: float, at_least: float, why_short: str = "") -> bool:
        """A performance target (a benchmark, not a test): met or not, recorded with what the trace says."""
        met = bool(value >= at_least)
        self.record["targets"].append({"name": name, "value": float(value), "at_least": float(at_least),
                                       "met": met, **({} if met else {"short_because": why_short})})
        return met

    def note(self, text: str) -> None:
        self.record["notes"].append(str(text))

    def check_close(self, what: str, got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float) -> None:
        """An item measures only what computes the right result: compare with torch before timing."""
        if not torch.allclose(got.float(), want.float(), atol=atol, rtol=rtol):
            gap = (got.float() - want.float()).abs().max().item()
            raise SuiteError(f"{what}: differs from torch by {gap:.3g} (atol {atol}, rtol {rtol})")


# --------------------------------------------------------------------------- files


def device_slug(name: str) -> str:
    """A folder name for a device: ``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug or "unknown-device"


def write_json_atomic(path: Path, data: dict) -> None:
    """Write ``data`` so that ``path`` holds either the old file or the whole new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def merge_item(path: Path, environment: dict, key: str, entry: dict) -> None:
    """Put one item's entry into its chapter's file, keeping the entries of items not run this time."""
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
        items = old.get("items", {}) if isinstance(old, dict) and old.get("schema") == SCHEMA else {}
    except (OSError, ValueError):
        items = {}
    items[key] = entry
    write_json_atomic(path, {"schema": SCHEMA, "device": environment["device"], "items": items})
