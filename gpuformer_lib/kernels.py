"""The course's own GPU kernels, written in Triton, and the CUDA C kernel of the second article this course
started from.

Covers: vector add (with the tail masked), a strided copy (for coalescing), a row-wise fused
softmax, a tiled matrix product (``tl.dot``) and its grouped-order variant (:func:`grouped_matmul`, with
the order written out in Python, :func:`grouped_tile_order`, and its cache working set,
:func:`wave_working_set`), and a grid-stride ``add`` in CUDA C compiled with
``torch.utils.cpp_extension.load_inline``; and :func:`kernel_support`, which says whether they can
run compiled, interpreted, or not at all, and why.

How they run: on a machine with a CUDA GPU, Triton compiles them. Without one, this module sets
``TRITON_INTERPRET=1`` *before* its kernels are defined (Triton reads it when ``@triton.jit``
runs), so they run in Triton's interpreter on CPU tensors: the same code, checked for correctness,
but thousands of times slower than PyTorch's own operators (chapter 2 measures the factor on the machine
that runs it; it depends on the size and the kernel). Importing this module therefore also makes kernels you define
afterwards interpreted on such a machine. Where Triton is not installed (macOS, Windows) the
kernels are unavailable and calling one raises :class:`KernelUnavailableError` with the reason.

Leaves out: autotuning and benchmarking helpers (``triton.testing`` needs a GPU; see chapter 2).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import subprocess
import sys

_TRITON_ALREADY_IMPORTED = "triton" in sys.modules  # torch.optim and torch.compile import it on a CPU too

import torch


class KernelUnavailableError(RuntimeError):
    """A kernel cannot run on this machine; the message says why and what to do."""


def _choose_triton_mode() -> tuple[str, str]:
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "interpreted", "TRITON_INTERPRET=1 is set: Triton kernels run in its interpreter on CPU tensors"
    if torch.cuda.is_available():
        return "compiled", f"Triton compiles kernels for {torch.cuda.get_device_name()}"
    os.environ["TRITON_INTERPRET"] = "1"
    reason = ("no CUDA GPU: Triton kernels run in its interpreter on CPU tensors "
              "(for correctness, not speed: far slower than PyTorch's own operators)")
    if _TRITON_ALREADY_IMPORTED:
        reason += TOO_LATE
    return "interpreted", reason


TOO_LATE = ("; but Triton was imported before this module could switch its interpreter on (an optimizer step or "
            "torch.compile imports it), so Triton's own helpers such as tl.sigmoid are not interpreted and a "
            "kernel that calls one fails with \"Cannot call @triton.jit'd outside of the scope of a kernel\": "
            "restart the kernel and import gpuformer_lib.kernels first")
"""Added to the interpreter's reason when Triton was imported before :func:`_choose_triton_mode` set
``TRITON_INTERPRET=1``: Triton reads the variable when its own ``@triton.jit`` helpers are defined."""


_TRITON_MODE, _TRITON_REASON = _choose_triton_mode()
try:
    import triton
    import triton.language as tl
except ImportError as err:  # no wheel for this platform, or not installed
    triton = tl = None
    _TRITON_MODE = "unavailable"
    _TRITON_REASON = (f"Triton is not installed ({err}). It comes with PyTorch's CUDA builds on Linux; "
                      "otherwise `pip install triton` (Linux only). On macOS or Windows, read the kernels "
                      "and run them in Colab.")


@dataclasses.dataclass(frozen=True)
class KernelSupport:
    """What can run here: Triton kernels (compiled, interpreted or unavailable) and CUDA C."""

    triton_mode: str
    triton_reason: str
    cuda_c: bool
    cuda_c_reason: str

    def __str__(self) -> str:
        return (f"Triton kernels: {self.triton_mode} ({self.triton_reason})\n"
                f"CUDA C kernels: {'can be compiled' if self.cuda_c else 'not available'} ({self.cuda_c_reason})")


@functools.lru_cache(maxsize=None)
def _nvcc_cuda_version(nvcc: str) -> tuple[int, int] | None:
    """The CUDA version ``nvcc`` compiles for, from ``nvcc --version`` ("... release 12.4, V12.4.131"), or None."""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else None


def _cuda_c_support() -> tuple[bool, str]:
    """Whether ``load_inline`` can build the CUDA C kernel here, checked the way it will build it: the
    nvcc that ``torch.utils.cpp_extension`` finds ($CUDA_HOME, $CUDA_PATH, nvcc on PATH, or
    /usr/local/cuda), a CUDA major version equal to PyTorch's (it refuses to build otherwise), and ninja."""
    if not torch.cuda.is_available():
        return False, "needs a CUDA GPU; none is visible to PyTorch"
    if torch.version.cuda is None:
        return False, "needs a CUDA build of PyTorch (this one is built for ROCm)"
    from torch.utils import cpp_extension

    nvcc = os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc") if cpp_extension.CUDA_HOME else None
    if nvcc is None or not os.path.exists(nvcc):
        return False, "needs the CUDA toolkit's compiler nvcc (install the toolkit, or set CUDA_HOME to it)"
    version = _nvcc_cuda_version(nvcc)
    if version is None:
        return False, f"could not read the CUDA version of {nvcc} from `nvcc --version`"
    if str(version[0]) != torch.version.cuda.split(".")[0]:
        return False, (f"nvcc at {nvcc} is CUDA {version[0]}.{version[1]}, but PyTorch is built for CUDA "
                       f"{torch.version.cuda}: the major versions must match (install a matching toolkit and "
                       "set CUDA_HOME to it)")
    if not cpp_extension.is_ninja_available():
        return False, "needs the ninja build tool: pip install ninja"
    return True, f"nvcc at {nvcc} (CUDA {version[0]}.{version[1]}), PyTorch built for CUDA {torch.version.cuda}"


