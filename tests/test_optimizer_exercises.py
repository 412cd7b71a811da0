"""Predict-then-measure checks of chapter 6 (gpuformer_lib.exercises.optimizers)."""

import math

from gpuformer_lib.exercises.optimizers import check_adamw_state_prediction, check_initial_loss_prediction


def test_initial_loss_prediction(capsys):
    assert check_initial_loss_prediction(math.log(16), 2.80, 16)
    assert not check_initial_loss_prediction(math.log2(16), 2.80, 16)  # bits, not nats: too high
    assert "ln V" in capsys.readouterr().out
    assert not check_initial_loss_prediction(math.log10(16), 2.80, 16)
    assert "nats" in capsys.readouterr().out
    assert not check_initial_loss_prediction(None, 2.80, 16)
    assert not check_initial_loss_prediction("ln 16", 2.80, 16)


def test_adamw_state_prediction(capsys):
    n = 12_345
    assert check_adamw_state_prediction(8 * n, 8 * n)
    assert not check_adamw_state_prediction(16 * n, 8 * n)
    assert "weights" in capsys.readouterr().out
    assert not check_adamw_state_prediction(4 * n, 8 * n)
    assert "SGD with momentum" in capsys.readouterr().out
    assert not check_adamw_state_prediction(float("nan"), 8 * n)
