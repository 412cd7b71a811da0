"""Checks for the exercises on hardware, memory, FLOPs, the roofline and speedup (chapters 0 and 1)."""

from __future__ import annotations

from typing import Callable

import torch

from gpuformer_lib.exercises._answers import _bool, _number
from gpuformer_lib.exercises._core import CheckResult, _close, _describe, _report, _safe_check, _try

# --------------------------------------------------------------------------- hardware and memory


@_safe_check
def check_weights_memory(fn: Callable[[int, torch.dtype], float]) -> CheckResult:
    """``fn(n_params, dtype)`` returns the GiB (2**30 bytes) the weights of a model take."""
    cases = [(7_000_000_000, torch.bfloat16), (124_000_000, torch.float32), (1_300_000_000, torch.float16),
             (350_000_000, torch.float64)]
    for n, dtype in cases:
        got, err = _try(fn, n, dtype, expect=_number)
        if err:
            return _report(False, err)
        want = n * dtype.itemsize / 2**30
        if _close(got, want):
            continue
        if _close(got, n * dtype.itemsize):
            return _report(False, f"For {n:,} parameters in {dtype} you returned bytes; divide by 2**30 for GiB.")
        if _close(got, n * dtype.itemsize / 1e9):
            return _report(False, "You returned GB (10**9 bytes); the exercise asks for GiB (2**30 bytes), "
                                  "the unit torch.cuda memory figures use.")
        if _close(got, n * 4 / 2**30):
            return _report(False, f"You used 4 bytes per parameter for {dtype}; use dtype.itemsize "
                                  f"({dtype.itemsize} bytes).")
        return _report(False, f"For {n:,} parameters in {dtype} you returned {got!r}, expected {want:.4g} GiB. "
                              "Bytes = parameters x bytes per element (dtype.itemsize).")
    return _report(True, "Weights take parameters x dtype.itemsize bytes: a 7B model needs 13 GiB in bf16.")


@_safe_check
def check_supports_bf16(fn: Callable[[tuple[int, int]], bool]) -> CheckResult:
    """``fn((major, minor))`` says whether an NVIDIA GPU of that compute capability has fast bf16."""
    cases = {(6, 1): False, (7, 0): False, (7, 5): False, (8, 0): True, (8, 6): True, (8, 9): True,
             (9, 0): True, (10, 0): True, (12, 0): True}
    for cc, want in cases.items():
        got, err = _try(fn, cc)
        if err:
            return _report(False, err)
        got, err = _bool(got)
        if err:
            return _report(False, f"{err[:-1]} for {cc}.")
        if got != want:
            if cc == (7, 5):
                hint = "A T4 is compute capability 7.5 (Turing): it has fp16 tensor cores but no bf16."
            elif cc[0] > 8:
                hint = (f"{cc[0]}.{cc[1]} is newer than Ampere and supports bf16: compare the whole "
                        "tuple, cc >= (8, 0), instead of testing for major == 8.")
            elif want:
                hint = f"{cc[0]}.{cc[1]} (Ampere/Ada) supports bf16: the threshold is 8.0."
            else:
                hint = f"{cc[0]}.{cc[1]} is older than Ampere (8.0) and has no bf16 tensor cores."
            return _report(False, f"Wrong for compute capability {cc}: {hint}")
    return _report(True, "bf16 needs compute capability 8.0 or newer (Ampere, Ada, Hopper, Blackwell).")


