"""FP8 from scratch: the two 8-bit formats of Hopper's tensor cores, rounding to them, per-tensor scaling,
and what an FP8 matrix product loses against float64.

Micikevicius et al. (2022), "FP8 Formats for Deep Learning" (arXiv:2209.05433) define two encodings:

- **E4M3** (4 exponent bits, bias 7, 3 mantissa bits): largest 448, smallest normal 2^-6, smallest
  subnormal 2^-9; no infinities (only NaN), so it trades range for precision. Used for weights and
  activations. PyTorch: ``torch.float8_e4m3fn`` ("fn": finite, NaN only).
- **E5M2** (5 exponent bits, bias 15, 2 mantissa bits): largest 57344, smallest subnormal 2^-16, with
  infinities like IEEE formats; more range, less precision. Used for gradients.

With only 3 or 2 mantissa bits and 18-32 binades of range, a tensor must be **scaled** into the format
before the cast: per-tensor scaling multiplies by ``s = format max / amax(|x|)`` (the paper's section 4.3;
torchao.float8's "tensorwise" recipe), and the product is divided by the two scales afterwards. The
tensor cores multiply FP8 inputs and accumulate in higher precision; :func:`fp8_matmul` emulates that on
any device (quantise, multiply in float32, unscale), which is how this module measures the error.

:func:`round_to_format` rounds float64 values to a format with round-to-nearest-even, written from the
bit layout, and is checked against PyTorch's casts in ``tests/test_fp8.py``.

Leaves out: delayed scaling (amax history), row-wise and block (MX) scaling, FP8 all-gathers, the speed
(FP8 tensor cores exist from compute capability 8.9/9.0; ``torch._scaled_mm`` calls them), and stochastic
rounding.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class Fp8Format:
    """An 8-bit floating-point encoding: 1 sign bit, ``exponent_bits``, ``mantissa_bits``."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max_value: float
    """The largest finite value."""
    has_inf: bool
    """E5M2 overflows to infinity; E4M3 (``fn``) has none and a cast saturates at ``max_value`` here."""
    torch_dtype: torch.dtype

    @property
    def min_normal(self) -> float:
        return 2.0 ** (1 - self.bias)

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (1 - self.bias - self.mantissa_bits)

    @property
    def eps(self) -> float:
        """Spacing just above 1: 2^-mantissa_bits."""
        return 2.0 ** -self.mantissa_bits

    @property
    def binades(self) -> float:
        """log2(max / smallest subnormal): the range in powers of two."""
        import math

        return math.log2(self.max_value / self.min_subnormal)


E4M3 = Fp8Format("E4M3", 4, 3, 7, 448.0, False, torch.float8_e4m3fn)
E5M2 = Fp8Format("E5M2", 5, 2, 15, 57344.0, True, torch.float8_e5m2)
FORMATS = (E4M3, E5M2)


