"""What `pip install gpuformer-lib` (Colab's set-up cell) brings: every module the notebooks import, and a torch
floor no lower than the APIs the library calls (findings B8, B9, B17)."""

import ast
import json
import re
import sys
import tomllib

from gpuformer_lib.tools.notebooks import REPO_ROOT, notebook_paths

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
    names = set()
    for source in _sources():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"gpuformer_lib"}


def test_the_package_declares_what_the_notebooks_import():
    missing = {n for n in imported_by_notebooks() - PROVIDED if DISTRIBUTION.get(n, n).lower() not in declared()}
    assert not missing, f"notebooks import {sorted(missing)}, which pyproject.toml does not declare"


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
