"""gpuformer_lib: the helper library of the course *GPU-Accelerated Transformer Training*.

One concept per module (see the course plan). The modules in eight parts, bottom to top; a module imports
only from its own part and the parts below it (the ones above may import it), nothing imports from notebooks or
tests, and no two modules import each other (``tests/test_layout.py`` checks this map against the files and
their imports, at any depth):

1. Hardware, timing and intervals: ``_checks``, ``rng``, ``hardware``, ``profiles``, ``device``, ``gpu``,
   ``bench``, ``intervals``, ``device_checks``, ``device_measurements``, ``rank_ends``, ``distributed``.
2. Sources and results: ``published_figures``, ``published``, ``gpu_results``.
3. The Transformer and its data: ``attention``, ``layers``, ``rope``, ``model``, ``model_sizes``,
   ``losses``, ``clipping``, ``checkpoint``, ``fp8``, ``speed``, ``data``, ``packing``, ``generate``.
4. Predictions and views: ``predict`` (the one home of every predicted GPU time: the step-time predictor
   itself, and beside it in the package the roofline with a GPU's datasheet roofs, predict.roofline, and the
   costs built from the predictor's pieces, predict.layer_cost, predict.optimizer_cost,
   predict.collective_costs and predict.parallel_costs), ``gpu_view``, ``memory``, ``activation_accounting``,
   ``occupancy``, ``bottlenecks``.
5. Kernels, attention on a GPU and decoding: ``kernels``, ``tiled_attention``, ``kv_cache``,
   ``seq2seq_decoding``, ``mixed_precision``.
6. Training and parallelism: ``train``, ``lr_search``, ``ladder``, ``prefetch``, ``context_parallel``,
   ``sequence_parallel``, ``pipeline_orders``, ``pipeline_schedules``, ``expert_parallel``.
7. Case studies and after training: ``case_study``, ``translation_task``, ``retrieval`` (chapter 13's
   baseline and its scores), ``proteins``, ``forecasting``, ``ltsf``, ``toolchain``, ``deploy``, ``compression``.
8. The course's machinery: ``figures``, ``viz``, ``diagrams``, ``drawings``, ``book_run``, ``exercises``, ``gpu_suite``,
   ``tools``, ``workers``.

``device`` re-exports the names of ``hardware`` and ``profiles`` for the notebooks.

Shape vocabulary, used in a comment on every reshape and matrix product in the library:

    B   batch size
    T   tokens in a sequence (sequence length)
    C   model width (d_model)
    H   number of attention heads
    hs  head size, C // H
    V   vocabulary size

Matrix-product sizes follow BLAS: ``(M, K) @ (K, N) -> (M, N)``.

Importing the package itself imports nothing (tools such as ``gpuformer_lib.tools.fslock`` need no torch). A
module that needs a package this Python lacks, torch most often, raises :class:`MissingDependencyError`, which
says to use the course's environment instead of a bare ``No module named 'torch'``.
"""

__version__ = "0.1.0"

import os
import sys
from importlib.machinery import PathFinder


class MissingDependencyError(ModuleNotFoundError):
    """A library module could not be imported because a package it needs (torch, most often) is missing from this
    Python: the plain ``No module named 'torch'`` says nothing of the course's environment, this says where it is.
    ``name`` is still the missing package's, as for the error it replaces."""


def _missing_dependency_hint(missing: str, module: str) -> str:
    repo = os.path.dirname(os.path.abspath(__path__[0]))
    if missing.split(".")[0] == "torch":
        install = 'install PyTorch into this Python as the README\'s "Getting PyTorch" section says'
    else:
        install = f"install the course's requirements into this Python: pip install -r {repo}/requirements.txt"
    return (f"No module named {missing!r}: {module} needs it, and this Python ({sys.executable}) does not have it. "
            f"Use the course's environment: {repo}/.venv/bin/python, or `make lab` (which creates .venv and installs "
            f"everything); or {install}")


class _HintingLoader:
    """The loader of a library module, which rewrites a missing third-party package into
    :class:`MissingDependencyError`; everything else (source, resources) is the wrapped loader's."""

    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):
        if name == "_loader":  # not set yet (a copy being made): no endless recursion
            raise AttributeError(name)
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        try:
            self._loader.exec_module(module)
        except ModuleNotFoundError as err:
            if isinstance(err, MissingDependencyError) or not err.name or err.name.split(".")[0] == __name__:
                raise  # already explained by a module further down, or a library module itself is missing
            raise MissingDependencyError(_missing_dependency_hint(err.name, module.__name__), name=err.name,
                                         path=err.path).with_traceback(err.__traceback__) from None


class _LibraryModuleFinder:
    """Finds ``gpuformer_lib.*`` exactly as Python would (``PathFinder`` on the package's ``__path__``), with the
    loader wrapped. It hooks the library's own modules, not ``torch``: ``importlib.util.find_spec("torch")``, with
    which other code asks whether torch is there, still answers None, and importing this package imports nothing
    (tools that need no torch, such as ``gpuformer_lib.tools.fslock``, stay fast)."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if path is None or not fullname.startswith(__name__ + "."):
            return None
        spec = PathFinder.find_spec(fullname, path, target)
        if spec is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _HintingLoader(spec.loader)
        return spec


if not any(type(finder).__qualname__ == _LibraryModuleFinder.__qualname__ and type(finder).__module__ == __name__
           for finder in sys.meta_path):  # once, even if this package is reloaded
    sys.meta_path.insert(0, _LibraryModuleFinder())