@_safe_check
def check_fits_training(fn: Callable[[int, float], bool]) -> CheckResult:
    """``fn(n_params, gpu_memory_gib)``: do fp32 weights, gradients and AdamW's two states fit?

    Activations are ignored. The right count is 16 bytes per parameter, compared with ``gpu_memory_gib * 2**30``
    bytes. The cases separate the counts a learner may use instead (4, 8, 12, 18, 20, 24 bytes per parameter),
    10**9 from 2**30 bytes per "GB", and two memory sizes (a budget written into the function instead of
    ``gpu_memory_gib``); none sits exactly on a bound, so ``<`` and ``<=`` both pass.
    """
    cases = []
    for memory_gib in (16.0, 80.0):
        budget = memory_gib * 2**30
        # n = budget / c fits at up to c bytes per parameter: each c sits between two counts a learner may use
        # (16.5: fits in GiB, not in GB, 10**9 bytes, which acts as 16 * 2**30 / 10**9 = 17.2 bytes in GiB)
        cases += [(int(budget / c), memory_gib) for c in (6, 10, 14, 16.5, 17.6, 19, 22, 30, 40)]
    answers = []
    for n, memory_gib in cases:
        got, err = _try(fn, n, memory_gib)
        if err:
            return _report(False, err)
        got, err = _bool(got)
        if err:
            return _report(False, err)
        answers.append(got)

    def model(per_param: float, unit: float = 2**30, fixed_gib: float | None = None) -> list[bool]:
        return [n * per_param <= (memory if fixed_gib is None else fixed_gib) * unit for n, memory in cases]

    if answers == model(16):
        return _report(True, "fp32 weights (4 B) + gradients (4 B) + AdamW exp_avg and exp_avg_sq (8 B) "
                             "= 16 bytes per parameter, before any activation.")
    more = "You counted more than needed: weights, gradients and two AdamW states make 16 bytes per parameter."
    diagnoses = [
        (model(4), "You counted the weights only. Training also keeps a gradient per weight and AdamW's two "
                   "moments: 16 bytes per parameter."),
        (model(8), "You counted weights and gradients, but AdamW also keeps two states per parameter (exp_avg, "
                   "exp_avg_sq)."),
        (model(12), "You are 4 bytes short per parameter: AdamW keeps two fp32 states, not one."),
        (model(16, unit=1e9), "You compared with GB (10**9 bytes); gpu_memory_gib is in GiB (2**30 bytes), the "
                              "unit torch.cuda reports: multiply it by 2**30."),
        (model(16, fixed_gib=16.0), "Your answer is right for 16 GiB but not for other memory sizes: compare with "
                                    "the gpu_memory_gib argument, not a number written into the function."),
        (model(16, unit=1), "You compared bytes with GiB: the budget is gpu_memory_gib * 2**30 bytes."),
        (model(18), "You counted 18 bytes per parameter, mixed precision's count (a 16-bit copy of the weights "
                    "beside the fp32 ones). In float32 there is no copy: weights, gradients and two AdamW states "
                    "make 16 bytes per parameter."),
        (model(20), more),
        (model(24), more),
        (model(32), more),
    ]
    for want, hint in diagnoses:
        if answers == want:
            return _report(False, hint)
    (n, memory_gib), answer = next((c, a) for c, a, w in zip(cases, answers, model(16)) if a != w)
    return _report(False, f"For {n:,} parameters and {memory_gib:g} GiB you answered {answer}. Count bytes per "
                          "parameter (weights, gradients, optimizer states) times the number of parameters, and "
                          "compare with gpu_memory_gib * 2**30.")


# --------------------------------------------------------------------------- FLOPs, bytes and the roofline


@_safe_check
def check_matmul_flops(fn: Callable[[int, int, int], int]) -> CheckResult:
    """``fn(m, n, k)`` returns the FLOPs of an (m, k) @ (k, n) matrix product."""
    for m, n, k in [(3, 5, 7), (128, 64, 32), (1, 4096, 4096)]:
        got, err = _try(fn, m, n, k, expect=_number)
        if err:
            return _report(False, err)
        want = 2 * m * n * k
        if _close(got, want):
            continue
        if _close(got, m * n * k):
            return _report(False, "Each of the m*n*k steps is a multiply and an add: 2 FLOPs.")
        if _close(got, 2 * m * n * (k - 1)) or _close(got, m * n * (2 * k - 1)):
            return _report(False, "Close: the exact count is m*n*(2k-1), but FLOP counts for throughput "
                                  "use 2*m*n*k (a multiply-add per step). Use that.")
        return _report(False, f"For m={m}, n={n}, k={k} you returned {got!r}, expected {want}. Every "
                              "output element is a dot product of length k.")
    return _report(True, "An (m, k) @ (k, n) product costs 2*m*n*k FLOPs.")