def kernel_support() -> KernelSupport:
    """Whether the course's kernels can run here, and why (or why not)."""
    cuda_c, reason = _cuda_c_support()
    return KernelSupport(_TRITON_MODE, _TRITON_REASON, cuda_c, reason)


def _check_tensors(*tensors: torch.Tensor) -> None:
    if _TRITON_MODE == "unavailable":
        raise KernelUnavailableError(_TRITON_REASON)
    want = "cuda" if _TRITON_MODE == "compiled" else "cpu"
    for t in tensors:
        if t.device.type != want:
            raise ValueError(f"Triton kernels are {_TRITON_MODE} here, so tensors must be on the {want.upper()} "
                             f"(got one on {t.device}); move them with .to('{want}')")
        if _TRITON_MODE == "interpreted" and t.dtype == torch.bfloat16:
            raise ValueError("Triton's interpreter computes with NumPy, which has no bfloat16, and gets bfloat16 "
                             "wrong: use float32 or float16 on the CPU, and bfloat16 on a GPU")
    if len({t.device for t in tensors}) > 1:
        raise ValueError(f"the tensors must be on one device, got {', '.join(str(t.device) for t in tensors)}")


_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_float(name: str, t: torch.Tensor) -> None:
    """The softmax and matmul kernels compute in float32 and store in the input's dtype: 16- and 32-bit floats."""
    if t.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{name} is {t.dtype}; this kernel takes float16, bfloat16 or float32 (it computes in "
                         "float32): convert with .float(), or use PyTorch's own op for other dtypes")


