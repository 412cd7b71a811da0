"""Small checks of how PyTorch meets the device: host syncs, hidden GPUs, misplaced tensors, a GPU's summary.

Covers:

- :func:`host_sync_cost`: what reading one value back to the host costs (``.item()``, ``.cpu()``,
  ``print(tensor)``), against queueing the same tiny operation without waiting. On a GPU every such read
  makes the Python thread wait until the GPU has finished all the work queued before it (a *host sync*);
  on a CPU every operation has finished when it returns, so a read adds only its own call.
  It times the two loops through ``bench.compare`` (interleaved rounds), and :func:`sync_comparison_words`
  words its verdict; :func:`sync_cost_words` words a ratio's band; :func:`read_interval_run` times a loop that reads
  every k-th step beside both (chapter 0's exercise).
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

from gpuformer_lib import bench
from gpuformer_lib.device import pick_device


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


# --------------------------------------------------------------------------- host syncs


@dataclasses.dataclass(frozen=True)
class HostSyncCost:
    """Seconds per tiny operation (``x.add_(1)`` on a one-element tensor), read back after each one with
    ``.item()`` or queued and read once at the end: the same operation in both loops, so the difference is
    the reads."""

    device: str
    read_each: float
    """Seconds per step of ``x.add_(1); x.item()``: launch the add, wait for the device, copy 4 bytes back."""
    queued: float
    """Seconds per ``x.add_(1)`` when ``n`` of them are queued and one value is read at the end."""
    n: int
    comparison: bench.Comparison | None = None
    """The two loops timed in interleaved rounds (:func:`bench.compare`): candidate ``"read each step"``
    against baseline ``"queued"``; its verdict is what a page says of the read (``None`` where the costs come
    from :func:`read_interval_run`)."""

    @property
    def wait_per_read(self) -> float:
        """What one read adds beyond queueing the operation: the host sync's own cost (>= 0)."""
        return max(self.read_each - self.queued, 0.0)

    @property
    def ratio(self) -> float:
        """``read_each / queued``: how many times a step that reads costs a step that only queues."""
        return self.read_each / self.queued

    def __str__(self) -> str:
        how = (f"median of {len(self.comparison.ratios)} interleaved rounds of n = {self.n}"
               if self.comparison is not None else f"best of the runs of n = {self.n}")
        return (f"{self.device}: add + .item() each step {self.read_each * 1e6:.1f} us, add queued and read once "
                f"{self.queued * 1e6:.1f} us per step ({how})")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _steps(x: torch.Tensor, n: int, read_every: int) -> None:
    """``n`` steps of ``x.add_(1)``, with ``x.item()`` after every ``read_every``-th step, and at the end when
    the last step did not read (so the last queued work is waited for too)."""
    for step in range(1, n + 1):
        x.add_(1)
        if step % read_every == 0:
            x.item()
    if n % read_every:
        x.item()


def _per_step(x: torch.Tensor, n: int, read_every: int) -> float:
    """Seconds per step of :func:`_steps`."""
    _sync(x.device)
    start = time.perf_counter()
    _steps(x, n, read_every)
    return (time.perf_counter() - start) / n


def host_sync_cost(device: str | torch.device | None = None, n: int = 200, repeats: int = 10) -> HostSyncCost:
    """Measure :class:`HostSyncCost` on ``device`` (default: :func:`~gpuformer_lib.device.pick_device`).

    Both loops run ``n`` in-place adds ``x.add_(1)`` on a one-element tensor; one reads ``x.item()`` after
    every add, the other once at the end. The two are timed by :func:`bench.compare` in interleaved rounds
    (``repeats`` of them, at least 5, more while the spread is wide), so a change in the machine's load meets
    both loops alike; the costs are the medians of the rounds, per step, and :attr:`HostSyncCost.comparison`
    says whether reading made a step slower by more than the rounds' spread.
    """
    n, repeats = _positive_int("n", n), _positive_int("repeats", repeats)
    device = pick_device(device)
    x = torch.zeros((), device=device)
    for _ in range(10):  # warm-up: the first calls pay one-off costs (allocator, kernel loading)
        x.add_(1)
        x.item()
    result = bench.compare({"queued": lambda: _steps(x, n, n + 1), "read each step": lambda: _steps(x, n, 1)},
                           device=device, warmup=1, repeats=max(repeats, 5))["read each step"]
    timings = result.timings
    return HostSyncCost(str(device), timings["read each step"].median / n, timings["queued"].median / n, n,
                        result)