@_safe_check
def check_attainable_flops(fn: Callable[[float, float, float], float]) -> CheckResult:
    """``fn(intensity, peak_flops, bandwidth)``: the roofline's attainable FLOP/s."""
    peak, bw = 1e15, 3e12
    intensities = (0.25, 10.0, 333.3, 5000.0)
    got = []
    for intensity in intensities:
        value, err = _try(fn, intensity, peak, bw, expect=_number)
        if err:
            return _report(False, err)
        got.append(value)

    def matches(rule: Callable[[float], float]) -> bool:
        return all(_close(g, rule(i)) for g, i in zip(got, intensities))

    if matches(lambda i: min(peak, i * bw)):
        return _report(True, "Attainable = min(peak, intensity x bandwidth).")
    diagnoses = [
        (lambda i: peak, "At low intensity memory limits you to intensity x bandwidth, below the peak."),
        (lambda i: i * bw, "At high intensity the compute peak caps you: take the minimum of the two roofs."),
        (lambda i: max(peak, i * bw), "Use min, not max: you can exceed neither the compute peak nor what memory "
                                      "can feed."),
        (lambda i: min(peak, i / bw), "FLOP/byte times byte/s gives FLOP/s: multiply intensity by bandwidth."),
    ]
    for rule, hint in diagnoses:
        if matches(rule):
            return _report(False, hint)
    wrong = next(i for g, i in zip(got, intensities) if not _close(g, min(peak, i * bw)))
    return _report(False, f"For intensity {wrong} FLOP/byte, peak {peak:.0e} FLOP/s and bandwidth {bw:.0e} B/s "
                          f"you returned {got[intensities.index(wrong)]!r}, expected {min(peak, wrong * bw):.4g}.")


# Operations for check_bound, with their intensity on a 16-bit GPU (FLOPs / bytes moved).
BOUND_OPERATIONS: dict[str, float] = {
    "matmul (4096, 4096) @ (4096, 4096), bf16": 2 * 4096**3 / (3 * 4096**2 * 2),
    "matmul (16, 4096) @ (4096, 4096), bf16 (one decoding step)": 2 * 16 * 4096**2 / ((2 * 16 * 4096 + 4096**2) * 2),
    "softmax over a (8192, 8192) bf16 score matrix": 5 / 4,
    "layer norm over (8192, 4096) bf16 activations": 8 / 4,
    "residual add of two (8192, 4096) bf16 tensors": 1 / 6,
}


@_safe_check
def check_bound(answers: dict[str, str], peak_flops: float = 989.4e12, bandwidth: float = 3.35e12,
                vector_flops: float = 67e12) -> CheckResult:
    """``answers`` maps each name in :data:`BOUND_OPERATIONS` to ``"memory"`` or ``"compute"``: which
    roof limits it on a GPU with these ceilings (default: an H100 SXM's datasheet bf16 tensor cores, CUDA-core
    float32 and HBM3). Matrix products are judged against ``peak_flops`` (tensor cores); element-wise and
    row-wise kernels, which never run on tensor cores, against min(``vector_flops``, ``peak_flops``)."""
    if not isinstance(answers, dict):
        return _report(False, "Pass a dict that maps each name in BOUND_OPERATIONS to 'memory' or 'compute', "
                              f"not {_describe(answers)}.")
    ridge = peak_flops / bandwidth
    vector_ridge = min(vector_flops, peak_flops) / bandwidth
    missing = [op for op in BOUND_OPERATIONS if op not in answers]
    if missing:
        return _report(False, f"Answer every operation; missing: {missing[0]!r}.")
    for op, intensity in BOUND_OPERATIONS.items():
        matrix = op.startswith("matmul")
        op_ridge = ridge if matrix else vector_ridge
        want = "compute" if intensity > op_ridge else "memory"
        got = str(answers[op]).strip().lower()
        if got not in ("memory", "compute"):
            return _report(False, f"Answer 'memory' or 'compute' for {op!r}, not {answers[op]!r}.")
        if got != want:
            units = "tensor cores" if matrix else "CUDA cores (element-wise work never runs on tensor cores)"
            return _report(False, f"{op}: its intensity is {intensity:.3g} FLOP/byte; it runs on {units}, whose "
                                  f"ridge is at {op_ridge:.0f} FLOP/byte, so it is {want}-bound.")
    return _report(True, f"Only the large matmul clears the tensor-core ridge at {ridge:.0f} FLOP/byte; a 16-row "
                         "product (a decoding step) is memory-bound, and the element-wise operations sit far below "
                         f"even the CUDA-core ridge at {vector_ridge:.0f} FLOP/byte.")


