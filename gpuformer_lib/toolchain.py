"""The software under PyTorch and the tools that look inside it: what this build reports, what is wrong with it,
what the compiler does, and what determinism costs.

Covers:

- :func:`stack_report`: the layers this torch build reports (build kind, CUDA runtime, HIP, cuDNN, NCCL, Triton,
  the CPU's vector instructions, oneDNN/MKL, threads, MPS) and, on an NVIDIA machine, the driver and the highest
  CUDA version it supports, read through NVML (``nvidia-ml-py``) or ``nvidia-smi`` in two small wrappers.
- :func:`diagnose_stack`: each mismatch between those layers in words, with the message the reader would see
  and what to do (a CUDA wheel without a usable driver, a driver older than the runtime, a CPU wheel on a GPU
  machine, a wheel without kernels for the GPU's architecture, a system CUDA/cuDNN on ``LD_LIBRARY_PATH``
  shadowing the wheel's ``nvidia-*`` libraries, a GPU without NCCL or Triton), and what a ROCm (HIP behind
  ``torch.cuda``) or Apple MPS build does differently. Wheel advice names only index tags PyTorch publishes
  (:data:`PYTORCH_CUDA_INDEXES`, with the newest torch each carries: :func:`wheel_index_for_driver`).
- :func:`graph_breaks` (``torch._dynamo.explain``), :func:`generated_code` (the kernels Inductor writes:
  C++/OpenMP on a CPU, Triton on a GPU) and :func:`compile_cost` (a cold compile against the time it saves per
  call: the break-even number of calls).
- :func:`determinism_check`: the same small training run twice with and without
  ``torch.use_deterministic_algorithms(True)``: bitwise equal losses or not, and the step time each way.
  :func:`deterministic_algorithms` sets the switches and puts the old ones back.
- :func:`enable_reproducible_cublas`: ``CUBLAS_WORKSPACE_CONFIG`` set before CUDA initialises (cuBLAS reads it
  then, and only then), called in a notebook's first cell.
- :func:`cuda_graphs_speedup`: a training step's median time compiled with and without ``mode="reduce-overhead"``
  (CUDA graphs), warmed up and synchronized, on a CUDA device; refused clearly on a CPU.
  :func:`cuda_graphs_compile`: the same mode through :func:`gpuformer_lib.speed.apply_plan`.
- Predictors for the GPU view: :func:`fusion_prediction` (layer norm + GELU as bytes over bandwidth, eager's four
  passes against the fused kernel's two) and :func:`decode_tokens_per_s` (batch-1 decoding bounded by bandwidth
  over the weights' bytes: bf16, weight-only int8 and int4); :func:`tool_sizes`, chapter 16's sizes per device.

Leaves out: installing anything (the Dockerfile and README do that), XLA/TPUs (cited in the book, not run),
``TORCH_LOGS`` output (printed by PyTorch, not returned), and Nsight (a GPU tool: the book gives its commands).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import re
import shutil
import statistics
import subprocess
import time
import warnings
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn.functional as F

from gpuformer_lib import bench
from gpuformer_lib.model import DecoderLM, TransformerConfig
from gpuformer_lib.profiles import rehearsing_gpu

BUILDS = ("CPU", "CUDA", "ROCm (HIP)", "MPS")


# --------------------------------------------------------------------------- the stack


@dataclasses.dataclass(frozen=True)
class StackReport:
    """What this PyTorch build and the machine under it report. None: the layer is absent or could not be read."""

    torch_version: str
    build: str
    """Which accelerator the wheel was built for: "CPU", "CUDA", "ROCm (HIP)" or "MPS" (an Apple build with MPS)."""
    cuda_runtime: str | None
    """``torch.version.cuda``: the CUDA runtime the wheel was compiled against and ships (None unless CUDA)."""
    hip_runtime: str | None
    """``torch.version.hip``: the HIP (ROCm) version of a ROCm wheel."""
    cudnn: int | None
    """``torch.backends.cudnn.version()``, e.g. 91002 for 9.10.2 (MIOpen on ROCm reports here too)."""
    nccl: str | None
    """NCCL (RCCL on ROCm) that the wheel ships: multi-GPU collectives; read only where a GPU is usable."""
    triton: str | None
    """The Triton package version: the compiler ``torch.compile`` writes GPU kernels in."""
    cpu_capability: str
    """The widest vector instructions PyTorch's CPU kernels use here (``AVX2``, ``AVX512``, ``DEFAULT``...)."""
    onednn: bool
    """oneDNN (MKL-DNN) available: CPU convolutions, matmuls and fused kernels."""
    mkl: bool
    """Intel MKL available: CPU BLAS and FFT."""
    threads: int
    """Threads PyTorch uses for CPU operations (``torch.get_num_threads()``)."""
    gpu_usable: bool
    """``torch.cuda.is_available()``: the build, the driver and a GPU all agree."""
    gpu_name: str | None
    mps_available: bool
    """``torch.backends.mps.is_available()``: an Apple-silicon GPU usable by this build."""
    driver: str | None
    """The NVIDIA driver version (NVML or nvidia-smi), or None where there is no NVIDIA driver."""
    driver_cuda: str | None
    """The newest CUDA version that driver supports, e.g. "12.4"."""
    driver_gpus: int
    """GPUs the NVIDIA driver sees (0 without a driver): what the machine has, whatever the wheel."""
    gpu_capability: str | None = None
    """The first GPU's compute capability, e.g. "8.6" (``torch.cuda.get_device_capability``; a usable GPU only)."""
    arch_list: tuple[str, ...] = ()
    """The GPU architectures this wheel carries kernels for (``torch.cuda.get_arch_list()``: "sm_75", ...,
    "compute_90" for PTX that the driver can compile for newer GPUs)."""
    shadowing_libraries: tuple[str, ...] = ()
    """Directories on ``LD_LIBRARY_PATH`` holding a system libcudnn/libcublas/libcudart: they are found before the
    ``nvidia-*-cu12``/``-cu13`` pip wheels' copies torch was built against."""

    def __post_init__(self):
        if self.build not in BUILDS:
            raise ValueError(f"build must be one of {', '.join(BUILDS)}, not {self.build!r}")
        if self.driver_gpus < 0:
            raise ValueError(f"driver_gpus must be >= 0, not {self.driver_gpus}")
        for name in ("cuda_runtime", "driver_cuda"):
            value = getattr(self, name)
            if value is not None and _version(value) is None:
                raise ValueError(f"{name} must look like '12.4', not {value!r}")
        if self.gpu_capability is not None and _version(self.gpu_capability) is None:
            raise ValueError(f"gpu_capability must look like '8.6', not {self.gpu_capability!r}")

    def rows(self) -> list[tuple[str, str, str]]:
        """(layer, what this build reports, what the layer does): the table a page shows."""
        none = "none"
        cudnn = f"{self.cudnn // 10000}.{self.cudnn // 100 % 100}.{self.cudnn % 100}" if self.cudnn else none
        return [
            ("PyTorch", f"{self.torch_version} ({self.build} build)", "the Python API; dispatches each op to a kernel"),
            ("NVIDIA driver", f"{self.driver} (CUDA <= {self.driver_cuda}, {self.driver_gpus} GPU(s))"
             if self.driver else none, "talks to the GPU; sets the newest CUDA runtime it can serve"),
            ("CUDA runtime", self.cuda_runtime or none,
             "launches kernels, moves memory; a pip dependency of the wheel (nvidia-cuda-runtime-*)"),
            ("HIP (ROCm)", self.hip_runtime or none, "AMD's CUDA-like runtime, behind torch.cuda"),
            ("cuBLAS", f"with CUDA {self.cuda_runtime}" if self.cuda_runtime else none,
             "matrix products on tensor cores (pip: nvidia-cublas-*)"),
            ("cuDNN / MIOpen" if self.build == "ROCm (HIP)" else "cuDNN", cudnn,
             "tuned kernels for convolutions, attention, normalisation"),
            ("NCCL", self.nccl or none, "all-reduce and other collectives between GPUs"),
            ("Triton", self.triton or none, "the compiler torch.compile writes GPU kernels in"),
            ("CPU kernels", f"{self.cpu_capability}, oneDNN {'yes' if self.onednn else 'no'}, "
             f"MKL {'yes' if self.mkl else 'no'}, {self.threads} thread(s)", "what runs when no GPU does"),
            ("GPU kernels", (f"capability {self.gpu_capability}; wheel has {' '.join(self.arch_list) or 'none'}"
                             if self.gpu_capability else
                             (' '.join(self.arch_list) if self.arch_list else none)),
             "architectures the wheel carries kernels for"),
            ("GPU usable", f"yes: {self.gpu_name}" if self.gpu_usable else
             ("MPS" if self.mps_available else "no"), "torch.cuda.is_available() / torch.backends.mps"),
        ]

    def table(self) -> str:
        """:meth:`rows` as fixed-width text."""
        rows = self.rows()
        a = max(len(r[0]) for r in rows)
        b = max(len(r[1]) for r in rows)
        return "\n".join(f"{layer:<{a}}  {value:<{b}}  {what}" for layer, value, what in rows)


