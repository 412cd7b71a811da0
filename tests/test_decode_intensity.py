"""Decode intensity against batch: the FLOPs counted by FlopCounterMode on a real cached step, the bytes by
the formula, and the two regimes (weights amortised by the batch; the cache never)."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from gpuformer_lib import kv_cache as kv


def matrix_params(model) -> int:
    """The weights of the matrix products: every 2-D parameter but the embedding tables."""
    tables = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    return sum(p.numel() for p in model.parameters() if p.dim() == 2 and id(p) not in tables)


@pytest.mark.parametrize("batch, context, n_kv_heads", [(1, 9, 4), (3, 17, 4), (2, 33, 1), (4, 5, 2)])
def test_flops_equal_flopcounter_on_a_cached_step(batch, context, n_kv_heads):
    torch.manual_seed(0)
    shape = kv.DecoderShape(vocab_size=40, d_model=32, n_heads=4, n_kv_heads=n_kv_heads, n_layers=2, max_len=64)
    model = kv.CachedDecoder(shape).eval()
    step = kv._decode_step(model, batch, context, use_cache=True)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        step()
    work = kv.decode_intensity(matrix_params(model), batch=batch, context=context, n_layers=2, n_heads=4,
                               n_kv_heads=n_kv_heads, head_size=8, itemsize=4)
    assert counter.get_total_flops() == work.flops
    cache = model.new_cache(batch, context)
    assert work.cache_bytes == sum(t.numel() * t.element_size() for layer in cache.layers
                                   for t in (layer.k, layer.v))


def test_batching_lifts_the_weights_but_not_the_cache():
    sizes = dict(context=4096, n_layers=32, n_heads=32, n_kv_heads=32, head_size=128)
    seven_b = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)
    intensities = [kv.decode_intensity(seven_b, batch=b, **sizes).intensity for b in (1, 8, 64, 4096)]
    assert intensities == sorted(intensities)
    assert intensities[0] == pytest.approx(1.0, rel=0.1)  # 2 FLOPs per 2-byte weight at batch 1
    limit = kv.cache_intensity(32, 32)
    assert limit == 1.0 and intensities[-1] < 1.1 * limit * (1 + 2 * seven_b / (4 * 32 * 4096 * 32 * 128))
    assert kv.cache_intensity(32, 8) == 4.0 and kv.cache_intensity(32, 1) == 32.0


def test_without_a_context_the_batch_alone_sets_the_intensity():
    work = kv.decode_intensity(1000, batch=64, context=0, n_layers=2, n_heads=4, n_kv_heads=4, head_size=8)
    assert work.intensity == 64.0 and work.cache_bytes == 0


def test_the_compute_bound_batch_is_the_first_at_the_ridge():
    from gpuformer_lib import predict

    ridge = predict.achievable_rate("H100 SXM", "bf16")[0] / predict.achievable_bandwidth("H100 SXM")[0]
    sizes = dict(context=0, n_layers=32, n_heads=32, n_kv_heads=32, head_size=128)
    b = kv.compute_bound_batch("H100 SXM", "bf16", 6_000_000_000, **sizes)
    assert kv.decode_intensity(6_000_000_000, batch=b, **sizes).intensity >= ridge
    assert kv.decode_intensity(6_000_000_000, batch=b - 1, **sizes).intensity < ridge
    # a long context with multi-head attention caps the intensity near 1 FLOP/B: no batch reaches the ridge
    assert kv.compute_bound_batch("H100 SXM", "bf16", 6_000_000_000, **{**sizes, "context": 4096}) is None


@pytest.mark.parametrize("kwargs", [dict(batch=0), dict(context=-1), dict(n_kv_heads=3), dict(itemsize=1.5)])
def test_bad_sizes_raise(kwargs):
    base = dict(batch=1, context=8, n_layers=1, n_heads=4, n_kv_heads=4, head_size=8, itemsize=2)
    with pytest.raises(ValueError):
        kv.decode_intensity(100, **{**base, **kwargs})
