"""Chapter 16's exercise checks pass right answers and give the specific hint for each kind of wrong one."""

import torch

from gpuformer_lib import compression
from gpuformer_lib.exercises.tools import (check_graph_break_fixed, check_int8_size_prediction,
                                           check_wheel_for_driver, predicted_int8_size_ratio)
from gpuformer_lib.model import DecoderLM


def test_int8_size_prediction_against_a_real_quantized_checkpoint():
    model = DecoderLM(compression.demo_config(40, d_model=64))
    share = compression.linear_share(model)
    quantized, _ = compression.torch_quantize_dynamic(model)
    measured = compression.state_dict_bytes(model) / compression.state_dict_bytes(quantized)
    predicted = predicted_int8_size_ratio(share)
    assert 1 < predicted < 4 and abs(predicted / measured - 1) < 0.15, (predicted, measured)
    assert check_int8_size_prediction(predicted, measured, linear_share=share)
    too_high = check_int8_size_prediction(4.0, measured, linear_share=share)
    assert not too_high and "stay float32" in too_high.message
    too_low = check_int8_size_prediction((1 - share) + share / 4, measured, linear_share=share)
    assert not too_low and "not (1 - s) + s / 4" in too_low.message
    assert not check_int8_size_prediction(None, measured, linear_share=share)


def clip_if_large(x):  # the notebook's function: a Python branch on a tensor's value
    peak = x.abs().max()
    if peak.item() > 1:
        return x / peak
    return x


def test_graph_break_check_rejects_the_break_and_wrong_outputs_and_passes_torch_where():
    broken = check_graph_break_fixed(clip_if_large)
    assert not broken and "break(s)" in broken.message and "torch.where" in broken.message
    wrong = check_graph_break_fixed(lambda x: x / x.abs().max())  # always scales: wrong below the threshold
    assert not wrong and "differ" in wrong.message

    def fixed(x):
        peak = x.abs().max()
        return torch.where(peak > 1, x / peak, x)

    assert check_graph_break_fixed(fixed)
    assert not check_graph_break_fixed(fixed(torch.ones(3)))  # a tensor, not a function


def test_wheel_for_driver_hints():
    best = check_wheel_for_driver("https://download.pytorch.org/whl/cu124")
    assert best and "newest tag it runs" in best.message and "2.6" in best.message
    older = check_wheel_for_driver("https://download.pytorch.org/whl/cu121/")
    assert older and "pin" in older.message and "cu124 is the newest" in older.message
    assert "already has" in check_wheel_for_driver("https://download.pytorch.org/whl/cpu").message
    newer = check_wheel_for_driver("https://download.pytorch.org/whl/cu128")
    assert not newer and "PTX" in newer.message and "cu124" in newer.message
    major = check_wheel_for_driver("https://download.pytorch.org/whl/cu130")
    assert not major and "too old" in major.message
    old_major = check_wheel_for_driver("https://download.pytorch.org/whl/cu118")
    assert old_major and "2.7" in old_major.message
    for never_published in ("cu122", "cu123", "cu125"):  # match the URL pattern, but PyTorch has no such index
        wrong = check_wheel_for_driver(f"https://download.pytorch.org/whl/{never_published}")
        assert not wrong and "publishes no" in wrong.message and "cu124" in wrong.message
    assert "AMD" in check_wheel_for_driver("https://download.pytorch.org/whl/rocm6.4").message
    assert "<build>" in check_wheel_for_driver("pip install torch-gpu").message
    assert not check_wheel_for_driver(124)
