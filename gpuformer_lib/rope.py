"""Rotary position embedding (RoPE): positions as rotations of query and key vectors.

Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding" (arXiv:2104.09864), eq. 34:
split a head's vector x (size hs, even) into hs/2 pairs (x_{2i}, x_{2i+1}) and rotate pair i of the
token at position m by the angle m * theta_i, with theta_i = base^(-2i/hs) (base 10000, the
geometric frequencies of the paper's sinusoids):

    (x_{2i}, x_{2i+1}) -> (x_{2i} cos(m theta_i) - x_{2i+1} sin(m theta_i),
                           x_{2i} sin(m theta_i) + x_{2i+1} cos(m theta_i))

Read as complex numbers z_i = x_{2i} + i x_{2i+1}, that is z_i * exp(i m theta_i)
(:func:`apply_rope_complex`, the float64 reference). Rotations preserve length, and the dot product of
a query rotated to position m with a key rotated to position n is Re(sum_i q_i conj(k_i)
exp(i (m - n) theta_i)): it depends on the positions only through m - n. That is why RoPE is a
*relative* encoding, applied to q and k inside attention (not added to the embeddings), and never to v.

Pairs are adjacent elements (2i, 2i+1), as in the paper; GPT-NeoX and Llama's Hugging Face code pair
element i with i + hs/2 instead ("rotate half"), which is the same rotation on a permuted vector.

Leaves out: caching the cos/sin tables across calls, scaling tricks for longer contexts (position
interpolation, NTK/YaRN), partial rotary (rotating only some dimensions), and attention layers that use it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _check_head_size(head_size: int) -> None:
    if isinstance(head_size, bool) or not isinstance(head_size, int) or head_size < 2 or head_size % 2:
        raise ValueError(f"RoPE rotates pairs of dimensions: the head size must be an even int >= 2, got {head_size!r}")


def _check_base(base: float) -> None:
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 1 or not math.isfinite(base):
        raise ValueError(f"base must be a finite number > 1 (the paper's is 10000), got {base!r}")


def rope_frequencies(head_size: int, base: float = 10000.0, dtype: torch.dtype = torch.float32,
                     device: torch.device | str | None = None) -> Tensor:
    """theta_i = base^(-2i / head_size) for i = 0 .. head_size/2 - 1: shape (head_size / 2,)."""
    _check_head_size(head_size)
    _check_base(base)
    two_i = torch.arange(0, head_size, 2, dtype=torch.float64, device=device)
    return (base ** (-two_i / head_size)).to(dtype)


def rope_angles(positions: Tensor, head_size: int, base: float = 10000.0) -> Tensor:
    """m * theta_i for each position m: (T,) -> (T, head_size / 2), in float64 (angles of thousands of
    radians lose their low digits in float32 before the cos and sin are taken)."""
    if not isinstance(positions, Tensor) or positions.dim() != 1:
        raise ValueError(f"positions must be a 1-D tensor of token positions, got {positions!r}")
    theta = rope_frequencies(head_size, base, torch.float64, positions.device)
    return positions.to(torch.float64)[:, None] * theta[None, :]  # (T, 1) * (1, hs/2) -> (T, hs/2)


def _positions(x: Tensor, positions: Tensor | None) -> Tensor:
    if not isinstance(x, Tensor) or x.dim() < 2:
        raise ValueError(f"x must be a tensor (..., T, head_size), got {getattr(x, 'shape', x)!r}")
    T = x.shape[-2]
    if positions is None:
        return torch.arange(T, device=x.device)
    if not isinstance(positions, Tensor) or positions.shape != (T,):
        raise ValueError(f"positions must be a ({T},) tensor, one position per token, got "
                         f"{getattr(positions, 'shape', positions)!r}")
    return positions


def apply_rope(x: Tensor, positions: Tensor | None = None, base: float = 10000.0) -> Tensor:
    """Rotate each adjacent pair of ``x`` (..., T, head_size) by its token's angle; the same dtype out.

    ``positions`` (T,) defaults to 0 .. T-1; pass ``arange(start, start + T)`` for tokens that continue a
    sequence (decoding with a cache). Works on (B, H, T, hs) queries and keys as they leave the head split.
    """
    positions = _positions(x, positions)
    hs = x.shape[-1]
    angles = rope_angles(positions, hs, base)  # (T, hs/2), float64
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    pairs = x.unflatten(-1, (hs // 2, 2))  # (..., T, hs) -> (..., T, hs/2, 2)
    even, odd = pairs[..., 0], pairs[..., 1]  # (..., T, hs/2) each
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)  # (..., T, hs/2, 2)
    return rotated.flatten(-2)  # (..., T, hs)


def apply_rope_complex(x: Tensor, positions: Tensor | None = None, base: float = 10000.0) -> Tensor:
    """The reference: pairs as complex numbers z_i, multiplied by exp(i m theta_i), in float64."""
    positions = _positions(x, positions)
    hs = x.shape[-1]
    _check_head_size(hs)
    z = torch.view_as_complex(x.to(torch.float64).unflatten(-1, (hs // 2, 2)).contiguous())  # (..., T, hs/2)
    angles = rope_angles(positions, hs, base)  # (T, hs/2), float64
    rotation = torch.polar(torch.ones_like(angles), angles)  # exp(i m theta_i), complex128
    return torch.view_as_real(z * rotation).flatten(-2)  # (..., T, hs), float64


def rope_score_by_offset(q: Tensor, k: Tensor, max_len: int, base: float = 10000.0) -> Tensor:
    """The score of one query vector placed at every position m against one key vector at every
    position n: a (max_len, max_len) matrix whose entry (m, n) is rope(q, m) . rope(k, n). RoPE makes it
    constant along each diagonal (it depends on m - n only)."""
    if q.dim() != 1 or q.shape != k.shape:
        raise ValueError(f"q and k must be two vectors of the same head size, got {tuple(q.shape)} and {tuple(k.shape)}")
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be an int >= 1, got {max_len!r}")
    qs = apply_rope(q.expand(max_len, -1), base=base)  # (T, hs): q at every position
    ks = apply_rope(k.expand(max_len, -1), base=base)  # (T, hs)
    return qs @ ks.T  # (T, hs) x (hs, T) -> (T, T)
