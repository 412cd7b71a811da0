"""The chapter-3 checks of exercises.attention: a right answer passes, each typical wrong one gets its hint."""

import pytest
import torch

from gpuformer_lib import tiled_attention as ta
from gpuformer_lib.exercises.attention import check_attention_memory_prediction, check_online_softmax_update


def test_memory_prediction_grades_the_count_of_matrices_not_the_measurement(capsys):
    """(The right counts and the plausible miscounts are in tests/answer_tables/attention.py.) The model of
    whole (B, H, T, T) matrices agrees with what peak_bytes measures to within a fraction of one matrix, and
    the measurement is shown, not graded."""
    B, H, T, hs = 1, 2, 128, 16
    q, k, v = (torch.randn(B, H, T, hs) for _ in range(3))
    S = B * H * T * T * 4
    measured = ta.peak_bytes(lambda: ta.minimal_attention(q, k, v))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    both = ta.peak_bytes(lambda: ta.minimal_attention(qg, kg, vg).sum().backward())
    assert abs(measured / S - 2) < 0.5 and abs(both / S - 3) < 0.5
    graded = check_attention_memory_prediction(2 * S, measured, shape=q.shape)
    assert graded and "peak_bytes measured" in graded.message
    assert check_attention_memory_prediction(3 * S, both, shape=q.shape, backward=True)
    assert check_attention_memory_prediction(3 * S, None, shape=q.shape, backward=True)  # no measurement
    assert check_attention_memory_prediction(S, None, shape=q.shape, dtype=torch.float16)  # 2 bytes an element
    assert not check_attention_memory_prediction("a lot", both, shape=q.shape, backward=True)
    with pytest.raises(ValueError):
        check_attention_memory_prediction(2 * S, measured, shape=(0, 2, 128, 16))  # the notebook's input raises


def test_online_softmax_update_answers_of_the_wrong_form():
    """(The right update and the plausible wrong ones are in tests/answer_tables/attention.py.)"""

    def unfinished(m, l, x):
        raise NotImplementedError

    assert not check_online_softmax_update(unfinished)
    assert not check_online_softmax_update(lambda m, l, x: m)
