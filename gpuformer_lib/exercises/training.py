"""Checks for the exercises on losses, schedules and batching (chapters 6 and 7)."""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from gpuformer_lib.exercises._core import CheckResult, _close, _report, _try


def check_masked_cross_entropy(fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> CheckResult:
    """``fn(logits (B, T, V), targets (B, T), padding_mask (B, T), True at padding)``: the mean
    cross-entropy over the real (non-padding) tokens."""
    g = torch.Generator().manual_seed(0)
    logits, targets = torch.randn(3, 7, 11, generator=g), torch.randint(0, 11, (3, 7), generator=g)
    padding = torch.arange(7)[None, :] >= torch.tensor([7, 2, 4])[:, None]
    got, err = _try(fn, logits, targets, padding)
    if err:
        return _report(False, err)
    per_token = F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1), reduction="none").view(3, 7)
    want = per_token[~padding].mean()
    if _close(got, want.item(), rel=1e-5):
        return _report(True, "Sum the losses of the real tokens and divide by their number: every real token counts once.")
    if _close(got, per_token.mean().item(), rel=1e-5):
        return _report(False, "You averaged over every position, padding included: padding adds losses that "
                              "mean nothing. Keep only the positions where padding_mask is False.")
    per_sequence = torch.stack([per_token[b][~padding[b]].mean() for b in range(3)]).mean()
    if _close(got, per_sequence.item(), rel=1e-5):
        return _report(False, "You averaged each sequence, then the sequences: short sequences then weigh as much "
                              "as long ones. Average over all real tokens of the batch at once.")
    if _close(got, (per_token * ~padding).sum().item() / per_token.numel(), rel=1e-5):
        return _report(False, "The masked sum is right; divide by the number of real tokens, not of all positions.")
    return _report(False, f"Expected {want.item():.4f}, got {got!r}. Per-token losses: "
                          "F.cross_entropy(..., reduction='none').")


def check_label_smoothing(fn: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]) -> CheckResult:
    """``fn(logits (N, V), targets (N,), eps)``: cross-entropy with label smoothing ``eps``, as
    ``F.cross_entropy(..., label_smoothing=eps)`` defines it (eps spread over all V classes)."""
    g = torch.Generator().manual_seed(1)
    logits, targets = torch.randn(9, 6, generator=g), torch.randint(0, 6, (9,), generator=g)
    for eps in (0.1, 0.3):
        got, err = _try(fn, logits, targets, eps)
        if err:
            return _report(False, err)
        want = F.cross_entropy(logits, targets, label_smoothing=eps).item()
        if _close(got, want, rel=1e-5):
            continue
        logp = logits.log_softmax(-1)
        nll, uniform = -logp.gather(1, targets[:, None]).squeeze(1), -logp.mean(-1)
        others = (-logp.sum(-1) - nll) / (logits.shape[1] - 1)
        if _close(got, ((1 - eps) * nll + eps * others).mean().item(), rel=1e-5):
            return _report(False, "You spread eps over the V - 1 wrong classes; PyTorch (and the exercise) spreads it "
                                  "over all V classes: (1 - eps) * nll + eps * mean over classes of -log p.")
        if _close(got, (nll + eps * uniform).mean().item(), rel=1e-5):
            return _report(False, "Weight the true-class term by (1 - eps): the target is a mixture of one-hot and uniform.")
        return _report(False, f"For eps={eps} expected {want:.4f}, got {got!r}.")
    return _report(True, "(1 - eps) * NLL + eps * the mean of -log p over all classes: it stops the model chasing certainty.")


def check_warmup_schedule(fn: Callable[[int, int, int], float]) -> CheckResult:
    """``fn(step, d_model, warmup)``: the paper's learning rate, d^-0.5 * min(step^-0.5, step * warmup^-1.5),
    for steps counted from 1."""
    for step, d, w in ((1, 512, 4000), (4000, 512, 4000), (100_000, 512, 4000), (10, 64, 100)):
        got, err = _try(fn, step, d, w)
        if err:
            return _report(False, err)
        want = d ** -0.5 * min(step ** -0.5, step * w ** -1.5)
        if _close(got, want, rel=1e-6):
            continue
        if _close(got, min(step ** -0.5, step * w ** -1.5), rel=1e-6):
            return _report(False, "Missing the factor d_model^-0.5: wider models get smaller steps.")
        if _close(got, d ** -0.5 * max(step ** -0.5, step * w ** -1.5), rel=1e-6):
            return _report(False, "Use min, not max: warm up linearly, then decay as 1/sqrt(step).")
        return _report(False, f"For step={step}, d_model={d}, warmup={w} expected {want:.3e}, got {got!r}.")
    peak = 512 ** -0.5 * 4000 ** -0.5
    return _report(True, f"The base model peaks at step 4000 at {peak:.2e} and then decays as 1/sqrt(step).")


def check_collate(fn: Callable[[list[torch.Tensor], int], tuple[torch.Tensor, torch.Tensor]]) -> CheckResult:
    """``fn(sequences, pad_id)`` stacks 1-D id tensors into (B, T_max), padding on the right, and returns
    it with the padding mask (True at padding)."""
    seqs = [torch.tensor([5, 6, 7]), torch.tensor([8]), torch.tensor([9, 10])]
    got, err = _try(fn, seqs, 0)
    if err:
        return _report(False, err)
    if not (isinstance(got, tuple) and len(got) == 2):
        return _report(False, "Return two tensors: (padded ids, padding mask).")
    ids, mask = got
    want = torch.tensor([[5, 6, 7], [8, 0, 0], [9, 10, 0]])
    want_mask = want == 0
    if ids.shape != want.shape:
        return _report(False, f"Pad to the longest sequence: expected shape {tuple(want.shape)}, got {tuple(ids.shape)}.")
    if torch.equal(ids, torch.tensor([[5, 6, 7], [0, 0, 8], [0, 9, 10]])):
        return _report(False, "That pads on the left; pad on the right, so position t is token t of every sequence.")
    if not torch.equal(ids, want):
        return _report(False, f"Expected ids\n{want}\ngot\n{ids}")
    if torch.equal(mask.bool(), ~want_mask):
        return _report(False, "The mask is inverted: True must mark padding.")
    if not torch.equal(mask, want_mask):
        return _report(False, "The mask should be a bool tensor, True exactly where padding was added.")
    return _report(True, "Right-padded ids and their mask; the model and the loss both need the mask.")
