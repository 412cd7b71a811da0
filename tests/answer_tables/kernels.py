"""Chapter 2: Triton kernels (a masked add, a fused GELU), two roofs on two GPUs, a strided gather's bytes, what
limits occupancy.

The kernel checks launch ``@triton.jit`` kernels: their rows name a kernel of :func:`_kernels` and are skipped
where Triton is not installed (they run in Triton's interpreter on a CPU, compiled on a GPU)."""

from __future__ import annotations

import functools

import pytest
import torch

import gpuformer_lib.kernels  # noqa: F401  first, at collection: it switches Triton's interpreter on without a GPU,
# which works only before anything imports triton (a test that steps torch.optim does, on a CPU too)
from answer_tables import Table, Wrong
from gpuformer_lib.exercises import kernels as ex
from gpuformer_lib.predict.roofline import datasheet_bandwidth as bandwidth, datasheet_ceiling as compute_ceiling


@functools.cache
def _kernels() -> dict:
    """The kernels the rows name: right and wrong answers to exercises 2.1 (add) and 2.2 (GELU)."""
    from gpuformer_lib import kernels  # noqa: F401  sets TRITON_INTERPRET=1 without a GPU, before triton is imported

    import triton
    import triton.language as tl

    @triton.jit
    def add_masked(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        y = tl.load(y_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, x + y, mask=mask)

    @triton.jit
    def add_masked_positional(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, offsets < n) + tl.load(y_ptr + offsets, offsets < n),
                 offsets < n)

    @triton.jit
    def add_unmasked(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) + tl.load(y_ptr + offsets))

    @triton.jit
    def add_store_masked_only(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offsets)
        y = tl.load(y_ptr + offsets)
        tl.store(out_ptr + offsets, x + y, mask=offsets < n)

    @triton.jit
    def add_off_by_one(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets <= n
        x = tl.load(x_ptr + offsets, mask=mask)
        y = tl.load(y_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, x + y, mask=mask)

    @triton.jit
    def add_block_offsets_forgotten(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(axis=0) + tl.arange(0, BLOCK)  # pid, not pid * BLOCK
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        y = tl.load(y_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, x + y, mask=mask)

    @triton.jit
    def gelu_tanh(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        z = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        tl.store(out_ptr + offsets, x * tl.sigmoid(2.0 * z), mask=mask)

    @triton.jit
    def gelu_sigmoid_z(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        z = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        tl.store(out_ptr + offsets, x * tl.sigmoid(z), mask=mask)

    @triton.jit
    def gelu_without_x(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        z = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        tl.store(out_ptr + offsets, tl.sigmoid(2.0 * z), mask=mask)

    @triton.jit
    def gelu_quick(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, x * tl.sigmoid(1.702 * x), mask=mask)

    @triton.jit
    def gelu_unmasked(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offsets)
        z = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        tl.store(out_ptr + offsets, x * tl.sigmoid(2.0 * z))

    @triton.jit
    def gelu_load_unmasked(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offsets)
        z = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        tl.store(out_ptr + offsets, x * tl.sigmoid(2.0 * z), mask=offsets < n)

    return {name: value for name, value in locals().items() if name.startswith(("add_", "gelu_"))}


def _launch(check):
    """Grade the kernel a row names with ``check``, as the notebook does; skipped without Triton."""

    def grade(name: str):
        from gpuformer_lib.kernels import kernel_support

        if kernel_support().triton_mode == "unavailable":
            pytest.skip("Triton is not installed: the kernel checks cannot launch a kernel here")
        return check(_kernels()[name])

    return grade


def _roofs(**changes) -> dict:
    """The right answer to exercise 2.3 (as the chapter's solution computes it), with ``changes`` applied: a
    kernel's name -> its (intensity, bound on a T4, bound on an H100 SXM)."""
    answers = {}
    for name, (flops, nbytes) in ex.KERNEL_ROOF_COSTS.items():
        matmul = "matmul" in name
        dtype = torch.float16 if matmul else torch.float32
        answers[name] = (flops / nbytes, *(
            "compute" if flops / nbytes > compute_ceiling(g, dtype, tensor_cores=matmul) / bandwidth(g) else "memory"
            for g in ex.ROOF_GPUS))
    return {**answers, **{_ROOF_NAMES[key]: value for key, value in changes.items()}}


_ROOF_NAMES = {"add": "vector add, float32", "softmax": "fused softmax, float32",
               "poly": "degree-128 polynomial (Horner), float32", "mm768": "tiled matmul 768 x 768 x 768, float16",
               "mm4096": "tiled matmul 4096 x 4096 x 4096, float16"}

# exercise 2.5's kernel: blocks of 256 threads, 64 registers per thread, 24 KB of shared memory per block
_KERNEL = dict(threads_per_block=256, regs_per_thread=64, smem_per_block=24 * 1024)
_LIMITER_RIGHT = {"T4": ("shared memory", {"smem_per_block": 16 * 1024}),
                  "H100 SXM": ("registers", {"regs_per_thread": 32})}

TABLES = [
    Table(
        "check_masked_add", _launch(ex.check_masked_add),
        right=("add_masked", "add_masked_positional"),
        wrong=(Wrong("no mask at all", "add_unmasked", ("writes past the end", "mask=offsets < n")),
               Wrong("loads not masked", "add_store_masked_only", ("a load is not", "mask=offsets < n")),
               Wrong("mask offsets <= n", "add_off_by_one", ("off by one", "not offsets <= n")),
               Wrong("offsets without pid * BLOCK", "add_block_offsets_forgotten", ("pid * BLOCK",))),
    ),
    Table(
        "check_gelu_kernel", _launch(ex.check_gelu_kernel),
        right=("gelu_tanh",),
        wrong=(Wrong("sigmoid(z), not sigmoid(2z)", "gelu_sigmoid_z", ("x·sigmoid(z)", "2z")),
               Wrong("the gate without x", "gelu_without_x", ("multiplies it by x",)),
               Wrong("quick GELU x·sigmoid(1.702x)", "gelu_quick", ("quick GELU", "tanh approximation")),
               Wrong("no mask", "gelu_unmasked", ("writes past the end", "mask=offsets < n")),
               Wrong("load not masked", "gelu_load_unmasked", ("the load is not", "mask=offsets < n"))),
    ),
    Table(
        "check_kernel_roofs", ex.check_kernel_roofs,
        right=(_roofs(),),
        wrong=(Wrong("vector add upside down", _roofs(add=(12.0, "memory", "memory")), ("upside down",)),
               Wrong("vector add without the write", _roofs(add=(1 / 8, "memory", "memory")),
                     ("write is missing",)),
               Wrong("FLOPs per element, not per byte", _roofs(softmax=(5.0, "memory", "memory")),
                     ("flops per element",)),
               Wrong("Horner's multiply-add as 1 FLOP", _roofs(poly=(16.0, "compute", "memory")),
                     ("multiply-add, 2 flops",)),
               Wrong("polynomial against the tensor-core roof", _roofs(poly=(32.0, "memory", "memory")),
                     ("other roof", "never runs on tensor cores")),
               Wrong("matmul without reuse", _roofs(mm768=(1536 / 3074, "memory", "memory")),
                     ("without reuse",)),
               Wrong("matmul with 4-byte elements", _roofs(mm768=(128.0, "memory", "memory")),
                     ("2 bytes, not 4",)),
               Wrong("matmul without the write of C", _roofs(mm768=(384.0, "compute", "compute")),
                     ("write of c is missing",)),
               Wrong("the 768-cube product compute-bound on the H100 too",
                     _roofs(mm768=(256.0, "compute", "compute")), ("on the h100 sxm", "each gpu has its own ridge")),
               Wrong("the polynomial memory-bound (float16 tensor-core ridge)",
                     _roofs(poly=(32.0, "compute", "memory")), ("on the h100 sxm", "never runs on tensor cores"))),
    ),
    Table(
        "check_strided_copy_prediction",
        # the notebook passes the measured ratio: a fixed number here (a CPU measured 2.9x)
        lambda answer: ex.check_strided_copy_prediction(answer, 2.9, stride=8),
        right=((8 + 8 * 4 + 4) / (8 + 4 + 4), 2.75, 2.8),
        wrong=(Wrong("index bytes forgotten", (32 + 4) / (4 + 4), ("leaving out the index", "count the index")),
               Wrong("bytes used, not sectors fetched", 1.0, ("bytes fetched, not the bytes used",)),
               Wrong("a 64-byte line per element", (8 + 64 + 4) / 16, ("64-byte lines", "share a line")),
               Wrong("the stride itself", 8, ("the stride alone",)),
               Wrong("the write forgotten", (8 + 32) / (8 + 4), ("count the write",)),
               Wrong("upside down", 16 / 44, ("upside down",)),
               Wrong("the measurement typed in", 5.0, ("too high", "32-byte sector"))),
    ),
    Table(
        "check_occupancy_limiter", lambda answers: ex.check_occupancy_limiter(answers, **_KERNEL),
        right=(_LIMITER_RIGHT,
               # any single change that at least doubles occupancy passes: 256 -> 128 threads does on a T4
               {**_LIMITER_RIGHT, "T4": ("shared memory", {"smem_per_block": 12 * 1024})}),
        wrong=(Wrong("registers named on the T4", {**_LIMITER_RIGHT, "T4": ("registers", {"smem_per_block": 16384})},
                     ("t4: not 'registers'", "the smallest is the limiter")),
               Wrong("shared memory named on the H100 (no 1 KB reserved per block)",
                     {**_LIMITER_RIGHT, "H100 SXM": ("shared memory", {"smem_per_block": 12 * 1024})},
                     ("h100 sxm: not 'shared memory'", "reserved")),
               Wrong("halving shared memory on the H100", {**_LIMITER_RIGHT, "H100 SXM": (
                   "registers", {"smem_per_block": 12 * 1024})}, ("not twice", "limited by registers")),
               Wrong("too small a cut on the T4", {**_LIMITER_RIGHT, "T4": ("shared memory", {"smem_per_block": 20480})},
                     ("not twice",)),
               Wrong("registers cut to 48 on the H100", {**_LIMITER_RIGHT, "H100 SXM": (
                   "registers", {"regs_per_thread": 48})}, ("not twice",)),
               Wrong("a block that no longer launches", {**_LIMITER_RIGHT, "T4": (
                   "shared memory", {"smem_per_block": 100 * 1024})}, ("does not launch",))),
    ),
]
