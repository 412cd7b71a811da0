"""Checks for the exercises on writing GPU kernels and placing them on the roofline (chapter 2)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from gpuformer_lib.exercises._core import CheckResult, _close, _describe, _report, _safe_check, _try


def _kernel_device() -> str:
    from gpuformer_lib.kernels import kernel_support

    return "cuda" if kernel_support().triton_mode == "compiled" else "cpu"


_BLOCK, _GUARD = 1024, 2048


def _kernel_problem(kernel: Any) -> str | None:
    """Why ``kernel`` cannot be launched here (no Triton, or not a ``@triton.jit`` kernel), or None."""
    from gpuformer_lib.kernels import kernel_support

    support = kernel_support()
    if support.triton_mode == "unavailable":
        return f"Triton cannot run here: {support.triton_reason}"
    from triton.runtime.jit import KernelInterface  # what @triton.jit (or @triton.autotune) makes

    if not isinstance(kernel, KernelInterface):
        return f"Pass your kernel itself, the function decorated with @triton.jit, not {_describe(kernel)}."
    return None


def _launch_guarded(kernel: Any, n: int, input_names: tuple[str, ...]
                    ) -> tuple[list[torch.Tensor], torch.Tensor, bool, str | None]:
    """Launch ``kernel(*inputs, out, n, BLOCK=1024)`` on views into larger buffers, so that reads and
    writes past the end land in memory the check owns (an unmasked kernel would otherwise crash the
    process). Returns the inputs as they were before the launch, the output, whether anything was
    written past n, and a hint if the launch failed, ran out of time or wrote into an input.
    A kernel that never ends on a GPU cannot be interrupted: the time limit (6 x the checks' limit, for
    the compilation) covers the launch only; in Triton's interpreter on a CPU it covers the run too."""
    import triton

    device = _kernel_device()
    buffers = [torch.randn(n + _GUARD, device=device) for _ in input_names]
    before = [b.clone() for b in buffers]
    out_buffer = torch.full((n + _GUARD,), float("nan"), device=device)
    inputs, out = [b[:n] for b in buffers], out_buffer[:n]
    # the first launch compiles the kernel (seconds on a GPU), so it gets more time than a Python function
    _, err = _try(lambda: kernel[(triton.cdiv(n, _BLOCK),)](*inputs, out, n, BLOCK=_BLOCK), none_ok=True,
                  time_scale=6.0)
    kept = [b[:n] for b in before]
    if err:
        return kept, out, False, "Launching your kernel failed: " + err.replace("Your function", "it", 1)
    for name, buffer, original in zip(input_names, buffers, before):
        if not torch.equal(buffer, original):
            return kept, out, False, (f"Your kernel wrote into {name}, an input: store the result through out_ptr "
                                      "only, so the caller's tensors stay as they were.")
    return kept, out, not torch.isnan(out_buffer[n:]).all().item(), None


@_safe_check
def check_masked_add(kernel) -> CheckResult:
    """``kernel`` is your fixed ``@triton.jit`` add kernel, arguments ``(x_ptr, y_ptr, out_ptr, n, BLOCK)``.

    The check launches it with BLOCK = 1024 on several lengths, inside larger buffers, so a missing
    mask is reported instead of crashing the notebook.
    """
    problem = _kernel_problem(kernel)
    if problem:
        return _report(False, problem)
    results, past_end = {}, {}
    for n in (4096, 1000, 5000, 1):
        (x, y), out, wrote_past, err = _launch_guarded(kernel, n, ("x_ptr", "y_ptr"))
        if err:
            return _report(False, err)
        results[n], past_end[n] = torch.equal(out, x + y), wrote_past
    if all(results.values()) and not any(past_end.values()):
        return _report(True, "Masked loads and stores: the last block stops at n, whatever n is.")
    if any(past_end.values()):
        return _report(False, "Your kernel writes past the end of the output when n is not a multiple of BLOCK: "
                              "on a GPU that corrupts other tensors or crashes. Store with mask=offsets < n "
                              "(and load with it too).")
    if results[4096]:
        return _report(False, f"Right for n = 4096, wrong for {[n for n, ok in results.items() if not ok]}: "
                              "check the mask, offsets < n.")
    return _report(False, "Wrong even for n = 4096 (four full blocks): check the offsets, "
                          "pid * BLOCK + tl.arange(0, BLOCK).")


