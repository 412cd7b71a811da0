"""Checks for the roofline exercises (chapter 1): which roof limits an operation, with two compute roofs
(tensor cores for matrix products, CUDA cores for element-wise and row-wise kernels), and predict-then-
measure exercises that time an operation after predicting its time from this device's measured ceilings
(the add and the product are graded against the roofline model, their timing shown beside it; GELU, whose
model is only a bound, against the timing).

Leaves out: the measurements (the notebook makes them with ``bench`` and ``roofline``) and the one-line
formula checks (``hardware.check_matmul_flops``, ``check_attainable_flops``, ``check_speedup``).
"""

from __future__ import annotations

from gpuformer_lib.exercises._core import CheckResult, _describe, _report, _safe_check
from gpuformer_lib.exercises.predictions import grade_model, grade_prediction
from gpuformer_lib.predict import roofline

# An H100 SXM's datasheet ceilings (predict.roofline.datasheet_ceiling / datasheet_bandwidth): dense bf16 tensor cores, CUDA-core
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
    by_kind = {op: "compute" if op.startswith("matmul") else "memory" for op in TWO_ROOF_OPERATIONS}
    if got == by_kind:
        return _report(False, "Not every matrix product is compute-bound: a product's intensity grows with its "
                              "smallest dimension. A 16-row decoding step, or 256 rows in bf16 on tensor cores, "
                              f"stays below the tensor-core ridge ({tensor_ridge:.0f} FLOP/byte): work out each "
                              "intensity, 2mnk / (b(mk + kn + mn)).")
    flipped = {op: "memory" if side == "compute" else "compute" for op, side in want.items()}
    if got == flipped:
        return _report(False, "Upside down: every answer is flipped. Above the ridge (more FLOPs per byte than "
                              "peak / bandwidth) an operation is compute-bound; below it, memory-bound.")
    op = next(o for o in TWO_ROOF_OPERATIONS if got[o] != want[o])
    intensity, tensor_cores = TWO_ROOF_OPERATIONS[op]
    ridge, unit = (tensor_ridge, "tensor cores") if tensor_cores else (cuda_ridge, "CUDA cores")
    return _report(False, f"{op}: its intensity is {intensity:.3g} FLOP/byte; it runs on {unit}, whose ridge is at "
                          f"{ridge:.0f} FLOP/byte, so it is {want[op]}-bound.")


def _ratio(predicted, measured_seconds: float):
    """prediction / measurement, or None when the prediction is not a positive number (the grader says so)."""
    try:
        value = float(predicted)
    except (TypeError, ValueError):
        return None
    return value / measured_seconds if value > 0 and measured_seconds > 0 else None


def check_gelu_time_prediction(predicted_seconds, measured_seconds: float) -> CheckResult:
    """Grade a predicted time of GELU on a float32 tensor larger than the last-level cache (from this device's
    measured main-memory bandwidth) against the time measured here: a pass within a factor of 3 (a shared
    machine is noisy). The explanation of the gap follows its direction: predicted slower than measured means
    the kernel beat the bandwidth used (a cache held part of it, or the copy that measured main memory was
    disturbed); predicted faster means something besides bytes set the pace (erf's arithmetic, launch)."""
    slower = ("Slower predicted than measured: check the bytes (4 per float32 element, read once and written "
              "once: 8 per element) and the units (bytes/s, not GB/s). If they are right, GELU beat the main-memory "
              "rate you used: part of its tensors stayed in a cache, or the copy that measured main memory ran while "
              "the machine was busier.")
    faster = ("The prediction assumes GELU streams bytes as fast as a copy. It did not here: erf costs tens of "
              "instructions per element, and on a CPU's vector units that arithmetic competes with memory for the "
              "pace (on a GPU, with ~100x more arithmetic per byte, GELU sits near its memory roof). A small tensor "
              "also pays the launch overhead, and a busy machine lends less bandwidth than the copy had.")
    ratio = _ratio(predicted_seconds, measured_seconds)
    if ratio is not None and ratio > 1.2:
        why = ("GELU ran faster than bytes / main-memory bandwidth: part of its tensors stayed in a cache, or the copy "
               "that measured main memory ran while the machine was busier.")
    elif ratio is not None and ratio < 1 / 1.2:
        why = "GELU ran slower than bytes / main-memory bandwidth. " + faster
    else:
        why = ("GELU moved its bytes at about the main-memory rate: on a tensor larger than the caches it is "
               "memory-bound, its time bytes over bandwidth.")
    return grade_prediction(predicted_seconds, measured_seconds, quantity="the time of GELU", unit="s", within=3.0,
                            too_high=slower, too_low=faster, why_close=why)


