"""The course's one step-time predictor: what a GPU step costs before it runs, and how wrong that guess has been.

A step on a GPU is three streams of work, and its time is set by the slowest of them (they overlap, because the
host queues kernels ahead of the GPU):

- **the GPU's work**, kernel after kernel: matrix products at an *achievable* matrix rate, and the memory
  traffic of every other kernel (norms, adds, activations, softmax, the loss, the optimizer) at an achievable
  bandwidth. A matrix product takes the larger of its arithmetic and its bytes (``max(F / rate, bytes / bw)``:
  a decode step's products are memory-bound); an element-wise kernel takes its bytes;
- **the host's work**: issuing the step's kernels, one after another, at a per-kernel cost (in eager PyTorch:
  Python, autograd, autocast and the dispatcher, measured inside a real step; compiled or hand-written code pays
  only the bare launch, and a CUDA graph one launch a step);
- **communication** (data parallel): the gradient all-reduce, ``alpha`` per ring step and NCCL's base latency
  plus bytes at the link's bus bandwidth, overlapped with the backward pass as far as it can be.

``step = max(GPU work, host work) + all-reduce time not hidden behind the backward``.

The constants come from datasheets and microbenchmarks, each stated once (:func:`constants`), never from the
validation cases: the achievable matrix rate is a published MAMF measurement ("maximum achievable matmul
FLOPS") where one exists, else the course's own best square matrix product on that GPU (chapter 1's suite item),
else one stated fraction of the datasheet peak (``_fractions``: the median of those measured over
datasheet); the achievable bandwidth is the course's measured copy bandwidth, else the stated fraction of
the datasheet; the per-kernel cost of an eager step is the kernel census's launch floor
(``scripts/kernel_census.py``: a real GPT-2 step at sizes where the host sets the time).

:func:`count_kernels` is the course's one count of the kernels a step launches: it runs the step's operators
on the CPU at a tiny width (the operator sequence does not depend on the width), and maps each operator to the
kernels it launches on a GPU, from the kernel census of a GPT-2 step on an H100 (views, detaches and host
reads launch none; a layer norm's backward two; an embedding's backward a sort of 19); the optimizer's
foreach and fused kernels are counted as ``multi_tensor_apply`` launches them, from the real parameter sizes.

Smaller pieces from the same constants: :func:`kernel_time` (one kernel alone: its FLOPs at the achievable
rate of its units or its bytes at the achievable bandwidth), :func:`step_work` (the work of a step of any
model, counted from a run of it on the CPU, for models :func:`training_work`'s rules do not describe) and
:func:`host_link_bandwidth` (the PCIe link's own ceiling). Beside the predictor in this package:
``predict.roofline`` (the roofline model and a GPU's datasheet roofs, shown beside predictions, never as
them) and the costs built from these pieces (``layer_cost``, ``optimizer_cost``, ``collective_costs``,
``parallel_costs``).

:func:`validate` sets the predictor against published measurements from the registry (``VALIDATION_CASES``,
fixed before the constants were) and the course's own committed GPU runs; ``python -m gpuformer_lib.predict
validate`` prints the table and its summary line.

Leaves out: tile and wave quantisation (a product's rate below its best shape's, the main cause of a
prediction that is too fast), kernels that overlap on separate streams, the host's data loading, pipeline
bubbles, power and clock limits, and L2 reuse between kernels.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch

from gpuformer_lib import bench, gpu_results, gpu_view
from gpuformer_lib.published import figure

FORMATS = ("fp32", "tf32", "fp16", "bf16", "fp8")
"""The formats a matrix product runs in: float32 on CUDA cores, TF32, float16, bfloat16 or FP8 (e4m3/e5m2) on
tensor cores. FP8 is a product format only: a training step's byte rules (:func:`training_work`) know 16-bit
autocast, not FP8 training's scaling kernels."""


def format_of(dtype) -> str:
    """The format (:data:`FORMATS`) a product in ``dtype`` runs in: ``torch.float32`` (strict, CUDA cores) ->
    ``'fp32'``, ``torch.float16`` -> ``'fp16'``, ``torch.bfloat16`` -> ``'bf16'``."""
    formats = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
    if dtype not in formats:
        raise ValueError(f"dtype must be torch.float32, torch.float16 or torch.bfloat16, got {dtype!r}")
    return formats[dtype]


EXECUTIONS = ("eager", "eager-op", "compiled", "cuda-graphs", "hand-written", "graph")
"""How a step's kernels are issued: eager PyTorch in a training step (autograd and autocast on the host's
path), eager PyTorch operations outside autograd (``eager-op``: a kernel or an inference pass called from
Python), ``torch.compile`` (Inductor, no CUDA graphs), a compiled step replayed as a CUDA graph, hand-written
CUDA (llm.c), or a framework's graph executor (TensorFlow 1: eager's unfused kernels, issued from C++ at a bare
launch's cost)."""
FUSED = frozenset({"compiled", "cuda-graphs", "hand-written"})
"""Executions whose element-wise kernels are fused (each run of them reads its inputs and writes its output once)."""

REPO_ROOT = Path(__file__).resolve().parents[2]
VALIDATION_FILE = REPO_ROOT / "bench_results" / "predictor-validation.json"
"""The validation table as committed (``python -m gpuformer_lib.predict validate --write``): the book, built
without torch, shows it; ``tests/test_predict.py`` checks it against a fresh run."""
PCIE3_X16_LINE_RATE = 8e9 * 16 * 128 / 130 / 8
"""PCIe 3.0 x16 per direction, bytes/s (8 GT/s a lane, 16 lanes, 128b/130b encoding): the link of a machine
whose GPUs are not joined by NVLink."""
CENSUS_FILES = "kernel-census-*.json"


# --------------------------------------------------------------------------- constants, each stated once


MAMF_KEYS = {("A100", "bf16"): "a100-sxm-bf16-mamf", ("A100", "fp16"): "a100-sxm-bf16-mamf",
             ("H100 SXM", "bf16"): "h100-sxm-bf16-matmul-measured",
             ("H100 SXM", "fp16"): "h100-sxm-bf16-matmul-measured", ("V100 SXM2", "fp16"): "v100-fp16-matmul-measured"}
"""Published measured matrix rates (registry keys), by GPU family and format: MAMF's best shape of a search on
the A100 and H100 (fp16 runs at the bf16 rate on both), the best square product on the V100."""


def _family(gpu: str) -> str:
    return "A100" if gpu.startswith("A100") else gpu


@functools.lru_cache(maxsize=None)
def _course_measured() -> dict[str, dict[str, float]]:
    """The course's own microbenchmarks on each committed GPU, by datasheet name: the best square product of
    each format (chapter 1's ``ch01.matmul_formats``) and the largest copy's bandwidth (``ch01.copy_bandwidth``)."""
    out: dict[str, dict[str, float]] = {}
    for run in (gpu_results.load_results() or {}).values():
        name = (run.get("device") or {}).get("name", "")
        peak = bench.lookup_gpu_peak(name) if name else None
        if peak is None:
            continue
        got = out.setdefault(peak.name, {})
        for item, record in run.get("items", {}).items():
            for key, m in (record.get("measurements") or {}).items():
                rate = m.get("rate") if isinstance(m, dict) else None
                if not rate:
                    continue
                if item == "ch01.matmul_formats":
                    fmt = {"float32": "fp32", "tf32": "tf32", "float16": "fp16", "bfloat16": "bf16"}.get(
                        key.split("_n")[0])
                    if fmt:
                        got[fmt] = max(got.get(fmt, 0.0), rate)
                elif item == "ch01.copy_bandwidth" and key == "copy_2^30B":
                    got["copy"] = rate
    return out


def datasheet_rate(gpu: str, fmt: str) -> float:
    """The datasheet's dense peak of ``gpu`` (a name of ``bench.known_gpus()``) in ``fmt``, FLOP/s."""
    peak = gpu_view.datasheet(gpu)
    if _format(fmt) == "fp8":
        from gpuformer_lib.fp8 import FP8_DENSE_PEAK_TFLOPS

        if peak.name not in FP8_DENSE_PEAK_TFLOPS:
            raise ValueError(f"the course's table has no FP8 peak for the {peak.name} (FP8 tensor cores need "
                             f"compute capability 8.9 or 9.0); known: {', '.join(FP8_DENSE_PEAK_TFLOPS)}")
        return FP8_DENSE_PEAK_TFLOPS[peak.name] * 1e12
    value = {"fp32": peak.fp32, "tf32": peak.tf32, "fp16": peak.fp16, "bf16": peak.bf16}[fmt]
    if value is None:
        raise ValueError(f"the {peak.name} has no {fmt} tensor cores: predict its products in "
                         f"{'fp16' if fmt == 'bf16' else 'fp32'}")
    return value * 1e12


def _format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    return fmt


