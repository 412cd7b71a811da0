"""The layers of a Transformer around attention: positional encodings, the feed-forward block,
residual connections with LayerNorm (pre-LN or post-LN), and the encoder and decoder layers.

Implements Vaswani et al. (2017) §3.1 (layers), §3.3 (feed-forward), §3.5 (sinusoidal positional
encoding). Post-LN is the paper's ``x = LayerNorm(x + Sublayer(x))``; pre-LN, used by GPT-2 and
most models since (Xiong et al. 2020), is ``x = x + Sublayer(LayerNorm(x))``.

Submodules are named as in ``torch.nn.TransformerEncoderLayer`` and ``TransformerDecoderLayer``
(``self_attn``, ``multihead_attn``, ``linear1``, ``linear2``, ``norm1``..``norm3``), so their
``state_dict`` loads into these layers and the two can be compared number for number.

Beside them, what models since Llama use instead: :class:`RMSNorm` (no mean, no bias) and :class:`SwiGLU` (a gated
feed-forward block with three matrices), checked against PyTorch and their formulas.

Leaves out: embeddings and the whole model (``model``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpuformer_lib.attention import MultiHeadAttention

_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


def _check_positive_ints(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def _check_activations(x: Tensor, d_model: int, name: str = "x") -> None:
    """(B, T, C) floating point: checks of shape and dtype only, which cost no host sync on a GPU."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor (B, T, {d_model}), got "
                        f"{getattr(x, 'dtype', type(x).__name__)}: embed token ids first")
    if x.dim() != 3 or x.shape[-1] != d_model:
        raise ValueError(f"{name} must have shape (B, T, {d_model}), got {tuple(x.shape)}")


def sinusoidal_encoding(max_len: int, d_model: int) -> Tensor:
    """(max_len, d_model): PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(same)."""
    _check_positive_ints(max_len=max_len, d_model=d_model)
    if d_model % 2:
        raise ValueError(f"sinusoidal encodings need an even d_model, got {d_model}")
    position = torch.arange(max_len, dtype=torch.float32)[:, None]  # (max_len, 1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    angles = position * inv_freq  # (max_len, 1) x (d_model/2,) -> (max_len, d_model/2)
    pe = torch.empty(max_len, d_model)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(angles), torch.cos(angles)
    return pe


class PositionalEncoding(nn.Module):
    """Adds position information to (B, T, C) embeddings: fixed sinusoids or a learned table."""

    def __init__(self, d_model: int, max_len: int, kind: str = "sinusoidal"):
        super().__init__()
        _check_positive_ints(d_model=d_model, max_len=max_len)
        self.max_len, self.kind = max_len, kind
        if kind == "sinusoidal":
            self.register_buffer("pe", sinusoidal_encoding(max_len, d_model), persistent=False)
        elif kind == "learned":
            self.pe = nn.Parameter(torch.randn(max_len, d_model) * 0.02)
        else:
            raise ValueError(f"kind must be 'sinusoidal' or 'learned', not {kind!r}")

    def forward(self, x: Tensor) -> Tensor:
        _check_activations(x, self.pe.shape[-1])  # integer x would add a table truncated to integers
        if x.device != self.pe.device:
            raise ValueError(f"x is on {x.device} but the positional table is on {self.pe.device}: move the model "
                             "to the input's device")
        T = x.shape[1]
        if T > self.max_len:
            raise ValueError(f"sequence of {T} tokens is longer than max_len={self.max_len}; "
                             "raise max_len in the config or truncate the input")
        return x + self.pe[:T].to(x.dtype)  # (B, T, C) + (T, C)


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each wrapped in a residual connection and LayerNorm.

    With ``causal=True`` it is also the block of a decoder-only language model (GPT).
    ``fused_attention``: PyTorch's fused attention kernel (True) or the explicit computation.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.1, norm_first: bool = True,
                 activation: str = "relu", causal: bool = False, fused_attention: bool = True):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, not {activation!r}")
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout, fused=fused_attention)
        self.linear1, self.linear2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout, self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout), nn.Dropout(dropout)
        self.activation, self.norm_first, self.causal = _ACTIVATIONS[activation], norm_first, causal

    def _sa_block(self, x: Tensor, padding_mask: Tensor | None) -> Tensor:
        y, _ = self.self_attn(x, x, x, key_padding_mask=padding_mask, is_causal=self.causal)
        return self.dropout1(y)

    def _ff_block(self, x: Tensor) -> Tensor:
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))  # C -> d_ff -> C

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """x (B, T, C); padding_mask (B, T), True at padding. Returns (B, T, C)."""
        _check_activations(x, self.self_attn.d_model)
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), padding_mask)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, padding_mask))
        return self.norm2(x + self._ff_block(x))


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention over the encoder's output, then feed-forward."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.1, norm_first: bool = True,
                 activation: str = "relu", fused_attention: bool = True):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, not {activation!r}")
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout, fused=fused_attention)
        self.multihead_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout, fused=fused_attention)
        self.linear1, self.linear2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.dropout1, self.dropout2, self.dropout3 = nn.Dropout(dropout), nn.Dropout(dropout), nn.Dropout(dropout)
        self.activation, self.norm_first = _ACTIVATIONS[activation], norm_first

    def _sa_block(self, x: Tensor, padding_mask: Tensor | None) -> Tensor:
        y, _ = self.self_attn(x, x, x, key_padding_mask=padding_mask, is_causal=True)
        return self.dropout1(y)

    def _ca_block(self, x: Tensor, memory: Tensor, memory_padding_mask: Tensor | None) -> Tensor:
        y, _ = self.multihead_attn(x, memory, memory, key_padding_mask=memory_padding_mask)
        return self.dropout2(y)

    def _ff_block(self, x: Tensor) -> Tensor:
        return self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def forward(self, x: Tensor, memory: Tensor, padding_mask: Tensor | None = None,
                memory_padding_mask: Tensor | None = None) -> Tensor:
        """x (B, T, C) targets; memory (B, S, C) encoder output; masks True at padding."""
        _check_activations(x, self.self_attn.d_model)
        _check_activations(memory, self.self_attn.d_model, "memory")
        if memory.shape[0] != x.shape[0]:
            raise ValueError(f"x {tuple(x.shape)} and memory {tuple(memory.shape)} must have the same batch size B")
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), padding_mask)
            x = x + self._ca_block(self.norm2(x), memory, memory_padding_mask)
            return x + self._ff_block(self.norm3(x))
        x = self.norm1(x + self._sa_block(x, padding_mask))
        x = self.norm2(x + self._ca_block(x, memory, memory_padding_mask))
        return self.norm3(x + self._ff_block(x))