def _check_power_of_two(name: str, value, least: int = 1) -> None:
    """Block sizes (``tl.arange``'s length) and warp counts must be powers of two."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least or value & (value - 1):
        raise ValueError(f"{name}={value!r} must be a power of two (an int), at least {least}")


# --------------------------------------------------------------------------- Triton kernels

if triton is not None:

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(axis=0)  # which block of BLOCK elements this program handles
        offsets = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n  # the last block may run past the end: mask the tail
        x = tl.load(x_ptr + offsets, mask=mask)
        y = tl.load(y_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, x + y, mask=mask)

    @triton.jit
    def strided_copy_kernel(x_ptr, out_ptr, n, stride, BLOCK: tl.constexpr):
        offsets = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        # neighbouring programs' threads read addresses `stride` elements apart: stride 1 is coalesced
        src = (offsets.to(tl.int64) * stride) % n
        tl.store(out_ptr + offsets, tl.load(x_ptr + src, mask=mask), mask=mask)

    @triton.jit
    def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(axis=0)  # one program per row
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(in_ptr + row * in_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
        x = x - tl.max(x, axis=0)  # stable: every exponent <= 0
        numerator = tl.exp(x)
        y = numerator / tl.sum(numerator, axis=0)
        tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                      stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # each program computes one (BLOCK_M, BLOCK_N) tile of C, walking along K in steps of BLOCK_K
        rm = tl.program_id(axis=0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(axis=1) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            a_mask = (rm[:, None] < M) & (k0 + rk[None, :] < K)
            b_mask = (k0 + rk[:, None] < K) & (rn[None, :] < N)
            a = tl.load(a_ptr + rm[:, None] * stride_am + (k0 + rk[None, :]) * stride_ak, mask=a_mask, other=0.0)
            b = tl.load(b_ptr + (k0 + rk[:, None]) * stride_bk + rn[None, :] * stride_bn, mask=b_mask, other=0.0)
            acc += tl.dot(a, b)  # (BLOCK_M, BLOCK_K) x (BLOCK_K, BLOCK_N): tensor cores on sm_80+, FMA below
        c_mask = (rm[:, None] < M) & (rn[None, :] < N)
        tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty), mask=c_mask)

    @triton.jit
    def grouped_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                              stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
        # a 1-D grid whose program ids walk the tiles of C in groups of GROUP_M rows of tiles, column by column
        # inside a group (the mapping :func:`grouped_tile_order` writes out in Python), so programs that run at
        # the same time share rows of A and columns of B in the L2 cache
        pid = tl.program_id(axis=0)
        tiles_m = tl.cdiv(M, BLOCK_M)
        tiles_n = tl.cdiv(N, BLOCK_N)
        in_group = GROUP_M * tiles_n
        first_m = (pid // in_group) * GROUP_M
        rows = tl.minimum(tiles_m - first_m, GROUP_M)  # the last group may be shorter
        pid_m = first_m + (pid % in_group) % rows
        pid_n = (pid % in_group) // rows
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            a_mask = (rm[:, None] < M) & (k0 + rk[None, :] < K)
            b_mask = (k0 + rk[:, None] < K) & (rn[None, :] < N)
            a = tl.load(a_ptr + rm[:, None] * stride_am + (k0 + rk[None, :]) * stride_ak, mask=a_mask, other=0.0)
            b = tl.load(b_ptr + (k0 + rk[:, None]) * stride_bk + rn[None, :] * stride_bn, mask=b_mask, other=0.0)
            acc += tl.dot(a, b)
        c_mask = (rm[:, None] < M) & (rn[None, :] < N)
        tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


def vector_add(x: torch.Tensor, y: torch.Tensor, block_size: int = 1024) -> torch.Tensor:
    """x + y with :func:`add_kernel`: one program per ``block_size`` elements."""
    _check_tensors(x, y)
    _check_power_of_two("block_size", block_size)
    if x.shape != y.shape or x.dtype != y.dtype:
        raise ValueError(f"x and y need one shape and dtype, got {tuple(x.shape)} {x.dtype} and {tuple(y.shape)} {y.dtype}")
    x, y = x.contiguous(), y.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    add_kernel[(triton.cdiv(n, block_size),)](x, y, out, n, BLOCK=block_size)
    return out


def strided_copy(x: torch.Tensor, stride: int, block_size: int = 1024) -> torch.Tensor:
    """out[i] = x[(i * stride) % n] for a 1-D tensor: stride 1 is a plain, coalesced copy."""
    _check_tensors(x)
    _check_power_of_two("block_size", block_size)
    if x.dim() != 1 or isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise ValueError(f"need a 1-D tensor and an int stride >= 1, got shape {tuple(x.shape)} and stride {stride!r}")
    x = x.contiguous()
    out = torch.empty_like(x)
    strided_copy_kernel[(triton.cdiv(x.numel(), block_size),)](x, out, x.numel(), stride, BLOCK=block_size)
    return out


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Row-wise softmax of a 2-D tensor in one fused kernel: each row is read once and written once.

    Rows may be strided (a row stride other than the row length); the columns of a row must be adjacent
    in memory, so a transposed or column-strided input is copied first."""
    _check_tensors(x)
    if x.dim() != 2:
        raise ValueError(f"softmax works on a 2-D tensor (rows, columns), got shape {tuple(x.shape)}")
    _check_float("x", x)
    n_rows, n_cols = x.shape
    if n_cols == 0:
        raise ValueError(f"a softmax over no columns has no value, got shape {tuple(x.shape)}")
    block = triton.next_power_of_2(n_cols)
    if block > 65536:
        raise ValueError(f"rows of {n_cols} elements do not fit one program; this kernel handles up to 65,536")
    if x.stride(1) != 1:  # the kernel steps through a row one element at a time
        x = x.contiguous()
    out = torch.empty(n_rows, n_cols, device=x.device, dtype=x.dtype)  # contiguous, whatever x's strides
    num_warps = 4 if block < 2048 else 8 if block < 4096 else 16
    softmax_kernel[(n_rows,)](out, x, x.stride(0), out.stride(0), n_cols, BLOCK=block, num_warps=num_warps)
    return out


