"""Measured rooflines with honest ceilings: several compute roofs, memory roofs with their spread, and launch overhead.

The roofline model (Williams, Waterman and Patterson 2009, "Roofline: an insightful visual performance model
for multicore architectures", CACM 52(4)) bounds the rate of a kernel of arithmetic intensity I (FLOP per
byte moved) by ``min(peak FLOP/s, I x bandwidth)``. This module measures the ceilings on the device that runs
a page, in a form that a noisy, shared machine cannot turn into an impossible "120 % of the roof":

- **memory roofs** from a copy-bandwidth curve over sizes (:func:`copy_bandwidth_curve`), each size with the
  spread of its repeats: the *hard* memory ceiling is the best copy rate seen at any size (a working set that
  fits in a cache is the fastest memory there is); the *main-memory* bandwidth is the largest copy's median;
- **compute roofs**, two of them (:class:`Ceilings`): the matrix units (tensor cores on a GPU, the best
  matrix product measured in the format) for matrix products, and the vector units (CUDA cores, or a CPU's
  SIMD FMA units: the best float32 product without TF32) for element-wise and row-wise kernels;
- a **third limit**, launch overhead (:func:`launch_overhead`): no kernel takes less than the time to issue
  it, so a small operation sits below both roofs for a reason the roofline does not draw
  (:func:`predicted_seconds` takes the largest of the three times);
- :func:`transformer_layer_operations`: the FLOPs and bytes of six operations of one Transformer layer, the
  same counts for a measurement here and a prediction for a T4 or an H100;
- :func:`fraction_of_roof`: an operation's achieved FLOP/s over its own roof, through
  ``bench.check_fraction`` (over 100 % fails, and says what to check);
- a GPU's **datasheet roofs** (:func:`datasheet_ceiling`, :func:`datasheet_bandwidth`, :func:`datasheet_seconds`,
  :func:`datasheet_matmul`): the bound a page shows *beside* a prediction, never as one. No step reaches them:
  the course's predictor (``gpuformer_lib.predict``) uses achievable rates, memory traffic and a launch floor.

Leaves out: the timing loop (``bench.time_fn``), datasheet peaks (``bench.known_gpus``), the
SFU rate that bounds ``exp``/``erf`` on a GPU, cache-line and write-allocate traffic (a copy on x86 may move
3 bytes per byte copied; both the copy and the operations are counted the same simple way), and tile or wave
quantisation of matrix products.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import warnings
from typing import Sequence

import torch

from gpuformer_lib import bench
from gpuformer_lib.gpu_view import datasheet


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _count(name: str, value, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    return int(value)


# --------------------------------------------------------------------------- memory roofs


@dataclasses.dataclass(frozen=True)
class CopyPoint:
    """One size of a copy-bandwidth curve: bytes copied and the timing of its repeats."""

    nbytes: int
    timing: bench.Timing

    @property
    def bandwidth(self) -> float:
        """Bytes per second (read + written) at the median time."""
        return 2 * self.nbytes / self.timing.median

    @property
    def best(self) -> float:
        """Bytes per second at the fastest repeat: what the memory can do when nothing else is running."""
        return 2 * self.nbytes / self.timing.min

    @property
    def worst(self) -> float:
        """Bytes per second at the slowest repeat."""
        return 2 * self.nbytes / max(self.timing.times)


def copy_bandwidth_curve(sizes: Sequence[int], device: torch.device | str, *, repeats: int = 10,
                         max_seconds: float = 1.0) -> list[CopyPoint]:
    """Time ``dst.copy_(src)`` for each byte count in ``sizes`` (``repeats`` repeats after warm-up)."""
    if not sizes:
        raise ValueError("give at least one size to copy")
    points = []
    for nbytes in sizes:
        _count("nbytes", nbytes)
        src = torch.empty(int(nbytes), dtype=torch.uint8, device=device).random_()
        dst = torch.empty_like(src)
        timing = bench.time_fn(lambda: dst.copy_(src), device=device, warmup=3, repeats=repeats,
                               max_seconds=max_seconds)
        points.append(CopyPoint(int(nbytes), timing))
        del src, dst
    return points


def memory_ceiling(curve: Sequence[CopyPoint]) -> float:
    """The hard memory roof: the best copy rate at any size (caches included). Nothing that moves bytes
    through this device's memory hierarchy beats it, whatever its working set."""
    if not curve:
        raise ValueError("the copy-bandwidth curve is empty")
    return max(p.best for p in curve)


