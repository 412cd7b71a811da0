"""Grouped-query attention (MHA, GQA, MQA) and a KV cache for incremental decoding, with their costs.

Multi-query attention (Shazeer, 2019, "Fast Transformer Decoding: One Write-Head is All You Need") lets
every query head share one key head and one value head; grouped-query attention (Ainslie et al., 2023,
"GQA: Training Generalized Multi-Query Transformer Models from Multi-Head Checkpoints") shares each
key/value head among a group of ``n_heads / n_kv_heads`` query heads. ``n_kv_heads = n_heads`` is
ordinary multi-head attention, ``n_kv_heads = 1`` is MQA. Query head ``h`` uses key/value head
``h // (n_heads / n_kv_heads)`` (the convention of FlashAttention and of ``F.scaled_dot_product_attention``
with ``enable_gqa=True``, i.e. ``repeat_interleave`` of the key/value heads).

A decoder that generates token t+1 needs the keys and values of tokens 0..t in every layer. Recomputing
them is a forward pass over the whole prefix for every new token; the **KV cache** keeps them, so a step
computes only the new token's q, k, v and attends over the stored keys: per layer it reads
``2 * n_kv_heads * hs * T`` numbers per sequence, which is what GQA and MQA shrink. Its size is

    bytes = 2 (K and V) * n_layers * n_kv_heads * hs * T * B * bytes per element      (:func:`kv_cache_bytes`)

Contents: :func:`grouped_attention` (the product written out without copying the shared keys),
:class:`GroupedQueryAttention` (parameters named as in ``attention.MultiHeadAttention`` so that with
``n_kv_heads = n_heads`` one's ``state_dict`` loads into the other), :class:`LayerKVCache` and
:class:`KVCache` (preallocated buffers, filled as tokens arrive), :class:`CachedDecoder` (a small
decoder-only model that runs with or without a cache) and :func:`greedy_decode`; the cost models
:func:`decode_step_bytes`, :func:`predicted_decode_seconds` and :func:`predicted_heads_loop_vs_batch`;
decode intensity against the batch (:func:`decode_intensity`, :func:`cache_intensity`,
:func:`compute_bound_batch`: batching amortises the weights, never the cache); and
:func:`minimal_attention`, the explicit attention with nothing added (no input checks, no NaN guard, the
mask built once by the caller) used to compare a loop over heads with one batched call like for like.

Leaves out: paged or quantized caches, sliding windows, rotary positions (the model uses learned absolute
positions), beam search and sampling (``generate``), and converting a trained MHA checkpoint to GQA by
mean-pooling its key/value heads (Ainslie et al., §2.1).
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# --------------------------------------------------------------------------- attention with shared key/value heads


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """(B, Hkv, T, hs) -> (B, Hkv * n_rep, T, hs): each key/value head copied for the query heads of its group.
    The reference (and what a naive GQA does); :func:`grouped_attention` gets the same result without the copy."""
    return x.repeat_interleave(n_rep, dim=1)


def bottom_right_causal_mask(t_query: int, t_key: int, device: torch.device | str | None = None) -> Tensor:
    """(Tq, Tk) bool, True where query i may see key j: the queries are the *last* Tq of Tk positions, so
    query i sits at position Tk - Tq + i and sees keys j <= Tk - Tq + i. With a cache, Tq new tokens attend
    over Tk = cached + Tq keys; ``is_causal=True`` in ``F.scaled_dot_product_attention`` aligns top-left
    instead, which is only right when Tq == Tk."""
    if t_query > t_key:
        raise ValueError(f"more queries ({t_query}) than keys ({t_key}): the keys must include the queries' own")
    return torch.ones(t_query, t_key, dtype=torch.bool, device=device).tril(diagonal=t_key - t_query)


def grouped_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = True) -> Tensor:
    """Attention of H query heads over Hkv shared key/value heads, written out.

    q: (B, H, Tq, hs); k, v: (B, Hkv, Tk, hs) with H a multiple of Hkv; returns (B, H, Tq, hs). With
    ``causal`` the mask is bottom-right aligned (:func:`bottom_right_causal_mask`). The g = H / Hkv query
    heads of a group are stacked along the token axis, so each key/value head is read once for its whole
    group instead of being copied g times (:func:`repeat_kv`).
    """
    B, H, Tq, hs = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    if H % Hkv:
        raise ValueError(f"{H} query heads cannot be grouped over {Hkv} key/value heads (not a divisor)")
    g = H // Hkv
    qg = q.reshape(B, Hkv, g * Tq, hs)  # (B, H, Tq, hs) -> (B, Hkv, g*Tq, hs): head h = kv*g + j
    scores = (qg * hs**-0.5) @ k.transpose(-2, -1)  # (B, Hkv, g*Tq, hs) x (B, Hkv, hs, Tk) -> (B, Hkv, g*Tq, Tk)
    if causal:
        allowed = bottom_right_causal_mask(Tq, Tk, device=q.device).repeat(g, 1)  # (g*Tq, Tk)
        scores = scores.masked_fill(~allowed, float("-inf"))
    y = scores.softmax(dim=-1) @ v  # (B, Hkv, g*Tq, Tk) x (B, Hkv, Tk, hs) -> (B, Hkv, g*Tq, hs)
    return y.reshape(B, H, Tq, hs)  # (B, Hkv, g*Tq, hs) -> (B, H, Tq, hs)


def minimal_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None = None) -> Tensor:
    """softmax(q k^T / sqrt(hs)) v and nothing else: ``allowed`` (True = may attend) is built once by the
    caller; no input checks, no guard for fully masked rows (``attention.scaled_dot_product_attention``
    adds both, and builds the causal mask on every call). For timing like for like."""
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # (..., Tq, hs) x (..., hs, Tk) -> (..., Tq, Tk)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(dim=-1) @ v  # (..., Tq, Tk) x (..., Tk, hs) -> (..., Tq, hs)


# --------------------------------------------------------------------------- the cache


class LayerKVCache:
    """One layer's keys and values, preallocated for ``max_len`` tokens: (B, Hkv, max_len, hs) each.

    :meth:`append` writes new tokens' keys and values after the ones stored and returns views of all of
    them; nothing is reallocated while decoding (a growing ``torch.cat`` would copy the whole cache every step).
    """

    def __init__(self, batch: int, n_kv_heads: int, max_len: int, head_size: int, *, dtype: torch.dtype,
                 device: torch.device | str | None = None):
        for name, value in (("batch", batch), ("n_kv_heads", n_kv_heads), ("max_len", max_len),
                            ("head_size", head_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        shape = (batch, n_kv_heads, max_len, head_size)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store (B, Hkv, t, hs) new keys and values; return all stored so far, (B, Hkv, length, hs) each."""
        t = k.shape[2]
        if k.shape[:2] != self.k.shape[:2] or k.shape[3] != self.k.shape[3] or v.shape != k.shape:
            raise ValueError(f"new keys {tuple(k.shape)} / values {tuple(v.shape)} do not fit a cache of "
                             f"{tuple(self.k.shape)} = (B, Hkv, max_len, hs)")
        if self.length + t > self.max_len:
            raise ValueError(f"the cache holds {self.max_len} tokens; {self.length} stored + {t} new is more")
        self.k[:, :, self.length:self.length + t] = k
        self.v[:, :, self.length:self.length + t] = v
        self.length += t
        return self.k[:, :, :self.length], self.v[:, :, :self.length]

    @property
    def nbytes(self) -> int:
        """Bytes of the two buffers as allocated (for ``max_len`` tokens), read from the tensors."""
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()


