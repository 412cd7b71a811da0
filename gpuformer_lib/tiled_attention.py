"""The online softmax and FlashAttention's tiling, forward pass, written out in PyTorch.

Attention as written, softmax(Q Kᵀ / sqrt(d)) V, builds the (T_q, T_k) matrix of scores, then the
matrix of probabilities, and keeps the probabilities for the backward pass: O(T²) memory per head.
FlashAttention (Dao et al., 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with
IO-Awareness"; Dao, 2023, "FlashAttention-2: Faster Attention with Better Parallelism and Work
Partitioning") computes the same numbers one tile of keys at a time and never holds the whole matrix.
What makes that possible is the **online softmax** (Milakov and Gimelshein, 2018, "Online normalizer
calculation for softmax"): a softmax's normaliser can be accumulated block by block if the running sum
is rescaled whenever the running maximum grows,

    m_new = max(m, max_j x_j)                                  (running maximum)
    l_new = l · exp(m − m_new) + Σ_j exp(x_j − m_new)          (rescaled running sum)

and attention's output can be accumulated the same way (FlashAttention-2, Algorithm 1):

    acc_new = acc · exp(m − m_new) + exp(S_block − m_new) · V_block,    output = acc / l.

This module has:

- :func:`online_softmax_update` (the two lines above), :func:`online_softmax` (a softmax that reads its
  input one block of columns at a time);
- :func:`tiled_attention`: attention over query tiles and key tiles, with the running max, sum and
  output accumulator kept in float32 (float64 for float64 inputs); with ``is_causal`` it skips the tiles above the diagonal;
- :func:`minimal_attention`: the explicit computation with nothing added (a precomputed boolean mask, no
  input checks, no guard for fully masked rows), the like-for-like baseline for timing fused kernels;
- :class:`PeakTensorBytes` / :func:`peak_bytes`: the peak of the bytes held by tensors created while a
  function runs, measured on any device (a ``TorchDispatchMode`` that watches every tensor an operation
  returns until it is freed); on a CUDA GPU :func:`peak_bytes` asks the allocator instead;
- the course's predictions: :func:`attention_flops`, :func:`explicit_attention_bytes`,
  :func:`tiled_attention_bytes`, and predicted times for a GPU by the course's predictor
  (:func:`explicit_attention_seconds`, :func:`fused_attention_seconds`, with :func:`fused_attention_bytes`:
  K and V re-read per query tile).

- :func:`tiled_attention_backward` and :class:`TiledAttentionFunction`: FlashAttention-2's backward, which
  recomputes each tile's probabilities from the saved log-sum-exp instead of storing the T² of them, checked
  against autograd (``tests/test_tiled_attention_backward.py``);

Leaves out: dropout, arbitrary masks (only causal or none), and speed: the loops run in
Python, one small matrix product per tile, so on a GPU this is slower than PyTorch's fused kernels, which
do the same work inside one kernel with the tiles held in on-chip memory (Triton's tutorial 06 writes
such a kernel).
"""

from __future__ import annotations

import math
import weakref
from typing import Callable

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


# --------------------------------------------------------------------------- the online softmax


def _check_block(block_size: int, name: str = "block_size") -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"{name} must be an int >= 1, got {block_size!r}")


def online_softmax_update(m: Tensor, l: Tensor, x_block: Tensor) -> tuple[Tensor, Tensor]:
    """One step of the online softmax: fold a block of columns ``x_block`` (..., n) into the running
    maximum ``m`` (...) and the running sum ``l`` (...) of exp(x − m). Start from m = −inf, l = 0.

    The old sum was taken relative to the old maximum; relative to the new one each of its terms is
    smaller by exp(m − m_new), so the sum is rescaled by that factor before the block's terms are added.
    A row whose entries so far are all −inf (fully masked) keeps m = −inf and l = 0 (no NaN)."""
    m_new = torch.maximum(m, x_block.amax(dim=-1))
    # subtract a finite number: where every entry so far is -inf, exp(-inf - (-inf)) would be NaN
    base = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
    l_new = l * torch.exp(m - base) + torch.exp(x_block - base.unsqueeze(-1)).sum(dim=-1)
    return m_new, l_new