@functools.lru_cache(maxsize=None)
def _fractions() -> tuple[float, float]:
    """(matrix-rate fraction, bandwidth fraction) of the datasheet, each the median of the measured ratios."""
    ratios = [figure(key).value * 1e12 / datasheet_rate(gpu, fmt)
              for (family, fmt), key in MAMF_KEYS.items() if fmt == "bf16"
              for gpu in ([p.name for p in bench.known_gpus() if _family(p.name) == family][:1])]
    bandwidths = []
    for gpu, got in sorted(_course_measured().items()):
        ratios += [got[fmt] / datasheet_rate(gpu, fmt) for fmt in FORMATS if fmt in got]
        if "copy" in got:
            bandwidths.append(got["copy"] / (gpu_view.datasheet(gpu).memory_bandwidth_gbs * 1e9))
    if not ratios or not bandwidths:
        raise RuntimeError("no MAMF figure or committed GPU measurement to derive the achievable fractions from")
    return statistics.median(ratios), statistics.median(bandwidths)


def achievable_rate(gpu: str, fmt: str) -> tuple[float, str]:
    """The matrix rate a step's products can reach on ``gpu`` in ``fmt`` (FLOP/s) and where it comes from."""
    datasheet = datasheet_rate(gpu, fmt)
    key = MAMF_KEYS.get((_family(gpu), fmt))
    if key is not None:
        return figure(key).value * 1e12, f"published MAMF ({key})"
    measured = _course_measured().get(gpu_view.datasheet(gpu).name, {}).get(fmt)
    if measured:
        return measured, "the course's best square product on this GPU (ch01.matmul_formats)"
    fraction = _fractions()[0]
    return fraction * datasheet, f"{fraction:.0%} of the datasheet peak (the median measured fraction)"


def achievable_bandwidth(gpu: str) -> tuple[float, str]:
    """The memory bandwidth a step's kernels can reach on ``gpu`` (bytes/s) and where it comes from."""
    measured = _course_measured().get(gpu_view.datasheet(gpu).name, {}).get("copy")
    if measured:
        return measured, "the course's 1 GiB copy on this GPU (ch01.copy_bandwidth)"
    fraction = _fractions()[1]
    return fraction * gpu_view.datasheet(gpu).memory_bandwidth_gbs * 1e9, f"{fraction:.0%} of the datasheet bandwidth"


def kernel_time(flops: float, nbytes: float, gpu: str, fmt: str, *, matrix: bool) -> tuple[float, str]:
    """The GPU time of one kernel alone and what sets it, ``(seconds, 'compute' | 'memory')``: its FLOPs at
    the achievable rate of its units (a matrix product's: :func:`achievable_rate` in ``fmt``; an element-wise
    or row-wise kernel's: the float32 rate of the CUDA cores, whatever it stores) or its bytes at
    :func:`achievable_bandwidth`, whichever is longer: the roofline at the rates a GPU reaches, not its
    datasheet's. Issuing the kernel is left out (:func:`predict_step` adds the launches of a whole step)."""
    for name, value in (("flops", flops), ("nbytes", nbytes)):
        if isinstance(value, bool) or not 0 <= value < math.inf:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    rate, _ = achievable_rate(gpu, fmt if matrix else "fp32")
    compute, memory = flops / rate, nbytes / achievable_bandwidth(gpu)[0]
    return max(compute, memory), ("compute" if compute >= memory else "memory")


PCIE_LINKS = {"T4": ("PCIe 3.0 x16", 8e9), "H100 SXM": ("PCIe 5.0 x16", 32e9)}
"""The host link of the course's two prediction GPUs and its transfers per second per lane (the PCIe
specification's 8 GT/s for 3.0, 32 GT/s for 5.0)."""


def host_link_bandwidth(gpu: str) -> tuple[float, str]:
    """The host-to-GPU link's rate in one direction (bytes/s) and the link: 16 lanes x transfers per second
    x 128/130 encoding / 8 bits. No achievable fraction: the course measured none it could set apart from
    the host's memory, so this is the link's own ceiling (chapter 7 measures a copy against it)."""
    name = gpu_view.datasheet(gpu).name
    if name not in PCIE_LINKS:
        raise ValueError(f"the predictor knows the host link of {', '.join(PCIE_LINKS)}, not {name!r}")
    link, rate = PCIE_LINKS[name]
    return 16 * rate * 128 / 130 / 8, link


@functools.lru_cache(maxsize=None)
def launch_seconds() -> dict[str, float]:
    """Host seconds per kernel, by execution. ``eager``: the kernel census's launch floor (a real GPT-2 step at
    batch 1 x 16-256 tokens, where the host sets the time: step time / kernels), the median of the fastest
    host's rows (the census machines' hosts differ; published runs are on dedicated hosts). ``compiled`` and
    ``hand-written``: a bare launch (back-to-back ``x.add_(1)``), on the
    same machine (``ch00.sync_and_launch``); ``eager-op``: the same measurement, which is what it times (one
    eager operation outside autograd). ``cuda-graphs``: the bare launch, once per step."""
    per_machine = []
    for path in sorted((REPO_ROOT / "bench_results").glob(CENSUS_FILES)):
        census = json.loads(path.read_text())
        rows = [r["seconds_per_kernel"] for runs in census["launch_floor"].values() for r in runs]
        per_machine.append((statistics.median(rows), path.stem.removeprefix("kernel-census-")))
    if not per_machine:
        raise RuntimeError("no committed kernel census (bench_results/kernel-census-*.json): the eager launch "
                           "floor has no measurement")
    eager, device = min(per_machine)
    bare = gpu_results.lookup((gpu_results.load_results() or {})[device]["items"]["ch00.sync_and_launch"],
                              "measurements.tiny_kernel_launch")
    return {"eager": eager, "eager-op": bare, "compiled": bare, "hand-written": bare, "cuda-graphs": bare,
            "graph": bare}


NCCL_PROTOCOLS = {
    # protocol: (base latency key, NVLink ring step latency key, share of the Simple bus bandwidth it reaches)
    "LL": ("nccl-ring-ll-base-latency", "nccl-nvlink-ring-ll-step-latency", "nccl-ll-allreduce-bandwidth-divisor"),
    "LL128": ("nccl-ring-ll128-base-latency", "nccl-nvlink-ring-ll128-step-latency",
              "nccl-ll128-bandwidth-share"),
    "Simple": ("nccl-ring-simple-base-latency", "nccl-nvlink-ring-step-latency", None),
}
"""NCCL's tuning model for a ring over NVLink (``src/graph/tuning.cc``, registry keys): per protocol, a base
latency per call, a latency per ring step and the share of the link's bandwidth it reaches (LL's is given as a
divisor)."""


def _share(key: str | None) -> float:
    if key is None:
        return 1.0
    value = figure(key).value
    return 1 / value if key.endswith("divisor") else value


