"""The step-time predictor (matrix products at the tensor-core roof + element-wise bytes at the bandwidth
roof), the step and projection timers, and the architecture figure."""

import matplotlib

matplotlib.use("Agg")

import dataclasses

import pytest
import torch

from gpuformer_lib.diagrams import encoder_decoder_figure
from gpuformer_lib import bench
from gpuformer_lib.predict.layer_cost import (compare_minimums, count_step_operators, elementwise_elements_per_token,
                                      measure_time_split, measure_training_step, step_time_prediction,
                                      time_vocab_projection)
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
    times = time_vocab_projection(4, 8, (60, 64), "cpu", repeats=2)
    assert set(times) == {60, 64} and all(t.median > 0 for t in times.values())
    split = measure_time_split(c, 2, 8, "cpu")
    assert sum(split.values()) == pytest.approx(1.0)
    assert split.get("matrix products", 0) > 0 and all(0 <= v <= 1 for v in split.values())


def test_architecture_figure_names_the_parts():
    fig = encoder_decoder_figure()
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    for part in ("cross-attention", "causal self-attention", "feed-forward", "LayerNorm", "memory", "tied"):
        assert part in texts


def test_interleaved_timing_and_comparison_by_minimums():
    times = time_vocab_projection(4, 8, (60, 64), "cpu", repeats=6)
    assert all(len(t.times) == 6 for t in times.values())
    same = compare_minimums(bench.Timing((1.0, 1.1, 1.3), 0, 1), bench.Timing((0.95, 1.2, 1.4), 0, 1))
    assert same.speedup == pytest.approx(1 / 0.95) and same.noise == pytest.approx(0.25 / 0.95)
    assert not same.distinguishable and same.words().startswith("indistinguishable here (noise \u00b126%")
    clear = compare_minimums(bench.Timing((2.0, 2.02, 2.1), 0, 1), bench.Timing((1.0, 1.01, 1.05), 0, 1))
    assert clear.distinguishable and clear.words() == "faster"
    assert compare_minimums(bench.Timing((1.0, 1.01), 0, 1), bench.Timing((2.0, 2.01), 0, 1)).words() == "slower"
    with pytest.raises(TypeError):
        compare_minimums(1.0, 2.0)


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