@_safe_check
def check_speedup(fn: Callable[[float, float], float]) -> CheckResult:
    """``fn(time_before, time_after)`` returns the speedup."""
    for before, after in [(10.0, 2.7), (3.0, 1.5), (1.0, 4.0)]:
        got, err = _try(fn, before, after, expect=_number)
        if err:
            return _report(False, err)
        want = before / after
        if _close(got, want):
            continue
        if _close(got, after / before):
            return _report(False, "Upside down: speedup is time before / time after, so faster gives a number above 1.")
        if _close(got, (before - after) / before) or _close(got, 100 * (before - after) / before):
            return _report(False, "That is the fraction of time saved, not the speedup (time before / time after).")
        return _report(False, f"For {before} s before and {after} s after you returned {got!r}, expected {want:.4g}.")
    return _report(True, "10 h before and 2.7 h after is a 3.7x speedup; on 4 GPUs that is 93% efficiency.")


# --------------------------------------------------------------------------- predict, then measure (chapter 0)


def check_training_state_prediction(predicted_bytes, measured_bytes: int, *,
                                    layers: "tuple[tuple[int, int], ...] | None" = None) -> CheckResult:
    """Grade a prediction of the bytes that float32 weights, gradients and AdamW's state take for a model after
    one optimizer step: 16 bytes per parameter, within 0.4 % (rounding). ``measured_bytes`` is what
    ``memory.model_state_bytes`` counts, exact arithmetic with no noise. ``layers`` (the ``(in_features,
    out_features)`` of each ``nn.Linear`` with bias) gives the parameter count, so the check grades against the
    formula, shows the count beside it and names a forgotten bias (1 % of this block: a timing-style tolerance
    would pass it); a count that disagrees with the layers is the notebook's error and raises. Without
    ``layers`` the count itself is the right answer."""
    from gpuformer_lib.exercises.predictions import grade_model

    if layers is None:
        right, weights_only = measured_bytes, None
    else:
        weights_only = 16 * sum(i * o for i, o in layers)
        right = weights_only + 16 * sum(o for _, o in layers)
        if abs(measured_bytes - right) > 0.001 * right:
            raise ValueError(f"measured_bytes={measured_bytes} is not 16 bytes per parameter of layers={layers} "
                             f"({right} bytes): pass the layers of the model that was measured")
    bits = ("16 bytes per parameter in float32 (4 for the weight, 4 its gradient, 4 + 4 AdamW's exp_avg and "
            "exp_avg_sq)")
    wrong = {
        "weights only (4 bytes per parameter)": (
            right / 4, f"Training keeps more than the weights: {bits}."),
        "weights and gradients (8 bytes per parameter)": (
            right / 2, "AdamW also keeps two float32 tensors per parameter (exp_avg and exp_avg_sq), created at "
                       "the first step: 16 bytes per parameter. (Or did you count 2 bytes per value? This model is "
                       "float32.)"),
        "one AdamW moment (12 bytes per parameter)": (
            right * 3 / 4, "AdamW keeps two float32 tensors per parameter, exp_avg and exp_avg_sq, not one: 16 "
                           "bytes per parameter."),
        "the number of parameters, not bytes": (
            right / 16, f"That is the parameter count; the question asks for {bits}."),
        "KiB instead of bytes": (right / 2**10, "The answer is in bytes, not KiB: multiply by 1024."),
        "twice the state (32 bytes per parameter)": (
            right * 2, "Count each tensor once: float32 is 4 bytes, so weight, gradient and AdamW's two moments "
                       "make 16 bytes per parameter, not 32."),
    }
    if weights_only is not None:
        wrong["the weights without the biases"] = (
            weights_only, "You left out the biases: a bias is a parameter like any other, with its gradient and "
                          "AdamW's two moments (sum(p.numel() for p in model.parameters()) counts them).")
    return grade_model(
        predicted_bytes, right, quantity="weights + gradients + AdamW state", unit="bytes", rel=0.004,
        wrong={name: value for name, value in wrong.items() if abs(value[0] / right - 1) > 0.0085},
        too_high="Count each parameter's bytes once: 16 in float32. Activations are not part of this count.",
        too_low="Count every parameter, the biases too, at 16 bytes each: a weight, its gradient and AdamW's "
                "two moments (exp_avg, exp_avg_sq), created at the first step.",
        measured=None if layers is None else measured_bytes, measured_by="memory.model_state_bytes counted",
        why_close="The optimizer's state appears only after the first step(): before it, AdamW holds nothing.")