class KVCache:
    """The caches of every layer of a model; ``length`` is how many tokens they hold."""

    def __init__(self, layers: list[LayerKVCache]):
        if not layers:
            raise ValueError("a KV cache needs at least one layer")
        self.layers = layers

    @property
    def length(self) -> int:
        return self.layers[0].length

    def truncate(self, length: int) -> None:
        """Forget every token after the first ``length`` (to re-time one step, or to backtrack)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"length must be in [0, {self.length}], got {length}")
        for layer in self.layers:
            layer.length = length

    @property
    def nbytes(self) -> int:
        """Bytes of all layers' key and value buffers, read from the tensors."""
        return sum(layer.nbytes for layer in self.layers)


def kv_cache_bytes(n_layers: int, n_kv_heads: int, head_size: int, seq_len: int, batch: int,
                   bytes_per_element: int) -> int:
    """Predicted size of a KV cache: 2 (K and V) * n_layers * n_kv_heads * hs * T * B * bytes per element."""
    for name, value in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("head_size", head_size),
                        ("seq_len", seq_len), ("batch", batch), ("bytes_per_element", bytes_per_element)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return 2 * n_layers * n_kv_heads * head_size * seq_len * batch * bytes_per_element


# --------------------------------------------------------------------------- the layer and a small decoder


