"""Which device a run uses, what that hardware is, how big the run should be, and seeding.

Covers: choosing the device (CUDA, then Apple MPS, then CPU) with clear errors when a requested
device is missing; a summary of the hardware and software a notebook runs on; size presets chosen
by device, so the same notebook runs in minutes on a laptop CPU and shows the real effect on a
GPU; seeding for reproducible runs.

Leaves out: timing and peak throughput (``bench``), multi-process set-up (``distributed``).

Two environment variables override the automatic choices, so a learner or CI can force them
without editing a notebook: ``GPUFORMER_DEVICE`` (``cpu``, ``cuda``, ``cuda:1``, ``mps``) and
``GPUFORMER_PRESET`` (``cpu``, ``gpu-small``, ``gpu``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
import random
import shutil
import subprocess
import sys
import warnings
from typing import Any

import torch

DEVICE_ENV = "GPUFORMER_DEVICE"
PRESET_ENV = "GPUFORMER_PRESET"


class DeviceNotAvailableError(RuntimeError):
    """A device was asked for that this machine (or this PyTorch build) cannot provide."""


def _cuda_unavailable_message() -> str:
    lines = ["CUDA was requested, but PyTorch cannot use a GPU here."]
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        lines.append(
            f"  torch {torch.__version__} is a CPU-only build (torch.version.cuda is None). "
            "Install a CUDA build of PyTorch: see the README, 'Getting PyTorch'."
        )
    else:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        lines += [
            f"  torch {torch.__version__} was built for CUDA {torch.version.cuda}, "
            "but torch.cuda.is_available() is False. Check that:",
            "  - `nvidia-smi` lists a GPU (if the command fails, the NVIDIA driver is missing or not loaded);",
            f"  - the driver supports CUDA {torch.version.cuda} or newer (the 'CUDA Version' nvidia-smi prints);",
            f"  - CUDA_VISIBLE_DEVICES does not hide every GPU (it is {visible!r});",
            "  - in Colab: Runtime > Change runtime type > a GPU accelerator.",
        ]
    lines.append('To run on the CPU instead, call pick_device("cpu") or pick_device() for the best device present.')
    return "\n".join(lines)


def _auto_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def pick_device(requested: str | torch.device | None = None) -> torch.device:
    """Return the device to run on.

    ``requested=None`` takes ``$GPUFORMER_DEVICE`` if set, otherwise the best device present:
    CUDA, then Apple MPS, then the CPU. A device that is asked for but not present raises
    :class:`DeviceNotAvailableError` saying what to check; it never falls back silently.
    """
    if requested is None:
        requested = os.environ.get(DEVICE_ENV) or None
    if requested is None:
        return _auto_device()
    try:
        device = torch.device(requested)
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"{requested!r} is not a device name. Use 'cpu', 'cuda', 'cuda:N' (N a GPU index) or 'mps'."
        ) from err
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceNotAvailableError(_cuda_unavailable_message())
        count = torch.cuda.device_count()
        index = torch.cuda.current_device() if device.index is None else device.index
        if index >= count:
            raise DeviceNotAvailableError(
                f"GPU cuda:{index} was requested, but this machine shows {count} GPU(s): "
                f"cuda:0 to cuda:{count - 1}. Check CUDA_VISIBLE_DEVICES "
                f"(it is {os.environ.get('CUDA_VISIBLE_DEVICES')!r}) or ask for a lower index."
            )
        # Make it current: CUDA events, streams and allocator calls without a device use the current GPU,
        # so timing work on cuda:1 while cuda:0 is current would time an empty stream.
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise DeviceNotAvailableError(
            "Apple MPS was requested, but torch.backends.mps.is_available() is False. MPS needs an "
            "Apple-silicon Mac with macOS 12.3 or newer and a PyTorch build with MPS support. "
            'Use pick_device("cpu") instead.'
        )
    if device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"The course supports 'cpu', 'cuda' and 'mps' devices, not {device.type!r}.")
    return device


# --------------------------------------------------------------------------- hardware summary


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin" and shutil.which("sysctl"):
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5
            )
            if out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _nvidia_driver_version() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


@dataclasses.dataclass(frozen=True)
class HardwareSummary:
    """What a run executes on. GPU fields are None when the device is not a CUDA GPU."""

    device: str
    """The device the run uses, e.g. ``cuda:0``, ``mps`` or ``cpu``."""
    gpu_name: str | None
    """Marketing name as the driver reports it, e.g. ``NVIDIA H100 80GB HBM3``."""
    gpu_count: int
    """CUDA GPUs visible to this process."""
    sm_count: int | None
    """Streaming multiprocessors: the GPU's independent cores; work is spread over them."""
    gpu_memory_gib: float | None
    """Total device memory (GiB = 2**30 bytes): bounds model, batch and activations."""
    compute_capability: tuple[int, int] | None
    """The GPU architecture's version: 7.5 Turing (T4), 8.0 Ampere (A100), 8.9 Ada, 9.0 Hopper."""
    bf16: bool
    """Fast bfloat16 matrix products (compute capability >= 8.0 on NVIDIA; native support on a CPU)."""
    tf32: bool
    """TensorFloat-32 tensor cores for float32 matrix products (compute capability >= 8.0)."""
    torch_version: str
    cuda_version: str | None
    """CUDA version the PyTorch build was compiled for (None for a CPU-only build)."""
    cudnn_version: int | None
    driver_version: str | None
    cpu_model: str
    cpu_threads: int
    """Logical CPUs the operating system reports."""
    torch_threads: int
    """Threads PyTorch uses for CPU operations."""
    python_version: str
    platform: str

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        rows = [("device", self.device)]
        if self.gpu_name is not None:
            cc = self.compute_capability
            rows += [
                ("GPU", f"{self.gpu_name} ({self.gpu_count} visible)"),
                ("SMs", str(self.sm_count)),
                ("GPU memory", f"{self.gpu_memory_gib:.1f} GiB"),
                ("compute capability", f"{cc[0]}.{cc[1]}" if cc else "?"),
                ("bf16 / TF32", f"{'yes' if self.bf16 else 'no'} / {'yes' if self.tf32 else 'no'}"),
                ("driver", self.driver_version or "unknown"),
            ]
        elif self.device == "cpu":
            # Without AVX512-BF16/AMX PyTorch converts bf16 to float32 inside oneDNN (about float32 speed) or,
            # where oneDNN does not take the op, runs a slow reference kernel: which one is measured in chapter 1.
            rows.append(("bf16", "native" if self.bf16
                         else "no native instructions (converted; speed depends on the kernel)"))
        cuda = self.cuda_version or "none (CPU-only build)"
        rows += [
            ("CPU", f"{self.cpu_model}, {self.cpu_threads} threads (torch uses {self.torch_threads})"),
            ("torch / CUDA", f"{self.torch_version} / {cuda}"),
            ("python", f"{self.python_version} on {self.platform}"),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


@functools.lru_cache(maxsize=1)
def _cpu_has_native_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return platform.machine() == "arm64" and sys.platform == "darwin"
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16"))


def hardware_summary(device: str | torch.device | None = None) -> HardwareSummary:
    """Describe the device a run uses (default: :func:`pick_device`) and the software around it."""
    device = pick_device(device)
    gpu: dict[str, Any] = dict(gpu_name=None, sm_count=None, gpu_memory_gib=None, compute_capability=None)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        cc = (props.major, props.minor)
        is_rocm = getattr(torch.version, "hip", None) is not None
        gpu = dict(
            gpu_name=props.name,
            sm_count=props.multi_processor_count,
            gpu_memory_gib=round(props.total_memory / 2**30, 2),
            compute_capability=cc,
        )
        bf16 = torch.cuda.is_bf16_supported() if is_rocm else cc >= (8, 0)
        tf32 = (not is_rocm) and cc >= (8, 0)
    elif device.type == "mps":
        bf16, tf32 = True, False
    else:
        bf16, tf32 = _cpu_has_native_bf16(), False
    return HardwareSummary(
        device=str(device),
        gpu_count=torch.cuda.device_count() if torch.cuda.is_available() else 0,
        bf16=bf16,
        tf32=tf32,
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
        cudnn_version=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        driver_version=_nvidia_driver_version() if device.type == "cuda" else None,
        cpu_model=_cpu_model(),
        cpu_threads=os.cpu_count() or 1,
        torch_threads=torch.get_num_threads(),
        python_version=platform.python_version(),
        platform=platform.platform(terse=True),
        **gpu,
    )


# --------------------------------------------------------------------------- size presets

PRESET_NAMES = ("cpu", "gpu-small", "gpu")
_PRESET_HELP = {
    "cpu": "small sizes that finish in minutes on a laptop CPU: correctness and method, not speed",
    "gpu-small": "sizes for a GPU under 24 GiB (a Colab T4, Apple MPS): the real effects, smaller",
    "gpu": "sizes that show the real effect on a data-centre GPU (A100, H100)",
}


@dataclasses.dataclass(frozen=True)
class SizePreset:
    """A named size class for a run. Notebooks ask it for their sizes with :meth:`pick`."""

    name: str
    """One of ``cpu``, ``gpu-small``, ``gpu``."""
    reason: str
    """Why this preset was chosen, for the notebook's opening lines."""
    toy: bool = False
    """Rehearsal: named for a GPU profile, but :meth:`pick` returns the CPU (toy) sizes."""

    def __post_init__(self):
        if self.name not in PRESET_NAMES:
            raise ValueError(f"Unknown size preset {self.name!r}; choose one of {', '.join(PRESET_NAMES)}.")

    @property
    def description(self) -> str:
        return _PRESET_HELP[self.name]

    def pick(self, *, cpu: Any, gpu: Any, gpu_small: Any = None) -> Any:
        """Return the value for this preset: ``preset.pick(cpu=512, gpu=8192, gpu_small=4096)``.

        ``gpu_small`` defaults to ``gpu``; give it where the ``gpu`` value would not fit in 16 GB.
        """
        if self.name == "cpu" or self.toy:
            return cpu
        if self.name == "gpu-small" and gpu_small is not None:
            return gpu_small
        return gpu

    def __str__(self) -> str:
        toy = "\n  rehearsal: the CPU preset's toy sizes are used" if self.toy else ""
        return f"size preset '{self.name}' ({self.reason}):\n  {self.description}{toy}"


def choose_preset(device: str | torch.device | None = None, name: str | None = None) -> SizePreset:
    """Choose the size preset for ``device``: ``name`` if given, else ``$GPUFORMER_PRESET``, else from the
    device's profile (:func:`gpuformer_lib.profiles.preset_name`: by memory; a rehearsed profile gets its
    preset's name with the CPU's toy sizes)."""
    from gpuformer_lib.profiles import current_profile, size_preset  # profiles builds on this module

    return size_preset(current_profile(device), name)


def run_header(device: str | torch.device | None = None, preset: SizePreset | None = None) -> str:
    """The lines every notebook opens with: what it runs on and which size preset it chose."""
    from gpuformer_lib.profiles import current_profile, display_only

    device = pick_device(device)
    preset = preset or choose_preset(device)
    profile = current_profile(device)
    with display_only():  # text for the reader: no choice is made from it
        return f"{hardware_summary(device)}\nprofile: {profile.describe()}\n{preset}"


# --------------------------------------------------------------------------- seeding


def seed_everything(seed: int = 0, deterministic: bool = False) -> int:
    """Seed Python, NumPy (if installed) and PyTorch on every device; return the seed.

    Seeding fixes the random *numbers* (initialisation, dropout, data order); it does not make a GPU
    run repeat bit for bit. Kernels that add in a varying order (atomics in FlashAttention's backward,
    ``index_add_``, ``scatter_add_``, some cuBLAS reductions) round differently from run to run.
    ``deterministic=True`` asks PyTorch for deterministic kernels (slower) with ``warn_only=True``: an
    operation that has none *warns* and still runs non-deterministically. It also sets
    ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` if unset, which cuBLAS reads only when it initialises: if CUDA is
    already initialised in this process and the variable was not set before, it warns that cuBLAS may
    stay non-deterministic (set the variable before the process starts). Same seed, same device, same
    versions, deterministic kernels: same numbers. Different devices draw different random streams, so
    a CPU and a GPU run differ even with one seed.
    """
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, not {seed!r}")
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:
        pass
    torch.manual_seed(seed)  # seeds the CPU and every CUDA device
    if deterministic:
        if "CUBLAS_WORKSPACE_CONFIG" not in os.environ and torch.cuda.is_initialized():
            warnings.warn("seed_everything(deterministic=True): CUDA is already initialised, so setting "
                          "CUBLAS_WORKSPACE_CONFIG now may not reach cuBLAS; matrix products can stay "
                          "non-deterministic. Set CUBLAS_WORKSPACE_CONFIG=:4096:8 before starting Python.",
                          RuntimeWarning, stacklevel=2)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
    return seed
