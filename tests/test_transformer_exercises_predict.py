"""Chapter 5's predict-then-measure and diagnosis exercises: the FLOPs prediction's grader and the tied
head's check, with right answers and the typical wrong ones."""

import functools
import math

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


def test_flops_prediction_grades_the_typical_answers():
    measured, n_params, config = _gpt2_small_flops_per_token()
    C, L, T = config.d_model, config.n_decoder_layers, 1024
    right = 6 * (n_params - T * C) + 12 * L * T * C  # 6 N without the position table, plus attention
    graded = check_training_flops_prediction(right, measured)
    assert graded and "FlopCounterMode counted" in graded.message and "this device measured" not in graded.message
    six_n = check_training_flops_prediction(6 * n_params, measured)
    assert not six_n and "no parameters" in six_n.message
    forward = check_training_flops_prediction(right / 3, measured)
    assert not forward and "forward pass only" in forward.message
    assert not check_training_flops_prediction(right * 1024, measured)
    assert not check_training_flops_prediction("a lot", measured)


def test_tied_head_check():
    assert check_tied_head(lambda h, w: h @ w.T * h.shape[-1] ** -0.5)
    unscaled = check_tied_head(lambda h, w: h @ w.T)
    # the message names the symptom (loss, the input token's probability), not the fix: still a diagnosis
    assert not unscaled and "probability" in unscaled.message and "ln 16" in unscaled.message
    assert "C^-1/2" not in unscaled.message and "sqrt(C)" not in unscaled.message and "Scale" not in unscaled.message
    assert not check_tied_head(lambda h, w: h @ w.T * h.shape[-1] ** 0.5)
    assert not check_tied_head(lambda h, w: h @ w.T / h.shape[-1])
    assert not check_tied_head(lambda h, w: w @ h)


def test_initial_loss_with_and_without_the_scale():
    scaled = initial_loss_with_head(lambda h, w: h @ w.T * h.shape[-1] ** -0.5)
    unscaled = initial_loss_with_head(lambda h, w: h @ w.T)
    assert abs(scaled - math.log(16)) < 0.35
    assert unscaled > math.log(16) + 2  # the input token wins: the review's 6.28