@_safe_check
def check_gelu_kernel(kernel) -> CheckResult:
    """``kernel`` is your ``@triton.jit`` GELU kernel (tanh approximation), arguments ``(x_ptr, out_ptr, n, BLOCK)``."""
    problem = _kernel_problem(kernel)
    if problem:
        return _report(False, problem)
    for n in (1000, 4099):
        (x,), out, wrote_past, err = _launch_guarded(kernel, n, ("x_ptr",))
        if err:
            return _report(False, err)
        if wrote_past:
            return _report(False, "Your kernel writes past the end of the output: store with mask=offsets < n.")
        want = F.gelu(x, approximate="tanh")
        if torch.allclose(out, want, rtol=1e-5, atol=1e-5):
            continue
        if torch.allclose(out, F.gelu(x), rtol=1e-3, atol=1e-3):
            return _report(False, "Close to the exact (erf) GELU; the exercise asks for the tanh approximation, "
                                  "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).")
        return _report(False, "Compare with F.gelu(x, approximate='tanh'); note that 0.5 (1 + tanh(z)) = sigmoid(2z).")
    return _report(True, "One read, one write per element: GELU fused into a single pass over memory.")


# (FLOPs per element, bytes per element) of each kernel, and the dtype's size, for check_kernel_roofline
KERNEL_COSTS = {
    "vector add, float32": (1, 12),  # read x and y, write out: 3 x 4 bytes
    "fused softmax, float32": (5, 8),  # read once, write once; max, subtract, exp, sum, divide
    "tiled matmul 4096 x 4096 x 4096, float16": (2 * 4096, 3 * 2),  # per element of C: 2K FLOPs; A, B, C once
}


@_safe_check
def check_kernel_roofline(answers: dict[str, tuple[float, str]], peak_flops: float = 989.4e12,
                          bandwidth: float = 3.35e12) -> CheckResult:
    """``answers`` maps each kernel in :data:`KERNEL_COSTS` to (FLOP per byte, "memory" or "compute")
    on a GPU with these ceilings (default: an H100 SXM, dense bf16/fp16 and HBM3)."""
    if not isinstance(answers, dict):
        return _report(False, "Pass a dict that maps each name in KERNEL_COSTS to a pair (FLOP per byte, 'memory' or "
                              f"'compute'), not {_describe(answers)}.")
    ridge = peak_flops / bandwidth
    for name, (flops, nbytes) in KERNEL_COSTS.items():
        if name not in answers:
            return _report(False, f"Answer every kernel; missing {name!r}.")
        try:
            intensity, bound = answers[name]
        except (TypeError, ValueError):
            return _report(False, f"Answer {name!r} with a pair: (FLOP per byte, 'memory' or 'compute').")
        want = flops / nbytes
        if not _close(intensity, want, rel=0.02):
            if _close(intensity, nbytes / flops, rel=0.02):
                return _report(False, f"{name}: upside down; intensity is FLOPs divided by bytes.")
            return _report(False, f"{name}: intensity {intensity!r} is off; count {flops} FLOP and {nbytes} bytes "
                                  "moved per output element.")
        want_bound = "compute" if want > ridge else "memory"
        if str(bound).strip().lower() != want_bound:
            return _report(False, f"{name}: {want:.3g} FLOP/byte against a ridge of {ridge:.0f} FLOP/byte is "
                                  f"{want_bound}-bound.")
    return _report(True, f"Only the matrix product clears the ridge ({ridge:.0f} FLOP/byte); element-wise and "
                         "row-wise kernels are judged by GB/s, not FLOP/s.")
