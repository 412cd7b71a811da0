"""Grouped-query attention and the KV cache against references: PyTorch's SDPA (with enable_gqa, or
repeat_interleave), the library's MultiHeadAttention, and decoding without a cache; the cost models."""

import math

import pytest
import torch
import torch.nn.functional as F

from gpuformer_lib.attention import MultiHeadAttention
from gpuformer_lib.kv_cache import (CachedDecoder, DecoderShape, GroupedQueryAttention, KVCache, LayerKVCache,
                                    bottom_right_causal_mask, decoder_parameters, grouped_attention, greedy_decode,
                                    kv_cache_bytes, minimal_attention, predicted_decode_seconds,
                                    predicted_heads_loop_vs_batch, predicted_recompute_seconds, repeat_kv)


def _sdpa_gqa(q, k, v, causal):
    """PyTorch's reference: enable_gqa where this torch has it, else the keys repeated per group."""
    g = q.shape[1] // k.shape[1]
    try:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    except TypeError:  # torch < 2.5
        return F.scaled_dot_product_attention(q, repeat_kv(k, g), repeat_kv(v, g), is_causal=causal)


@pytest.mark.parametrize("n_kv", [8, 4, 2, 1])
@pytest.mark.parametrize("causal", [True, False])
def test_grouped_attention_equals_sdpa(n_kv, causal):
    torch.manual_seed(n_kv)
    q = torch.randn(2, 8, 7, 16)
    k, v = torch.randn(2, n_kv, 7, 16), torch.randn(2, n_kv, 7, 16)
    torch.testing.assert_close(grouped_attention(q, k, v, causal=causal), _sdpa_gqa(q, k, v, causal))
    reps = 8 // n_kv
    ref = F.scaled_dot_product_attention(q, repeat_kv(k, reps), repeat_kv(v, reps), is_causal=causal)
    torch.testing.assert_close(grouped_attention(q, k, v, causal=causal), ref)


def test_grouped_attention_in_float64_and_bf16():
    q = torch.randn(1, 4, 5, 8, dtype=torch.float64)
    k, v = torch.randn(1, 2, 5, 8, dtype=torch.float64), torch.randn(1, 2, 5, 8, dtype=torch.float64)
    ref = F.scaled_dot_product_attention(q, repeat_kv(k, 2), repeat_kv(v, 2), is_causal=True)
    torch.testing.assert_close(grouped_attention(q, k, v), ref)
    got = grouped_attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    torch.testing.assert_close(got.double(), ref, atol=3e-2, rtol=3e-2)


def test_bottom_right_mask_matches_sdpa_lower_right_bias():
    from torch.nn.attention.bias import causal_lower_right

    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(3, 6))
    torch.testing.assert_close(grouped_attention(q, k, v), ref)
    assert bottom_right_causal_mask(1, 4).all()  # one new token sees every cached key
    with pytest.raises(ValueError, match="more queries"):
        bottom_right_causal_mask(5, 4)


def test_minimal_attention_equals_sdpa():
    q, k, v = (torch.randn(2, 3, 9, 8) for _ in range(3))
    allowed = torch.ones(9, 9, dtype=torch.bool).tril()
    torch.testing.assert_close(minimal_attention(q, k, v, allowed),
                               F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_gqa_with_all_heads_equals_the_library_multi_head_attention():
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4)
    gqa = GroupedQueryAttention(32, 4)  # n_kv_heads = n_heads
    gqa.load_state_dict(mha.state_dict())
    x = torch.randn(3, 6, 32)
    want, _ = mha(x, x, x, is_causal=True)
    torch.testing.assert_close(gqa(x), want)


def test_gqa_layer_equals_sdpa_with_the_same_weights():
    torch.manual_seed(1)
    layer = GroupedQueryAttention(48, 6, 2)
    x = torch.randn(2, 5, 48)
    w = layer.in_proj_weight
    q, k, v = F.linear(x, w, layer.in_proj_bias).split([48, 16, 16], dim=-1)
    q = q.view(2, 5, 6, 8).transpose(1, 2)
    k, v = (t.view(2, 5, 2, 8).transpose(1, 2) for t in (k, v))
    y = _sdpa_gqa(q, k, v, True).transpose(1, 2).reshape(2, 5, 48)
    torch.testing.assert_close(layer(x), layer.out_proj(y))
    assert layer.in_proj_weight.shape == (48 + 2 * 16, 48)


