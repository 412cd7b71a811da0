"""Timing done right, measured throughput and bandwidth, and the peak numbers MFU divides by.

Covers:
- :func:`time_fn`: warm-up, then repeats, each synchronized (CUDA events on a GPU), reporting the
  median. GPU work is asynchronous: without a synchronize you time the launch, not the work.
- measured matrix-product FLOP/s per dtype (:func:`measure_matmul`) and memory bandwidth
  (:func:`measure_copy_bandwidth`, :func:`measure_transfer_bandwidth`);
- a table of datasheet dense peaks for common NVIDIA GPUs, looked up by the detected GPU's name
  (:func:`lookup_gpu_peak`, :func:`peak_flops`), never one GPU hard-coded;
- the roofline model (:func:`attainable_flops`) and speedup = time before / time after;
- :func:`compare`, the one way a page times a comparison: interleaved rounds, the median and spread, and a
  verdict ("faster", "slower", "no difference we can see") chosen by whether the gap exceeds the spread;
- :func:`mfu`, model FLOPs per second over the peak (the FLOPs formula is ``model.transformer_flops``);
- monitoring and profiling: :func:`nvml_sample` (utilisation, memory, power), :func:`profile_steps`
  (``torch.profiler`` with a schedule, writing a Perfetto trace), :func:`profile_table`,
  :func:`time_by_category` (where a step's time goes, each kernel counted once) and
  :func:`sample_while_busy` (NVML and the allocator's counters after some work).

Leaves out: plots (``viz``), the training ladder (``python -m gpuformer_lib.ladder``). Imports nothing of
the library but ``gpu`` (no model: it measures whatever function it is given).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
import os
import re
import statistics
import time
from typing import Any, Callable, Iterator

import torch

from gpuformer_lib import gpu

# --------------------------------------------------------------------------- checks of arguments


def _check_count(name: str, value, least: int) -> None:
    """Sizes and repeat counts are ints: a float would give a float FLOP count or a wrong loop, silently."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")


def _check_positive(**values: float) -> None:
    """Times, rates and peaks are finite numbers > 0: a NaN or a negative one would pass through every formula."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


# --------------------------------------------------------------------------- timing


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait until the device has finished all queued work (a no-op on the CPU).

    ``device=None`` waits on CUDA if this process has used it.
    """
    kind = torch.device(device).type if device is not None else None
    if kind == "cuda" or (kind is None and torch.cuda.is_available() and torch.cuda.is_initialized()):
        torch.cuda.synchronize(device if kind == "cuda" else None)
    elif kind == "mps":
        torch.mps.synchronize()


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds per call over several repeats; report :attr:`median`."""

    times: tuple[float, ...]
    """Seconds per call, one entry per repeat."""
    warmup: int
    number: int
    """Calls per repeat; each entry of ``times`` is the repeat's time divided by this."""

    def __post_init__(self):
        if not self.times:
            raise ValueError("a Timing needs at least one measured time (times is empty)")

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def min(self) -> float:
        return min(self.times)

    @property
    def spread(self) -> float:
        """(max - min) / median: how noisy the measurement was."""
        return (max(self.times) - min(self.times)) / self.median if self.median > 0 else 0.0

    def __str__(self) -> str:
        return (f"{format_seconds(self.median)} median of {len(self.times)} "
                f"(min {format_seconds(self.min)}, spread {self.spread:.0%})")


