"""Chapter 3: the memory of explicit attention (predicted in bytes) and the online softmax's update."""

from __future__ import annotations

import torch

from answer_tables import Table, Wrong
from gpuformer_lib.exercises import attention as ex

# exercise 3.2: q, k, v of shape (B, H, T, hs) = (2, 4, 512, 64) in float32; one (B, H, T, T) matrix is 8 MiB
SHAPE = (2, 4, 512, 64)
ONE = 2 * 4 * 512 * 512 * 4
MEASURED = {False: 2.12 * ONE, True: 3.25 * ONE}  # what this page's CPU measured (fixed: no test times anything)


def _memory(answer):
    """``answer`` is (backward, predicted bytes): graded as the notebook grades it, beside a fixed measurement."""
    backward, predicted = answer
    return ex.check_attention_memory_prediction(predicted, MEASURED[backward], shape=SHAPE, backward=backward)


def _fixed(m, l, x):
    """The chapter's solution: rescale the old sum, and a finite stand-in for m_new on fully masked rows."""
    m_new = torch.maximum(m, x.amax(-1))
    base = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
    return m_new, l * torch.exp(m - base) + torch.exp(x - base[..., None]).sum(-1)


def _fixed_with_nan_to_num(m, l, x):
    """Another right fix: exp(m - m_new) made 1 where both are -inf (l is 0 there anyway)."""
    m_new = torch.maximum(m, x.amax(-1))
    scale = torch.exp(torch.nan_to_num(m - m_new, nan=0.0))
    terms = torch.exp(torch.nan_to_num(x - m_new[..., None], nan=float("-inf")))
    return m_new, l * scale + terms.sum(-1)


def _no_rescale(m, l, x):  # the colleague's update, as the exercise shows it
    m_new = torch.maximum(m, x.amax(-1))
    return m_new, l + torch.exp(x - m_new[..., None]).sum(-1)


def _wrong_way(m, l, x):
    m_new = torch.maximum(m, x.amax(-1))
    base = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
    up = torch.exp(torch.nan_to_num(m_new - m, posinf=0.0))
    return m_new, l * up + torch.exp(x - base[..., None]).sum(-1)


def _nan_on_masked(m, l, x):  # the rescaling right, no guard for a row of -inf
    m_new = torch.maximum(m, x.amax(-1))
    return m_new, l * torch.exp(m - m_new) + torch.exp(x - m_new[..., None]).sum(-1)


def _block_max_only(m, l, x):  # the running maximum forgotten: m is the last block's
    m_new = x.amax(-1)
    base = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
    return m_new, l * torch.exp(torch.nan_to_num(m - base, nan=0.0)) + torch.exp(x - base[..., None]).sum(-1)


TABLES = [
    Table(
        "check_attention_memory_prediction", _memory,
        right=((False, 2 * ONE), (True, 3 * ONE),
               (False, 2 * ONE + ONE // 8),  # with the output (B, H, T, hs) counted too
               (True, 2 * 4 * 512 * 512 * 4 * 3)),
        wrong=(Wrong("forward: one matrix", (False, ONE), ("alive at the same moment",)),
               Wrong("forward: three matrices", (False, 3 * ONE), ("three matrices", "freed as soon as")),
               Wrong("forward: bits, not bytes", (False, 2 * ONE * 8), ("bits or bytes",)),
               Wrong("forward: T, not T squared", (False, 2 * 2 * 4 * 512 * 4), ("t squared",)),
               Wrong("forward: float16 bytes (two matrices of 2 bytes)", (False, 2 * ONE // 2),
                     ("4 bytes per element",)),
               Wrong("training: the forward's two", (True, 2 * ONE), ("one more (b, h, t, t) matrix",)),
               Wrong("training: scores kept for backward (4 matrices)", (True, 4 * ONE),
                     ("needs only its output",)),
               Wrong("training: every matrix ever made", (True, 5 * ONE), ("freed as soon as",)),
               Wrong("training: MiB, not bytes", (True, 24), ("not mib",))),
    ),
    Table(
        "check_online_softmax_update", ex.check_online_softmax_update,
        right=(_fixed, _fixed_with_nan_to_num),
        wrong=(Wrong("no rescaling (the colleague's bug)", _no_rescale, ("not rescaled", "exp(m - m_new)")),
               Wrong("rescaled the wrong way", _wrong_way, ("wrong way",)),
               Wrong("NaN on a fully masked row", _nan_on_masked, ("fully masked row", "nan")),
               Wrong("the running maximum forgotten", _block_max_only, ("each row's maximum",))),
    ),
]