def check_matmul_time_prediction(predicted_seconds, measured_seconds: float, *, n: int, peak_flops: float,
                                 bandwidth: float) -> CheckResult:
    """Grade a predicted time of an ``n`` x ``n`` x ``n`` float32 product against the compute-bound model
    2 n^3 / ``peak_flops`` (this device's best measured float32 rate), within 5 % (rounding). The time measured
    here (``measured_seconds``) is shown beside the model, not graded: a band around a noisy timing wide enough
    for a shared machine (a factor 3) also passes n^3 FLOPs, the factor-2 mistake. The known mistakes get their
    own hints: n^3 FLOPs, the memory roof (3 n^2 x 4 bytes / ``bandwidth``), GFLOP/s taken for FLOP/s."""
    flops = 2 * n**3
    right = flops / _positive_number("peak_flops", peak_flops)
    memory = 3 * n * n * 4 / _positive_number("bandwidth", bandwidth)
    wrong = {
        "n^3 FLOPs (a multiply-add counted as one)": (
            right / 2, "Each of the n^3 multiply-adds is 2 FLOPs: the product costs 2 n^3."),
        "the memory roof, 3 n^2 x 4 bytes / bandwidth": (
            memory, f"A product reads and writes 3 n^2 values but does 2 n^3 FLOPs: at n = {n} its intensity, "
                    f"n/6 = {n / 6:.0f} FLOP/byte in float32, is above this device's ridge "
                    f"({peak_flops / bandwidth:.0f} FLOP/byte), so it is compute-bound: FLOPs over the FLOP rate."),
        "GFLOP/s taken for FLOP/s": (right * 1e9, "best_fp32 is in FLOP/s, not GFLOP/s: divide 2 n^3 by it as it is."),
        "the FLOPs over the rate the wrong way up": (
            peak_flops / flops, "Time = FLOPs / (FLOP/s): the rate goes in the denominator."),
    }
    ratio = measured_seconds / right
    if ratio > 1.2:
        why = ("This run fell short of the sweep's best rate: the best came from another size, a shared machine "
               "lent fewer cores this time, or (at small n) fixed costs and the launch overhead count.")
    elif ratio < 1 / 1.2:
        why = ("This run beat the sweep's best rate: the sweep was measured while the machine was busier.")
    else:
        why = ("A large product is compute-bound, so FLOPs over the measured peak predicts it; the gap is how far "
               "this size falls short of the best size (caches, tile quantisation, a busy machine).")
    return grade_model(
        predicted_seconds, right, quantity="the time of the matrix product", unit="s", rel=0.05,
        wrong={name: value for name, value in wrong.items() if abs(value[0] / right - 1) > 0.11},
        too_high="Slower predicted than the model: check the FLOPs (2 n^3) and the units (FLOP/s, not GFLOP/s).",
        too_low="Faster predicted than the model: did you count 2 n^3 FLOPs (n^3 multiply-adds), at best_fp32?",
        measured=measured_seconds, measured_by="This device measured", why_close=why)


# --------------------------------------------------------------------------- where a thin product crosses the ridge


def rows_at_ridge(ridge: float, k: int = 4096, n: int = 4096, itemsize: int = 2) -> float:
    """The row count m at which an (m, k) @ (k, n) product reaches intensity ``ridge`` (FLOP/byte), reading
    A and B once and writing C once: solve 2mkn / (itemsize (mk + kn + mn)) = ridge for m."""
    denominator = 2 * k * n - ridge * itemsize * (k + n)
    return float("inf") if denominator <= 0 else ridge * itemsize * k * n / denominator


