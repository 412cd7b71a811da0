"""`make book`, the first command a newcomer runs, installs only what building the book needs: requirements-book.txt,
no torch (a 6 GB CUDA build from PyPI on Linux) and no library, since the book shows the notebooks' stored outputs
and never executes them. Its lines are written as in requirements.txt, which `make test`, `make lab` and the rest
install; what the book's build imports (its Sphinx extensions) comes from those packages."""

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuformer_lib.tools.notebooks import REPO_ROOT
from package_imports import canonical, imports, installed_closure, third_party

yaml = pytest.importorskip("yaml", reason="PyYAML comes with jupyter-book (make test installs it)")
requirements = pytest.importorskip("packaging.requirements", reason="packaging comes with pip's tools and Sphinx")

BOOK = REPO_ROOT / "requirements-book.txt"
FULL = REPO_ROOT / "requirements.txt"
NEVER_FOR_THE_BOOK = {"torch", "triton", "gpuformer-lib"}


def requirement_lines(text: str) -> list[str]:
    """The requirement lines of a requirements file, comments and blank lines dropped, spaces removed."""
    lines = (line.split("#", 1)[0] for line in text.splitlines())
    return ["".join(line.split()) for line in lines if line.strip()]


def book_requirements_problems(book_text: str, full_text: str) -> list[str]:
    """What is wrong with requirements-book.txt against requirements.txt, in words; [] when nothing is."""
    found = []
    full = {canonical(requirements.Requirement(line).name): line for line in requirement_lines(full_text)}
    for line in requirement_lines(book_text):
        name = canonical(requirements.Requirement(line).name)
        if name in NEVER_FOR_THE_BOOK:
            found.append(f"{line}: the book's build needs no {name} (make book must not install it)")
        elif name not in full:
            found.append(f"{line}: not in requirements.txt, which make test installs (the book is tested there)")
        elif full[name] != line:
            found.append(f"{line}: requirements.txt says {full[name]} (write the two alike)")
    if "jupyter-book" not in {canonical(requirements.Requirement(l).name) for l in requirement_lines(book_text)}:
        found.append("jupyter-book is missing: make book runs it")
    return found


def test_the_book_requirements_agree_with_requirements_txt_and_name_no_torch():
    assert book_requirements_problems(BOOK.read_text(), FULL.read_text()) == []


@pytest.mark.parametrize("edit, hint", [
    (lambda t: t + "torch>=2.11\n", "needs no torch"),
    (lambda t: t + "triton>=3.0; sys_platform == 'linux'\n", "needs no triton"),
    (lambda t: t.replace("sphinx-book-theme==1.2.0", "sphinx-book-theme==1.3.0"), "requirements.txt says"),
    (lambda t: t.replace("myst-nb>=1.1", "myst-nb"), "requirements.txt says"),
    (lambda t: t + "sphinx-autobuild>=2024\n", "not in requirements.txt"),
    (lambda t: t.replace("jupyter-book>=1,<2", ""), "jupyter-book is missing"),
])
def test_book_requirements_that_drift_are_refused(edit, hint):
    found = book_requirements_problems(edit(BOOK.read_text()), FULL.read_text())
    assert any(hint in problem for problem in found), found


def library_sources(modules: set[str]) -> list[Path]:
    """The source files of the library's modules among ``modules`` and of every library module they import in
    turn (the package's ``__init__`` too): what the build loads from the checkout, not from an installed library."""
    todo = sorted(m for m in modules if m.split(".")[0] == "gpuformer_lib")
    seen: dict[str, Path] = {}
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for depth in range(1, len(parts) + 1):
            dotted = ".".join(parts[:depth])
            base = REPO_ROOT.joinpath(*parts[:depth])
            path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
            if dotted in seen or not path.is_file():
                continue
            seen[dotted] = path
            todo += [m for m in imports(path.read_text()) if m.split(".")[0] == "gpuformer_lib"]
    return sorted(set(seen.values()))


def modules_the_build_imports() -> set[str]:
    """Top-level modules the book's build loads beyond jupyter-book's own: the extensions _config.yml names, what
    the local extensions (book/_ext) import, and what the library modules they load from the checkout import (the
    GPU views are drawn with gpuformer_lib.gpu_results, which must need no torch)."""
    config = yaml.safe_load((REPO_ROOT / "_config.yml").read_text())
    sphinx = config.get("sphinx", {})
    modules = {name.split(".")[0] for name in sphinx.get("extra_extensions", [])}
    for name, folder in sphinx.get("local_extensions", {}).items():
        found = imports((REPO_ROOT / folder / f"{name}.py").read_text())
        modules |= third_party(found)
        for path in library_sources(found):
            modules |= third_party(imports(path.read_text()))
    return modules - set(sys.stdlib_module_names) - {"gpuformer_lib"}


def test_the_build_loads_only_library_modules_that_need_nothing_installed():
    """The extension draws the GPU views with the checkout's gpuformer_lib.gpu_results; it and what it imports
    from the library (the package's __init__, published, published_figures) import the standard library only."""
    extension = imports((REPO_ROOT / "book" / "_ext" / "gpuformer_book.py").read_text())
    sources = library_sources(extension)
    assert REPO_ROOT / "gpuformer_lib" / "gpu_results.py" in sources
    for path in sources:
        assert third_party(imports(path.read_text())) <= {"gpuformer_lib"}, \
            f"{path.name} imports {sorted(third_party(imports(path.read_text())) - {'gpuformer_lib'})}"


def test_what_the_build_imports_comes_with_the_book_requirements_and_brings_no_torch():
    book = {canonical(requirements.Requirement(line).name) for line in requirement_lines(BOOK.read_text())}
    closure = installed_closure(book)
    assert "jupyter-book" in closure and "sphinx" in closure, "run in the course's environment (make test)"
    assert not closure & NEVER_FOR_THE_BOOK, f"the book's requirements bring {sorted(closure & NEVER_FOR_THE_BOOK)}"
    assert "numpy" not in closure, "the book's requirements now bring numpy: does the build import the library?"
    providers = importlib.metadata.packages_distributions()
    for module in modules_the_build_imports():
        assert module != "torch", "the book's build imports torch: make book installs none"
        dists = {canonical(d) for d in providers.get(module, [])}
        assert dists & closure, f"the build imports {module} ({sorted(dists)}), which requirements-book.txt lacks"


def dry_run(target: str, tmp_path: Path) -> str:
    """What `make -n target` would run, in a copy of the Makefile and the files its rules depend on, without a
    virtual environment."""
    for name in ("Makefile", "requirements.txt", "requirements-book.txt", "pyproject.toml"):
        shutil.copyfile(REPO_ROOT / name, tmp_path / name)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # under `make test`
    done = subprocess.run(["make", "-n", "--no-print-directory", target, "PYTHON=python3"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_book_installs_the_book_requirements_with_progress_and_the_rest_install_everything(tmp_path):
    book = dry_run("book", tmp_path)
    installs = [line for line in book.splitlines() if "pip install" in line]
    assert installs and all("-r requirements-book.txt" in line for line in installs), book
    assert not any("--quiet" in line or " -q " in line for line in installs), "a first make book shows its progress"
    assert "requirements.txt" not in book.replace("requirements-book.txt", "") and "-e ." not in book, book
    assert "jupyter-book build" in book
    for target in ("test", "lab", "outputs"):
        assert "-r requirements.txt" in dry_run(target, tmp_path), f"make {target} no longer installs everything"
