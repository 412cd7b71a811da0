"""Losses written out: masked cross-entropy, and the last layer of a classifier with its backward
pass derived by hand.

Covers: ``masked_cross_entropy`` (the mean over real tokens only; what
``F.cross_entropy(..., ignore_index=pad)`` computes) and ``LinearSoftmaxCrossEntropy``, a linear
layer, softmax and cross-entropy with the gradient dL/dz = (p - y) / N written by hand, checked by
``gradcheck`` in the tests. Leaves out: everything PyTorch already provides well (MSE, label smoothing
via ``F.cross_entropy(label_smoothing=...)``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def masked_cross_entropy(logits: Tensor, targets: Tensor, padding_mask: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """Mean cross-entropy over the real tokens: logits (B, T, V), targets (B, T), padding_mask (B, T)
    True at padding. Every real token weighs the same, however the padding is spread."""
    if logits.shape[:-1] != targets.shape or targets.shape != padding_mask.shape:
        raise ValueError(f"logits {tuple(logits.shape)}, targets {tuple(targets.shape)} and padding_mask "
                         f"{tuple(padding_mask.shape)} must agree on (B, T)")
    real = ~padding_mask
    if not real.any():
        raise ValueError("every position is padding: there is no token to compute a loss on")
    return F.cross_entropy(logits[real], targets[real], label_smoothing=label_smoothing)


class LinearSoftmaxCrossEntropy(torch.autograd.Function):
    """loss = cross_entropy(x W^T + b, targets), mean over N, with a hand-written backward."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, targets: Tensor) -> Tensor:
        z = x @ weight.T + bias  # (N, C) x (C, V) -> (N, V)
        log_p = z - z.logsumexp(dim=1, keepdim=True)  # stable log-softmax
        ctx.save_for_backward(x, weight, log_p.exp(), targets)
        return -log_p[torch.arange(len(targets)), targets].mean()

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x, weight, p, targets = ctx.saved_tensors
        dz = p.clone()
        dz[torch.arange(len(targets)), targets] -= 1  # p - y
        dz *= grad_out / len(targets)  # (N, V)
        return dz @ weight, dz.T @ x, dz.sum(0), None  # dx (N, C), dW (V, C), db (V,)


def linear_softmax_cross_entropy(x: Tensor, weight: Tensor, bias: Tensor, targets: Tensor) -> Tensor:
    return LinearSoftmaxCrossEntropy.apply(x, weight, bias, targets)
