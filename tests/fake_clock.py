"""A clock that moves only when told, for tests of code that times work: what they assert is then exact and
does not depend on how busy the machine is (STYLE.md, habit 16)."""


class FakeClock:
    """Stands in for the ``time`` module of the code under test (``monkeypatch.setattr(module, "time", clock)``):
    ``perf_counter`` and ``monotonic`` read it, ``sleep`` moves it on at once; with ``tick``, every reading also
    moves it on by that much (so that each timed piece of work lasts exactly one tick)."""

    def __init__(self, tick: float = 0.0) -> None:
        self.now, self.tick = 0.0, tick

    def perf_counter(self) -> float:
        self.now += self.tick
        return self.now

    monotonic = perf_counter

    def sleep(self, seconds: float) -> None:
        self.now += seconds