def _check_matmul(a: torch.Tensor, b: torch.Tensor, block_m: int, block_n: int, block_k: int,
                  num_warps: int) -> None:
    """The checks :func:`matmul` and :func:`grouped_matmul` share: two float matrices that multiply, tiles that
    ``tl.dot`` takes (powers of two, at least 16), a power-of-two warp count."""
    _check_tensors(a, b)
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"need (M, K) and (K, N) matrices, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise ValueError(f"a and b need one dtype, got {a.dtype} and {b.dtype}")
    _check_float("a", a)
    for name, size in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        _check_power_of_two(name, size, least=16)
    _check_power_of_two("num_warps", num_warps)


def matmul(a: torch.Tensor, b: torch.Tensor, block_m: int = 64, block_n: int = 64, block_k: int = 32,
           num_warps: int = 4, num_stages: int = 3) -> torch.Tensor:
    """(M, K) @ (K, N) with a tiled kernel; accumulates in float32, returns a's dtype.

    Block sizes must be powers of two and at least 16 (what ``tl.dot`` needs). ``num_warps`` and
    ``num_stages`` (software pipelining of the loads) matter only when compiled for a GPU. On an sm_80 or
    newer GPU, float32 inputs multiply in TF32 on tensor cores (Triton's default), as with
    ``torch.set_float32_matmul_precision("high")``; below sm_80 (a T4), Triton >= 3.2 runs ``tl.dot`` on
    the FMA units (:func:`triton_dot_uses_tensor_cores`).
    """
    _check_matmul(a, b, block_m, block_n, block_k, num_warps)
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
        raise ValueError(f"num_stages must be an int >= 1, got {num_stages!r}")
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty(M, N, device=a.device, dtype=a.dtype)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                        c.stride(0), c.stride(1), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                        num_warps=num_warps, num_stages=num_stages)
    return c