def check_host_sync_prediction(predicted_seconds, measured_seconds: float, *, per_read: float) -> CheckResult:
    """Grade a prediction of the time of N ``.item()`` reads from the measured cost of one read
    (``per_read`` seconds). Passes within a factor 3: one read is a few microseconds, and on a shared
    machine the scheduler's pauses and the loop's own Python overhead move a loop's total by tens of percent."""
    from gpuformer_lib.exercises.predictions import grade_prediction

    return grade_prediction(
        predicted_seconds, measured_seconds, quantity="time of the loop of reads", unit="s", within=3.0,
        too_high=f"Each read costs about {per_read * 1e6:.1f} us here: multiply by the number of reads "
                 "(check your units: microseconds are 1e-6 s, milliseconds 1e-3 s).",
        too_low=f"Each read costs about {per_read * 1e6:.1f} us here, and every one of them waits: the "
                "reads do not overlap, so N reads take N times as long (check your units: 1 us = 1e-6 s).",
        why_close="Reads are sequential waits, so their cost adds up linearly; on a GPU each also drains the "
                  "queue of work launched before it.")


# --------------------------------------------------------------------------- chapter 0, second edition


def precision_devices() -> dict[str, "object"]:
    """The devices of chapter 0's precision exercise: a description a learner reads -> its device profile."""
    import dataclasses

    from gpuformer_lib.profiles import PROFILES, _gpu

    def gpu_line(p) -> str:
        return f"{p.gpu_name} (compute capability {p.compute_capability[0]}.{p.compute_capability[1]})"

    blackwell = _gpu("rtx-5090", "NVIDIA GeForce RTX 5090", 30.0, (12, 0))  # memory unused here
    cpu_bf16 = dataclasses.replace(PROFILES["cpu"], bf16=True)
    return {gpu_line(PROFILES["t4"]): PROFILES["t4"],
            gpu_line(PROFILES["a100-40gb"]): PROFILES["a100-40gb"],
            gpu_line(PROFILES["h100-80gb"]): PROFILES["h100-80gb"],
            gpu_line(blackwell): blackwell,
            "a laptop CPU with native bf16 instructions (AVX512-BF16), no GPU": cpu_bf16}


