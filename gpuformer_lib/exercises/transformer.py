"""Checks for the exercises on attention, multi-head attention and the Transformer's layers (chapters 3-5)."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpuformer_lib.exercises._core import CheckResult, _describe, _report, _run_limited, _safe_check, _try


def _as_tensor(got: Any, what: str) -> tuple[Tensor | None, str | None]:
    if isinstance(got, tuple) and got and isinstance(got[0], Tensor):
        got = got[0]
    if not isinstance(got, Tensor):
        return None, f"Return a tensor ({what}), not {_describe(got)}."
    return got, None


def _same(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and not a.is_complex() and torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- masks


@_safe_check
def check_causal_mask(fn: Callable[[int], Tensor]) -> CheckResult:
    """``fn(T)`` returns a (T, T) bool mask, True where query i may attend to key j."""
    for T in (4, 7, 1):  # the larger sizes tell the typical mistakes apart
        got, err = _try(fn, T)
        got, err2 = (None, err) if err else _as_tensor(got, "a (T, T) bool mask")
        if err or err2:
            return _report(False, err or err2)
        want = torch.ones(T, T, dtype=torch.bool).tril()
        if got.shape != (T, T):
            return _report(False, f"For T={T} the mask must have shape ({T}, {T}), got {tuple(got.shape)}.")
        if got.dtype != torch.bool:
            if (got.is_floating_point() and T > 1
                    and torch.equal(got, torch.zeros(T, T, dtype=got.dtype).masked_fill(~want, float("-inf")))):
                return _report(False, "That is an additive mask (0 where a query may attend, -inf where not), what "
                                      "is added to the scores. The exercise asks for the bool mask: True where "
                                      "query i may attend to key j, e.g. torch.ones(T, T, dtype=torch.bool).tril().")
            return _report(False, "Return a bool tensor (True = may attend), e.g. torch.ones(T, T, dtype=torch.bool).")
        if T > 1 and torch.equal(got, want.T):
            return _report(False, "That is the upper triangle: query i may see keys j <= i, the lower one (tril).")
        if T > 1 and torch.equal(got, ~want):
            return _report(False, "Inverted: True must mean 'may attend', as in F.scaled_dot_product_attention.")
        if torch.equal(got, want.tril(-1)):
            return _report(False, "The diagonal is missing: a token may attend to itself.")
        if not torch.equal(got, want):
            return _report(False, f"For T={T} expected\n{want.int()}\ngot\n{got.int()}")
    return _report(True, "torch.ones(T, T, dtype=torch.bool).tril(): each token sees itself and the past.")


# --------------------------------------------------------------------------- attention


@_safe_check
def check_attention(fn: Callable[[Tensor, Tensor, Tensor], Tensor]) -> CheckResult:
    """``fn(q, k, v)`` returns softmax(q k^T / sqrt(d_k)) v for inputs (..., T, hs)."""
    gen = torch.Generator().manual_seed(0)
    for lead, tq, tk, hs in (((2,), 5, 5, 8), ((2, 3), 4, 6, 16), ((1,), 3, 7, 64)):
        q, k, v = (torch.randn(*lead, t, hs, generator=gen) for t in (tq, tk, tk))
        got, err = _try(fn, q, k, v)
        got, err2 = (None, err) if err else _as_tensor(got, "the attention output")
        if err or err2:
            return _report(False, err or err2)
        want = F.scaled_dot_product_attention(q, k, v)
        if _same(got, want):
            continue
        scores = q @ k.transpose(-2, -1)
        if got.shape != want.shape:
            return _report(False, f"Output shape should be {tuple(want.shape)} (..., T_query, hs), "
                                  f"got {tuple(got.shape)}.")
        if _same(got, scores.softmax(-1) @ v):
            return _report(False, "You forgot to scale the scores by 1 / sqrt(d_k), d_k = q.size(-1).")
        if _same(got, (scores / hs).softmax(-1) @ v):
            return _report(False, "Divide by sqrt(d_k), not d_k: the scores' variance is d_k, their spread sqrt(d_k).")
        if _same(got, (scores / math.sqrt(hs)).softmax(-2) @ v):
            return _report(False, "Softmax over the keys, the last dimension (dim=-1): each query's weights sum to 1.")
        return _report(False, f"For q {tuple(q.shape)}, k and v {tuple(k.shape)} your output differs from "
                              "F.scaled_dot_product_attention. Check the transpose of k and the order of the products.")
    return _report(True, "Your attention equals F.scaled_dot_product_attention.")


@_safe_check
def check_split_heads(fn: Callable[[Tensor, int], Tensor]) -> CheckResult:
    """``fn(x, n_heads)`` turns (B, T, C) into (B, H, T, hs) with hs = C // H."""
    for B, T, C, H in ((2, 5, 12, 3), (1, 7, 16, 4)):
        x = torch.randn(B, T, C)
        got, err = _try(fn, x, H)
        got, err2 = (None, err) if err else _as_tensor(got, "(B, H, T, hs)")
        if err or err2:
            return _report(False, err or err2)
        want = x.view(B, T, H, C // H).transpose(1, 2)
        if torch.equal(got, want):
            continue
        if got.shape == (B, T, H, C // H):
            return _report(False, "Shape (B, T, H, hs): now transpose(1, 2) so heads come before tokens.")
        if got.shape == want.shape and torch.equal(got, x.view(B, H, T, C // H)):
            return _report(False, "Right shape, wrong elements: view(B, H, T, hs) mixes tokens into heads. "
                                  "View as (B, T, H, hs) first, then transpose(1, 2).")
        if got.shape == want.shape and torch.equal(got, x.view(B, T, C // H, H).permute(0, 3, 1, 2)):
            return _report(False, "Right shape, wrong elements: heads interleaved. view(B, T, hs, H) gives head h "
                                  "the channels h, h + H, h + 2H, ...; each head owns hs neighbouring channels, "
                                  "so view(B, T, H, hs), then transpose(1, 2).")
        return _report(False, f"For x {tuple(x.shape)} and {H} heads expected shape {tuple(want.shape)}, "
                              f"got {tuple(got.shape)} with other values.")
    return _report(True, "x.view(B, T, H, hs).transpose(1, 2): each head gets its own slice of every token.")


@_safe_check
def check_merge_heads(fn: Callable[[Tensor], Tensor]) -> CheckResult:
    """``fn(y)`` turns (B, H, T, hs) back into (B, T, C): the inverse of splitting heads."""
    for B, H, T, hs in ((2, 3, 5, 4), (1, 4, 6, 2)):
        y = torch.randn(B, H, T, hs)
        got, err = _try(fn, y)
        got, err2 = (None, err) if err else _as_tensor(got, "(B, T, C)")
        if err or err2:
            return _report(False, err or err2)
        want = y.transpose(1, 2).reshape(B, T, H * hs)
        if torch.equal(got, want):
            continue
        if got.shape == want.shape and torch.equal(got, y.reshape(B, T, H * hs)):
            return _report(False, "Right shape, wrong elements: transpose(1, 2) back to (B, T, H, hs) before "
                                  "reshaping, or tokens and heads get mixed.")
        return _report(False, f"For y {tuple(y.shape)} expected {tuple(want.shape)}, got {tuple(got.shape)}.")
    return _report(True, "y.transpose(1, 2).reshape(B, T, C) (reshape, because the transpose is not contiguous).")


# --------------------------------------------------------------------------- counting parameters


# --------------------------------------------------------------------------- layers


@_safe_check
def check_residual_block(fn: Callable[[Tensor, nn.Module, nn.Module, bool], Tensor]) -> CheckResult:
    """``fn(x, sublayer, norm, norm_first)``: a residual connection with LayerNorm, pre-LN or post-LN."""
    torch.manual_seed(0)
    sublayer, norm = nn.Linear(8, 8), nn.LayerNorm(8)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(2, 3, 8)
    with torch.no_grad():
        pre, post = x + sublayer(norm(x)), norm(x + sublayer(x))
        outputs = {}
        for norm_first in (True, False):
            got, err = _try(fn, x, sublayer, norm, norm_first)
            got, err2 = (None, err) if err else _as_tensor(got, "the block's output")
            if err or err2:
                return _report(False, err or err2)
            outputs[norm_first] = got
        if all(_same(outputs[flag], want) for flag, want in ((True, pre), (False, post))):
            return _report(True, "Pre-LN: x + f(LN(x)) keeps an un-normalised path from input to output; "
                                 "post-LN: LN(x + f(x)).")
        if _same(outputs[True], outputs[False]):
            order = "pre-LN" if _same(outputs[True], pre) else "post-LN" if _same(outputs[True], post) else "one block"
            return _report(False, f"You return {order} for both values of norm_first: norm_first=True is pre-LN, "
                                  "x + sublayer(norm(x)); norm_first=False is post-LN, norm(x + sublayer(x)).")
        if _same(outputs[True], post) and _same(outputs[False], pre):
            return _report(False, "Pre-LN and post-LN are swapped: norm_first=True means x + sublayer(norm(x)).")
        for norm_first, want in ((True, pre), (False, post)):
            got = outputs[norm_first]
            if _same(got, want):
                continue
            if norm_first and _same(got, sublayer(norm(x))):
                return _report(False, "Pre-LN keeps the residual: add x back, x + sublayer(norm(x)).")
            if norm_first and _same(got, norm(x + sublayer(norm(x)))):
                return _report(False, "Pre-LN does not normalise the sum: x + sublayer(norm(x)), so the residual "
                                      "path from input to output is never normalised.")
            if not norm_first and _same(got, x + norm(sublayer(x))):
                return _report(False, "Post-LN normalises the sum: norm(x + sublayer(x)), not x + norm(sublayer(x)).")
            if not norm_first and _same(got, norm(sublayer(x))):
                return _report(False, "Post-LN keeps the residual too: add x before normalising, "
                                      "norm(x + sublayer(x)).")
            return _report(False, f"norm_first={norm_first}: expected "
                                  f"{'x + sublayer(norm(x))' if norm_first else 'norm(x + sublayer(x))'}.")
    return _report(False, "Expected x + sublayer(norm(x)) for norm_first=True, norm(x + sublayer(x)) otherwise.")


# --------------------------------------------------------------------------- cost and initialisation (predict, measure, diagnose)


def check_training_flops_prediction(predicted, measured: float | None = None, config=None,
                                    seq_len: int = 1024) -> CheckResult:
    """Grade a predicted number of training FLOPs per token (forward + backward, matrix products) of a
    decoder-only model, GPT-2 small unless ``config`` says otherwise, on sequences of ``seq_len`` tokens,
    against the count :func:`gpuformer_lib.model.transformer_flops` makes, within 3 % (rounding; the rule
    "6 N + 12 L T C" passes). The usual slips are named: 6 N alone (attention's scores and weighted sum have
    no parameters), the forward pass only, attention halved, the embedding counted as a product, the output
    layer left out, a count per sequence. ``measured``, the count ``FlopCounterMode`` made for the same model,
    is shown beside the model and must agree with it (a count of another model raises)."""
    import dataclasses

    from gpuformer_lib.exercises.predictions import grade_model
    from gpuformer_lib.model import DecoderLM, count_parameters, gpt2_config, transformer_flops

    config = gpt2_config() if config is None else config
    right = transformer_flops(config, 1, seq_len) / seq_len
    if measured is not None and abs(measured / right - 1) > 0.01:
        raise ValueError(f"FlopCounterMode counted {measured:.4g} FLOPs per token, the model {right:.4g}: pass the "
                         "config and seq_len of the model that was counted")
    with torch.device("meta"):  # shapes only
        n_params = count_parameters(DecoderLM(dataclasses.replace(config, check_token_ids=False)))
    C, L, T, V = config.d_model, config.n_decoder_layers, seq_len, config.vocab_size
    wrong = {
        "6 N alone": (6 * n_params, (
            "Close to 6 N? That counts every parameter's multiply-add forward and backward, but the attention "
            f"scores Q K^T and the weighted sum A V have no parameters: they add 4 T C per layer and token "
            f"forward, 12 T C with the backward, a sizeable share at T = {T}.")),
        "the forward pass only": (right / 3, (
            "About a third: that is the forward pass only. Training adds the backward pass, which computes "
            "gradients for the inputs and for the weights, two products per forward product: 3x.")),
        "a backward as costly as the forward": (2 * right / 3, (
            "Two thirds: the backward pass costs twice the forward, not once: for each product it computes the "
            "gradient for the input and the gradient for the weight, so training is 3x the forward.")),
        "attention counted as 2 T C": (right - 3 * L * 2 * T * C, (
            "Attention is two products per token and layer, each 2 T C forward: the scores Q K^T and the weighted "
            "sum A V, 4 T C in all. A causal mask does not halve them here: explicit attention computes the full "
            "T x T and masks it afterwards.")),
        "the embedding counted as a product": (right + 6 * C * V, (
            "The embedding lookup is a gather, not a matrix product (no FLOPs); a tied output layer counts once, "
            "as the product h W^T, even though its weights are the embedding's.")),
        "the output layer left out": (right - 6 * C * V, (
            f"The output layer is a product too: 2 C V per token forward (V = {V:,}), x3 for training, a large "
            "share for a small model with a big vocabulary.")),
        "a count per sequence": (right * T, "Count per token, not per sequence: divide the step's count by B T."),
    }
    rel = 0.03
    wrong = {name: entry for name, entry in wrong.items() if abs(entry[0] / right - 1) > 2 * rel}
    return grade_model(
        predicted, right, quantity="training FLOPs per token", unit="FLOP", wrong=wrong, rel=rel,
        measured=measured, measured_by="FlopCounterMode counted",
        too_low=("Count per token and layer: projections 8 C^2, feed-forward 4 C d_ff, attention 4 T C (all "
                 "forward, 2 FLOPs per multiply-add), plus the output layer 2 C V; then x3 for training."),
        too_high=("Too high: the embedding lookup is a gather, not a matrix product (no FLOPs); a tied output "
                  "layer counts once as a product even though its weights are shared; count per token, not "
                  "per sequence (divide the step's count by B T)."),
        why_close=("LayerNorm, softmax and GELU FLOPs are left out of the model, and FlopCounterMode does not "
                   "count them either (it counts matrix products)."))


def initial_loss_with_head(head: Callable[[Tensor, Tensor], Tensor], vocab_size: int = 16, d_model: int = 64,
                           seed: int = 0) -> float:
    """The loss at initialisation of a 2-layer ``DecoderLM`` with tied embeddings whose output layer is
    ``head(h, embedding_weight)`` -> logits, on a ``data.repeating_patterns`` batch (no training)."""
    from gpuformer_lib import data
    from gpuformer_lib.model import DecoderLM, TransformerConfig

    torch.manual_seed(seed)
    config = TransformerConfig(vocab_size=vocab_size, d_model=d_model, n_heads=4, n_decoder_layers=2,
                               d_ff=4 * d_model, dropout=0.0, max_len=32, tie_embeddings=True)
    model = DecoderLM(config).eval()
    x, y = data.repeating_patterns(0, vocab_size)
    with torch.no_grad():
        h = model.blocks(model.pos(model.embed(x)))  # (B, T, C), after the final LayerNorm
        logits = head(h, model.embed.weight)
    if not isinstance(logits, Tensor) or logits.shape != (*x.shape, vocab_size):
        raise ValueError(f"the head must return logits of shape {(*x.shape, vocab_size)}, got "
                         f"{getattr(logits, 'shape', type(logits).__name__)}")
    return F.cross_entropy(logits.reshape(-1, vocab_size).float(), y.reshape(-1)).item()


def _input_token_probability(head: Callable[[Tensor, Tensor], Tensor], vocab_size: int = 16, d_model: int = 64,
                             seed: int = 0) -> float:
    """The mean probability an untrained tied model (as in :func:`initial_loss_with_head`) gives the input
    token itself as the next token: about 1/V for a sound head, near 1 for an unscaled tied one."""
    from gpuformer_lib import data
    from gpuformer_lib.model import DecoderLM, TransformerConfig

    torch.manual_seed(seed)
    config = TransformerConfig(vocab_size=vocab_size, d_model=d_model, n_heads=4, n_decoder_layers=2,
                               d_ff=4 * d_model, dropout=0.0, max_len=32, tie_embeddings=True)
    model = DecoderLM(config).eval()
    x, _ = data.repeating_patterns(0, vocab_size)
    with torch.no_grad():
        logits = head(model.blocks(model.pos(model.embed(x))), model.embed.weight)  # (B, T, V)
    return logits.float().softmax(-1).gather(-1, x[..., None]).mean().item()


@_safe_check
def check_tied_head(fn: Callable[[Tensor, Tensor], Tensor]) -> CheckResult:
    """``fn(h, embedding_weight)`` returns the logits of an output layer tied to a sqrt(C)-scaled embedding:
    h (B, T, C), embedding_weight (V, C) -> (B, T, V), starting an untrained model at a loss of about ln V."""
    torch.manual_seed(0)
    V, C = 16, 64
    h, w = torch.randn(2, 5, C), torch.randn(V, C) * C ** -0.5
    got, err = _try(fn, h, w)
    got, err2 = (None, err) if err else _as_tensor(got, "logits (B, T, V)")
    if err or err2:
        return _report(False, err or err2)
    if got.shape != (2, 5, V):
        return _report(False, f"Logits must have shape (B, T, V) = (2, 5, {V}), got {tuple(got.shape)}: "
                              "multiply h (B, T, C) by the transposed weight, h @ weight.T.")
    plain = h @ w.T  # (B, T, C) x (C, V) -> (B, T, V)
    from gpuformer_lib import data, model  # noqa: F401  before the time limit: an interrupted import stays broken

    if _same(got, plain * C ** -0.5):
        loss, hint = _run_limited(initial_loss_with_head, fn, what="Your function, in a model,")
        if hint:
            return _report(False, hint)
        if abs(loss - math.log(V)) > 0.35:
            return _report(False, f"The formula matches on a test input, but the model's first loss is {loss:.2f}, "
                                  f"not near ln {V} = {math.log(V):.2f}.")
        return _report(True, f"h @ W.T / sqrt(C): the untrained model's loss is {loss:.2f} against ln {V} = "
                             f"{math.log(V):.2f}. The sqrt(C) that made embeddings unit-size is taken back out.")
    if _same(got, plain):
        both, hint = _run_limited(lambda: (initial_loss_with_head(fn), _input_token_probability(fn)),
                                  what="Your function, in a model,")
        if hint:
            return _report(False, hint)
        loss, p_input = both
        return _report(False, f"The untrained model's first loss is {loss:.2f} against ln {V} = {math.log(V):.2f} "
                              f"for an even guess, and it gives the input token itself a mean probability of "
                              f"{p_input:.2f} (an even guess: {1 / V:.2f}). Why would an untrained model be so sure "
                              "that the next token repeats the current one? Follow the input token's own vector "
                              "from the embedding to the logits.")
    if _same(got, plain * C ** 0.5):
        return _report(False, "Scaled the wrong way: multiplying by sqrt(C) makes the input token's logit even "
                              "larger (~C). Divide by sqrt(C).")
    if _same(got, plain / C):
        return _report(False, "Dividing by C also starts near ln V, but shrinks every logit and the gradient into "
                              "the shared weights by a further sqrt(C); T5's choice, and the library's, is C^-1/2.")
    return _report(False, "Expected h @ weight.T scaled by C ** -0.5 (C = h.shape[-1]).")