def main_memory_bandwidth(curve: Sequence[CopyPoint]) -> float:
    """The largest copy's median rate: main memory (DRAM or HBM) when that copy is larger than every cache."""
    if not curve:
        raise ValueError("the copy-bandwidth curve is empty")
    return max(curve, key=lambda p: p.nbytes).bandwidth


# --------------------------------------------------------------------------- launch overhead


def launch_overhead(device: torch.device | str, *, calls: int = 200) -> float:
    """Seconds per call of the smallest operation there is (adding a one-element tensor to another, in
    place), issued back to back: the floor under every kernel's time on ``device`` (on a GPU, the launch; on
    a CPU, the dispatcher and Python). Both operands are tensors, as in a model's own operations: a Python
    number as the second operand would first be wrapped into a tensor, a cost of its own that a model's
    kernels do not pay. The fastest of the repeats, the statistic the chapter's other small timings use:
    noise only adds time, and a floor taken as a median can sit above the operations it bounds."""
    _count("calls", calls)
    x, one = torch.zeros(1, device=device), torch.ones(1, device=device)
    timing = bench.time_fn(lambda: x.add_(one), device=device, warmup=10, repeats=7, number=calls)
    return timing.min


# --------------------------------------------------------------------------- ceilings and the three limits


@dataclasses.dataclass(frozen=True)
class Ceilings:
    """The roofs of one device: two compute roofs, the hard memory roof and main memory, launch overhead."""

    matrix_flops: float
    """FLOP/s of the matrix units (tensor cores; a CPU's best matrix product in the format) for matmuls."""
    vector_flops: float
    """FLOP/s of the vector units (CUDA cores, a CPU's SIMD FMAs) for element-wise and row-wise kernels."""
    memory_bandwidth: float
    """Bytes/s: the hard memory roof (:func:`memory_ceiling`)."""
    main_memory_bandwidth: float
    """Bytes/s of main memory (:func:`main_memory_bandwidth`), at most ``memory_bandwidth``."""
    launch_seconds: float = 0.0
    """The floor under any kernel's time (:func:`launch_overhead`)."""

    def __post_init__(self):
        for name in ("matrix_flops", "vector_flops", "memory_bandwidth", "main_memory_bandwidth"):
            _positive(name, getattr(self, name))
        if isinstance(self.launch_seconds, bool) or not 0 <= self.launch_seconds < math.inf:
            raise ValueError(f"launch_seconds must be a finite number >= 0, got {self.launch_seconds!r}")
        if self.main_memory_bandwidth > self.memory_bandwidth:
            raise ValueError(f"main memory ({self.main_memory_bandwidth:.3g} B/s) cannot beat the hard memory roof "
                             f"({self.memory_bandwidth:.3g} B/s): the hard roof is the best rate at any size")

    def compute(self, matrix: bool) -> float:
        """The compute roof of a matrix product (``matrix=True``) or of an element-wise kernel."""
        return self.matrix_flops if matrix else self.vector_flops

    def attainable(self, intensity: float, *, matrix: bool) -> float:
        """min(compute roof, intensity x hard memory roof), in FLOP/s."""
        return bench.attainable_flops(intensity, self.compute(matrix), self.memory_bandwidth)

    def ridge(self, *, matrix: bool) -> float:
        """FLOP/byte where the roof for matrix products (or element-wise kernels) turns."""
        return bench.ridge_intensity(self.compute(matrix), self.memory_bandwidth)