def _prediction_ridges(tensor_cores: bool = True) -> dict[str, float]:
    """Each prediction GPU's datasheet ridge (FLOP/byte): its 16-bit tensor cores', or its CUDA cores'."""
    import torch

    from gpuformer_lib import gpu_view

    dtypes = {"T4": torch.float16, "H100 SXM": torch.bfloat16}  # the T4 has no bf16 tensor cores
    return {gpu: roofline.datasheet_ceiling(gpu, dtypes[gpu], tensor_cores=tensor_cores)
            / roofline.datasheet_bandwidth(gpu) for gpu in gpu_view.PREDICTION_GPUS}


@_safe_check
def check_ridge_rows(answers: dict, ridges: dict | None = None, k: int = 4096, n: int = 4096,
                     itemsize: int = 2) -> CheckResult:
    """``answers`` maps each GPU ("T4", "H100 SXM") to the number of rows m at which a 16-bit (m, 4096) @
    (4096, 4096) product on its tensor cores turns compute-bound (its intensity reaches the tensor-core ridge).
    Passes within 3 % of the exact root (whole rows: the answer may be rounded)."""
    cuda_ridges = _prediction_ridges(tensor_cores=False) if ridges is None else {}
    ridges = _prediction_ridges() if ridges is None else dict(ridges)
    if not isinstance(answers, dict):
        return _report(False, f"Pass a dict mapping each of {list(ridges)} to a row count, not {_describe(answers)}.")
    rows = {gpu: rows_at_ridge(r, k, n, itemsize) for gpu, r in ridges.items()}

    def near(m: float, want: float) -> bool:
        return abs(m - want) <= max(0.03 * want, 1.0)

    given = {}
    for gpu in ridges:
        if gpu not in answers:
            return _report(False, f"Answer for every GPU; missing: {gpu!r}.")
        try:
            given[gpu] = float(answers[gpu])
        except (TypeError, ValueError):
            return _report(False, f"Predict a number of rows for {gpu!r}, not {_describe(answers[gpu])}.")
    if len(rows) == 2 and not all(near(given[g], rows[g]) for g in rows):
        (a, row_a), (b, row_b) = rows.items()
        if near(given[a], row_b) and near(given[b], row_a):
            return _report(False, f"Swapped: {row_a:.0f} rows is the {a}'s answer and {row_b:.0f} the {b}'s. The "
                                  "GPU with the higher ridge needs more rows, more reuse of each byte of B.")
    for gpu, ridge in ridges.items():
        m, want = given[gpu], rows[gpu]
        if near(m, want):
            continue
        if gpu in cuda_ridges and near(m, rows_at_ridge(cuda_ridges[gpu], k, n, itemsize)):
            return _report(False, f"{gpu}: you used the CUDA-core ridge ({cuda_ridges[gpu]:.0f} FLOP/byte). A 16-bit "
                                  f"product runs on tensor cores, whose ridge is {ridge:.0f} FLOP/byte.")
        if itemsize != 4 and near(m, rows_at_ridge(ridge, k, n, 4)):
            return _report(False, f"{gpu}: you counted 4 bytes per element; the product is 16-bit, {itemsize} bytes "
                                  "per element.")
        no_write = ridge * itemsize * n / (2 * n - ridge * itemsize)  # bytes b(mk + kn): C never written
        if 2 * n > ridge * itemsize and near(m, no_write):
            return _report(False, f"{gpu}: you left out the write of C: the bytes are b(mk + kn + mn), A and B read "
                                  "once and the (m, n) output written once.")
        square = 3 * itemsize * ridge / 2  # n from the square formula 2n/(3b) = ridge
        if abs(m - ridge) <= 0.02 * ridge:
            return _report(False, f"{gpu}: {m:.0f} is the ridge itself ({ridge:.0f} FLOP/byte), not a row count. "
                                  "Write the product's intensity as a function of m and solve for the m that "
                                  "reaches it.")
        if abs(m - square) <= 0.03 * square:
            return _report(False, f"{gpu}: you used the square product's 2n/(3b). This product is thin: only A and C "
                                  "grow with m, while B (4096 x 4096) is read whole whatever m is. Write FLOPs / bytes "
                                  "with m, k and n separately.")
        small_m = ridge * itemsize / 2  # I ~ 2m/b when m << k, n
        if abs(m - small_m) <= 0.02 * small_m:
            return _report(False, f"{gpu}: {m:.0f} rows is the thin-product limit I ~ 2m/b, which ignores the bytes of "
                                  f"A and C (m(k + n) elements). They lower the intensity, so it takes more rows: "
                                  "solve the full equation.")
        side = "high" if m > want else "low"
        return _report(False, f"{gpu}: {m:.4g} rows is too {side}. The tensor-core ridge is {ridge:.0f} FLOP/byte; "
                              f"intensity = 2mkn / (b(mk + kn + mn)) with k = n = {k}, b = {itemsize}; set it equal to "
                              "the ridge and solve for m (it is linear in m once you multiply out).")
    said = ", ".join(f"{gpu}: {m:.0f} rows (ridge {ridges[gpu]:.0f} FLOP/byte)" for gpu, m in rows.items())
    return _report(True, f"{said}. Between the two, a product of a few hundred rows is compute-bound on one GPU "
                         "and memory-bound on the other: the faster tensor cores need more reuse per byte.")