def read_interval_run(device: str | torch.device | None = None, n: int = 2000, read_every: int = 50,
                      chunk: int = 200, repeats: int = 10) -> tuple[HostSyncCost, float]:
    """The per-step costs of :func:`host_sync_cost` and the seconds of ``n`` steps of ``x.add_(1)`` that read
    ``x.item()`` every ``read_every`` steps (a training loop that logs its loss every ``read_every`` steps),
    measured together: runs of ``chunk`` steps (a multiple of ``read_every``) of the three loops interleaved,
    the best of ``repeats`` of each, so a shared machine's drifting speed meets all three alike. The loop's
    time is its best run per step times ``n``."""
    n, read_every, chunk, repeats = (_positive_int("n", n), _positive_int("read_every", read_every),
                                     _positive_int("chunk", chunk), _positive_int("repeats", repeats))
    if chunk % read_every:
        raise ValueError(f"chunk ({chunk}) must be a multiple of read_every ({read_every})")
    device = pick_device(device)
    x = torch.zeros((), device=device)
    for _ in range(10):
        x.add_(1)
        x.item()
    runs = {1: [], chunk + 1: [], read_every: []}
    for _ in range(repeats):
        for every, times in runs.items():
            times.append(_per_step(x, chunk, every))
    cost = HostSyncCost(str(device), min(runs[1]), min(runs[chunk + 1]), chunk)
    return cost, n * min(runs[read_every])


SYNC_BANDS = ((1.2, "costs about as much as queueing it"), (3.0, "costs somewhat more than queueing it"),
              (float("inf"), "costs several times as much as queueing it"))
"""How a read after each operation compares with queueing it, by ``read_each / queued``: up to 1.2, up to 3,
above 3."""


def sync_cost_words(ratio: float, device_type: str) -> str:
    """The words for a measured ``read_each / queued`` ratio, chosen from its band (:data:`SYNC_BANDS`); on a
    CPU (``device_type == 'cpu'``) with the reason a read costs little there. Never says a GPU is
    synchronous."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio < float("inf"):
        raise ValueError(f"ratio must be a finite number > 0, got {ratio!r}")
    if not isinstance(device_type, str):
        raise TypeError(f"device_type must be a string such as 'cpu' or 'cuda', got {device_type!r}")
    words = next(text for limit, text in SYNC_BANDS if ratio <= limit)
    if device_type == "cpu":
        words += (": on a CPU every operation has finished when it returns, so a read waits for nothing and "
                  "adds only the cost of the .item() call")
    return words


CPU_SYNC_NOTE = ("on a CPU every operation has finished when it returns, so a read waits for nothing and adds only "
                 "the cost of the .item() call: a CPU cannot show what a host sync costs on a GPU")
"""Why a CPU's measurement is not the lesson, said beside its verdict on a CPU."""


def sync_comparison_words(cost: HostSyncCost, device_type: str) -> str:
    """What reading after every step did to a step, in the words of the two loops' comparison
    (:attr:`HostSyncCost.comparison`: ``"1.45x slower than queued"``, or no difference that the rounds' spread
    lets us see), on a CPU with :data:`CPU_SYNC_NOTE`. Never says a GPU is synchronous."""
    if not isinstance(cost, HostSyncCost) or cost.comparison is None:
        raise TypeError("sync_comparison_words needs the HostSyncCost of host_sync_cost (it carries the comparison)")
    if not isinstance(device_type, str):
        raise TypeError(f"device_type must be a string such as 'cpu' or 'cuda', got {device_type!r}")
    words = f"reading after every step made a step {cost.comparison.phrase()}"
    return f"{words}; {CPU_SYNC_NOTE}" if device_type == "cpu" else words


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


CUDA_MISMATCH_FORM = ("Expected all tensors to be on the same device, but got {argument} is on {device}, "
                      "different from other tensors on {common_device} (when checking argument in method "
                      "{method})")
