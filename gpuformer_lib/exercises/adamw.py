"""AdamW from scratch (chapter 6): the learner writes one step of the update, graded against ``torch.optim.AdamW``.

The learner's ``adamw_step(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay)`` returns
the new ``(param, exp_avg, exp_avg_sq)``; ``step`` counts from 1. The check runs it for several steps on a
parameter with a changing gradient, from the same start as ``torch.optim.AdamW``, and compares every step in
float64. A wrong update is recognised by running the plausible mistakes (:data:`MISTAKES`) on the same inputs:
no bias correction, Adam's L2 decay added to the gradient instead of AdamW's decoupled decay, decay not scaled by
the learning rate, eps inside the square root, the first moment's bias correction left out, beta1 and beta2
swapped, and the second moment built from |g| instead of g². Each gets a hint that names it.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from gpuformer_lib.exercises._answers import _tensors
from gpuformer_lib.exercises._core import CheckResult, _report, _safe_check, _try

SETTINGS = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1)
"""The hyperparameters the check uses: torch.optim.AdamW's defaults but a larger weight decay and learning
rate, so that every term of the update moves the parameter by more than rounding."""

STEPS = 4


def reference_step(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay, *,
                   bias_correction=True, decoupled=True, decay_times_lr=True, eps_inside=False,
                   first_correction=True, swap_betas=False, abs_second=False):
    """One AdamW step (Loshchilov and Hutter, 2019, Algorithm 2, as ``torch.optim.AdamW`` computes it), or one of
    the plausible mistakes, selected by the keyword switches. Returns new ``(param, exp_avg, exp_avg_sq)``."""
    if swap_betas:
        beta1, beta2 = beta2, beta1
    if not decoupled:
        grad = grad + weight_decay * param  # Adam with L2: the decay goes through the moments
    else:
        param = param * (1 - lr * weight_decay) if decay_times_lr else param * (1 - weight_decay)
    exp_avg = beta1 * exp_avg + (1 - beta1) * grad
    exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * (grad.abs() if abs_second else grad * grad)
    first = 1 - beta1**step if bias_correction and first_correction else 1.0
    second = 1 - beta2**step if bias_correction else 1.0
    m_hat, v_hat = exp_avg / first, exp_avg_sq / second
    denom = (v_hat + eps).sqrt() if eps_inside else v_hat.sqrt() + eps
    return param - lr * m_hat / denom, exp_avg, exp_avg_sq


MISTAKES: dict[str, tuple[dict, str]] = {
    "no bias correction": (dict(bias_correction=False), (
        "Your update matches Adam without bias correction: early on the moments start at zero and are too small; "
        "divide exp_avg by (1 - beta1**step) and exp_avg_sq by (1 - beta2**step) before using them.")),
    "L2 instead of decoupled decay": (dict(decoupled=False), (
        "You added weight_decay * param to the gradient: that is Adam with L2 regularisation, whose decay is "
        "divided by sqrt(v) like the gradient. AdamW decouples it: param *= (1 - lr * weight_decay), apart from "
        "the moments.")),
    "decay not times lr": (dict(decay_times_lr=False), (
        "Your decay shrinks the parameter by weight_decay itself each step; PyTorch's AdamW scales it by the "
        "learning rate: param *= (1 - lr * weight_decay).")),
    "eps inside the square root": (dict(eps_inside=True), (
        "You put eps inside the square root, sqrt(v_hat + eps); AdamW adds it outside, sqrt(v_hat) + eps "
        "(it matters when v_hat is tiny).")),
    "first moment not corrected": (dict(first_correction=False), (
        "You corrected the second moment's bias but not the first's: divide exp_avg by (1 - beta1**step) too.")),
    "betas swapped": (dict(swap_betas=True), (
        "beta1 and beta2 are swapped: beta1 (0.9) averages the gradient, beta2 (0.999) its square.")),
    "|g| for the second moment": (dict(abs_second=True), (
        "The second moment averages the squared gradient, g * g, not |g|.")),
}


def _start():
    g = torch.Generator().manual_seed(6)
    param = torch.randn(5, 3, generator=g, dtype=torch.float64)
    grads = [torch.randn(5, 3, generator=g, dtype=torch.float64) * scale for scale in (1.0, 0.1, 3.0, 0.01)]
    return param, grads


def torch_trajectory() -> list[torch.Tensor]:
    """The parameter after each of :data:`STEPS` steps of ``torch.optim.AdamW`` with :data:`SETTINGS`."""
    param, grads = _start()
    p = torch.nn.Parameter(param.clone())
    s = SETTINGS
    opt = torch.optim.AdamW([p], lr=s["lr"], betas=(s["beta1"], s["beta2"]), eps=s["eps"],
                            weight_decay=s["weight_decay"], foreach=False)
    out = []
    for grad in grads[:STEPS]:
        p.grad = grad.clone()
        opt.step()
        out.append(p.detach().clone())
    return out


def _trajectory(step_fn: Callable, **switches) -> list[torch.Tensor]:
    param, grads = _start()
    m, v = torch.zeros_like(param), torch.zeros_like(param)
    out = []
    for step, grad in enumerate(grads[:STEPS], start=1):
        param, m, v = step_fn(param, grad, m, v, step, **SETTINGS, **switches)
        out.append(param)
    return out


@_safe_check
def check_adamw_step(fn: Callable) -> CheckResult:
    """``fn(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay)`` -> ``(param, exp_avg,
    exp_avg_sq)``: one AdamW step, ``step`` counted from 1. Graded against ``torch.optim.AdamW`` over four steps
    in float64 (to 1e-10); each plausible mistake (no bias correction, L2 decay, decay without lr, eps inside the
    square root, one moment uncorrected, betas swapped, |g| for g²) is recognised by its own hint."""
    want = torch_trajectory()
    param, grads = _start()
    m, v = torch.zeros_like(param), torch.zeros_like(param)
    got = []
    for step, grad in enumerate(grads[:STEPS], start=1):
        result, err = _try(fn, param, grad, m, v, step, *SETTINGS.values(),
                           expect=_tensors(3, "three tensors (param, exp_avg, exp_avg_sq)"))
        if err:
            return _report(False, err)
        param, m, v = result
        if param.shape != want[0].shape:
            return _report(False, f"The new param has shape {tuple(param.shape)}; it keeps the shape "
                                  f"{tuple(want[0].shape)} of the parameter.")
        got.append(param.detach().to(torch.float64))
    if all(torch.allclose(a, b, rtol=1e-10, atol=1e-12) for a, b in zip(got, want)):
        return _report(True, f"Your update equals torch.optim.AdamW for {STEPS} steps: decoupled decay, "
                             "bias-corrected moments, eps outside the square root.")
    for name, (switches, hint) in MISTAKES.items():
        if all(torch.allclose(a, b, rtol=1e-10, atol=1e-12) for a, b in zip(got, _trajectory(reference_step,
                                                                                           **switches))):
            return _report(False, hint)
    first_bad = next(i for i, (a, b) in enumerate(zip(got, want), start=1)
                     if not torch.allclose(a, b, rtol=1e-10, atol=1e-12))
    gap = (got[first_bad - 1] - want[first_bad - 1]).abs().max().item()
    return _report(False, f"At step {first_bad} your parameter differs from torch.optim.AdamW's by up to {gap:.3g}. "
                          "One step: decay param by (1 - lr * wd); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g²; "
                          "param -= lr * (m / (1 - b1**t)) / (sqrt(v / (1 - b2**t)) + eps).")