def round_to_format(x: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """``x`` rounded to the nearest value of ``fmt`` (ties to even), returned in float64. Rounded once, from
    ``x`` itself: PyTorch's cast of a float64 tensor may go through float32 first (rounding twice), so
    tests compare the two on float32 inputs.

    A value in binade ``2^e <= |x| < 2^(e+1)`` (``e`` at least the smallest normal exponent, so that
    subnormals share the smallest normal's spacing) is a multiple of the quantum ``2^(e - mantissa_bits)``:
    divide, round half to even, multiply. A result beyond ``max_value`` is infinite in E5M2 and saturates
    at ``max_value`` in E4M3 (which has no infinity; scale a tensor into range before casting).
    """
    x = x.detach().to(torch.float64)
    a = x.abs()
    e_min = 1 - fmt.bias
    e = torch.floor(torch.log2(a.clamp(min=fmt.min_subnormal / 4))).clamp(min=e_min)
    quantum = torch.exp2(e - fmt.mantissa_bits)
    r = torch.round(a / quantum) * quantum  # torch.round is round-half-to-even
    if fmt.has_inf:  # rounded past the largest value (ties there go to the even 2^(e_max + 1)): overflow
        r = torch.where(r > fmt.max_value, torch.full_like(r, float("inf")), r)
    else:
        r = r.clamp(max=fmt.max_value)
    r = torch.where(torch.isinf(a), torch.full_like(r, float("inf") if fmt.has_inf else fmt.max_value), r)
    r = torch.where(torch.isnan(x), x, r)
    return torch.copysign(r, x)


def cast(x: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """PyTorch's cast to ``fmt``'s dtype and back to float64 (E4M3 clamped first: no infinity to overflow to)."""
    x = x.detach().to(torch.float64)
    if not fmt.has_inf:
        x = x.clamp(-fmt.max_value, fmt.max_value)
    return x.to(torch.float32).to(fmt.torch_dtype).to(torch.float64)


@dataclasses.dataclass(frozen=True)
class Scaled:
    """A tensor quantised with one scale: ``values / scale`` approximates the original."""

    values: torch.Tensor
    """The FP8 values (float64, each representable in the format)."""
    scale: float
    fmt: Fp8Format

    def dequantize(self) -> torch.Tensor:
        return self.values / self.scale


def scaled_quantize(x: torch.Tensor, fmt: Fp8Format, *, scaling: bool = True) -> Scaled:
    """Per-tensor scaling: multiply by ``fmt.max_value / amax(|x|)`` so the largest element lands on the
    format's largest value, round to the format, keep the scale. ``scaling=False`` casts as is (scale 1)."""
    x = x.detach().to(torch.float64)
    amax = float(x.abs().max()) if x.numel() else 0.0
    scale = fmt.max_value / amax if scaling and amax > 0 else 1.0
    return Scaled(round_to_format(x * scale, fmt), scale, fmt)


def relative_error(approx: torch.Tensor, reference: torch.Tensor) -> float:
    """``||approx - reference|| / ||reference||`` in float64 (Frobenius norms)."""
    ref = reference.detach().to(torch.float64)
    return float((approx.detach().to(torch.float64) - ref).norm() / ref.norm())


def flushed_share(x: torch.Tensor, fmt: Fp8Format, *, scaling: bool) -> float:
    """Share of the non-zero elements of ``x`` that become zero when quantised to ``fmt``."""
    q = scaled_quantize(x, fmt, scaling=scaling).values
    nonzero = x != 0
    return float(((q == 0) & nonzero).sum() / nonzero.sum())


def fp8_matmul(a: torch.Tensor, b: torch.Tensor, fmt_a: Fp8Format = E4M3, fmt_b: Fp8Format = E4M3) -> torch.Tensor:
    """``a @ b`` as an FP8 tensor-core product computes it, emulated: each operand scaled per tensor and
    rounded to its format, multiplied with float32 accumulation, divided by both scales."""
    qa, qb = scaled_quantize(a, fmt_a), scaled_quantize(b, fmt_b)
    out = qa.values.to(torch.float32) @ qb.values.to(torch.float32)  # FP8 values are exact in float32
    return out.to(torch.float64) / (qa.scale * qb.scale)


def matmul_errors(m: int, k: int, n: int, *, seed: int = 0) -> dict[str, float]:
    """Relative error of an (m, k) x (k, n) product of random normal matrices against float64, for
    float32, bf16 inputs (float32 accumulation), FP8 E4M3 x E4M3 and E5M2 x E5M2 with per-tensor scales."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g, dtype=torch.float64)
    b = torch.randn(k, n, generator=g, dtype=torch.float64)
    ref = a @ b
    bf16 = a.to(torch.bfloat16).float() @ b.to(torch.bfloat16).float()
    return {"float32": relative_error(a.float() @ b.float(), ref), "bf16": relative_error(bf16, ref),
            "fp8 E4M3": relative_error(fp8_matmul(a, b), ref),
            "fp8 E5M2": relative_error(fp8_matmul(a, b, E5M2, E5M2), ref)}


FP8_DENSE_PEAK_TFLOPS = {"H100 SXM": 1979.0}
"""Dense FP8 tensor-core peaks (no sparsity) from the datasheet, as the registry's
``h100-sxm-fp8-dense-peak`` quotes it; a T4 (compute capability 7.5) has no FP8 tensor cores."""