def time_fn(
    fn: Callable[[], object],
    *,
    device: torch.device | str | None = None,
    warmup: int = 3,
    repeats: int = 10,
    number: int = 1,
    max_seconds: float | None = None,
) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls, then ``repeats`` timed repeats of ``number`` calls each.

    On a CUDA device each repeat is timed with CUDA events; elsewhere with ``time.perf_counter``
    after synchronizing. ``max_seconds`` stops repeating early (after at least 3 repeats) once that
    much time has been spent, so slow sizes do not blow a notebook's time budget.
    """
    if not callable(fn):
        raise TypeError(f"time_fn times a function called with no arguments, got {type(fn).__name__}: "
                        "wrap the work in a lambda, time_fn(lambda: model(x))")
    for name, value, least in (("warmup", warmup, 0), ("repeats", repeats, 1), ("number", number, 1)):
        _check_count(name, value, least)
    use_events = device is not None and torch.device(device).type == "cuda"
    for _ in range(warmup):
        fn()
    synchronize(device)
    times: list[float] = []
    started = time.perf_counter()
    for _ in range(repeats):
        if use_events:  # events on the stream of `device`, not of whichever GPU happens to be current
            times.append(gpu.event_seconds(fn, device, number))
        else:
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            synchronize(device)
            times.append((time.perf_counter() - t0) / number)
        if max_seconds is not None and len(times) >= 3 and time.perf_counter() - started > max_seconds:
            break
    return Timing(times=tuple(times), warmup=warmup, number=number)


def speedup(time_before: float, time_after: float) -> float:
    """How many times faster 'after' is: time before / time after (2.0 means twice as fast)."""
    if not all(isinstance(t, numbers.Real) and 0 < t < math.inf for t in (time_before, time_after)):
        raise ValueError(f"times must be positive (and finite), got before={time_before}, after={time_after}")
    return time_before / time_after


# --------------------------------------------------------------------------- comparing two ways of doing the work

VERDICTS = ("faster", "slower", "no difference we can see")
"""What :attr:`Comparison.verdict` can say of the candidate against the baseline."""


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Two (or more) ways of doing the same work, timed in interleaved rounds (:func:`compare`), one of them
    judged against the baseline. Round ``i`` timed every candidate once, close together in time, so a change
    in the machine's load between rounds meets them all alike; :attr:`ratios` are the rounds' speedups
    (baseline's time / candidate's time, each from the same round) and the verdict reads them, not one run.

    ``verdict`` is ``"faster"`` when at least three rounds in four found the candidate faster (the lower
    quartile of :attr:`ratios` above 1) and its median speedup clears ``min_gap``; ``"slower"`` the other way;
    otherwise ``"no difference we can see"``: the gap does not exceed the spread. A page's words about the
    comparison come from :attr:`verdict` and :meth:`phrase`, never from the author's expectation."""

    baseline: str
    candidate: str
    timings: dict[str, Timing]
    """Every timed function's :class:`Timing` (seconds per call, one entry per round), by name."""
    min_gap: float = 0.02

    @property
    def ratios(self) -> tuple[float, ...]:
        """Speedup of each round: the baseline's time / the candidate's time in that round."""
        return tuple(b / a for b, a in zip(self.timings[self.baseline].times, self.timings[self.candidate].times))

    @property
    def speedup(self) -> float:
        """Median time of the baseline / median time of the candidate (above 1: the candidate is faster)."""
        return speedup(self.timings[self.baseline].median, self.timings[self.candidate].median)

    @property
    def ratio_range(self) -> tuple[float, float]:
        """The middle half of the rounds' speedups: (lower quartile, upper quartile)."""
        ratios = sorted(self.ratios)
        if len(ratios) < 2:
            return ratios[0], ratios[0]
        low, _, high = statistics.quantiles(ratios, n=4, method="inclusive")
        return low, high

    @property
    def verdict(self) -> str:
        low, high = self.ratio_range
        if low > 1 and self.speedup > 1 + self.min_gap:
            return "faster"
        if high < 1 and self.speedup < 1 / (1 + self.min_gap):
            return "slower"
        return "no difference we can see"

    @property
    def factor(self) -> float:
        """How many times faster (or slower) the candidate is, whichever way: always >= 1."""
        return max(self.speedup, 1 / self.speedup)

    def phrase(self) -> str:
        """The verdict as a page says it: ``"1.32x faster than <baseline>"``, ``"1.25x slower than
        <baseline>"`` or ``"no faster or slower than <baseline> that we can see (1.03x, within the spread)"``."""
        if self.verdict == "no difference we can see":
            return (f"no faster or slower than {self.baseline} that we can see "
                    f"({self.speedup:.2f}x, within the spread of the rounds)")
        return f"{self.factor:.2f}x {self.verdict} than {self.baseline}"

    def __str__(self) -> str:
        low, high = self.ratio_range
        return (f"{self.candidate}: {self.phrase()} (median of {len(self.ratios)} interleaved rounds, "
                f"{format_seconds(self.timings[self.candidate].median)} against "
                f"{format_seconds(self.timings[self.baseline].median)}; middle half of the rounds' speedups "
                f"{_ratio_text(low)}-{_ratio_text(high)})")


def _ratio_text(ratio: float) -> str:
    """A speedup as a page prints it: two decimals, or three significant digits below 0.1 (a 500-fold slowdown
    is 0.00200x, not 0.00x)."""
    return f"{ratio:.2f}x" if ratio >= 0.1 else f"{ratio:#.3g}x"