class GroupedQueryAttention(nn.Module):
    """Causal self-attention with ``n_kv_heads`` key/value heads shared by ``n_heads`` query heads.

    (B, T, C) in, (B, T, C) out. ``in_proj_weight`` stacks W_q (C rows), W_k and W_v (Hkv * hs rows each);
    with ``n_kv_heads = n_heads`` it is (3C, C), named as in ``attention.MultiHeadAttention`` and
    ``nn.MultiheadAttention``, so their ``state_dict`` loads here. With a ``cache``, the new tokens'
    keys and values are appended to it and the queries attend over everything stored.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, bias: bool = True):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if n_kv_heads < 1 or n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads={n_kv_heads} must divide n_heads={n_heads} (1 = MQA, n_heads = MHA)")
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.head_size = d_model // n_heads
        kv_width = n_kv_heads * self.head_size
        self.in_proj_weight = nn.Parameter(torch.empty(d_model + 2 * kv_width, d_model))
        self.in_proj_bias = nn.Parameter(torch.zeros(d_model + 2 * kv_width)) if bias else None
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        nn.init.xavier_uniform_(self.in_proj_weight)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}"

    def forward(self, x: Tensor, cache: LayerKVCache | None = None) -> Tensor:
        B, T, C = x.shape
        H, Hkv, hs = self.n_heads, self.n_kv_heads, self.head_size
        qkv = F.linear(x, self.in_proj_weight, self.in_proj_bias)  # (B, T, C + 2 Hkv hs)
        q, k, v = qkv.split([C, Hkv * hs, Hkv * hs], dim=-1)
        q = q.view(B, T, H, hs).transpose(1, 2)  # (B, T, C) -> (B, H, T, hs)
        k = k.view(B, T, Hkv, hs).transpose(1, 2)  # (B, T, Hkv hs) -> (B, Hkv, T, hs)
        v = v.view(B, T, Hkv, hs).transpose(1, 2)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, Hkv, cached + T, hs)
        y = grouped_attention(q, k, v, causal=True)  # (B, H, T, hs)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, C))  # (B, H, T, hs) -> (B, T, C)


@dataclasses.dataclass(frozen=True)
class DecoderShape:
    """The sizes of a :class:`CachedDecoder`."""

    vocab_size: int = 64
    d_model: int = 64
    n_heads: int = 8
    n_kv_heads: int = 8
    """Key/value heads: ``n_heads`` for MHA, 1 for MQA, a divisor in between for GQA."""
    n_layers: int = 2
    max_len: int = 256
    """Longest sequence (learned positions); also the default cache length."""

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_heads", "n_kv_heads", "n_layers", "max_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.d_model % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}: "
                             "n_heads must divide d_model and n_kv_heads must divide n_heads")


class _Block(nn.Module):
    def __init__(self, shape: DecoderShape):
        super().__init__()
        C = shape.d_model
        self.norm1, self.norm2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.attn = GroupedQueryAttention(C, shape.n_heads, shape.n_kv_heads)
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C))

    def forward(self, x: Tensor, cache: LayerKVCache | None) -> Tensor:
        x = x + self.attn(self.norm1(x), cache)  # pre-LN residual blocks
        return x + self.mlp(self.norm2(x))


class CachedDecoder(nn.Module):
    """A small pre-LN decoder-only language model whose attention layers can use a :class:`KVCache`.

    ``forward(idx, cache=None)``: token ids (B, T) -> logits (B, T, V). Without a cache the T tokens are
    positions 0..T-1; with one they continue after the ``cache.length`` tokens it holds.
    """

    def __init__(self, shape: DecoderShape):
        super().__init__()
        self.shape = shape
        self.tok_emb = nn.Embedding(shape.vocab_size, shape.d_model)
        self.pos_emb = nn.Embedding(shape.max_len, shape.d_model)
        self.blocks = nn.ModuleList(_Block(shape) for _ in range(shape.n_layers))
        self.norm = nn.LayerNorm(shape.d_model)
        self.head = nn.Linear(shape.d_model, shape.vocab_size, bias=False)

    def new_cache(self, batch: int, max_len: int | None = None) -> KVCache:
        """An empty cache for ``batch`` sequences of up to ``max_len`` tokens, in the model's dtype and device."""
        p = self.head.weight
        s = self.shape
        return KVCache([LayerKVCache(batch, s.n_kv_heads, max_len or s.max_len, s.d_model // s.n_heads,
                                     dtype=p.dtype, device=p.device) for _ in range(s.n_layers)])

    def forward(self, idx: Tensor, cache: KVCache | None = None) -> Tensor:
        B, T = idx.shape
        start = cache.length if cache is not None else 0
        if start + T > self.shape.max_len:
            raise ValueError(f"{start} + {T} tokens is more than max_len={self.shape.max_len}")
        pos = torch.arange(start, start + T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)  # (B, T, C)
        for i, block in enumerate(self.blocks):
            x = block(x, cache.layers[i] if cache is not None else None)
        return self.head(self.norm(x))  # (B, T, C) -> (B, T, V)


