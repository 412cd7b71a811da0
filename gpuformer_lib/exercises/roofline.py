"""Checks for the roofline exercises (chapter 1): which roof limits an operation, with two compute roofs
(tensor cores for matrix products, CUDA cores for element-wise and row-wise kernels), and predict-then-
measure exercises that time an operation after predicting its time from this device's measured ceilings.

Leaves out: the measurements (the notebook makes them with ``bench`` and ``roofline``) and the one-line
formula checks (``hardware.check_matmul_flops``, ``check_attainable_flops``, ``check_speedup``).
"""

from __future__ import annotations

from gpuformer_lib.exercises._core import CheckResult, _describe, _report, _safe_check
from gpuformer_lib.exercises.predictions import grade_prediction

# An H100 SXM's datasheet ceilings (gpu_view.compute_ceiling / bandwidth): dense bf16 tensor cores, CUDA-core
# float32, HBM3.
H100_TENSOR_BF16 = 989.4e12
H100_CUDA_CORE_FP32 = 67e12
H100_BANDWIDTH = 3.35e12


def _matmul_intensity(m: int, n: int, k: int, itemsize: int) -> float:
    return 2 * m * n * k / ((m * k + k * n + m * n) * itemsize)


# name -> (FLOP per byte, runs on tensor cores)
TWO_ROOF_OPERATIONS: dict[str, tuple[float, bool]] = {
    "matmul (4096, 4096) @ (4096, 4096), bf16 on tensor cores": (_matmul_intensity(4096, 4096, 4096, 2), True),
    "matmul (256, 4096) @ (4096, 4096), bf16 on tensor cores": (_matmul_intensity(256, 4096, 4096, 2), True),
    "matmul (256, 4096) @ (4096, 4096), float32 with TF32 off (CUDA cores)": (_matmul_intensity(256, 4096, 4096, 4),
                                                                             False),
    "matmul (16, 4096) @ (4096, 4096), bf16 on tensor cores (one decoding step)": (_matmul_intensity(16, 4096, 4096, 2),
                                                                                   True),
    "softmax over a (8192, 8192) bf16 score matrix": (5 / 4, False),
    "layer norm over (8192, 4096) bf16 activations": (8 / 4, False),
    "residual add of two (8192, 4096) bf16 tensors": (1 / 6, False),
}
"""Operations for :func:`check_bound_two_roofs`: intensity in FLOP/byte, and whether tensor cores run it."""


def _want(intensity: float, tensor_cores: bool, tensor_peak: float, cuda_peak: float, bandwidth: float) -> str:
    ridge = (tensor_peak if tensor_cores else cuda_peak) / bandwidth
    return "compute" if intensity > ridge else "memory"


