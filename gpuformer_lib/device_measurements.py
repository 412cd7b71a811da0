"""Measurements whose set-up depends on the device profile, so that a notebook's GPU branch is one call.

Covers: which matrix-product formats are worth timing on a profile, and which of them are emulated
(slow) on the device that computes (:func:`matmul_formats`, :func:`is_emulated`); host-to-GPU copy
bandwidth from pageable and pinned memory (:func:`host_to_device_bandwidth`); the milliseconds of a
Triton kernel (:func:`kernel_milliseconds`), with its bandwidth and roofline point (:func:`kernel_rate`),
over several configurations (:func:`time_configs`); the modes of a mixed-precision comparison
(:func:`precision_modes`) and the precision a training run uses (:func:`training_precision_on`); the
cost of reading a GPU value back every training step (:func:`readback_cost`).

Each is a function of a :class:`~gpuformer_lib.profiles.DeviceProfile` or of the device, so that CI runs
it under every rehearsed profile (``GPUFORMER_REHEARSE``): there the computation stays on the CPU at toy
sizes, and where a GPU-only call has no CPU equivalent a stand-in runs instead (a host-to-host copy for
a host-to-GPU one, the wall clock for CUDA events). The numbers a rehearsal prints are a CPU's.

Leaves out: the timing loop (``bench.time_fn``), the profile and the choices every chapter shares
(``profiles``), memory caps (``memory``).
"""

from __future__ import annotations

import dataclasses
import numbers
import time
from typing import Callable, Sequence

import torch

from gpuformer_lib import bench
from gpuformer_lib.device import _cpu_has_native_bf16
from gpuformer_lib.profiles import DeviceProfile, rehearsing_gpu, training_precision

EMULATED_MAX_SIZE = 256
"""Largest n of an n x n x n product timed in an emulated format (it runs at a few GFLOP/s)."""


