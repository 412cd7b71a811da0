"""The few CUDA-only calls the course makes, each in one small wrapper with a CPU stand-in for rehearsal.

Covers: making a GPU current, synchronizing, the caching allocator's counters (allocated, peak,
reserved, free), emptying its cache, a memory cap (:func:`memory_cap`), a memory-history snapshot
(:func:`memory_history`) and CUDA-event timing (:func:`event_seconds`).

On a CUDA device each call is the ``torch.cuda`` call it names. While a GPU profile is rehearsed
(``$GPUFORMER_REHEARSE``, see :mod:`gpuformer_lib.profiles`; on any machine, one with GPUs too: the
rehearsal computes on the CPU) each runs a stand-in that
checks its arguments the way CUDA would (a device index the profile has, a cap between 0 and the
GPU's memory, a path to write) and returns a neutral value (0 bytes, the wall clock), so a notebook's
GPU branch executes here and a wrong argument fails CI. Anything else (a CPU device without
rehearsal) raises :class:`ValueError`: these calls have no meaning there.

Leaves out: the timing loop itself (``bench.time_fn``), measuring what autograd keeps on any device
(``memory.SavedActivations``).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Callable, Iterator

import torch

from gpuformer_lib.profiles import rehearsed_profile


def _target(device: torch.device | str | int | None) -> tuple[torch.device, bool]:
    """(device, real): ``real`` is True for a CUDA device; a CPU device is accepted only under rehearsal.

    Under rehearsal the rehearsed profile wins, also on a machine with GPUs: the work runs on the CPU, so
    every call is a stand-in and a CUDA index is checked against the *profile's* GPU count (on a real
    H100, ``cuda:1`` under the T4 profile is refused as on a T4; without this order, one real GPU raised
    CUDA's invalid-ordinal error and eight accepted it)."""
    if isinstance(device, int):
        device = torch.device("cuda", device)
    device = torch.device(device) if device is not None else None
    rehearsed = rehearsed_profile()
    if device is not None and device.type == "cuda":
        if rehearsed is not None:  # whatever torch.cuda.is_available() says: a rehearsal computes on the CPU
            count = rehearsed.gpu_count
            if (device.index or 0) >= count:
                raise ValueError(f"cuda:{device.index} does not exist on the rehearsed '{rehearsed.name}' profile "
                                 f"({count} GPU(s))")
            return device, False
        return device, True
    if rehearsed is not None and rehearsed.on_gpu and (device is None or device.type == "cpu"):
        return torch.device("cpu"), False
    raise ValueError(f"{device} is not a CUDA device: this call needs a GPU (or a rehearsed GPU profile, "
                     "GPUFORMER_REHEARSE=t4). Guard it with `if profile.on_gpu:`.")


def set_current(device: torch.device | str | int) -> None:
    """Make ``device`` the current GPU, so events, streams and allocator calls without a device use it."""
    device, real = _target(device)
    if real:
        torch.cuda.set_device(device)


def synchronize(device: torch.device | str | int | None = None) -> None:
    """Wait until the GPU has finished the work queued on it."""
    device, real = _target(device)
    if real:
        torch.cuda.synchronize(device)


def memory_allocated(device: torch.device | str | int | None = None) -> int:
    """Bytes held by tensors on the GPU (0 in rehearsal)."""
    device, real = _target(device)
    return torch.cuda.memory_allocated(device) if real else 0


def max_memory_allocated(device: torch.device | str | int | None = None) -> int:
    """Peak bytes held by tensors since the last :func:`reset_peak_memory_stats` (0 in rehearsal)."""
    device, real = _target(device)
    return torch.cuda.max_memory_allocated(device) if real else 0


def memory_reserved(device: torch.device | str | int | None = None) -> int:
    """Bytes the caching allocator holds from the driver: allocated plus its cache (0 in rehearsal)."""
    device, real = _target(device)
    return torch.cuda.memory_reserved(device) if real else 0