def predicted_seconds(flops: float, nbytes: float, peak_flops: float, bandwidth: float,
                      launch_seconds: float = 0.0) -> float:
    """The three-limit model of one kernel: max(FLOPs / peak, bytes / bandwidth, launch overhead)."""
    for name, value in (("flops", flops), ("nbytes", nbytes), ("launch_seconds", launch_seconds)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < math.inf:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    _positive("peak_flops", peak_flops)
    _positive("bandwidth", bandwidth)
    return max(flops / peak_flops, nbytes / bandwidth, launch_seconds)


def limiting_factor(flops: float, nbytes: float, peak_flops: float, bandwidth: float,
                    launch_seconds: float = 0.0) -> str:
    """Which of the three limits sets :func:`predicted_seconds`: ``'compute'``, ``'memory'`` or ``'launch'``."""
    times = {"compute": flops / _positive("peak_flops", peak_flops),
             "memory": nbytes / _positive("bandwidth", bandwidth), "launch": launch_seconds}
    predicted_seconds(flops, nbytes, peak_flops, bandwidth, launch_seconds)  # the same input checks
    return max(times, key=times.get)


def fraction_of_roof(name: str, achieved_flops: float, intensity: float, ceilings: Ceilings, *,
                     matrix: bool) -> float:
    """``achieved / roof`` for an operation, its roof chosen by kind (matrix units or vector units); an
    ``ImpossibleValueError`` when it is over 100 %."""
    roof = ceilings.attainable(intensity, matrix=matrix)
    unit = "matrix-unit" if matrix else "vector-unit"
    return bench.check_fraction(f"{name}'s FLOP/s", achieved_flops / roof,
                                ceiling=f"its roof (min({unit} peak, intensity x best copy bandwidth))")


# --------------------------------------------------------------------------- a GPU's datasheet roofs


def datasheet_ceiling(gpu: str, dtype: torch.dtype, *, tensor_cores: bool) -> float:
    """The compute roof in FLOP/s for work in ``dtype`` on ``gpu``.

    ``tensor_cores=True`` is for matrix products: the tensor-core peak of fp16/bf16 (TF32 for float32 on
    GPUs that have it, else the float32 rate). ``tensor_cores=False`` is for element-wise and row-wise
    kernels (softmax, layer norm, GELU, an add), which never run on tensor cores: their roof is the
    CUDA-core float32 rate, whatever the storage format (the arithmetic is done in float32). The two roofs
    differ 8-16x, so judging a softmax against the tensor-core peak misplaces it.
    """
    peak = datasheet(gpu)
    if not isinstance(dtype, torch.dtype) or dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"dtype must be torch.float32, torch.float16 or torch.bfloat16, got {dtype!r}")
    if not tensor_cores:
        return peak.fp32 * 1e12
    if dtype == torch.float32:
        return (peak.tf32 if peak.tf32 is not None else peak.fp32) * 1e12
    value = peak.fp16 if dtype == torch.float16 else peak.bf16
    if value is None:
        raise ValueError(f"the {peak.name} has no bfloat16 tensor cores (it needs compute capability 8.0 or "
                         "newer): predict for float16 instead")
    return value * 1e12


def datasheet_bandwidth(gpu: str) -> float:
    """Datasheet memory bandwidth of ``gpu`` in bytes per second."""
    return datasheet(gpu).memory_bandwidth_gbs * 1e9