@_safe_check
def check_bound_two_roofs(answers: dict, tensor_peak: float = H100_TENSOR_BF16, cuda_peak: float = H100_CUDA_CORE_FP32,
                          bandwidth: float = H100_BANDWIDTH) -> CheckResult:
    """``answers`` maps each name in :data:`TWO_ROOF_OPERATIONS` to ``"memory"`` or ``"compute"``: which roof
    limits it on an H100 SXM, judged against *its own* compute roof (tensor cores or CUDA cores)."""
    if not isinstance(answers, dict):
        return _report(False, "Pass a dict that maps each name in TWO_ROOF_OPERATIONS to 'memory' or 'compute', "
                              f"not {_describe(answers)}.")
    missing = [op for op in TWO_ROOF_OPERATIONS if op not in answers]
    if missing:
        return _report(False, f"Answer every operation; missing: {missing[0]!r}.")
    got = {}
    for op in TWO_ROOF_OPERATIONS:
        value = str(answers[op]).strip().lower()
        if value not in ("memory", "compute"):
            return _report(False, f"Answer 'memory' or 'compute' for {op!r}, not {answers[op]!r}.")
        got[op] = value
    tensor_ridge, cuda_ridge = tensor_peak / bandwidth, cuda_peak / bandwidth
    want = {op: _want(i, tc, tensor_peak, cuda_peak, bandwidth) for op, (i, tc) in TWO_ROOF_OPERATIONS.items()}
    if got == want:
        return _report(True, f"Two ridges: {tensor_ridge:.0f} FLOP/byte for tensor-core products, {cuda_ridge:.0f} "
                             "for work on CUDA cores. A float32 product with TF32 off clears the low ridge, a "
                             "256-row bf16 product falls short of the high one, and every element-wise kernel sits "
                             "far left of both.")
    one_ridge = {op: "compute" if i > tensor_ridge else "memory" for op, (i, _) in TWO_ROOF_OPERATIONS.items()}
    if got == one_ridge:
        return _report(False, f"You judged everything against the tensor-core ridge ({tensor_ridge:.0f} FLOP/byte). "
                              f"A float32 product with TF32 off runs on CUDA cores: its roof is {cuda_peak / 1e12:.0f} "
                              f"TFLOP/s and its ridge {cuda_ridge:.0f} FLOP/byte.")
    low_ridge = {op: "compute" if i > cuda_ridge else "memory" for op, (i, _) in TWO_ROOF_OPERATIONS.items()}
    if got == low_ridge:
        return _report(False, f"You judged everything against the CUDA-core ridge ({cuda_ridge:.0f} FLOP/byte). bf16 "
                              f"products run on tensor cores, whose roof ({tensor_peak / 1e12:.0f} TFLOP/s) puts the "
                              f"ridge at {tensor_ridge:.0f} FLOP/byte.")
    op = next(o for o in TWO_ROOF_OPERATIONS if got[o] != want[o])
    intensity, tensor_cores = TWO_ROOF_OPERATIONS[op]
    ridge, unit = (tensor_ridge, "tensor cores") if tensor_cores else (cuda_ridge, "CUDA cores")
    return _report(False, f"{op}: its intensity is {intensity:.3g} FLOP/byte; it runs on {unit}, whose ridge is at "
                          f"{ridge:.0f} FLOP/byte, so it is {want[op]}-bound.")


def check_gelu_time_prediction(predicted_seconds, measured_seconds: float) -> CheckResult:
    """Grade a predicted time of GELU on a large float32 tensor (from this device's measured main-memory
    bandwidth) against the time measured here: a pass within a factor of 3 (a shared machine is noisy)."""
    return grade_prediction(
        predicted_seconds, measured_seconds, quantity="the time of GELU", unit="s", within=3.0,
        too_high=("Slower predicted than measured: check the bytes (4 per float32 element, read once and written "
                  "once: 8 per element) and the units (bytes/s, not GB/s). If they are right, the tensor fitted in a "
                  "cache, which is faster than the main-memory bandwidth you used."),
        too_low=("The prediction assumes GELU streams bytes as fast as a copy. It does not here: erf costs tens of "
                 "instructions per element, and on a CPU's vector units that arithmetic, not memory, sets the pace "
                 "(on a GPU, with ~100x more arithmetic per byte, GELU sits near its memory roof). A small tensor "
                 "also pays the launch overhead, and a busy machine lends fewer cores than the copy had."),
        why_close=("GELU is memory-bound: it reads each element once and writes it once, so its time is bytes over "
                   "bandwidth; what is left is erf's arithmetic and how far a real kernel falls short of a copy."))


def check_matmul_time_prediction(predicted_seconds, measured_seconds: float) -> CheckResult:
    """Grade a predicted time of an n x n x n float32 product (from this device's best measured float32 rate)
    against the time measured here: a pass within a factor of 3 (a shared machine is noisy)."""
    return grade_prediction(
        predicted_seconds, measured_seconds, quantity="the time of the matrix product", unit="s", within=3.0,
        too_high=("Slower predicted than measured: check the FLOPs (2 n^3) and the units (FLOP/s, not GFLOP/s). "
                  "If they are right, this size ran faster than the best rate of the sweep: the sweep was measured "
                  "while the machine was busier."),
        too_low=("Faster predicted than measured: did you count 2 n^3 FLOPs (n^3 multiply-adds)? If so, the product "
                 "fell short of the best rate: the sweep's best came from another size, a shared machine lent fewer "
                 "cores this time, or (at small n) fixed costs and the launch overhead dominate. A large product "
                 "usually reaches 60-90 % of the best rate."),
        why_close=("A large product is compute-bound, so FLOPs over the measured peak predicts it; the gap is how far "
                   "this size falls short of the best size (caches, tile quantisation, a busy machine)."))
