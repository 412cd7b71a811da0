"""Fast decoding for the encoder-decoder ``model.Transformer``: a KV cache, beam search, and what the cache saves.

``generate.greedy_translate`` runs ``model.decode`` over the whole prefix at every step, so the t-th token costs
a forward pass over t tokens (and re-projects the encoder's memory into keys and values in every layer). Here:

- :func:`prefill_cache` / :func:`cached_decode_step`: the decoder run one token at a time. Each layer keeps
  the keys and values of its **self-attention** for every earlier position (``kv_cache.LayerKVCache``,
  appended to per step), and the keys and values of its **cross-attention** over the memory are projected
  once per sentence, before the loop, because the memory does not change while decoding. A step then feeds
  only the newest token (embedding + the sinusoid or learned row of its own position t) through
  pre-LN or post-LN layers exactly as ``layers.DecoderLayer`` computes them, reading the layer's weights
  from outside (``in_proj_weight`` stacks W_q, W_k, W_v); its logits equal the last position of
  ``model.decode`` (checked in the tests).
- :func:`greedy_translate_cached`: the same contract and token ids as ``generate.greedy_translate``.
- :func:`beam_translate`: beam search over the cache, with the length penalty of Wu et al. (2016, GNMT)
  lp(Y) = ((5 + |Y|) / 6) ** alpha, scores log P(Y | X) / lp(Y). Vaswani et al. (2017) §6.1: "We used beam
  search with a beam size of 4 and length penalty α = 0.6", the defaults here.
- :func:`decode_work`: the matrix-product FLOPs of greedy decoding with and without the cache, from the
  config (checked against ``torch.utils.flop_counter.FlopCounterMode``), and :func:`decode_timing`: both
  decoders timed on one batch.

Leaves out: removing finished sentences from the batch (they keep being computed, with <pad> fed in: simple,
and the loop still stops when every sentence has finished), sampling, the paper's "input length + 50" output
limit (``max_len`` is the caller's), and compiled models (pass the model before ``torch.compile``).
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpuformer_lib.attention import scaled_dot_product_attention
from gpuformer_lib.data import Vocab
from gpuformer_lib.kv_cache import LayerKVCache
from gpuformer_lib.layers import DecoderLayer
from gpuformer_lib.model import Transformer, TransformerConfig


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_model(model, caller: str) -> Transformer:
    """The encoder-decoder ``Transformer`` (a compiled one unwrapped), or a clear error."""
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper holds the model here
    if not isinstance(model, Transformer):
        raise TypeError(f"{caller} needs an encoder-decoder Transformer, got {type(model).__name__}; "
                        "continue a decoder-only model's prompt with generate.sample()")
    return model


def _check_max_len(max_len) -> None:
    if not _is_int(max_len) or max_len < 2:
        raise ValueError(f"max_len must be an int >= 2 (it counts the <bos>), got {max_len!r}")


def decoder_layers(model: Transformer) -> list[DecoderLayer]:
    """The model's ``DecoderLayer`` objects, unwrapped from ``speed.CheckpointedLayer`` (``.layer``) if wrapped."""
    layers = []
    for layer in model.decoder.layers:
        while not isinstance(layer, DecoderLayer) and isinstance(getattr(layer, "layer", None), nn.Module):
            layer = layer.layer
        if not isinstance(layer, DecoderLayer):
            raise TypeError(f"decoder layer {type(layer).__name__} is not a layers.DecoderLayer (or one wrapped "
                            "in speed.CheckpointedLayer): the cached step reads a DecoderLayer's weights")
        layers.append(layer)
    return layers


# --------------------------------------------------------------------------- the cache and one step


