"""The checks of the heads exercises: a right answer passes, each common wrong one gets its own hint."""

import pytest

from gpuformer_lib.exercises.heads import (check_decode_speedup_prediction, check_gqa_parameters,
                                           check_kv_cache_prediction)
from gpuformer_lib.kv_cache import GroupedQueryAttention


def right(C, H, Hkv, bias):
    kv = Hkv * C // H
    return 2 * C * C + 2 * C * kv + ((2 * C + 2 * kv) if bias else 0)


def test_gqa_parameters_right_answer_matches_the_module():
    result = check_gqa_parameters(right)
    assert result
    # review: MQA removes ~half of the attention layer's parameters (not "a small saving"), ~15 % of a block
    assert "small" not in result.message and "half" in result.message and "15 %" in result.message
    mha, mqa = right(768, 12, 12, True), right(768, 12, 1, True)
    assert 0.4 < 1 - mqa / mha < 0.5
    block = mha + 8 * 768 * 768 + 5 * 768  # attention + a 4C MLP with biases
    assert 0.1 < (mha - mqa) / block < 0.2
    for C, H, Hkv, bias in ((64, 8, 2, True), (48, 6, 3, False)):
        layer = GroupedQueryAttention(C, H, Hkv, bias=bias)
        assert right(C, H, Hkv, bias) == sum(p.numel() for p in layer.parameters())


@pytest.mark.parametrize("wrong, hint", [
    (lambda C, H, Hkv, b: 4 * C * C + (4 * C if b else 0), "that is MHA"),
    (lambda C, H, Hkv, b: right(C, H, Hkv, False), "bias"),
    (lambda C, H, Hkv, b: right(C, H, Hkv, b) - C * C - (C if b else 0), "output projection"),
    (lambda C, H, Hkv, b: None, "None"),
])
def test_gqa_parameters_wrong_answers_get_hints(wrong, hint):
    result = check_gqa_parameters(wrong)
    assert not result and hint in result.message


MEASURED = {"MHA": 1_000_000, "GQA-4": 500_000, "MQA": 125_000}


def test_kv_cache_prediction():
    assert check_kv_cache_prediction(dict(MEASURED), MEASURED)
    doubled = {k: 2 * v for k, v in MEASURED.items()}
    result = check_kv_cache_prediction(doubled, MEASURED)
    assert not result and "2 bytes, not 4" in result.message
    halved = {k: v / 2 for k, v in MEASURED.items()}
    assert "a K and a V" in check_kv_cache_prediction(halved, MEASURED).message
    assert "missing: MQA" in check_kv_cache_prediction({"MHA": 1, "GQA-4": 1}, MEASURED).message
    assert not check_kv_cache_prediction(3, MEASURED)
    assert not check_kv_cache_prediction({"MHA": "big", "GQA-4": 1, "MQA": 1}, MEASURED)


def test_decode_speedup_prediction():
    assert check_decode_speedup_prediction(10, 8.0, context=128)
    high = check_decode_speedup_prediction(128, 8.0, context=128)
    assert not high and "fixed cost" in high.message
    low = check_decode_speedup_prediction(1.5, 8.0, context=128)
    assert not low and "recomputes" in low.message
    upside_down = check_decode_speedup_prediction(0.1, 8.0, context=128)
    assert not upside_down and "slower" in upside_down.message
    with pytest.raises(ValueError):
        check_decode_speedup_prediction(2, -1.0, context=128)


def test_decode_speedup_prediction_accepts_a_measuring_function():
    calls = []

    def measure():  # the first timing is disturbed (3x too fast a speedup), the second is not
        calls.append(1)
        return 40.0 if len(calls) == 1 else 8.0

    result = check_decode_speedup_prediction(8, measure, context=128, measured_by="the decoder measured")
    assert result and len(calls) == 2 and "closest of 2" in result.message and "the decoder measured" in result.message
    calls.clear()
    assert check_decode_speedup_prediction(10, lambda: calls.append(1) or 8.0, context=128) and len(calls) == 1
    calls.clear()
    miss = check_decode_speedup_prediction(128, lambda: calls.append(1) or 8.0, context=128)
    assert not miss and len(calls) == 3 and "fixed cost" in miss.message
