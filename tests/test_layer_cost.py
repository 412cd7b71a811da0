"""The step-time predictor (matrix products at the tensor-core roof + element-wise bytes at the bandwidth
roof), the step and projection timers, and the architecture figure."""

import matplotlib

matplotlib.use("Agg")

import dataclasses

import pytest
import torch

from gpuformer_lib.diagrams import encoder_decoder_figure
from gpuformer_lib import bench
from gpuformer_lib.predict.layer_cost import (compare_vocab_projection, count_step_operators,
                                      elementwise_elements_per_token, measure_time_split, measure_training_step,
                                      step_time_prediction)
from gpuformer_lib.model import TransformerConfig, gpt2_config, transformer_flops


def test_the_prediction_is_the_courses_predictor_without_an_optimizer():
    from gpuformer_lib import predict

    config = gpt2_config()
    p = step_time_prediction(config, 8, 1024, torch.bfloat16, "H100 SXM")
    work = predict.training_work(dataclasses.replace(config, check_token_ids=False), tokens=8 * 1024, seq_len=1024,
                                 fmt="bf16", optimizer=None)
    step = predict.predict_step(work, "H100 SXM")
    assert p.matmul_flops == transformer_flops(config, 8, 1024) == work.matrix_flops
    assert p.seconds == pytest.approx(step.seconds) and p.kernels == work.kernels > 0
    assert p.matmul_seconds == pytest.approx(p.matmul_flops / predict.achievable_rate("H100 SXM", "bf16")[0])
    assert 0 < p.elementwise_fraction < 1
    assert step_time_prediction(config, 8, 1024, torch.float16, "T4").seconds > p.seconds
    with pytest.raises(ValueError, match="training"):
        step_time_prediction(config, 8, 1024, torch.bfloat16, "H100 SXM", training=False)


def test_elementwise_elements_by_hand():
    c = TransformerConfig(vocab_size=10, d_model=8, n_heads=2, n_decoder_layers=3, d_ff=32)
    assert elementwise_elements_per_token(c) == 3 * (14 * 8 + 2 * 32) + 2 * 8 + 2 * 10
    with pytest.raises(TypeError):
        elementwise_elements_per_token("gpt2")


def test_timers_run_on_the_cpu():
    c = TransformerConfig(vocab_size=16, d_model=16, n_heads=2, n_decoder_layers=1, d_ff=32, dropout=0.0, max_len=16)
    assert measure_training_step(c, 2, 8, "cpu", repeats=2).median > 0
    padded = compare_vocab_projection(4, 8, (60, 64), "cpu", repeats=5)
    assert set(padded) == {64} and padded[64].speedup > 0 and len(padded[64].ratios) >= 5
    split = measure_time_split(c, 2, 8, "cpu")
    assert sum(split.values()) == pytest.approx(1.0)
    assert split.get("matrix products", 0) > 0 and all(0 <= v <= 1 for v in split.values())


def test_architecture_figure_names_the_parts():
    fig = encoder_decoder_figure()
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    for part in ("cross-attention", "causal self-attention", "feed-forward", "LayerNorm", "memory", "tied"):
        assert part in texts


def test_vocabulary_sizes_are_compared_in_interleaved_rounds(monkeypatch):
    """Issue 30: the padded vocabulary is judged by ``bench.compare``'s verdict, with a fake clock: every
    product lasts one tick, so the rounds tie and the verdict cannot be "faster" or "slower"."""
    from fake_clock import FakeClock

    monkeypatch.setattr(bench, "time", FakeClock(tick=1.0))
    padded = compare_vocab_projection(4, 8, (60, 64), "cpu", repeats=6)
    comparison = padded[64]
    assert comparison.baseline == "V = 60" and comparison.candidate == "V = 64"
    assert len(comparison.ratios) == 6 and comparison.speedup == 1.0
    assert comparison.verdict == "no difference we can see" and "no faster or slower than V = 60" in comparison.phrase()
    for bad in (dict(repeats=4), dict(repeats=True)):
        with pytest.raises(ValueError):
            compare_vocab_projection(4, 8, (60, 64), "cpu", **bad)
    with pytest.raises(ValueError):
        compare_vocab_projection(4, 8, (64, 64), "cpu")


def test_operator_count_grows_with_depth():
    c = TransformerConfig(vocab_size=16, d_model=16, n_heads=2, n_decoder_layers=1, d_ff=32, dropout=0.0, max_len=16)
    one = count_step_operators(c, 2, 8)
    two = count_step_operators(dataclasses.replace(c, n_decoder_layers=2), 2, 8)
    assert 20 < one < two


def test_architecture_figure_is_labelled_as_pre_ln_with_residual_adds():
    fig = encoder_decoder_figure()
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts.count("+") == 5  # one add per sublayer: 2 in the encoder layer, 3 in the decoder layer
    assert "pre-LN" in fig.axes[0].get_title()


def test_decoder_label_sits_clear_of_the_memory_arrow():
    # the memory arrow runs from the encoder (left) into the decoder's left side: the decoder's rotated
    # "layer x N" label goes on the decoder's right, where no arrow passes
    fig = encoder_decoder_figure()
    labels = {t.get_text(): t.get_position()[0] for t in fig.axes[0].texts}
    cross = [t.get_position()[0] for t in fig.axes[0].texts if t.get_text() == "cross-attention"][0]
    assert labels["decoder layer x N"] > cross + 1.2 and labels["encoder layer x N"] < cross
