"""Checks for the exercises on accumulation, activation memory and out-of-memory recovery (chapter 9)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from gpuformer_lib.exercises._answers import _number, _numbers
from gpuformer_lib.exercises._core import (CheckResult, _close, _describe, _report, _run_limited, _safe_check,
                                            _stub_raised, _timed_out, _try)


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


# --------------------------------------------------------------------------- second edition: predict, measure, diagnose


def check_loss_peak_prediction(predicted, measured: float) -> CheckResult:
    """Predict, then measure: the bytes alive at the moment of the loss's backward pass beyond the layers'
    activations, for float32 logits of B x T x V (``F.cross_entropy``). The notebook measures them with
    ``activation_accounting.LiveBytes``; this grades within 15 %."""
    from gpuformer_lib.exercises.predictions import grade_prediction

    return grade_prediction(
        predicted, measured, quantity="the bytes alive at the loss's backward pass beyond the layers' activations",
        unit="bytes", within=1.15,
        too_low=("Count every B·T·V tensor alive at once while log-softmax's backward runs: the float32 log-probs "
                 "the loss saved, the gradient of the log-probs that NLL's backward writes (dense, though only one "
                 "entry per row is non-zero), and the gradient of the logits that log-softmax's backward writes: "
                 "three float32 tensors, 12 bytes per logit."),
        too_high=("The logits themselves are gone by then (nothing saved them: log-softmax keeps its output, not its "
                  "input), and so is any copy made in the forward pass. Count only what exists during the backward "
                  "of the loss; 4 bytes per float32 value, not 32."),
        why_close=("Three float32 B·T·V tensors: the saved log-probs and the two gradients, 12 bytes per logit. The "
                   "rest is the targets and a few scalars."))


@_safe_check
def check_low_memory_loss(fn: Callable) -> CheckResult:
    """Diagnose and fix: ``fn(hidden, head, targets)`` returns the mean cross-entropy of ``head(hidden)`` against
    ``targets`` (rows with -100 ignored) with the same value and gradients as ``F.cross_entropy``, but a
    measured peak (``LiveBytes``) under a third of the plain loss's."""
    import torch.nn.functional as F

    from gpuformer_lib.activation_accounting import LiveBytes

    torch.manual_seed(0)
    N, C, V = 512, 32, 4096
    head = torch.nn.Linear(C, V, bias=False)
    hidden = torch.randn(N, C, requires_grad=True)
    targets = torch.randint(0, V, (N,))
    targets[:7] = -100
    def measure(f: Callable) -> tuple[Any, int]:
        hidden.grad = head.weight.grad = None
        with LiveBytes() as live:
            loss = f(hidden, head, targets)
            loss.backward()
        return loss, live.peak

    if not callable(fn):
        return _report(False, f"Pass your function itself, e.g. check_low_memory_loss(my_loss), not {_describe(fn)}.")
    results = []
    for learners, f in ((False, lambda h, w, y: F.cross_entropy(w(h).float(), y)), (True, fn)):
        try:  # the learner's forward and backward both run under the checks' time limit
            measured, hint = _run_limited(measure, f) if learners else (measure(f), None)
        except NotImplementedError as error:
            return _report(False, _stub_raised() if not str(error) else f"your function raised NotImplementedError: "
                                                                         f"{error}")
        except Exception as error:  # noqa: BLE001 - the learner's code: reported, not raised
            return _report(False, f"your function raised {type(error).__name__}: {error}")
        if hint:
            return _report(False, hint)
        loss, peak = measured
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            return _report(False, f"return the loss as a 0-dimensional tensor, got {_describe(loss)}")
        results.append((loss.detach(), hidden.grad, head.weight.grad, peak))
    (l0, g0, w0, p0), (l1, g1, w1, p1) = results
    if g1 is None or w1 is None:
        return _report(False, "the gradients did not reach hidden and head.weight: keep the computation in autograd "
                              "(no torch.no_grad, no .detach())")
    if not torch.allclose(l1, l0, rtol=1e-4, atol=1e-5):
        return _report(False, f"loss {float(l1):.5f}, expected {float(l0):.5f}: sum the chunks' summed losses and "
                              "divide once by the number of real (not -100) targets")
    if not (torch.allclose(g1, g0, rtol=1e-3, atol=1e-6) and torch.allclose(w1, w0, rtol=1e-3, atol=1e-6)):
        return _report(False, "the loss is right but the gradients are not: is every chunk in the graph once?")
    ratio = p1 / p0
    if ratio > 1 / 3:
        return _report(False, f"measured peak {p1 / 2**20:.1f} MiB, {ratio:.0%} of the plain loss's "
                              f"{p0 / 2**20:.1f} MiB: computing the loss in chunks is not enough if autograd keeps "
                              "every chunk's log-probs for the backward pass. Recompute each chunk in the backward "
                              "pass (torch.utils.checkpoint around the chunk's projection and loss).")
    return _report(True, f"Peak {p1 / 2**20:.1f} MiB against {p0 / 2**20:.1f} MiB ({ratio:.0%}), same loss and "
                         "gradients: the (N, V) tensors now exist a chunk at a time, paid for with a second "
                         "projection in the backward pass (activation_accounting.chunked_cross_entropy).")
