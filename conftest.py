"""pytest hooks for the whole repository: time every notebook nbval runs and report it against its budget.

On a CPU a chapter notebook aims at 3 minutes (the course plan's budget; ``GPUFORMER_NOTEBOOK_BUDGET_S``
changes it). Budgets are a report, not a test: CI machines are noisy, so a notebook over budget is only
flagged. A gross overrun, ``GPUFORMER_NOTEBOOK_OVERRUN`` times the budget (default 3), fails the run:
that is a notebook whose sizes are wrong, not a slow machine. Under a rehearsed profile
(``GPUFORMER_REHEARSE``) the report names it.

Under pytest-xdist (``make test``: ``-n 2 --dist loadfile``) the files are handed out longest first, so that the
two workers finish together: the notebooks by the seconds their stored run took (``make outputs`` records them
in the notebook's metadata), then the test files, most tests first (xdist's own order). xdist's default hands
out every file by its number of tests, which put chapter 10, the longest notebook, last.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

import pytest

_seconds: dict[str, float] = defaultdict(float)


def _budget_s() -> float:
    return float(os.environ.get("GPUFORMER_NOTEBOOK_BUDGET_S", "180"))


def _overrun() -> float:
    return float(os.environ.get("GPUFORMER_NOTEBOOK_OVERRUN", "3"))


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep the order set below
        config.option.loadscopereorder = False


def _stored_seconds(path) -> float:
    """The seconds the notebook's stored run took (``make outputs``), 0 where it has none."""
    try:
        with open(path, encoding="utf-8") as f:
            return float(json.load(f)["metadata"]["gpuformer"]["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    if not hasattr(config, "workerinput"):  # only the order xdist's workers report matters; a plain run keeps its own
        return
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    def longest_first(path: str) -> tuple:
        if path.endswith(".ipynb"):
            return 0, -_stored_seconds(config.rootpath / path)
        return 1, -len(files[path])

    items[:] = [item for path in sorted(files, key=longest_first) for item in files[path]]


# Rehearsal reads (``make rehearse``): with $GPUFORMER_PROFILE_READS naming a folder, each notebook's kernel, and
# the processes it starts, note the rehearsed profile's fields they read in a folder of the notebook's own,
# <folder>/<notebook stem>/ (see gpuformer_lib.profiles.PROFILE_READS_ENV). The variable is set for the kernel
# before nbval starts it, in the setup of the notebook's first cell.
_PROFILE_READS_ENV = "GPUFORMER_PROFILE_READS"
_reads_root = os.environ.get(_PROFILE_READS_ENV)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    path = item.nodeid.split("::", 1)[0]
    if _reads_root and path.endswith(".ipynb"):
        os.environ[_PROFILE_READS_ENV] = os.path.join(_reads_root, os.path.splitext(os.path.basename(path))[0])


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    if path.endswith(".ipynb"):
        _seconds[path] += report.duration


def _gross(seconds: float) -> bool:
    budget = _budget_s()
    return bool(budget) and seconds > _overrun() * budget


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not _seconds:
        return
    budget = _budget_s()
    profile = os.environ.get("GPUFORMER_REHEARSE")
    terminalreporter.section(f"time per notebook{f' (rehearsing {profile})' if profile else ''}")
    for path, seconds in sorted(_seconds.items()):
        flag = ""
        if budget and seconds > budget:
            flag = "  GROSS OVERRUN (fails the run)" if _gross(seconds) else "  over budget (reported only)"
        terminalreporter.write_line(f"{seconds:7.1f} s  {path}{flag}")
    terminalreporter.write_line(f"{sum(_seconds.values()):7.1f} s  all notebooks (budget {budget:.0f} s each, "
                                f"a run fails only past {_overrun():g}x)")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    gross = [p for p, s in _seconds.items() if _gross(s)]
    if gross and session.exitstatus == 0:
        print(f"\nnotebooks over {_overrun():g} x their {_budget_s():.0f} s budget: {', '.join(gross)}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
