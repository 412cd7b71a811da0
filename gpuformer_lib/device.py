"""Which device a run uses, what that hardware is, how big the run should be, and seeding.

Covers: choosing the device (CUDA, then Apple MPS, then CPU) with clear errors when a requested
device is missing; a summary of the hardware and software a notebook runs on; size presets chosen
by device, so the same notebook runs in minutes on a laptop CPU and shows the real effect on a
GPU; seeding for reproducible runs.

Leaves out: timing and peak throughput (``bench``), multi-process set-up (``distributed``).

Two environment variables override the automatic choices, so a learner or CI can force them
without editing a notebook: ``GPUFORMER_DEVICE`` (``cpu``, ``cuda``, ``cuda:1``, ``mps``) and
``GPUFORMER_PRESET`` (``cpu``, ``gpu-small``, ``gpu``).

Layering: choosing the device and the hardware summary live in :mod:`gpuformer_lib.hardware`, the size
presets (:class:`SizePreset`, chosen from a device's profile) in :mod:`gpuformer_lib.profiles`, which builds on
``hardware``; this module builds on both and re-exports their names, so ``from gpuformer_lib.device import
pick_device, SizePreset, ...`` keeps working. Neither of the two imports this module.
"""

from __future__ import annotations

import os
import random
import warnings

import torch

from gpuformer_lib.hardware import (DEVICE_ENV, DeviceNotAvailableError, HardwareSummary,  # noqa: F401
                                    _cpu_has_native_bf16, hardware_summary, pick_device)
from gpuformer_lib.profiles import (PRESET_ENV, PRESET_NAMES, SizePreset, current_profile, display_only,
                                    size_preset)

__all__ = ["DEVICE_ENV", "PRESET_ENV", "PRESET_NAMES", "DeviceNotAvailableError", "HardwareSummary", "SizePreset",
           "choose_preset", "hardware_summary", "pick_device", "run_header", "seed_everything"]
# _cpu_has_native_bf16 is re-exported too (device_measurements imports it from here)

# --------------------------------------------------------------------------- size presets and the opening lines


def choose_preset(device: str | torch.device | None = None, name: str | None = None) -> SizePreset:
    """Choose the size preset for ``device``: ``name`` if given, else ``$GPUFORMER_PRESET``, else from the
    device's profile (:func:`gpuformer_lib.profiles.preset_name`: by memory; a rehearsed profile gets its
    preset's name with the CPU's toy sizes)."""
    return size_preset(current_profile(device), name)


def run_header(device: str | torch.device | None = None, preset: SizePreset | None = None) -> str:
    """The lines every notebook opens with: what it runs on and which size preset it chose."""
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
