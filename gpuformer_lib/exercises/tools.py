"""Checks for the exercises of chapter 16 (the tools and what comes next).

- :func:`check_int8_size_prediction`: predict, then compare; how many times smaller a checkpoint gets when the
  ``nn.Linear`` weights go from float32 to int8, predicted from the share of parameters in those layers
  (``compression.linear_share``), graded against the model 1 / ((1 - s) + s / 4), with the size
  ``compression.compare_quantization`` measured shown beside it.
- :func:`check_graph_break_fixed`: diagnosis; a function whose Python ``if`` on a tensor's value splits it into
  two graphs, rewritten so that ``toolchain.graph_breaks`` finds one graph and no break, with the same outputs.
- :func:`check_wheel_for_driver`: diagnosis; a stack report that shows a CPU-only wheel on a machine whose driver
  supports CUDA 12.4: the PyTorch index URL that gives a working GPU build (a tag PyTorch publishes,
  ``toolchain.PYTORCH_CUDA_INDEXES``, no newer than the driver's CUDA), with a hint per wrong kind of answer.
"""

from __future__ import annotations

import re
from typing import Callable

import torch

from gpuformer_lib.exercises._core import CheckResult, _describe, _report, _run_limited, _safe_check, _try


def predicted_int8_size_ratio(linear_share: float) -> float:
    """The model answer: fp32 bytes / int8 bytes when a share ``s`` of the parameters drops from 4 bytes to 1 and
    the rest stays at 4: 4 / (4 (1 - s) + s) = 1 / ((1 - s) + s / 4). Scales and packing add a little."""
    if not 0.0 <= linear_share <= 1.0:
        raise ValueError(f"linear_share is a share in [0, 1], got {linear_share!r}")
    return 1.0 / ((1.0 - linear_share) + linear_share / 4.0)


def check_int8_size_prediction(predicted, measured: float, *, linear_share: float) -> CheckResult:
    """Predict how many times smaller the checkpoint gets (float32 bytes / int8 bytes) when the ``nn.Linear``
    weights, ``linear_share`` of the parameters, go from float32 to int8: graded against the model
    :func:`predicted_int8_size_ratio` within 1 % (two decimals), not against ``measured`` (torch.save of both
    state dicts), which is shown beside it: a band around the measurement passed a round guess of 2x. The
    usual mistakes get their own hints: every weight int8 (4x), the ratio upside down, 2-byte weights taken
    for float32, the linear layers' bytes dropped entirely, the share of bytes saved, and a guess of 2x."""
    from gpuformer_lib.exercises.predictions import grade_model

    right = predicted_int8_size_ratio(linear_share)  # raises on a share outside [0, 1]: the notebook's bug
    s = linear_share
    kept = (1 - s) + s / 4  # int8 bytes / float32 bytes
    formula = "1 / ((1 - s) + s / 4)"
    wrong = {
        "every weight in int8": (
            4.0, f"Only the nn.Linear weights become int8, {s:.0%} of the parameters here; embeddings, layer "
                 "norms, the fused Q/K/V projection and the output layer stay float32. A ratio near 4 assumes every "
                 "weight shrinks: the untouched share dominates."),
        "int8 / float32, the ratio upside down": (
            kept, f"That is the int8 checkpoint's size over the float32 one's, (1 - s) + s / 4: the question asks "
                  f"how many times smaller, float32 / int8 = {formula}, not (1 - s) + s / 4."),
        "the share of bytes saved": (
            1 - kept, "That is the share of the bytes saved, 3 s / 4; the question asks how many times smaller the "
                      "checkpoint gets, float32 bytes / int8 bytes."),
        "weights of 2 bytes (float16) taken for float32": (
            1 / ((1 - s) + s / 2), "The model is float32: 4 bytes a weight, so an int8 weight is 4 times smaller, "
                                   "not 2."),
        "a guess of 2x (int8 halves the checkpoint)": (
            2.0, f"2x is not what the model gives: an int8 weight is 1 byte instead of float32's 4, and only the "
                 f"share s = {s:.2f} in nn.Linear shrinks. Compute {formula} from s."),
    }
    if s < 1:
        wrong["the linear layers' bytes dropped entirely"] = (
            1 / (1 - s), "The linear weights do not vanish: each still takes 1 byte of its 4, so the checkpoint "
                         "keeps (1 - s) + s / 4 of its bytes.")
    return grade_model(
        predicted, right, quantity="checkpoint size, float32 / dynamic int8", unit="x",
        wrong={k: v for k, v in wrong.items() if abs(v[0] / right - 1) > 0.025}, rel=0.01,
        too_high=(f"Only the nn.Linear weights, s = {s:.2f} of the parameters, shrink fourfold; the rest stays "
                  f"float32. Compute {formula} from s = quant.quantized_share, to two decimals (the measured size "
                  "also holds the scales and headers the model leaves out)."),
        too_low=(f"Each int8 weight takes 1 byte instead of 4: the share s = {s:.2f} of the parameters in linear "
                 f"layers shrinks fourfold. Compute {formula} from s = quant.quantized_share, to two decimals (the "
                 "measured size also holds the scales and headers the model leaves out)."),
        measured=measured, measured_by="torch.save of both state dicts measured",
        why_close=("What is left between the model and the measurement: one float scale (and zero point) per "
                   "quantized tensor, the packed-weight format's headers, and torch.save's own bookkeeping. For a "
                   "large model whose linear layers hold most weights the ratio approaches 4; weight-only int4 on a "
                   "GPU approaches 8 the same way."))


