"""Every graded check that a notebook of chapters 0-12 and 16 calls passes its right answers and fails each
plausible wrong one with the hint that names the mistake (``tests/answer_tables``; issue 30)."""

from __future__ import annotations

import importlib
import json
import pkgutil
import re

import pytest

import gpuformer_lib.exercises as exercises_package
from answer_tables import MIN_WRONG, all_tables
from notebook_pages import NOTEBOOKS

CASE_STUDY_CHAPTERS = ("13", "14", "15")
"""Chapters whose checks belong to the case-study issue (their own tables come with it)."""

TABLES = all_tables()
CALL = re.compile(r"\b(check_\w+)\s*\(")


def exercise_checks() -> dict[str, str]:
    """Every public ``check_*`` of ``gpuformer_lib.exercises``, by name, with the module that defines it."""
    found: dict[str, str] = {}
    for info in pkgutil.iter_modules(exercises_package.__path__):
        module = importlib.import_module(f"{exercises_package.__name__}.{info.name}")
        for name, value in vars(module).items():
            if name.startswith("check_") and callable(value) and getattr(value, "__module__", "") == module.__name__:
                found[name] = info.name
    return found


def graded_checks_of_notebooks() -> dict[str, set[str]]:
    """The exercise checks each notebook's code calls, by check name: the chapters that call it."""
    checks = exercise_checks()
    called: dict[str, set[str]] = {}
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        chapter = path.name[:2]
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] != "code":
                continue
            for match in CALL.finditer("".join(cell["source"])):
                if match.group(1) in checks:
                    called.setdefault(match.group(1), set()).add(chapter)
    return called


def test_the_notebooks_are_found_and_call_checks():
    called = graded_checks_of_notebooks()
    assert len(called) >= 50 and "check_weights_memory" in called and "check_bubble_prediction" in called


def test_every_graded_check_has_a_table_of_wrong_answers():
    """The count of checks called by chapters 0-12 and 16 without a table here is 0."""
    needed = {name for name, chapters in graded_checks_of_notebooks().items()
              if not chapters <= set(CASE_STUDY_CHAPTERS)}
    missing = sorted(needed - set(TABLES))
    assert not missing, f"{len(missing)} graded checks have no table of wrong answers: {missing}"
    assert all(len(TABLES[name].wrong) >= MIN_WRONG for name in needed)


def test_tables_name_real_checks():
    checks = exercise_checks()
    assert not sorted(set(TABLES) - set(checks))


ROWS = [pytest.param(name, answer, id=f"{name}-right{index}")
        for name, table in TABLES.items() for index, answer in enumerate(table.right)]
WRONG_ROWS = [pytest.param(name, wrong, id=f"{name}-{wrong.mistake}")
              for name, table in TABLES.items() for wrong in table.wrong]


@pytest.mark.parametrize("name, answer", ROWS)
def test_right_answer_passes(capsys, name, answer):
    result = TABLES[name].grade(answer)
    printed = capsys.readouterr().out
    assert result, f"{name} refused a right answer: {printed}"
    assert "✅" in printed


@pytest.mark.parametrize("name, wrong", WRONG_ROWS)
def test_wrong_answer_fails_with_its_hint(capsys, name, wrong):
    result = TABLES[name].grade(wrong.answer)
    printed = capsys.readouterr().out
    assert not result, f"{name} passed a wrong answer ({wrong.mistake}): {printed}"
    assert "❌" in printed
    missing = [word for word in wrong.words if word.lower() not in printed.lower()]
    assert not missing, f"{name}, {wrong.mistake}: the hint lacks {missing}: {printed}"