@torch.no_grad()
def greedy_decode(model: CachedDecoder, prompt: Tensor, n_new: int, *, use_cache: bool = True) -> Tensor:
    """Append ``n_new`` greedily chosen tokens to ``prompt`` (B, T0). Without the cache every step runs the
    model over the whole sequence so far; with it, the prompt once (prefill) and then one token per step."""
    idx = prompt
    cache = model.new_cache(prompt.shape[0], prompt.shape[1] + n_new) if use_cache else None
    step_input = prompt
    for _ in range(n_new):
        logits = model(step_input if use_cache else idx, cache)  # (B, T, V)
        nxt = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
        idx = torch.cat([idx, nxt], dim=1)
        step_input = nxt
    return idx


# --------------------------------------------------------------------------- cost models


def decoder_parameters(d_model: int, n_layers: int, vocab_size: int, n_heads: int, n_kv_heads: int,
                       max_len: int) -> int:
    """Parameters of a GPT-2-like decoder (as :class:`CachedDecoder`, untied head, biases, LayerNorms).
    GPT-2 small (C 768, 12 layers, V 50257, 1024 positions, 12 heads) ties its head: subtract V * C."""
    hs = d_model // n_heads
    attn = d_model * (d_model + 2 * n_kv_heads * hs) + (d_model + 2 * n_kv_heads * hs) + d_model * d_model + d_model
    mlp = 2 * 4 * d_model * d_model + 4 * d_model + d_model
    norms = 2 * 2 * d_model
    return (n_layers * (attn + mlp + norms) + vocab_size * d_model + max_len * d_model + 2 * d_model
            + vocab_size * d_model)


def decode_step_bytes(weight_bytes: float, cache_bytes: float) -> float:
    """Bytes one decoding step must read at least: every weight once, and the whole KV cache once."""
    if weight_bytes < 0 or cache_bytes < 0:
        raise ValueError("bytes cannot be negative")
    return weight_bytes + cache_bytes


def predicted_decode_seconds(gpu: str, weight_bytes: float, cache_bytes: float) -> float:
    """Predicted time of one decoding step with a cache on ``gpu``: decode is memory-bound (a (B, 1, C)
    activation against (C, C) weights does 2 FLOPs per weight read at B = 1), so (weights + cache) over the
    bandwidth a copy achieves (the course's predictor, ``predict.achievable_bandwidth``); launches left out
    (a compiled, graph-replayed decode)."""
    from gpuformer_lib import predict

    return decode_step_bytes(weight_bytes, cache_bytes) / predict.achievable_bandwidth(gpu)[0]


@dataclasses.dataclass(frozen=True)
class DecodeIntensity:
    """The work of one decoding step of ``batch`` sequences at ``context`` tokens each, with a KV cache."""

    batch: int
    flops: float
    """2 per weight per sequence (the products) + 4 per cached key element per query head (q kᵀ and p v)."""
    weight_bytes: float
    """Every weight read once per step, however many sequences share it."""
    cache_bytes: float
    """Every sequence's own cached keys and values, read once per step."""

    @property
    def nbytes(self) -> float:
        return self.weight_bytes + self.cache_bytes

    @property
    def intensity(self) -> float:
        """FLOPs per byte read: the x of the roofline."""
        return self.flops / self.nbytes