@dataclasses.dataclass
class Seq2SeqCache:
    """What a cached decoding step needs besides the new token, for B rows (sentences, or sentences x beams)."""

    self_kv: list[LayerKVCache]
    """Per decoder layer: the self-attention keys and values of the tokens so far, (B, H, max_len, hs) each."""
    cross_k: list[Tensor]
    """Per decoder layer: the memory projected by W_k, (B, H, S, hs); computed once, never changes."""
    cross_v: list[Tensor]
    """Per decoder layer: the memory projected by W_v, (B, H, S, hs)."""
    memory_allowed: Tensor | None
    """(B, 1, 1, S) bool, True at real source tokens (the cross-attention mask); None: no padding."""

    @property
    def length(self) -> int:
        """Target tokens (the <bos> included) whose keys and values are stored."""
        return self.self_kv[0].length

    def reorder(self, index: Tensor) -> None:
        """Row i takes the stored keys and values of row ``index[i]`` (beam search: a surviving beam inherits
        its parent's prefix). The cross-attention keys are left alone: beam search only reorders within each
        sentence's block of beams, whose rows hold the same memory."""
        n = self.length
        for layer in self.self_kv:
            layer.k[:, :, :n] = layer.k[index, :, :n]  # (B, H, n, hs) gathered along B
            layer.v[:, :, :n] = layer.v[index, :, :n]


