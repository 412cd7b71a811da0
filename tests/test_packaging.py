"""What `pip install gpuformer-lib` (Colab's set-up cell) brings: every module the notebooks import, and a torch
floor no lower than the APIs the library calls (findings B8, B9, B17)."""

import ast
import importlib.metadata
import json
import re
import subprocess
import sys
import textwrap
import tomllib

import pytest

from gpuformer_lib.tools.notebooks import REPO_ROOT, code_cells, notebook_paths, read_notebook
from package_imports import canonical, imports, installed_closure, third_party

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
# import name -> distribution name, where they differ
DISTRIBUTION = {"yaml": "pyyaml", "pynvml": "nvidia-ml-py", "IPython": "ipython"}
# provided by Jupyter / Colab itself, or by torch's CUDA wheels
PROVIDED = {"IPython", "ipywidgets", "myst_nb", "triton", "google"}


def declared() -> set[str]:
    project = PYPROJECT["project"]
    specs = project["dependencies"] + [s for extra in project["optional-dependencies"].values() for s in extra]
    return {re.split(r"[<>=!;\[ ]", s, maxsplit=1)[0].strip().lower() for s in specs}


def _sources():
    for path in notebook_paths():
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":
                yield "\n".join(l for l in "".join(cell["source"]).splitlines() if not l.lstrip().startswith(("%", "!")))
    for path in (REPO_ROOT / "gpuformer_lib").rglob("*.py"):  # the library's imports, lazy ones included
        yield path.read_text()


def imported_by_notebooks() -> set[str]:
    """Third-party modules the notebooks import, directly or through the library."""
    return {name for source in _sources() for name in third_party(imports(source))} - {"gpuformer_lib"}


def test_the_package_declares_what_the_notebooks_import():
    missing = {n for n in imported_by_notebooks() - PROVIDED if DISTRIBUTION.get(n, n).lower() not in declared()}
    assert not missing, f"notebooks import {sorted(missing)}, which pyproject.toml does not declare"


# Modules a chapter reaches that the package's own dependencies do not install, beyond PROVIDED, and why a learner
# on Colab has them or the chapter runs without them.
OPTIONAL = {
    "pynvml": "the gpu extra (nvidia-ml-py), read only on an NVIDIA GPU and skipped where it is missing",
    "psutil": "a dependency where there is no /proc (not Linux); Colab ships it",
    "nbformat": "the tools extra: imported only by the tools that read notebook files, inside their functions",
    "yaml": "the tools extra: imported only by the tools that read _toc.yml, inside their functions",
}


def _library_file(module: str):
    path = REPO_ROOT.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def reached_modules(source: str) -> set[str]:
    """Top-level third-party modules that ``source`` imports, directly or through the library's modules (their
    imports anywhere in the file, functions included, relative ones followed), plus the ONNX packages that
    ``deploy`` imports by name."""
    seen, third, todo = set(), set(), list(imports(source))
    while todo:
        module = todo.pop()
        if module.split(".")[0] != "gpuformer_lib":
            third |= third_party({module})
            continue
        path = _library_file(module)
        if path is None or path in seen:
            continue
        seen.add(path)
        text = path.read_text(encoding="utf-8")
        if path.stem == "deploy":
            from gpuformer_lib.deploy import ONNX_PACKAGES

            third |= set(ONNX_PACKAGES)
        todo += imports(text)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                base = path.parent
                for _ in range(node.level - 1):
                    base = base.parent
                package = ".".join(base.relative_to(REPO_ROOT).parts)
                module = package + (f".{node.module}" if node.module else "")
                todo += [module, *(f"{module}.{a.name}" for a in node.names)]
    return third


def installed_by_the_package() -> set[str]:
    """Top-level modules of the package's dependencies (pyproject.toml, no extras) and of what they require."""
    from packaging.requirements import Requirement

    dists = installed_closure({Requirement(d).name for d in PYPROJECT["project"]["dependencies"]})
    return {module for module, names in importlib.metadata.packages_distributions().items()
            if any(canonical(n) in dists for n in names)}


@pytest.mark.parametrize("path", notebook_paths(), ids=lambda p: p.name)
def test_what_a_chapter_imports_is_installed_by_its_first_cell(path):
    """The first cell installs the package, which brings its dependencies, not its extras: every module the
    chapter reaches is one of them, or provided (PROVIDED) or optional (OPTIONAL); chapter 16's ONNX packages are
    dependencies, so Colab has them."""
    code = "\n".join(c.source for c in code_cells(read_notebook(path)))
    missing = reached_modules(code) - installed_by_the_package() - PROVIDED - set(OPTIONAL)
    assert not missing, f"{path.name} imports {sorted(missing)}, which its first cell does not install"


def test_the_import_check_follows_the_library():
    assert {"onnx", "onnxscript", "onnxruntime"} <= reached_modules("from gpuformer_lib import deploy")
    assert "sacrebleu" in reached_modules("from gpuformer_lib import generate")
    assert reached_modules("import pandas\nimport json") == {"pandas"}
    assert "pandas" not in installed_by_the_package()


def test_sacrebleu_is_a_dependency_and_nvml_an_extra():
    deps = PYPROJECT["project"]["dependencies"]
    assert any(d.startswith("sacrebleu") for d in deps)
    assert any(d.startswith("nvidia-ml-py") for d in PYPROJECT["project"]["optional-dependencies"]["gpu"])


