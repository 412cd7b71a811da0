"""Rotary position embedding: against the complex-number reference in float64, and its relative-position
property (q_m . k_n depends only on m - n)."""

import pytest
import torch

from gpuformer_lib.rope import (apply_rope, apply_rope_complex, rope_angles, rope_frequencies,
                                rope_score_by_offset)


def test_matches_complex_reference_in_float64():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 17, 16, dtype=torch.float64)  # (B, H, T, hs)
    torch.testing.assert_close(apply_rope(x), apply_rope_complex(x), rtol=1e-12, atol=1e-12)


def test_float32_close_to_reference_at_long_positions():
    torch.manual_seed(1)
    x = torch.randn(5, 64)
    positions = torch.arange(8000, 8005)
    torch.testing.assert_close(apply_rope(x, positions), apply_rope_complex(x, positions).float(),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_keeps_dtype_and_is_close(dtype):
    torch.manual_seed(2)
    x = torch.randn(2, 9, 32)
    got = apply_rope(x.to(dtype))
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), apply_rope(x), rtol=2e-2, atol=2e-2)


def test_relative_position_property():
    torch.manual_seed(3)
    q, k = torch.randn(32, dtype=torch.float64), torch.randn(32, dtype=torch.float64)
    scores = rope_score_by_offset(q, k, 40)  # (m, n) -> rope(q, m) . rope(k, n)
    for offset in range(-39, 40):
        diagonal = scores.diagonal(offset)
        torch.testing.assert_close(diagonal, diagonal[0].expand_as(diagonal), rtol=1e-10, atol=1e-10)
    # and it is not trivially constant: different offsets give different scores
    assert scores.diagonal(0)[0] != pytest.approx(scores.diagonal(5)[0])


def test_rotation_preserves_length_and_position_zero_is_identity():
    torch.manual_seed(4)
    x = torch.randn(3, 12, 8)
    torch.testing.assert_close(apply_rope(x).norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(apply_rope(x)[:, 0], x[:, 0])


def test_positions_offset_continues_a_sequence():
    torch.manual_seed(5)
    x = torch.randn(1, 10, 16)
    full = apply_rope(x)
    tail = apply_rope(x[:, 6:], positions=torch.arange(6, 10))
    torch.testing.assert_close(tail, full[:, 6:])


def test_frequencies_are_the_sinusoid_frequencies():
    theta = rope_frequencies(8)
    torch.testing.assert_close(theta, torch.tensor([1.0, 10000 ** -0.25, 10000 ** -0.5, 10000 ** -0.75]))
    assert rope_angles(torch.arange(3), 8).shape == (3, 4)


@pytest.mark.parametrize("bad", [7, 0, True, 4.0])
def test_rejects_odd_or_invalid_head_size(bad):
    with pytest.raises(ValueError, match="even"):
        rope_frequencies(bad)


def test_rejects_wrong_positions_and_base():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="positions"):
        apply_rope(x, positions=torch.arange(3))
    with pytest.raises(ValueError, match="base"):
        apply_rope(x, base=1)
    with pytest.raises(ValueError, match="same head size"):
        rope_score_by_offset(torch.randn(8), torch.randn(6), 4)