class LayerStack(nn.Module):
    """Layers applied in turn, then a final LayerNorm (named like ``nn.TransformerEncoder``'s).

    Activation checkpointing wraps the layers from outside (``speed.apply_activation_checkpointing``).
    """

    def __init__(self, layers: list[nn.Module], d_model: int):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, *args, **kwargs) -> Tensor:
        for layer in self.layers:
            x = layer(x, *args, **kwargs)
        return self.norm(x)


# --------------------------------------------------------------------------- what models since 2023 use instead


class RMSNorm(nn.Module):
    """Root-mean-square normalisation (Zhang and Sennrich, 2019, "Root Mean Square Layer Normalization"), which
    Llama, Mistral and most models since use instead of LayerNorm:

        y = x / sqrt(mean(x²) + eps) · g

    LayerNorm subtracts the mean and adds a bias; RMSNorm does neither, so it reads the row once for one
    statistic instead of two, and has C parameters instead of 2C. The sum of squares is taken in float32
    for 16-bit inputs (a bfloat16 sum over 4,096 values loses the small ones), the result returned in x's
    dtype. Same numbers as ``torch.nn.RMSNorm`` (``tests/test_layers_modern.py``)."""

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        _check_positive_ints(d_model=d_model)
        if not (isinstance(eps, (int, float)) and 0 < eps < 1):
            raise ValueError(f"eps must be a small positive number, got {eps!r}")
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        if not isinstance(x, Tensor) or not x.is_floating_point() or x.shape[-1] != self.weight.shape[0]:
            raise ValueError(f"x must be a floating-point tensor (..., {self.weight.shape[0]}), got "
                             f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}")
        work = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        normed = work * torch.rsqrt(work.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (normed * self.weight.to(work.dtype)).to(x.dtype)


class SwiGLU(nn.Module):
    """The gated feed-forward block of Llama and PaLM (Shazeer, 2020, "GLU Variants Improve Transformer"):

        SwiGLU(x) = W2 (SiLU(W1 x) ∘ W3 x),    SiLU(z) = z · sigmoid(z)

    Two projections up, one of them gating the other element by element, instead of one projection and a
    ReLU or GELU. With three matrices instead of two, models keep the parameters (and FLOPs, 3·C·F against
    2·C·F per token each way) of a d_ff-wide block by making the hidden width about 2/3 of it:
    :meth:`matching_width` gives Llama's choice, 2/3 · d_ff rounded up to a multiple of ``multiple_of``. No
    biases, as in Llama. Activation memory: it saves W1 x, W3 x and their gated product for the backward,
    three F-wide tensors where a GELU block saves two."""

    def __init__(self, d_model: int, d_hidden: int):
        super().__init__()
        _check_positive_ints(d_model=d_model, d_hidden=d_hidden)
        self.w1 = nn.Linear(d_model, d_hidden, bias=False)  # to the SiLU
        self.w3 = nn.Linear(d_model, d_hidden, bias=False)  # the gate's other side
        self.w2 = nn.Linear(d_hidden, d_model, bias=False)  # back down

    @staticmethod
    def matching_width(d_ff: int, multiple_of: int = 256) -> int:
        """The hidden width that gives a SwiGLU block about the parameters of a two-matrix block of width
        ``d_ff``: 2/3 · d_ff, rounded up to a multiple of ``multiple_of`` (Llama's rule; 11,008 for d_ff =
        4 · 4,096)."""
        _check_positive_ints(d_ff=d_ff, multiple_of=multiple_of)
        hidden = int(2 * d_ff / 3)
        return multiple_of * math.ceil(hidden / multiple_of)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))
