"""Small checks of how PyTorch meets the device: host syncs, hidden GPUs, misplaced tensors, a GPU's summary.

Covers:

- :func:`host_sync_cost`: what reading one value back to the host costs (``.item()``, ``.cpu()``,
  ``print(tensor)``), against queueing the same tiny operation without waiting. On a GPU every such read
  makes the Python thread wait until the GPU has finished all the work queued before it (a *host sync*);
  on a CPU every operation is already synchronous, so the two costs are the same order of magnitude.
- :func:`nvidia_smi_report`: the driver's own table (``nvidia-smi``), or why there is none.
- :func:`visible_gpu_count`: ``torch.cuda.device_count()`` in a fresh Python process with a given
  ``CUDA_VISIBLE_DEVICES``: the variable is read once, when CUDA initialises, so it must be set before
  that, in the environment of a new process, never by ``os.environ`` in a notebook that already used CUDA.
- :func:`device_mismatch_error`: the error PyTorch raises when one operation gets tensors on two devices.
- :func:`profile_summary`: what ``device.hardware_summary`` shows on a GPU, built from a rehearsal profile
  (``profiles.PROFILES``) for a reader without that GPU: profile data (the names and memory the driver
  reports on those cards, their compute capability), not a measurement.
- :func:`training_state_bytes`: the bytes of float32 weights, gradients and AdamW's two moments (16 per
  parameter), the arithmetic the chapter's memory section and exercise use.

Leaves out: choosing the device and the full hardware summary (``device``), timing loops with CUDA events
(``bench``), the memory calculator with activations (``memory``), the cost of a sync inside a training loop
(``device_measurements.readback_cost``).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import subprocess
import sys
import time

import torch

from gpuformer_lib.device import pick_device


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


# --------------------------------------------------------------------------- host syncs


@dataclasses.dataclass(frozen=True)
class HostSyncCost:
    """Seconds per tiny operation, read back at once with ``.item()`` or queued and read once at the end."""

    device: str
    read_each: float
    """Median seconds of one ``(x + 1).item()``: launch, wait for the device, copy 4 bytes back."""
    queued: float
    """Seconds per ``x.add_(1)`` when ``n`` of them are queued and one value is read at the end."""
    n: int

    @property
    def wait_per_read(self) -> float:
        """What one read adds beyond queueing the operation: the host sync's own cost (>= 0)."""
        return max(self.read_each - self.queued, 0.0)

    def __str__(self) -> str:
        return (f"{self.device}: .item() after each op {self.read_each * 1e6:.1f} us, queued and read once "
                f"{self.queued * 1e6:.1f} us per op (n = {self.n})")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_sync_cost(device: str | torch.device | None = None, n: int = 200, repeats: int = 5) -> HostSyncCost:
    """Measure :class:`HostSyncCost` on ``device`` (default: :func:`~gpuformer_lib.device.pick_device`).

    ``read_each`` is the median over ``n`` calls of ``(x + 1).item()`` on a one-element tensor; ``queued``
    the best of ``repeats`` runs of ``n`` in-place adds followed by one ``.item()``, divided by ``n``.
    """
    n, repeats = _positive_int("n", n), _positive_int("repeats", repeats)
    device = pick_device(device)
    x = torch.zeros((), device=device)
    for _ in range(10):  # warm-up: the first calls pay one-off costs (allocator, kernel loading)
        (x + 1).item()
    _sync(device)
    each = []
    for _ in range(n):
        start = time.perf_counter()
        (x + 1).item()
        each.append(time.perf_counter() - start)
    runs = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        for _ in range(n):
            x.add_(1)
        x.item()
        runs.append((time.perf_counter() - start) / n)
    return HostSyncCost(str(device), statistics.median(each), min(runs), n)


# --------------------------------------------------------------------------- CUDA_VISIBLE_DEVICES


