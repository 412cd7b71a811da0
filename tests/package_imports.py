"""Which modules a piece of code imports, and which distributions an install brings: one copy, shared by
``test_packaging.py`` (what Colab's install brings each chapter) and ``test_requirements_book.py`` (what
``make book`` brings its build). Imported as ``from package_imports import ...`` (``tests/`` is on ``sys.path``)."""

import ast
import importlib.metadata
import re
import sys

from packaging.requirements import Requirement


def canonical(name: str) -> str:
    """A distribution's name as pip compares them: ``Foo_Bar.baz`` -> ``foo-bar-baz``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def imports(source: str) -> set[str]:
    """Absolute imports of ``source`` anywhere in it (functions included), dotted: ``import a.b`` gives ``a.b``,
    ``from a import b`` gives ``a`` and ``a.b``. IPython's ``%`` and ``!`` lines are skipped."""
    source = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return found


def third_party(modules: set[str]) -> set[str]:
    """The top-level names of ``modules`` that are not the standard library's."""
    return {m.split(".")[0] for m in modules} - set(sys.stdlib_module_names) - {"__future__"}


def installed_closure(names: set[str]) -> set[str]:
    """The installed distributions that ``names`` bring, themselves included (their dependencies whose markers
    hold here, without extras), canonical names."""
    seen, todo = set(), [canonical(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            dependencies = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for spec in dependencies:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonical(req.name))
    return seen
