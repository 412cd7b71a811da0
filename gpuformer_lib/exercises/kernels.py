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
                    ) -> tuple[list[torch.Tensor], torch.Tensor, int, str | None]:
    """Launch ``kernel(*inputs, out, n, BLOCK=1024)`` on views into larger buffers, so that reads and
    writes past the end land in memory the check owns (an unmasked kernel would otherwise crash the
    process). Returns the inputs as they were before the launch, the output, how many elements were
    written past n (0: none), and a hint if the launch failed, ran out of time or wrote into an input.
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
        hint = "Launching your kernel failed: " + err.replace("Your function", "it", 1)
        from gpuformer_lib.kernels import TOO_LATE, kernel_support

        if "outside of the scope of a kernel" in err and TOO_LATE in kernel_support().triton_reason:
            hint += " (" + TOO_LATE.lstrip("; ") + ".)"
        return kept, out, 0, hint
    for name, buffer, original in zip(input_names, buffers, before):
        if not torch.equal(buffer, original):
            return kept, out, 0, (f"Your kernel wrote into {name}, an input: store the result through out_ptr "
                                  "only, so the caller's tensors stay as they were.")
    return kept, out, int((~torch.isnan(out_buffer[n:])).sum().item()), None


def _past_end_hint(written_past: dict[int, int]) -> str:
    """The hint for a kernel that stored past n: one element past the end is ``offsets <= n``."""
    if set(written_past.values()) == {1}:
        return ("Your kernel writes one element past the end of the output: off by one. Offsets run from 0 to "
                "n - 1, so the mask is offsets < n, not offsets <= n.")
    return ("Your kernel writes past the end of the output when n is not a multiple of BLOCK: on a GPU that "
            "corrupts other tensors or crashes. Store with mask=offsets < n (and load with it too).")


def _unmasked_loads(kernel: Any) -> int:
    """How many ``tl.load`` calls in the kernel's source take neither a mask nor a boundary check. Reads past
    the end leave no trace in the output (the store is masked), so the check reads the source: on a GPU such
    a read can fault or read another tensor's memory."""
    import ast
    import textwrap

    import inspect
    import types

    src, layer = None, kernel
    for _ in range(3):  # a JITFunction has .src; the interpreter's function, and @triton.autotune, hold .fn
        if isinstance(getattr(layer, "src", None), str):
            src = layer.src
            break
        if isinstance(layer, types.FunctionType):
            try:
                src = inspect.getsource(layer)
            except (OSError, TypeError):
                pass
            break
        layer = getattr(layer, "fn", None)
    try:
        tree = ast.parse(textwrap.dedent(src or ""))
    except (SyntaxError, TypeError, ValueError):
        return 0
    count = 0
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load"
                and len(node.args) < 2 and not {k.arg for k in node.keywords} & {"mask", "boundary_check"}):
            count += 1
    return count


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
    if any(past_end.values()):
        return _report(False, _past_end_hint({n: k for n, k in past_end.items() if k}))
    if all(results.values()):
        if _unmasked_loads(kernel):
            return _report(False, "The stores are masked, but a load is not: the last block still reads past the "
                                  "end of x and y. On a GPU that read can fault (an illegal memory access) or read "
                                  "another tensor; the masked store only hides it. Load with mask=offsets < n too.")
        return _report(True, "Masked loads and stores: the last block stops at n, whatever n is.")
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
            return _report(False, _past_end_hint({n: wrote_past}))
        want = F.gelu(x, approximate="tanh")
        if torch.allclose(out, want, rtol=1e-5, atol=1e-5):
            continue
        z = 0.7978845608028654 * (x + 0.044715 * x**3)  # sqrt(2 / pi) (x + 0.044715 x^3)
        if torch.allclose(out, F.gelu(x), rtol=1e-3, atol=1e-3):
            return _report(False, "Close to the exact (erf) GELU; the exercise asks for the tanh approximation, "
                                  "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).")
        if torch.allclose(out, x * torch.sigmoid(z), rtol=1e-4, atol=1e-5):
            return _report(False, "You wrote x·sigmoid(z): the identity is 0.5 (1 + tanh(z)) = sigmoid(2z), so the "
                                  "argument of the sigmoid is 2z, twice sqrt(2/pi) (x + 0.044715 x^3).")
        if torch.allclose(out, torch.sigmoid(2 * z), rtol=1e-4, atol=1e-5):
            return _report(False, "That is 0.5 (1 + tanh(z)) alone, a gate between 0 and 1: GELU multiplies it by "
                                  "x, x·sigmoid(2z).")
        if torch.allclose(out, x * torch.sigmoid(1.702 * x), rtol=1e-4, atol=1e-5):
            return _report(False, "That is the sigmoid approximation x·sigmoid(1.702 x) ('quick GELU'), another "
                                  "curve: the exercise asks for the tanh approximation, x·sigmoid(2z) with "
                                  "z = sqrt(2/pi) (x + 0.044715 x^3).")
        return _report(False, "Compare with F.gelu(x, approximate='tanh'); note that 0.5 (1 + tanh(z)) = sigmoid(2z).")
    if _unmasked_loads(kernel):
        return _report(False, "The store is masked, but the load is not: the last block still reads past the end "
                              "of x, which on a GPU can fault. Load with mask=offsets < n too.")
    return _report(True, "One read, one write per element: GELU fused into a single pass over memory.")


