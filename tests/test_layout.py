"""The package docstring's map of the library is true: every module is in exactly one part, a module imports
only from its own part and the parts below it (imports inside functions included), and no modules import each
other in a circle."""

from __future__ import annotations

import re

import gpuformer_lib
from gpuformer_lib.tools.notebooks import REPO_ROOT
from package_imports import imports

LIBRARY = REPO_ROOT / "gpuformer_lib"


def parts(docstring: str) -> dict[str, int]:
    """``{module: part number}`` from the docstring's numbered list of parts."""
    found: dict[str, int] = {}
    for number, body in re.findall(r"^(\d+)\. [^:\n]+:(.*?)(?=^\d+\. |\n\n)", docstring, re.M | re.S):
        for name in re.findall(r"``([\w.]+)``", body):
            assert name not in found, f"{name} is in parts {found[name]} and {number}"
            found[name] = int(number)
    return found


def top_level(path) -> str:
    """The library's top-level name a file belongs to: ``bench`` for bench.py, ``tools`` for tools/grade.py."""
    return path.relative_to(LIBRARY).parts[0].removesuffix(".py")


def library_imports(path) -> set[str]:
    """The library's top-level names that ``path`` imports, anywhere in it (a subpackage's relative imports of
    its own modules left out)."""
    return {name.split(".")[1] for name in imports(path.read_text()) if name.startswith("gpuformer_lib.")}


def modules() -> dict[str, set[str]]:
    """``{top-level name: library names it imports}``, a subpackage's files taken together."""
    graph: dict[str, set[str]] = {}
    for path in sorted(LIBRARY.rglob("*.py")):
        if path.parent == LIBRARY and path.name == "__init__.py":
            continue
        name = top_level(path)
        graph.setdefault(name, set()).update(library_imports(path) - {name})
    return graph


def test_every_module_is_in_exactly_one_part():
    mapped, graph = parts(gpuformer_lib.__doc__), modules()
    assert set(mapped) == set(graph), (f"not in the map: {sorted(set(graph) - set(mapped))}; "
                                       f"in the map but not a module: {sorted(set(mapped) - set(graph))}")


def test_a_module_imports_only_from_its_part_and_below():
    mapped, graph = parts(gpuformer_lib.__doc__), modules()
    upward = [f"{name} (part {mapped[name]}) imports {dep} (part {mapped[dep]})"
              for name, deps in graph.items() for dep in sorted(deps) if mapped[dep] > mapped[name]]
    assert not upward, "\n".join(upward)


def test_no_modules_import_each_other_in_a_circle():
    graph = modules()
    state: dict[str, int] = {}
    circles = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(graph.get(name, ())):
            if state.get(dep) == 1:
                circles.append(" -> ".join(path[path.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, path + [dep])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, circles


def test_the_map_check_catches_an_upward_import_and_a_missing_module():
    doc = gpuformer_lib.__doc__
    moved = doc.replace("``bench``,", "", 1).replace("``viz``,", "``viz``, ``bench``,", 1)
    mapped = parts(moved)
    assert mapped["bench"] == 8 and any(mapped[name] < 8 and "bench" in deps for name, deps in modules().items())
    assert "bench" not in parts(doc.replace("``bench``,", "", 1))