def check_add_time_prediction(predicted_seconds, measured_seconds: float, *, elements: int, bandwidth: float,
                              peak_flops: float) -> CheckResult:
    """Grade a predicted time of ``x + y`` on float32 tensors of ``elements`` elements, larger than the last-level
    cache, against the memory-bound model 12 x ``elements`` / ``bandwidth`` (read x and y, write the sum: 12
    bytes per element, at this device's main-memory bandwidth), within 5 % (rounding). The time measured here
    (``measured_seconds``) is shown beside the model with what explains the gap, not graded: a band around
    the timing wide enough for a shared machine passes the write forgotten (8 bytes per element). The known
    mistakes get their own hints: 8 or 4 bytes per element, the compute roof (``peak_flops``), GB/s taken for
    bytes/s, float64's 24 bytes."""
    bytes_moved = 12 * elements
    right = bytes_moved / _positive_number("bandwidth", bandwidth)
    wrong = {
        "8 bytes per element (the write forgotten)": (
            right * 2 / 3, "x and y are read and the sum is written: three float32 tensors, 12 bytes per element. "
                           "The write of z moves bytes too."),
        "4 bytes per element (one tensor)": (
            right / 3, "The add moves three float32 tensors, not one: x and y read, the sum written, 12 bytes per "
                       "element."),
        "the compute roof, one FLOP per element at best_fp32": (
            elements / _positive_number("peak_flops", peak_flops),
            "One FLOP per 12 bytes is far below the ridge: the add is memory-bound, its time bytes over bandwidth "
            "(measured_bandwidth), not FLOPs over best_fp32."),
        "GB/s taken for bytes/s": (
            right * 1e9, "measured_bandwidth is in bytes per second, not GB/s: divide the bytes by it as it is."),
        "24 bytes per element (float64)": (
            right * 2, "The tensors are float32: 4 bytes per element each, 12 for the three."),
    }
    ratio = measured_seconds / right
    if ratio < 1 / 1.2:
        why = ("The add ran faster than bytes / main-memory bandwidth: part of its tensors stayed in a cache, or the "
               "copy that measured main memory ran while the machine was busier.")
    elif ratio > 1.2:
        why = ("The add ran slower than bytes / main-memory bandwidth: it streams three tensors, not a copy's two, "
               "and the machine may have been busier than when the copy ran.")
    else:
        why = ("The add moved its bytes at about the main-memory rate: one FLOP per 12 bytes, it is memory-bound, "
               "its time bytes over bandwidth.")
    return grade_model(
        predicted_seconds, right, quantity="the time of the add", unit="s", rel=0.05,
        wrong={name: value for name, value in wrong.items() if abs(value[0] / right - 1) > 0.11},
        too_high="Slower predicted than the model: check the bytes (x and y read, the sum written: 12 per float32 "
                 "element) and the units (bytes/s, not GB/s).",
        too_low="Faster predicted than the model: did you count all three tensors (12 bytes per element)?",
        measured=measured_seconds, measured_by="This device measured", why_close=why)


def _positive_number(name: str, value) -> float:
    """The notebook's measurement or setting as a float; a bad one raises (the learner's answer never does)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)