def time_interleaved(fns: dict[str, Callable[[], object]], *, device: torch.device | str | None = None,
                     warmup: int = 2, repeats: int = 7, number: int = 1, max_repeats: int = 21,
                     wide: float = 0.25, max_seconds: float | None = None) -> dict[str, Timing]:
    """Time several functions of no arguments in interleaved rounds: ``warmup`` untimed calls of each, then
    rounds in which each is timed once (``number`` calls), the order reversed every other round so that no
    function always runs first. After ``repeats`` rounds (at least 5), more rounds are run, up to ``max_repeats``,
    while some function's spread (:attr:`Timing.spread`) is over ``wide``; ``max_seconds`` stops adding rounds
    (never below 5) once that much time has been spent. Synchronizes ``device`` around each timing."""
    if not isinstance(fns, dict) or len(fns) < 2 or not all(callable(fn) for fn in fns.values()):
        raise TypeError("time_interleaved times a dict of at least two functions of no arguments, by name")
    for name, value, least in (("warmup", warmup, 0), ("repeats", repeats, 5), ("number", number, 1),
                               ("max_repeats", max_repeats, repeats)):
        _check_count(name, value, least)
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    synchronize(device)
    times: dict[str, list[float]] = {name: [] for name in names}
    started = time.perf_counter()

    def spread_is_wide() -> bool:
        return any(Timing(tuple(t), warmup, number).spread > wide for t in times.values())

    rounds = 0
    while rounds < repeats or (rounds < max_repeats and spread_is_wide()):
        if max_seconds is not None and rounds >= 5 and time.perf_counter() - started > max_seconds:
            break
        for name in (names if rounds % 2 == 0 else names[::-1]):
            synchronize(device)
            t0 = time.perf_counter()
            for _ in range(number):
                fns[name]()
            synchronize(device)
            times[name].append((time.perf_counter() - t0) / number)
        rounds += 1
    return {name: Timing(times=tuple(t), warmup=warmup, number=number) for name, t in times.items()}


def compare(fns: dict[str, Callable[[], object]], *, baseline: str | None = None, min_gap: float = 0.02,
            **timing: Any) -> dict[str, Comparison]:
    """The one way the course times a comparison: :func:`time_interleaved` on ``fns`` (the baseline, by
    default the first, and one or more candidates), then a :class:`Comparison` of each candidate against the
    baseline, by name. ``timing`` goes to :func:`time_interleaved` (``device``, ``warmup``, ``repeats``, ...).

    >>> result = compare({"loop": slow, "vectorized": fast})["vectorized"]
    >>> result.verdict, result.phrase()   # doctest: +SKIP
    ('faster', '3.10x faster than loop')
    """
    baseline = next(iter(fns)) if baseline is None else baseline
    if baseline not in fns:
        raise ValueError(f"baseline {baseline!r} is not one of the timed functions {list(fns)}")
    if not (isinstance(min_gap, numbers.Real) and 0 <= min_gap < 1):
        raise ValueError(f"min_gap is a fraction in [0, 1), got {min_gap!r}")
    timings = time_interleaved(fns, **timing)
    return {name: Comparison(baseline, name, timings, float(min_gap)) for name in fns if name != baseline}


# --------------------------------------------------------------------------- measured throughput


def matmul_flops(m: int, n: int, k: int) -> int:
    """Floating-point operations of an (M, K) @ (K, N) product: M*N*K multiply-adds, 2 FLOPs each."""
    for name, value in (("m", m), ("n", n), ("k", k)):
        _check_count(name, value, 0)
    return 2 * int(m) * int(n) * int(k)  # Python ints: NumPy's int32 would wrap around


@contextlib.contextmanager
def _set_for_the_block(get: Callable[[], Any], set_: Callable[[Any], None], value: Any) -> Iterator[None]:
    """``set_(value)`` inside the block, and the value ``get()`` gave before restored after it."""
    before = get()
    set_(value)
    try:
        yield
    finally:
        set_(before)


def torch_threads(threads: int) -> contextlib.AbstractContextManager[None]:
    """PyTorch's intra-op CPU threads set to ``threads`` inside the block, restored after: two ways of running
    the same work (eager and ONNX Runtime, float32 and int8) are timed with the same number."""
    _check_count("threads", threads, 1)
    return _set_for_the_block(torch.get_num_threads, torch.set_num_threads, threads)


def float32_matmul_precision(precision: str) -> contextlib.AbstractContextManager[None]:
    """Temporarily set ``torch.set_float32_matmul_precision`` (``"highest"`` fp32, ``"high"`` TF32)."""
    return _set_for_the_block(torch.get_float32_matmul_precision, torch.set_float32_matmul_precision, precision)


@dataclasses.dataclass(frozen=True)
class MatmulResult:
    n: int
    dtype: str
    """``float32``, ``tf32`` (float32 inputs on TF32 tensor cores), ``float16``, ``bfloat16``, ..."""
    device: str
    timing: Timing

    @property
    def flops_per_s(self) -> float:
        return matmul_flops(self.n, self.n, self.n) / self.timing.median