def _check_dtype(dtype) -> None:
    if not isinstance(dtype, torch.dtype):  # a string such as "float16" would be no 16-bit format: silently False
        raise TypeError(f"dtype must be a torch.dtype such as torch.float16, got {dtype!r}")


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_emulated(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether ``dtype`` arithmetic is emulated (slow) on ``device``: 16-bit formats on a CPU. float16
    always (its CPU matrix products run at a few GFLOP/s: chapter 1 measures it), bfloat16 unless the
    CPU has native bf16 instructions (AVX512-BF16 or AMX). GPUs and float32/float64 never count."""
    _check_dtype(dtype)
    if torch.device(device).type != "cpu" or dtype not in (torch.float16, torch.bfloat16):
        return False
    return dtype == torch.float16 or not _cpu_has_native_bf16()


@dataclasses.dataclass(frozen=True)
class MatmulFormat:
    """One number format to time matrix products in."""

    label: str
    """``float64``, ``float32``, ``tf32`` (float32 inputs on TF32 tensor cores), ``float16``, ``bfloat16``."""
    dtype: torch.dtype
    tf32: bool = False
    """Let float32 products use TF32 tensor cores (``bench.measure_matmul(tf32=True)``)."""
    emulated: bool = False
    """Emulated on the computing device (:func:`is_emulated`): time small sizes only."""

    def __post_init__(self):
        _check_dtype(self.dtype)
        if self.tf32 and self.dtype != torch.float32:
            raise ValueError(f"tf32=True applies to float32 inputs only, not {self.dtype}")

    def sizes(self, sizes: Sequence[int]) -> list[int]:
        """The sizes worth timing in this format: all of them, or those up to
        :data:`EMULATED_MAX_SIZE` when it is emulated."""
        return [s for s in sizes if s <= EMULATED_MAX_SIZE] if self.emulated else list(sizes)


def matmul_formats(profile: DeviceProfile, device: torch.device | str) -> list[MatmulFormat]:
    """The formats a GPU (or CPU) of ``profile`` multiplies matrices in, fastest path each: on a GPU
    float32, TF32 where it has TF32 tensor cores (sm_80+), float16, and bfloat16 only where it is native
    (not on a T4, where PyTorch would emulate it). On Apple MPS float32 and float16 (no float64). On a CPU
    all four IEEE-style formats. ``device`` is where the products run (the CPU under rehearsal): it only
    decides which formats are emulated there."""
    if profile.on_gpu:
        chosen = [("float32", torch.float32, False)]
        if profile.tf32:
            chosen.append(("tf32", torch.float32, True))
        if profile.fp16_tensor_cores:
            chosen.append(("float16", torch.float16, False))
        if profile.bf16:
            chosen.append(("bfloat16", torch.bfloat16, False))
    elif profile.kind == "mps":
        chosen = [("float32", torch.float32, False), ("float16", torch.float16, False)]
    else:
        chosen = [(str(dt).removeprefix("torch."), dt, False)
                  for dt in (torch.float64, torch.float32, torch.bfloat16, torch.float16)]
    return [MatmulFormat(label, dtype, tf32, is_emulated(dtype, device)) for label, dtype, tf32 in chosen]


def host_to_device_bandwidth(nbytes: int, device: torch.device | str, *, pinned: bool, repeats: int = 10) -> float:
    """Bytes per second copied from host memory to the GPU ``device``, from pinned or pageable memory
    (``bench.measure_transfer_bandwidth``). Rehearsing a GPU profile on the CPU, the stand-in copies
    host to host (pageable either way: without a GPU there is no pinned allocator), timed the same way,
    so the calling code runs; the number is the CPU's memory bandwidth, not a PCIe link's."""
    if not _is_int(nbytes) or nbytes < 1:
        raise ValueError(f"nbytes must be an int >= 1, got {nbytes!r}")
    device = torch.device(device)
    if device.type == "cuda":
        return bench.measure_transfer_bandwidth(nbytes, device, pinned=pinned, repeats=repeats)
    if not (device.type == "cpu" and rehearsing_gpu()):
        raise ValueError(f"host-to-device copies need a CUDA device, not {device} (or a rehearsed GPU profile, "
                         "GPUFORMER_REHEARSE=t4). Guard the call with `if profile.on_gpu:`.")
    host = torch.empty(nbytes, dtype=torch.uint8).random_()
    target = torch.empty_like(host)
    timing = bench.time_fn(lambda: target.copy_(host), device=device, warmup=2, repeats=repeats, max_seconds=2.0)
    return nbytes / timing.median


def kernel_milliseconds(fn: Callable[[], object], device: torch.device | str) -> float:
    """Milliseconds per call of a (Triton) kernel: ``triton.testing.do_bench`` on a GPU, which also
    flushes the L2 cache between calls; elsewhere (the Triton interpreter, under rehearsal) the median
    of ``bench.time_fn``, a few repeats: the interpreter's speed, not a GPU's."""
    if torch.device(device).type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn))
    return bench.time_fn(fn, device=device, warmup=1, repeats=3, max_seconds=2.0).median * 1e3


@dataclasses.dataclass(frozen=True)
class KernelRate:
    """A kernel's time per call, with the bytes it must move and the FLOPs it does per call: what its
    bandwidth and its point on the roofline are computed from."""

    name: str
    milliseconds: float
    nbytes: int
    """Bytes a call reads plus writes at the least (each input read once, each output written once)."""
    flops: int = 0

    def __post_init__(self):
        if (not self.milliseconds > 0 or not _is_int(self.nbytes) or self.nbytes < 1 or not _is_int(self.flops)
                or self.flops < 0):
            raise ValueError(f"{self.name}: need milliseconds > 0, int nbytes >= 1 and int flops >= 0; got "
                             f"{self.milliseconds}, {self.nbytes}, {self.flops}")

    @property
    def bytes_per_s(self) -> float:
        return self.nbytes / (self.milliseconds / 1e3)

    @property
    def flops_per_s(self) -> float:
        return self.flops / (self.milliseconds / 1e3)

    def roofline_point(self) -> tuple[str, float, float]:
        """(name, FLOP/byte, achieved FLOP/s), as ``viz.plot_roofline`` takes its points."""
        return self.name, self.flops / self.nbytes, self.flops_per_s


def kernel_rate(name: str, fn: Callable[[], object], device: torch.device | str, *, nbytes: int,
                flops: int = 0) -> KernelRate:
    """Time ``fn`` with :func:`kernel_milliseconds` and keep what it moves and computes per call."""
    return KernelRate(name, kernel_milliseconds(fn, device), nbytes, flops)


@dataclasses.dataclass(frozen=True)
class ConfigTimings:
    """Milliseconds per call for each configuration of a kernel; None where it did not run."""

    milliseconds: dict[tuple, float | None]

    @property
    def best(self) -> tuple:
        """The fastest configuration that ran."""
        ran = {config: ms for config, ms in self.milliseconds.items() if ms is not None}
        if not ran:
            raise ValueError("no configuration ran: " + ", ".join(map(str, self.milliseconds)))
        return min(ran, key=ran.get)

    @property
    def best_milliseconds(self) -> float:
        return self.milliseconds[self.best]


def time_configs(run: Callable[[tuple], object], configs: Sequence[tuple],
                 device: torch.device | str) -> ConfigTimings:
    """Time ``run(config)`` for each configuration with :func:`kernel_milliseconds`. A configuration that
    fails to compile or launch (say, tiles that need more shared memory than the GPU has: a T4 has 64 KiB
    per SM, an H100 228 KiB) is recorded as None instead of stopping the sweep."""
    if not configs:
        raise ValueError("give at least one configuration")
    timings: dict[tuple, float | None] = {}
    for config in configs:
        try:
            timings[tuple(config)] = kernel_milliseconds(lambda: run(config), device)
        except Exception:  # noqa: BLE001 - Triton raises several types for a kernel that cannot run here
            timings[tuple(config)] = None
    return ConfigTimings(timings)


def precision_modes(profile: DeviceProfile) -> list[str]:
    """The training precisions worth comparing on ``profile``, float32 first (the baseline): on a GPU
    ``tf32`` only with TF32 tensor cores (on a T4 it would be float32 again), ``bf16`` only where it is
    native (a T4 would emulate it) and ``fp16``; on a CPU or MPS float32, bf16 and fp16 (to show that
    emulated 16-bit arithmetic is slower there)."""
    if not profile.on_gpu:
        return ["fp32", "bf16", "fp16"]
    modes = ["fp32"] + (["tf32"] if profile.tf32 else []) + (["bf16"] if profile.bf16 else [])
    return modes + (["fp16"] if profile.fp16_tensor_cores else [])


def training_precision_on(profile: DeviceProfile, device: torch.device | str) -> str:
    """``TrainConfig.precision`` for a run of ``profile`` on ``device``: ``profiles.training_precision``
    (bf16 or fp16 on a GPU, fp32 on a CPU), except ``fp32`` where that 16-bit format is emulated on
    ``device``. That happens only when a GPU profile is rehearsed on a CPU: the choice is made the GPU's
    way, and the rehearsal's arithmetic stays as fast as a CPU run's."""
    precision = training_precision(profile)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return "fp32" if dtype is not None and is_emulated(dtype, device) else precision


@dataclasses.dataclass(frozen=True)
class ReadbackCost:
    """Seconds per training step with the loss read back to the host every step, and read at the end."""

    every_step: float
    at_the_end: float

    @property
    def speedup(self) -> float:
        return bench.speedup(self.every_step, self.at_the_end)

    def __str__(self) -> str:
        return (f".item() every step: {self.every_step * 1e3:.2f} ms/step; read back at the end: "
                f"{self.at_the_end * 1e3:.2f} ms/step; speedup {self.speedup:.2f}x")


def readback_cost(step: Callable[[], torch.Tensor], device: torch.device | str, steps: int = 50,
                  warmup: int = 5) -> ReadbackCost:
    """Time ``steps`` calls of ``step()`` (one training step returning its loss tensor) twice: reading
    each loss with ``.item()`` at once, which makes the host wait for the GPU every step, and keeping
    the tensors and reading them all at the end, which lets the host queue the next step while the GPU
    works. On a CPU both are the same (every operation is synchronous): under rehearsal it shows the
    code runs, not the effect."""
    if not (_is_int(steps) and _is_int(warmup)) or steps < 1 or warmup < 0:
        raise ValueError(f"need ints steps >= 1 and warmup >= 0, got {steps!r}, {warmup!r}")

    def run(read_every_step: bool, n: int) -> float:
        losses = []
        bench.synchronize(device)
        start = time.perf_counter()
        for _ in range(n):
            loss = step()
            if not torch.is_tensor(loss):
                raise TypeError(f"step() must return the loss tensor (not read back), got {type(loss).__name__}: "
                                "return loss, not loss.item()")
            losses.append(loss.item() if read_every_step else loss.detach())
        [float(x) for x in losses]  # the deferred reads: one wait at the end
        bench.synchronize(device)
        return (time.perf_counter() - start) / n

    if warmup:
        run(False, warmup)
    return ReadbackCost(every_step=run(True, steps), at_the_end=run(False, steps))
