"""Scaled dot-product attention and multi-head attention, written out, with masks safe in every dtype.

Implements Vaswani et al. (2017), "Attention Is All You Need", §3.2: equation (1),

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V,

and multi-head attention (§3.2.2). Masks follow ``torch.nn.functional.scaled_dot_product_attention``:
a boolean ``attn_mask`` is True where a query may attend to a key; a float mask is added to the
scores. Masked scores become ``-inf`` (never a literal like -1e9, which does not fit in float16),
and a query whose every key is masked gets zero weights and a zero output instead of NaN. Q is
scaled by 1/sqrt(d_k) before the product, not after, so large activations do not overflow float16.
Inputs that would otherwise compute a wrong answer quietly are refused with a message: integer q, k
or v, an integer mask or a float mask of only 0s and 1s (meant as "may attend", but added to the
scores it hides nothing), dimensions that only broadcast by accident.

Leaves out: positional information and the layers around attention (``layers``), fused kernels
other than PyTorch's own SDPA (chapter 10).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


_MASK_RULES = ("a bool mask is True where a query may attend to a key; a float mask is added to the scores "
               "(0 to attend, -inf to block)")


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    """Refuse inputs the computation would get wrong without an error (integers, a mix of dtypes,
    leading dimensions that only line up by accident), or that PyTorch would reject deep inside."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}: integer scores and weights "
                            "would round to nothing (embed token ids first, or convert with .float())")
        if t.dim() < 2:
            raise ValueError(f"{name} must have shape (..., T, hs), got {tuple(t.shape)}")
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype} and {v.dtype}; cast them to one")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device} and {v.device}")
    if not q.dim() == k.dim() == v.dim():
        raise ValueError(f"q, k and v must have the same number of dimensions, got {shapes}: a missing dimension "
                         "would be broadcast against the wrong one (to share k or v across heads, give it a "
                         "dimension of size 1, e.g. k.unsqueeze(1))")
    if q.shape[-1] == 0:
        raise ValueError(f"the head size (last dimension of q and k) must be at least 1, got {shapes}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k need the same head size: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v need the same number of keys: k {tuple(k.shape)}, v {tuple(v.shape)}")
    try:
        torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(f"the leading (batch, head) dimensions of {shapes} do not match or broadcast") from None


def _looks_like_a_0_1_mask(mask: Tensor) -> bool:
    """A float mask of only 0s and 1s, with a 1: almost surely meant as "1 = may attend". Reading the
    answer back is a host sync on a GPU; float masks are rare in the course (bool masks cost nothing)."""
    return bool((((mask == 0) | (mask == 1)).all() & (mask == 1).any()).item())


def _check_mask(mask: Tensor, scores_shape: torch.Size, device: torch.device, name: str = "attn_mask") -> None:
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"{name} has dtype {mask.dtype}, which is ambiguous: {_MASK_RULES}. Added to the scores, a "
                        f"0/1 integer mask would leave every key visible; for 1 = may attend, pass {name}.bool()")
    if mask.device != device:
        raise ValueError(f"{name} is on {mask.device} but the attention inputs are on {device}; move it with .to()")
    try:
        broadcast = torch.broadcast_shapes(mask.shape, scores_shape)
    except RuntimeError:
        broadcast = None
    if broadcast != scores_shape:  # not broadcastable, or it would add dimensions to the output
        raise ValueError(
            f"{name} of shape {tuple(mask.shape)} does not broadcast to the attention scores "
            f"{tuple(scores_shape)} = (..., T_query, T_key)"
        )
    if 2 < mask.dim() < len(scores_shape):
        # e.g. (B, Tq, Tk) against (B, H, Tq, Tk): broadcasting would match B with H, silently
        raise ValueError(f"{name} of shape {tuple(mask.shape)} has fewer dimensions than the attention scores "
                         f"{tuple(scores_shape)}, so its leading dimension would be matched to the wrong one; give it "
                         f"all {len(scores_shape)} (size 1 where it is shared, e.g. {name}[:, None] for one mask per "
                         "sequence shared by every head) or just (T_query, T_key)")
    if mask.dtype != torch.bool and not torch.compiler.is_compiling() and _looks_like_a_0_1_mask(mask):
        raise ValueError(f"{name} is a float mask of only 0s and 1s, which would be added to the scores and hide "
                         f"nothing: {_MASK_RULES}. For 1 = may attend, pass {name}.bool()")