def measure_matmul(
    n: int, dtype: torch.dtype, device: torch.device | str, *, tf32: bool = False,
    repeats: int = 10, max_seconds: float | None = 2.0,
) -> MatmulResult:
    """Measure FLOP/s of an (n, n) @ (n, n) product in ``dtype`` on ``device``.

    ``tf32=True`` with ``torch.float32`` lets a GPU of compute capability >= 8.0 use TF32 tensor
    cores (10-bit mantissa products, float32 range and accumulation).
    """
    _check_count("n", n, 1)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch.dtype such as torch.float16, got {dtype!r}")
    if tf32 and dtype != torch.float32:
        raise ValueError("tf32=True applies to float32 inputs only")
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    with float32_matmul_precision("high" if tf32 else "highest"):
        timing = time_fn(lambda: torch.matmul(a, b, out=out), device=device, warmup=2,
                         repeats=repeats, max_seconds=max_seconds)
    name = "tf32" if tf32 else str(dtype).removeprefix("torch.")
    return MatmulResult(n=n, dtype=name, device=str(device), timing=timing)


def measure_copy_bandwidth(nbytes: int, device: torch.device | str, *, repeats: int = 10) -> float:
    """Bytes per second of a device-to-device copy of ``nbytes``, counting bytes read plus written."""
    _check_count("nbytes", nbytes, 1)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    timing = time_fn(lambda: dst.copy_(src), device=device, warmup=3, repeats=repeats, max_seconds=2.0)
    return 2 * nbytes / timing.median


def measure_transfer_bandwidth(
    nbytes: int, device: torch.device | str, *, pinned: bool, repeats: int = 10
) -> float:
    """Bytes per second copied from host memory to a GPU (pinned or pageable host memory)."""
    if torch.device(device).type != "cuda":
        raise ValueError(f"host-to-device transfers need a CUDA device, not {device}")
    _check_count("nbytes", nbytes, 1)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned).random_()
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    timing = time_fn(lambda: dst.copy_(host, non_blocking=pinned), device=device, warmup=2,
                     repeats=repeats, max_seconds=2.0)
    return nbytes / timing.median


# --------------------------------------------------------------------------- datasheet peaks


@dataclasses.dataclass(frozen=True)
class GpuPeak:
    """Datasheet peak throughput of one GPU model, dense (no 2:4 sparsity), at boost clock.

    FLOP/s fields are in TFLOP/s; None where the GPU has no fast path for that format. For
    GeForce cards the fp16 and bf16 figures are with float32 accumulation, which PyTorch uses.
    """

    name: str
    fp32: float
    tf32: float | None
    fp16: float
    bf16: float | None
    memory_bandwidth_gbs: float
    """Memory bandwidth in GB/s (10**9 bytes per second)."""


# Order matters: the first pattern that matches the device name wins, so specific names go first.
_GPU_PEAKS: tuple[tuple[str, GpuPeak], ...] = (
    (r"H200 NVL", GpuPeak("H200 NVL", 60, 417.5, 835.5, 835.5, 4800)),
    (r"(?<!G)H200", GpuPeak("H200 SXM", 67, 494.7, 989.4, 989.4, 4800)),
    (r"H100 NVL", GpuPeak("H100 NVL", 60, 417.5, 835.5, 835.5, 3900)),
    (r"H100 PCIe", GpuPeak("H100 PCIe", 51, 378, 756, 756, 2000)),
    (r"(?<!G)H100", GpuPeak("H100 SXM", 67, 494.7, 989.4, 989.4, 3350)),
    (r"A100 80GB PCIe", GpuPeak("A100 80GB PCIe", 19.5, 156, 312, 312, 1935)),
    (r"A100-PCIE", GpuPeak("A100 40GB PCIe", 19.5, 156, 312, 312, 1555)),
    (r"A100.*80GB", GpuPeak("A100 SXM 80GB", 19.5, 156, 312, 312, 2039)),
    (r"A100", GpuPeak("A100 SXM 40GB", 19.5, 156, 312, 312, 1555)),
    (r"L40S", GpuPeak("L40S", 91.6, 183, 362, 362, 864)),
    (r"\bL4\b", GpuPeak("L4", 30.3, 60, 121, 121, 300)),
    (r"\bA10\b", GpuPeak("A10", 31.2, 62.5, 125, 125, 600)),
    (r"\bT4\b", GpuPeak("T4", 8.1, None, 65, None, 320)),
    (r"V100-PCIE", GpuPeak("V100 PCIe", 14, None, 112, None, 900)),
    (r"V100", GpuPeak("V100 SXM2", 15.7, None, 125, None, 900)),
    (r"P100", GpuPeak("P100 SXM2", 10.6, None, 21.2, None, 720)),
    (r"RTX A6000\s*$", GpuPeak("RTX A6000", 38.7, 77.4, 154.8, 154.8, 768)),
    (r"RTX 4090\s*$", GpuPeak("GeForce RTX 4090", 82.6, 82.6, 165.2, 165.2, 1008)),
    (r"RTX 4080\s*$", GpuPeak("GeForce RTX 4080", 48.7, 48.7, 97.5, 97.5, 716.8)),
    (r"RTX 3090\s*$", GpuPeak("GeForce RTX 3090", 35.6, 35.6, 71, 71, 936)),
    (r"RTX 3080\s*$", GpuPeak("GeForce RTX 3080", 29.8, 29.8, 59.5, 59.5, 760)),
)