# (FLOPs per element, bytes per element) of each kernel, and the dtype's size, for check_kernel_roofline
KERNEL_COSTS = {
    "vector add, float32": (1, 12),  # read x and y, write out: 3 x 4 bytes
    "fused softmax, float32": (5, 8),  # read once, write once; max, subtract, exp, sum, divide
    "tiled matmul 4096 x 4096 x 4096, float16": (2 * 4096, 3 * 2),  # per element of C: 2K FLOPs; A, B, C once
}


@_safe_check
def check_kernel_roofline(answers: dict[str, tuple[float, str]], peak_flops: float | None = None,
                          bandwidth: float = 3.35e12) -> CheckResult:
    """``answers`` maps each kernel in :data:`KERNEL_COSTS` to (FLOP per byte, "memory" or "compute")
    on an H100 SXM (HBM3, 3.35 TB/s). Each kernel is judged against the roof it runs under: the float16
    matrix product against the tensor cores (989 TFLOP/s), the float32 element-wise and row-wise kernels
    against the CUDA cores' float32 rate (67 TFLOP/s). ``peak_flops``, if given, is one roof for all."""
    if not isinstance(answers, dict):
        return _report(False, "Pass a dict that maps each name in KERNEL_COSTS to a pair (FLOP per byte, 'memory' or "
                              f"'compute'), not {_describe(answers)}.")
    for name, (flops, nbytes) in KERNEL_COSTS.items():
        ridge = (peak_flops if peak_flops is not None else _roof("H100 SXM", name)) / bandwidth
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
    return _report(True, f"Only the matrix product clears its ridge (tensor cores: {ridge:.0f} FLOP/byte); the "
                         "element-wise and row-wise kernels stay below even the CUDA cores' ridge (about 20) and are "
                         "judged by GB/s, not FLOP/s.")


def _roof(gpu: str, name: str) -> float:
    """The compute roof of kernel ``name`` on ``gpu``: tensor cores for a matrix product, CUDA-core float32
    for element-wise and row-wise kernels (which compute in float32 whatever they store)."""
    from gpuformer_lib.predict.roofline import datasheet_ceiling as compute_ceiling

    matmul = "matmul" in name
    return compute_ceiling(gpu, torch.float16 if matmul and "float16" in name else torch.float32, tensor_cores=matmul)


# --------------------------------------------------------------------------- two roofs, two GPUs

from gpuformer_lib.exercises._answers import _number  # noqa: E402  (appended section)

# (FLOPs per output element, bytes moved per output element): a float16 product (M, K) x (K, N) with
# perfect tiling reads A and B and writes C once, (MK + KN + MN) x 2 bytes, spread over MN outputs
KERNEL_ROOF_COSTS = {
    "vector add, float32": (1, 12),
    "fused softmax, float32": (5, 8),
    "degree-128 polynomial (Horner), float32": (256, 8),  # 128 multiply-adds per element; read 4 B, write 4 B
    "tiled matmul 768 x 768 x 768, float16": (2 * 768, 3 * 768**2 * 2 / 768**2),
    "tiled matmul 4096 x 4096 x 4096, float16": (2 * 4096, 3 * 4096**2 * 2 / 4096**2),
}
ROOF_GPUS = ("T4", "H100 SXM")