def _split_heads(x: Tensor, n_heads: int) -> Tensor:
    B, T, C = x.shape
    return x.view(B, T, n_heads, C // n_heads).transpose(1, 2)  # (B, T, C) -> (B, H, T, hs)


def prefill_cache(model: Transformer, memory: Tensor, src_padding_mask: Tensor | None, max_len: int,
                  *, repeat: int = 1) -> Seq2SeqCache:
    """An empty self-attention cache for ``max_len`` target tokens and the cross-attention keys and values of
    ``memory`` (B, S, C), the encoder's output, in every decoder layer. ``repeat`` > 1 gives each sentence
    ``repeat`` consecutive rows (beams): B * repeat rows in all."""
    model = _check_model(model, "prefill_cache")
    _check_max_len(max_len)
    if not _is_int(repeat) or repeat < 1:
        raise ValueError(f"repeat (rows per sentence, the beam size) must be an int >= 1, got {repeat!r}")
    if repeat > 1:
        memory = memory.repeat_interleave(repeat, dim=0)  # (B, S, C) -> (B * repeat, S, C)
        if src_padding_mask is not None:
            src_padding_mask = src_padding_mask.repeat_interleave(repeat, dim=0)
    B, C = memory.shape[0], memory.shape[2]
    H = model.config.n_heads
    self_kv, cross_k, cross_v = [], [], []
    for layer in decoder_layers(model):
        attn = layer.multihead_attn
        w_k, w_v = attn.in_proj_weight.chunk(3)[1:]  # (3C, C) -> W_k, W_v, (C, C) each
        b_k, b_v = attn.in_proj_bias.chunk(3)[1:] if attn.in_proj_bias is not None else (None, None)
        cross_k.append(_split_heads(F.linear(memory, w_k, b_k), H))  # (B, S, C) -> (B, H, S, hs)
        cross_v.append(_split_heads(F.linear(memory, w_v, b_v), H))
        self_kv.append(LayerKVCache(B, H, max_len, C // H, dtype=memory.dtype, device=memory.device))
    allowed = None if src_padding_mask is None else ~src_padding_mask[:, None, None, :]  # (B, S) -> (B, 1, 1, S)
    return Seq2SeqCache(self_kv, cross_k, cross_v, allowed)


def _attend(attn, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None) -> Tensor:
    """One query per row over stored keys, as the module computes it: fused SDPA or the explicit product."""
    if attn.fused:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # (B, H, 1, hs)
    return scaled_dot_product_attention(q, k, v, attn_mask=allowed)[0]  # (B, H, 1, hs)


def _self_attention(layer: DecoderLayer, x: Tensor, cache: LayerKVCache) -> Tensor:
    attn = layer.self_attn
    q, k, v = F.linear(x, attn.in_proj_weight, attn.in_proj_bias).chunk(3, dim=-1)  # (B, 1, C) -> 3 x (B, 1, C)
    H = attn.n_heads
    k_all, v_all = cache.append(_split_heads(k, H), _split_heads(v, H))  # (B, H, t + 1, hs): no causal mask
    y = _attend(attn, _split_heads(q, H), k_all, v_all, None)  # needed, the new token is the last one
    return attn.out_proj(y.transpose(1, 2).reshape(x.shape))  # (B, H, 1, hs) -> (B, 1, C)


def _cross_attention(layer: DecoderLayer, x: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None) -> Tensor:
    attn = layer.multihead_attn
    w_q = attn.in_proj_weight.chunk(3)[0]
    b_q = attn.in_proj_bias.chunk(3)[0] if attn.in_proj_bias is not None else None
    q = _split_heads(F.linear(x, w_q, b_q), attn.n_heads)  # (B, 1, C) -> (B, H, 1, hs)
    y = _attend(attn, q, k, v, allowed)  # (B, H, 1, hs) x (B, H, S, hs) -> (B, H, 1, hs)
    return attn.out_proj(y.transpose(1, 2).reshape(x.shape))


def _layer_step(layer: DecoderLayer, x: Tensor, cache: Seq2SeqCache, i: int) -> Tensor:
    """``DecoderLayer.forward`` for one new token (B, 1, C), dropout left out (evaluation)."""
    def ff(h: Tensor) -> Tensor:
        return layer.linear2(layer.activation(layer.linear1(h)))  # C -> d_ff -> C

    if layer.norm_first:
        x = x + _self_attention(layer, layer.norm1(x), cache.self_kv[i])
        x = x + _cross_attention(layer, layer.norm2(x), cache.cross_k[i], cache.cross_v[i], cache.memory_allowed)
        return x + ff(layer.norm3(x))
    x = layer.norm1(x + _self_attention(layer, x, cache.self_kv[i]))
    x = layer.norm2(x + _cross_attention(layer, x, cache.cross_k[i], cache.cross_v[i], cache.memory_allowed))
    return layer.norm3(x + ff(x))


def cached_decode_step(model: Transformer, tokens: Tensor, cache: Seq2SeqCache) -> Tensor:
    """Feed one token per row, ``tokens`` (B,), at position ``cache.length``; returns the next-token logits
    (B, V), equal to ``model.decode(prefix)[:, -1]``. Call under ``torch.no_grad()`` in eval mode."""
    model = _check_model(model, "cached_decode_step")
    t = cache.length
    if t >= cache.self_kv[0].max_len:
        raise ValueError(f"the cache holds {cache.self_kv[0].max_len} target tokens and is full")
    pe = model.tgt_pos.pe  # (max_len, C): sinusoids or a learned table; row t is this token's position
    x = model.tgt_embed(tokens[:, None])  # (B,) -> (B, 1, C), scaled by sqrt(C)
    x = x + pe[t].to(x.dtype)  # as PositionalEncoding adds pe[:T], here only the row of position t
    for i, layer in enumerate(decoder_layers(model)):
        x = _layer_step(layer, x, cache, i)
    return model.generator(model.decoder.norm(x))[:, 0]  # (B, 1, C) -> (B, V)


# --------------------------------------------------------------------------- greedy


def _strip(row: list[int], finished: bool) -> list[int]:
    """Token ids after <bos> as ``generate.greedy_translate`` returns them: cut at <eos>; an unfinished
    row drops its <pad> tokens."""
    if finished:
        return row[: row.index(Vocab.EOS)]
    return [t for t in row if t != Vocab.PAD]


@torch.no_grad()
def greedy_translate_cached(model: Transformer, src: Tensor, src_padding_mask: Tensor | None = None,
                            max_len: int = 50) -> list[list[int]]:
    """``generate.greedy_translate`` with a KV cache: the same contract and the same token ids, but each step
    feeds only the newest token. ``max_len`` counts the <bos> (>= 2); it is capped at the model's ``max_len``."""
    model = _check_model(model, "greedy_translate_cached")
    _check_max_len(max_len)
    was_training = model.training
    model.eval()
    try:
        max_len = min(max_len, model.config.max_len)
        memory = model.encode(src, src_padding_mask)  # (B, S, C); checks src and the mask
        cache = prefill_cache(model, memory, src_padding_mask, max_len)
        B = src.shape[0]
        token = torch.full((B,), Vocab.BOS, dtype=torch.long, device=src.device)
        out = [token]
        done = torch.zeros(B, dtype=torch.bool, device=src.device)
        for _ in range(max_len - 1):
            logits = cached_decode_step(model, token, cache)  # (B, V)
            token = logits.argmax(-1).masked_fill(done, Vocab.PAD)
            out.append(token)
            done |= token == Vocab.EOS
            if done.all():
                break
    finally:
        model.train(was_training)
    rows = torch.stack(out[1:], dim=1).tolist()  # T x (B,) -> (B, T)
    return [_strip(row, Vocab.EOS in row) for row in rows]


# --------------------------------------------------------------------------- beam search


def gnmt_length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    """GNMT's lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al. 2016); |Y| counts the generated tokens, <eos>
    included, <bos> not. alpha = 0: no penalty (the plain log-probability, which favours short outputs)."""
    return ((5 + length) / 6) ** alpha


@torch.no_grad()
def beam_translate(model: Transformer, src: Tensor, src_padding_mask: Tensor | None = None, max_len: int = 50,
                   beam_size: int = 4, length_penalty: float = 0.6) -> list[list[int]]:
    """Beam search with the KV cache: each sentence keeps ``beam_size`` hypotheses; returns each sentence's
    best by log P(Y | X) / lp(Y), without <bos> and <eos>.

    A step scores every continuation of every live hypothesis (K beams x V tokens per sentence) and takes the
    2K best. Those among the first K that end in <eos> are finished and set aside; the first K that do not
    live on, and the cache rows are reordered by their parents. A sentence stops when it has K finished
    hypotheses (or at ``max_len``, which counts the <bos>); its answer is its best finished hypothesis by
    penalised score, or, if none finished, its best live one. ``beam_size=1`` is greedy decoding; a wider
    beam searches more but is no optimum: it can stop on K short hypotheses that score below greedy's.
    ``length_penalty`` is alpha >= 0 (Vaswani et al. 2017 used beam size 4 and alpha 0.6).
    """
    model = _check_model(model, "beam_translate")
    _check_max_len(max_len)
    if not _is_int(beam_size) or beam_size < 1:
        raise ValueError(f"beam_size must be an int >= 1 (1 is greedy decoding), got {beam_size!r}")
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, numbers.Real) \
            or not 0 <= length_penalty < math.inf:
        raise ValueError(f"length_penalty is GNMT's alpha, a finite number >= 0 (0: none; the paper used 0.6), "
                         f"got {length_penalty!r}")
    alpha, K = float(length_penalty), int(beam_size)
    was_training = model.training
    model.eval()
    try:
        max_len = min(max_len, model.config.max_len)
        memory = model.encode(src, src_padding_mask)  # (B, S, C)
        B, device = src.shape[0], src.device
        dtype = torch.promote_types(memory.dtype, torch.float32)  # scores in float32 at least
        sentence = torch.arange(B, device=device)
        cache = prefill_cache(model, memory, src_padding_mask, max_len, repeat=K)  # rows b*K .. b*K+K-1
        tokens = torch.full((B, K, max_len), Vocab.PAD, dtype=torch.long, device=device)
        tokens[:, :, 0] = Vocab.BOS
        # Only beam 0 is live at the start: K copies of <bos> would fill the beam with one hypothesis.
        scores = torch.full((B, K), -math.inf, dtype=dtype, device=device)
        scores[:, 0] = 0.0  # log-probabilities of the live hypotheses
        best = torch.full((B,), -math.inf, dtype=dtype, device=device)  # best finished penalised score per sentence
        best_tokens = torch.full((B, max_len), Vocab.PAD, dtype=torch.long, device=device)
        n_finished = torch.zeros(B, dtype=torch.long, device=device)
        done = torch.zeros(B, dtype=torch.bool, device=device)
        base = (torch.arange(B, device=device) * K)[:, None]  # (B, 1): first cache row of each sentence
        for t in range(1, max_len):
            logits = cached_decode_step(model, tokens[:, :, t - 1].reshape(B * K), cache)  # (B*K, V)
            logp = logits.to(dtype).log_softmax(-1).view(B, K, -1)  # (B, K, V)
            V = logp.shape[-1]
            cand = (scores[:, :, None] + logp).view(B, K * V)  # (B, K*V): hypothesis + token
            top, idx = cand.topk(min(2 * K, K * V), dim=-1)  # (B, 2K), best first
            parent, token = idx // V, idx % V
            is_eos = token == Vocab.EOS
            # Finished: an <eos> among the first K candidates (so K = 1 stops exactly where greedy does).
            first_k = torch.arange(top.shape[1], device=device) < K
            finishing = is_eos & first_k & torch.isfinite(top) & ~done[:, None]  # (B, 2K)
            penalised = (top / gnmt_length_penalty(t, alpha)).masked_fill(~finishing, -math.inf)
            cand_best, cand_at = penalised.max(dim=-1)  # (B,)
            better = cand_best > best
            if better.any():
                rows = tokens[sentence, parent.gather(1, cand_at[:, None])[:, 0]]  # (B, max_len): the parent
                rows[:, t] = Vocab.EOS
                best = torch.where(better, cand_best, best)
                best_tokens = torch.where(better[:, None], rows, best_tokens)
            n_finished += finishing.sum(-1)
            done |= n_finished >= K
            # Live on: the K best candidates that do not end in <eos> (there are at least K among 2K).
            scores, order = top.masked_fill(is_eos, -math.inf).topk(K, dim=-1)  # (B, K)
            new_parent, new_token = parent.gather(1, order), token.gather(1, order)  # (B, K)
            tokens = tokens.gather(1, new_parent[:, :, None].expand(-1, -1, max_len))  # (B, K, max_len)
            tokens[:, :, t] = new_token
            if done.all():
                break
            cache.reorder((base + new_parent).view(B * K))
        # Sentences with nothing finished answer with their best live hypothesis (all of one length).
        live_rows = tokens[sentence, scores.argmax(-1)]  # (B, max_len)
    finally:
        model.train(was_training)
    has_finished = torch.isfinite(best).tolist()
    out = []
    for b in range(B):
        if has_finished[b]:
            out.append(_strip(best_tokens[b, 1:].tolist(), True))
        else:
            out.append(_strip(live_rows[b, 1:].tolist(), False))
    return out



# --------------------------------------------------------------------------- what the cache saves


@dataclasses.dataclass(frozen=True)
class DecodeWork:
    """Matrix-product FLOPs of greedy decoding ``steps`` tokens for ``batch`` sentences of ``src_len`` tokens."""

    encoder: int
    """The encoder, run once per batch either way."""
    without_cache: int
    """The decoding loop of ``generate.greedy_translate``: step t runs ``model.decode`` over t tokens."""
    with_cache: int
    """The decoding loop of :func:`greedy_translate_cached`, the projection of the memory included."""
    tokens: int
    """Tokens generated: batch x steps."""

    @property
    def per_token_without_cache(self) -> float:
        return self.without_cache / self.tokens

    @property
    def per_token_with_cache(self) -> float:
        return self.with_cache / self.tokens

    @property
    def ratio(self) -> float:
        """Decoding FLOPs without / with the cache: the speedup the work predicts for a compute-bound loop."""
        return self.without_cache / self.with_cache


def decode_work(config: TransformerConfig, batch: int, src_len: int, steps: int) -> DecodeWork:
    """Count the matrix-product FLOPs (2 per multiply-add) of greedy decoding, with and without the cache.

    Per decoder layer, with C = d_model, F = d_ff, S = ``src_len``, the t-th step (t = 1..steps) costs:

    - without the cache, ``model.decode`` over t tokens: self-attention 8 t C^2 + 4 t^2 C, cross-attention
      4 t C^2 (queries, output) + 4 S C^2 (the memory's keys and values, projected again every step)
      + 4 t S C, feed-forward 4 t C F; and the output layer 2 t C V for all t positions;
    - with it, one token: 8 C^2 + 4 t C (t keys), 4 C^2 + 4 S C, 4 C F, output 2 C V; plus 4 S C^2 once per
      sentence for the memory's keys and values.

    Summed over the steps, the recomputation grows as steps^2 (steps^3 in the attention term) and the cache
    as steps. Embeddings, norms and softmax are left out, as in ``model.transformer_flops``, whose per-step
    count the "without" sum is (checked against ``FlopCounterMode`` in the tests, explicit attention).
    """
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
    for name, value in (("batch", batch), ("src_len", src_len), ("steps", steps)):
        if not _is_int(value) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    batch, S, n = int(batch), int(src_len), int(steps)
    C, Fd, V, L = config.d_model, config.d_ff, config.vocab_size, config.n_decoder_layers
    encoder = batch * config.n_encoder_layers * (8 * S * C * C + 4 * S * S * C + 4 * S * C * Fd)
    without = 0
    with_cache = batch * L * 4 * S * C * C  # the memory's keys and values, once
    for t in range(1, n + 1):
        layer = 8 * t * C * C + 4 * t * t * C + 4 * t * C * C + 4 * S * C * C + 4 * t * S * C + 4 * t * C * Fd
        without += batch * (L * layer + 2 * t * C * V)
        step = 8 * C * C + 4 * t * C + 4 * C * C + 4 * S * C + 4 * C * Fd
        with_cache += batch * (L * step + 2 * C * V)
    return DecodeWork(encoder=encoder, without_cache=without, with_cache=with_cache, tokens=batch * n)


@dataclasses.dataclass(frozen=True)
class DecodeTiming:
    """Greedy decoding of one batch timed without and with the cache (medians of ``repeats``, after a warm-up)."""

    without_cache_s: float
    """Median seconds of ``generate.greedy_translate`` (recomputes the prefix every step)."""
    with_cache_s: float
    """Median seconds of :func:`greedy_translate_cached`."""
    batch: int
    tokens: int
    """Tokens generated over the batch (the translations' lengths, <eos> not counted)."""
    steps: int
    """Decoding steps run: the longest translation, plus one for its <eos> unless it hit ``max_len``."""
    same_output: bool
    """True when both returned the same token ids (they should; a near-tie in the logits could flip one)."""

    @property
    def speedup(self) -> float:
        """Time without the cache / time with it."""
        from gpuformer_lib import bench

        return bench.speedup(self.without_cache_s, self.with_cache_s)


def decode_timing(model: Transformer, src: Tensor, src_padding_mask: Tensor | None, max_len: int, *,
                  repeats: int = 3) -> DecodeTiming:
    """Time ``generate.greedy_translate`` and :func:`greedy_translate_cached` on the same batch with
    ``bench.time_fn`` (one warm-up call each, ``repeats`` timed calls, synchronized on a GPU)."""
    from gpuformer_lib import bench
    from gpuformer_lib.generate import greedy_translate

    model = _check_model(model, "decode_timing")
    _check_max_len(max_len)
    if not _is_int(repeats) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    device = src.device
    plain = greedy_translate(model, src, src_padding_mask, max_len)
    cached = greedy_translate_cached(model, src, src_padding_mask, max_len)
    slow = bench.time_fn(lambda: greedy_translate(model, src, src_padding_mask, max_len), device=device,
                         warmup=1, repeats=repeats)
    fast = bench.time_fn(lambda: greedy_translate_cached(model, src, src_padding_mask, max_len), device=device,
                         warmup=1, repeats=repeats)
    cap = min(max_len, model.config.max_len) - 1  # most tokens a translation can hold
    steps = max(min(len(t) + 1, cap) for t in cached)
    return DecodeTiming(without_cache_s=slow.median, with_cache_s=fast.median, batch=src.shape[0],
                        tokens=sum(len(t) for t in cached), steps=steps, same_output=plain == cached)
