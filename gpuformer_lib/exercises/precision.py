"""Checks for the exercises on number formats, loss scaling and mixed-precision memory (chapter 8)."""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from gpuformer_lib.exercises._answers import _number, _truth
from gpuformer_lib.exercises._core import CheckResult, _report, _safe_check, _try


@_safe_check
def check_update_survives(fn: Callable[[float, float, torch.dtype], bool]) -> CheckResult:
    """``fn(weight, update, dtype)``: does ``weight + update``, stored in ``dtype``, differ from ``weight``?
    Predict it from the format's precision; the check measures it."""
    cases = [(1.0, 1e-4, torch.float16), (1.0, 1e-3, torch.float16), (1.0, 1e-3, torch.bfloat16),
             (1.0, 1e-2, torch.bfloat16), (1000.0, 0.3, torch.float16), (1000.0, 1.0, torch.float16),
             (1.0, 1e-4, torch.float32)]
    for w, u, dtype in cases:
        got, err = _try(fn, w, u, dtype, expect=_truth)
        if err:
            return _report(False, err)
        measured = bool((torch.tensor(w, dtype=dtype) + torch.tensor(u, dtype=dtype)) != torch.tensor(w, dtype=dtype))
        if bool(got) != measured:
            spacing = torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(abs(w)))
            return _report(False, f"weight {w} + update {u} in {dtype}: {'kept' if measured else 'lost'} when stored. "
                                  f"Near {w} the {dtype} values are {spacing:.3g} apart (eps x 2^floor(log2 |w|)); "
                                  "an update smaller than half of that rounds away.")
    return _report(True, "An update survives only if it exceeds half the spacing eps x 2^floor(log2 |w|): fp16 loses "
                         "1e-4 on a weight of 1, which is why weights are kept in float32.")


@_safe_check
def check_loss_scale(fn: Callable[[float, Sequence[bool], int], float]) -> CheckResult:
    """``fn(init_scale, overflow_per_step, growth_interval)``: the loss scale after these steps, with
    GradScaler's rules: an overflow halves the scale (the step is skipped); ``growth_interval``
    consecutive clean steps double it."""

    def rule(scale: float, overflows: Sequence[bool], interval: int) -> float:
        clean = 0
        for overflow in overflows:
            if overflow:
                scale, clean = scale / 2, 0
            else:
                clean += 1
                if clean == interval:
                    scale, clean = scale * 2, 0
        return scale

    cases = [(65536.0, [False] * 5, 5), (65536.0, [True, True, False], 5), (1024.0, [False, True] + [False] * 6, 3),
             (8.0, [True] * 3, 2)]
    for init, overflows, interval in cases:
        got, err = _try(fn, init, overflows, interval, expect=_number)
        if err:
            return _report(False, err)
        want = rule(init, overflows, interval)
        if got != want:
            return _report(False, f"From {init} with overflows {overflows} and growth_interval {interval}: expected "
                                  f"{want}, got {got!r}. An overflow also restarts the count of clean steps.")
    # the rules are GradScaler's: confirm with the real thing
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
    w = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([w], lr=0.0)
    for overflow in [False, True] + [False] * 6:
        scaler.scale((w * (float("inf") if overflow else 1.0)).sum()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    assert scaler.get_scale() == rule(1024.0, [False, True] + [False] * 6, 3)
    return _report(True, "Halve on overflow, double after a run of clean steps: the scale hovers just below overflow.")


@_safe_check
def check_mixed_precision_state(fn: Callable[[int, str], int]) -> CheckResult:
    """``fn(n_params, mode)``: bytes of weights, gradients, optimizer state and master weights with AdamW, for
    ``mode`` in 'fp32' (everything float32), 'autocast' (float32 weights, 16-bit compute) and 'fp16+master'
    (fp16 weights and gradients, a float32 master copy)."""
    n = 1_000_000
    want = {"fp32": 16 * n, "autocast": 16 * n, "fp16+master": (2 + 2 + 4 + 8) * n}
    for mode, expected in want.items():
        got, err = _try(fn, n, mode, expect=_number)
        if err:
            return _report(False, err)
        if got != expected:
            hint = {"autocast": "Autocast keeps float32 weights and gradients; only the activations and the matrix "
                                "products are 16-bit.",
                    "fp16+master": "fp16 weights (2) and gradients (2), a float32 master copy (4) and AdamW's two "
                                   "float32 states (8).",
                    "fp32": "4 (weights) + 4 (gradients) + 8 (AdamW's two states)."}[mode]
            return _report(False, f"For {mode}: expected {expected // n} bytes per parameter, got {got / n:g}. {hint}")
    return _report(True, "16 bytes per parameter in every mode: mixed precision saves activations and time, not "
                         "weight and optimizer memory.")