def allreduce_seconds(nbytes: float, gpus: int, bus_bandwidth: float, *, calls: int = 1) -> float:
    """``calls`` ring all-reduces of ``nbytes`` in all over ``gpus`` GPUs on NVLink, as NCCL's tuning model
    prices them: per call, for each protocol, its base latency, ``2 (n - 1)`` ring steps at its step latency and
    ``2 (n - 1) / n`` of the call's bytes at its share of ``bus_bandwidth`` (NCCL-tests' busbw of large
    messages); NCCL runs the protocol its model finds fastest, and so does this (:data:`NCCL_PROTOCOLS`)."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus must be an int >= 1, got {gpus!r}")
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
        raise ValueError(f"calls must be an int >= 1, got {calls!r}")
    if not nbytes >= 0 or not bus_bandwidth > 0:
        raise ValueError(f"nbytes must be >= 0 and bus_bandwidth > 0, got {nbytes!r} and {bus_bandwidth!r}")
    if gpus == 1:
        return 0.0
    steps, per_call = 2 * (gpus - 1), nbytes / calls
    times = []
    for base, step, share in NCCL_PROTOCOLS.values():
        bandwidth = bus_bandwidth * _share(share)
        times.append((figure(base).value + steps * figure(step).value) * 1e-6
                     + steps / gpus * per_call / bandwidth)
    return calls * min(times)


NVLINK_KEYS = {"V100": "v100-nvlink-bandwidth", "A100": "a100-nvlink-bandwidth",
               "H100 SXM": "nvlink4-unidirectional-bandwidth"}


NCCL_RING_KEYS = {"H100 SXM": "nccl-h100-nvlink-effective-ring"}
"""Published NCCL ring bandwidths over NVLink (an NCCL developer's figure), by GPU; not a validation case."""


def nvlink_bus_bandwidth(gpu: str) -> tuple[float, str]:
    """The all-reduce bus bandwidth of ``gpu``'s NVLink: NCCL's published effective ring rate where one exists
    (:data:`NCCL_RING_KEYS`), else the per-direction link bandwidth (datasheet) times the achievable bandwidth
    fraction of memory (the same stated fraction; no case sets it)."""
    if gpu in NCCL_RING_KEYS:
        return figure(NCCL_RING_KEYS[gpu]).value * 1e9, f"published NCCL ring rate ({NCCL_RING_KEYS[gpu]})"
    family = "V100" if gpu.startswith("V100") else _family(gpu)
    key = NVLINK_KEYS.get(family)
    if key is None:
        raise ValueError(f"no NVLink bandwidth registered for {gpu!r}")
    fig = figure(key)
    per_direction = fig.value * 1e9 / (2 if "both directions" in fig.quantity else 1)
    fraction = _fractions()[1]
    return fraction * per_direction, f"{fraction:.0%} of {key} per direction"


def constants() -> list[tuple[str, str, str]]:
    """Every constant the predictor uses: (name, value, source), the table the book prints once."""
    rows = []
    matrix, bandwidth = _fractions()
    rows.append(("achievable matrix fraction of datasheet", f"{matrix:.3f}",
                 "median of published MAMF / datasheet and the course's best product / datasheet"))
    rows.append(("achievable bandwidth fraction of datasheet", f"{bandwidth:.3f}",
                 "median of the course's 1 GiB copy / datasheet"))
    for execution, seconds in launch_seconds().items():
        rows.append((f"host seconds per kernel, {execution}", f"{seconds * 1e6:.1f} us",
                     "kernel census launch floor" if execution == "eager" else "ch00.sync_and_launch tiny launch"))
    for protocol, keys in NCCL_PROTOCOLS.items():
        rows.append((f"NCCL ring, {protocol}: base latency, NVLink step latency, bandwidth share",
                     f"{figure(keys[0]).value} us, {figure(keys[1]).value} us, "
                     f"{_share(keys[2]):.2f}", ", ".join(k for k in keys if k)))
    return rows


# --------------------------------------------------------------------------- counting the kernels of a step


NO_KERNEL = frozenset({
    "view", "_unsafe_view", "t", "transpose", "permute", "expand", "as_strided", "detach", "alias", "slice",
    "select", "unsqueeze", "squeeze", "split", "split_with_sizes", "unbind", "chunk", "_reshape_alias",
    "reshape", "empty", "empty_like", "empty_strided", "lift_fresh", "_local_scalar_dense", "is_nonzero",
    "_record_function_enter_new", "_record_function_exit", "clone", "slice_backward", "_to_copy_noop",
    "scalar_tensor", "sym_size", "sym_stride", "sym_numel", "unfold"})
"""Operators that launch no kernel on a GPU (the census: views, detaches, a host read of a scalar, profiler
marks; ``clone`` and ``slice_backward`` of a contiguous tensor are copies the census saw none of)."""

KERNELS_PER_OPERATOR = {
    "native_layer_norm_backward": 2,  # input gradient, then weight and bias gradients
    "embedding_dense_backward": 19,  # a radix sort of the ids, then the scatter of the rows
    "sdpa_backward": 3,  # fused attention's backward: dO.O, the backward kernel, dQ's conversion
}
"""Operators that launch more than one kernel (the census of a GPT-2 step on an H100, by name); every other
operator not in :data:`NO_KERNEL` launches one."""

MATRIX_OPERATORS = frozenset({"mm", "addmm", "bmm", "baddbmm", "linear", "matmul"})
ATTENTION_OPERATORS = frozenset({"sdpa_forward", "sdpa_backward"})
"""Fused attention, as :func:`dispatched_operators` records ``F.scaled_dot_product_attention``."""

# multi_tensor_apply's limits (ATen's ForeachFunctors / MultiTensorApply.cuh): tensors per launch by the number
# of lists the kernel reads and writes, chunks of 65,536 elements, at most 320 blocks per launch
_MAX_TENSORS = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}
_CHUNK, _MAX_BLOCKS = 65536, 320

ADAMW_FOREACH_LISTS = (2, 1, 3, 2, 1, 1, 3, 1)
"""PyTorch's foreach AdamW, one step: m.lerp_(g), v.mul_, v.addcmul_(g, g), sqrt(v) into a new list, its div_
and add_ (eps), p.addcdiv_(m, denom), p.mul_ (weight decay): the lists each foreach kernel reads or writes."""
ADAMW_FUSED_LISTS = (4,)
"""The fused AdamW kernel: params, grads, m, v in one kernel (after a foreach add of 1 to every parameter's step
count, which the fused path keeps on the GPU: one-element tensors, one list)."""


def foreach_launches(numels: Sequence[int], lists: int) -> int:
    """Kernels one foreach operator launches over tensors of these sizes, reading or writing ``lists`` lists,
    as ATen's ``multi_tensor_apply`` packs them: tensors are split into chunks of 65,536 elements, and a
    launch goes when it holds 320 chunks, or ``_MAX_TENSORS[lists]`` tensors whose last chunk it has, or the
    list ends; a tensor cut by a full launch continues into the next one."""
    max_tensors = _MAX_TENSORS[lists]
    sizes = [n for n in numels if n > 0]
    launches = tensors = blocks = 0
    for i, numel in enumerate(sizes):
        tensors += 1
        chunks = math.ceil(numel / _CHUNK)
        for chunk in range(chunks):
            blocks += 1
            last_chunk = chunk == chunks - 1
            if (tensors == max_tensors and last_chunk) or blocks == _MAX_BLOCKS or (i == len(sizes) - 1
                                                                                     and last_chunk):
                launches += 1
                blocks = 0
                tensors = 0 if last_chunk else 1
    return launches


def optimizer_kernels(numels: Sequence[int], optimizer: str | None) -> int:
    """Kernels one AdamW step launches for parameters of these sizes: ``'foreach'`` (PyTorch's default on a
    GPU), ``'fused'``, ``'per-tensor'`` (the for-loop: 13 kernels a tensor) or None (no optimizer step)."""
    if optimizer is None:
        return 0
    if optimizer == "foreach":
        return sum(foreach_launches(numels, lists) for lists in ADAMW_FOREACH_LISTS)
    if optimizer == "fused":
        steps = foreach_launches([1] * len(numels), 1)
        return steps + sum(foreach_launches(numels, lists) for lists in ADAMW_FUSED_LISTS)
    if optimizer == "per-tensor":
        return 13 * len(numels)
    raise ValueError(f"optimizer must be 'foreach', 'fused', 'per-tensor' or None, got {optimizer!r}")


def kernels_of(operators: dict[str, int]) -> int:
    """GPU kernels of dispatched operators ``{name: count}`` (:data:`NO_KERNEL`, :data:`KERNELS_PER_OPERATOR`)."""
    return sum(n * (0 if name in NO_KERNEL else KERNELS_PER_OPERATOR.get(name, 1)) for name, n in operators.items())


@contextlib.contextmanager
def _fused_attention(on_forward: Callable[..., None], on_backward: Callable[..., None]):
    """Within it, ``F.scaled_dot_product_attention`` runs as one fused operator, as a GPU runs it: the CPU's own
    computation (with a mask or dropout, the explicit scores) runs with every dispatch mode switched off, so no
    counter sees it, and ``on_forward(q, k, v, out, options)`` and ``on_backward(q, k, v, out, grad, options)``
    are told of each call instead."""
    import torch.nn.functional as F
    from torch.utils._python_dispatch import _disable_current_modes

    original = F.scaled_dot_product_attention

    class _Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, options):
            with _disable_current_modes():
                out = original(q, k, v, **options)
            ctx.save_for_backward(q, k, v)
            ctx.options = options
            on_forward(q, k, v, out, options)
            return out

        @staticmethod
        def backward(ctx, grad):
            q, k, v = ctx.saved_tensors
            with _disable_current_modes(), torch.enable_grad():
                inputs = [t.detach().requires_grad_(t.requires_grad) for t in (q, k, v)]
                out = original(*inputs, **ctx.options)
                wanted = [t for t in inputs if t.requires_grad]
                grads = iter(torch.autograd.grad(out, wanted, grad))
            on_backward(q, k, v, out, grad, ctx.options)
            return (*(next(grads) if t.requires_grad else None for t in inputs), None)

    def counted_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **rest):
        return _Attention.apply(q, k, v, dict(attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **rest))

    F.scaled_dot_product_attention = counted_attention
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def dispatched_operators(fn: Callable[[], object]) -> dict[str, int]:
    """Run ``fn()`` and count the ATen operators it dispatches below autograd, by name (``aten.mm.default`` ->
    ``'mm'``). Build the model and its inputs outside ``fn``: only what ``fn`` runs is counted.

    ``F.scaled_dot_product_attention`` counts as one fused attention operator forward
    (``'sdpa_forward'``) and one backward (``'sdpa_backward'``), whatever this CPU runs for it: with a mask or
    dropout a CPU falls back to the explicit computation, where a GPU runs one fused kernel."""
    import collections

    from torch.utils._python_dispatch import TorchDispatchMode

    counts: collections.Counter = collections.Counter()

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            counts[func.__name__.split(".")[0]] += 1
            return func(*args, **(kwargs or {}))

    with _fused_attention(lambda *call: counts.update(["sdpa_forward"]),
                          lambda *call: counts.update(["sdpa_backward"])), _Count():
        fn()
    return dict(counts)