@_safe_check
def check_kernel_roofs(answers: dict[str, tuple[float, str, str]]) -> CheckResult:
    """``answers`` maps each kernel in :data:`KERNEL_ROOF_COSTS` to (FLOP per byte, bound on a T4, bound on
    an H100 SXM), each bound ``"memory"`` or ``"compute"``. A kernel is judged against the roof it runs
    under: matrix products on tensor cores, element-wise and row-wise float32 kernels on CUDA cores."""
    from gpuformer_lib.predict.roofline import datasheet_bandwidth as bandwidth, datasheet_ceiling as compute_ceiling

    if not isinstance(answers, dict):
        return _report(False, "Pass a dict that maps each name in KERNEL_ROOF_COSTS to (FLOP per byte, bound on "
                              f"a T4, bound on an H100 SXM), not {_describe(answers)}.")
    for name, (flops, nbytes) in KERNEL_ROOF_COSTS.items():
        if name not in answers:
            return _report(False, f"Answer every kernel; missing {name!r}.")
        try:
            intensity, *bounds = answers[name]
        except (TypeError, ValueError):
            return _report(False, f"Answer {name!r} with a triple: (FLOP per byte, bound on T4, bound on H100 SXM).")
        if len(bounds) != 2:
            return _report(False, f"Answer {name!r} with a triple: (FLOP per byte, bound on T4, bound on H100 SXM).")
        want = flops / nbytes
        value, hint = _number(intensity)
        if hint:
            return _report(False, f"{name}: the intensity is a number (FLOP per byte), not {_describe(intensity)}.")
        if not _close(value, want, rel=0.02):
            for wrong, why in _intensity_mistakes(name, flops, nbytes):
                if _close(value, wrong, rel=0.02):
                    return _report(False, f"{name}: intensity {value:.3g} is off. {why}")
            return _report(False, f"{name}: intensity {value:.3g} is off. Count the FLOPs one output element "
                                  "costs and the bytes moved for it (everything read and written), then divide.")
        matmul = "matmul" in name
        dtype = torch.float16 if matmul else torch.float32
        for gpu, bound in zip(ROOF_GPUS, bounds):
            ridge = compute_ceiling(gpu, dtype, tensor_cores=matmul) / bandwidth(gpu)
            other = compute_ceiling(gpu, torch.float16, tensor_cores=not matmul) / bandwidth(gpu)  # the wrong roof
            right = "compute" if want > ridge else "memory"
            if str(bound).strip().lower() == right:
                continue
            why = (f"{name} on the {gpu}: {want:.3g} FLOP/byte against the "
                   f"{'tensor-core' if matmul else 'CUDA-core float32'} ridge of {ridge:.0f} FLOP/byte is {right}-bound.")
            if matmul:  # the usual slip: one GPU's ridge carried over to the other
                ridges = {g: compute_ceiling(g, dtype, tensor_cores=True) / bandwidth(g) for g in ROOF_GPUS}
                why += (" Each GPU has its own ridge: the tensor-core ridges are " + " and ".join(
                    f"{r:.0f} on the {g}" for g, r in ridges.items()) + " FLOP/byte (peak over bandwidth).")
            elif ("compute" if want > other else "memory") == str(bound).strip().lower():
                why += (f" You judged it against the other roof ({other:.0f} FLOP/byte): an element-wise float32 "
                        "kernel never runs on tensor cores; its roof is the CUDA cores' float32 rate.")
            return _report(False, why)
    return _report(True, "Two roofs, two GPUs: the polynomial is compute-bound on the CUDA cores though it would "
                         "be 'memory-bound' against the tensor-core peak, and the 768-cube product clears the T4's "
                         "lower tensor-core ridge but not the H100's. Each kernel has the roof of the units it runs on.")