def online_softmax(x: Tensor, block_size: int = 64) -> Tensor:
    """Softmax over the last dimension, reading ``x`` one block of ``block_size`` columns at a time to
    find each row's maximum and normaliser (one pass), then normalising (a second pass). Equals
    ``torch.softmax(x, -1)``; a row of only −inf gets zeros (``torch.softmax`` gives NaN there)."""
    _check_block(block_size)
    if not x.is_floating_point() or x.dim() < 1:
        raise ValueError(f"x must be a floating-point tensor with at least one dimension, got {x.dtype} {tuple(x.shape)}")
    work = torch.float64 if x.dtype == torch.float64 else torch.float32  # 16-bit inputs: accumulate in float32
    xf = x.to(work)
    m = torch.full(xf.shape[:-1], float("-inf"), device=x.device, dtype=work)
    l = torch.zeros(xf.shape[:-1], device=x.device, dtype=work)
    for start in range(0, xf.shape[-1], block_size):
        m, l = online_softmax_update(m, l, xf[..., start:start + block_size])
    base = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    p = torch.exp(xf - base.unsqueeze(-1)) / l.clamp_min(torch.finfo(work).tiny).unsqueeze(-1)
    return p.to(x.dtype)


# --------------------------------------------------------------------------- attention, tiled and minimal


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or not t.is_floating_point() or t.dim() < 2:
            raise ValueError(f"{name} must be a floating-point tensor of shape (..., T, hs)")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2] or not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)} {k.dtype}, v {tuple(v.shape)} {v.dtype}: "
                         "q and k need one head size, k and v one number of keys, all three one dtype")