def step_work(fn: Callable[[], object], *, fmt: str, execution: str = "eager",
              optimizer_numels: Sequence[int] = (), optimizer: str | None = "foreach") -> Work:
    """The :class:`Work` of one step of any model, counted from a real run of it: ``fn()`` runs the step's
    forward, loss and backward on the CPU in float32 at the size to predict, and every operator it dispatches
    is counted as a GPU would run it: its kernels (:data:`NO_KERNEL`, :data:`KERNELS_PER_OPERATOR`), its FLOPs
    (``FlopCounterMode``) and the bytes of the tensors it reads and writes. Two operators a CPU decomposes are
    counted as a GPU runs them, fused: ``F.scaled_dot_product_attention`` (one kernel forward, reading q, k, v
    and writing the output; three backward, reading q, k, v, the output and its gradient and writing three
    gradients; FLOPs 4 x queries x keys x head size forward, 2.5 times that backward, halved when causal: the
    CPU's explicit scores are not counted) and ``F.dropout`` (one kernel each way, a one-byte mask). The matrix
    products' bytes count apart, in ``fmt`` (halved for fp16/bf16: autocast's casts are not counted); every
    other kernel's bytes stay float32. AdamW's kernels and bytes follow :func:`optimizer_work` for
    ``optimizer_numels`` (the parameter tensors' sizes). For a model :func:`training_work`'s rules do not
    describe (chapter 15's PatchTST); a step of the course's ``DecoderLM`` takes :func:`training_work`."""
    import collections

    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
    from torch.utils._pytree import tree_leaves
    from torch.utils.flop_counter import FlopCounterMode

    _format(fmt)
    totals: collections.Counter = collections.Counter()  # bytes: "matrix", "other"; "fused_flops"
    operators: collections.Counter = collections.Counter()

    def nbytes(*trees) -> int:
        return sum(t.numel() * t.element_size() for t in tree_leaves(trees) if isinstance(t, torch.Tensor))

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.__name__.split(".")[0]
            operators[name] += 1
            if name not in NO_KERNEL:
                totals["matrix" if name in MATRIX_OPERATORS else "other"] += nbytes(args, kwargs, out)
            return out

    dropout = F.dropout

    def fused(name: str, moved: int, flops: float = 0.0, matrix: bool = False) -> None:
        operators[name] += 1
        totals["matrix" if matrix else "other"] += moved
        totals["fused_flops"] += flops

    def attention_flops(q, k, options) -> float:  # 4 x queries x keys x head size, halved when causal
        return 4 * q.numel() * k.shape[-2] / (2 if options.get("is_causal") else 1)

    def attention_forward(q, k, v, out, options) -> None:
        fused("sdpa_forward", nbytes(q, k, v, out), attention_flops(q, k, options), matrix=True)

    def attention_backward(q, k, v, out, grad, options) -> None:
        fused("sdpa_backward", nbytes(q, k, v, out, grad) + nbytes(q, k, v), 2.5 * attention_flops(q, k, options),
              matrix=True)

    class _Dropout(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, p):
            with _disable_current_modes():
                mask = (torch.rand_like(x) >= p).to(x.dtype) / (1 - p)
                out = x * mask
            ctx.save_for_backward(mask)
            fused("native_dropout", 2 * nbytes(x) + x.numel())  # read x, write the output and a byte mask
            return out

        @staticmethod
        def backward(ctx, grad):
            (mask,) = ctx.saved_tensors
            with _disable_current_modes():
                out = grad * mask
            fused("native_dropout_backward", 2 * nbytes(grad) + grad.numel())
            return out, None

    def counted_dropout(x, p=0.5, training=True, inplace=False):
        return _Dropout.apply(x, p) if training and p > 0 else x

    flops = FlopCounterMode(display=False)
    F.dropout = counted_dropout
    try:
        with _fused_attention(attention_forward, attention_backward), flops, _Count():
            fn()
    finally:
        F.dropout = dropout
    kernels = kernels_of(dict(operators))
    scale = ACTIVATION_BYTES[fmt] / 4
    other = totals["other"]
    if optimizer is not None and optimizer_numels:
        opt = optimizer_work(optimizer_numels, optimizer)
        kernels += opt.kernels
        other += opt.other_bytes
    return Work(matrix_flops=float(flops.get_total_flops()) + totals["fused_flops"],
                matrix_bytes=totals["matrix"] * scale, other_bytes=float(other), kernels=kernels, fmt=fmt,
                execution=execution)


@functools.lru_cache(maxsize=64)
def parameter_sizes(config, encoder_decoder: bool = False) -> tuple[int, ...]:
    """The sizes of the parameter tensors of the course's ``DecoderLM`` (or, with ``encoder_decoder``, its
    ``Transformer``) of ``config``, built on the meta device: no memory, no arithmetic."""
    from gpuformer_lib.model import DecoderLM, Transformer

    with torch.device("meta"):
        return tuple(p.numel() for p in (Transformer(config) if encoder_decoder else DecoderLM(config)).parameters())


def _kernel_count(operators: dict[str, int], optimizer: int = 0) -> KernelCount:
    """:class:`KernelCount` of dispatched operators (:func:`dispatched_operators`) and an optimizer's kernels."""
    matrix = sum(n for name, n in operators.items() if name in MATRIX_OPERATORS)
    attention = sum(n * KERNELS_PER_OPERATOR.get(name, 1) for name, n in operators.items()
                    if name in ATTENTION_OPERATORS)
    return KernelCount(matrix, attention, kernels_of(operators) - matrix - attention, optimizer)


@dataclasses.dataclass(frozen=True)
class KernelCount:
    """The kernels one step launches on a GPU, by kind."""

    matrix: int
    """Matrix products (mm, addmm, bmm)."""
    attention: int
    """Fused attention kernels (forward and backward)."""
    other: int
    """Element-wise, row-wise, copies, the loss, the embedding."""
    optimizer: int
    """The optimizer step's kernels."""

    @property
    def total(self) -> int:
        return self.matrix + self.attention + self.other + self.optimizer

    def compiled(self) -> int:
        """The step's kernels once ``torch.compile`` fuses it: the matrix products and attention kernels stay,
        each run of element-wise kernels between two of them becomes one kernel (at most one per product),
        and the optimizer (not compiled) stays as it is."""
        return 2 * (self.matrix + self.attention) + self.optimizer


def count_kernels(config, *, batch_size: int = 2, seq_len: int = 8, src_len: int = 0, dtype=None,
                  training: bool = True, optimizer: str | None = "foreach") -> KernelCount:
    """The kernels one step of the course's ``DecoderLM`` (``src_len == 0``) or encoder-decoder ``Transformer``
    with ``config`` launches on a GPU, the course's one kernel count. The step (forward, loss and, with
    ``training``, backward; ``dtype`` bfloat16 or float16 runs it under autocast) runs on the CPU at a width of
    8 per head and a vocabulary of 64, with the config's layers, heads, attention path, activation, dropout and
    norms: the operators dispatched do not depend on the width (or on the batch and lengths, which stay small).
    The optimizer's kernels are counted from the real parameter sizes (:func:`optimizer_kernels`)."""
    import torch.nn.functional as F

    from gpuformer_lib.model import DecoderLM, Transformer

    tiny = dataclasses.replace(config, d_model=8 * config.n_heads, d_ff=32 * config.n_heads, vocab_size=64,
                               src_vocab_size=None if config.src_vocab_size is None else 64,
                               max_len=max(seq_len, src_len) + 1, check_token_ids=False)
    torch.manual_seed(0)
    model = Transformer(tiny) if src_len else DecoderLM(tiny)
    model.train(training)
    tgt = torch.randint(0, 64, (batch_size, seq_len + 1))
    src = torch.randint(0, 64, (batch_size, src_len)) if src_len else None
    autocast = dtype is not None and dtype != torch.float32

    def step():
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=autocast):
            logits = model(src, tgt[:, :-1]) if src_len else model(tgt[:, :-1])  # (B, T, V)
            loss = F.cross_entropy(logits.reshape(-1, 64).float(), tgt[:, 1:].reshape(-1))
        if training:
            loss.backward()

    with torch.set_grad_enabled(training):
        operators = dispatched_operators(step)
    numels = parameter_sizes(config, bool(src_len))
    return _kernel_count(operators, optimizer_kernels(numels, optimizer) if training else 0)


# --------------------------------------------------------------------------- what a step asks of a GPU


ACTIVATION_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