def known_gpus() -> list[GpuPeak]:
    """Every GPU in the peak table."""
    return [peak for _, peak in _GPU_PEAKS]


def lookup_gpu_peak(gpu_name: str) -> GpuPeak | None:
    """The datasheet peaks for a GPU name as the driver reports it, or None if it is not in the table."""
    if not isinstance(gpu_name, str):
        raise TypeError(f"gpu_name must be the GPU's name as a string (torch.cuda.get_device_name()), "
                        f"got {gpu_name!r}")
    for pattern, peak in _GPU_PEAKS:
        if re.search(pattern, gpu_name, flags=re.IGNORECASE):
            return peak
    return None


def peak_flops(dtype: torch.dtype, device: torch.device | str | None = None, *, tf32: bool = False,
               gpu_name: str | None = None) -> float:
    """Dense datasheet peak in FLOP/s for ``dtype`` on the given CUDA device (or a named GPU).

    Raises ``ValueError`` with what to do when the GPU is not in the table, the device is not a
    CUDA GPU, or the GPU has no fast path for ``dtype``.
    """
    if gpu_name is None:
        if device is None or torch.device(device).type != "cuda":
            raise ValueError(
                f"Datasheet peaks exist for NVIDIA GPUs only, not for {device!r}. On a CPU, compare "
                "against a measured peak instead (measure_matmul)."
            )
        gpu_name = torch.cuda.get_device_name(device)
    peak = lookup_gpu_peak(gpu_name)
    if peak is None:
        names = ", ".join(p.name for p in known_gpus())
        raise ValueError(
            f"{gpu_name!r} is not in the course's peak table ({names}). Look up its dense "
            "(non-sparse) peak on the datasheet and pass it yourself, or use a measured peak."
        )
    if dtype == torch.float32:
        value = peak.tf32 if tf32 else peak.fp32
    elif dtype == torch.float16:
        value = peak.fp16
    elif dtype == torch.bfloat16:
        value = peak.bf16
    else:
        raise ValueError(f"The peak table covers float32 (and TF32), float16 and bfloat16, not {dtype}.")
    if value is None:
        fmt = "TF32" if dtype == torch.float32 else str(dtype).removeprefix("torch.")
        raise ValueError(f"The {peak.name} has no fast {fmt} path (it needs compute capability 8.0 or newer).")
    return value * 1e12


# --------------------------------------------------------------------------- the roofline


def attainable_flops(intensity: float, peak_flops: float, bandwidth: float) -> float:
    """The roofline: FLOP/s reachable at ``intensity`` FLOP/byte, min(peak, intensity * bandwidth)."""
    _check_positive(intensity=intensity, peak_flops=peak_flops, bandwidth=bandwidth)
    return min(peak_flops, intensity * bandwidth)


def ridge_intensity(peak_flops: float, bandwidth: float) -> float:
    """FLOP/byte where the roofline turns: below it an operation is memory-bound, above compute-bound."""
    _check_positive(peak_flops=peak_flops, bandwidth=bandwidth)
    return peak_flops / bandwidth


# --------------------------------------------------------------------------- formatting