def tiled_attention(q: Tensor, k: Tensor, v: Tensor, *, block_q: int = 64, block_k: int = 64,
                    is_causal: bool = False, scale: float | None = None,
                    return_lse: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """softmax(q kᵀ · scale) v computed one (block_q, block_k) tile of scores at a time (forward only).

    q: (..., Tq, hs), k: (..., Tk, hs), v: (..., Tk, hv) -> (..., Tq, hv), in q's dtype. For each tile of
    queries the running maximum ``m``, running sum ``l`` and output accumulator ``acc`` (float32) are
    updated tile of keys by tile of keys (FlashAttention-2, Algorithm 1); the largest score tensor alive is
    one (..., block_q, block_k) tile. ``is_causal`` masks key j > query i (top-left aligned, as
    ``F.scaled_dot_product_attention``) and skips key tiles that lie wholly above the diagonal.

    ``return_lse`` also returns the log-sum-exp of each query's scores, ``m + log(l)`` (..., Tq), in the working
    precision: all that the backward pass (:func:`tiled_attention_backward`) keeps of the softmax."""
    _check_qkv(q, k, v)
    _check_block(block_q, "block_q")
    _check_block(block_k, "block_k")
    t_q, t_k = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    work = torch.float64 if q.dtype == torch.float64 else torch.float32  # 16-bit inputs: accumulate in float32
    out = torch.empty(*lead, t_q, v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.empty(*lead, t_q, dtype=work, device=q.device)
    for i0 in range(0, t_q, block_q):
        i1 = min(i0 + block_q, t_q)
        q_tile = q[..., i0:i1, :].to(work) * scale  # (..., bq, hs)
        m = torch.full((*lead, i1 - i0), float("-inf"), device=q.device, dtype=work)  # running max per query
        l = torch.zeros((*lead, i1 - i0), device=q.device, dtype=work)  # running sum of exp(s - m)
        acc = torch.zeros((*lead, i1 - i0, v.shape[-1]), device=q.device, dtype=work)  # running sum of exp(s - m) v
        last_key = t_k if not is_causal else min(t_k, i1)  # causal: keys j <= i only; later tiles are all masked
        for j0 in range(0, last_key, block_k):
            j1 = min(j0 + block_k, last_key)
            s = q_tile @ k[..., j0:j1, :].to(work).transpose(-2, -1)  # (..., bq, hs) x (..., hs, bk) -> (..., bq, bk)
            if is_causal and j1 - 1 > i0:  # this tile crosses the diagonal
                rows = torch.arange(i0, i1, device=q.device)[:, None]
                cols = torch.arange(j0, j1, device=q.device)[None, :]
                s = s.masked_fill(cols > rows, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            base = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
            alpha = torch.exp(m - base)  # how much the old sums shrink against the new maximum
            p = torch.exp(s - base.unsqueeze(-1))  # (..., bq, bk) unnormalised probabilities of this tile
            l = l * alpha + p.sum(dim=-1)
            acc = acc * alpha.unsqueeze(-1) + p @ v[..., j0:j1, :].to(work)  # (..., bq, bk) x (..., bk, hv)
            m = m_new
        out[..., i0:i1, :] = (acc / l.clamp_min(torch.finfo(work).tiny).unsqueeze(-1)).to(q.dtype)
        lse[..., i0:i1] = m + torch.log(l)
    return (out, lse) if return_lse else out


def tiled_attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, grad_out: Tensor, *,
                             block_q: int = 64, block_k: int = 64, is_causal: bool = False,
                             scale: float | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients (dq, dk, dv) of :func:`tiled_attention`, one tile of scores at a time, from what the
    forward kept: its output and the log-sum-exp ``lse`` (``return_lse=True``), not the (Tq, Tk) probabilities.

    FlashAttention-2's backward (Algorithm 2) in PyTorch. With S = q kᵀ · scale, P = softmax(S), O = P v and
    the incoming gradient dO, the chain rule gives

        dv = Pᵀ dO,    dP = dO vᵀ,    dS = P ∘ (dP − D),  D_i = Σ_j P_ij dP_ij = Σ_c dO_ic O_ic,
        dq = dS k · scale,    dk = dSᵀ q · scale.

    D is one number per query, computed once from dO and O (the second form), so that each tile needs only
    its own P, **recomputed** from the tile's scores and the saved log-sum-exp, P = exp(S − lse): the
    backward does the forward's score product again instead of storing the T² probabilities. The largest
    score-sized tensor alive is one (..., block_q, block_k) tile. ``is_causal`` skips the tiles above the
    diagonal, as the forward does. Accumulates in float32 (float64 for float64 inputs); returns q's dtype."""
    _check_qkv(q, k, v)
    _check_block(block_q, "block_q")
    _check_block(block_k, "block_k")
    t_q, t_k = q.shape[-2], k.shape[-2]
    if out.shape[-2:] != (t_q, v.shape[-1]) or grad_out.shape != out.shape or lse.shape != out.shape[:-1]:
        raise ValueError(f"out {tuple(out.shape)}, grad_out {tuple(grad_out.shape)} and lse {tuple(lse.shape)} "
                         f"must be the forward's output (..., {t_q}, {v.shape[-1]}), its gradient, and (..., {t_q})")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    qw, kw, vw, dout = (t.to(work) for t in (q, k, v, grad_out))
    lse = lse.to(work)
    d = (dout * out.to(work)).sum(dim=-1)  # (..., Tq): D_i, one number per query
    dq = torch.zeros(qw.shape, dtype=work, device=q.device)
    dk = torch.zeros(torch.broadcast_shapes(kw.shape, (*dq.shape[:-2], *kw.shape[-2:])), dtype=work, device=q.device)
    dv = torch.zeros(torch.broadcast_shapes(vw.shape, (*dq.shape[:-2], *vw.shape[-2:])), dtype=work, device=q.device)
    for i0 in range(0, t_q, block_q):
        i1 = min(i0 + block_q, t_q)
        last_key = t_k if not is_causal else min(t_k, i1)
        for j0 in range(0, last_key, block_k):
            j1 = min(j0 + block_k, last_key)
            s = (qw[..., i0:i1, :] * scale) @ kw[..., j0:j1, :].transpose(-2, -1)  # (..., bq, bk), recomputed
            if is_causal and j1 - 1 > i0:
                rows = torch.arange(i0, i1, device=q.device)[:, None]
                cols = torch.arange(j0, j1, device=q.device)[None, :]
                s = s.masked_fill(cols > rows, float("-inf"))
            p = torch.exp(s - lse[..., i0:i1, None])  # the tile's probabilities, from the saved log-sum-exp
            dv[..., j0:j1, :] += p.transpose(-2, -1) @ dout[..., i0:i1, :]
            dp = dout[..., i0:i1, :] @ vw[..., j0:j1, :].transpose(-2, -1)  # (..., bq, bk)
            ds = p * (dp - d[..., i0:i1, None])
            dq[..., i0:i1, :] += (ds @ kw[..., j0:j1, :]) * scale
            dk[..., j0:j1, :] += (ds.transpose(-2, -1) @ qw[..., i0:i1, :]) * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class TiledAttentionFunction(torch.autograd.Function):
    """:func:`tiled_attention` as an autograd function whose backward is :func:`tiled_attention_backward`: it
    saves q, k, v, the output and the log-sum-exp (O(T) per head beyond the inputs), never the probabilities.
    ``TiledAttentionFunction.apply(q, k, v, block_q, block_k, is_causal, scale)``; k and v must have q's
    leading shape (no broadcasting)."""

    @staticmethod
    def forward(ctx, q, k, v, block_q=64, block_k=64, is_causal=False, scale=None):
        if not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
            raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: one leading shape")
        out, lse = tiled_attention(q, k, v, block_q=block_q, block_k=block_k, is_causal=is_causal, scale=scale,
                                   return_lse=True)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.settings = dict(block_q=block_q, block_k=block_k, is_causal=is_causal, scale=scale)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = tiled_attention_backward(q, k, v, out, lse, grad_out.contiguous(), **ctx.settings)
        return dq, dk, dv, None, None, None, None


def minimal_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                      scale: float | None = None) -> Tensor:
    """The explicit computation and nothing more: scores, a precomputed boolean ``mask`` (True = may
    attend) filled with −inf, softmax, product with v. No input checks and no guard for a query whose every
    key is masked (it gets NaN): the baseline a fused kernel should be timed against."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q * scale) @ k.transpose(-2, -1)  # (..., Tq, hs) x (..., hs, Tk) -> (..., Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1) @ v  # (..., Tq, Tk) x (..., Tk, hv) -> (..., Tq, hv)


# --------------------------------------------------------------------------- measuring memory on any device


class PeakTensorBytes(TorchDispatchMode):
    """Inside ``with PeakTensorBytes() as peak:``, watches every tensor an operation returns and keeps
    ``peak.peak`` (most bytes alive at once) and ``peak.current`` (bytes still alive), counting each
    storage once (a view and its base are one allocation). Tensors made before the block are not counted,
    nor buffers a kernel allocates for itself (a fused kernel's workspace), nor the allocator's cache:
    what is counted is what the program holds. Works on every device; on a CUDA GPU
    ``torch.cuda.max_memory_allocated`` also sees the workspaces (:func:`peak_bytes` uses it there)."""

    def __init__(self):
        super().__init__()
        self.current = 0
        self.peak = 0
        self._bytes: dict[tuple[str, int], int] = {}
        self._refs: dict[tuple[str, int], int] = {}

    def _release(self, key: tuple[str, int]) -> None:
        self._refs[key] -= 1
        if self._refs[key] == 0:
            self.current -= self._bytes.pop(key)
            del self._refs[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {(str(t.device), t.untyped_storage().data_ptr())
                  for t in tree_flatten((args, kwargs))[0] if isinstance(t, Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, Tensor):
                storage = t.untyped_storage()
                key = (str(t.device), storage.data_ptr())
                if key not in self._bytes and key in inputs:
                    continue  # a view of a tensor made before the block: no new allocation
                if key not in self._bytes:
                    self._bytes[key] = storage.nbytes()
                    self._refs[key] = 0
                    self.current += storage.nbytes()
                    self.peak = max(self.peak, self.current)
                self._refs[key] += 1
                weakref.finalize(t, self._release, key)
        return out


def peak_bytes(fn: Callable[[], object], device: torch.device | str = "cpu") -> int:
    """Most bytes held at once by tensors created while ``fn()`` runs (its result is dropped at the end).

    On a CUDA GPU: the allocator's peak above what was allocated before (workspaces included); elsewhere
    (a CPU, or a GPU profile rehearsed on one): :class:`PeakTensorBytes`."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        from gpuformer_lib.memory import measure_peak_memory

        return measure_peak_memory(fn, device)
    with PeakTensorBytes() as tracker:
        fn()
    return tracker.peak


# --------------------------------------------------------------------------- the course's predictions


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _check_sizes(**sizes: int) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def attention_flops(batch: int, heads: int, t_query: int, t_key: int, head_size: int, *,
                    causal: bool = False) -> int:
    """FLOPs of attention's two matrix products, forward: 2·Tq·Tk·hs for Q Kᵀ and as many for P V, so
    4·Tq·Tk·hs per head and sequence. ``causal`` counts only the pairs a causal mask allows
    (Tq·(Tq+1)/2 when Tq = Tk): what a kernel that skips masked tiles needs at least; the explicit
    computation does all Tq·Tk. The softmax's few FLOPs per score are left out (they run on CUDA cores)."""
    _check_sizes(batch=batch, heads=heads, t_query=t_query, t_key=t_key, head_size=head_size)
    pairs = t_query * t_key
    if causal:
        pairs = sum(min(i + 1, t_key) for i in range(t_query))
    return 4 * batch * heads * pairs * head_size


def explicit_attention_bytes(batch: int, heads: int, t: int, dtype: torch.dtype, *, backward: bool = False) -> int:
    """Predicted peak bytes of the (B, H, T, T) matrices that explicit attention holds at once.

    Forward: the softmax reads the scores and writes the probabilities, so two such matrices are alive
    together: 2·B·H·T²·itemsize. Forward and backward: the probabilities are kept for the backward
    pass, which then makes the gradient of the probabilities and from both the gradient of the scores:
    three at once. Leaves out q, k, v, the output and a mask (T·hs or T² bytes, not B·H·T²)."""
    _check_sizes(batch=batch, heads=heads, t=t)
    return (3 if backward else 2) * batch * heads * t * t * _itemsize(dtype)


def tiled_attention_bytes(batch: int, heads: int, t: int, head_size: int, *, block_q: int = 64,
                          block_k: int = 64) -> int:
    """Predicted peak bytes of :func:`tiled_attention` beyond its inputs, float32 accumulators: the output
    (B·H·T·hs in q's dtype, counted at 4 bytes), and per tile of queries the accumulator, the running max
    and sum, and a few (block_q, block_k) tiles (scores, probabilities, a mask). Linear in T."""
    _check_sizes(batch=batch, heads=heads, t=t, head_size=head_size, block_q=block_q, block_k=block_k)
    bq, bk = min(block_q, t), min(block_k, t)
    per_tile = bq * head_size * 3 + bq * 4 + bq * bk * 3 + bk * head_size * 2
    return 4 * batch * heads * (t * head_size + per_tile)


def _kernel_seconds(flops: float, nbytes: float, rate: float, bandwidth: float) -> float:
    return max(flops / rate, nbytes / bandwidth)


def explicit_attention_seconds(gpu: str, batch: int, heads: int, t: int, head_size: int,
                               dtype: torch.dtype) -> float:
    """Predicted time of explicit attention's forward on ``gpu`` (a datasheet name), by the course's predictor
    (``gpuformer_lib.predict``): three kernels, each max(FLOPs / the rate it achieves, bytes / the bandwidth a
    copy achieves) — Q Kᵀ (tensor cores; writes the B·H·T² scores), the softmax (CUDA cores, ~5 FLOPs a
    score; reads the scores, writes the probabilities) and P V (tensor cores; reads the probabilities).
    The T² matrices cross memory four times."""
    from gpuformer_lib import predict

    _check_sizes(batch=batch, heads=heads, t=t, head_size=head_size)
    size = _itemsize(dtype)
    rate, vector = predict.achievable_rate(gpu, predict.format_of(dtype))[0], predict.achievable_rate(gpu, "fp32")[0]
    bandwidth = predict.achievable_bandwidth(gpu)[0]
    scores = batch * heads * t * t * size
    operand = batch * heads * t * head_size * size
    matmul = 2 * batch * heads * t * t * head_size
    return (_kernel_seconds(matmul, 2 * operand + scores, rate, bandwidth)
            + _kernel_seconds(5 * batch * heads * t * t, 2 * scores, vector, bandwidth)
            + _kernel_seconds(matmul, scores + 2 * operand, rate, bandwidth))


def fused_attention_bytes(batch: int, heads: int, t: int, head_size: int, dtype: torch.dtype, *,
                          block_q: int = 128, l2_resident: bool = False) -> int:
    """Bytes a FlashAttention-style forward moves through HBM: Q read and the output written once, and K and V
    read once per tile of ``block_q`` queries (FlashAttention's Theorem 2: each query tile streams the whole
    of K and V, Θ(N² d² / M) accesses), i.e. ⌈T / block_q⌉ times. ``l2_resident``: one head's K and V stay in
    the GPU's L2 cache between query tiles, so HBM sees them once (an H100's 50 MB L2 holds a head's K and V of
    T = 4,096 at d = 64 in 16 bits, 1 MiB, many times over; whether they stay depends on how many heads run
    at once), the lower bound."""
    _check_sizes(batch=batch, heads=heads, t=t, head_size=head_size, block_q=block_q)
    one = batch * heads * t * head_size * _itemsize(dtype)
    passes = 1 if l2_resident else -(-t // block_q)
    return 2 * one + 2 * one * passes


def fused_attention_seconds(gpu: str, batch: int, heads: int, t: int, head_size: int, dtype: torch.dtype, *,
                            causal: bool = False, l2_resident: bool = True) -> float:
    """Predicted time of a fused (FlashAttention-style) forward on ``gpu`` by the course's predictor: the
    FLOPs of :func:`attention_flops` (``causal``: the masked tiles skipped) at the rate products achieve,
    against :func:`fused_attention_bytes` at the bandwidth a copy achieves; no T² matrix crosses memory.
    ``l2_resident`` (the default): the query tiles' re-reads of K and V are served by the L2 cache, which at
    this course's sizes holds the K and V of every head running at once (a few heads of 2·T·d 16-bit values,
    megabytes, against an L2 of 4 MB on a T4 and 50 MB on an H100), so HBM sees them once; False: Theorem
    2's re-read per query tile, the upper bound on the bytes. Real kernels reach less than the best product's
    rate (the FlashAttention-2 paper's abstract: FlashAttention reached 25-40 % of an A100's peak,
    FlashAttention-2 up to 73 %)."""
    from gpuformer_lib import predict

    _check_sizes(batch=batch, heads=heads, t=t, head_size=head_size)
    flops = attention_flops(batch, heads, t, t, head_size, causal=causal)
    nbytes = fused_attention_bytes(batch, heads, t, head_size, dtype, l2_resident=l2_resident)
    return _kernel_seconds(flops, nbytes, predict.achievable_rate(gpu, predict.format_of(dtype))[0],
                           predict.achievable_bandwidth(gpu)[0])


# --------------------------------------------------------------------------- which fused kernel PyTorch runs

_SDPA_NAMES = {
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "_scaled_dot_product_efficient_attention": "memory-efficient",
    "_scaled_dot_product_cudnn_attention": "cuDNN",
    "_scaled_dot_product_fused_attention_overrideable": "fused (device plug-in)",
    "_efficient_attention_forward": "memory-efficient",
    "_flash_attention_forward": "flash",
}


class _OpNames(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def sdpa_backend_used(q: Tensor, k: Tensor, v: Tensor, **kwargs) -> str:
    """The kernel ``F.scaled_dot_product_attention(q, k, v, **kwargs)`` ran on these inputs, as seen by
    the dispatcher: ``'flash'``, ``'memory-efficient'``, ``'cuDNN'``, ``'flash (CPU)'``, or ``'math'``
    (the explicit computation, when no fused kernel accepts the inputs)."""
    import torch.nn.functional as F

    with _OpNames() as ops:
        F.scaled_dot_product_attention(q, k, v, **kwargs)
    for name in ops.names:
        if name in _SDPA_NAMES:
            return _SDPA_NAMES[name]
    return "math"


def expected_sdpa_backend(compute_capability: tuple[int, int], dtype: torch.dtype, head_size: int, *,
                          arbitrary_mask: bool = False) -> str:
    """The fused kernel PyTorch's rules (``sdp_utils.cpp``) pick on a CUDA GPU, tried in the order flash,
    memory-efficient, math: flash needs sm_80+, float16/bfloat16, a head size up to 256 that is a
    multiple of 8, and no arbitrary ``attn_mask`` (``is_causal`` is fine); the memory-efficient kernel
    takes float32 and float16 everywhere, bfloat16 on sm_80+, and masks. So a T4 (sm_75) runs the
    memory-efficient kernel, an A100 or H100 FlashAttention-2. (cuDNN's kernel, where a PyTorch version
    prefers it on Hopper, is left out; ``sdpa_backend_used`` shows what actually ran.)"""
    _check_sizes(head_size=head_size)
    cc = tuple(compute_capability)
    aligned = head_size % 8 == 0
    if (cc >= (8, 0) and dtype in (torch.float16, torch.bfloat16) and head_size <= 256 and aligned
            and not arbitrary_mask):
        return "flash"
    if aligned and (dtype in (torch.float32, torch.float16) or (dtype == torch.bfloat16 and cc >= (8, 0))):
        return "memory-efficient"
    return "math"


_PROFILE_KERNEL_NAMES = {"flash": "flash", "flash (CPU)": "flash", "memory-efficient": "efficient",
                         "cuDNN": "cudnn", "math": "math", "fused (device plug-in)": "fused"}


def profile_kernel_name(backend: str) -> str:
    """The name a device profile's ``sdpa_kernels`` uses for a kernel :func:`sdpa_backend_used` reported
    (``'flash (CPU)'`` -> ``'flash'``, ``'memory-efficient'`` -> ``'efficient'``, ``'cuDNN'`` -> ``'cudnn'``)."""
    if backend not in _PROFILE_KERNEL_NAMES:
        raise ValueError(f"{backend!r} is not a kernel name sdpa_backend_used returns; "
                         f"one of {', '.join(_PROFILE_KERNEL_NAMES)}")
    return _PROFILE_KERNEL_NAMES[backend]


# --------------------------------------------------------------------------- growth against a model


def growth_against(ratios, model: float, *, digits: int = 2) -> tuple[float, float, float, str]:
    """How many times a time grew between two sizes, against the growth a ``model`` predicts (4 for T² when T
    doubles). ``ratios``: one growth per interleaved round (the larger size's time / the smaller's, both from
    the same round, e.g. a ``bench.Comparison``'s ``ratios`` with the larger size as baseline).

    Returns the median of the rounds' growths, the middle half of them (lower and upper quartile) and where
    ``model`` lies: ``"within"`` the middle half, or the growth is ``"below"`` or ``"above"`` it. All three
    numbers are rounded to ``digits`` decimals *before* the side is chosen, so the words never contradict the
    numbers a page prints (a review found "4.0-fold (3.9 to 4.0) ... below it"), and the median lies in the
    range by construction."""
    import statistics

    ratios = sorted(float(r) for r in ratios)
    if not ratios or not all(0 < r < math.inf for r in ratios):
        raise ValueError(f"growth ratios must be positive and finite, one per round, got {ratios}")
    if not 0 < model < math.inf:
        raise ValueError(f"the model's growth must be positive and finite, got {model}")
    low, high = ((ratios[0], ratios[0]) if len(ratios) < 2 else
                 statistics.quantiles(ratios, n=4, method="inclusive")[::2])
    growth, low, high = (round(x, digits) for x in (statistics.median(ratios), low, high))
    side = "within" if low <= model <= high else ("below" if high < model else "above")
    return growth, low, high, side
