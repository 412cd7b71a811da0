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


def test_a_timing_is_measured_alike_whatever_the_prediction():
    """A timing is measured ``attempts`` times and graded against the median: never re-measured until it
    agrees with the prediction (a wrong answer could pass on a lucky timing), never graded on one slow outlier."""
    for predicted in (10.0, 100.0, None):
        timings = iter([40.0, 10.0, 11.0])  # one of three several times too slow
        calls = []

        def measure():
            calls.append(1)
            return next(timings)

        result = grade_prediction(predicted, measure, quantity="q", unit="ms", within=1.5, too_high="HIGH")
        assert len(calls) == 3
        assert bool(result) == (predicted == 10.0)
        if predicted is not None:
            assert "median of 3" in result.message and "11 ms" in result.message
    assert "HIGH" in grade_prediction(100.0, lambda: 10.0, quantity="q", unit="ms", within=1.5,
                                      too_high="HIGH").message
    once = grade_prediction(10.0, lambda: 10.0, quantity="q", unit="ms", within=1.5, attempts=1)
    assert once and "median" not in once.message


def test_where_the_number_came_from_is_named():
    result = grade_prediction(10.0, 10.0, quantity="q", unit="FLOP", measured_by="FlopCounterMode counted")
    assert "FlopCounterMode counted 10" in result.message
