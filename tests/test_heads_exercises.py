"""The checks of the heads exercises beyond their tables of right and wrong answers (``tests/answer_tables/heads.py``)."""

import pytest

from gpuformer_lib.exercises.heads import (check_decode_speedup_prediction, check_gqa_parameters,
                                           check_kv_cache_prediction, decode_speedup_model)
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


MEASURED = {"MHA": 1_000_000, "GQA-4": 500_000, "MQA": 125_000}


def test_kv_cache_prediction():
    """The answers of exercise 4.3 are in tests/answer_tables/heads.py; here, answers of the wrong shape."""
    assert check_kv_cache_prediction(dict(MEASURED), MEASURED)
    assert "missing: MQA" in check_kv_cache_prediction({"MHA": 1, "GQA-4": 1}, MEASURED).message
    assert not check_kv_cache_prediction(3, MEASURED)
    assert not check_kv_cache_prediction({"MHA": "big", "GQA-4": 1, "MQA": 1}, MEASURED)


WORK_WITH, WORK_WITHOUT, COSTS = (8e6, 200, 1e5), (2e9, 150, 2e7), (1e11, 1e-9, 3e-6)


def test_gqa_message_gives_the_whole_model_share_of_gpt2_small_not_the_blocks():
    """Review of 2026-11-27, chapter 4 error 2: the message said the whole model shrinks by about 15 %; for
    GPT-2 small MQA removes 12 x 1,082,752 = 13.0 M of 124.4 M parameters, 10.4 %: 15 % is per block."""
    import re

    from gpuformer_lib.kv_cache import decoder_parameters

    message = check_gqa_parameters(right).message
    gpt2 = decoder_parameters(768, 12, 50257, 12, 12, 1024) - 50257 * 768  # tied head
    removed = 12 * (right(768, 12, 12, True) - right(768, 12, 1, True))
    assert removed == 12 * 1_082_752
    (said,) = re.findall(r"about (\d+) % of GPT-2's", message)
    assert abs(int(said) - 100 * removed / gpt2) < 1
    assert f"{gpt2 / 1e6:.0f} M" in message


def test_decode_speedup_prediction_shows_the_timing_beside_the_model_without_grading_it():
    """The right and wrong answers of exercise 4.4 are in tests/answer_tables/heads.py."""
    right = decode_speedup_model(WORK_WITH, WORK_WITHOUT, COSTS)
    with_step = 8e6 / 1e11 + 1e5 * 1e-9 + 200 * 3e-6
    assert right == pytest.approx((2e9 / 1e11 + 2e7 * 1e-9 + 150 * 3e-6) / with_step)
    far = right * 10  # a timing far from the model: shown, never graded
    result = check_decode_speedup_prediction(right, WORK_WITH, WORK_WITHOUT, COSTS, context=128, measured=far,
                                             measured_by="the decoder measured")
    assert result and f"the decoder measured {far:.3g}" in result.message and "not graded" in result.message
    assert not check_decode_speedup_prediction(far, WORK_WITH, WORK_WITHOUT, COSTS, context=128, measured=far)


@pytest.mark.parametrize("work_with, work_without, costs", [
    ((8e6, 200), WORK_WITHOUT, COSTS), (WORK_WITH, WORK_WITHOUT, (1e11, 0.0, 3e-6)),
    (WORK_WITH, (2e9, -1, 2e7), COSTS)])
def test_decode_speedup_prediction_refuses_bad_author_input(work_with, work_without, costs):
    with pytest.raises(ValueError):
        check_decode_speedup_prediction(2, work_with, work_without, costs, context=128)
