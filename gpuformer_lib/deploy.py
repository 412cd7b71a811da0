"""Export for inference: ``torch.export``, ONNX export, and ONNX Runtime checked against eager PyTorch.

Covers, for the course's decoder-only language model (``model.DecoderLM``; any module that maps token
ids (B, T) to logits works):

- :func:`export_program`: ``torch.export.export`` with a dynamic batch B and length T, and
  :func:`check_exported`, the exported program run against eager at several shapes (max abs difference).
- :func:`export_onnx`: the ONNX file, written by ``torch.onnx.export(..., dynamo=True)`` from that
  exported program (the dynamo exporter converts an ``ExportedProgram`` as it is), weights inside the one
  file (``external_data=False``), into a folder the caller names or a fresh temporary one; an existing
  file is never overwritten.
- :func:`ort_session` (ONNX Runtime with ``CPUExecutionProvider``; with ``device="cuda"``,
  ``CUDAExecutionProvider`` first, and :func:`ort_providers` raises a clear error when the installed onnxruntime
  has none) and :func:`compare_onnx` (always on the CPU provider, against eager on the CPU):
  outputs against eager within a stated tolerance at two or more shapes, and latency, eager against ONNX
  Runtime, median of several repeats after warm-up, same inputs and the same number of CPU threads.

What does not export dynamically: the optional ``padding_mask`` (it defaults to None, which the exported
graph bakes in: batches must be unpadded or the mask applied outside), and lengths beyond the model's
``max_len`` (the range of T is [1, max_len]). Token-id range checks (``TokenEmbedding``'s) are skipped
while tracing, so an id out of range fails inside the exported gather, not with the eager message.

Leaves out: quantization and distillation (``compression``), TensorRT and other runtimes, and serving.
Needs ``onnx``, ``onnxscript`` and ``onnxruntime`` (``pip install onnx onnxscript onnxruntime``) for
the ONNX part only; ``torch.export`` is part of PyTorch. Where one is missing (a GPU node often has onnx
and onnxruntime but not onnxscript, which the dynamo exporter needs), :func:`onnx_missing` says which, so a
notebook can skip its ONNX cells with that message; the ONNX functions raise :class:`OnnxUnavailableError`
naming every missing package.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import tempfile
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from gpuformer_lib import bench

ONNX_TOLERANCE = 1e-4
"""Largest |ONNX Runtime - eager| accepted on float32 logits of order 1-10: ONNX Runtime's kernels sum in
other orders (and may fuse), so a few float32 ulps of the largest logit, about 1e-6 here, differ; 1e-4
leaves room for deeper models while a wrong graph (a missing mask, a wrong scale) differs by 0.1 or more."""

_INSTALL_HINT = "pip install onnx onnxscript onnxruntime (or: pip install -r requirements.txt)"


ONNX_PACKAGES = ("onnx", "onnxscript", "onnxruntime")


class OnnxUnavailableError(ImportError):
    """The ONNX part was asked for, and a package it needs cannot be imported here (the message names each)."""


def _import_failures() -> dict[str, ImportError]:
    failures = {}
    for name in ONNX_PACKAGES:
        try:
            importlib.import_module(name)
        except ImportError as error:
            failures[name] = error
    return failures


def onnx_missing() -> str | None:
    """None when ``onnx``, ``onnxscript`` and ``onnxruntime`` all import; else a sentence naming the missing ones
    and how to install them, for a notebook to print when it skips its ONNX cells."""
    failures = _import_failures()
    if not failures:
        return None
    return (f"the ONNX export and ONNX Runtime comparison need {', '.join(repr(n) for n in failures)}, which "
            f"{'is' if len(failures) == 1 else 'are'} not installed in this Python: {_INSTALL_HINT}")


def require_onnx() -> tuple[object, object]:
    """The ``onnx`` and ``onnxruntime`` modules, or an :class:`OnnxUnavailableError` (an ``ImportError``) naming
    every missing package and how to install them. ``onnxscript`` is checked too: the dynamo exporter needs it."""
    failures = _import_failures()
    if failures:
        raise OnnxUnavailableError(f"gpuformer_lib.deploy: {onnx_missing()}") from next(iter(failures.values()))
    return importlib.import_module("onnx"), importlib.import_module("onnxruntime")


def _check_ids(ids: Tensor, what: str = "ids") -> None:
    if not isinstance(ids, Tensor):
        raise TypeError(f"{what} must be a tensor of token ids (B, T), got {type(ids).__name__}")
    if ids.dim() != 2 or ids.shape[0] < 1 or ids.shape[1] < 1:
        raise ValueError(f"{what} must be token ids of shape (B, T) with B, T >= 1, got {tuple(ids.shape)}")
    if ids.dtype != torch.int64:
        raise ValueError(f"{what} must be torch.long token ids (the exported graph's input type), got {ids.dtype}: "
                         "use .long()")


def _max_len(model: nn.Module) -> int:
    config = getattr(model, "config", None)
    return int(getattr(config, "max_len", 4096))


torch_threads = bench.torch_threads  # kept under this name: deploy's callers use it


def export_program(model: nn.Module, example_ids: Tensor, *, dynamic: bool = True) -> torch.export.ExportedProgram:
    """``torch.export.export(model, (example_ids,))``: the model's forward as one graph of ATen operators,
    without Python. With ``dynamic`` the batch B (1 to 1024) and length T (1 to the model's ``max_len``)
    stay symbolic, so one program serves every shape in that range; without it the program accepts only
    ``example_ids``'s shape. The model is put in eval mode (dropout off) first; its ``padding_mask``
    argument is not exported (module docstring)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    _check_ids(example_ids, "example_ids")
    model.eval()
    dynamic_shapes = None
    if dynamic:
        batch = torch.export.Dim("batch", min=1, max=1024)
        length = torch.export.Dim("length", min=1, max=_max_len(model))
        dynamic_shapes = ({0: batch, 1: length},)
    with warnings.catch_warnings():  # pytree's LeafSpec FutureWarning, raised inside torch itself
        warnings.filterwarnings("ignore", message=".*LeafSpec", category=FutureWarning)
        return torch.export.export(model, (example_ids,), dynamic_shapes=dynamic_shapes)


@dataclasses.dataclass(frozen=True)
class ExportCheck:
    """The exported program against eager."""

    shapes: tuple[tuple[int, int], ...]
    """The (B, T) input shapes compared."""
    max_abs_diff: float
    """Largest |exported - eager| over all logits of all shapes."""


def check_exported(program: torch.export.ExportedProgram, model: nn.Module, inputs: Sequence[Tensor]) -> ExportCheck:
    """Run ``program`` and the eager ``model`` on each of ``inputs`` (token ids (B, T)); the largest
    absolute difference of their logits. The same ATen kernels run both, so it is 0 or a few ulps."""
    if not isinstance(program, torch.export.ExportedProgram):
        raise TypeError(f"program must be a torch.export.ExportedProgram (from export_program), got "
                        f"{type(program).__name__}")
    if not inputs:
        raise ValueError("inputs must hold at least one batch of token ids")
    exported, diff = program.module(), 0.0
    model.eval()
    with torch.no_grad():
        for ids in inputs:
            _check_ids(ids)
            diff = max(diff, (exported(ids) - model(ids)).abs().max().item())
    return ExportCheck(shapes=tuple((int(i.shape[0]), int(i.shape[1])) for i in inputs), max_abs_diff=diff)


def export_onnx(program: torch.export.ExportedProgram, out_dir: str | Path | None = None, *,
                name: str = "model.onnx", opset: int | None = None) -> Path:
    """Write ``program`` (from :func:`export_program`) as an ONNX model file ``out_dir / name``, weights
    included, and return its path. ``out_dir`` None makes a fresh temporary folder (the caller may delete
    it). Refuses to overwrite an existing file. ``opset`` None takes the exporter's default (read the
    file's with :func:`onnx_opset`)."""
    require_onnx()
    if not isinstance(program, torch.export.ExportedProgram):
        raise TypeError(f"program must be a torch.export.ExportedProgram (from export_program), got "
                        f"{type(program).__name__}")
    folder = Path(tempfile.mkdtemp(prefix="gpuformer_onnx_")) if out_dir is None else Path(out_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"out_dir {folder} is not an existing folder: create it first or pass None")
    path = folder / name
    if path.suffix != ".onnx":
        raise ValueError(f"name must end in .onnx, got {name!r}")
    if path.exists():
        raise FileExistsError(f"{path} exists already; export_onnx never overwrites a file: pass another name "
                              "or folder")
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)  # "torchvision is not installed. Skipping torchvision::nms", 4 times
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*LeafSpec", category=FutureWarning)
        try:
            torch.onnx.export(program, (), str(path), dynamo=True, external_data=False, opset_version=opset,
                              verbose=False)
        finally:
            registration.setLevel(level)
    return path


