"""The case studies' intervals: a statistic, its bounds, what it excludes, and bounds that cannot be."""

import pytest

from gpuformer_lib.intervals import Interval


def test_an_interval_excludes_what_lies_outside_it():
    gap = Interval(0.0248, 0.0008, 0.0558, 0.95)
    assert gap.excludes(0.0) and gap.excludes(0.06)
    assert not gap.excludes(0.0008) and not gap.excludes(0.03) and not gap.excludes(0.0558)
    assert not Interval(0.5, -0.4, 3.0, 0.95).excludes(0.0)  # holds 0: the data cannot separate the two


@pytest.mark.parametrize("low, high, level", [(1.0, 0.5, 0.95), (0.0, 1.0, 1.0), (0.0, 1.0, 0.0), (0.0, 1.0, 95)])
def test_impossible_intervals_are_refused(low, high, level):
    with pytest.raises(ValueError):
        Interval(0.5, low, high, level)


def test_the_case_studies_share_it():
    from gpuformer_lib import ltsf, retrieval  # noqa: F401 (retrieval imports it inside its bootstrap)

    assert ltsf.Interval is Interval
