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


def masked_cross_entropy(logits: Tensor, targets: Tensor, padding_mask: Tensor, label_smoothing: float = 0.0, *,
                         allow_empty: bool = False) -> Tensor:
    """Mean cross-entropy over the real tokens: logits (B, T, V), targets (B, T), padding_mask (B, T)
    True at padding. Every real token weighs the same, however the padding is spread.

    A target below 0 (PyTorch's ``ignore_index=-100``) counts as padding too. A batch that is all
    padding has no token to average over: that is almost always a bug upstream (a mask the wrong way
    round, targets all -100), so it raises ``ValueError`` unless ``allow_empty=True``, which a loop
    accumulating micro-batches passes (one micro-batch may hold only padding; the step as a whole is
    checked, as :func:`gpuformer_lib.train.train` does). Then its loss is 0, and so is its gradient
    (never NaN, whose 0 / 0 would spread to every weight). The check reads one boolean back from the
    device; with ``allow_empty=True`` nothing is read back: no boolean indexing, whose output size the
    host would have to wait for."""
    if not all(isinstance(t, Tensor) for t in (logits, targets, padding_mask)):
        raise TypeError("masked_cross_entropy takes three tensors: logits (B, T, V), targets (B, T) and "
                        "padding_mask (B, T)")
    if logits.dim() != 3 or logits.shape[:-1] != targets.shape or targets.shape != padding_mask.shape:
        raise ValueError(f"logits {tuple(logits.shape)}, targets {tuple(targets.shape)} and padding_mask "
                         f"{tuple(padding_mask.shape)} must agree: (B, T, V), (B, T) and (B, T)")
    if not logits.is_floating_point():
        raise TypeError(f"logits must be floating point, got {logits.dtype}")
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        raise TypeError(f"targets must be integer class ids (torch.long), got {targets.dtype}")
    if padding_mask.dtype != torch.bool:
        raise TypeError(f"padding_mask must be a bool tensor, True at padding; got {padding_mask.dtype}. A 0/1 mask "
                        "is ambiguous: Hugging Face's attention_mask is 1 at real tokens, the opposite. Pass "
                        "attention_mask == 0 for that one, or mask == 1 for a mask that is 1 at padding")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) \
            or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be a number in [0, 1], got {label_smoothing!r}")
    padding = padding_mask | (targets < 0)  # ignore_index=-100 and the like: no token to learn there
    if not allow_empty and bool(padding.all()):
        raise ValueError(f"every one of the {padding.numel()} target positions is padding (padding_mask True, or a "
                         "target below 0 such as -100), so there is no token to average the loss over: is the mask "
                         "the wrong way round (True marks padding here)? Pass allow_empty=True where a batch of "
                         "only padding is expected (a micro-batch in gradient accumulation); its loss is then 0")
    # padding positions get logits 0 and target 0: finite values whatever was there, and their losses are
    # dropped below, so the backward pass sends them an exact 0
    logits = logits.masked_fill(padding[..., None], 0.0)
    per_token = F.cross_entropy(logits.flatten(0, 1), targets.masked_fill(padding, 0).flatten(), reduction="none",
                                label_smoothing=label_smoothing)  # (B*T, V) -> (B*T,)
    real = ~padding.flatten()
    return per_token.masked_fill(~real, 0.0).sum() / real.sum().clamp(min=1)


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
    """cross_entropy(x W^T + b, targets), mean over N, by :class:`LinearSoftmaxCrossEntropy`: x (N, C),
    weight (V, C), bias (V,), targets (N,) class ids in [0, V). The shapes are checked, since a wrong one
    would broadcast into a wrong mean; so are the ids (a teaching function: the check reads them back)."""
    if not all(isinstance(t, Tensor) for t in (x, weight, bias, targets)):
        raise TypeError("linear_softmax_cross_entropy takes four tensors: x (N, C), weight (V, C), bias (V,), "
                        "targets (N,)")
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1] or tuple(bias.shape) != weight.shape[:1] \
            or tuple(targets.shape) != x.shape[:1] or x.shape[0] == 0:
        raise ValueError(f"x {tuple(x.shape)}, weight {tuple(weight.shape)}, bias {tuple(bias.shape)} and targets "
                         f"{tuple(targets.shape)} must be (N, C), (V, C), (V,) and (N,) with N >= 1")
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        raise TypeError(f"targets must be integer class ids (torch.long), got {targets.dtype}")
    if targets.min() < 0 or targets.max() >= weight.shape[0]:
        raise ValueError(f"targets must lie in [0, {weight.shape[0]}) (V = weight.shape[0]), got ids from "
                         f"{int(targets.min())} to {int(targets.max())}")
    return LinearSoftmaxCrossEntropy.apply(x, weight, bias, targets)
