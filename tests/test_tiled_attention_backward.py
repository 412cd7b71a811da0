"""FlashAttention-2's backward written out (tiled_attention_backward) equals autograd through explicit attention
in float64, and keeps tile-sized score tensors only."""

import math

import pytest
import torch

from gpuformer_lib import tiled_attention as ta


def explicit(q, k, v, is_causal=False, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.transpose(-2, -1) * scale
    if is_causal:
        t_q, t_k = s.shape[-2:]
        s = s.masked_fill(torch.ones(t_q, t_k, dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1) @ v


@pytest.mark.parametrize("t_q, t_k, block_q, block_k, causal", [
    (37, 37, 8, 16, False), (37, 37, 16, 8, True), (64, 64, 64, 64, True), (20, 45, 7, 9, False), (5, 5, 1, 1, True),
])
def test_gradients_equal_autograd_in_float64(t_q, t_k, block_q, block_k, causal):
    g = torch.Generator().manual_seed(t_q * 100 + t_k)
    q = torch.randn(2, 3, t_q, 16, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(2, 3, t_k, 16, dtype=torch.float64, generator=g, requires_grad=True)
    v = torch.randn(2, 3, t_k, 12, dtype=torch.float64, generator=g, requires_grad=True)
    grad = torch.randn(2, 3, t_q, 12, dtype=torch.float64, generator=g)
    explicit(q, k, v, causal).backward(grad)
    want = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    out = ta.TiledAttentionFunction.apply(q, k, v, block_q, block_k, causal, None)
    assert torch.allclose(out, explicit(q, k, v, causal), atol=1e-12)
    out.backward(grad)
    for name, got, ref in zip("qkv", (q.grad, k.grad, v.grad), want):
        assert torch.allclose(got, ref, atol=1e-10, rtol=1e-10), f"d{name} differs by {(got - ref).abs().max():.2e}"


def test_the_log_sum_exp_is_the_softmax_normaliser():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 19, 8, dtype=torch.float64, generator=g) for _ in range(3))
    _, lse = ta.tiled_attention(q, k, v, block_q=4, block_k=5, return_lse=True)
    scores = q @ k.transpose(-2, -1) / math.sqrt(8)
    assert torch.allclose(lse, scores.logsumexp(-1), atol=1e-12)


def test_float32_gradients_are_close_to_float64():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 50, 16, dtype=torch.float64, generator=g) for _ in range(3))
    grad = torch.randn(2, 50, 16, dtype=torch.float64, generator=g)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    explicit(*leaves, is_causal=True).backward(grad)
    out, lse = ta.tiled_attention(*(t.float() for t in (q, k, v)), block_q=16, block_k=16, is_causal=True,
                                  return_lse=True)
    grads = ta.tiled_attention_backward(*(t.float() for t in (q, k, v)), out, lse, grad.float(), block_q=16,
                                        block_k=16, is_causal=True)
    for got, leaf in zip(grads, leaves):
        assert got.dtype == torch.float32 and torch.allclose(got.double(), leaf.grad, atol=1e-4, rtol=1e-4)


def test_no_tensor_the_size_of_the_scores_is_kept_or_made():
    """The backward's largest tensor is a tile (or an input's size), never the (T, T) scores: a wrong
    backward that rebuilds the whole probability matrix would hold T * T elements at once."""
    t, hs, block = 256, 16, 32
    g = torch.Generator().manual_seed(3)
    q, k, v, dout = (torch.randn(1, t, hs, generator=g) for _ in range(4))
    out, lse = ta.tiled_attention(q, k, v, block_q=block, block_k=block, return_lse=True)
    largest = []

    class Largest(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            for r in (result if isinstance(result, (tuple, list)) else (result,)):
                if isinstance(r, torch.Tensor):
                    largest.append(r.numel())
            return result

    with Largest():
        ta.tiled_attention_backward(q, k, v, out, lse, dout, block_q=block, block_k=block)
    assert max(largest) <= max(t * hs, block * block) < t * t


def test_mismatched_saved_tensors_are_refused():
    q = k = v = torch.randn(1, 8, 4)
    out, lse = ta.tiled_attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match="forward's output"):
        ta.tiled_attention_backward(q, k, v, out, lse[..., :4], out)