def datasheet_seconds(flops: float, nbytes: float, gpu: str, dtype: torch.dtype, *, tensor_cores: bool) -> float:
    """Predicted time of one kernel: max(FLOPs / compute roof, bytes / bandwidth). A lower bound: a real
    kernel adds launch overhead (microseconds) and reaches only a fraction of either roof (chapter 1 measures how much)."""
    for name, value in (("flops", flops), ("nbytes", nbytes)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < math.inf:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if flops == 0 and nbytes == 0:
        raise ValueError("a kernel with no FLOPs and no bytes has no time to predict")
    return max(flops / datasheet_ceiling(gpu, dtype, tensor_cores=tensor_cores), nbytes / datasheet_bandwidth(gpu))


@dataclasses.dataclass(frozen=True)
class DatasheetMatmul:
    """Roofline prediction for one (m, k) x (k, n) product, each operand read once and the result written once."""

    gpu: str
    flops: int
    nbytes: int
    compute_seconds: float
    memory_seconds: float

    @property
    def seconds(self) -> float:
        return max(self.compute_seconds, self.memory_seconds)

    @property
    def flops_per_second(self) -> float:
        return self.flops / self.seconds

    @property
    def bound(self) -> str:
        """``'compute'`` or ``'memory'``: which roof the prediction sits under."""
        return "compute" if self.compute_seconds >= self.memory_seconds else "memory"


def datasheet_matmul(m: int, n: int, k: int, dtype: torch.dtype, gpu: str) -> DatasheetMatmul:
    """Roofline time of an m x k by k x n product in ``dtype`` on ``gpu`` (tensor cores)."""
    flops = bench.matmul_flops(m, n, k)
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = (m * k + k * n + m * n) * itemsize
    return DatasheetMatmul(datasheet(gpu).name, flops, nbytes, flops / datasheet_ceiling(gpu, dtype, tensor_cores=True),
                            nbytes / datasheet_bandwidth(gpu))


# --------------------------------------------------------------------------- a Transformer layer's operations


@dataclasses.dataclass(frozen=True)
class Operation:
    """FLOPs and bytes of one operation, and which compute roof it sits under."""

    name: str
    flops: int
    nbytes: int
    matrix: bool
    """True for matrix products (tensor cores), False for element-wise and row-wise kernels (CUDA cores)."""

    @property
    def intensity(self) -> float:
        return self.flops / self.nbytes


def transformer_layer_operations(tokens: int, width: int, heads: int, seq: int, itemsize: int) -> list[Operation]:
    """Six operations of one Transformer layer at these sizes, each input read once and each output
    written once: the MLP's up-projection (tokens, C) x (C, 4C); the attention scores QK^T per sequence and
    head; softmax over the (T, T) scores (5 FLOPs per element: max, subtract, exp, sum, divide); layer
    norm (8 per element); GELU (8 per element, a convention: erf costs more); and the residual add."""
    for name, value in (("tokens", tokens), ("width", width), ("heads", heads), ("seq", seq),
                        ("itemsize", itemsize)):
        _count(name, value)
    if tokens % seq or width % heads:
        raise ValueError(f"tokens ({tokens}) must be a multiple of seq ({seq}) and width ({width}) of heads ({heads})")
    bh, hs = tokens // seq * heads, width // heads  # sequences x heads, head size
    b = itemsize
    return [
        Operation("MLP matmul", 2 * tokens * width * 4 * width,
                  (tokens * width + width * 4 * width + tokens * 4 * width) * b, True),
        Operation("attention QK^T", 2 * bh * seq * seq * hs, (2 * bh * seq * hs + bh * seq * seq) * b, True),
        Operation("softmax", 5 * bh * seq * seq, 2 * bh * seq * seq * b, False),
        Operation("layer norm", 8 * tokens * width, 2 * tokens * width * b, False),
        Operation("GELU", 8 * tokens * 4 * width, 2 * tokens * 4 * width * b, False),
        Operation("residual add", tokens * width, 3 * tokens * width * b, False),
    ]


# --------------------------------------------------------------------------- a CPU's 16-bit code paths


def cpu_matmul_path_timings(n: int = 256, *, repeats: int = 5, max_seconds: float = 3.0) -> dict[str, bench.Timing]:
    """Seconds of an n x n x n product on the CPU in float32, bfloat16 and float16, each 16-bit format twice:
    through oneDNN (PyTorch's CPU BLAS for 16-bit formats, which uses native bf16/fp16 instructions where the
    CPU has them) and with oneDNN switched off (PyTorch's portable fallback GEMM). The five paths are timed
    in interleaved rounds (:func:`bench.time_interleaved`), so a page can compare any two of them with a
    :class:`bench.Comparison` built from these timings."""
    _count("n", n)
    fns = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        a = torch.randn(n, n, dtype=dtype)
        b = torch.randn(n, n, dtype=dtype)
        name = str(dtype).removeprefix("torch.")
        paths = ((name, True),) if dtype == torch.float32 else ((f"{name} (oneDNN)", True),
                                                                 (f"{name} (fallback, oneDNN off)", False))
        for label, enabled in paths:
            def product(a=a, b=b, enabled=enabled):
                with torch.backends.mkldnn.flags(enabled=enabled):
                    return a @ b

            fns[label] = product
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")  # irrelevant here
        return bench.time_interleaved(fns, warmup=1, repeats=max(repeats, 5), max_seconds=max_seconds)


def cpu_matmul_paths(n: int = 256, *, repeats: int = 5) -> dict[str, float]:
    """FLOP/s of each path of :func:`cpu_matmul_path_timings` (its median round). Shows that a slow 16-bit
    product on a CPU is a property of the code path, not of the format."""
    timings = cpu_matmul_path_timings(n, repeats=repeats)
    return {label: bench.matmul_flops(n, n, n) / timing.median for label, timing in timings.items()}