@pytest.mark.parametrize("n_kv", [4, 2, 1])
def test_decoding_with_the_cache_gives_the_logits_of_the_whole_prefix(n_kv):
    torch.manual_seed(2)
    model = CachedDecoder(DecoderShape(vocab_size=17, d_model=32, n_heads=4, n_kv_heads=n_kv, n_layers=2,
                                       max_len=24)).eval()
    idx = torch.randint(0, 17, (2, 12))
    with torch.no_grad():
        full = model(idx)  # (B, T, V) in one pass
        cache = model.new_cache(2)
        prefill = model(idx[:, :5], cache)  # the prompt at once
        steps = [model(idx[:, t:t + 1], cache) for t in range(5, 12)]  # then one token at a time
    torch.testing.assert_close(torch.cat([prefill] + steps, dim=1), full)
    assert cache.length == 12


def test_greedy_decode_is_the_same_with_and_without_the_cache():
    torch.manual_seed(3)
    model = CachedDecoder(DecoderShape(vocab_size=11, d_model=16, n_heads=4, n_kv_heads=2, n_layers=2,
                                       max_len=20)).eval()
    prompt = torch.randint(0, 11, (3, 4))
    assert torch.equal(greedy_decode(model, prompt, 8, use_cache=True), greedy_decode(model, prompt, 8,
                                                                                          use_cache=False))


def test_cache_bytes_measured_from_the_tensors_equal_the_formula():
    for n_kv, dtype in ((8, torch.float32), (2, torch.bfloat16), (1, torch.float16)):
        model = CachedDecoder(DecoderShape(d_model=64, n_heads=8, n_kv_heads=n_kv, n_layers=3, max_len=40))
        cache = model.to(dtype).new_cache(batch=5)
        assert cache.nbytes == kv_cache_bytes(3, n_kv, 8, 40, 5, dtype.itemsize)
    # GPT-2 small in fp16: 36 KiB per token
    assert kv_cache_bytes(12, 12, 64, 1, 1, 2) == 36_864


def test_cache_refuses_overflow_and_wrong_shapes_and_truncates():
    layer = LayerKVCache(1, 2, 4, 8, dtype=torch.float32)
    layer.append(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8))
    with pytest.raises(ValueError, match="holds 4 tokens"):
        layer.append(torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8))
    with pytest.raises(ValueError, match="do not fit"):
        layer.append(torch.randn(1, 3, 1, 8), torch.randn(1, 3, 1, 8))
    cache = KVCache([layer])
    cache.truncate(1)
    assert cache.length == 1
    with pytest.raises(ValueError):
        cache.truncate(2)
    with pytest.raises(ValueError):
        kv_cache_bytes(12, 0, 64, 1, 1, 2)


def test_bad_head_counts_are_refused():
    with pytest.raises(ValueError, match="must divide"):
        GroupedQueryAttention(48, 6, 4)
    with pytest.raises(ValueError):
        DecoderShape(d_model=30, n_heads=4)


def test_gpt2_small_parameter_count():
    assert decoder_parameters(768, 12, 50257, 12, 12, 1024) - 50257 * 768 == 124_439_808  # tied head
    model = CachedDecoder(DecoderShape(vocab_size=50, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, max_len=16))
    assert sum(p.numel() for p in model.parameters()) == decoder_parameters(32, 2, 50, 4, 2, 16)


def test_decode_predictions():
    weights, cache = 250e6, 2e9
    t4 = predicted_decode_seconds("T4", weights, cache)
    h100 = predicted_decode_seconds("H100 SXM", weights, cache)
    from gpuformer_lib import predict

    assert math.isclose(t4, (weights + cache) / predict.achievable_bandwidth("T4")[0])  # the predictor's bandwidth
    assert h100 < t4
    # without the cache a step is a forward pass over all T tokens: far slower at long T
    assert predicted_recompute_seconds("H100 SXM", 124_000_000, 4096, 1, torch.bfloat16) > \
        predicted_decode_seconds("H100 SXM", 248e6, 0)