def format_seconds(seconds: float) -> str:
    """``format_seconds(0.0123) -> '12.3 ms'``; a negative duration keeps its sign."""
    if seconds < 0:
        return "-" + format_seconds(-seconds)
    seconds = float(f"{seconds:.3g}")  # rounded first, so that 0.99999 ms reads "1 ms", not "1e+03 µs"
    for unit, scale in (("s", 1), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def format_rate(value: float, unit: str) -> str:
    """``format_rate(3.1e12, 'FLOP/s') -> '3.1 TFLOP/s'``."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


# --------------------------------------------------------------------------- impossible values


class ImpossibleValueError(ValueError):
    """A measured fraction of a ceiling above 100 %, or a negative rate: the ceiling or the measurement is
    wrong, and a page that printed it would teach something false."""


def check_fraction(what: str, value: float, *, ceiling: str = "the ceiling") -> float:
    """``value`` (a utilisation, an efficiency, a fraction of a roof) if it lies in [0, 1]; otherwise an
    :class:`ImpossibleValueError` that says what the number means and what to check."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value):
        raise ValueError(f"{what} must be a number, got {value!r}")
    if value < 0:
        raise ImpossibleValueError(f"{what} = {value:.3g} is negative: a time or a count went wrong (a clock "
                                   "read before the work finished, or a subtraction the wrong way round)")
    if value > 1:
        raise ImpossibleValueError(
            f"{what} = {100 * value:.0f} % of {ceiling}: nothing runs faster than its ceiling, so the ceiling is "
            "not one for this work (a datasheet peak of another format or unit, a bandwidth measured on a "
            "working set of another size, FLOPs or bytes miscounted) or the timing did not wait for the work")
    return float(value)


# --------------------------------------------------------------------------- MFU


def mfu(flops_per_step: float, seconds_per_step: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: the model's FLOPs per second over the hardware's dense peak (HFU: pass the
    hardware's FLOPs, recomputation included).

    Refuses (:class:`ImpossibleValueError`) a value above 1: a step cannot run faster than the peak of the
    device, so the peak it was divided by is not that device's peak (a measured peak measured too low, or a
    datasheet peak of a slower format)."""
    _check_positive(flops_per_step=flops_per_step, seconds_per_step=seconds_per_step, peak_flops=peak_flops)
    value = flops_per_step / seconds_per_step / peak_flops
    if value > 1:
        raise ImpossibleValueError(
            f"MFU = {100 * value:.0f} %: the step did {format_rate(flops_per_step / seconds_per_step, 'FLOP/s')}, "
            f"more than the peak of {format_rate(peak_flops, 'FLOP/s')} it is divided by, so that peak was measured "
            "too low (a median under load, or a size too small to reach the peak: use measured_peak_flops, the "
            "fastest of >= 10 repeats) or is the datasheet peak of a slower format than the step computes in")
    return check_fraction("MFU", value, ceiling="the peak FLOP/s")


_MEASURED_PEAKS: dict[tuple[str, torch.dtype], float] = {}


def measured_peak_flops(device: torch.device | str, dtype: torch.dtype = torch.float32, *,
                        sizes: tuple[int, ...] | None = None, repeats: int = 10, refresh: bool = False) -> float:
    """The fastest matrix-product rate this device reaches in ``dtype``: the best of ``repeats`` (>= 10) timed
    (n, n) @ (n, n) products at each of ``sizes`` (default 512 and 1024 on a CPU, 4096 on a GPU), i.e. the
    FLOPs over the *fastest* repeat, not the median: a peak is what the hardware can do, and a median taken
    while other work shares the machine would be a peak the same run's model could exceed.

    Measured once per process and device and dtype, then reused (``refresh=True`` measures again), so a
    chapter and the ladder it runs divide by the same peak."""
    device = torch.device(device)
    _check_count("repeats", repeats, 10)
    key = (str(device), dtype)
    if key in _MEASURED_PEAKS and not refresh:
        return _MEASURED_PEAKS[key]
    if sizes is None:
        sizes = (4096,) if device.type == "cuda" else (512, 1024)
    best = 0.0
    for n in sizes:
        result = measure_matmul(n, dtype, device, repeats=repeats, max_seconds=None)
        best = max(best, matmul_flops(n, n, n) / result.timing.min)
    _MEASURED_PEAKS[key] = best
    return best


# --------------------------------------------------------------------------- monitoring and profiling


def nvml_sample(device: torch.device | str | int | None = None) -> dict[str, float | None] | None:
    """GPU utilisation (%), memory in use (GiB), power (W) and temperature (C) from NVML, the driver's
    monitoring library; None where there is no NVIDIA GPU or no ``pynvml`` (``pip install nvidia-ml-py``).
    ``device``: a CUDA device or index (default: the current GPU).

    The GPU is found by its UUID: NVML numbers every GPU in the machine, CUDA only those that
    ``CUDA_VISIBLE_DEVICES`` lets through, so with ``CUDA_VISIBLE_DEVICES=3`` NVML's GPU 0 is another
    GPU than ``cuda:0``. Each field is read on its own: one the driver does not report here (power on some
    virtual GPUs, utilisation on a MIG slice) is None, and the others are still read.

    Utilisation is the share of the last sample period in which *any* kernel ran: 100 % does not mean
    the GPU's units were busy (MFU says that).
    """
    if not torch.cuda.is_available():
        return None
    try:
        import pynvml
    except ImportError:
        return None
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda")
    if device.type != "cuda":
        return None
    index = torch.cuda.current_device() if device.index is None else device.index
    uuid = str(torch.cuda.get_device_properties(index).uuid)
    uuid = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"  # NVML's spelling of the same UUID
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    except pynvml.NVMLError:
        pynvml.nvmlShutdown()
        return None

    def read(field: Callable[[], float]) -> float | None:
        try:
            return float(field())
        except pynvml.NVMLError:
            return None

    try:
        return {"utilization_pct": read(lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                "memory_used_gib": read(lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**30),
                "power_w": read(lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3),  # milliwatts
                "temperature_c": read(lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))}
    finally:
        pynvml.nvmlShutdown()


def sample_while_busy(step: Callable[[], object], device: torch.device | str, steps: int = 5) -> str:
    """Run ``step()`` ``steps`` times, then report what the GPU says about itself: NVML's sample (its
    utilisation then covers a busy period) and the caching allocator's allocated and reserved bytes.
    Lines to print; in a rehearsal the allocator's counters read 0 and NVML has no GPU to ask."""
    for _ in range(steps):
        step()
    synchronize(device)
    sample = nvml_sample(device)
    readings = ", ".join(f"{k} {v:.1f}" if v is not None else f"{k} not reported" for k, v in (sample or {}).items())
    lines = [readings or "NVML is not available here (no NVIDIA driver, or no nvidia-ml-py): no utilisation or "
                         "power to read"]
    lines.append(f"allocated by PyTorch: {gpu.memory_allocated(device) / 2**30:.2f} GiB, "
                 f"reserved by its cache: {gpu.memory_reserved(device) / 2**30:.2f} GiB")
    return "\n".join(lines)


def profile_steps(step: Callable[[], object], *, wait: int = 1, warmup: int = 1, active: int = 3,
                  trace_path: str | os.PathLike | None = None, device: torch.device | str | None = None,
                  record_shapes: bool = False, profile_memory: bool = False, with_stack: bool = False,
                  quiet: bool = True):
    """Run ``step()`` ``wait + warmup + active`` times under ``torch.profiler`` with a schedule and
    return the profiler, whose ``key_averages()`` covers the ``active`` steps.

    The first ``wait`` steps are not recorded, the ``warmup`` ones are recorded and thrown away (the
    profiler's own start-up cost lands there). With ``trace_path`` a Chrome/Perfetto trace of the
    active steps is written there (open it in https://ui.perfetto.dev), atomically. ``quiet`` hides
    the lines the profiler's native code prints when it starts and stops.
    """
    from torch.profiler import ProfilerActivity, profile, schedule

    if wait < 0 or warmup < 0 or active < 1:
        raise ValueError(f"need wait >= 0, warmup >= 0 and active >= 1; got {wait}, {warmup}, {active}")
    activities = [ProfilerActivity.CPU]
    if device is not None and torch.device(device).type == "cuda":
        activities.append(ProfilerActivity.CUDA)

    def write_trace(prof) -> None:
        if trace_path is None:
            return
        path = os.fspath(trace_path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}.json"
        prof.export_chrome_trace(tmp)
        os.replace(tmp, path)

    with _native_stderr_silenced(quiet), profile(
            activities=activities, schedule=schedule(wait=wait, warmup=warmup, active=active),
            on_trace_ready=write_trace, record_shapes=record_shapes, profile_memory=profile_memory,
            with_stack=with_stack) as prof:
        for _ in range(wait + warmup + active):
            with torch.profiler.record_function("train_step"):
                step()
            synchronize(device)
            prof.step()
    return prof


@contextlib.contextmanager
def _native_stderr_silenced(enabled: bool) -> Iterator[None]:
    """Send file descriptor 2 to /dev/null: the profiler's C++ side prints start and stop lines there
    that no setting turns off. Python's own ``sys.stderr`` in a notebook is not descriptor 2."""
    if not enabled:
        yield
        return
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def profile_table(prof, *, row_limit: int = 12, device: torch.device | str | None = None) -> str:
    """The profiler's operator table, sorted by the time each operator itself took on the device that
    matters (the GPU when there is one, else the CPU)."""
    on_gpu = device is not None and torch.device(device).type == "cuda"
    key = "self_cuda_time_total" if on_gpu else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=row_limit, max_name_column_width=48)


