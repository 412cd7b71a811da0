"""The one way a page times a comparison (``bench.compare``): interleaved rounds, and a verdict that the
rounds' spread, not one run, decides. Every test runs on a clock of its own, so what it asserts is exact
whatever the machine's load (no timing verdict is ever asserted on a real clock)."""

import itertools

import pytest

from fake_clock import FakeClock
from gpuformer_lib import bench


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(bench, "time", fake)
    return fake


def work(clock, seconds):
    """A function that takes ``seconds`` per call, from an iterable (one value per call) or a number."""
    values = iter(seconds) if not isinstance(seconds, (int, float)) else itertools.repeat(seconds)
    return lambda: clock.sleep(next(values))


def test_a_clear_gap_is_faster_and_the_words_come_from_the_rounds(clock):
    result = bench.compare({"loop": work(clock, 0.03), "vectorized": work(clock, 0.01)}, warmup=0)
    vectorized = result["vectorized"]
    assert vectorized.verdict == "faster" and vectorized.speedup == pytest.approx(3.0)
    assert vectorized.phrase() == "3.00x faster than loop"
    assert len(vectorized.ratios) == 7 and "median of 7 interleaved rounds" in str(vectorized)
    slower = bench.compare({"fast": work(clock, 0.01), "slow": work(clock, 0.015)}, warmup=0)["slow"]
    assert slower.verdict == "slower" and slower.phrase() == "1.50x slower than fast"


def test_a_gap_inside_the_spread_is_no_difference(clock):
    # the candidate wins some rounds and loses others: the medians differ by 5 %, the rounds by up to 40 %
    base = [0.010, 0.012, 0.010, 0.012, 0.010, 0.012, 0.010]
    cand = [0.012, 0.009, 0.012, 0.009, 0.0095, 0.0105, 0.0095]
    result = bench.compare({"a": work(clock, base), "b": work(clock, cand)}, warmup=0, wide=10.0)["b"]
    assert result.verdict == "no difference we can see"
    assert result.phrase().startswith("no faster or slower than a that we can see")


def test_a_tiny_steady_gap_is_not_a_finding(clock):
    result = bench.compare({"a": work(clock, 0.0100), "b": work(clock, 0.0099)}, warmup=0)["b"]
    assert all(r > 1 for r in result.ratios) and result.verdict == "no difference we can see"


def test_one_slow_round_does_not_decide(clock):
    # one round of the candidate is hit by the machine's load; the other rounds all show it 2x faster
    cand = [0.005, 0.005, 0.05, 0.005, 0.005, 0.005, 0.005]
    result = bench.compare({"a": work(clock, 0.01), "b": work(clock, cand)}, warmup=0, wide=100.0)["b"]
    assert result.verdict == "faster" and result.speedup == pytest.approx(2.0)


def test_rounds_alternate_their_order(clock):
    order = []
    fns = {name: (lambda name=name: order.append(name)) for name in ("a", "b", "c")}
    bench.time_interleaved(fns, warmup=0, repeats=5)
    assert order[:6] == ["a", "b", "c", "c", "b", "a"] and len(order) == 15


def test_a_wide_spread_gets_more_rounds_up_to_the_limit(clock):
    noisy = itertools.cycle([0.01, 0.03])
    timings = bench.time_interleaved({"a": work(clock, noisy), "b": work(clock, 0.01)}, warmup=0,
                                     repeats=5, max_repeats=9)
    assert len(timings["a"].times) == 9
    steady = bench.time_interleaved({"a": work(clock, 0.01), "b": work(clock, 0.01)}, warmup=0, repeats=5)
    assert len(steady["a"].times) == 5


def test_the_time_limit_stops_adding_rounds_but_never_below_five(clock):
    noisy = itertools.cycle([0.5, 1.5])
    timings = bench.time_interleaved({"a": work(clock, noisy), "b": work(clock, 1.0)}, warmup=0,
                                     repeats=5, max_repeats=21, max_seconds=0.1)
    assert len(timings["a"].times) == 5


def test_warm_up_calls_are_not_timed(clock):
    calls = []
    bench.compare({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, warmup=3, repeats=5)
    assert calls.count("a") == 3 + 5


@pytest.mark.parametrize("fns, kwargs", [
    ({"a": lambda: None}, {}),
    ({"a": lambda: None, "b": 3}, {}),
    ({"a": lambda: None, "b": lambda: None}, {"repeats": 4}),
    ({"a": lambda: None, "b": lambda: None}, {"baseline": "c"}),
    ({"a": lambda: None, "b": lambda: None}, {"min_gap": -0.1}),
])
def test_bad_arguments_raise(fns, kwargs):
    with pytest.raises((TypeError, ValueError)):
        bench.compare(fns, **kwargs)


def test_verdicts_are_the_three_named_words(clock):
    seen = {bench.compare({"a": work(clock, a), "b": work(clock, b)}, warmup=0)["b"].verdict
            for a, b in ((0.02, 0.01), (0.01, 0.02), (0.01, 0.01))}
    assert seen == set(bench.VERDICTS)


def test_a_large_slowdown_prints_its_digits(clock):
    result = bench.compare({"a": work(clock, 0.001), "b": work(clock, 0.5)}, warmup=0)["b"]
    assert result.phrase() == "500.00x slower than a" and "0.00200x-0.00200x" in str(result)
    assert "500 ms against 1 ms" in str(result)  # 0.999999 ms rounds to 1 ms, not "1e+03 µs"