def causal_mask(t_query: int, t_key: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """Boolean (T_query, T_key) mask, True where query i may see key j: j <= i (top-left aligned)."""
    t_key = t_query if t_key is None else t_key
    return torch.ones(t_query, t_key, dtype=torch.bool, device=device).tril()


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Attention written out: returns ``(output, weights)``.

    q: (..., Tq, hs), k: (..., Tk, hs), v: (..., Tk, hv) -> output (..., Tq, hv), weights (..., Tq, Tk).
    q, k and v are floating point, of one dtype, device and number of dimensions. ``weights`` are the
    probabilities actually applied to ``v`` (after dropout, if any). Like PyTorch's function, dropout
    is applied whenever ``dropout_p > 0``: pass 0 in evaluation. An integer ``attn_mask``, or a float
    one of only 0s and 1s, is refused: use ``mask.bool()`` (True = may attend).
    """
    _check_qkv(q, k, v)
    if is_causal and attn_mask is not None:
        raise ValueError("pass either attn_mask or is_causal=True, not both (combine them into one mask)")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not 0 < scale < math.inf):  # NaN fails the comparison too
        raise ValueError(f"scale must be a finite number > 0, or None for 1/sqrt(hs), got {scale!r}")
    if attn_mask is not None:
        scores_shape = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]) + (q.shape[-2], k.shape[-2])
        _check_mask(attn_mask, scores_shape, q.device)
    return _attend(q, k, v, attn_mask, is_causal, dropout_p, scale)


def _attend(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, is_causal: bool, dropout_p: float,
            scale: float | None) -> tuple[Tensor, Tensor]:
    """The computation of :func:`scaled_dot_product_attention`, on inputs already checked."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    # Scale q before the product, not the product after: in float16, q @ kᵀ alone can pass 65504 (inf)
    # where the scaled scores are fine. (MultiHeadAttention keeps as much for the backward pass as
    # before: matmul saves copies of its non-contiguous head views either way.)
    scores = (q * scale) @ k.transpose(-2, -1)  # (..., Tq, hs) x (..., hs, Tk) -> (..., Tq, Tk)
    if is_causal:
        attn_mask = causal_mask(q.shape[-2], k.shape[-2], device=q.device)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.to(scores.dtype)
    # A query with every key masked would softmax -inf against -inf (NaN): give it zero weights.
    fully_masked = torch.isneginf(scores).all(dim=-1, keepdim=True)
    weights = scores.masked_fill(fully_masked, 0.0).softmax(dim=-1).masked_fill(fully_masked, 0.0)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights.to(v.dtype) @ v, weights  # (..., Tq, Tk) x (..., Tk, hv) -> (..., Tq, hv)


class MultiHeadAttention(nn.Module):
    """Multi-head attention, batch-first: (B, T, C) in, (B, T, C) out.

    Parameters are named as in ``torch.nn.MultiheadAttention`` (``in_proj_weight`` holding W_q, W_k
    and W_v stacked, ``in_proj_bias``, ``out_proj``), so one module's ``state_dict`` loads into the
    other. ``fused`` is chosen when the module is built and cannot be flipped later: True computes
    attention with PyTorch's fused ``F.scaled_dot_product_attention``, False with the explicit
    :func:`scaled_dot_product_attention` (which keeps the (B, H, Tq, Tk) scores and which FLOP
    counters see). Both give the same result; ``need_weights=True`` always takes the explicit path.
    To compare the two, build one of each and load one's ``state_dict`` into the other.

    Masks: ``attn_mask`` as in :func:`scaled_dot_product_attention` (boolean True = may attend),
    shaped (Tq, Tk) or (B, H, Tq, Tk) or anything that broadcasts to it; ``key_padding_mask`` (B, Tk)
    is a bool tensor, True at *padding* keys, which are ignored (the convention of
    ``nn.MultiheadAttention``'s boolean masks; other dtypes are refused, as their meaning is ambiguous).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True, fused: bool = True):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model, self.n_heads, self.head_size = d_model, n_heads, d_model // n_heads
        self.dropout = dropout
        self._fused = bool(fused)
        self.in_proj_weight = nn.Parameter(torch.empty(3 * d_model, d_model))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * d_model)) if bias else None
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        nn.init.xavier_uniform_(self.in_proj_weight)
        if bias:
            nn.init.zeros_(self.out_proj.bias)

    @property
    def fused(self) -> bool:
        """True: PyTorch's fused kernel; False: the explicit computation. Fixed at construction."""
        return self._fused

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, dropout={self.dropout}, fused={self.fused}"

    def split_heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.head_size).transpose(1, 2)  # (B, T, C) -> (B, H, T, hs)

    def merge_heads(self, x: Tensor) -> Tensor:
        B, _, T, _ = x.shape
        return x.transpose(1, 2).reshape(B, T, self.d_model)  # (B, H, T, hs) -> (B, T, C)

    def _project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        w, b = self.in_proj_weight, self.in_proj_bias
        if query is key and key is value:  # self-attention: one fused (C -> 3C) projection
            return F.linear(query, w, b).chunk(3, dim=-1)  # (B, T, C) -> 3 x (B, T, C)
        w_q, w_k, w_v = w.chunk(3)
        b_q, b_k, b_v = b.chunk(3) if b is not None else (None, None, None)
        return F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None) -> None:
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, Tensor) or not t.is_floating_point():
                raise TypeError(f"{name} must be a floating-point tensor (B, T, {self.d_model}), got "
                                f"{getattr(t, 'dtype', type(t).__name__)}: embed token ids before attention")
            if t.dim() != 3 or t.shape[-1] != self.d_model:
                raise ValueError(f"{name} must have shape (B, T, {self.d_model}), got {tuple(t.shape)}")
            if t.device != query.device:
                raise ValueError(f"query, key and value must be on one device, got {query.device} and {t.device}")
        if key.shape[:2] != value.shape[:2] or key.shape[0] != query.shape[0]:
            raise ValueError(f"query {tuple(query.shape)}, key {tuple(key.shape)} and value "
                             f"{tuple(value.shape)} must share B, and key and value T")
        weight_dtype = self.in_proj_weight.dtype
        if len({query.dtype, key.dtype, value.dtype, weight_dtype}) > 1 and not torch.is_autocast_enabled(
                query.device.type):  # autocast casts them to one dtype itself
            raise TypeError(f"query ({query.dtype}), key ({key.dtype}), value ({value.dtype}) and the weights "
                            f"({weight_dtype}) must share one dtype: convert the inputs or the module "
                            "(module.to(dtype)), or run under torch.autocast")
        if key_padding_mask is None:
            return
        if not isinstance(key_padding_mask, Tensor) or key_padding_mask.dtype != torch.bool:
            # nn.MultiheadAttention adds a float key_padding_mask to the scores; a 0/1 one could mean
            # "1 = padding" or "1 = real token" (Hugging Face's attention_mask): refuse, don't guess.
            raise TypeError(f"key_padding_mask must be a bool tensor, True at padding keys, got "
                            f"{getattr(key_padding_mask, 'dtype', type(key_padding_mask).__name__)}; for a 0/1 "
                            "mask with 1 at padding pass mask.bool(), for one with 1 at real tokens pass mask == 0")
        if key_padding_mask.shape != key.shape[:2]:
            raise ValueError(f"key_padding_mask must have shape (B, T_key) = {tuple(key.shape[:2])}, "
                             f"got {tuple(key_padding_mask.shape)}")
        if key_padding_mask.device != key.device:
            raise ValueError(f"key_padding_mask is on {key_padding_mask.device} but key is on {key.device}")

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attn_mask: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Returns ``(output, weights)``: output (B, Tq, C); weights (B, H, Tq, Tk) if ``need_weights``, else None."""
        self._check_inputs(query, key, value, key_padding_mask)
        B, Tq, Tk = query.shape[0], query.shape[1], key.shape[1]
        q, k, v = (self.split_heads(t) for t in self._project(query, key, value))  # each (B, H, T, hs)
        mask = self._combine_masks(attn_mask, key_padding_mask, is_causal, (B, self.n_heads, Tq, Tk), q.device)
        if mask is not None and mask.dtype != torch.bool:
            mask = mask.to(q.dtype)  # the fused kernel wants a float mask in the dtype of q
        causal_only = is_causal and mask is None
        dropout_p = self.dropout if self.training else 0.0
        if self._fused and not need_weights:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal_only)
            weights = None
        else:  # the masks were checked in _combine_masks: skip the public function's second check
            y, weights = _attend(q, k, v, mask, causal_only, dropout_p, scale=None)
        return self.out_proj(self.merge_heads(y)), weights  # (B, H, Tq, hs) -> (B, Tq, C)

    @staticmethod
    def _combine_masks(attn_mask, key_padding_mask, is_causal, scores_shape, device) -> Tensor | None:
        """One mask for (B, H, Tq, Tk) from the three ways of masking; None if nothing is masked."""
        if attn_mask is not None:
            _check_mask(attn_mask, scores_shape, device)
        if key_padding_mask is None and not (is_causal and attn_mask is not None):
            return attn_mask
        allowed = torch.ones(scores_shape[-2:], dtype=torch.bool, device=device)
        if is_causal:
            allowed = causal_mask(*scores_shape[-2:], device=device)
        if key_padding_mask is not None:
            allowed = allowed & ~key_padding_mask[:, None, None, :]  # (B, Tk) -> (B, 1, 1, Tk)
        if attn_mask is None:
            return allowed
        if attn_mask.dtype == torch.bool:
            return allowed & attn_mask
        return attn_mask.masked_fill(~allowed, float("-inf"))