def visible_gpu_count(cuda_visible_devices: str | None) -> int:
    """``torch.cuda.device_count()`` in a new Python process whose ``CUDA_VISIBLE_DEVICES`` is the given
    string (``""`` hides every GPU, ``"0"`` shows the first, ``"1,0"`` shows two and renumbers them);
    ``None`` removes the variable. Takes a second or two: the new process imports torch."""
    if cuda_visible_devices is not None and not isinstance(cuda_visible_devices, str):
        raise TypeError(f"cuda_visible_devices must be a string such as '' or '0,1', or None; got "
                        f"{cuda_visible_devices!r}")
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                         capture_output=True, text=True, env=env, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"the child process failed: {out.stderr.strip()[-500:]}")
    return int(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- nvidia-smi


def nvidia_smi_report(timeout: float = 20.0) -> str:
    """The output of ``nvidia-smi`` (its table: driver version, the newest CUDA the driver supports, memory
    used and total, utilisation, processes), or a sentence saying why there is none on this machine."""
    import shutil

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ("nvidia-smi is not on this machine's PATH: no NVIDIA driver is installed here, so there is no "
                "GPU table to read (on a GPU machine this prints it).")
    try:
        out = subprocess.run([exe], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as err:
        return f"nvidia-smi is installed but could not run: {err}"
    if out.returncode != 0:
        return f"nvidia-smi failed (exit {out.returncode}): {(out.stdout + out.stderr).strip()[-500:]}"
    return out.stdout.rstrip()


# --------------------------------------------------------------------------- tensors on two devices


CUDA_MISMATCH_MESSAGE = ("Expected all tensors to be on the same device, but found at least two devices, "
                         "cuda:0 and cpu!")
"""The form of PyTorch's message (``TORCH_CHECK`` in ATen) when one operation gets a ``cuda:0`` and a
``cpu`` tensor; which devices it names depends on the operation's argument order."""


def device_mismatch_error(device: str | torch.device | None = None) -> str:
    """Run a ``Linear`` layer whose weights are on one device with an input on another and return the error
    PyTorch raises, as ``'RuntimeError: ...'``. With a GPU the layer goes to the GPU and the input stays on
    the CPU; without one the layer goes to the ``meta`` device (tensors with shapes and no data), which
    trips the same device check with a message worded differently."""
    device = pick_device(device)
    where = device if device.type == "cuda" else torch.device("meta")
    layer = torch.nn.Linear(4, 2).to(where)
    try:
        layer(torch.ones(1, 4))  # the input is on the CPU
    except RuntimeError as err:
        return f"{type(err).__name__}: {err}"
    raise AssertionError(f"no error: PyTorch accepted a {where} layer with a cpu input")


# --------------------------------------------------------------------------- a GPU's summary from its profile


def profile_summary(name: str) -> str:
    """What the GPU lines of ``hardware_summary`` show for the rehearsal profile ``name`` (``'t4'``,
    ``'h100-80gb'``), labelled as profile data: the name and memory the driver reports on that card, its
    compute capability and the formats it has tensor cores for, and the SM count of its datasheet."""
    from gpuformer_lib.profiles import PROFILES

    if name not in PROFILES or not PROFILES[name].on_gpu:
        raise ValueError(f"{name!r} is not a GPU profile; choose one of "
                         f"{', '.join(k for k, p in PROFILES.items() if p.on_gpu)}")
    p = PROFILES[name]
    cc = p.compute_capability
    rows = [
        ("GPU", f"{p.gpu_name} ({p.gpu_count} visible)"),
        ("SMs", str(_DATASHEET_SMS.get(p.gpu_name, "?"))),
        ("GPU memory", f"{p.memory_gib:.1f} GiB"),
        ("compute capability", f"{cc[0]}.{cc[1]}"),
        ("bf16 / TF32", f"{'yes' if p.bf16 else 'no'} / {'yes' if p.tf32 else 'no'}"),
        ("tensor cores", f"{p.tensor_core_generation}: "
                         + ", ".join(k for k, v in (("bf16", p.bf16), ("fp16", p.fp16_tensor_cores),
                                                    ("tf32", p.tf32)) if v)),
        ("fp16 attention kernels", ", ".join(p.sdpa_kernels.get("float16", ()))),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"profile '{name}' (profile data, not measured):"]
    return "\n".join(lines + [f"  {k:<{width}}  {v}" for k, v in rows])


_DATASHEET_SMS = {"Tesla T4": 40, "NVIDIA H100 80GB HBM3": 132}
"""Streaming multiprocessors: 40 on a T4 (as ``deviceQuery`` reports it, registry key ``t4-devicequery-sm-count``),
132 on an H100 SXM5 (the figure chapter 1's table uses). Other profiles show '?'."""


# --------------------------------------------------------------------------- training memory


ADAMW_FP32_BYTES_PER_PARAM = 4 + 4 + 8
"""float32 weight, float32 gradient, AdamW's exp_avg and exp_avg_sq (float32 each)."""


def training_state_bytes(n_params: int) -> int:
    """Bytes of float32 weights, gradients and AdamW state for ``n_params`` parameters (no activations)."""
    n_params = _positive_int("n_params", n_params)
    return ADAMW_FP32_BYTES_PER_PARAM * n_params


def largest_trainable_params(memory_bytes: float) -> int:
    """The most parameters whose float32 weights, gradients and AdamW state fit in ``memory_bytes``
    (activations, the CUDA context and the allocator's reserve not counted: a real run fits fewer)."""
    if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, (int, float)) or not memory_bytes > 0:
        raise ValueError(f"memory_bytes must be a number > 0, got {memory_bytes!r}")
    return int(memory_bytes // ADAMW_FP32_BYTES_PER_PARAM)
