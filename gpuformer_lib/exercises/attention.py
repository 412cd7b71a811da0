"""Checks for attention's exercises that need a prediction, a measurement or a diagnosis (chapter 3).

- :func:`check_attention_memory_prediction`: predict the peak bytes explicit attention holds for a
  (B, H, T, dtype), forward or forward and backward; graded against the count of (B, H, T, T) matrices alive at
  once, each usual miscount named; the notebook's measurement (``tiled_attention.peak_bytes``) is shown beside it;
- :func:`check_online_softmax_update`: a buggy step of the online softmax is shown; the learner writes the
  fixed one, which is tried on rows split into blocks and compared with ``torch.softmax``'s normaliser,
  and the usual mistakes (no rescaling, rescaling the wrong way, NaN on a fully masked row) are named.

The transcription checks of the chapter (masks, attention) live in ``exercises.transformer``.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from gpuformer_lib.exercises._core import CheckResult, _describe, _report, _safe_check, _try


def check_attention_memory_prediction(predicted, measured: float | None = None, *, shape: tuple[int, ...],
                                      backward: bool = False, dtype: torch.dtype = torch.float32) -> CheckResult:
    """Predict, then measure: the peak bytes of explicit attention's (B, H, T, T) matrices, forward
    (``backward=False``) or forward and backward, for q, k, v of ``shape`` (B, H, T, hs) and ``dtype``.

    Graded against the count of matrices alive at once (two forward: the scores and the probabilities while the
    softmax runs; three with the backward: the probabilities kept for it, their gradient and the scores'
    gradient), within half a matrix or so, because the counts differ by whole matrices and a measurement's
    extras (q·scale, the output, an allocator's rounding) are a fraction of one. The usual miscounts are named.
    ``measured`` (peak bytes this device measured, optional) is shown beside the model, not graded."""
    shape = tuple(int(d) for d in shape)  # the notebook's q.shape: bad input raises here, not as a hint
    if len(shape) < 2 or min(shape) < 1:
        raise ValueError(f"shape is q's shape, (B, H, T, hs), got {shape!r}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    one = math.prod(shape[:-1]) * shape[-2] * itemsize  # one (B, H, T, T) matrix, in bytes
    what = "forward and backward" if backward else "the forward pass"
    right = 3 if backward else 2
    freed = ("Each intermediate is freed as soon as nothing uses it: the scores once the softmax has read them"
             + (" (the softmax's backward needs only its output, the probabilities)" if backward else
                ", and the softmax is one operation, its exponentials never a tensor of their own") + ".")
    wrong = {
        "one (B, H, T, T) float32 matrix": (
            one, "Count how many (B, H, T, T) matrices are alive at the same moment, not only one: the softmax "
                 "reads the scores while it writes the probabilities" + (
                     ", and the backward keeps the probabilities while it makes the gradients." if backward else ".")
                 + f" (And {itemsize} bytes per element in {str(dtype).removeprefix('torch.')}.)"),
        "counting the matrices in bits": (
            8 * right * one, "Bits or bytes? An element of float32 is 4 bytes, not 32."),
    }
    if backward:
        wrong.update({
            "the forward pass's two matrices": (
                2 * one, "That is the forward pass's peak. The backward keeps the probabilities while it makes "
                         "their gradient and then the scores' gradient: one more (B, H, T, T) matrix at the peak."),
            "keeping the scores for the backward too": (
                4 * one, "The softmax's backward needs only its output (the probabilities), not its input: the "
                         "scores are freed after the forward, so they are not alive at the backward's peak."),
            "every matrix ever made": (5 * one, freed),
        })
    else:
        wrong["three matrices (every intermediate)"] = (3 * one, freed)
    rel = 0.15 if backward else 0.2
    from gpuformer_lib.exercises.predictions import grade_model

    return grade_model(
        predicted, right * one, quantity=f"the peak bytes of explicit attention, {what}", unit="bytes",
        wrong=wrong, rel=rel, measured=measured, measured_by="peak_bytes measured",
        too_low=("Count whole (B, H, T, T) matrices: B·H·T² elements each (T squared: every query against every "
                 "key), 4 bytes per element in float32, 2 in float16/bfloat16, and give the answer in bytes, "
                 "not MiB."),
        too_high=(freed + " Count (B, H, T, T) matrices alive at the peak, at 4 bytes per float32 element."),
        why_close=(f"{'Three' if backward else 'Two'} (B, H, T, T) matrices at once: "
                   + ("the probabilities saved for backward, their gradient, and the scores' gradient. "
                      if backward else "the scores and the probabilities, while the softmax runs. ")
                   + "A measurement adds a little: q·scale and the output are (B, H, T, hs), T·hs per row, "
                     "not T²."))


def _reference_update(m: Tensor, l: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    m_new = torch.maximum(m, x.amax(-1))
    base = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
    return m_new, l * torch.exp(m - base) + torch.exp(x - base[..., None]).sum(-1)


def _run(update, x: Tensor, block: int) -> tuple[Tensor | None, Tensor | None, str | None]:
    m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype)
    l = torch.zeros(x.shape[:-1], dtype=x.dtype)
    for start in range(0, x.shape[-1], block):
        got, err = _try(update, m, l, x[..., start:start + block])
        if err:
            return None, None, err
        if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, Tensor) for t in got)):
            return None, None, f"Return the pair (m_new, l_new) of tensors, not {_describe(got)}."
        m, l = got
        if m.shape != x.shape[:-1] or l.shape != x.shape[:-1]:
            return None, None, (f"m_new and l_new hold one number per row: shape {tuple(x.shape[:-1])}, got "
                                f"{tuple(m.shape)} and {tuple(l.shape)}.")
    return m, l, None


@_safe_check
def check_online_softmax_update(fn: Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]) -> CheckResult:
    """``fn(m, l, x_block)`` folds a block of columns (..., n) into the running maximum m (...) and the
    running sum l (...) of exp(x − m), starting from m = −inf, l = 0; after the last block, m is each
    row's maximum and l = Σ exp(x − m). A row of only −inf keeps m = −inf, l = 0 (no NaN)."""
    gen = torch.Generator().manual_seed(3)
    # increasing rows make the maximum grow block after block: the case the rescaling is for
    rising = torch.linspace(-3, 6, 24, dtype=torch.float64).repeat(2, 1) + 0.1 * torch.randn(2, 24, generator=gen,
                                                                                             dtype=torch.float64)
    cases = [(3 * torch.randn(4, 30, generator=gen, dtype=torch.float64), 7), (rising, 5),
             (torch.randn(3, 10, generator=gen, dtype=torch.float64), 10)]
    for x, block in cases:
        m, l, err = _run(fn, x, block)
        if err:
            return _report(False, err)
        want_m, want_l = x.amax(-1), torch.exp(x - x.amax(-1, keepdim=True)).sum(-1)
        if not torch.allclose(m, want_m):
            return _report(False, "After the last block m must be each row's maximum: m_new = max(m, max of the block).")
        if torch.allclose(l, want_l, rtol=1e-6):
            continue
        m0 = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype)
        l_none, l_wrong = torch.zeros_like(m0), torch.zeros_like(m0)
        m_run = m0
        for start in range(0, x.shape[-1], block):
            blk = x[..., start:start + block]
            m_new = torch.maximum(m_run, blk.amax(-1))
            l_none = l_none + torch.exp(blk - m_new[..., None]).sum(-1)
            l_wrong = l_wrong * torch.exp(torch.nan_to_num(m_new - m_run, posinf=0.0)) + torch.exp(blk - m_new[..., None]).sum(-1)
            m_run = m_new
        if torch.allclose(l, l_none, rtol=1e-6):
            return _report(False, "The running sum is not rescaled: its old terms were taken relative to the old "
                                  "maximum. Multiply l by exp(m - m_new) before adding the block's terms.")
        if torch.allclose(l, l_wrong, rtol=1e-6):
            return _report(False, "Rescaled the wrong way: the new maximum is larger, so the old terms shrink, by "
                                  "exp(m - m_new) (at most 1), not exp(m_new - m).")
        return _report(False, f"For a {tuple(x.shape)} input in blocks of {block}, l is not Σ exp(x - max): "
                              f"got {l.tolist()[:2]}, expected {want_l.tolist()[:2]}.")
    masked = torch.tensor([[float("-inf")] * 6, [0.0, 1.0, float("-inf"), 2.0, float("-inf"), 0.5]],
                          dtype=torch.float64)
    m, l, err = _run(fn, masked, 2)
    if err:
        return _report(False, err)
    if l.isnan().any() or m.isnan().any():
        return _report(False, "A fully masked row (all -inf) gives NaN: exp(-inf - (-inf)) is exp(NaN). Subtract "
                              "a finite number where m_new is -inf, e.g. torch.where(torch.isneginf(m_new), 0, m_new).")
    want_m, want_l = _reference_update(torch.full((2,), float("-inf"), dtype=torch.float64),
                                       torch.zeros(2, dtype=torch.float64), masked)
    if not (torch.isneginf(m[0]) and l[0] == 0 and torch.allclose(l[1], want_l[1])):
        return _report(False, "With -inf entries (masked keys): a fully masked row keeps m = -inf and l = 0, and "
                              "a -inf entry adds exp(-inf) = 0 to the sum.")
    return _report(True, "m_new = max(m, block max); l_new = l·exp(m - m_new) + Σ exp(x - m_new), with a finite "
                         "stand-in for m_new on fully masked rows: the update FlashAttention applies to every tile.")