def onnx_opset(path: str | Path) -> int:
    """The default-domain (ai.onnx) opset version an ONNX file was written for."""
    onnx, _ = require_onnx()
    model = onnx.load(str(path), load_external_data=False)
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def ort_providers(device: torch.device | str = "cpu") -> list[str]:
    """Execution providers for an ONNX Runtime session on ``device``: ``["CPUExecutionProvider"]`` on the
    CPU; on ``cuda`` ``["CUDAExecutionProvider", "CPUExecutionProvider"]``, and a clear error when the
    installed onnxruntime has no CUDA provider (the ``onnxruntime-gpu`` package brings it)."""
    _, ort = require_onnx()
    kind = torch.device(device).type
    if kind == "cpu":
        return ["CPUExecutionProvider"]
    if kind != "cuda":
        raise ValueError(f"ONNX Runtime sessions here run on 'cpu' or 'cuda', not {kind!r}")
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        raise RuntimeError(f"this onnxruntime has no CUDAExecutionProvider (it has {available}): install "
                           "onnxruntime-gpu in place of onnxruntime, or use device='cpu'")
    return ["CUDAExecutionProvider", "CPUExecutionProvider"]


def ort_session(path: str | Path, *, threads: int = 1, device: torch.device | str = "cpu"):
    """An ``onnxruntime.InferenceSession`` for the file at ``path`` with ``threads`` intra-op threads."""
    _, ort = require_onnx()
    bench._check_count("threads", threads, 1)
    if not Path(path).is_file():
        raise FileNotFoundError(f"no ONNX file at {path}: write one with export_onnx")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=ort_providers(device))


