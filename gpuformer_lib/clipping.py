"""Gradient clipping by global norm, from scratch: the norm, the clip coefficient, the rescale.

One bad batch (a rare token, a long sequence, a loss spike) can give a gradient many times larger than
usual; one step along it can undo hours of training. Clipping by the *global* norm bounds the step
without changing its direction (Pascanu, Mikolov and Bengio 2013, "On the difficulty of training
recurrent neural networks", algorithm 1):

.. math::

    \\|g\\| = \\sqrt{\\textstyle\\sum_i \\sum_j g_{ij}^2}, \\qquad
    c = \\min\\Big(1, \\frac{\\tau}{\\|g\\| + 10^{-6}}\\Big), \\qquad g_i \\leftarrow c\\, g_i,

over every parameter tensor ``i`` at once (not per tensor: per-tensor clipping would change the
direction). GPT-2/3-style training clips at ``tau = 1.0``. :func:`clip_grad_norm` does what
``torch.nn.utils.clip_grad_norm_`` does (the 1e-6, the float32 accumulation, the multiply even when
``c = 1``, ``error_if_nonfinite``), and ``tests/test_clipping.py`` checks them equal, foreach or not, with
non-finite gradients too. :func:`global_grad_norm` and :func:`clip_coefficient` are its two halves.

Leaves out: clipping by value (``clip_grad_value_``), norms other than L2 and infinity, and the
distributed case (where the squared norms of the shards are summed across ranks before the square root).
"""

from __future__ import annotations

import math
import numbers
from typing import Iterable

import torch

EPS = 1e-6
"""Added to the norm in the clip coefficient, as PyTorch does: no division by zero for a zero gradient."""


def _grads(parameters: Iterable[torch.Tensor] | torch.Tensor) -> list[torch.Tensor]:
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    return [p.grad for p in parameters if p.grad is not None]


def global_grad_norm(parameters: Iterable[torch.Tensor] | torch.Tensor, norm_type: float = 2.0) -> torch.Tensor:
    """The norm of all gradients together, as if concatenated into one vector: the square root of the sum,
    over tensors, of each tensor's squared norm (``norm_type=2``), or the largest absolute entry
    (``norm_type=inf``). A 0-d float32 tensor (or the gradients' dtype when wider); 0 with no gradients."""
    if isinstance(norm_type, bool) or not isinstance(norm_type, numbers.Real) or norm_type not in (2, math.inf):
        raise ValueError(f"norm_type must be 2 or math.inf, got {norm_type!r}")
    grads = _grads(parameters)
    if not grads:
        return torch.tensor(0.0)
    dtype = torch.promote_types(torch.float32, grads[0].dtype)
    if norm_type == math.inf:
        return torch.stack([g.detach().abs().max().to(dtype) for g in grads]).max()
    per_tensor = torch.stack([torch.linalg.vector_norm(g.detach(), 2, dtype=dtype) for g in grads])  # (n_tensors,)
    return torch.linalg.vector_norm(per_tensor, 2)  # sqrt(sum of squared per-tensor norms)


def clip_coefficient(total_norm: torch.Tensor | float, max_norm: float) -> torch.Tensor:
    """``min(1, max_norm / (total_norm + 1e-6))``: the factor every gradient is multiplied by. A tensor, so
    that computing it needs no read-back to the host (on a GPU the step stays asynchronous)."""
    if isinstance(max_norm, bool) or not isinstance(max_norm, numbers.Real) or math.isnan(max_norm) or max_norm <= 0:
        raise ValueError(f"max_norm must be a positive number, got {max_norm!r}")
    total_norm = torch.as_tensor(total_norm, dtype=torch.float32)
    return torch.clamp(max_norm / (total_norm + EPS), max=1.0)


def clip_grad_norm(parameters: Iterable[torch.Tensor] | torch.Tensor, max_norm: float, norm_type: float = 2.0,
                   error_if_nonfinite: bool = False) -> torch.Tensor:
    """Rescale the gradients in place so that their global norm is at most ``max_norm``; return the norm
    they had before. With a non-finite norm the result follows IEEE arithmetic, as in PyTorch: an inf
    gradient makes the norm inf and the coefficient ``max_norm / inf = 0``, so every finite gradient becomes
    0 and each inf entry NaN (``0 * inf``); a NaN gradient makes the norm and the coefficient NaN, and every
    gradient NaN. ``error_if_nonfinite`` raises instead. Either way the step must then be skipped (mixed
    precision's GradScaler does it for you, chapter 8)."""
    parameters = list(parameters) if not isinstance(parameters, torch.Tensor) else [parameters]
    total = global_grad_norm(parameters, norm_type)
    if error_if_nonfinite and not bool(torch.isfinite(total)):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, "
                           "so it cannot be clipped. To disable this error and scale the gradients by the "
                           "non-finite norm anyway, set `error_if_nonfinite=False`")
    coef = clip_coefficient(total, max_norm)
    for g in _grads(parameters):
        g.detach().mul_(coef.to(g.device, g.dtype))  # multiplied even when coef == 1: no read-back to decide
    return total
