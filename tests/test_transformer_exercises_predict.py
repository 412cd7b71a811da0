"""Chapter 5's predict-then-measure and diagnosis exercises: the FLOPs prediction's grader and the tied
head's check, with right answers and the typical wrong ones."""

import functools
import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from gpuformer_lib.exercises.transformer import (check_tied_head, check_training_flops_prediction,
                                                 initial_loss_with_head)
from gpuformer_lib.model import DecoderLM, count_parameters, transformer_flops
import dataclasses
from gpuformer_lib.model import gpt2_config


@functools.lru_cache(maxsize=1)
def _gpt2_small_flops_per_token(T=1024):
    config = dataclasses.replace(gpt2_config(), fused_attention=False, check_token_ids=False)
    with torch.device("meta"):
        model = DecoderLM(config)
        ids = torch.zeros(1, T, dtype=torch.long)
        with FlopCounterMode(display=False) as counter:
            model(ids).float().sum().backward()
    return counter.get_total_flops() / T, count_parameters(model), config


def test_flop_counter_on_meta_agrees_with_transformer_flops():
    measured, _, config = _gpt2_small_flops_per_token()
    assert measured == transformer_flops(config, 1, 1024) / 1024


def test_flops_prediction_grades_the_model_and_refuses_a_count_of_another_model(capsys):
    """(The right answers and the plausible wrong ones are in tests/answer_tables/transformer.py.)"""
    measured, n_params, config = _gpt2_small_flops_per_token()
    assert check_training_flops_prediction(measured, measured, config)
    assert "FlopCounterMode counted" in capsys.readouterr().out
    assert check_training_flops_prediction(measured)  # no count: GPT-2 small at T = 1024 by default
    assert not check_training_flops_prediction("a lot", measured)
    with pytest.raises(ValueError):  # a count of another model (T = 512) is the notebook's error, not the learner's
        check_training_flops_prediction(measured, transformer_flops(config, 1, 512) / 512)
    small = dataclasses.replace(config, n_decoder_layers=2, d_model=128, n_heads=4, d_ff=512, vocab_size=512)
    right = transformer_flops(small, 1, 64) / 64
    assert check_training_flops_prediction(right, None, small, seq_len=64)
    assert not check_training_flops_prediction(right / 3, None, small, seq_len=64)


def test_tied_head_unscaled_hint_is_a_diagnosis():
    """(The other right and wrong heads are in tests/answer_tables/transformer.py.)"""
    unscaled = check_tied_head(lambda h, w: h @ w.T)
    # the message names the symptom (loss, the input token's probability), not the fix: still a diagnosis
    assert not unscaled and "probability" in unscaled.message and "ln 16" in unscaled.message
    assert "C^-1/2" not in unscaled.message and "sqrt(C)" not in unscaled.message and "Scale" not in unscaled.message


def test_initial_loss_with_and_without_the_scale():
    scaled = initial_loss_with_head(lambda h, w: h @ w.T * h.shape[-1] ** -0.5)
    unscaled = initial_loss_with_head(lambda h, w: h @ w.T)
    assert abs(scaled - math.log(16)) < 0.35
    assert unscaled > math.log(16) + 2  # the input token wins: the review's 6.28
