"""The predict-then-measure grader: passes within the factor, says which way and by how much it missed."""

import pytest
import torch

from gpuformer_lib.exercises.predictions import grade_prediction


def grade(predicted, measured=10.0, **kw):
    return grade_prediction(predicted, measured, quantity="the time of a 2048^3 product", unit="ms", within=1.5,
                            too_high="HIGH-HINT", too_low="LOW-HINT", why_close="CLOSE-NOTE", **kw)


def test_within_the_factor_passes_and_explains_the_rest(capsys):
    assert grade(12.0) and grade(7.0) and grade(torch.tensor(10.0))
    assert "CLOSE-NOTE" in capsys.readouterr().out


@pytest.mark.parametrize("predicted, hint, ratio", [(16.0, "HIGH-HINT", "1.6x"), (6.0, "LOW-HINT", "1.7x")])
def test_a_miss_says_which_way_and_why(predicted, hint, ratio):
    result = grade(predicted)
    assert not result and hint in result.message and ratio in result.message


@pytest.mark.parametrize("answer", [None, "12", -3.0, 0.0, float("nan"), torch.ones(2), True])
def test_a_non_answer_is_a_hint_not_a_crash(answer):
    result = grade(answer)
    assert not result and "Not yet" in result.message


@pytest.mark.parametrize("measured, within", [(-1.0, 2.0), (0.0, 2.0), (1.0, 1.0), (1.0, float("nan"))])
def test_a_bad_measurement_or_tolerance_is_the_notebook_s_error(measured, within):
    with pytest.raises(ValueError):
        grade_prediction(1.0, measured, quantity="q", unit="s", within=within)