def test_the_torch_floor_covers_the_apis_used():
    """torch.OutOfMemoryError is 2.5+, the public torch.distributed.fsdp.fully_shard 2.6+."""
    floors = [re.search(r"torch>=([\d.]+)", text).group(1)
              for text in (" ".join(PYPROJECT["project"]["dependencies"]), (REPO_ROOT / "requirements.txt").read_text())]
    for floor in floors:
        assert tuple(int(p) for p in floor.split(".")[:2]) >= (2, 6), f"torch>={floor} is too low"
    assert floors[0] == floors[1], "pyproject.toml and requirements.txt disagree on the torch floor"


def stated_torch_floors(text: str) -> set[tuple[int, ...]]:
    """Every torch floor a text states: ``torch>=X.Y`` and, in prose, 'torch X.Y or later'."""
    found = re.findall(r"torch>=([\d.]+)", text) + re.findall(r"torch ([\d.]+) or later", text)
    return {tuple(int(p) for p in v.strip(".").split(".")[:2]) for v in found}


def test_the_torch_floor_is_stated_alike_everywhere_and_met_by_the_torch_ci_tests():
    """The floor is the oldest torch the tests have run on: requirements.txt, pyproject.toml, the README and the
    install page state one and the same (before: 2.6 in all four, a torch no test had run on), and the torch
    .ci/run installs meets it."""
    texts = {"pyproject.toml": " ".join(PYPROJECT["project"]["dependencies"])}
    for name in ("requirements.txt", "README.md", "book/install.md"):
        texts[name] = (REPO_ROOT / name).read_text()
    floors = {name: stated_torch_floors(text) for name, text in texts.items()}
    assert all(len(f) == 1 for f in floors.values()), f"each file states one torch floor: {floors}"
    assert len(set.union(*floors.values())) == 1, f"the files disagree on the torch floor: {floors}"
    floor = next(iter(floors["requirements.txt"]))
    assert floor == (2, 11), "the floor is what the tests have run on: 2.11, where the GPU suite and tests passed (an H200)"
    from gpuformer_lib.toolchain import COURSE_TORCH_FLOOR, _wheel_advice
    assert tuple(map(int, COURSE_TORCH_FLOOR.split("."))) == floor, "chapter 16's advice states another floor"
    assert "this course needs torch 2.11 or newer" in _wheel_advice("12.4")  # its newest wheel: torch 2.6
    assert "this course needs" not in _wheel_advice("13.0")
    ci = re.search(r"torch==(\d+)\.(\d+)", (REPO_ROOT / ".ci" / "run").read_text())
    assert ci and (int(ci.group(1)), int(ci.group(2))) >= floor, "CI installs a torch below the stated floor"


def run_without_site_packages(code: str) -> subprocess.CompletedProcess:
    """``code`` in this Python without its site-packages (-S) or environment (-I): a Python without torch, as a plain
    ``python3`` is, that imports the library from the repository as one started inside it does."""
    prelude = f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r})\n"
    return subprocess.run([sys.executable, "-I", "-S", "-c", prelude + textwrap.dedent(code)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)


def test_a_python_without_torch_is_told_to_use_the_courses_environment():
    done = run_without_site_packages('''
        import importlib.util, sys
        import gpuformer_lib, gpuformer_lib.tools.fslock  # tools that need no torch import without it
        assert "torch" not in sys.modules and importlib.util.find_spec("torch") is None  # asking still answers None
        try:
            from gpuformer_lib import attention
        except ModuleNotFoundError as err:
            print(err.name, type(err).__name__, err, sep="\\n")
        try:
            import gpuformer_lib.no_such_module  # a library module that does not exist is not a missing dependency
        except ModuleNotFoundError as err:
            print(type(err).__name__, err)
    ''')
    assert done.returncode == 0, done.stderr
    name, kind, message, not_a_dependency = done.stdout.strip().split("\n")
    assert name == "torch" and kind == "MissingDependencyError"
    assert message.startswith("No module named 'torch': gpuformer_lib.attention needs it")
    assert f"{REPO_ROOT}/.venv/bin/python" in message and "`make lab`" in message and '"Getting PyTorch"' in message
    assert not_a_dependency == "ModuleNotFoundError No module named 'gpuformer_lib.no_such_module'"


def test_the_library_modules_load_as_before_with_the_import_hook():
    """The hook wraps the library's loaders: source, resources and `python -m` must see what they saw."""
    import importlib.resources
    import inspect

    from gpuformer_lib import attention, viz

    assert type(attention.__loader__).__name__ == "_HintingLoader"
    assert "def scaled_dot_product_attention" in inspect.getsource(attention)
    assert "function" in importlib.resources.files("gpuformer_lib").joinpath("js/memory_calculator.js").read_text()
    assert (importlib.resources.files("gpuformer_lib.workers") / "data_parallel.py").is_file()
    done = subprocess.run([sys.executable, "-m", "gpuformer_lib.ladder", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "--overwrite" in done.stdout, done.stderr
    assert viz.__spec__.loader.get_source("gpuformer_lib.viz") == (REPO_ROOT / "gpuformer_lib" / "viz.py").read_text()