# Checked in order: the loss's log_softmax / nll_loss before attention's softmax, products before the rest.
_TIME_CATEGORIES = (
    ("loss (log-softmax, NLL)", ("log_softmax", "nll_loss", "cross_entropy")),
    ("attention", ("attention", "flash", "sdpa", "softmax")),
    ("matrix products", ("mm", "matmul", "linear", "gemm")),
    ("optimizer", ("adam", "foreach")),
)
OTHER_CATEGORY = "element-wise, norms, copies"


def operator_category(name: str) -> str:
    """The category of an operator by its name, e.g. ``aten::addmm`` -> 'matrix products'."""
    name = name.lower()
    return next((category for category, keys in _TIME_CATEGORIES if any(k in name for k in keys)), OTHER_CATEGORY)


# Kernel names on a GPU, checked in order: the loss's log-softmax before attention's softmax, fused attention
# (flash, cutlass FMHA, cuDNN SDPA) before the matrix products (cuBLAS gemm / nvjet, cutlass tensor-op gemm).
_KERNEL_CATEGORIES = (
    ("loss (log-softmax, NLL)", ("logsoftmax", "log_softmax", "nll_loss", "cross_entropy")),
    ("attention", ("flash", "fmha", "attention", "sdpa", "softmax")),
    ("matrix products", ("gemm", "nvjet", "cutlass", "cublas", "xmma", "splitkreduce", "triton_tem")),
    ("optimizer", ("adam", "multi_tensor_apply", "foreach")),
    ("copies", ("memcpy", "memset")),
)


