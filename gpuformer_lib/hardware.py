"""Which torch device a run uses and what that hardware is: the layer under :mod:`gpuformer_lib.profiles`.

Covers: choosing the device (CUDA, then Apple MPS, then CPU) with clear errors when a requested
device is missing (:func:`pick_device`, ``$GPUFORMER_DEVICE``); a summary of the hardware and software a
notebook runs on (:func:`hardware_summary`).

Leaves out: what a device can do and the choices made from it, the size presets among them (``profiles``,
which builds on this module), a notebook's opening lines and seeding (``device``, which builds on both and
re-exports every name here: notebooks import them from ``gpuformer_lib.device``). This module imports
nothing else of the library.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
import shutil
import subprocess
import sys
from typing import Any

import torch

DEVICE_ENV = "GPUFORMER_DEVICE"


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
