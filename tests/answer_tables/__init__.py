"""Tables of right and plausible wrong answers for every graded exercise check (issue 30).

Each module of this package (one per topic module of ``gpuformer_lib.exercises``) defines ``TABLES``, a list of
:class:`Table`: a check, how to grade one answer with it, the answers that must pass, and at least three
plausible wrong answers, each of which must fail with a hint holding the key words that name its mistake.
``tests/test_answer_tables.py`` runs every row, and fails naming any check that a notebook calls without a
table here (the checks are found from the notebooks' code, not from a list kept by hand).

A row's key words are the hint's, not the check's generic text: a wrong answer that fails for another reason
(a crash, a placeholder) does not pass its row.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any, Callable

MIN_WRONG = 3
"""Plausible wrong answers each table needs at least."""


@dataclasses.dataclass(frozen=True)
class Wrong:
    """One plausible mistake: ``answer`` must fail with a hint containing every one of ``words`` (case-blind)."""

    mistake: str
    """What the learner got wrong, in a few words (the row's test id)."""
    answer: Any
    words: tuple[str, ...]
    marks: tuple[Any, ...] = ()
    """pytest marks of the row: ``pytest.mark.xfail(..., strict=True)`` for a row that a proposed fix of the check
    (not yet applied) makes fail with its hint, so that the fix, once applied, turns it into a failure to unmark."""

    def __post_init__(self):
        if isinstance(self.words, str) or not self.words or not all(isinstance(w, str) and w for w in self.words):
            raise ValueError(f"{self.mistake!r}: words is a tuple of the hint's key words, got {self.words!r}")
        if not isinstance(self.marks, tuple):
            raise ValueError(f"{self.mistake!r}: marks is a tuple of pytest marks, got {self.marks!r}")


@dataclasses.dataclass(frozen=True)
class Table:
    """The right and wrong answers of one check."""

    check: str
    """The public check's name, as the notebooks call it (``check_weights_memory``)."""
    grade: Callable[[Any], Any]
    """Grades one answer: calls the check (with whatever measurement or setting the notebook gives it)
    and returns its result."""
    right: tuple[Any, ...]
    wrong: tuple[Wrong, ...]

    def __post_init__(self):
        if not self.check.startswith("check_"):
            raise ValueError(f"{self.check!r} is not a check's name")
        if not self.right:
            raise ValueError(f"{self.check}: a table needs at least one right answer")
        if len(self.wrong) < MIN_WRONG:
            raise ValueError(f"{self.check}: {len(self.wrong)} wrong answers, at least {MIN_WRONG} needed")
        mistakes = [w.mistake for w in self.wrong]
        if len(set(mistakes)) != len(mistakes):
            raise ValueError(f"{self.check}: two wrong answers share a name: {mistakes}")


def _defining_topics(check: str) -> list[str]:
    """The modules of ``gpuformer_lib.exercises`` that define a public ``check`` of that name."""
    import gpuformer_lib.exercises as exercises

    topics = []
    for info in pkgutil.iter_modules(exercises.__path__):
        module = importlib.import_module(f"{exercises.__name__}.{info.name}")
        value = vars(module).get(check)
        if callable(value) and getattr(value, "__module__", "") == module.__name__:
            topics.append(info.name)
    return topics


def all_tables() -> dict[str, Table]:
    """Every table of every module of this package, by the check's qualified name, ``topic.check_name``, the topic
    being the module of ``gpuformer_lib.exercises`` that defines it (two topics define a ``check_padding_prediction``:
    chapter 7's in ``training``, chapter 14's in ``proteins``; a table of such a name lies in the module of this
    package named as its topic). A check with two tables is an error."""
    tables: dict[str, Table] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for table in getattr(module, "TABLES"):
            topics = _defining_topics(table.check)
            if info.name in topics or len(topics) != 1:
                topic = info.name  # a name no topic defines is reported by the test, under this module's name
            else:
                topic = topics[0]
            key = f"{topic}.{table.check}"
            if key in tables:
                raise ValueError(f"two tables for {key} (the second in {info.name})")
            tables[key] = table
    return tables