def _intensity_mistakes(name: str, flops: float, nbytes: float) -> list[tuple[float, str]]:
    """The intensities the usual mistakes give for a kernel of :data:`KERNEL_ROOF_COSTS`, each with its hint,
    in the order they are tried."""
    matmul = "matmul" in name
    itemsize = 2 if matmul else 4
    mistakes = [(nbytes / flops, "Upside down: intensity is FLOPs divided by bytes."),
                (float(flops), "That is FLOPs per element; intensity divides them by the bytes each element "
                               "moves.")]
    if matmul:
        k = flops / 2
        mistakes += [
            (flops / (nbytes - itemsize), "The write of C is missing: a perfectly tiled product reads A and B "
                                          "once and writes C once, all three count."),
            (flops / (2 * nbytes), "Half the intensity: a multiply-add is 2 FLOPs, and a float16 element is 2 "
                                   "bytes, not 4."),
            (flops / (2 * k * itemsize + itemsize), "That is the product without reuse: each output reading its "
                                                    "own row of A and column of B from memory. Tiling reads A "
                                                    "and B once: count (MK + KN + MN) elements for MN outputs."),
        ]
    else:
        mistakes.append((flops / (nbytes - itemsize), "The write is missing: the output element is stored to "
                                                      "memory (4 bytes in float32), and counts as much as a read."))
        if "Horner" in name:
            mistakes.append((flops / 2 / nbytes, "Half the FLOPs: each of Horner's steps is a multiply-add, 2 FLOPs "
                                                 "(a multiply and an add)."))
    return mistakes


# --------------------------------------------------------------------------- predict, then measure


STRIDED_SECTOR_BYTES = 32
"""What a GPU moves at once (a sector of a 128-byte line); a CPU's 64-byte line gives the same count at stride 8,
where two of the elements read share a line."""


def strided_gather_bytes(stride: int, sector: int = STRIDED_SECTOR_BYTES) -> int:
    """Bytes moved per element by the gather ``out = x[idx]`` of float32 ``x`` with int64 ``idx = arange(n) *
    stride``: 8 of index and 4 of output, and of x 4 bytes times the stride, at most one whole ``sector`` (past
    that, each element pulls in its own sector)."""
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise ValueError(f"stride must be an int >= 1, got {stride!r}")
    return 8 + min(4 * stride, sector) + 4


def check_strided_copy_prediction(predicted, measured, stride: int,
                                  measured_by: str = "this device measured") -> CheckResult:
    """Grade a predicted time ratio: a gather of n float32 elements ``out = x[idx]`` with ``idx = arange(n) *
    stride`` (int64) over the same gather with stride 1. Both run the same code, so the ratio is what the memory
    traffic makes it: the bytes :func:`strided_gather_bytes` counts at that stride over those at stride 1,
    graded within 5 % (rounding), each usual mistake (the index or the write left out, bytes used instead of
    sectors fetched, a 64-byte line per element, the stride itself) named. The measured ratio (a number, or a
    function of no arguments that measures it) is shown beside the model, not graded: timings spread over more
    than the gap between the right count and the wrong ones (a CPU measures 2-5x)."""
    from gpuformer_lib.exercises.predictions import grade_model

    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 2:
        raise ValueError(f"stride must be an int >= 2 (stride 1 is the baseline), got {stride!r}")
    x_bytes = min(4 * stride, STRIDED_SECTOR_BYTES)
    right = strided_gather_bytes(stride) / strided_gather_bytes(1)
    wrong = {
        "counting only the bytes used": (
            1.0, f"Count the bytes fetched, not the bytes used: with stride {stride} every 4-byte element of x "
                 f"pulls in {x_bytes} bytes of its sector, {x_bytes // 4}x the reads of x."),
        "leaving out the index": (
            (x_bytes + 4) / (4 + 4), "Count the index too: both gathers read 8 bytes of int64 index per "
                                     "element, which dilutes the growth of the reads of x."),
        "a 64-byte line per element": (
            (8 + 64 + 4) / 16, f"A CPU moves 64-byte lines, but at stride {stride} the elements read are "
                               f"{4 * stride} bytes apart: {max(64 // (4 * stride), 1)} share a line, so each "
                               "costs at most 32 bytes, as on a GPU, where a 32-byte sector is the unit."),
        "the stride alone": (
            float(stride), "Only the reads of x grow with the stride, and only up to the size of what memory "
                           "moves at once (a 32-byte sector): the index (8 bytes per element) and the write "
                           "(4 bytes) are the same in both gathers."),
        "leaving out the write": (
            (8 + x_bytes) / (8 + 4), "Count the write too: both gathers store 4 bytes per element."),
        "an upside-down ratio": (
            1 / right, "Upside down: the strided gather moves more bytes, so its time over the stride-1 time is "
                       "above 1."),
    }
    if 4 * stride >= 64:  # each element in its own line: not a mistake on a CPU
        del wrong["a 64-byte line per element"]
    rel = 0.05
    wrong = {name: entry for name, entry in wrong.items() if abs(entry[0] / right - 1) > 2 * rel}
    value = measured() if callable(measured) else measured
    return grade_model(
        predicted, right, quantity=f"the stride-{stride} gather's time over the stride-1 gather's", unit="x",
        wrong=wrong, rel=rel, measured=value, measured_by=measured_by,
        too_high=("Only the reads of x grow with the stride, and only up to the size of what memory moves at once "
                  "(a 32-byte sector on a GPU): past that, one element costs one sector."),
        too_low=("Count the bytes fetched, not the bytes used, and count everything: per element the stride-1 "
                 "gather reads 8 bytes of index and 4 of x and writes 4."),
        why_close=(f"Bytes per element: 8 + {x_bytes} + 4 = {strided_gather_bytes(stride)} against 8 + 4 + 4 = "
                   "16. A measurement strays from the model: a CPU's prefetcher and a GPU's caches hide part of "
                   "the waste, and a gather that jumps through memory waits on latency as well as on bandwidth."))