def reset_peak_memory_stats(device: torch.device | str | int | None = None) -> None:
    device, real = _target(device)
    if real:
        torch.cuda.reset_peak_memory_stats(device)


def empty_cache() -> None:
    """Give the allocator's cached, unused blocks back to the driver (does not free live tensors)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def total_memory(device: torch.device | str | int | None = None) -> int:
    """The GPU's memory in bytes (the rehearsed profile's, in rehearsal)."""
    device, real = _target(device)
    if real:
        return torch.cuda.get_device_properties(device).total_memory
    return int(rehearsed_profile().memory_gib * 2**30)


def mem_get_info(device: torch.device | str | int | None = None) -> tuple[int, int]:
    """(free, total) bytes as the driver sees them (in rehearsal: the profile's memory, all free)."""
    device, real = _target(device)
    if real:
        return torch.cuda.mem_get_info(device)
    total = total_memory(device)
    return total, total


DEVICE_PROPERTY_NAMES = ("name", "multi_processor_count", "warp_size", "max_threads_per_multi_processor",
                         "regs_per_multiprocessor", "shared_memory_per_multiprocessor", "L2_cache_size",
                         "total_memory")
"""The properties of ``torch.cuda.get_device_properties`` that chapter 2 explains."""


def device_properties(device: torch.device | str | int | None = None) -> dict[str, object]:
    """The GPU's properties named in :data:`DEVICE_PROPERTY_NAMES` (a property this PyTorch build does not
    report is left out). In rehearsal: what the profile knows, its name and memory."""
    device, real = _target(device)
    if real:
        props = torch.cuda.get_device_properties(device)
        found = {name: getattr(props, name, None) for name in DEVICE_PROPERTY_NAMES}
        return {name: value for name, value in found.items() if value is not None}
    return {"name": rehearsed_profile().gpu_name, "total_memory": total_memory(device)}


@contextlib.contextmanager
def memory_cap(device: torch.device | str | int, cap_bytes: int) -> Iterator[None]:
    """Let this process allocate at most ``cap_bytes`` on ``device`` while the block runs; an allocation
    past it raises ``torch.OutOfMemoryError``, as on a smaller GPU. The cap is lifted afterwards, even on
    an error. (In rehearsal the cap is checked but not enforced: see ``memory.SavedActivations(cap=)``.)"""
    device, real = _target(device)
    total = total_memory(device)
    if not isinstance(cap_bytes, int) or isinstance(cap_bytes, bool) or not 0 < cap_bytes <= total:
        raise ValueError(f"cap_bytes must be an int between 1 and the GPU's {total:,} bytes, got {cap_bytes!r}")
    if not real:
        yield
        return
    torch.cuda.set_per_process_memory_fraction(cap_bytes / total, device)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)


@contextlib.contextmanager
def memory_history(path: str | os.PathLike, device: torch.device | str | int | None = None,
                   max_entries: int = 100_000) -> Iterator[Path]:
    """Record every allocation while the block runs and write a snapshot to ``path`` (a pickle that
    https://pytorch.org/memory_viz draws). Recording stops afterwards, even on an error."""
    device, real = _target(device)
    path = Path(path)
    if not path.parent.is_dir():
        raise ValueError(f"cannot write the snapshot to {path}: {path.parent} is not a folder")
    if not real:
        yield path
        return
    torch.cuda.memory._record_memory_history(max_entries=max_entries, device=device)
    try:
        yield path
        torch.cuda.memory._dump_snapshot(str(path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None, device=device)


def event_seconds(fn: Callable[[], object], device: torch.device | str | int, number: int = 1) -> float:
    """Seconds per call of ``fn`` over ``number`` calls, timed with CUDA events on ``device``'s current
    stream (made current for the call, so work on cuda:1 is not timed on cuda:0's empty stream).
    In rehearsal: the wall clock."""
    device, real = _target(device)
    if not real:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - start) / number
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record(stream)
        for _ in range(number):
            fn()
        end.record(stream)
        end.synchronize()
    return begin.elapsed_time(end) / 1e3 / number  # elapsed_time is in ms