@_safe_check
def check_precision_choice(answers: dict[str, str]) -> CheckResult:
    """``answers`` maps each description in :func:`precision_devices` to the training precision the course
    picks there (``'bf16'``, ``'fp16'`` or ``'fp32'``), graded against ``profiles.training_precision``."""
    from gpuformer_lib.profiles import training_precision

    devices = precision_devices()
    if not isinstance(answers, dict):
        return _report(False, "Pass a dict that maps each description in precision_devices() to 'bf16', 'fp16' "
                              f"or 'fp32', not {_describe(answers)}.")
    missing = [d for d in devices if d not in answers]
    if missing:
        return _report(False, f"Answer every device; missing: {missing[0]!r}.")
    for desc, profile in devices.items():
        got = str(answers[desc]).strip().lower()
        want = training_precision(profile)
        if got not in ("bf16", "fp16", "fp32"):
            return _report(False, f"Answer 'bf16', 'fp16' or 'fp32' for {desc!r}, not {answers[desc]!r}.")
        if got == want:
            continue
        if not profile.on_gpu:
            hint = ("On a CPU the course trains in fp32 even with native bf16 instructions: its models are small "
                    "there and autocast only adds casts (read help(training_precision)).")
        elif want == "fp16":
            hint = ("This GPU is older than 8.0: it has fp16 tensor cores but no bf16 ones "
                    "(torch.cuda.is_bf16_supported() still says True on it, because it counts emulation). The "
                    "course trains it in fp16, with a loss scaler (chapter 8)." if got == "bf16" else
                    "fp32 would leave its fp16 tensor cores idle: the course trains it in fp16, with a loss scaler.")
        elif profile.compute_capability[0] > 8 and got == "fp16":
            hint = (f"{profile.compute_capability[0]}.{profile.compute_capability[1]} is newer than Ampere and has "
                    "bf16 tensor cores: compare the whole tuple, cc >= (8, 0), not major == 8.")
        else:
            hint = ("From compute capability 8.0 the tensor cores have bf16, with float32's exponent range: no "
                    "loss scaler needed, so the course prefers it to fp16 and to fp32.")
        return _report(False, f"{desc}: the course picks {want}, not {got}. {hint}")
    return _report(True, "bf16 wherever the tensor cores have it (compute capability 8.0 or newer, Blackwell "
                         "included), fp16 with a loss scaler on a T4, fp32 on a CPU: profiles.training_precision.")


def check_read_interval_prediction(predicted_seconds, measured_seconds: float, *, n: int, read_every: int,
                                   queued: float, read_each: float) -> CheckResult:
    """Grade a prediction of the time of ``n`` steps that read ``.item()`` every ``read_every`` steps, from the
    measured cost of a queued step (``queued`` s) and of a step that reads (``read_each`` s), against the model
    n x queued + (n // read_every) x (read_each - queued), within 5 % (rounding the printed costs).

    The loop's time (``measured_seconds``) is shown beside the model, not graded: on a CPU a read costs
    little more than a queued step, so "every step reads" (n x read_each) lands within 15 % of the loop and
    would pass any band wide enough for a shared machine's noise. The known mistakes get their own hints."""
    from gpuformer_lib.exercises.predictions import grade_model

    reads = n // read_every
    right = n * queued + reads * (read_each - queued)
    units = "The costs are in seconds (1 us = 1e-6 s), and so is the answer."
    wrong = {
        "a read on every step, n x read_each": (
            n * read_each, f"Only {reads} of the {n} steps read: the others cost a queued step "
                           f"({queued * 1e6:.1f} us), not a step that reads ({read_each * 1e6:.1f} us)."),
        "the reads alone, (n / k) x read_each": (
            reads * read_each, f"Every one of the {n} steps still costs its operation ({queued * 1e6:.1f} us "
                               f"queued); the {reads} reads add what a read costs beyond that, read_each - queued, "
                               "each."),
        "the queued steps alone, n x queued": (
            n * queued, f"The {reads} reads each add what a read costs beyond a queued step, read_each - queued: "
                        "that wait is what the exercise is about."),
        "the right time in microseconds": (right * 1e6, units),
        "the right time in milliseconds": (right * 1e3, units),
    }
    return grade_model(
        predicted_seconds, right, quantity=f"time of {n} steps reading every {read_every}th", unit="s", rel=0.05,
        wrong={name: value for name, value in wrong.items() if abs(value[0] / right - 1) > 0.11},
        too_high=f"Only {reads} of the {n} steps read; every step costs a queued step ({queued * 1e6:.1f} us). "
                 + units,
        too_low=f"Every one of the {n} steps still costs its operation ({queued * 1e6:.1f} us queued); the {reads} "
                "reads add read_each - queued each. " + units,
        measured=measured_seconds, measured_by="The loop took",
        why_close="Time = n x queued + (n / k) x (read_each - queued): every step pays its operation, only every "
                  "k-th pays the wait. On a GPU a read waits for the whole queue, so reading less often saves more.")