def grouped_tile_order(tiles_m: int, tiles_n: int, group_m: int) -> list[tuple[int, int]]:
    """The (row, column) tile of C that each program id of :func:`grouped_matmul_kernel` computes, in program-id
    order: the tiles in groups of ``group_m`` rows of tiles, each group walked column by column. ``group_m = 1``
    is plain row-major order (program 0 takes (0, 0), program 1 (0, 1), ...). Written out here, from the same
    arithmetic as the kernel, so the order can be drawn and its cache reuse counted without a GPU."""
    for name, value in (("tiles_m", tiles_m), ("tiles_n", tiles_n), ("group_m", group_m)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    order = []
    in_group = group_m * tiles_n
    for pid in range(tiles_m * tiles_n):
        first_m = (pid // in_group) * group_m
        rows = min(tiles_m - first_m, group_m)
        order.append((first_m + (pid % in_group) % rows, (pid % in_group) // rows))
    return order


def wave_working_set(order: list[tuple[int, int]], wave: int) -> list[int]:
    """For each wave of ``wave`` programs running at once (the first ``wave`` ids of ``order``, then the next
    ...), how many distinct row blocks of A plus column blocks of B its tiles read: the panels the L2 cache
    must hold for the wave to reuse them. A wave of w programs in row-major order, on rows of tiles longer
    than w, reads 1 or 2 row blocks and w column blocks; in grouped order with ``group_m`` = sqrt(w) it reads
    sqrt(w) of each: 2·sqrt(w) panels instead of about w + 1 (``tests/test_kernels_grouped.py``)."""
    if isinstance(wave, bool) or not isinstance(wave, int) or wave < 1:
        raise ValueError(f"wave must be an int >= 1, got {wave!r}")
    return [len({m for m, _ in order[i:i + wave]}) + len({n for _, n in order[i:i + wave]})
            for i in range(0, len(order), wave)]


def grouped_matmul(a: torch.Tensor, b: torch.Tensor, block_m: int = 64, block_n: int = 64, block_k: int = 32,
                   group_m: int = 8, num_warps: int = 4, num_stages: int = 3) -> torch.Tensor:
    """:func:`matmul` with the tiles of C launched in grouped order (:func:`grouped_tile_order`), as Triton's
    matmul tutorial does: the same result, different cache behaviour on a GPU (the GPU suite times both)."""
    _check_matmul(a, b, block_m, block_n, block_k, num_warps)
    if isinstance(group_m, bool) or not isinstance(group_m, int) or group_m < 1:
        raise ValueError(f"group_m must be an int >= 1, got {group_m!r}")
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty(M, N, device=a.device, dtype=a.dtype)
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
    grouped_matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                c.stride(0), c.stride(1), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                                GROUP_M=group_m, num_warps=num_warps, num_stages=num_stages)
    return c


# --------------------------------------------------------------------------- CUDA C

CUDA_ADD_SOURCE = r"""
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

// The kernel of the second article this course started from: y = x + y with a grid-stride loop.
__global__ void add_kernel(int64_t n, const float *x, float *y) {
    // 64-bit indices: a tensor may hold more than 2^31 elements
    int64_t index = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;  // this thread's first element
    int64_t stride = (int64_t)blockDim.x * gridDim.x;                // threads in the whole grid
    for (int64_t i = index; i < n; i += stride)                      // so any grid covers any n
        y[i] = x[i] + y[i];
}

torch::Tensor add(torch::Tensor x, torch::Tensor y, int64_t blocks, int64_t threads) {
    TORCH_CHECK(x.is_cuda() && y.is_cuda(), "x and y must be CUDA tensors");
    TORCH_CHECK(x.device() == y.device(), "x and y must be on the same GPU");
    TORCH_CHECK(x.scalar_type() == torch::kFloat && y.scalar_type() == torch::kFloat, "float32 only");
    TORCH_CHECK(x.numel() == y.numel(), "x and y need as many elements");
    const c10::cuda::CUDAGuard guard(x.device());  // launch on x's GPU, whichever GPU is current
    auto out = y.contiguous().clone();
    auto xc = x.contiguous();
    // on PyTorch's current stream of that GPU (not the legacy default stream), ordered with its other work
    add_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        out.numel(), xc.data_ptr<float>(), out.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();  // a launch that failed (say threads > 1024) raises here, not silently
    return out;
}
"""


@functools.lru_cache(maxsize=1)
def _compiled_cuda_add():
    from torch.utils.cpp_extension import load_inline

    return load_inline(name="gpuformer_cuda_add", cpp_sources="torch::Tensor add(torch::Tensor x, torch::Tensor y, "
                       "int64_t blocks, int64_t threads);", cuda_sources=CUDA_ADD_SOURCE, functions=["add"])


def cuda_add(x: torch.Tensor, y: torch.Tensor, blocks: int = 256, threads: int = 256) -> torch.Tensor:
    """x + y with the CUDA C kernel above (compiled on first use, which takes a minute): float32 tensors of
    one shape on one GPU, ``threads`` per block (1 to 1024, a multiple of 32 uses whole warps), ``blocks``
    >= 1 (the grid-stride loop covers any size with any grid)."""
    if x.shape != y.shape:
        raise ValueError(f"x and y need one shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.dtype != torch.float32 or y.dtype != torch.float32:
        raise ValueError(f"the CUDA C kernel adds float32 only, got {x.dtype} and {y.dtype}: convert with .float()")
    for name, value, most in (("threads", threads, 1024), ("blocks", blocks, 2**31 - 1)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise ValueError(f"{name} must be an int from 1 to {most} (a CUDA launch limit), got {value!r}")
    if not _compiled_cuda_add.cache_info().currsize:  # until it is built: the check starts nvcc and ninja
        ok, reason = _cuda_c_support()
        if not ok:
            raise KernelUnavailableError(f"The CUDA C kernel cannot be compiled here: it {reason}.")
    if x.device != y.device or x.device.type != "cuda":
        raise ValueError(f"x and y must be on one CUDA GPU, got {x.device} and {y.device}: move them with .cuda()")
    return _compiled_cuda_add().add(x, y, blocks, threads)


# --------------------------------------------------------------------------- predicting the Triton product

TRITON_TENSOR_CORE_MIN_CC = (8, 0)
"""Triton >= 3.2 compiles ``tl.dot`` to tensor-core instructions only from this compute capability on; below
it (Turing, sm_75: the T4) it falls back to FMA on the CUDA cores (triton-lang/triton PR #5066,
"Deprecate MMAv1; fallback to FMA for computeCapability < 80")."""


def triton_dot_uses_tensor_cores(gpu: str) -> bool:
    """Whether Triton's ``tl.dot`` runs on tensor cores on ``gpu`` (a name of ``occupancy.GPUS``, e.g. ``'T4'``)."""
    from gpuformer_lib import occupancy

    arch = occupancy.limits(gpu).arch  # 'sm_75', 'sm_90'
    cc = int(arch[3:])
    return (cc // 10, cc % 10) >= TRITON_TENSOR_CORE_MIN_CC


@dataclasses.dataclass(frozen=True)
class MatmulPrediction:
    """The course's predictor on one (m, k) x (k, n) product (each operand read once, the result written once)."""

    flops: int
    nbytes: int
    seconds: float
    bound: str
    """``'compute'`` or ``'memory'``: which of the two sets the time."""

    @property
    def flops_per_second(self) -> float:
        return self.flops / self.seconds


def triton_matmul_prediction(m: int, n: int, k: int, dtype: torch.dtype, gpu: str) -> tuple[MatmulPrediction, bool]:
    """The course's predictor (``predict.kernel_time``) on :func:`matmul` (this chapter's Triton kernel) on
    ``gpu``: the achievable tensor-core rate where ``tl.dot`` uses tensor cores, the CUDA cores' achievable
    float32 rate where it falls back to FMA (a T4). Returns the prediction and whether tensor cores were
    assumed."""
    from gpuformer_lib import predict

    tensor_cores = triton_dot_uses_tensor_cores(gpu)
    flops = 2 * m * n * k
    nbytes = (m * k + k * n + m * n) * torch.empty((), dtype=dtype).element_size()
    seconds, bound = predict.kernel_time(flops, nbytes, gpu, predict.format_of(dtype), matrix=tensor_cores)
    return MatmulPrediction(flops, nbytes, seconds, bound), tensor_cores