def check_occupancy_prediction(answers, threads_per_block: int, regs_per_thread: int, smem_per_block: int,
                               blocks: int) -> CheckResult:
    """``answers`` maps ``'T4'`` and ``'H100 SXM'`` to (occupancy as a fraction, number of waves) of a
    launch of ``blocks`` blocks of ``threads_per_block`` threads, each thread using ``regs_per_thread``
    registers and each block ``smem_per_block`` bytes of shared memory; checked with
    :mod:`gpuformer_lib.occupancy`."""
    from gpuformer_lib import occupancy as occ

    @_safe_check
    def check(answers) -> CheckResult:
        """Answer ``{'T4': (occupancy, waves), 'H100 SXM': (occupancy, waves)}``."""
        if not isinstance(answers, dict) or set(answers) != set(occ.GPUS):
            return _report(False, f"Answer a dict with the keys {sorted(occ.GPUS)}, each (occupancy, waves); got "
                                  f"{_describe(answers)}.")
        for gpu in sorted(occ.GPUS, reverse=True):
            o = occ.occupancy(gpu, threads_per_block, regs_per_thread, smem_per_block)
            w = occ.waves(gpu, blocks, o)
            try:
                fraction, n_waves = answers[gpu]
            except (TypeError, ValueError):
                return _report(False, f"{gpu}: answer a pair (occupancy, waves).")
            value, hint = _number(fraction)
            if hint or not _close(value, o.occupancy, rel=0.01):
                if not hint and _close(value, o.warps_per_sm, rel=0.01):
                    return _report(False, f"{gpu}: that is the number of resident warps; occupancy is that over "
                                          f"the SM's maximum of {o.max_warps} warps.")
                lim = occ.limits(gpu)
                return _report(False, f"{gpu}: occupancy is off. Find the blocks per SM each resource allows: "
                                      f"{lim.max_blocks} block slots; {lim.max_warps} warps / warps per block; "
                                      f"{lim.registers:,} registers / (warps per block x registers per thread x 32); "
                                      f"{lim.smem_per_sm // 1024} KB of shared memory / (the block's bytes"
                                      + (f" + {lim.smem_reserved_per_block} reserved)" if lim.smem_reserved_per_block
                                         else ")") + "; the smallest wins.")
            value, hint = _number(n_waves)
            if hint or value != w.waves:
                return _report(False, f"{gpu}: the waves are off. {o.blocks_per_sm} blocks per SM x "
                                      f"{occ.sm_count(gpu)} SMs run at once; {blocks} blocks need the ceiling of "
                                      "blocks / that.")
        t4, h100 = (occ.occupancy(g, threads_per_block, regs_per_thread, smem_per_block) for g in ("T4", "H100 SXM"))
        return _report(True, f"T4: {t4.blocks_per_sm} blocks per SM, limited by {t4.limiter}; H100: "
                             f"{h100.blocks_per_sm}, limited by {h100.limiter}. The last wave's empty slots are the "
                             "tail effect: pick a grid that is a whole number of waves, or many waves.")

    return check(answers)


# --------------------------------------------------------------------------- what limits occupancy