def kernel_category(name: str) -> str:
    """The category of a GPU kernel by its name, e.g. ``nvjet_hsh_256x128_...`` (cuBLAS on Hopper) -> 'matrix
    products', ``fmha_cutlassF_f16_...`` -> 'attention', ``cunn_SoftMaxForward<..., LogSoftMaxForwardEpilogue>``
    (the loss) -> 'loss (log-softmax, NLL)'."""
    name = name.lower()
    return next((category for category, keys in _KERNEL_CATEGORIES if any(k in name for k in keys)), OTHER_CATEGORY)


def _is_device_kernel(event) -> bool:
    from torch.autograd import DeviceType

    return (getattr(event, "device_type", None) == DeviceType.CUDA and not getattr(event, "is_user_annotation", False)
            and not event.key.startswith("ProfilerStep"))


def _inside_optimizer_step(event) -> bool:
    """Whether a raw profiler event lies inside an ``Optimizer.step#...`` range (False for ``key_averages()``
    entries, which keep no parent)."""
    parent = getattr(event, "cpu_parent", None)
    while parent is not None:
        if getattr(parent, "name", "").startswith("Optimizer.step#"):
            return True
        parent = getattr(parent, "cpu_parent", None)
    return False


def time_by_category(events, device: torch.device | str | None = None) -> dict[str, float]:
    """Microseconds per category of a profile's ``key_averages()``, each unit of time counted once.

    On a GPU (``device`` a CUDA device) only the device's own events count: the kernels and copies
    (``device_type == DeviceType.CUDA``, as PyTorch's own table sums them), each by its device time, classified by
    kernel name (:func:`kernel_category`). The CPU operators that launched them are left out: under Kineto an
    ``aten::mm`` reports its kernels' time as its own self device time, so summing operators and kernels counts
    every kernel twice; and kernels launched outside an ``aten::`` operator (``torch.compile``'s Triton kernels)
    are still counted. GPU-side user annotations (``record_function`` ranges such as ``train_step``, shown on
    the stream row) are ranges, not kernels, and are left out.

    On a CPU: ``aten::`` operators by their *self* CPU time (the time in the operator itself, not in the
    operators it called), classified by :func:`operator_category`; ranges are left out. Given a profile's raw
    events (``prof.events()``, which keep their parents) instead of ``key_averages()``, an operator called inside
    the optimizer's ``Optimizer.step#...`` range counts as "optimizer" whatever its name: a for-loop AdamW's
    ``aten::mul_``/``lerp_``/``addcdiv_`` would otherwise fall among the element-wise operators.
    """
    on_gpu = device is not None and torch.device(device).type == "cuda"
    shares: dict[str, float] = {}
    for e in events:
        if on_gpu:
            if not _is_device_kernel(e) or getattr(e, "self_device_time_total", 0) <= 0:
                continue
            category, value = kernel_category(e.key), e.self_device_time_total
        else:
            if not e.key.startswith("aten::") or getattr(e, "self_cpu_time_total", 0) <= 0:
                continue
            category, value = operator_category(e.key), e.self_cpu_time_total
            if _inside_optimizer_step(e):
                category = "optimizer"
        shares[category] = shares.get(category, 0.0) + value
    return shares