def test_heads_prediction_batching_wins_on_small_heads_and_ties_on_large():
    small = predicted_heads_loop_vs_batch(8, 12, 128, 64, torch.float16, "H100 SXM")
    large = predicted_heads_loop_vs_batch(8, 12, 8192, 64, torch.float16, "H100 SXM")
    assert small.speedup > 3 and small.launch_bound_loop
    assert 1 <= large.speedup < 1.1 and not large.launch_bound_loop


def test_time_decode_step_both_ways():
    from gpuformer_lib.kv_cache import time_decode_step

    model = CachedDecoder(DecoderShape(vocab_size=11, d_model=16, n_heads=4, n_kv_heads=1, n_layers=1,
                                       max_len=32)).eval()
    for use_cache in (True, False):
        timing = time_decode_step(model, 2, 20, use_cache=use_cache, repeats=3)
        assert len(timing.times) == 3 and timing.median > 0
    with pytest.raises(ValueError):
        time_decode_step(model, 2, 33, use_cache=True)


def test_sdpa_backends_reports_math_runs_and_names_every_backend():
    from gpuformer_lib.kv_cache import SDPA_BACKENDS, sdpa_backends

    q = torch.randn(1, 2, 8, 16)
    report = sdpa_backends(q, q, q, is_causal=True)
    assert set(report) == set(SDPA_BACKENDS) and report["MATH"] == "runs"
    assert all(r == "runs" or r.startswith("refused: ") for r in report.values())


def test_chapter_4_takes_its_dtype_from_the_profile():
    """The review found chapter 4 choosing bf16 with torch.cuda.is_bf16_supported(), which counts a T4's
    emulation: the notebook must ask the profile (profiles.compute_dtype)."""
    import json
    from pathlib import Path

    nb = json.loads((Path(__file__).parent.parent / "notebooks" / "04_multi_head_attention.ipynb").read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "is_bf16_supported" not in code and "compute_dtype(profile)" in code


def test_decode_speedup_times_both_steps_in_interleaved_rounds(monkeypatch):
    """On a clock of its own (no verdict on a real clock): a forward pass costs 1 ms per token it is given, so
    the recomputing step at 48 tokens takes 48 ms and the cached one 1 ms, in every round."""
    from fake_clock import FakeClock
    from gpuformer_lib import bench
    from gpuformer_lib.kv_cache import decode_speedup

    clock = FakeClock()
    monkeypatch.setattr(bench, "time", clock)
    model = CachedDecoder(DecoderShape(vocab_size=32, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2,
                                       max_len=64)).eval()
    forward = model.forward

    def timed_forward(idx, *args, **kwargs):
        clock.sleep(idx.shape[1] * 1e-3)
        return forward(idx, *args, **kwargs)

    monkeypatch.setattr(model, "forward", timed_forward)
    result = decode_speedup(model, 2, 48, repeats=5)
    assert isinstance(result, bench.Comparison)
    assert (result.baseline, result.candidate) == ("without the cache", "with the cache")
    assert result.speedup == pytest.approx(48) and result.verdict == "faster"
    assert len(result.ratios) == 5 and result.phrase() == "48.00x faster than without the cache"
    assert result.timings["with the cache"].median == pytest.approx(1e-3)


def test_decode_step_work():
    from gpuformer_lib.kv_cache import decode_step_work

    torch.manual_seed(0)
    model = CachedDecoder(DecoderShape(vocab_size=32, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2,
                                       max_len=64)).eval()
    flops_with, calls_with, elements_with = decode_step_work(model, 2, 48, use_cache=True)
    flops_without, calls_without, elements_without = decode_step_work(model, 2, 48, use_cache=False)
    # matrix products: the recomputing step does ~context times the cached step's FLOPs
    assert 24 < flops_without / flops_with <= 48
    assert calls_with > 10 and calls_without > 10  # every layer calls several PyTorch functions
    # element-wise work: the recomputing step masks and normalises (B, H, T, T) scores, the cached one (B, H, 1, T)
    assert elements_without > 20 * elements_with


def test_count_torch_work_counts_calls_and_written_elements_not_views_or_products():
    from gpuformer_lib.kv_cache import count_torch_work

    x, w = torch.ones(3, 4), torch.ones(5, 4)
    calls, elements = count_torch_work(lambda: F.linear(x, w).softmax(-1).transpose(0, 1))
    assert calls == 3 and elements == 15  # the softmax's 3 x 5; the product and the view are not counted