def run_ort(session, ids: Tensor) -> np.ndarray:
    """Logits (B, T, V) from an ONNX Runtime session for token ids (B, T), as a NumPy array."""
    _check_ids(ids)
    return session.run(None, {session.get_inputs()[0].name: ids.cpu().numpy()})[0]


@dataclasses.dataclass(frozen=True)
class OnnxComparison:
    """An exported ONNX model run by ONNX Runtime against eager PyTorch: what chapter 16 glues."""

    shapes: tuple[tuple[int, int], ...]
    """The (B, T) input shapes compared (two or more: the dynamic dimensions at work)."""
    max_abs_diff: float
    """Largest |ONNX Runtime - eager| over all logits of all shapes."""
    tolerance: float
    """The bound it is held to (:data:`ONNX_TOLERANCE` unless the caller gave another)."""
    eager_ms: float
    """Median eager forward time (no_grad, eval) on the first shape, milliseconds."""
    ort_ms: float
    """Median ONNX Runtime time on the same inputs, milliseconds."""
    threads: int
    """CPU threads both ran with (PyTorch's intra-op threads, ONNX Runtime's intra_op_num_threads)."""
    repeats: int
    """Timed repeats each median is taken over (after warm-up)."""
    file_bytes: int
    """Size of the .onnx file (weights included)."""
    opset: int
    """The ai.onnx opset of the file."""
    provider: str
    """The execution provider that ran it."""
    path: str
    """Where the file is."""
    comparison: bench.Comparison
    """Eager (the baseline) against "ONNX Runtime", timed in interleaved rounds (:func:`gpuformer_lib.bench.compare`):
    a page's words about which is faster come from its ``verdict`` and ``phrase()``."""

    @property
    def speedup(self) -> float:
        """Eager time / ONNX Runtime time: above 1 means ONNX Runtime is faster."""
        return self.comparison.speedup

    @property
    def within_tolerance(self) -> bool:
        return self.max_abs_diff <= self.tolerance


def compare_onnx(model: nn.Module, inputs: Sequence[Tensor], *, path: str | Path | None = None,
                 program: torch.export.ExportedProgram | None = None, out_dir: str | Path | None = None,
                 tolerance: float = ONNX_TOLERANCE, threads: int = 1, warmup: int = 3, repeats: int = 10
                 ) -> OnnxComparison:
    """Export ``model`` to ONNX (unless ``path`` names a file already written from it), run it with ONNX
    Runtime on every batch of ``inputs`` (token ids (B, T), two or more shapes to show the dynamic
    dimensions), compare with eager, and time both on ``inputs[0]`` through :func:`gpuformer_lib.bench.compare`:
    ``warmup`` untimed calls of each, then at least ``repeats`` interleaved rounds (medians), PyTorch and ONNX
    Runtime both on ``threads`` CPU threads. ``program`` reuses an
    exported program from :func:`export_program`. Raises if the difference exceeds ``tolerance``."""
    require_onnx()
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not inputs:
        raise ValueError("inputs must hold at least one batch of token ids (two shapes show dynamic dimensions)")
    for ids in inputs:
        _check_ids(ids)
    if not tolerance > 0:
        raise ValueError(f"tolerance must be positive, got {tolerance}")
    model.eval()
    if path is None:
        program = program if program is not None else export_program(model, inputs[0])
        path = export_onnx(program, out_dir)
    session = ort_session(path, threads=threads)
    diff = 0.0
    with torch.no_grad(), torch_threads(threads):
        for ids in inputs:
            diff = max(diff, float(np.abs(run_ort(session, ids) - model(ids).numpy()).max()))
        if diff > tolerance:
            raise AssertionError(f"ONNX Runtime differs from eager by {diff:.3g}, more than the tolerance "
                                 f"{tolerance:.3g}: the export changed the computation")
        ids = inputs[0]
        comparison = bench.compare({"eager": lambda: model(ids), "ONNX Runtime": lambda: run_ort(session, ids)},
                                   warmup=warmup, repeats=repeats)["ONNX Runtime"]
        eager, ort_time = comparison.timings["eager"], comparison.timings["ONNX Runtime"]
    return OnnxComparison(shapes=tuple((int(i.shape[0]), int(i.shape[1])) for i in inputs), max_abs_diff=diff,
                          tolerance=tolerance, eager_ms=eager.median * 1e3, ort_ms=ort_time.median * 1e3,
                          threads=threads, repeats=repeats, file_bytes=Path(path).stat().st_size,
                          opset=onnx_opset(path), provider=session.get_providers()[0], path=str(path),
                          comparison=comparison)
