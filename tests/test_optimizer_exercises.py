"""Prediction checks of chapter 6 (gpuformer_lib.exercises.optimizers) beyond their tables of right and wrong
answers (``tests/answer_tables/optimizers.py``): answers of the wrong kind, bad author input."""

import math

import pytest
import torch

from gpuformer_lib.exercises.optimizers import check_adamw_state_prediction, check_initial_loss_prediction


def test_initial_loss_prediction_answers_of_the_wrong_kind(capsys):
    assert check_initial_loss_prediction(math.log(16), 2.80, 16)
    assert "2.8 nats, shown beside the model, not graded" in capsys.readouterr().out
    assert not check_initial_loss_prediction(None, 2.80, 16)
    assert not check_initial_loss_prediction("ln 16", 2.80, 16)
    assert not check_initial_loss_prediction(-2.77, 2.80, 16)


@pytest.mark.parametrize("vocab_size, smoothing", [(1, 0.0), (16.0, 0.0), (16, 1.0), (16, -0.1)])
def test_initial_loss_prediction_refuses_bad_author_input(vocab_size, smoothing):
    with pytest.raises(ValueError):
        check_initial_loss_prediction(2.77, 2.80, vocab_size, label_smoothing=smoothing)


def test_adamw_state_prediction_follows_the_parameters_dtype(capsys):
    n = 12_345
    assert check_adamw_state_prediction(8 * n, 8 * n, n_parameters=n)
    assert check_adamw_state_prediction(4 * n, 4 * n, n_parameters=n, dtype=torch.float16)
    assert not check_adamw_state_prediction(8 * n, 4 * n, n_parameters=n, dtype=torch.float16)
    capsys.readouterr()
    assert not check_adamw_state_prediction(float("nan"), 8 * n, n_parameters=n)
    assert "positive number" in capsys.readouterr().out


@pytest.mark.parametrize("n_parameters, dtype", [(0, torch.float32), (True, torch.float32), (10, "bf16")])
def test_adamw_state_prediction_refuses_bad_author_input(n_parameters, dtype):
    with pytest.raises(ValueError):
        check_adamw_state_prediction(8, 8, n_parameters=n_parameters, dtype=dtype)