"""The form of the message a CUDA operator's generated device check raises in this PyTorch (2.13:
``common_device_check_failure`` in ``aten/src/ATen/core/adaption.cpp``), when one argument is on another
device than the ones before it. Older versions said ``found at least two devices, cuda:0 and cpu!``, and
element-wise operators (``TensorIterator``) still do: the exact wording varies with the operation and the
version. :func:`mismatch_form_fragments_in_torch` checks the installed PyTorch still carries it."""


def mismatch_form_fragments_in_torch() -> bool | None:
    """Whether the fixed fragments of :data:`CUDA_MISMATCH_FORM` are in the installed ``libtorch_cpu`` (None
    when that library cannot be found, e.g. a build that names it differently). Reads a file of some
    hundred MB: for a test, not a notebook."""
    import re
    from pathlib import Path

    lib = Path(torch.__file__).parent / "lib"
    candidates = sorted(lib.glob("libtorch_cpu.*")) + sorted(lib.glob("torch_cpu.*"))
    if not candidates:
        return None
    data = candidates[0].read_bytes()
    fragments = [f for f in re.split(r"\{[a-z_]+\}", CUDA_MISMATCH_FORM) if f]
    return all(f.encode() in data for f in fragments)


def device_mismatch_error(device: str | torch.device | None = None) -> str:
    """Run a ``Linear`` layer whose weights are on one device with an input on another and return the error
    PyTorch raises, as ``'RuntimeError: ...'``. With a GPU the layer goes to the GPU and the input stays on
    the CPU; without one the layer goes to the ``meta`` device (tensors with shapes and no data), which
    trips a device check too: another check, worded differently (see :data:`CUDA_MISMATCH_FORM`)."""
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


TRAINING_STATE_OPTIONS: tuple[tuple[str, float], ...] = (
    ("AdamW in float32 (weight 4, gradient 4, two moments 8)", 16),
    ("mixed precision: 16-bit weights and gradients, float32 master weights and moments (2+2+4+8)", 16),
    ("16-bit weights and gradients, float32 moments, no float32 master copy (2+2+8)", 12),
    ("float32 weights and gradients, 8-bit AdamW moments (4+4+2)", 10),
    ("AdamW in float32 sharded over two T4s, weights, gradients and moments split (ZeRO stage 3: 16/2)", 8),
)
"""Bytes per parameter of the training state (no activations) under the usual ways to shrink it: mixed
precision as Micikevicius et al. (2018) and ZeRO (Rajbhandari et al., 2020) count it keeps a float32 master
copy, so it saves nothing here; 8-bit optimizers (Dettmers et al., 2022) shrink the moments; ZeRO-3 divides
the whole state between GPUs."""

HEADROOM_GIB = 2.0
"""What a training run needs beyond its weights, gradients and optimizer state, as a round allowance: the
CUDA context (a few hundred MiB), the caching allocator's reserve and a small batch's activations."""


def state_fit(n_params: int, bytes_per_param: float, memory_gib: float,
              headroom_gib: float = HEADROOM_GIB) -> tuple[bool, str]:
    """Whether a training state of ``n_params`` x ``bytes_per_param`` fits in ``memory_gib`` GiB with
    ``headroom_gib`` left for the CUDA context and activations, and the words for it: ``'fits, N GiB left
    ...'``, ``'N GiB short'`` (of the memory itself) or, when it fits only without the headroom, that it is no
    real fit."""
    n_params = _positive_int("n_params", n_params)
    for name, value in (("bytes_per_param", bytes_per_param), ("memory_gib", memory_gib)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    need = n_params * bytes_per_param / 2**30
    left = memory_gib - need
    if left >= headroom_gib:
        return True, f"needs {need:.1f} GiB: fits, {left:.1f} GiB left for the CUDA context and activations"
    if left >= 0:
        return False, (f"needs {need:.1f} GiB: fits on paper, but leaves {left:.2f} GiB, under the "
                       f"{headroom_gib:g} GiB the CUDA context and activations need: not a real fit")
    return False, f"needs {need:.1f} GiB: {-left:.1f} GiB short"
