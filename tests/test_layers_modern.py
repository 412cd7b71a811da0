"""RMSNorm and SwiGLU, the layers models since Llama use, against PyTorch and the formulas written out."""

import math

import pytest
import torch
import torch.nn.functional as F

from gpuformer_lib.layers import RMSNorm, SwiGLU


def test_rmsnorm_equals_torch_and_the_formula():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 16, dtype=torch.float64, generator=g) * 4 + 2
    ours = RMSNorm(16, eps=1e-6).double()
    with torch.no_grad():
        ours.weight.copy_(torch.rand(16, generator=g, dtype=torch.float64) + 0.5)
    theirs = torch.nn.RMSNorm(16, eps=1e-6).double()
    theirs.load_state_dict(ours.state_dict())
    assert torch.allclose(ours(x), theirs(x), atol=1e-12)
    by_hand = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-6) * ours.weight
    assert torch.allclose(ours(x), by_hand, atol=1e-12)
    # not LayerNorm: the mean is not subtracted, so a shifted row gives a different output
    assert not torch.allclose(ours(x), ours(x - x.mean(-1, keepdim=True)), atol=1e-3)


def test_rmsnorm_has_half_layernorms_parameters_and_keeps_the_dtype():
    assert sum(p.numel() for p in RMSNorm(64).parameters()) == 64
    assert sum(p.numel() for p in torch.nn.LayerNorm(64).parameters()) == 128
    x = torch.randn(2, 8, 64).bfloat16()
    out = RMSNorm(64)(x)
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), RMSNorm(64)(x.float()), atol=1e-2)


@pytest.mark.parametrize("bad", [0, -3, 2.5])
def test_rmsnorm_refuses_a_bad_width(bad):
    with pytest.raises(ValueError):
        RMSNorm(bad)


def test_rmsnorm_refuses_the_wrong_width_of_input():
    with pytest.raises(ValueError, match=r"\(\.\.\., 8\)"):
        RMSNorm(8)(torch.randn(2, 4))


def test_swiglu_equals_the_formula_and_its_gradient_is_autograds():
    torch.manual_seed(0)
    block = SwiGLU(16, 24).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    a, b = x @ block.w1.weight.T, x @ block.w3.weight.T
    by_hand = (a * torch.sigmoid(a) * b) @ block.w2.weight.T
    assert torch.allclose(block(x), by_hand, atol=1e-12)
    assert torch.autograd.gradcheck(block, (x,))
    assert torch.allclose(F.silu(a), a * torch.sigmoid(a))


def test_swiglu_at_the_matching_width_has_about_the_parameters_of_the_plain_block():
    c, f = 4096, 4 * 4096
    hidden = SwiGLU.matching_width(f)
    # Llama-2-7B's intermediate_size, as configured e.g. in microsoft/Olive examples/llm/config.py
    assert hidden == 11008
    swiglu = 3 * c * hidden
    plain = 2 * c * f
    assert abs(swiglu / plain - 1) < 0.01
    assert SwiGLU.matching_width(300, multiple_of=1) == 200
    assert sum(p.numel() for p in SwiGLU(8, 12).parameters()) == 3 * 8 * 12