def _reference_break_free(x: torch.Tensor) -> torch.Tensor:
    """What ``clip_if_large`` computes: x scaled down to a maximum of 1 where its largest |value| exceeds 1."""
    peak = x.abs().max()
    return torch.where(peak > 1, x / peak, x)


@_safe_check
def check_graph_break_fixed(fn: Callable[[torch.Tensor], torch.Tensor]) -> CheckResult:
    """``fn(x)``: the notebook's ``clip_if_large`` without its graph break: ``toolchain.graph_breaks`` must find one
    graph and no break, and the outputs must equal the reference's on inputs above and below the threshold (one
    of them clipped by its largest |value|, a negative one, where its largest value is below 1)."""
    from gpuformer_lib.toolchain import graph_breaks

    g = torch.Generator().manual_seed(0)
    # one is clipped, one is not, and one is clipped by its largest |value|, a negative one (not its largest value)
    inputs = (torch.randn(64, generator=g) * 3, torch.rand(64, generator=g) * 0.5,
              -(torch.rand(64, generator=g) * 2 + 1))
    for x in inputs:
        got, hint = _try(fn, x)
        if hint:
            return _report(False, hint)
        if not isinstance(got, torch.Tensor) or got.shape != x.shape:
            return _report(False, f"Return a tensor of the input's shape {tuple(x.shape)}, not {_describe(got)}.")
        if not torch.allclose(got, _reference_break_free(x), rtol=1e-5, atol=1e-6):
            return _report(False, "The outputs differ from the original function's: scale by the largest |value| "
                                  "only where it exceeds 1, and return x unchanged otherwise. torch.where(cond, a, b) "
                                  "computes both a and b and picks one per element.")
    from torch import _dynamo  # before the time limit starts: an import it interrupted would stay broken

    try:  # Dynamo runs the learner's function again, traced: under the time limit (6 x, for the tracing)
        found, hint = _run_limited(graph_breaks, fn, inputs[0], time_scale=6.0, what="Tracing your function")
    except Exception as err:  # noqa: BLE001  the learner's function may not trace at all
        return _report(False, f"torch._dynamo.explain could not trace your function: {type(err).__name__}: {err}")
    finally:
        _dynamo.reset()  # also after a trace the time limit stopped half-way
    if hint:
        return _report(False, hint)
    if found.breaks:
        reasons = "; ".join(found.reasons) or "no reason recorded"
        return _report(False, f"Dynamo still finds {found.breaks} break(s) ({found.graphs} graphs): {reasons}. "
                              "A Python `if` on a tensor's value needs that value on the host (.item(), bool(), "
                              "float()): Dynamo must stop the graph to read it. Make the choice inside the graph "
                              "with torch.where, on tensors, without asking Python which branch to take.")
    return _report(True, f"One graph, no break ({found.graphs} graph). torch.where keeps the decision on the device: "
                         "both branches are computed, one is selected per element, and the compiler can fuse the "
                         "whole function into one kernel. On a GPU the original also paid a device-to-host "
                         "synchronisation per call for the .item().")


_INDEX = re.compile(r"^https://download\.pytorch\.org/whl/(cpu|cu(\d\d)(\d)|rocm[\d.]+)/?$")  # cu124: CUDA 12.4


