"""Every graded check that a notebook calls passes its right answers and fails each plausible wrong one with the
hint that names the mistake (``tests/answer_tables``; issue 30, the case studies' chapters 13-15 in issue 31)."""

from __future__ import annotations

import importlib
import json
import pkgutil
import re

import pytest

import gpuformer_lib.exercises as exercises_package
from answer_tables import MIN_WRONG, all_tables
from notebook_pages import NOTEBOOKS

TABLES = all_tables()
"""By the check's qualified name, ``topic.check_name`` (``heads.check_kv_cache_prediction``)."""
CALL = re.compile(r"\b(check_\w+)\s*\(")
IMPORT = re.compile(r"from\s+gpuformer_lib\.exercises(?:\.(\w+))?\s+import\s+(\([^)]*\)|[^\n]+)")


def exercise_checks() -> dict[str, str]:
    """Every public ``check_*`` of ``gpuformer_lib.exercises``, by qualified name (``topic.check_name``), with its
    bare name."""
    found: dict[str, str] = {}
    for info in pkgutil.iter_modules(exercises_package.__path__):
        module = importlib.import_module(f"{exercises_package.__name__}.{info.name}")
        for name, value in vars(module).items():
            if name.startswith("check_") and callable(value) and getattr(value, "__module__", "") == module.__name__:
                found[f"{info.name}.{name}"] = name
    return found


def _imported_from(code: str) -> dict[str, str]:
    """The topic module each ``check_*`` that ``code`` imports from ``gpuformer_lib.exercises`` comes from."""
    topics: dict[str, str] = {}
    for match in IMPORT.finditer(code):
        for item in match.group(2).strip("()").split(","):
            name = item.split("#")[0].strip().split(" as ")[0].strip()
            if name.startswith("check_"):
                topic = match.group(1) or getattr(exercises_package, name).__module__.rsplit(".", 1)[1]
                topics[name] = topic
    return topics


def graded_checks_of_notebooks() -> dict[str, set[str]]:
    """The exercise checks each notebook's code calls, by qualified name: the chapters that call it. A name that
    two topics define (``check_padding_prediction``) is the one the notebook imports."""
    checks = exercise_checks()
    topics_of: dict[str, list[str]] = {}
    for qualified, name in checks.items():
        topics_of.setdefault(name, []).append(qualified.split(".")[0])
    called: dict[str, set[str]] = {}
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        chapter = path.name[:2]
        cells = ["".join(cell["source"]) for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]
                 if cell["cell_type"] == "code"]
        imported = _imported_from("\n".join(cells))
        for code in cells:
            for match in CALL.finditer(code):
                name = match.group(1)
                if name not in topics_of:
                    continue
                topic = imported.get(name) or (topics_of[name][0] if len(topics_of[name]) == 1 else None)
                assert topic in topics_of[name], f"{path.name} calls {name}, defined in {topics_of[name]}: " \
                                                 "which one it imports is not found"
                called.setdefault(f"{topic}.{name}", set()).add(chapter)
    return called


def test_the_notebooks_are_found_and_call_checks():
    called = graded_checks_of_notebooks()
    assert len(called) >= 50 and "hardware.check_weights_memory" in called
    assert "model_parallel.check_bubble_prediction" in called
    # two topics define check_padding_prediction: chapter 7 calls training's, chapter 14 proteins'
    assert called["training.check_padding_prediction"] == {"07"}
    assert called["proteins.check_padding_prediction"] == {"14"}


def test_every_graded_check_has_a_table_of_wrong_answers():
    """The count of checks called by the notebooks (the case studies' chapters 13-15 included) without a table
    here is 0."""
    needed = set(graded_checks_of_notebooks())
    missing = sorted(needed - set(TABLES))
    assert not missing, f"{len(missing)} graded checks have no table of wrong answers: {missing}"
    assert all(len(TABLES[name].wrong) >= MIN_WRONG for name in needed)


def test_tables_name_real_checks():
    checks = exercise_checks()
    assert not sorted(set(TABLES) - set(checks))


ROWS = [pytest.param(name, answer, id=f"{name}-right{index}")
        for name, table in TABLES.items() for index, answer in enumerate(table.right)]
WRONG_ROWS = [pytest.param(name, wrong, id=f"{name}-{wrong.mistake}", marks=wrong.marks)
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
