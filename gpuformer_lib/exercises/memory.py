"""Checks for the exercises on accumulation, activation memory and out-of-memory recovery (chapter 9)."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from gpuformer_lib.exercises._answers import _number, _numbers
from gpuformer_lib.exercises._core import CheckResult, _close, _report, _safe_check, _timed_out, _try


@_safe_check
def check_accumulated_loss(fn: Callable[[Sequence[torch.Tensor], Sequence[int]], torch.Tensor]) -> CheckResult:
    """``fn(micro_losses, micro_tokens)``: combine the mean losses of the micro-batches (each over its
    own real tokens) into the loss whose gradient equals one large batch's mean over all its tokens."""
    cases = [([2.0, 4.0], [10, 10]), ([2.0, 4.0], [30, 10]), ([1.0, 3.0, 0.5], [5, 1, 14]), ([0.7], [9])]
    for losses, tokens in cases:
        got, err = _try(fn, [torch.tensor(x) for x in losses], list(tokens), expect=_number)
        if err:
            return _report(False, err)
        want = sum(l * n for l, n in zip(losses, tokens)) / sum(tokens)
        if not _close(got, want, 1e-5):
            mean_of_means = sum(losses) / len(losses)
            hint = (" That is the mean of the means: it weighs a micro-batch of few real tokens as much as a full one."
                    if _close(got, mean_of_means, 1e-5) else "")
            return _report(False, f"losses {losses} over {tokens} tokens: expected {want:.4f}, got {float(got):.4f}."
                                  f"{hint} Each mean times its token count is that micro-batch's summed loss.")
    return _report(True, "Sum the token-weighted losses and divide by all the step's tokens; the training loop does "
                         "this with normalize_by='tokens'.")


@_safe_check
def check_layer_activation_prediction(fn: Callable[[int, int, int, int], float]) -> CheckResult:
    """Predict, then measure: ``fn(d_model, n_heads, seq_len, batch_size)`` returns the bytes one
    float32 pre-LN layer (d_ff = 4 d_model, fused attention, no dropout) keeps for its backward pass.
    The check measures a real ``EncoderLayer`` with ``memory.SavedActivations`` and accepts 3 %."""
    from gpuformer_lib.layers import EncoderLayer
    from gpuformer_lib.memory import SavedActivations

    for C, H, T, B in [(64, 4, 32, 2), (128, 8, 64, 3), (96, 2, 100, 1)]:
        got, err = _try(fn, C, H, T, B, expect=_number)
        if err:
            return _report(False, err)
        torch.manual_seed(0)
        layer = EncoderLayer(C, H, 4 * C, dropout=0.0, norm_first=True, activation="gelu", causal=True)
        x = torch.randn(B, T, C, requires_grad=True)
        with SavedActivations(layer) as saved:
            layer(x)
        measured = saved.bytes
        ratio = got / measured
        if not 0.97 <= ratio <= 1.03:
            per_token = measured / (T * B * C * 4)
            return _report(False, f"C={C}, H={H}, T={T}, B={B}: measured {measured:,} bytes, you predicted "
                                  f"{float(got):,.0f} ({ratio:.2f}x). Measured is about {per_token:.1f} float32 values "
                                  "per token and channel: count the LayerNorm inputs, the projections' inputs, Q, K, "
                                  "V, and the feed-forward's 4C-wide tensors twice.")
    return _report(True, "16 float32 values per token and channel, plus a small log-sum-exp per head: the formula "
                         "memory.layer_activation_bytes uses.")


@_safe_check
def check_micro_batch_plan(fn: Callable[[int, Callable[[int], bool]], tuple[int, int]]) -> CheckResult:
    """``fn(batch_size, fits)``: start at the whole batch and halve the micro-batch until
    ``fits(micro_batch)`` is True; return ``(micro_batch, accumulation_steps)`` with their product
    ``batch_size``. Raise ``torch.OutOfMemoryError`` if even a micro-batch of 1 does not fit."""
    for batch, limit in [(32, 8), (32, 32), (12, 3), (64, 1), (8, 5)]:
        tried: list[int] = []

        def fits(micro: int, limit=limit, tried=tried) -> bool:
            tried.append(micro)
            return micro <= limit

        got, err = _try(fn, batch, fits, expect=_numbers(2, "a pair (micro_batch, accumulation_steps)"))
        if err:
            return _report(False, err)
        want_micro = batch
        while want_micro > limit:
            want_micro //= 2
        if got != (want_micro, batch // want_micro):
            return _report(False, f"batch {batch}, micro-batches up to {limit} fit: expected "
                                  f"{(want_micro, batch // want_micro)}, got {got!r} (you tried {tried}).")
        if not tried or tried[0] != batch:
            return _report(False, "try the whole batch first: no accumulation is fastest when it fits")
    _, err = _try(fn, 16, lambda micro: False)
    if _timed_out(err):
        return _report(False, f"when nothing fits: {err} Stop halving at a micro-batch of 1.")
    if err is None or "OutOfMemoryError" not in err:
        return _report(False, "when nothing fits, raise torch.OutOfMemoryError with advice (shorter sequences, "
                              "checkpointing, bf16) instead of returning a plan that will crash")
    return _report(True, "Halving keeps micro-batch x steps = the batch the optimizer sees; memory.fit_micro_batch "
                         "does the same with real out-of-memory errors.")