def _version(text: str | None) -> tuple[int, int] | None:
    """'12.4' or '12.4.1' -> (12, 4); None when it is not a version."""
    m = re.match(r"^(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def _nvml_driver() -> tuple[str, str, int] | None:
    """(driver version, newest CUDA it supports, GPU count) from NVML; None without pynvml or a driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001  NVMLError (no driver) or a missing libnvidia-ml.so
        return None
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()  # e.g. 12040 for 12.4
        count = pynvml.nvmlDeviceGetCount()
    except Exception:  # noqa: BLE001
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    driver = driver.decode() if isinstance(driver, bytes) else str(driver)
    return driver, f"{cuda // 1000}.{cuda % 1000 // 10}", int(count)


def _nvidia_smi_driver() -> tuple[str, str, int] | None:
    """The same three from ``nvidia-smi``'s header and ``-L`` listing; None without it."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        header = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=10).stdout
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    driver = re.search(r"Driver Version:\s*([\d.]+)", header)
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", header)
    if not (driver and cuda):
        return None
    return driver.group(1), cuda.group(1), sum(line.startswith("GPU ") for line in listing.splitlines())


def _nccl_version() -> str | None:
    """NCCL's version as torch reports it, only where a CUDA/ROCm GPU is usable (the call needs the library)."""
    if not torch.cuda.is_available():
        return None
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001  built without NCCL (e.g. Windows)
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _triton_version() -> str | None:
    """The installed Triton's version from its package metadata (importing Triton takes seconds)."""
    from importlib import metadata

    for name in ("triton", "pytorch-triton-rocm", "pytorch-triton"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def stack_report() -> StackReport:
    """What this torch build and this machine report, layer by layer (see :class:`StackReport`)."""
    hip = getattr(torch.version, "hip", None)
    mps = getattr(torch.backends, "mps", None)
    mps_built = bool(mps and mps.is_built())
    build = "ROCm (HIP)" if hip else "CUDA" if torch.version.cuda else "MPS" if mps_built else "CPU"
    usable = torch.cuda.is_available()
    driver = _nvml_driver() or _nvidia_smi_driver()
    return StackReport(
        torch_version=torch.__version__,
        build=build,
        cuda_runtime=torch.version.cuda,
        hip_runtime=hip,
        cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        nccl=_nccl_version(),
        triton=_triton_version(),
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        onednn=torch.backends.mkldnn.is_available(),
        mkl=torch.backends.mkl.is_available(),
        threads=torch.get_num_threads(),
        gpu_usable=usable,
        gpu_name=torch.cuda.get_device_name(0) if usable else None,
        mps_available=bool(mps_built and mps.is_available()),
        driver=driver[0] if driver else None,
        driver_cuda=driver[1] if driver else None,
        driver_gpus=driver[2] if driver else 0,
        gpu_capability=_gpu_capability() if usable else None,
        arch_list=tuple(torch.cuda.get_arch_list()) if usable else (),
        shadowing_libraries=_shadowing_libraries() if (torch.version.cuda or hip) else (),
    )


def _gpu_capability() -> str | None:
    """The first GPU's compute capability as "8.6" (CUDA/ROCm with a usable GPU only)."""
    try:
        major, minor = torch.cuda.get_device_capability(0)
    except Exception:  # noqa: BLE001
        return None
    return f"{major}.{minor}"


def _shadowing_libraries(path: str | None = None) -> tuple[str, ...]:
    """Directories on ``LD_LIBRARY_PATH`` (or ``path``) that hold libcudnn/libcublas/libcudart: the dynamic loader
    searches them before the pip wheels' own copies, so a system CUDA or cuDNN can replace the ones torch expects."""
    found = []
    for folder in (os.environ.get("LD_LIBRARY_PATH", "") if path is None else path).split(os.pathsep):
        if not folder or not os.path.isdir(folder):
            continue
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        if any(n.startswith(("libcudnn.so", "libcublas.so", "libcudart.so")) for n in names):
            found.append(folder)
    return tuple(dict.fromkeys(found))


# The CUDA index tags of https://download.pytorch.org/whl/ for Linux x86-64, each with the CUDA version it ships
# and the newest PyTorch minor release built for it. Read from PyTorch's release compatibility matrix (RELEASE.md,
# "Release Compatibility Matrix", rows 2.0-2.14) and its "get started / previous versions" page (e.g. v2.6.0 lists
# cu118, cu124, cu126; v2.9.1 lists cu126, cu128, cu130). "2.14" marks a tag the newest row of that matrix still
# builds, so newer releases may carry it too. Tags that never existed (cu122, cu123, cu125, cu127) are not here.
PYTORCH_CUDA_INDEXES: dict[str, tuple[tuple[int, int], str]] = {
    "cu117": ((11, 7), "2.0"),
    "cu118": ((11, 8), "2.7"),
    "cu121": ((12, 1), "2.5"),
    "cu124": ((12, 4), "2.6"),
    "cu126": ((12, 6), "2.14"),
    "cu128": ((12, 8), "2.11"),
    "cu129": ((12, 9), "2.8"),
    "cu130": ((13, 0), "2.14"),
    "cu132": ((13, 2), "2.14"),
}
"""tag -> ((CUDA major, minor), newest torch minor release built for it)."""
_NEWEST_LISTED = max((v for _, v in PYTORCH_CUDA_INDEXES.values()), key=lambda v: tuple(map(int, v.split("."))))


def wheel_index_for_driver(driver_cuda: str | None) -> tuple[str, str] | None:
    """The newest published PyTorch CUDA index tag whose CUDA the driver serves (same major, minor <= the
    driver's, or an older major), and the newest torch it carries: e.g. "12.4" -> ("cu124", "2.6"), "12.5" ->
    ("cu124", "2.6"), "13.0" -> ("cu130", "2.14"). None when no published tag fits (or the version is unreadable)."""
    v = _version(driver_cuda)
    if v is None:
        return None
    fitting = [(cuda, tag) for tag, (cuda, _) in PYTORCH_CUDA_INDEXES.items() if cuda <= v]
    if not fitting:
        return None
    tag = max(fitting)[1]
    return tag, PYTORCH_CUDA_INDEXES[tag][1]


def _sm(arch: str) -> tuple[int, int, str, bool] | None:
    """'sm_86' -> (8, 6, '', False); 'sm_90a' -> (9, 0, 'a', False); 'compute_90' -> (9, 0, '', True)."""
    m = re.match(r"^(sm|compute)_(\d+?)(\d)([a-z]?)$", arch)
    return (int(m.group(2)), int(m.group(3)), m.group(4), m.group(1) == "compute") if m else None


def arch_supported(capability: str, arch_list: Sequence[str]) -> bool:
    """Whether a wheel built for ``arch_list`` has a kernel image a GPU of ``capability`` can run: a cubin for
    sm_XY runs on capability X.Z with Z >= Y (same major; an "a" variant only on X.Y exactly), and PTX
    (compute_XY) is compiled by the driver for any capability >= X.Y."""
    cap = _version(capability)
    if cap is None:
        raise ValueError(f"capability must look like '8.6', not {capability!r}")
    for arch in arch_list:
        parsed = _sm(arch)
        if parsed is None:
            continue
        major, minor, variant, ptx = parsed
        if ptx and cap >= (major, minor):
            return True
        if not ptx and major == cap[0] and (minor == cap[1] if variant else minor <= cap[1]):
            return True
    return False


COURSE_TORCH_FLOOR = "2.11"
"""The oldest torch this course has run on (its GPU suite and GPU tests, on an H200; requirements.txt states it
too; tests/test_packaging.py keeps them alike): a driver whose newest wheel is older can run PyTorch, not the course."""


def _wheel_advice(driver_cuda: str | None) -> str:
    """'update the driver, or install ...' naming a published tag and the newest torch it carries."""
    found = wheel_index_for_driver(driver_cuda)
    if found is None:
        return ("update the NVIDIA driver (no CUDA wheel PyTorch publishes runs on CUDA "
                f"{driver_cuda or 'this driver'})")
    tag, newest = found
    below_floor = _version(newest) < _version(COURSE_TORCH_FLOOR)
    return (f"update the NVIDIA driver (first choice: newer torch releases need it), or install the newest wheel "
            f"this driver can run: pip install torch --index-url https://download.pytorch.org/whl/{tag} "
            f"(CUDA {'.'.join(map(str, PYTORCH_CUDA_INDEXES[tag][0]))}; torch {newest} is the newest release built "
            f"for {tag}{'' if newest == _NEWEST_LISTED else ', so pin torch==' + newest + '.*'})"
            + (f"; this course needs torch {COURSE_TORCH_FLOOR} or newer, so for the course only the driver update "
               "will do" if below_floor else ""))


_TRITON_PTXAS = ("torch.compile's Triton kernels fail the same way whatever the wheel's cu tag: Triton compiles with "
                 "the ptxas bundled in the triton package, and a ptxas newer than the driver gives \"RuntimeError: "
                 "Triton Error [CUDA]: device kernel image is invalid\" (pytorch/pytorch#119054: a cu118 torch 2.2 on "
                 "driver 470). Fix: update the driver, or point TRITON_PTXAS_PATH at a ptxas no newer than the "
                 "driver's CUDA (a CUDA toolkit's bin/ptxas, or the nvidia-cuda-nvcc wheel's); an older torch wheel "
                 "does not help.")


def diagnose_stack(report: StackReport) -> list[str]:
    """Each mismatch in ``report`` in words, with what to do. Lines start with "problem:" (something will fail or
    run on the wrong device) or "note:" (works, differently: ROCm and MPS). A healthy report gives []."""
    if not isinstance(report, StackReport):
        raise TypeError(f"diagnose_stack needs a StackReport (from stack_report()), not {type(report).__name__}")
    found: list[str] = []
    runtime, driver_cuda = _version(report.cuda_runtime), _version(report.driver_cuda)
    index = "https://download.pytorch.org/whl/"
    if report.build == "CPU" and report.driver_gpus > 0:
        found.append(f"problem: a CPU-only torch wheel on a machine whose NVIDIA driver {report.driver} shows "
                     f"{report.driver_gpus} GPU(s): torch.cuda.is_available() is False and everything runs on the "
                     f"CPU. The driver serves CUDA <= {report.driver_cuda}: {_wheel_advice(report.driver_cuda)}.")
    if report.build == "CUDA" and runtime and driver_cuda and driver_cuda < runtime:
        if driver_cuda[0] < runtime[0]:
            found.append(f"problem: this wheel ships CUDA {report.cuda_runtime} but the driver {report.driver} serves "
                         f"at most CUDA {report.driver_cuda}, an older major version: torch warns \"The NVIDIA driver "
                         f"on your system is too old\" and torch.cuda.is_available() is False. "
                         f"{_wheel_advice(report.driver_cuda)[0].upper()}{_wheel_advice(report.driver_cuda)[1:]}.")
        else:
            found.append(f"problem: this wheel ships CUDA {report.cuda_runtime} but the driver {report.driver} serves "
                         f"at most CUDA {report.driver_cuda}: same major version, so the wheel's prebuilt kernels run "
                         f"(minor-version compatibility), but PTX the driver must compile is too new for it. "
                         f"{_wheel_advice(report.driver_cuda)[0].upper()}{_wheel_advice(report.driver_cuda)[1:]}. "
                         f"{_TRITON_PTXAS}")
    elif report.build == "CUDA" and not report.gpu_usable:
        if report.driver is None:
            found.append("problem: a CUDA wheel, but no NVIDIA driver answers (no NVML, no nvidia-smi): "
                         "torch.cuda.is_available() is False (torch warns \"Found no NVIDIA driver on your system\") "
                         "and everything runs on the CPU. On a GPU machine install the driver (or run the container "
                         f"with --gpus all); on a machine without a GPU the CPU wheel ({index}cpu) is about ten times "
                         "smaller.")
        else:
            found.append(f"problem: a CUDA wheel and driver {report.driver} (CUDA <= {report.driver_cuda}), but "
                         "torch.cuda.is_available() is False: check CUDA_VISIBLE_DEVICES (empty or wrong hides the "
                         "GPUs), that this process may open /dev/nvidia*, and in a container --gpus all.")
    if report.gpu_capability and report.arch_list and not arch_supported(report.gpu_capability, report.arch_list):
        found.append(f"problem: the GPU has compute capability {report.gpu_capability}, but this wheel carries kernels "
                     f"only for {' '.join(report.arch_list)}: every kernel launch fails with \"CUDA error: no kernel "
                     "image is available for execution on the device\" (torch warns at start-up that the GPU is not "
                     "compatible). A new GPU needs a wheel built with its architecture (e.g. Blackwell's sm_100/sm_120 "
                     "come with the cu128 and cu13x wheels); an old one a wheel that still lists it (cu126 keeps "
                     "Maxwell to Volta, sm_50-sm_70). Compare torch.cuda.get_device_capability() with "
                     "torch.cuda.get_arch_list().")
    if report.build == "CUDA" and report.shadowing_libraries:
        found.append("problem: LD_LIBRARY_PATH puts a system CUDA/cuDNN first "
                     f"({', '.join(report.shadowing_libraries)}): the loader picks those over the nvidia-*-cu12/-cu13 "
                     "pip wheels torch was built with, and a version that differs fails at import (\"undefined symbol\") "
                     "or at the first convolution or attention call (a cuDNN version error). Unset LD_LIBRARY_PATH for "
                     "Python, or remove those folders from it.")
    if report.build in ("CUDA", "ROCm (HIP)") and report.gpu_usable:
        if report.nccl is None:
            found.append("problem: a GPU but no NCCL in this build: multi-GPU training (chapters 11-12) falls back "
                         "to the gloo backend, which copies through the CPU. Use a Linux wheel from the PyTorch index.")
        if report.triton is None:
            found.append("problem: a GPU but no Triton: torch.compile cannot write GPU kernels and fails on its first "
                         "call. pip install the triton version your torch wheel names (pip show torch, Requires).")
    if report.build == "ROCm (HIP)":
        found.append(f"note: a ROCm build (HIP {report.hip_runtime}): AMD GPUs sit behind torch.cuda, so "
                     "device='cuda', torch.cuda.is_available(), autocast, scaled_dot_product_attention, "
                     "torch.compile (Triton for AMD) and torch.distributed (RCCL under the name 'nccl') work as on "
                     "NVIDIA. What differs: torch.version.cuda is None, cuDNN is MIOpen, there is no TF32 on MI200 "
                     "(CDNA2; MI300 can use it through hipBLASLt), NVML and nvidia-smi do not see the GPU "
                     "(rocm-smi/amd-smi do), Nsight is rocprof, and CUDA C extensions must be hipified.")
    if report.build == "MPS":
        found.append("note: an Apple MPS build: use device='mps' (torch.cuda is empty). MPS has its own events "
                     "(torch.mps.Event(enable_timing=True) for timing) and memory cap "
                     "(torch.mps.set_per_process_memory_fraction); no NCCL and no Triton (torch.compile's Metal back-"
                     "end is experimental); float64 is not supported on the GPU; an op without an MPS kernel raises "
                     "unless PYTORCH_ENABLE_MPS_FALLBACK=1 sends it to the CPU; the GPU shares the Mac's memory."
                     + ("" if report.mps_available else " MPS is built in but not available here: it needs "
                        "Apple silicon and macOS 12.3 or newer."))
    return found


# --------------------------------------------------------------------------- the compiler: graph breaks


@contextlib.contextmanager
def _quiet_dynamo() -> Iterator[None]:
    """Dynamo logs a warning per graph break; the caller reads the reasons from the return value instead."""
    logger = logging.getLogger("torch._dynamo")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@dataclasses.dataclass(frozen=True)
class GraphBreaks:
    """What ``torch._dynamo.explain`` found: how many graphs the function became and why it was split."""

    graphs: int
    breaks: int
    reasons: tuple[str, ...]
    """One line per break: the reason's first line and the user line that caused it."""

    def __str__(self) -> str:
        lines = [f"{self.graphs} graph(s), {self.breaks} break(s)"]
        return "\n".join(lines + [f"  - {r}" for r in self.reasons])


def _short_reason(reason: Any) -> str:
    first = str(getattr(reason, "reason", reason)).strip().splitlines()[0]
    stack = getattr(reason, "user_stack", None) or []
    if stack:
        frame = stack[-1]
        first += f" (at line {frame.lineno}: {(frame.line or '').strip()})"
    return first


def graph_breaks(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> GraphBreaks:
    """Trace ``fn(*args, **kwargs)`` with TorchDynamo (``torch._dynamo.explain``) and report its graphs and breaks.
    A break means Dynamo handed control back to Python mid-function: two graphs compiled apart, no fusion across
    the break, and a guard check plus a Python round trip per call. Runs ``fn`` once."""
    if not callable(fn):
        raise TypeError(f"graph_breaks needs a function, not {type(fn).__name__}")
    torch.compiler.reset()  # a function traced before would otherwise be explained from its cache
    with _quiet_dynamo():
        explained = torch._dynamo.explain(fn)(*args, **kwargs)
    torch.compiler.reset()
    reasons = tuple(dict.fromkeys(_short_reason(r) for r in explained.break_reasons))
    return GraphBreaks(graphs=explained.graph_count, breaks=explained.graph_break_count, reasons=reasons)


# --------------------------------------------------------------------------- the compiler: generated code and its cost


def layer_norm_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """GELU(LayerNorm(x)) over the last dimension: eager PyTorch runs two kernels (two reads and two writes of x),
    a compiler can fuse them into one. x (B*T, C), weight and bias (C,)."""
    return F.gelu(F.layer_norm(x, (x.shape[-1],), weight, bias))


@contextlib.contextmanager
def cold_compile_caches() -> Iterator[None]:
    """A fresh, empty Inductor/Triton cache directory and no FX-graph or autotune cache: a compile inside pays the
    full price, as the first run on a new machine does. Dynamo's in-memory cache is reset on entry and exit."""
    from torch._inductor import config as inductor_config

    torch.compiler.reset()
    try:
        with _fresh_inductor_cache(), inductor_config.patch(fx_graph_cache=False, autotune_local_cache=False):
            yield
    finally:
        torch.compiler.reset()


def _fresh_inductor_cache() -> contextlib.AbstractContextManager:
    """Inductor's own context manager for an empty, temporary cache directory (torch has no public one): named
    ``fresh_cache`` in newer torch, ``fresh_inductor_cache`` in older (2.13 has both)."""
    from torch._inductor import utils

    fresh = getattr(utils, "fresh_cache", None) or getattr(utils, "fresh_inductor_cache", None)
    if fresh is None:
        raise RuntimeError(f"torch {torch.__version__} has neither torch._inductor.utils.fresh_cache nor "
                           "fresh_inductor_cache: cold compile caches cannot be set up")
    return fresh()


@dataclasses.dataclass(frozen=True)
class GeneratedCode:
    """The Python module Inductor wrote for a compiled function and the kernels inside it."""

    language: str
    """"triton" (a GPU) or "c++" (a CPU: C++ with OpenMP and vector intrinsics)."""
    module: str
    """The whole generated wrapper module: allocations, kernel launches, calls to cuBLAS/oneDNN."""
    kernels: tuple[str, ...]
    """The source of each generated kernel."""
    compile_s: float
    """Seconds of the call that compiled (cold caches): tracing, lowering, code generation, the C++/Triton compiler."""


def kernel_sources(module: str) -> tuple[str, ...]:
    """The kernels inside an Inductor wrapper module: the triple-quoted source passed to ``async_compile.triton``
    (a Triton kernel) or ``async_compile.cpp``/``cpp_pybinding`` (a C++ kernel)."""
    pattern = r"async_compile\.(?:triton|cpp_pybinding|cpp)\((?:[^']|'(?!''))*?r?'''(.*?)'''"
    return tuple(m.group(1).strip("\n") for m in re.finditer(pattern, module, re.S))


def generated_code(fn: Callable[..., Any], *args: Any, cold: bool = True) -> GeneratedCode:
    """Compile ``fn`` with ``torch.compile`` (Inductor), call it on ``args``, and return the code it generated. The
    kernels are C++ on a CPU and Triton on a CUDA or ROCm GPU (whichever device ``args`` live on). ``cold``: in
    :func:`cold_compile_caches` (the time is a first compile's); False: Inductor's usual cache directory, with only
    the FX-graph cache off (code is still generated, but the C++/Triton compiler's output may come from disk)."""
    from torch._inductor.utils import run_and_get_code

    if not callable(fn):
        raise TypeError(f"generated_code needs a function, not {type(fn).__name__}")
    from torch._inductor import config as inductor_config

    torch.compiler.reset()
    caches = cold_compile_caches() if cold else inductor_config.patch(fx_graph_cache=False)
    with caches:
        start = time.perf_counter()
        _, modules = run_and_get_code(torch.compile(fn), *args)
        seconds = time.perf_counter() - start
    module = "\n\n".join(modules)
    language = "triton" if "@triton.jit" in module else "c++"
    return GeneratedCode(language=language, module=module, kernels=kernel_sources(module), compile_s=seconds)


@dataclasses.dataclass(frozen=True)
class CompileCost:
    """A cold compile against the time it saves per call. speedup = eager / compiled."""

    compile_s: float
    """Seconds of the first compiled call (cold caches) minus one compiled call: the price of compiling."""
    comparison: bench.Comparison
    """Eager (the baseline) against compiled, timed in interleaved rounds by :func:`gpuformer_lib.bench.compare`:
    its ``verdict`` and ``phrase()`` are what a page says of the two."""
    break_even_calls: int | None
    """Calls after which compiling has paid for itself; None unless ``comparison.verdict`` is "faster"."""
    reason: str
    """Why there is no break-even, or how it was computed."""

    @property
    def eager_s(self) -> float:
        """Median seconds per eager call."""
        return self.comparison.timings["eager"].median

    @property
    def compiled_s(self) -> float:
        """Median seconds per compiled call, timed interleaved with the eager calls."""
        return self.comparison.timings["compiled"].median

    @property
    def speedup(self) -> float:
        return self.comparison.speedup


def break_even_calls(compile_s: float, eager_s: float, compiled_s: float) -> tuple[int | None, str]:
    """ceil(compile_s / (eager_s - compiled_s)) and how it was found; None with the reason when compiled is not
    faster (it never pays back)."""
    for name, value in (("compile_s", compile_s), ("eager_s", eager_s), ("compiled_s", compiled_s)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, not {value}")
    saved = eager_s - compiled_s
    if saved <= 0:
        return None, (f"the compiled call is not faster ({compiled_s * 1e6:.0f} µs against eager "
                      f"{eager_s * 1e6:.0f} µs): the compile never pays back")
    calls = max(1, math.ceil(compile_s / saved))
    return calls, f"{compile_s:.2f} s of compiling / {saved * 1e6:.1f} µs saved per call"


def _device_of(args: Sequence[Any]) -> torch.device | None:
    return next((a.device for a in args if isinstance(a, torch.Tensor)), None)


def compile_cost(fn: Callable[..., Any], *args: Any, repeats: int = 7, number: int = 20,
                 backend: str = "inductor", max_seconds: float | None = None) -> CompileCost:
    """Measure ``torch.compile(fn, backend=backend)`` on ``args``: a cold compile (fresh caches,
    :func:`cold_compile_caches`), then eager against compiled through :func:`gpuformer_lib.bench.compare`:
    interleaved rounds (at least ``repeats``, 5 or more, more while the spread is wide, up to ``max_seconds``) of
    ``number`` calls each, so load on the machine hits both alike. Dynamo's cache is reset on exit. ``backend``:
    "inductor" (generated kernels) or a cheaper one ("eager": Dynamo's capture only) to see what capture costs."""
    if not callable(fn):
        raise TypeError(f"compile_cost needs a function, not {type(fn).__name__}")
    for name, value, least in (("repeats", repeats, 5), ("number", number, 1)):
        if not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, not {value!r}")
    device = _device_of(args)
    with cold_compile_caches():
        compiled = torch.compile(fn, backend=backend)
        start = time.perf_counter()
        compiled(*args)
        bench.synchronize(device)
        first = time.perf_counter() - start
        comparison = bench.compare({"eager": lambda: fn(*args), "compiled": lambda: compiled(*args)},
                                   device=device, warmup=1, repeats=repeats, number=number,
                                   max_seconds=max_seconds)["compiled"]
    compiled_s = comparison.timings["compiled"].median
    compile_s = max(first - compiled_s, 0.0)
    if comparison.verdict == "faster":
        calls, reason = break_even_calls(compile_s, comparison.timings["eager"].median, compiled_s)
    else:  # a tie or a loss: no saving that the rounds' spread leaves standing, so no break-even
        calls, reason = None, f"compiled was {comparison.phrase()}: the compile never pays back"
    return CompileCost(compile_s=compile_s, comparison=comparison, break_even_calls=calls, reason=reason)


def cuda_graphs_compile(model: torch.nn.Module, device: torch.device | str) -> torch.nn.Module:
    """``torch.compile(model, mode="reduce-overhead")`` (:func:`gpuformer_lib.speed.apply_plan` with
    ``cuda_graphs=True``): on a CUDA device the compiled forward and backward are recorded as CUDA graphs and each
    replayed with one launch. In a rehearsed GPU profile on a CPU the model comes back unchanged (there is no graph
    to record); on a plain CPU this raises ValueError, as ``apply_plan`` does."""
    from gpuformer_lib.speed import SpeedPlan, apply_plan

    device = torch.device(device)
    if device.type != "cuda" and rehearsing_gpu():
        return model
    return apply_plan(model, SpeedPlan(compile=True, cuda_graphs=True), device)


@dataclasses.dataclass(frozen=True)
class CudaGraphsSpeedup:
    """A training step compiled without and with CUDA graphs: medians of warmed, synchronized steps."""

    compiled_step_s: float
    """Median seconds per step, ``torch.compile(model)`` (default mode: fused kernels, one launch each)."""
    graphed_step_s: float
    """Median seconds per step, ``torch.compile(model, mode="reduce-overhead")``: forward and backward replayed as
    CUDA graphs."""
    steps: int
    """Timed steps per mode (after the warm-up steps that compile and record)."""
    rehearsed: bool = False
    """True when a rehearsed GPU profile ran the loop on the CPU, uncompiled and without graphs: the times are then
    the CPU's and say nothing about graphs."""

    @property
    def speedup(self) -> float:
        """compiled / graphed: above 1 means the graphs saved launch time."""
        return bench.speedup(self.compiled_step_s, self.graphed_step_s)


def cuda_graphs_speedup(config: TransformerConfig, device: torch.device | str, *, steps: int = 30, batch: int = 8,
                        seq: int = 64, warmup: int = 3) -> CudaGraphsSpeedup:
    """Time AdamW training steps of ``DecoderLM(config)`` on ``device`` compiled two ways, ``torch.compile`` and
    ``torch.compile(mode="reduce-overhead")`` (CUDA graphs): the same seeded weights and a fixed batch of
    ``batch`` x ``seq`` tokens in each, ``warmup`` untimed steps each (compiling, then recording the graphs),
    then ``steps`` timed steps per mode in interleaved rounds, each step synchronized; medians. The loss and the
    optimizer step stay outside the graphs (``torch.compiler.cudagraph_mark_step_begin`` marks each step).
    A CPU device raises ValueError; in a rehearsed GPU profile on the CPU the same loop runs uncompiled, without
    graphs (``rehearsed=True``), to check the code path only."""
    device = torch.device(device)
    rehearsal = device.type != "cuda" and rehearsing_gpu()
    if device.type != "cuda" and not rehearsal:
        raise ValueError(f"CUDA graphs need a CUDA device, not {device}: they record CUDA kernel launches")
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config must be a TransformerConfig, not {type(config).__name__}")
    for name, value in (("steps", steps), ("batch", batch), ("seq", seq), ("warmup", warmup)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, not {value!r}")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (batch, seq + 1), generator=g).to(device)  # (B, T + 1)
    torch.compiler.reset()
    runs = {}
    for mode in (None, "reduce-overhead"):
        torch.manual_seed(0)
        model = DecoderLM(config).to(device)
        compiled = model if rehearsal else torch.compile(model, mode=mode)
        runs[mode] = (compiled, torch.optim.AdamW(model.parameters(), lr=1e-3), [])

    def step(mode: str | None) -> float:
        compiled, opt, _ = runs[mode]
        bench.synchronize(device)
        t0 = time.perf_counter()
        if mode and not rehearsal:
            torch.compiler.cudagraph_mark_step_begin()
        logits = compiled(ids[:, :-1])  # (B, T) -> (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())  # (B*T, V)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        bench.synchronize(device)
        return time.perf_counter() - t0

    try:
        for mode in runs:
            for _ in range(warmup):
                step(mode)
        for _ in range(steps):
            for mode in runs:
                runs[mode][2].append(step(mode))
    finally:
        torch.compiler.reset()
    return CudaGraphsSpeedup(compiled_step_s=statistics.median(runs[None][2]),
                             graphed_step_s=statistics.median(runs["reduce-overhead"][2]), steps=steps,
                             rehearsed=rehearsal)


# --------------------------------------------------------------------------- determinism


_CUBLAS_CONFIG = ":4096:8"
_cublas_set_before_cuda: bool | None = None


def enable_reproducible_cublas() -> bool:
    """Set ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (unless already set) while CUDA is not yet initialised: cuBLAS reads
    it when CUDA starts, so a notebook calls this in its first cell, before any tensor reaches a GPU. Returns
    whether the variable was in place before CUDA initialised (False: CUDA had started, and this process's cuBLAS
    keeps its default, possibly nondeterministic, workspaces; set it in the shell instead). Recorded for
    :func:`determinism_check`."""
    global _cublas_set_before_cuda
    initialised = torch.cuda.is_initialized()
    already = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if not initialised and already is None:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = _CUBLAS_CONFIG
    _cublas_set_before_cuda = not initialised or already is not None  # set in the shell, or now in time
    return _cublas_set_before_cuda


def cublas_config_before_cuda() -> bool | None:
    """Whether ``CUBLAS_WORKSPACE_CONFIG`` was set before CUDA initialised in this process: True or False once
    :func:`enable_reproducible_cublas` has run, else None (unknown; True if CUDA has not started yet and the
    variable is set)."""
    if _cublas_set_before_cuda is not None:
        return _cublas_set_before_cuda
    if not torch.cuda.is_initialized() and os.environ.get("CUBLAS_WORKSPACE_CONFIG"):
        return True
    return None



@contextlib.contextmanager
def deterministic_algorithms(enabled: bool = True, *, warn_only: bool = False) -> Iterator[None]:
    """Inside: ``torch.use_deterministic_algorithms(enabled, warn_only=warn_only)`` (an op without a deterministic
    kernel raises, or with ``warn_only`` warns and runs its nondeterministic kernel),
    ``torch.backends.cudnn.benchmark = False`` and ``cudnn.deterministic = enabled``. It does not set
    ``CUBLAS_WORKSPACE_CONFIG``: cuBLAS reads that only when CUDA initialises, and setting it later would only
    silence PyTorch's cuBLAS determinism error without changing cuBLAS; :func:`enable_reproducible_cublas` sets it
    in time. On exit every flag is put back as it was."""
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
    try:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = enabled
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[2], saved[3]


@dataclasses.dataclass(frozen=True)
class DeterminismResult:
    """The same training run twice in each mode: were the losses bitwise equal, and what did a step cost?"""

    equal_default: bool
    """Two runs with PyTorch's default kernels gave bitwise equal losses."""
    equal_deterministic: bool
    """Two runs with :func:`deterministic_algorithms` gave bitwise equal losses."""
    losses: tuple[float, ...]
    """The losses of the first deterministic run."""
    step_s_default: float
    """Median seconds per training step with the default kernels."""
    step_s_deterministic: float
    """Median seconds per training step with the deterministic switches."""
    nondeterministic_ops: tuple[str, ...] = ()
    """Operations that ran without a deterministic kernel in deterministic mode (PyTorch's warnings, first line):
    while any is listed, bitwise equality is not guaranteed on this device."""
    cublas_config_before_cuda: bool | None = None
    """On a CUDA device: whether ``CUBLAS_WORKSPACE_CONFIG`` was set before CUDA initialised
    (:func:`enable_reproducible_cublas`); False means cuBLAS ran with its default workspaces. None on a CPU."""

    @property
    def cost(self) -> float:
        """step_s_deterministic / step_s_default: 1.0 means the switches cost nothing here."""
        return self.step_s_deterministic / self.step_s_default


def _train_losses(config: TransformerConfig, device: torch.device, steps: int, batch: int, seq: int,
                  seed: int) -> tuple[list[float], list[float]]:
    torch.manual_seed(seed)
    model = DecoderLM(config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(seed + 1)
    losses, times = [], []
    for _ in range(steps):
        ids = torch.randint(0, config.vocab_size, (batch, seq + 1), generator=data).to(device)  # (B, T + 1)
        bench.synchronize(device)
        t0 = time.perf_counter()
        logits = model(ids[:, :-1])  # (B, T) -> (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())  # (B*T, V)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # waits for the step
        times.append(time.perf_counter() - t0)
    return losses, times


def determinism_cost_words(cost: float, device_type: str) -> str:
    """Words for what the determinism switches did to the step time, ``cost`` = deterministic / default step
    time, on a ``device_type`` ("cpu", "cuda", ...). Within 10 % either way: nothing measurable. Slower: they
    slowed it. Faster on a CPU can only be noise, since no kernel a CPU model uses changes; faster elsewhere
    is reported as not slower."""
    if not (isinstance(cost, (int, float)) and not isinstance(cost, bool) and 0 < cost < math.inf):
        raise ValueError(f"cost must be a positive finite ratio of step times, got {cost!r}")
    if 1 / 1.1 < cost < 1.1:
        return "cost nothing measurable"
    if cost >= 1.1:
        return "slowed the step down"
    if device_type == "cpu":
        return ("ran faster, which can only be noise here: on a CPU these switches change no kernel this "
                "model uses")
    return "did not slow the step down"


def determinism_check(config: TransformerConfig | None = None, *, device: torch.device | str = "cpu", steps: int = 6,
                      batch: int = 8, seq: int = 32, seed: int = 0) -> DeterminismResult:
    """Train a small :class:`DecoderLM` for ``steps`` AdamW steps on seeded random tokens, four times: default,
    deterministic, default, deterministic (interleaved, so load hits both modes). Same seed every time, dropout
    on (its mask comes from the seeded generator). Step times leave out each run's first step (warm-up).
    Deterministic mode runs with ``warn_only=True``: an operation without a deterministic kernel on this device
    is listed in ``nondeterministic_ops`` instead of stopping the run."""
    config = config or TransformerConfig(vocab_size=64, d_model=64, n_heads=4, n_encoder_layers=0,
                                         n_decoder_layers=2, d_ff=128, max_len=max(64, seq), dropout=0.1)
    if not isinstance(steps, int) or steps < 2:
        raise ValueError(f"steps must be an int >= 2 (the first step is warm-up), not {steps!r}")
    device = torch.device(device)
    runs: dict[bool, list[tuple[list[float], list[float]]]] = {False: [], True: []}
    flagged: list[str] = []
    for _ in range(2):
        for mode in (False, True):
            with deterministic_algorithms(mode, warn_only=True), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                runs[mode].append(_train_losses(config, device, steps, batch, seq, seed))
            flagged += [str(w.message).splitlines()[0] for w in caught if "deterministic" in str(w.message)]
    step = {mode: statistics.median(t for _, times in runs[mode] for t in times[1:]) for mode in runs}
    return DeterminismResult(
        equal_default=runs[False][0][0] == runs[False][1][0],
        equal_deterministic=runs[True][0][0] == runs[True][1][0],
        losses=tuple(runs[True][0][0]),
        step_s_default=step[False],
        step_s_deterministic=step[True],
        nondeterministic_ops=tuple(dict.fromkeys(flagged)),
        cublas_config_before_cuda=bool(cublas_config_before_cuda()) if device.type == "cuda" else None,
    )


def layer_norm_gelu_bytes(rows: int, width: int, *, fused: bool, element_bytes: int = 4) -> int:
    """Bytes :func:`layer_norm_gelu` moves through memory on (rows, width): eager PyTorch runs two kernels, layer
    norm (reads x, writes y) and GELU (reads y, writes z), 4 passes over the tensor; fused into one kernel, 2 (read
    x, write z). Plus the weight and bias, read once. Caches are left out (a tensor far larger than them)."""
    bench._check_count("rows", rows, 1)
    bench._check_count("width", width, 1)
    passes = 2 if fused else 4
    return (passes * rows * width + 2 * width) * element_bytes


def fusion_prediction(rows: int, width: int, gpu: str) -> tuple[float, float]:
    """(eager seconds, fused seconds) of :func:`layer_norm_gelu` on ``gpu``: both kernels are memory-bound (a
    few FLOPs per 8 bytes moved, far below a GPU's ridge point), so the time is the bytes of
    :func:`layer_norm_gelu_bytes` over the bandwidth a copy achieves (the course's predictor,
    ``predict.achievable_bandwidth``). Launch latency is left out (large tensors)."""
    from gpuformer_lib import predict

    bandwidth = predict.achievable_bandwidth(gpu)[0]
    return (layer_norm_gelu_bytes(rows, width, fused=False) / bandwidth,
            layer_norm_gelu_bytes(rows, width, fused=True) / bandwidth)


# --------------------------------------------------------------------------- the chapter's sizes


@dataclasses.dataclass(frozen=True)
class ToolSizes:
    """The sizes chapter 16 measures at, per device (:func:`tool_sizes`)."""

    rows: int
    """Rows (B*T) of the LayerNorm + GELU input the compiler is measured on."""
    width: int
    """Its width C."""
    compile_repeats: int
    """Interleaved rounds of :func:`compile_cost` (at least 5: :func:`gpuformer_lib.bench.compare`)."""
    compile_number: int
    """Calls per round."""
    teacher_steps: int
    """Training steps of the character model that is exported and quantized."""
    teacher_batch: int
    """Sequences of 64 characters per training step of that model."""
    batch: int
    """Sequences of 64 characters per batch (training, timing, held-out loss)."""
    timing_repeats: int
    """Interleaved rounds of the export and quantization comparisons (at least 5)."""
    determinism_steps: int
    """Training steps per run of :func:`determinism_check`."""
    teacher_lr: float = 1.2e-2
    """Peak learning rate of the character model (linear decay to 0)."""
    graphs_steps: int = 30
    """Timed training steps per mode of :func:`cuda_graphs_speedup`."""

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "teacher_lr":
                if not (isinstance(value, float) and 0 < value < 1):
                    raise ValueError(f"teacher_lr must be a float in (0, 1), not {value!r}")
            elif not isinstance(value, int) or value < 1:
                raise ValueError(f"{field.name} must be a positive int, not {value!r}")


def tool_sizes(on_gpu: bool, toy: bool) -> ToolSizes:
    """Chapter 16's sizes. ``toy`` (a rehearsed GPU profile): a few steps of each, so that every cell runs in CI.
    Else the CPU sizes (export and quantization run on the CPU on every machine: ONNX Runtime and dynamic int8 are
    CPU paths here; the model only needs to be trained enough that its held-out loss means something), with a
    compiler input that fills a GPU's memory bandwidth (64 MB, far above its caches) when ``on_gpu``. The
    character model: 180 steps of 8 x 64 characters at a peak learning rate of 1.2e-2; when this was set (shared
    2-core CPU, one thread) that took 4.8 s and reached a held-out loss of 2.55 nats per character, against 3.35 for
    the training set's character frequencies (:func:`gpuformer_lib.compression.unigram_loss`). The
    distillation's sizes are ``compression.translator_distillation_plan``'s."""
    if toy:
        return ToolSizes(rows=64, width=128, compile_repeats=5, compile_number=5, teacher_steps=10, teacher_batch=8,
                         batch=8, timing_repeats=5, determinism_steps=3, graphs_steps=2)
    rows, width = (4096, 4096) if on_gpu else (256, 512)
    return ToolSizes(rows=rows, width=width, compile_repeats=7, compile_number=20, teacher_steps=180,
                     teacher_batch=8, batch=16, timing_repeats=7, determinism_steps=12)


# --------------------------------------------------------------------------- weight-only quantization, predicted


def decode_tokens_per_s(parameters: float, bytes_per_weight: float, gpu: str) -> float:
    """Predicted batch-1 decode speed of a compiled, graph-replayed decoder: every generated token reads every
    weight once from memory, so tokens/s = bandwidth / (parameters x bytes per weight), at the bandwidth a copy
    achieves on ``gpu`` (the course's predictor, ``predict.achievable_bandwidth``; the KV cache and activations
    are left out: small at batch 1 and short contexts; eager decoding is launch-bound instead, chapter 10)."""
    from gpuformer_lib import predict

    if not (parameters > 0 and bytes_per_weight > 0):
        raise ValueError(f"parameters and bytes_per_weight must be positive, got {parameters} and {bytes_per_weight}")
    return predict.achievable_bandwidth(gpu)[0] / (parameters * bytes_per_weight)
