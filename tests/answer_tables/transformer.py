"""Chapters 3-5: the causal mask, splitting heads, the residual block, GPT-2 small's training FLOPs per token,
and a tied output layer's scale."""

from __future__ import annotations

import functools

import torch

from answer_tables import Table, Wrong
from gpuformer_lib.exercises import transformer as ex


def _additive_mask(T):
    return torch.zeros(T, T).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))


@functools.cache
def _gpt2_small() -> tuple[float, int]:
    """GPT-2 small's training FLOPs per token at T = 1024 as the notebook counts them (FlopCounterMode on the
    meta device), and its number of parameters."""
    import dataclasses

    from torch.utils.flop_counter import FlopCounterMode

    from gpuformer_lib.model import DecoderLM, count_parameters, gpt2_config

    config = dataclasses.replace(gpt2_config(), fused_attention=False, check_token_ids=False)
    with torch.device("meta"):
        model = DecoderLM(config)
        with FlopCounterMode(display=False) as counter:
            model(torch.zeros(1, 1024, dtype=torch.long)).float().sum().backward()
    return counter.get_total_flops() / 1024, count_parameters(model)


def _flops(answer):
    """``answer`` is a function of (the count, N) giving the prediction, graded as exercise 5.1 grades it."""
    counted, n_params = _gpt2_small()
    return ex.check_training_flops_prediction(answer(counted, n_params), counted)


C, L, T, V, FF = 768, 12, 1024, 50304, 3072
PER_LAYER = 8 * C**2 + 4 * C * FF + 4 * T * C  # forward, per token: projections, feed-forward, attention


def _split(x, h):
    B, T_, C_ = x.shape
    return x.view(B, T_, h, C_ // h).transpose(1, 2)  # (B, T, H, hs) -> (B, H, T, hs)


TABLES = [
    Table(
        "check_causal_mask", ex.check_causal_mask,
        right=(lambda T: torch.ones(T, T, dtype=torch.bool).tril(),
               lambda T: ~torch.ones(T, T, dtype=torch.bool).triu(1),
               lambda T: torch.arange(T)[None, :] <= torch.arange(T)[:, None]),
        wrong=(Wrong("upper triangle", lambda T: torch.ones(T, T, dtype=torch.bool).triu(), ("upper triangle",)),
               Wrong("inverted (True = masked)", lambda T: torch.ones(T, T, dtype=torch.bool).triu(1),
                     ("inverted", "may attend")),
               Wrong("diagonal missing", lambda T: torch.ones(T, T, dtype=torch.bool).tril(-1),
                     ("diagonal is missing",)),
               Wrong("a float 0/1 mask", lambda T: torch.ones(T, T).tril(), ("bool tensor",)),
               Wrong("an additive 0/-inf mask", _additive_mask, ("additive mask", "bool")),
               Wrong("a (1, 1, T, T) mask", lambda T: torch.ones(T, T, dtype=torch.bool).tril()[None, None],
                     ("must have shape",))),
    ),
    Table(
        "check_split_heads", ex.check_split_heads,
        right=(_split, lambda x, h: x.reshape(x.shape[0], x.shape[1], h, -1).permute(0, 2, 1, 3)),
        wrong=(Wrong("no transpose", lambda x, h: x.view(x.shape[0], x.shape[1], h, -1),
                     ("(b, t, h, hs)", "transpose(1, 2)")),
               Wrong("view straight to (B, H, T, hs)", lambda x, h: x.view(x.shape[0], h, x.shape[1], -1),
                     ("wrong elements", "mixes tokens into heads")),
               Wrong("heads interleaved", lambda x, h: x.view(x.shape[0], x.shape[1], -1, h).permute(0, 3, 1, 2),
                     ("heads interleaved",)),
               Wrong("transpose(1, 2) without a view", lambda x, h: x.transpose(1, 2), ("expected shape",))),
    ),
    Table(
        "check_residual_block", ex.check_residual_block,
        right=(lambda x, f, n, first: x + f(n(x)) if first else n(x + f(x)),),
        wrong=(Wrong("pre-LN and post-LN swapped", lambda x, f, n, first: n(x + f(x)) if first else x + f(n(x)),
                     ("swapped",)),
               Wrong("pre-LN without the residual", lambda x, f, n, first: f(n(x)) if first else n(x + f(x)),
                     ("keeps the residual",)),
               Wrong("post-LN normalising the branch", lambda x, f, n, first: x + f(n(x)) if first else x + n(f(x)),
                     ("normalises the sum",)),
               Wrong("post-LN without the residual", lambda x, f, n, first: x + f(n(x)) if first else n(f(x)),
                     ("keeps the residual too",)),
               Wrong("pre-LN whatever norm_first", lambda x, f, n, first: x + f(n(x)),
                     ("both values of norm_first",)),
               Wrong("pre-LN normalising the sum", lambda x, f, n, first: n(x + f(n(x))) if first else n(x + f(x)),
                     ("does not normalise the sum",))),
    ),
    Table(
        "check_training_flops_prediction", _flops,
        right=(lambda counted, n: 3 * (L * PER_LAYER + 2 * C * V),  # the chapter's solution
               lambda counted, n: 6 * n + 12 * L * T * C,  # the rule "6 N + 12 L T C"
               lambda counted, n: counted),
        wrong=(Wrong("6 N alone", lambda counted, n: 6 * n, ("6 n", "no parameters")),
               Wrong("forward only", lambda counted, n: L * PER_LAYER + 2 * C * V, ("forward pass only",)),
               Wrong("backward as costly as the forward", lambda counted, n: 2 * (L * PER_LAYER + 2 * C * V),
                     ("twice the forward",)),
               Wrong("attention 2 T C (causal halved, or Q K^T only)",
                     lambda counted, n: 3 * (L * (PER_LAYER - 2 * T * C) + 2 * C * V), ("4 t c", "causal mask")),
               Wrong("the embedding counted as a product", lambda counted, n: 3 * (L * PER_LAYER + 4 * C * V),
                     ("gather",)),
               Wrong("the output layer left out", lambda counted, n: 3 * L * PER_LAYER, ("output layer is a product",)),
               Wrong("per sequence", lambda counted, n: 1024 * 3 * (L * PER_LAYER + 2 * C * V), ("per token",))),
    ),
    Table(
        "check_tied_head", ex.check_tied_head,
        right=(lambda h, w: (h * h.shape[-1] ** -0.5) @ w.T,  # the chapter's solution
               lambda h, w: h @ w.T / h.shape[-1] ** 0.5,
               lambda h, w: torch.einsum("btc,vc->btv", h, w) / h.shape[-1] ** 0.5),
        wrong=(Wrong("unscaled (the colleague's head)", lambda h, w: h @ w.T, ("input token", "ln 16")),
               Wrong("scaled by sqrt(C), the wrong way", lambda h, w: h @ w.T * h.shape[-1] ** 0.5, ("wrong way",)),
               Wrong("divided by C", lambda h, w: h @ w.T / h.shape[-1], ("dividing by c", "c^-1/2")),
               Wrong("divided by sqrt(V)", lambda h, w: h @ w.T / w.shape[0] ** 0.5, ("c = h.shape[-1]",)),
               Wrong("(V, C) x (C, ...): transposed logits", lambda h, w: (w @ h.transpose(-2, -1)),
                     ("(b, t, v)", "h @ weight.t"))),
    ),
]
