"""first_nonfinite names the module where a float16 forward first overflows: planted in a real Transformer, the
inf starts where the large weights are, in float16 only (bfloat16 and float32 have the range)."""

import copy

import pytest
import torch

from gpuformer_lib.mixed_precision import first_nonfinite
from gpuformer_lib.model import DecoderLM, TransformerConfig


def planted_model():
    torch.manual_seed(0)
    config = TransformerConfig(d_model=64, n_heads=4, n_decoder_layers=2, d_ff=256, vocab_size=50, max_len=32,
                               dropout=0.0, activation="gelu")  # ReLU would zero a -inf, GELU makes it NaN
    model = DecoderLM(config).eval()
    with torch.no_grad():
        model.blocks.layers[1].linear1.weight.mul_(1e5)  # one feed-forward's weights grown past float16's range
    return model, torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))


def test_a_planted_overflow_is_found_where_it_starts_in_float16():
    model, ids = planted_model()
    half = copy.deepcopy(model).half()
    with torch.no_grad():
        logits = half(ids)
        found = first_nonfinite(half, lambda: half(ids))
    assert not torch.isfinite(logits).all()  # the symptom, at the end
    assert found is not None and found.module == "blocks.layers.1.linear1"
    assert found.first_output_inf and 0 < found.largest_input <= torch.finfo(torch.float16).max


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_same_model_stays_finite_where_the_range_is_wider(dtype):
    model, ids = planted_model()
    wide = copy.deepcopy(model).to(dtype)
    with torch.no_grad():
        assert first_nonfinite(wide, lambda: wide(ids)) is None


def test_the_hooks_are_removed_even_when_the_run_raises():
    model, _ = planted_model()
    with pytest.raises(ZeroDivisionError):
        first_nonfinite(model, lambda: 1 / 0)
    assert not any(m._forward_hooks for m in model.modules())
