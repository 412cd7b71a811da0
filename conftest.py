"""pytest hooks for the whole repository: time every notebook nbval runs and hold it to its budget.

On a CPU a chapter notebook must finish in 3 minutes (the course plan's budget); set
``GPUFORMER_NOTEBOOK_BUDGET_S`` to change that, or to 0 to switch the check off.
"""

from __future__ import annotations

import os
from collections import defaultdict

import pytest

_seconds: dict[str, float] = defaultdict(float)


def _budget_s() -> float:
    return float(os.environ.get("GPUFORMER_NOTEBOOK_BUDGET_S", "180"))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    if path.endswith(".ipynb"):
        _seconds[path] += report.duration


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not _seconds:
        return
    budget = _budget_s()
    terminalreporter.section("time per notebook")
    for path, seconds in sorted(_seconds.items()):
        flag = "  OVER BUDGET" if budget and seconds > budget else ""
        terminalreporter.write_line(f"{seconds:7.1f} s  {path}{flag}")
    terminalreporter.write_line(f"{sum(_seconds.values()):7.1f} s  all notebooks (budget {budget:.0f} s each)")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    budget = _budget_s()
    slow = [p for p, s in _seconds.items() if budget and s > budget]
    if slow and session.exitstatus == 0:
        import torch

        if not torch.cuda.is_available():  # the budget is for the CPU path
            print(f"\nnotebooks over their {budget:.0f} s CPU budget: {', '.join(slow)}")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