@dataclasses.dataclass(frozen=True)
class Work:
    """What one step asks of one GPU: the inputs of :func:`predict_step`."""

    matrix_flops: float
    """FLOPs of the matrix products and attention."""
    matrix_bytes: float
    """Bytes the matrix products read and write (weights, activations)."""
    other_bytes: float
    """Bytes every other kernel reads and writes (norms, adds, activations, softmax, loss, casts, optimizer)."""
    kernels: int
    """Kernels launched per step, as issued (eager: :func:`count_kernels`)."""
    fmt: str
    """The matrix products' format (:data:`FORMATS`)."""
    execution: str = "eager"
    """How the kernels are issued (:data:`EXECUTIONS`)."""
    allreduce_bytes: float = 0.0
    """Gradient bytes each GPU all-reduces per step (data parallel)."""
    gpus: int = 1
    allreduce_calls: int = 1
    """How many all-reduces carry those bytes (each pays NCCL's latencies)."""
    backward_share: float = 2 / 3
    """The share of the GPU's work an all-reduce can hide behind (the backward pass; 0 without overlap)."""

    def __post_init__(self):
        _format(self.fmt)
        if self.execution not in EXECUTIONS:
            raise ValueError(f"execution must be one of {EXECUTIONS}, got {self.execution!r}")
        for name in ("matrix_flops", "matrix_bytes", "other_bytes", "allreduce_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not 0 <= value < math.inf:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if isinstance(self.kernels, bool) or not isinstance(self.kernels, int) or self.kernels < 1:
            raise ValueError(f"kernels must be an int >= 1, got {self.kernels!r}")


@dataclasses.dataclass(frozen=True)
class Prediction:
    """A predicted step and its parts, in seconds."""

    gpu: str
    matrix_s: float
    memory_s: float
    host_s: float
    allreduce_s: float
    exposed_allreduce_s: float
    bound: str
    """What sets the time: 'compute' (matrix arithmetic), 'memory', 'host' (launches) or 'communication'."""

    @property
    def gpu_s(self) -> float:
        return self.matrix_s + self.memory_s

    @property
    def seconds(self) -> float:
        return max(self.gpu_s, self.host_s) + self.exposed_allreduce_s


def predict_step(work: Work, gpu: str, *, bus_bandwidth: float | None = None) -> Prediction:
    """The step time of ``work`` on ``gpu`` (see the module docstring): ``max(GPU work, host work)`` plus the
    all-reduce time the backward pass cannot hide. ``bus_bandwidth`` (bytes/s) for the all-reduce: default
    ``gpu``'s NVLink (:func:`nvlink_bus_bandwidth`)."""
    rate, _ = achievable_rate(gpu, work.fmt)
    bandwidth, _ = achievable_bandwidth(gpu)
    matrix_s = max(work.matrix_flops / rate, work.matrix_bytes / bandwidth)
    memory_s = work.other_bytes / bandwidth
    issued = 1 if work.execution == "cuda-graphs" else work.kernels
    host_s = issued * launch_seconds()[work.execution]
    allreduce = 0.0
    if work.gpus > 1 and work.allreduce_bytes:
        bus = bus_bandwidth if bus_bandwidth is not None else nvlink_bus_bandwidth(gpu)[0]
        allreduce = allreduce_seconds(work.allreduce_bytes, work.gpus, bus, calls=work.allreduce_calls)
    exposed = max(0.0, allreduce - work.backward_share * max(matrix_s + memory_s, host_s))
    compute_part = matrix_s if work.matrix_flops / rate >= work.matrix_bytes / bandwidth else 0.0
    if exposed > max(matrix_s + memory_s, host_s):
        bound = "communication"
    elif host_s > matrix_s + memory_s:
        bound = "host"
    else:
        bound = "compute" if compute_part >= matrix_s + memory_s - compute_part else "memory"
    return Prediction(gpu, matrix_s, memory_s, host_s, allreduce, exposed, bound)


def training_work(config, *, tokens: int, seq_len: int, fmt: str, execution: str = "eager", src_len: int = 0,
                  optimizer: str | None = "foreach", gpus: int = 1, kernels: KernelCount | None = None,
                  vocab_pad: int | None = None, micro_batches: int = 1, grad_bytes: int | None = None) -> Work:
    """One training step (forward, loss, backward, AdamW) of ``config`` on ``tokens`` target tokens per GPU in
    sequences of ``seq_len`` (with ``src_len``: the encoder-decoder, as many source tokens), matrix products in
    ``fmt`` (bf16/fp16: autocast over float32 weights; fp32 and tf32: no autocast), issued as ``execution``,
    in ``micro_batches`` forward-backward passes (gradient accumulation) before one optimizer step; with
    ``gpus`` > 1 the gradients (``grad_bytes`` per parameter: 4, or 2 for gradients kept in 16 bits) are
    all-reduced once a step, behind the backward pass.

    Bytes, per token and layer, forward (backward twice the forward, as for the FLOPs):

    - matrix products: each reads its weight (in the product's format) and its input, writes its output;
    - eager element-wise: two layer norms and two residual adds on the float32 residual stream under autocast
      (each reads and writes C values: 8C + 12C reads and writes of 4 bytes with two inputs to an add),
      the activation (reads and writes d_ff); dropout where the config has it; with explicit attention the
      scores (H x T per token): scale, mask, softmax (float32 under autocast), its cast back, each a read and a
      write; with fused attention nothing beyond the products' bytes;
    - compiled: each run of element-wise kernels reads its inputs and writes its output once: the two
      norm-and-add groups (4 reads and writes of C) and the activation; explicit attention's scale, mask and
      softmax fused into one read and one write of the scores;
    - the loss: eager casts the logits to float32, log-softmax reads and writes them, its backward reads two
      and writes one, cast back; compiled reads the logits and writes their gradient once;
    - autocast's casts of the float32 weights (read 4, write 2 bytes per parameter, forward and backward)
      and of the gradients back (read 2, write 4);
    - AdamW on float32 state: 28 bytes per parameter fused (read p, g, m, v; write p, m, v), 80 foreach
      (:data:`ADAMW_FOREACH_LISTS`: 20 reads and writes of 4 bytes); ``optimizer=None``: no optimizer step
      (forward, loss and backward only).
    """
    from gpuformer_lib.model import transformer_flops

    if _format(fmt) == "fp8":
        raise ValueError("the predictor has no byte rules for FP8 training (its scaling and cast kernels): "
                         "predict FP8 products alone with kernel_time")
    if tokens % seq_len:
        raise ValueError(f"tokens ({tokens}) must be a whole number of sequences of {seq_len}")
    batch = tokens // seq_len
    vocab = vocab_pad or config.vocab_size
    cfg = dataclasses.replace(config, vocab_size=vocab, max_len=max(config.max_len, seq_len, src_len))
    flops = transformer_flops(cfg, batch, seq_len, src_len, training=True)
    params = sum(parameter_sizes(cfg, bool(src_len)))
    a = ACTIVATION_BYTES[fmt]
    autocast = fmt in ("bf16", "fp16")
    C, d_ff, H = cfg.d_model, cfg.d_ff, cfg.n_heads
    compiled = execution in FUSED
    src_tokens = batch * src_len if src_len else 0
    dec_layers, enc_layers = cfg.n_decoder_layers, (cfg.n_encoder_layers if src_len else 0)
    # token-layers: each position passes its own stack only (target tokens the decoder, source the encoder)
    token_layers = tokens * dec_layers + src_tokens * enc_layers
    # matrix products, forward (x3 for training): each weight read once a pass; per token and layer the
    # inputs and outputs of Q/K/V (C in, 3C out), the output projection (C, C), the feed-forward (C, d_ff;
    # d_ff, C); a decoder layer of an encoder-decoder adds cross-attention's Q and output projections
    # (C, C twice) per target token and its K, V projections of the memory (C in, 2C out) per source token;
    # the output layer reads C and writes V per target token
    per_token_layer = C + 3 * C + C + C + C + d_ff + d_ff + C
    cross = (tokens * 4 * C + src_tokens * 3 * C) * dec_layers if src_len else 0
    matrix_bytes = 3 * (params * a + (token_layers * per_token_layer + cross + tokens * (C + vocab)) * a)
    # element-wise, forward, per token and layer, in bytes. Eager, float32 (no autocast): two layer norms
    # (read and write C) and two residual adds (read 2C, write C), 10C values of 4 bytes. Eager under
    # autocast: the residual stream and the norms' outputs stay float32 and each norm's output is cast to 16
    # bits for the next product (read 4, write 2 bytes): norms 16C, casts 12C, adds 20C (a float32 and a
    # 16-bit input, a float32 output). Compiled: each norm-and-add group reads the residual and the
    # sublayer's output and writes the residual and the normed input once: (4 + a + 4 + a)C, twice. Plus
    # the activation (read and write d_ff) everywhere; a decoder layer of an encoder-decoder has a third
    # norm-and-add (cross-attention), charged as half the pair again.
    if compiled:
        norms_adds = 2 * (8 + 2 * a) * C
    else:
        norms_adds = (16 + 12 + 20) * C if autocast else 10 * C * 4
    elementwise = norms_adds + 2 * d_ff * a
    if cfg.dropout and not compiled:
        elementwise += 3 * 2 * C * a  # three dropouts a layer, each a read and a write (mask aside)
    other = 3 * token_layers * elementwise
    if src_len:
        other += 3 * tokens * dec_layers * norms_adds / 2
    if not cfg.fused_attention:
        # the explicit (B, H, T, T) scores, per token and layer (H x T elements, masked ones included): Q K^T
        # writes them and P V reads the probabilities (a each); eager adds the scale, the mask, the softmax
        # (float32 under autocast: read a, write 4) and its cast back (read 4, write a), each a read and a
        # write; compiled fuses scale, mask and softmax into one read and one write
        per_score = 2 * a + ((2 * a) if compiled else (2 * a + 2 * a + (a + 4) + (4 + a) if autocast else 6 * 4))
        other += 3 * (tokens * dec_layers * H * seq_len + src_tokens * enc_layers * H * src_len) * per_score
    logits = tokens * vocab
    other += logits * ((2 * a) if compiled else ((a + 4) + 8 + 12 + (4 + a) if autocast else 20))
    if autocast:
        # each float32 weight cast to 16 bits once a step (read 4, write 2; the forward's cast is kept for the
        # backward) and each 16-bit weight gradient accumulated into float32 (read 2, write 4)
        other += params * (6 + 6)
    other += params * {"fused": 28, "foreach": 80, None: 0}[optimizer]
    if kernels is None:
        kernels = count_kernels(config, src_len=min(src_len, 8), dtype=torch.bfloat16 if autocast else None,
                                optimizer=optimizer)
    per_pass = kernels.total - kernels.optimizer if not compiled else kernels.compiled() - kernels.optimizer
    issued = micro_batches * per_pass + kernels.optimizer
    grad = grad_bytes if grad_bytes is not None else 4
    return Work(flops, matrix_bytes, other, issued, fmt, execution,
                allreduce_bytes=params * grad if gpus > 1 else 0.0, gpus=gpus)


def optimizer_work(numels: Sequence[int], optimizer: str = "fused") -> Work:
    """One AdamW step on float32 parameters of these sizes, alone: 28 bytes a parameter fused (read p, g, m, v;
    write p, m, v) or 80 foreach (:data:`ADAMW_FOREACH_LISTS`), against the kernels it launches
    (:func:`optimizer_kernels`)."""
    if optimizer not in ("fused", "foreach"):
        raise ValueError(f"optimizer must be 'fused' or 'foreach', got {optimizer!r}")
    n = sum(numels)
    return Work(0.0, 0.0, n * (28 if optimizer == "fused" else 80), max(1, optimizer_kernels(numels, optimizer)),
                "fp32")


def decode_work(params: float, *, layers: int, d_model: int, n_heads: int, d_ff: int, fmt: str = "bf16",
                execution: str = "eager", weight_bytes: float = 2.0, gpus: int = 1, context: int = 0) -> Work:
    """One token of batch-1 decoding with a KV cache, for a Llama-style model of ``params`` parameters (with
    ``gpus`` > 1: tensor parallel, each GPU holding ``1 / gpus`` of the weights and all-reducing two vectors of
    ``d_model`` per layer). Every weight is read once (``weight_bytes`` per parameter: 2 for bf16, 1 for int8)
    and each product does 2 FLOPs per weight: far below any GPU's ridge, so memory-bound. The kernels are
    those of an eager Llama forward (:func:`llama_decode_kernels`), or of its compiled form."""
    kernels = llama_decode_kernels(layers)
    issued = kernels.compiled() if execution in FUSED else kernels.total
    per_gpu = params / gpus
    kv = 2 * layers * context * d_model * 2 / gpus
    return Work(2 * per_gpu, per_gpu * weight_bytes + kv, 0.0, issued + (4 * layers if gpus > 1 else 0), fmt,
                execution, allreduce_bytes=2 * layers * d_model * 2 if gpus > 1 else 0.0, gpus=gpus,
                allreduce_calls=2 * layers, backward_share=0.0)


@functools.lru_cache(maxsize=None)
def llama_decode_kernels(layers: int) -> KernelCount:
    """Kernels of one decoding step of an eager Llama-style forward (the architecture of Llama 2, written
    here, not gpt-fast's code): per layer an RMSNorm computed in float32 (cast, square, mean, add eps, rsqrt,
    scale, cast back, weight), fused QKV projection, rotary embeddings applied to q and k in float32, the new
    k and v written into a static cache, SDPA over the cache with a mask, output projection, residual add, a
    second RMSNorm, SwiGLU (gate and up projections, SiLU, product, down projection), residual add; then a
    final norm and the output projection. Counted on the CPU at a tiny width (:func:`count_kernels`' rule)."""
    import torch.nn.functional as F

    C, H, hs, L, T = 16, 2, 8, layers, 4

    def rms(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * w

    def rope(x, cos, sin):
        xf = x.float().reshape(*x.shape[:-1], -1, 2)
        out = torch.stack([xf[..., 0] * cos - xf[..., 1] * sin, xf[..., 1] * cos + xf[..., 0] * sin], -1)
        return out.flatten(3).type_as(x)

    dt = torch.bfloat16
    weights = [dict(n1=torch.ones(C, dtype=dt), qkv=torch.randn(3 * C, C, dtype=dt), o=torch.randn(C, C, dtype=dt),
                    n2=torch.ones(C, dtype=dt), w1=torch.randn(4 * C, C, dtype=dt), w3=torch.randn(4 * C, C, dtype=dt),
                    w2=torch.randn(C, 4 * C, dtype=dt), k=torch.zeros(1, H, T, hs, dtype=dt),
                    v=torch.zeros(1, H, T, hs, dtype=dt)) for _ in range(L)]
    emb, out_w, norm = torch.randn(32, C, dtype=dt), torch.randn(32, C, dtype=dt), torch.ones(C, dtype=dt)
    cos, sin = torch.ones(1, 1, hs // 2), torch.zeros(1, 1, hs // 2)
    pos, mask = torch.tensor([1]), torch.ones(1, 1, 1, T, dtype=torch.bool)
    ids = torch.tensor([[3]])

    def forward():
        x = F.embedding(ids, emb)  # (1, 1, C)
        for w in weights:
            q, k, v = F.linear(rms(x, w["n1"]), w["qkv"]).split(C, dim=-1)
            q, k, v = (t.view(1, 1, H, hs) for t in (q, k, v))
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            w["k"][:, :, pos] = k
            w["v"][:, :, pos] = v
            y = F.scaled_dot_product_attention(q, w["k"], w["v"], attn_mask=mask)
            x = x + F.linear(y.transpose(1, 2).reshape(1, 1, C), w["o"])
            h = rms(x, w["n2"])
            x = x + F.linear(F.silu(F.linear(h, w["w1"])) * F.linear(h, w["w3"]), w["w2"])
        return F.linear(rms(x, norm), out_w)

    with torch.no_grad():
        return _kernel_count(dispatched_operators(forward))


# --------------------------------------------------------------------------- validation against published runs


@dataclasses.dataclass(frozen=True)
class Case:
    """A published measurement and the work that reproduces it."""

    key: str
    """The registry entry of the measurement (:mod:`gpuformer_lib.published_figures`)."""
    gpu: str
    """The GPU, as the datasheet table names it."""
    kind: str
    """'training' or 'inference' or 'kernel' or 'collective'."""
    execution: str
    work: Callable[[], Work] | None
    """Builds the step's work (None: the case predicts itself, see ``predict``)."""
    seconds_of: Callable[[float], float]
    """The measured value (in the registry's unit) -> seconds per step on one GPU."""
    held_out: bool = True
    """False for the cases looked at while the byte and kernel rules were written (see the docstring)."""
    predict: Callable[[], float] | None = None
    """For collectives and kernels: the predicted seconds directly."""
    explanation: str = ""
    """Why the prediction misses, for a case off by more than 1.5x (shown on the page)."""
    bus_bandwidth: Callable[[], float] | None = None
    """The all-reduce's bus bandwidth where it is not the GPU's NVLink."""
    gpus: int = 1
    """GPUs of a collective case (its latency terms depend on them)."""


def _gpt2(d_model=768, layers=12, heads=12, *, fused_attention=True, vocab=50257):
    from gpuformer_lib.model import TransformerConfig

    return TransformerConfig(vocab_size=vocab, d_model=d_model, n_heads=heads, n_decoder_layers=layers,
                             d_ff=4 * d_model, dropout=0.0, max_len=1024, activation="gelu",
                             positional="learned", fused_attention=fused_attention)


def transformer_big_config(dropout: float = 0.1):
    """fairseq's Transformer big as NVIDIA's DeepLearningExamples train it (6+6 layers, width 1024, 16 heads,
    feed-forward 4096, a shared vocabulary of 33,712; attention computed explicitly, as fairseq's code of that
    time does: batched products and a softmax), as the course's ``TransformerConfig``."""
    from gpuformer_lib.model import TransformerConfig

    return TransformerConfig(vocab_size=33712, d_model=1024, n_heads=16, n_encoder_layers=6, n_decoder_layers=6,
                             d_ff=4096, dropout=dropout, max_len=256, activation="relu", fused_attention=False)


def _transformer_base():
    from gpuformer_lib.model import TransformerConfig

    return TransformerConfig(vocab_size=37000, d_model=512, n_heads=8, n_encoder_layers=6, n_decoder_layers=6,
                             d_ff=2048, dropout=0.1, max_len=256, activation="relu", norm_first=False)


def _ms(value: float) -> float:
    return value / 1e3


def _s(value: float) -> float:
    return value


def _per_gpu_tokens(tokens_per_step: int, gpus: int) -> Callable[[float], float]:
    """A throughput in tokens/s over ``gpus`` GPUs -> seconds per step of ``tokens_per_step`` tokens per GPU."""
    return lambda rate: tokens_per_step * gpus / rate


_DLE_SCALING = (
    "Too fast, in two parts that the source's own rows show: one GPU's step is already predicted too fast (its "
    "one-GPU row), and the 8-GPU throughput is about 0.8 of eight one-GPU throughputs "
    "(214,656 / (8 x 32,942) on V100s, 551,599 / (8 x 82,059) on A100s), a loss the predictor does not see: it "
    "hides the whole gradient all-reduce behind the backward pass and prices one all-reduce, not DDP's buckets, "
    "their launches and the ranks waiting for the slowest.")


def _attention_forward_seconds() -> float:
    """FlashAttention-3's forward, batch 4, 8,448 tokens, 16 heads of 128, non-causal, fp16: 4 B H T^2 d FLOPs
    (two products of T x T x d per head) at the H100's achievable rate; Q, K, V and O read or written once."""
    B, T, H, d = 4, 8448, 16, 128
    return predict_step(Work(4 * B * H * T * T * d, 4 * B * T * H * d * 2, 0.0, 1, "fp16", "hand-written"),
                        "H100 SXM").seconds


def _cases() -> tuple[Case, ...]:
    A100, A100_40, H100, V100 = "A100 SXM 80GB", "A100 SXM 40GB", "H100 SXM", "V100 SXM2"
    g = _gpt2
    nano = dict(tokens=16384, seq_len=1024)
    llmc = dict(seq_len=1024, fmt="bf16", execution="hand-written", optimizer="fused", gpus=8, grad_bytes=2)
    # fairseq's Transformer big on DeepLearningExamples: 5,120 target tokens per GPU a step (about 32 a sentence)
    big = dict(tokens=5120, seq_len=32, src_len=32, optimizer="fused")
    tr = training_work
    return (
        # build-nanogpt's speed ladder on one A100: GPT-2 124M, 16 x 1024 tokens, explicit attention until "flash"
        Case("build-nanogpt-a100-fp32-step-ms", A100, "training", "eager", held_out=False, seconds_of=_ms,
             work=lambda: tr(g(fused_attention=False), fmt="fp32", **nano)),
        Case("build-nanogpt-a100-tf32-step-ms", A100, "training", "eager", held_out=False, seconds_of=_ms,
             work=lambda: tr(g(fused_attention=False), fmt="tf32", **nano)),
        Case("build-nanogpt-a100-bf16-step-ms", A100, "training", "eager", held_out=False, seconds_of=_ms,
             work=lambda: tr(g(fused_attention=False), fmt="bf16", **nano),
             explanation="Too fast. The predicted step is memory-bound: explicit attention and autocast's "
                         "float32 softmax move most of its bytes, which the predictor charges at a 1 GiB copy's "
                         "bandwidth, and its products at the best shape's rate; small element-wise kernels and "
                         "768-wide products reach less of either (the course's own H100 runs show how far small "
                         "products fall: ch01, bf16 at n = 1,024 reaches an eighth of its n = 8,192 rate). Which "
                         "of the two costs more is not measured on an A100 here."),
        Case("build-nanogpt-a100-compile-step-ms", A100, "training", "compiled", held_out=False, seconds_of=_ms,
             work=lambda: tr(g(fused_attention=False), fmt="bf16", execution="compiled", **nano),
             explanation="Too fast, for the reasons of the bf16 rung before it: products charged at the best "
                         "shape's rate, which GPT-2 small's 768-wide products do not reach; compiling fuses the "
                         "element-wise kernels and leaves the products as they were."),
        Case("build-nanogpt-a100-flash-step-ms", A100, "training", "compiled", held_out=False, seconds_of=_ms,
             work=lambda: tr(g(), fmt="bf16", execution="compiled", **nano)),
        # llm.c: hand-written CUDA, bf16, cuDNN attention, fused AdamW, 8 GPUs, 524,288 tokens a step
        Case("llm-c-gpt2-124m-8xa100-step-ms", A100, "training", "hand-written", seconds_of=_ms,
             work=lambda: tr(g(vocab=50304), tokens=65536, **llmc)),
        Case("llm-c-gpt2-350m-8xa100-step-ms", A100, "training", "hand-written", seconds_of=_ms,
             work=lambda: tr(g(1024, 24, 16, vocab=50304), tokens=65536, **llmc)),
        Case("llm-c-gpt2-774m-8xa100-step-s", A100, "training", "hand-written", seconds_of=_s,
             work=lambda: tr(g(1280, 36, 20, vocab=50304), tokens=65536, micro_batches=2, **llmc)),
        Case("llm-c-gpt2-1558m-8xh100-step-s", H100, "training", "hand-written", seconds_of=_s,
             work=lambda: tr(g(1600, 48, 25, vocab=50304), tokens=131072, micro_batches=8, **llmc)),
        # NVIDIA DeepLearningExamples, fairseq Transformer big, eager, Apex fused Adam
        Case("nvidia-transformer-big-v100-fp32-tokens-per-s", V100, "training", "eager",
             seconds_of=_per_gpu_tokens(2560, 1), work=lambda: tr(transformer_big_config(), fmt="fp32",
                                                                **{**big, "tokens": 2560})),
        Case("nvidia-transformer-big-v100-amp-tokens-per-s", V100, "training", "eager",
             seconds_of=_per_gpu_tokens(5120, 1), work=lambda: tr(transformer_big_config(), fmt="fp16", **big)),
        Case("nvidia-transformer-big-8xv100-amp-tokens-per-s", V100, "training", "eager",
             seconds_of=_per_gpu_tokens(5120, 8), explanation=_DLE_SCALING,
             work=lambda: tr(transformer_big_config(), fmt="fp16", gpus=8, grad_bytes=2, **big)),
        Case("nvidia-transformer-big-a100-tf32-tokens-per-s", A100_40, "training", "eager",
             seconds_of=_per_gpu_tokens(10240, 1),
             work=lambda: tr(transformer_big_config(), fmt="tf32", **{**big, "tokens": 10240})),
        Case("nvidia-transformer-big-a100-amp-tokens-per-s", A100_40, "training", "eager",
             seconds_of=_per_gpu_tokens(10240, 1),
             work=lambda: tr(transformer_big_config(), fmt="fp16", **{**big, "tokens": 10240})),
        Case("nvidia-transformer-big-8xa100-amp-tokens-per-s", A100_40, "training", "eager",
             seconds_of=_per_gpu_tokens(10240, 8), explanation=_DLE_SCALING,
             work=lambda: tr(transformer_big_config(), fmt="fp16", gpus=8, grad_bytes=2, **{**big, "tokens": 10240})),
        # the original Transformer on 8 P100s (TensorFlow graphs: unfused kernels issued by a C++ executor)
        Case("transformer-base-step-time-8xp100", "P100 SXM2", "training", "graph", seconds_of=_s,
             work=lambda: tr(_transformer_base(), fmt="fp32", execution="graph", tokens=3136, seq_len=32,
                             src_len=32, optimizer="fused", gpus=8),
             bus_bandwidth=lambda: _fractions()[1] * PCIE3_X16_LINE_RATE,
             explanation="Too fast, the worst case. The paper names neither the link between its 8 GPUs "
                         "nor how gradients were exchanged (TensorFlow 1's replicas, possibly through a parameter "
                         "server), nor the kernels' efficiency on a 2016 GPU at 512-wide products; the predictor "
                         "assumes a PCIe ring all-reduce and the stated fraction of the fp32 peak. Which of these "
                         "costs the time is not known."),
        # gpt-fast: Llama-2-7B decoding at batch 1 on an A100 (power-limited to 330 W)
        Case("gpt-fast-llama2-7b-eager-tokens-per-s", A100, "inference", "eager", held_out=False,
             seconds_of=lambda rate: 1 / rate,
             explanation="Too slow: launch-bound, as gpt-fast's blog says, but the per-kernel cost comes "
                         "from a training step (autograd and autocast on every operator), which a no-grad decode "
                         "step does not pay, and the kernel count from the course's own Llama-style forward, "
                         "not gpt-fast's code.",
             work=lambda: decode_work(6.74e9, layers=32, d_model=4096, n_heads=32, d_ff=11008)),
        Case("gpt-fast-llama2-7b-decode-tokens-per-s", A100, "inference", "cuda-graphs", held_out=False,
             seconds_of=lambda rate: 1 / rate,
             work=lambda: decode_work(6.74e9, layers=32, d_model=4096, n_heads=32, d_ff=11008,
                                      execution="cuda-graphs")),
        Case("gpt-fast-llama2-70b-tp8-tokens-per-s", A100, "inference", "cuda-graphs",
             seconds_of=lambda rate: 1 / rate,
             work=lambda: decode_work(69e9, layers=80, d_model=8192, n_heads=64, d_ff=28672,
                                      execution="cuda-graphs", gpus=8)),
        # kernels and collectives
        Case("fa3-h100-fp16-forward-ms", H100, "kernel", "hand-written", work=None, seconds_of=_ms,
             predict=_attention_forward_seconds),
        Case("nccl-2xa100-allreduce-latency-us", A100, "collective", "hand-written", work=None, gpus=2,
             seconds_of=lambda us: us * 1e-6,
             predict=lambda: allreduce_seconds(32, 2, nvlink_bus_bandwidth(A100)[0])),
        Case("nccl-8xa100-allreduce-busbw-measured", A100, "collective", "hand-written", work=None, gpus=8,
             # nccl-tests' busbw of its largest message: time = 2 (n - 1) / n x size / busbw; size 4 GiB
             seconds_of=lambda gbs: 2 * 7 / 8 * 2**32 / (gbs * 1e9),
             predict=lambda: allreduce_seconds(2**32, 8, nvlink_bus_bandwidth(A100)[0])),
    )


@dataclasses.dataclass(frozen=True)
class Row:
    key: str
    gpu: str
    kind: str
    execution: str
    held_out: bool
    measured_s: float
    predicted_s: float
    bound: str
    explanation: str

    @property
    def ratio(self) -> float:
        """Predicted time / measured time: below 1 the predictor is too optimistic."""
        return self.predicted_s / self.measured_s


def validate(cases: Sequence[Case] | None = None) -> list[Row]:
    """Every validation case, predicted and compared with its published measurement."""
    rows = []
    for case in _cases() if cases is None else cases:
        measured = case.seconds_of(figure(case.key).value)
        if case.work is not None:
            bus = case.bus_bandwidth() if case.bus_bandwidth is not None else None
            prediction = predict_step(case.work(), case.gpu, bus_bandwidth=bus)
            predicted, bound = prediction.seconds, prediction.bound
        else:
            predicted, bound = case.predict(), "compute"
            if case.kind == "collective":
                latency = allreduce_seconds(0, case.gpus, 1e12)
                bound = "latency" if latency > predicted / 2 else "bandwidth"
        rows.append(Row(case.key, case.gpu, case.kind, case.execution, case.held_out, measured, predicted, bound,
                        case.explanation))
    return rows


COURSE_RUNS = (
    # (suite item, path, what it ran: execution, optimizer, batch): GPT-2 small, 1024 tokens a sequence, bf16
    ("ch10.profile_step", "measurements.eager_step", "eager", "foreach", 4),
    ("ch10.ladder", "measurements.sdpa_step", "eager", "foreach", 16),
    ("ch10.ladder", "measurements.compile_step", "compiled", "foreach", 16),
    ("ch10.ladder", "measurements.fused_adamw_step", "compiled", "fused", 16),
    ("ch10.ladder", "measurements.cuda_graphs_step", "cuda-graphs", "fused", 16),
)
"""The course's own committed GPU runs that the predictor can reproduce (chapter 10's profiled step and the
speed ladder's bf16 rungs, fused attention throughout)."""


def course_rows() -> list[Row]:
    """The predictor against every committed GPU run of :data:`COURSE_RUNS` (none without results). Not held
    out: the eager launch constant is measured on these machines."""
    from gpuformer_lib.model import gpt2_config

    config = dataclasses.replace(gpt2_config(), vocab_size=50304, dropout=0.0, max_len=1024)
    rows = []
    for device, run in sorted((gpu_results.load_results() or {}).items()):
        peak = bench.lookup_gpu_peak((run.get("device") or {}).get("name", ""))
        if peak is None:
            continue
        for item, path, execution, optimizer, batch in COURSE_RUNS:
            measured = gpu_results.lookup(run["items"].get(item, {}), path)
            if measured is None:
                continue
            work = training_work(config, tokens=batch * 1024, seq_len=1024, fmt="bf16", execution=execution,
                                 optimizer=optimizer)
            prediction = predict_step(work, peak.name)
            rows.append(Row(f"{device}: {item} {path.split('.')[-1]}", peak.name, "training", execution, False,
                            measured, prediction.seconds, prediction.bound, ""))
    return rows


@dataclasses.dataclass(frozen=True)
class Summary:
    count: int
    median_abs_log_ratio: float
    worst_abs_log_ratio: float

    @property
    def median_error(self) -> float:
        """The median factor by which a prediction misses, minus 1 (0.25: within 25 %)."""
        return math.exp(self.median_abs_log_ratio) - 1

    @property
    def worst_factor(self) -> float:
        return math.exp(self.worst_abs_log_ratio)

    def line(self, label: str = "all") -> str:
        return (f"{label}: {self.count} cases, median |log ratio| {self.median_abs_log_ratio:.3f} "
                f"(off by {self.median_error:.0%}), worst |log ratio| {self.worst_abs_log_ratio:.3f} "
                f"(off by {self.worst_factor:.2f}x)")


def summarize(rows: Iterable[Row]) -> Summary:
    logs = [abs(math.log(r.ratio)) for r in rows]
    if not logs:
        raise ValueError("no rows to summarize")
    return Summary(len(logs), statistics.median(logs), max(logs))


def table(rows: Sequence[Row]) -> str:
    """The validation table as text."""
    lines = [f"{'case':48} {'GPU':14} {'how':12} {'measured':>10} {'predicted':>10} {'pred/meas':>9}  bound"]
    for r in rows:
        lines.append(f"{r.key + ('' if r.held_out else ' *'):48} {r.gpu:14} {r.execution:12} "
                     f"{gpu_results.si(r.measured_s, 's'):>10} {gpu_results.si(r.predicted_s, 's'):>10} "
                     f"{r.ratio:>9.2f}  {r.bound}")
    return "\n".join(lines)


def validation_record() -> dict:
    """The validation as data: every published case's row, the course's own runs, the summaries, the constants."""
    rows, course = validate(), course_rows()

    def as_dict(r: Row) -> dict:
        fig = figure(r.key) if r.key in {c.key for c in _cases()} else None
        return {**dataclasses.asdict(r), "ratio": r.ratio,
                "source": None if fig is None else {"value": fig.value, "unit": fig.unit, "hardware": fig.hardware,
                                                    "title": fig.title}}

    def summary(selected: Sequence[Row]) -> dict:
        s = summarize(selected)
        return {"count": s.count, "median_abs_log_ratio": s.median_abs_log_ratio,
                "worst_abs_log_ratio": s.worst_abs_log_ratio, "line": s.line()}

    return {"schema": 1, "rows": [as_dict(r) for r in rows], "course_rows": [as_dict(r) for r in course],
            "summary": {"held_out": summary([r for r in rows if r.held_out]), "all": summary(rows),
                        **({"course": summary(course)} if course else {})},
            "constants": [list(c) for c in constants()]}


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m gpuformer_lib.predict",
                                     description="The course's step-time predictor against published GPU runs.")
    parser.add_argument("command", choices=["validate", "constants"])
    parser.add_argument("--write", action="store_true",
                        help=f"validate: also write the table to {VALIDATION_FILE.relative_to(REPO_ROOT)} (the book's)")
    args = parser.parse_args(argv)
    if args.command == "constants":
        for name, value, source in constants():
            print(f"{name:70} {value:>22}  {source}")
        return 0
    rows = validate()
    print(table(rows))
    print("* looked at while the byte and kernel rules were written; the others are held out")
    course = course_rows()
    if course:
        print("\nThe course's own committed GPU runs (not held out: the eager launch constant comes from them):")
        print(table(course))
        print(summarize(course).line("course runs"))
    if args.write:
        VALIDATION_FILE.write_text(json.dumps(validation_record(), indent=1, ensure_ascii=False) + "\n")
        print(f"\nwrote {VALIDATION_FILE}")
    print()
    print(summarize([r for r in rows if r.held_out]).line("held out"))
    print(summarize(rows).line("all"))
    return 0