OCCUPANCY_CHANGES = ("threads_per_block", "regs_per_thread", "smem_per_block")
"""The launch parameters an answer to :func:`check_occupancy_limiter` may change (one of them)."""


def check_occupancy_limiter(answers, threads_per_block: int, regs_per_thread: int, smem_per_block: int
                            ) -> CheckResult:
    """``answers`` maps ``'T4'`` and ``'H100 SXM'`` to (the resource that limits the kernel's occupancy,
    one change that doubles it): the resource one of ``'blocks'``, ``'warps'``, ``'registers'``,
    ``'shared memory'``; the change a dict with one key of :data:`OCCUPANCY_CHANGES` and its new value,
    e.g. ``{"regs_per_thread": 48}``. Checked with :mod:`gpuformer_lib.occupancy`: the change passes when
    the kernel still launches and its occupancy is at least twice what it was."""
    from gpuformer_lib import occupancy as occ

    base = dict(threads_per_block=threads_per_block, regs_per_thread=regs_per_thread, smem_per_block=smem_per_block)

    @_safe_check
    def check(answers) -> CheckResult:
        """Answer ``{'T4': (resource, {parameter: new value}), 'H100 SXM': (resource, {parameter: new value})}``."""
        if not isinstance(answers, dict) or set(answers) != set(occ.GPUS):
            return _report(False, f"Answer a dict with the keys {sorted(occ.GPUS)}, each (resource, change); got "
                                  f"{_describe(answers)}.")
        found = {}
        for gpu in sorted(occ.GPUS, reverse=True):
            o = occ.occupancy(gpu, **base)
            lim = occ.limits(gpu)
            try:
                resource, change = answers[gpu]
            except (TypeError, ValueError):
                return _report(False, f"{gpu}: answer a pair (resource, change), e.g. ('warps', "
                                      "{'threads_per_block': 128}).")
            allowed = ", ".join(repr(k) for k in o.limits_by)
            if str(resource).strip().lower() not in o.limits_by:
                return _report(False, f"{gpu}: name the resource as one of {allowed}, not {_describe(resource)}.")
            if str(resource).strip().lower() != o.limiter:
                return _report(False, f"{gpu}: not {resource!r}. Count the blocks per SM each resource allows: "
                                      f"{lim.max_blocks} block slots; {lim.max_warps} warps / warps per block; "
                                      f"{lim.registers:,} registers / (warps per block x registers per thread x 32); "
                                      f"{lim.smem_per_sm // 1024} KB of shared memory / (the block's bytes"
                                      + (f" + {lim.smem_reserved_per_block} reserved)" if lim.smem_reserved_per_block
                                         else ")") + "; the smallest is the limiter.")
            if not isinstance(change, dict) or len(change) != 1 or not set(change) <= set(OCCUPANCY_CHANGES):
                return _report(False, f"{gpu}: the change is a dict with one key of {OCCUPANCY_CHANGES} and its new "
                                      f"value, e.g. {{'regs_per_thread': 48}}; got {_describe(change)}.")
            (key, new), = change.items()
            value, hint = _number(new)
            if hint or not float(value).is_integer():
                return _report(False, f"{gpu}: {key} is a whole number, not {_describe(new)}.")
            try:
                changed = occ.occupancy(gpu, **{**base, key: int(value)})
            except ValueError as err:
                return _report(False, f"{gpu}: with {key} = {int(value)} the kernel does not launch: {err}.")
            if changed.occupancy < 2 * o.occupancy - 1e-9:
                return _report(False, f"{gpu}: {key} = {int(value)} gives {changed.occupancy:.0%} occupancy "
                                      f"({changed.blocks_per_sm} blocks per SM, now limited by {changed.limiter}), "
                                      f"not twice {o.occupancy:.0%}. Relieve the limiter ({o.limiter}) just enough "
                                      "that the next resource does not take over below twice as many warps.")
            found[gpu] = (o, changed, key, int(value))
        text = "; ".join(f"{gpu}: {o.blocks_per_sm} blocks per SM ({o.occupancy:.0%}), limited by {o.limiter}; "
                         f"{key} = {v:,} gives {c.blocks_per_sm} ({c.occupancy:.0%})" for gpu, (o, c, key, v) in found.items())
        return _report(True, f"{text}. The same kernel is limited by different resources on different GPUs, "
                             "so a tuning that doubles occupancy on one may do nothing on the other.")

    return check(answers)
