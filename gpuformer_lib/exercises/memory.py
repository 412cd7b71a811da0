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
    float32 pre-LN GELU layer (d_ff = 4 d_model, fused attention, no dropout) keeps for its backward pass.
    Graded against the tensor-by-tensor count (``memory.layer_activation_bytes``) within 3 %, on three
    shapes; the usual mistakes get their own hints (ReLU's count for GELU, a forgotten LayerNorm input or
    Q, K and V, explicit attention's T x T tensors, 16-bit or values-not-bytes, the paper's 34 s b h). The
    check also measures a real ``EncoderLayer`` with ``memory.SavedActivations`` and shows it beside the
    count (it agrees to 1 %, the small boolean masks)."""
    from gpuformer_lib.exercises.predictions import grade_model
    from gpuformer_lib.layers import EncoderLayer
    from gpuformer_lib.memory import SavedActivations, layer_activation_bytes

    for C, H, T, B in [(64, 4, 32, 2), (128, 8, 64, 3), (96, 2, 100, 1)]:
        got, err = _try(fn, C, H, T, B, expect=_number)
        if err:
            return _report(False, err)
        tokens = T * B
        right = layer_activation_bytes(d_model=C, n_heads=H, seq_len=T, batch_size=B, activation="gelu")
        if _close(got, right, 0.03):
            continue
        torch.manual_seed(0)
        layer = EncoderLayer(C, H, 4 * C, dropout=0.0, norm_first=True, activation="gelu", causal=True)
        with SavedActivations(layer) as saved:
            layer(torch.randn(B, T, C, requires_grad=True))
        wrong = {
            "the count of a ReLU layer": (
                layer_activation_bytes(d_model=C, n_heads=H, seq_len=T, batch_size=B, activation="relu"),
                "The feed-forward's 4C-wide tensors count twice here: GELU's backward needs its input, and the "
                "second projection keeps GELU's output. Only ReLU, whose backward needs just its output (the "
                "same tensor as that projection's input), keeps one."),
            "a count without the LayerNorms' inputs": (
                right - tokens * 2 * C * 4,
                "Each LayerNorm keeps its input (the residual stream, C values a token) for its backward pass: "
                "two per layer."),
            "a count without Q, K and V": (
                right - tokens * 3 * C * 4,
                "The attention kernel keeps Q, K and V (3C values a token) besides the input of the QKV "
                "projection: its backward needs them to recompute the scores."),
            "explicit attention's count": (
                right - tokens * H * 4 + tokens * 2 * H * T * 4,
                "This layer uses fused attention: no T x T scores are kept, only a float32 log-sum-exp per head "
                "and token. The 2 H T values a token are explicit attention's softmax output and masked weights."),
            "16-bit values": (
                right // 2,
                "The layer is float32: 4 bytes a value, not 2 (16 bits are for autocast, chapter 8)."),
            "the count of values, not bytes": (
                right / 4,
                "You counted values: times 4 for float32 bytes."),
            "Korthikanti et al.'s 34 s b h": (
                34 * C * tokens,
                "Korthikanti et al.'s 34 s b h counts 16-bit activations with dropout masks for their layer; "
                "count this float32 layer's tensors one by one, as section 9.1 does."),
        }
        return grade_model(
            got, right, quantity=f"the layer's saved activations at C={C}, H={H}, T={T}, B={B}", unit="bytes",
            wrong={k: v for k, v in wrong.items() if abs(v[0] / right - 1) > 0.06}, rel=0.03,
            measured=saved.bytes, measured_by="SavedActivations measured",
            too_high=("Count only what autograd saves: the LayerNorms' inputs, the projections' inputs, Q, K, V, "
                      "the feed-forward's 4C-wide tensors twice and a log-sum-exp per head, 4 bytes a value."),
            too_low=("Count the LayerNorm inputs, the projections' inputs, Q, K, V, and the feed-forward's "
                     "4C-wide tensors twice, 4 bytes a value, plus a float32 log-sum-exp per head."))
    return _report(True, "16 float32 values per token and channel, plus a small log-sum-exp per head: the formula "
                         "memory.layer_activation_bytes uses (a ReLU layer keeps one 4C-wide tensor less: 12).")


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


def check_loss_peak_prediction(predicted, measured: float, *, logits: tuple[int, int, int] = (4, 32, 2048)
                               ) -> CheckResult:
    """Predict, then measure: the bytes alive at the moment of the loss's backward pass beyond the layers'
    activations, for float32 ``logits`` of B x T x V (``F.cross_entropy``). Graded against the count, three
    float32 B·T·V tensors (12 bytes a logit), within 5 %; the usual mistakes get their own hints (two of the
    three, section 9.1's 8 bytes a logit beyond the saved tensors; the log-probs alone; the logits counted too;
    bits, 16 bits, MiB). ``measured`` (``activation_accounting.LiveBytes``, in the notebook) is shown beside
    the count, not graded."""
    from gpuformer_lib.exercises.predictions import _positive, grade_model

    if (not isinstance(logits, tuple) or len(logits) != 3
            or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in logits)):
        raise ValueError(f"logits is the shape (B, T, V), three positive ints, got {logits!r}")
    measured = _positive("measured", measured)
    B, T, V = logits
    n = B * T * V
    right = 12 * n
    wrong = {
        "8 bytes a logit, two tensors": (
            8 * n, "Section 9.1's 8 bytes a logit are what the loss's backward adds beyond the saved tensors; "
                   "counted beyond the layers' activations, the float32 log-probs the loss saved are alive too: "
                   "three B·T·V tensors, the log-probs and the two gradients."),
        "the saved log-probs alone": (
            4 * n, "The log-probs the loss saved are one of three: its backward writes the gradient of the "
                   "log-probs and then the gradient of the logits, both B·T·V float32, while the log-probs live."),
        "the logits counted as well": (
            16 * n, "The logits themselves are gone by then (nothing saved them: log-softmax keeps its output, "
                    "not its input): count the log-probs and the two gradients only."),
        "bits, not bytes": (
            3 * 32 * n, "A float32 value is 4 bytes (32 bits): count bytes."),
        "16-bit values": (
            3 * 2 * n, "The logits are float32 here, and the loss computes in float32: 4 bytes a value, not 2."),
        "the right count in MiB": (
            right / 2**20, "That is MiB: the question asks for bytes."),
    }
    return grade_model(
        predicted, right, quantity="the bytes alive at the loss's backward pass beyond the layers' activations",
        unit="bytes", wrong=wrong, rel=0.05, measured=measured, measured_by="LiveBytes measured",
        too_low=("Count every B·T·V tensor alive at once while log-softmax's backward runs: the float32 log-probs "
                 "the loss saved, the gradient of the log-probs that NLL's backward writes (dense, though only one "
                 "entry per row is non-zero), and the gradient of the logits that log-softmax's backward writes."),
        too_high=("The logits themselves are gone by then (nothing saved them: log-softmax keeps its output, not its "
                  "input), and so is any copy made in the forward pass. Count only what exists during the backward "
                  "of the loss; 4 bytes per float32 value."),
        why_close=("Three float32 B·T·V tensors: the saved log-probs and the two gradients, 12 bytes per logit. The "
                   "rest is the targets and a few scalars."))


@_safe_check
def check_low_memory_loss(fn: Callable) -> CheckResult:
    """Diagnose and fix: ``fn(hidden, head, targets)`` returns the mean cross-entropy of ``head(hidden)`` against
    ``targets`` (rows with -100 ignored) with the same value and gradients as ``F.cross_entropy``, but a
    measured peak (``LiveBytes``) under a third of the plain loss's. The peak is counted, not timed (the same
    bytes on every run), and the plain loss, the chunked loss that autograd keeps whole, and the two wrong
    means (over all rows, of the chunks' means) each get their own hint."""
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
        with torch.no_grad():
            summed = F.cross_entropy(head(hidden).float(), targets, reduction="sum")
        hint = (" That divides by all the rows, the ignored (-100) ones included."
                if torch.allclose(l1, summed / len(targets), rtol=1e-4, atol=1e-5) else
                " (A mean of the chunks' means would weigh each chunk alike, however many real targets it holds.)")
        return _report(False, f"loss {float(l1):.5f}, expected {float(l0):.5f}: sum the chunks' summed losses and "
                              f"divide once by the number of real (not -100) targets.{hint}")
    if not (torch.allclose(g1, g0, rtol=1e-3, atol=1e-6) and torch.allclose(w1, w0, rtol=1e-3, atol=1e-6)):
        return _report(False, "the loss is right but the gradients are not: is every chunk in the graph once?")
    ratio = p1 / p0
    if ratio > 0.9:
        return _report(False, f"measured peak {p1 / 2**20:.1f} MiB, {ratio:.0%} of the plain loss's "
                              f"{p0 / 2**20:.1f} MiB: the same value and gradients, and the same peak, because the "
                              "whole (N, V) logits and their log-probs still exist at once. Compute the loss in "
                              "chunks of rows, and recompute each chunk in the backward pass.")
    if ratio > 1 / 3:
        return _report(False, f"measured peak {p1 / 2**20:.1f} MiB, {ratio:.0%} of the plain loss's "
                              f"{p0 / 2**20:.1f} MiB: computing the loss in chunks is not enough if autograd keeps "
                              "every chunk's log-probs for the backward pass. Recompute each chunk in the backward "
                              "pass (torch.utils.checkpoint around the chunk's projection and loss).")
    return _report(True, f"Peak {p1 / 2**20:.1f} MiB against {p0 / 2**20:.1f} MiB ({ratio:.0%}), same loss and "
                         "gradients: the (N, V) tensors now exist a chunk at a time, paid for with a second "
                         "projection in the backward pass (activation_accounting.chunked_cross_entropy).")
