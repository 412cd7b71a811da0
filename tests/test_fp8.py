"""FP8 from scratch (``gpuformer_lib.fp8``): rounding to E4M3 and E5M2 against PyTorch's casts, the
formats' constants against ``torch.finfo``, per-tensor scaling and the emulated FP8 product against a
float64 reference, and the FP8 peak against the registry."""

import pytest
import torch

from gpuformer_lib import fp8
from gpuformer_lib.published import figure


def _values(n=20000, seed=0):
    g = torch.Generator().manual_seed(seed)
    mags = 10 ** torch.empty(n, dtype=torch.float64).uniform_(-8, 6, generator=g)
    x = torch.randn(n, generator=g, dtype=torch.float64) * mags
    edges = torch.tensor([448.0, 460.0, 464.0, 500.0, 57344.0, 61439.0, 61440.0, 1e6, 2**-9, 2**-10, 2**-16,
                          2**-17, 0.0, -3.0, 1.0 + 2**-4, 1.0 + 3 * 2**-4], dtype=torch.float64)
    return torch.cat([x, edges, -edges]).float().double()  # float32 values: PyTorch's cast rounds once then


@pytest.mark.parametrize("fmt", fp8.FORMATS, ids=lambda f: f.name)
def test_rounding_matches_pytorchs_cast(fmt):
    x = _values()
    torch.testing.assert_close(fp8.round_to_format(x, fmt), fp8.cast(x, fmt), rtol=0, atol=0)


@pytest.mark.parametrize("fmt", fp8.FORMATS, ids=lambda f: f.name)
def test_constants_match_finfo(fmt):
    fi = torch.finfo(fmt.torch_dtype)
    assert fmt.max_value == fi.max and fmt.min_normal == fi.smallest_normal and fmt.eps == fi.eps
    assert fp8.round_to_format(torch.tensor([fmt.min_subnormal]), fmt).item() == fmt.min_subnormal
    assert fp8.round_to_format(torch.tensor([fmt.min_subnormal / 2]), fmt).item() == 0.0  # a tie goes to even 0


def test_overflow_e5m2_is_inf_and_e4m3_saturates():
    assert fp8.round_to_format(torch.tensor([1e6]), fp8.E5M2).item() == float("inf")
    assert fp8.round_to_format(torch.tensor([1e6]), fp8.E4M3).item() == 448.0
    assert fp8.E4M3.binades < fp8.E5M2.binades


@pytest.mark.parametrize("fmt", fp8.FORMATS, ids=lambda f: f.name)
def test_rounding_error_is_at_most_half_a_quantum_against_float64(fmt):
    x = torch.empty(5000, dtype=torch.float64).uniform_(fmt.min_normal, fmt.max_value / 2)
    rel = ((fp8.round_to_format(x, fmt) - x).abs() / x)
    assert float(rel.max()) <= fmt.eps / 2 + 1e-15


def test_per_tensor_scaling_rescues_small_tensors():
    g = torch.Generator().manual_seed(0)
    grads = torch.randn(4000, generator=g, dtype=torch.float64) * 1e-6
    for fmt in fp8.FORMATS:
        assert fp8.flushed_share(grads, fmt, scaling=False) > 0.9  # below the smallest subnormal
        assert fp8.flushed_share(grads, fmt, scaling=True) < 0.01
        q = fp8.scaled_quantize(grads, fmt)
        assert float(q.values.abs().max()) == fmt.max_value
        assert fp8.relative_error(q.dequantize(), grads) < fmt.eps


def test_fp8_matmul_against_float64():
    errors = fp8.matmul_errors(128, 256, 64)
    assert errors["float32"] < errors["bf16"] < errors["fp8 E4M3"] < errors["fp8 E5M2"] < 0.1
    g = torch.Generator().manual_seed(3)
    a = torch.randn(32, 64, generator=g, dtype=torch.float64)
    b = torch.randn(64, 16, generator=g, dtype=torch.float64)
    ref = a @ b
    # the emulation equals quantise -> exact product -> unscale, computed separately
    qa, qb = fp8.scaled_quantize(a, fp8.E4M3), fp8.scaled_quantize(b, fp8.E4M3)
    torch.testing.assert_close(fp8.fp8_matmul(a, b), (qa.values @ qb.values) / (qa.scale * qb.scale),
                               rtol=1e-6, atol=1e-9)
    assert fp8.relative_error(fp8.fp8_matmul(a, b), ref) < 0.06


def test_fp8_peak_is_the_registrys():
    assert fp8.FP8_DENSE_PEAK_TFLOPS["H100 SXM"] == figure("h100-sxm-fp8-dense-peak").value
    from gpuformer_lib import predict
    assert predict.datasheet_rate("H100 SXM", "fp8") == 1979e12  # the predictor reads the same table
    with pytest.raises(ValueError, match="FP8"):
        predict.datasheet_rate("T4", "fp8")
