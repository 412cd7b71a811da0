"""What every exercise check shares: the result type, printing, and calling the learner's code safely."""

from __future__ import annotations

import math
from typing import Any, Callable


class CheckResult:
    """The outcome of a check: truthy if it passed; ``message`` is what was printed."""

    def __init__(self, passed: bool, message: str):
        self.passed = passed
        self.message = message

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return f"CheckResult(passed={self.passed}, message={self.message!r})"

    def _ipython_display_(self) -> None:
        """Show nothing more in a notebook: the check has printed its message already."""


def _report(ok: bool, message: str) -> CheckResult:
    text = ("✅ Correct. " if ok else "❌ Not yet. ") + message
    print(text)
    return CheckResult(ok, text)


def _try(fn: Callable[..., Any], *args: Any) -> tuple[Any, str | None]:
    try:
        return fn(*args), None
    except NotImplementedError:
        return None, "The function still raises NotImplementedError: replace that line with your code."
    except Exception as err:  # the learner's code may raise anything; show it, don't crash
        return None, f"Your function raised {type(err).__name__}: {err} (for arguments {args})."


def _close(a: Any, b: float, rel: float = 1e-6) -> bool:
    try:
        return math.isclose(float(a), b, rel_tol=rel)
    except (TypeError, ValueError):
        return False