def decode_intensity(matrix_params: int, *, batch: int, context: int, n_layers: int, n_heads: int,
                     n_kv_heads: int, head_size: int, itemsize: int = 2) -> DecodeIntensity:
    """FLOPs, bytes and arithmetic intensity of one cached decoding step against the batch size.

    ``matrix_params`` are the weights of the matrix products (not embeddings or norms). Batching reads each
    weight once for all ``batch`` sequences, so the weights' share of the intensity grows as 2·batch/itemsize;
    but each sequence reads its own cache, whose share stays at 2·(n_heads / n_kv_heads) / itemsize FLOP per
    byte whatever the batch (:func:`cache_intensity`): at long contexts decoding stays memory-bound however
    large the batch, unless the heads share their keys (GQA, MQA). Checked against ``FlopCounterMode`` on a
    :class:`CachedDecoder` (``tests/test_decode_intensity.py``)."""
    for name, value in (("matrix_params", matrix_params), ("batch", batch), ("n_layers", n_layers),
                        ("n_heads", n_heads), ("n_kv_heads", n_kv_heads), ("head_size", head_size),
                        ("itemsize", itemsize)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if isinstance(context, bool) or not isinstance(context, int) or context < 0:
        raise ValueError(f"context must be an int >= 0, got {context!r}")
    if n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads={n_kv_heads} must divide n_heads={n_heads}")
    flops = 2 * matrix_params * batch + 4 * batch * n_layers * context * n_heads * head_size
    cache = 2 * batch * n_layers * context * n_kv_heads * head_size * itemsize
    return DecodeIntensity(batch, float(flops), float(matrix_params * itemsize), float(cache))


def cache_intensity(n_heads: int, n_kv_heads: int, itemsize: int = 2) -> float:
    """FLOPs per byte of reading the KV cache in a decoding step: each cached key (and value) element, of
    ``itemsize`` bytes, meets 2 FLOPs for each of the n_heads / n_kv_heads query heads that share it. The
    intensity decoding tends to as the batch grows at a fixed context (1.0 for multi-head attention in bf16)."""
    if n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads={n_kv_heads} must divide n_heads={n_heads}")
    return 2 * (n_heads // n_kv_heads) / itemsize


def compute_bound_batch(gpu: str, fmt: str, matrix_params: int, *, context: int, n_layers: int, n_heads: int,
                        n_kv_heads: int, head_size: int, itemsize: int = 2, max_batch: int = 1 << 16) -> int | None:
    """The smallest batch at which a decoding step's intensity reaches ``gpu``'s ridge for matrix products in
    ``fmt`` (the course's predictor: achievable rate / achievable bandwidth), or None if no batch up to
    ``max_batch`` does (the cache's intensity, :func:`cache_intensity`, caps it below the ridge)."""
    from gpuformer_lib import predict

    ridge = predict.achievable_rate(gpu, fmt)[0] / predict.achievable_bandwidth(gpu)[0]
    sizes = dict(context=context, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads, head_size=head_size,
                 itemsize=itemsize)
    if decode_intensity(matrix_params, batch=max_batch, **sizes).intensity < ridge:
        return None
    low, high = 1, max_batch  # intensity grows with the batch: bisect for the first batch at the ridge
    while low < high:
        middle = (low + high) // 2
        if decode_intensity(matrix_params, batch=middle, **sizes).intensity >= ridge:
            high = middle
        else:
            low = middle + 1
    return low


SM_COUNT = {"T4": 40, "H100 SXM": 132}
"""Streaming multiprocessors (NVIDIA datasheets: T4 Turing TU104, 40 SMs; H100 SXM5, 132 SMs)."""


@dataclasses.dataclass(frozen=True)
class HeadsPrediction:
    """Predicted time of minimal causal attention over H heads: one call per head, or one batched call."""

    gpu: str
    loop_seconds: float
    batch_seconds: float
    launch_bound_loop: bool
    """True when the loop's time is mostly launch overhead (its kernels are too small to fill the GPU)."""

    @property
    def speedup(self) -> float:
        """Loop time / batch time: how many times faster batching is predicted to be."""
        return self.loop_seconds / self.batch_seconds


def predicted_heads_loop_vs_batch(batch: int, n_heads: int, seq_len: int, head_size: int, dtype: torch.dtype,
                                  gpu: str, *, launch_seconds: float | None = None) -> HeadsPrediction:
    """The course's predictor (``gpuformer_lib.predict``) on :func:`minimal_attention` run per head or batched
    on ``gpu``, eager.

    The minimal attention is 4 kernels (scale q, q k^T, masked softmax counted as two passes over the
    scores, @ v). Each kernel's GPU time is ``predict.kernel_time`` (the products at the achievable
    tensor-core rate, the rest at the CUDA cores' achievable float32 rate, bytes at the achievable
    bandwidth), scaled by how much of the GPU it can fill: a kernel with fewer 128 x 128 output tiles
    (thread blocks) than the GPU has SMs uses only that fraction of it. The loop runs H such sequences of
    kernels on 1/H of the data each, plus one kernel that stacks them. As in ``predict.predict_step``, the
    host issues the kernels while the GPU runs them: each way takes the larger of the GPU's time and the
    host's, kernels x ``launch_seconds`` (default: what one eager operation outside autograd costs the host,
    ``predict.launch_seconds()['eager-op']``, measured on an H100).
    """
    from gpuformer_lib import gpu_view, predict

    if launch_seconds is None:
        launch_seconds = predict.launch_seconds()["eager-op"]
    item = torch.empty((), dtype=dtype).element_size()
    fmt = predict.format_of(dtype)
    sms = SM_COUNT[gpu_view.datasheet(gpu).name]

    def gpu_seconds(heads: int) -> float:
        rows = batch * heads
        scores = rows * seq_len * seq_len  # elements of the (rows, T, T) scores
        tiles = rows * math.ceil(seq_len / 128) ** 2
        fill = min(1.0, tiles / sms)
        qk = predict.kernel_time(2 * rows * seq_len * seq_len * head_size,
                                 (2 * rows * seq_len * head_size + scores) * item, gpu, fmt, matrix=True)[0] / fill
        pv = qk  # the same shapes transposed: (T, T) x (T, hs)
        scale = predict.kernel_time(rows * seq_len * head_size, 2 * rows * seq_len * head_size * item, gpu, fmt,
                                    matrix=False)[0] / fill
        softmax = predict.kernel_time(5 * scores, 4 * scores * item, gpu, fmt, matrix=False)[0] / fill
        return scale + qk + softmax + pv

    out_bytes = batch * n_heads * seq_len * head_size * item
    stack = predict.kernel_time(0, 2 * out_bytes, gpu, fmt, matrix=False)[0]
    loop_gpu, loop_host = n_heads * gpu_seconds(1) + stack, (4 * n_heads + 1) * launch_seconds
    batch_gpu, batch_host = gpu_seconds(n_heads), 4 * launch_seconds
    return HeadsPrediction(gpu_view.datasheet(gpu).name, max(loop_gpu, loop_host), max(batch_gpu, batch_host),
                           launch_bound_loop=loop_host > loop_gpu)


def predicted_recompute_seconds(gpu: str, n_params: int, seq_len: int, batch: int, dtype: torch.dtype) -> float:
    """Predicted time of one decoding step *without* a cache: a forward pass over all ``seq_len`` tokens,
    2 FLOPs per parameter per token at the rate products achieve (attention's own T^2 terms left out, so an
    underestimate at long T), or reading the weights once at the bandwidth a copy achieves, whichever is
    longer (the course's predictor)."""
    from gpuformer_lib import predict

    item = torch.empty((), dtype=dtype).element_size()
    flops = 2 * n_params * seq_len * batch
    return max(flops / predict.achievable_rate(gpu, predict.format_of(dtype))[0], n_params * item / predict.achievable_bandwidth(gpu)[0])


# --------------------------------------------------------------------------- measuring


def _decode_step(model: CachedDecoder, batch: int, context: int, *, use_cache: bool,
                 device: torch.device | str | None = None):
    """The function one greedy decoding step runs at ``context`` tokens (see :func:`time_decode_step`)."""
    if not 1 < context <= model.shape.max_len:
        raise ValueError(f"context must be in [2, {model.shape.max_len}], got {context}")
    device = model.head.weight.device if device is None else device
    idx = torch.randint(0, model.shape.vocab_size, (batch, context), device=device)
    if use_cache:
        cache = model.new_cache(batch, context)
        with torch.no_grad():
            model(idx[:, :-1], cache)  # prefill: the first context - 1 tokens

        def step():
            cache.truncate(context - 1)
            return model(idx[:, -1:], cache)  # (B, 1, V)
    else:
        def step():
            return model(idx)  # (B, context, V)
    return step


def time_decode_step(model: CachedDecoder, batch: int, context: int, *, use_cache: bool,
                     device: torch.device | str | None = None, repeats: int = 7, max_seconds: float | None = None):
    """Time one greedy decoding step at ``context`` tokens (a ``bench.Timing``): with the cache, one new
    token against ``context - 1`` cached ones (the cache is cut back before each repeat); without it, a
    forward pass over all ``context`` tokens, as a decoder without a cache must run for every new token."""
    from gpuformer_lib import bench

    step = _decode_step(model, batch, context, use_cache=use_cache, device=device)
    device = model.head.weight.device if device is None else device
    with torch.no_grad():
        return bench.time_fn(step, device=device, repeats=repeats, max_seconds=max_seconds)


def decode_speedup(model: CachedDecoder, batch: int, context: int, *, device: torch.device | str | None = None,
                   repeats: int = 7, max_seconds: float | None = None, **timing):
    """Time one decoding step at ``context`` tokens without and with the cache, in interleaved rounds
    (``bench.compare``, the course's one way to time a comparison); return the ``bench.Comparison`` of
    ``"with the cache"`` against the baseline ``"without the cache"``: its ``speedup`` is (median time
    without) / (median time with), its ``verdict`` and ``phrase()`` judge the gap against the rounds' spread,
    and ``timings`` holds both ``bench.Timing``s. ``timing`` goes on to ``bench.time_interleaved``."""
    from gpuformer_lib import bench

    device = model.head.weight.device if device is None else device
    steps = {"without the cache": _decode_step(model, batch, context, use_cache=False, device=device),
             "with the cache": _decode_step(model, batch, context, use_cache=True, device=device)}
    with torch.no_grad():
        return bench.compare(steps, baseline="without the cache", device=device, repeats=repeats,
                             max_seconds=max_seconds, **timing)["with the cache"]


_MATRIX_PRODUCTS = frozenset({"linear", "matmul", "__matmul__", "bmm", "mm", "addmm", "baddbmm"})


def count_torch_work(fn) -> tuple[int, int]:
    """``(calls, elements)`` of ``fn()``: how many PyTorch functions and tensor methods it calls
    (``torch.overrides.TorchFunctionMode`` sees each one; in eager mode each costs a roughly fixed dispatch,
    and on a GPU launch, overhead), and how many elements the calls that are neither matrix products nor
    views write (masking, softmax, GELU, layer norm, additions, copies): the memory-bound passes."""
    from torch.overrides import TorchFunctionMode

    counts = [0, 0]

    class _Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            counts[0] += 1
            if (isinstance(out, Tensor) and out._base is None
                    and getattr(func, "__name__", "") not in _MATRIX_PRODUCTS):
                counts[1] += out.numel()
            return out

    with _Count():
        fn()
    return counts[0], counts[1]


def decode_step_work(model: CachedDecoder, batch: int, context: int, *, use_cache: bool,
                     device: torch.device | str | None = None) -> tuple[int, int, int]:
    """``(FLOPs, PyTorch calls, elements)`` of one decoding step at ``context`` tokens, with or without the
    cache: the FLOPs of its matrix products from ``FlopCounterMode``, the calls and the elements written by
    its other operations from :func:`count_torch_work`. A cost model of the step is then FLOPs / (a measured
    FLOP rate) + elements * (a measured cost per element) + calls * (a measured cost of one call)."""
    from torch.utils.flop_counter import FlopCounterMode

    step = _decode_step(model, batch, context, use_cache=use_cache, device=device)
    with torch.no_grad():
        with FlopCounterMode(display=False) as counter:
            step()
        calls, elements = count_torch_work(step)
    return counter.get_total_flops(), calls, elements


SDPA_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")


def sdpa_backends(q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool = False) -> dict[str, str]:
    """Which of ``F.scaled_dot_product_attention``'s backends accept these inputs on their device: each is
    forced in turn with ``torch.nn.attention.sdpa_kernel``; the value is ``'runs'`` or ``'refused: '`` and
    PyTorch's first stated reason (head size, dtype, GPU generation, ...)."""
    import warnings

    from torch.nn.attention import SDPBackend, sdpa_kernel

    report = {}
    for name in SDPA_BACKENDS:
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            report[name] = "refused: not in this version of PyTorch"
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel(backend):
                    F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
                report[name] = "runs"
            except RuntimeError as error:
                reasons = [str(w.message).splitlines()[0] for w in caught] or [str(error).splitlines()[0]]
                report[name] = "refused: " + reasons[0][:160]
    return report