@_safe_check
def check_wheel_for_driver(index_url, *, driver_cuda: str = "12.4") -> CheckResult:
    """``index_url``: the ``--index-url`` for ``pip install torch`` on the machine of the exercise: a CPU-only wheel
    installed, an NVIDIA driver that supports CUDA up to ``driver_cuda``. A published tag (cu124, not cu122) no
    newer than the driver's CUDA passes; an older one than the newest that fits passes with a note to pin its
    (older) newest torch."""
    major, minor = (int(p) for p in driver_cuda.split(".")[:2])
    if not isinstance(index_url, str):
        return _report(False, f"Answer with the index URL as a string, e.g. 'https://download.pytorch.org/whl/cpu', "
                              f"not {_describe(index_url)}.")
    m = _INDEX.match(index_url.strip())
    if not m and _INDEX.match(index_url.split()[-1] if index_url.split() else ""):
        return _report(False, "Give the index URL alone (what --index-url takes), not the whole pip command.")
    if not m and "pypi" in index_url.lower():
        newer = (major, minor) < (12, 8)
        return _report(False, "PyPI's torch for Linux is built for one CUDA, a recent one (12.8 or later)"
                              + (f", newer than the {driver_cuda} this driver serves: it would not use the GPU."
                                 if newer else ", whichever the release chose.")
                              + " Take the tag that fits the driver from https://download.pytorch.org/whl/<build>.")
    if not m:
        return _report(False, "PyTorch's wheels live at https://download.pytorch.org/whl/<build>, where <build> is "
                              "cpu, cu<major><minor> (cu126, cu128, ...) or rocm<version>. Give such a URL.")
    build = m.group(1)
    if build == "cpu":
        return _report(False, "That is the wheel the machine already has: torch runs on the CPU and never sees the "
                              "GPU the driver reports. Pick a CUDA build.")
    if build.startswith("rocm"):
        return _report(False, "ROCm builds are for AMD GPUs; the driver in this report is NVIDIA's (NVML answers).")
    from gpuformer_lib.toolchain import PYTORCH_CUDA_INDEXES, wheel_index_for_driver

    best = wheel_index_for_driver(driver_cuda)
    best_words = (f"{best[0]} (torch {best[1]} is the newest release built for it)" if best else
                  "none: update the driver")
    if build not in PYTORCH_CUDA_INDEXES:
        return _report(False, f"PyTorch publishes no {build} index: pip would find no torch there. The CUDA tags it "
                              f"publishes are {', '.join(PYTORCH_CUDA_INDEXES)}; the newest this driver runs is "
                              f"{best_words}.")
    wheel, newest = PYTORCH_CUDA_INDEXES[build]
    if wheel[0] > major:
        return _report(False, f"{build} is CUDA {wheel[0]}.{wheel[1]}, a newer major version than the driver's CUDA "
                              f"{driver_cuda}: torch would say \"The NVIDIA driver on your system is too old\" and "
                              f"run on the CPU. Update the driver, or choose {best_words}.")
    if wheel[0] == major and wheel[1] > minor:
        return _report(False, f"{build} ships CUDA {wheel[0]}.{wheel[1]}, newer than the {driver_cuda} the driver "
                              "supports: its prebuilt kernels would mostly run (minor-version compatibility), but "
                              "PTX the driver must compile would not. Update the driver, or choose "
                              f"{best_words}.")
    if best and build != best[0]:
        return _report(True, f"{build} (CUDA {wheel[0]}.{wheel[1]}) runs on this driver, but its newest torch is "
                             f"{newest}: pin it (pip install 'torch=={newest}.*' ...), or pip quietly installs that "
                             f"old release. {best[0]} is the newest tag this driver runs.")
    return _report(True, f"{build}: CUDA {wheel[0]}.{wheel[1]} on a driver that supports {driver_cuda}, the newest "
                         f"tag it runs; torch {newest} is the newest release built for it, so pin "
                         f"'torch=={newest}.*' (a newer torch is not on this index). The wheel pulls in its own CUDA "
                         "runtime, cuBLAS, cuDNN and NCCL as nvidia-* pip packages; the driver is the only NVIDIA "
                         "piece the machine needs. Updating the driver is the other fix, and the one that keeps "
                         "new torch releases within reach.")
