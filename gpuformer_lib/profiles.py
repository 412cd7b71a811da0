"""What a device can do, as data, and every choice a notebook or worker makes from it.

Covers: :class:`DeviceProfile`, one description of a device's capabilities (native bf16, fp16 and
TF32 tensor cores, which fused attention (SDPA) kernels exist, memory, tensor-core generation,
NVML, GPU count); named profiles (:data:`PROFILES`) for a CPU, a Colab T4, an A100-40GB, an
H100-80GB and an 8xH100 node; :func:`current_profile`, which describes this machine, or a named
profile under *rehearsal*; and the choices made from a profile (:func:`low_precision_dtype`,
:func:`training_precision`, :func:`preset_name` and the :class:`SizePreset` it names,
:func:`data_parallel_world`), each tested for every profile.

Rehearsal: with ``GPUFORMER_REHEARSE=t4`` (or any name in :data:`PROFILES`) the library reports
that profile's capabilities while computing on the CPU at the CPU preset's (toy) sizes, and the
CUDA-only calls of :mod:`gpuformer_lib.gpu` run CPU stand-ins that check their arguments. So the
``if profile.on_gpu:`` branches of every notebook execute in CI, on a machine without a GPU.

Leaves out: choosing the torch device (``hardware``), a notebook's opening lines (``device``, which
builds on this module and re-exports :class:`SizePreset`), timing (``bench``). Figures in the profiles
are datasheet figures (memory as the driver reports it, compute capability); the SDPA kernel lists
follow PyTorch's ``sdp_utils.cpp`` rules: flash needs sm_80+, the memory-efficient kernel takes
fp16/fp32 below sm_80 and bf16 too from sm_80, cuDNN attention needs sm_80+. On a CPU, PyTorch (2.13 when
this was checked) runs its tiled ``_scaled_dot_product_flash_attention_for_cpu`` kernel for float32, float64,
bfloat16 and float16, listed as ``flash`` (``math`` remains the fallback).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from typing import Any

import torch

# hardware imports nothing else of the library; device builds on this module (its choose_preset and
# run_header read the profile), never the other way round
from gpuformer_lib.hardware import _cpu_has_native_bf16, pick_device

REHEARSE_ENV = "GPUFORMER_REHEARSE"


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """What one device (or node) can do. Every device-dependent choice is a function of this."""

    name: str
    """Profile name (``cpu``, ``t4``, ``a100-40gb``, ``h100-80gb``, ``8xh100``) or ``this machine``."""
    kind: str
    """``cpu``, ``cuda`` or ``mps``: the kind of device the work runs on (or would, when rehearsed)."""
    gpu_name: str | None = None
    """The name the driver reports, e.g. ``Tesla T4``; the datasheet peaks are looked up by it."""
    gpu_count: int = 0
    """CUDA GPUs visible to the process (on one node)."""
    memory_gib: float | None = None
    """Memory of one GPU in GiB (2**30 bytes) as the driver reports it; None on a CPU."""
    compute_capability: tuple[int, int] | None = None
    """7.5 Turing (T4), 8.0 Ampere (A100), 9.0 Hopper (H100)."""
    bf16: bool = False
    """Native bfloat16 arithmetic (tensor cores on a GPU, AVX512-BF16/AMX on a CPU)."""
    fp16_tensor_cores: bool = False
    """float16 matrix products on tensor cores (every NVIDIA GPU since Volta)."""
    tf32: bool = False
    """TensorFloat-32 tensor cores for float32 matrix products (sm_80+)."""
    sdpa_kernels: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """Fused attention kernels available per dtype name, e.g. ``{"float16": ("flash", "efficient", "math")}``."""
    triton_tensor_cores: bool = False
    """Triton's ``tl.dot`` uses tensor cores (Triton >= 3.2 only on sm_80+; below, it falls back to FMA)."""
    nvml: bool = False
    """The NVIDIA management library can be read (``nvidia-ml-py`` installed, an NVIDIA driver)."""
    rehearsal: bool = False
    """True when this profile is rehearsed: reported as this device, computed on the CPU at toy sizes."""

    def __post_init__(self):
        if self.kind not in ("cpu", "cuda", "mps"):
            raise ValueError(f"kind must be 'cpu', 'cuda' or 'mps', not {self.kind!r}")
        if isinstance(self.gpu_count, bool) or not isinstance(self.gpu_count, int) or self.gpu_count < 0:
            raise ValueError(f"profile {self.name!r}: gpu_count must be an int >= 0, got {self.gpu_count!r}")
        if self.memory_gib is not None and not 0 < self.memory_gib < float("inf"):
            raise ValueError(f"profile {self.name!r}: memory_gib must be a positive number of GiB or None, got "
                             f"{self.memory_gib!r}")
        cc = self.compute_capability
        if cc is not None and not (isinstance(cc, tuple) and len(cc) == 2 and all(isinstance(v, int) for v in cc)):
            raise ValueError(f"profile {self.name!r}: compute_capability must be (major, minor) ints such as (8, 0), "
                             f"got {cc!r}")
        if self.kind == "cuda" and (self.gpu_count < 1 or self.memory_gib is None or self.compute_capability is None):
            raise ValueError(f"profile {self.name!r}: a CUDA profile needs gpu_count >= 1, memory_gib and "
                             "compute_capability")

    @property
    def on_gpu(self) -> bool:
        """Whether the GPU paths run: on a CUDA GPU, or rehearsing one."""
        return self.kind == "cuda"

    @property
    def tensor_core_generation(self) -> str | None:
        """The tensor cores' generation, from the compute capability (None without tensor cores)."""
        if self.compute_capability is None:
            return None
        major, minor = self.compute_capability
        if major >= 10:
            return "5th (Blackwell)"
        if major == 9:
            return "4th (Hopper)"
        if (major, minor) >= (8, 0):
            return "3rd (Ampere/Ada)"
        if (major, minor) >= (7, 5):
            return "2nd (Turing)"
        return "1st (Volta)" if major == 7 else None

    def describe(self) -> str:
        """One line for a notebook's header."""
        with display_only():
            return self._describe()

    def _describe(self) -> str:
        if not self.on_gpu:
            text = f"{self.kind}: bf16 {'native' if self.bf16 else 'not native'}"
        else:
            cc = ".".join(map(str, self.compute_capability))
            fast = ", ".join(k for k, v in (("bf16", self.bf16), ("fp16", self.fp16_tensor_cores),
                                            ("tf32", self.tf32)) if v)
            text = (f"{self.gpu_count} x {self.gpu_name} ({self.memory_gib:.1f} GiB, sm_{cc.replace('.', '')}, "
                    f"{self.tensor_core_generation or 'no'} tensor cores: {fast or 'none'}; fp16 attention kernels: "
                    f"{', '.join(self.sdpa_kernels.get('float16', ())) or 'math only'})")
        if self.rehearsal:
            text += f"\nREHEARSAL of the '{self.name}' profile: computed on the CPU at toy sizes; numbers are not a GPU's"
        return text


def _sdpa_kernels(cc: tuple[int, int]) -> dict[str, tuple[str, ...]]:
    """Fused attention kernels per dtype, by PyTorch's rules (sdp_utils.cpp) for a compute capability."""
    if cc >= (8, 0):
        return {"float16": ("flash", "efficient", "cudnn", "math"), "bfloat16": ("flash", "efficient", "cudnn", "math"),
                "float32": ("efficient", "math")}
    return {"float16": ("efficient", "math"), "bfloat16": ("math",), "float32": ("efficient", "math")}


def _gpu(name: str, gpu_name: str, memory_gib: float, cc: tuple[int, int], count: int = 1) -> DeviceProfile:
    ampere = cc >= (8, 0)
    return DeviceProfile(name=name, kind="cuda", gpu_name=gpu_name, gpu_count=count, memory_gib=memory_gib,
                         compute_capability=cc, bf16=ampere, fp16_tensor_cores=cc >= (7, 0), tf32=ampere,
                         sdpa_kernels=_sdpa_kernels(cc), triton_tensor_cores=ampere, nvml=True)


_CPU_SDPA_KERNELS = {dtype: ("flash", "math") for dtype in ("float32", "float64", "bfloat16", "float16")}
"""PyTorch's flash-attention-for-CPU kernel takes all four; tests/test_tiled_attention.py checks it is what runs."""


PROFILES: dict[str, DeviceProfile] = {
    "cpu": DeviceProfile(name="cpu", kind="cpu", sdpa_kernels=_CPU_SDPA_KERNELS),
    # memory as torch reports it on these cards (total_memory / 2**30), not the marketing figure
    "t4": _gpu("t4", "Tesla T4", 14.7, (7, 5)),
    "a100-40gb": _gpu("a100-40gb", "NVIDIA A100-SXM4-40GB", 39.4, (8, 0)),
    "h100-80gb": _gpu("h100-80gb", "NVIDIA H100 80GB HBM3", 79.1, (9, 0)),
    "8xh100": _gpu("8xh100", "NVIDIA H100 80GB HBM3", 79.1, (9, 0), count=8),
}
"""Named profiles that CI rehearses and tests every choice under."""


# --------------------------------------------------------------------------- which fields a rehearsal reads

PROFILE_READS_ENV = "GPUFORMER_PROFILE_READS"
"""A folder: under rehearsal, each process appends to ``<folder>/<pid>.txt`` the name of every field of the
rehearsed profile it reads (once each). ``make rehearse`` records the first profile's reads per notebook and
rehearses each later profile only on the notebooks that read a field whose value differs between the two
(:func:`profiles_differ_on`, :mod:`gpuformer_lib.tools.rehearsal_plan`): a notebook that reads only equal
values takes the same path under both, so its second rehearsal would run the same code again."""

_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(DeviceProfile))
_noted_reads: set[str] = set()
_display_depth = [0]


@contextlib.contextmanager
def display_only():
    """Reads of the rehearsed profile inside this block are not noted: they only make text for the reader
    (:meth:`DeviceProfile.describe`, a notebook's opening lines), which no later choice depends on."""
    _display_depth[0] += 1
    try:
        yield
    finally:
        _display_depth[0] -= 1


def _reader() -> str:
    """``file:line`` of the first frame outside this module: where a field was read."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def _note_read(field: str) -> None:
    if field in _noted_reads or _display_depth[0]:
        return
    _noted_reads.add(field)
    folder = os.environ.get(PROFILE_READS_ENV)
    if folder:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{os.getpid()}.txt"), "a", encoding="utf-8") as f:
            f.write(f"{field}\t{_reader()}\n")


class _ReadRecordingProfile(DeviceProfile):
    """The rehearsed profile: a :class:`DeviceProfile` that notes each field read (see PROFILE_READS_ENV)."""

    def __getattribute__(self, attr: str):
        if attr in _FIELD_NAMES:
            _note_read(attr)
        return object.__getattribute__(self, attr)

    def __repr__(self) -> str:
        return "DeviceProfile(" + ", ".join(f"{f}={object.__getattribute__(self, f)!r}" for f in
                                            (f.name for f in dataclasses.fields(DeviceProfile))) + ")"


def profiles_differ_on(first: DeviceProfile, second: DeviceProfile) -> frozenset[str]:
    """The fields whose values differ between two profiles (``rehearsal`` aside: both are rehearsed)."""
    return frozenset(f for f in _FIELD_NAMES - {"rehearsal"}
                     if object.__getattribute__(first, f) != object.__getattribute__(second, f))


def _rehearsal_name() -> str | None:
    name = os.environ.get(REHEARSE_ENV, "").strip().lower() or None
    if name is not None and name not in PROFILES:
        raise ValueError(f"${REHEARSE_ENV}={name!r} is not a profile; choose one of {', '.join(PROFILES)} "
                         f"(or unset it to use this machine)")
    return name


def rehearsal_name() -> str | None:
    """The profile named by ``$GPUFORMER_REHEARSE``, or None when not rehearsing. (Code that only asks
    *whether* it rehearses, or for the profile's fields, calls :func:`rehearsed_profile`: the name is one more
    read of the profile's ``name``.)"""
    name = _rehearsal_name()
    if name is not None:
        _note_read("name")
    return name


def rehearsed_profile() -> DeviceProfile | None:
    """The profile ``$GPUFORMER_REHEARSE`` names, marked ``rehearsal=True``, or None when not rehearsing."""
    name = _rehearsal_name()
    if name is None:
        return None
    profile = dataclasses.replace(PROFILES[name], rehearsal=True)
    object.__setattr__(profile, "__class__", _ReadRecordingProfile)  # built first: __post_init__'s reads are not the caller's
    return profile


def rehearsing_gpu() -> bool:
    """Whether a GPU profile is being rehearsed (cheap: reads the environment only)."""
    profile = rehearsed_profile()
    return profile is not None and profile.on_gpu


def _nvml_present() -> bool:
    try:
        import pynvml  # noqa: F401  (nvidia-ml-py)
    except ImportError:
        return False
    return True


def describe_device(device: str | torch.device | None = None) -> DeviceProfile:
    """The profile of the device this process really runs on (no rehearsal)."""
    device = pick_device(device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        cc = (props.major, props.minor)
        rocm = getattr(torch.version, "hip", None) is not None
        base = _gpu("this machine", props.name, round(props.total_memory / 2**30, 1), cc, torch.cuda.device_count())
        if rocm:  # AMD: no TF32, no Triton/NVML claims; bf16 as PyTorch reports it
            base = dataclasses.replace(base, bf16=torch.cuda.is_bf16_supported(including_emulation=False), tf32=False,
                                       triton_tensor_cores=False, nvml=False)
        return dataclasses.replace(base, nvml=base.nvml and _nvml_present())
    if device.type == "mps":
        return DeviceProfile(name="this machine", kind="mps", bf16=True, sdpa_kernels={"float32": ("math",)})
    return dataclasses.replace(PROFILES["cpu"], name="this machine", bf16=_cpu_has_native_bf16())


def current_profile(device: str | torch.device | None = None) -> DeviceProfile:
    """The profile every choice is made from: the rehearsed one if ``$GPUFORMER_REHEARSE`` names one,
    else this machine's (:func:`describe_device`)."""
    profile = rehearsed_profile()
    return profile if profile is not None else describe_device(device)


def _check_profile(profile) -> None:
    if not isinstance(profile, DeviceProfile):
        raise TypeError(f"profile must be a DeviceProfile, got {profile!r}: take current_profile(), or a named one "
                        "such as PROFILES['t4']")


def compute_device(profile: DeviceProfile, device: str | torch.device | None = None) -> torch.device:
    """Where tensors go: the CPU under rehearsal, else :func:`~gpuformer_lib.hardware.pick_device`."""
    _check_profile(profile)
    return torch.device("cpu") if profile.rehearsal else pick_device(device)


# --------------------------------------------------------------------------- choices made from a profile


def low_precision_dtype(profile: DeviceProfile) -> torch.dtype | None:
    """The 16-bit format a GPU computes fastest in: bf16 with native support, else fp16 on a GPU with fp16
    tensor cores (a T4: ``torch.cuda.is_bf16_supported()`` says True there because it counts emulation).
    On a CPU: bf16 when native, else None (stay in float32: emulated 16-bit is slower)."""
    _check_profile(profile)
    if profile.bf16:
        return torch.bfloat16
    if profile.on_gpu and profile.fp16_tensor_cores:
        return torch.float16
    return None


def training_precision(profile: DeviceProfile) -> str:
    """``TrainConfig.precision`` for a training run: ``bf16`` or ``fp16`` (with a loss scaler) on a GPU,
    ``fp32`` on a CPU (where the models are small and autocast only adds casts)."""
    _check_profile(profile)
    if not profile.on_gpu:
        return "fp32"
    dtype = low_precision_dtype(profile)
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")


def compute_dtype(profile: DeviceProfile) -> torch.dtype:
    """dtype for tensors a notebook creates to time or demonstrate a kernel: the fast 16-bit format on a
    GPU, float32 on a CPU."""
    _check_profile(profile)
    return (low_precision_dtype(profile) or torch.float32) if profile.on_gpu else torch.float32


# --------------------------------------------------------------------------- size presets

PRESET_ENV = "GPUFORMER_PRESET"
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


# GPUs with at least this much memory get the `gpu` sizes; smaller ones (a T4) `gpu-small`.
GPU_PRESET_MIN_GIB = 24.0


def preset_name(profile: DeviceProfile) -> str:
    """The size preset for a profile, by memory: ``gpu`` from 24 GiB, ``gpu-small`` below and on MPS."""
    _check_profile(profile)
    if profile.kind == "cpu":
        return "cpu"
    if profile.kind == "mps" or profile.memory_gib < GPU_PRESET_MIN_GIB:
        return "gpu-small"
    return "gpu"


def size_preset(profile: DeviceProfile, name: str | None = None) -> SizePreset:
    """The :class:`SizePreset` for a profile (``gpuformer_lib.device`` re-exports it); under rehearsal it is named
    for the profile but picks the CPU (toy) sizes. ``name`` or ``$GPUFORMER_PRESET`` override the choice."""
    _check_profile(profile)
    if profile.rehearsal:
        # A rehearsed preset's name is for the reader: pick() gives the toy sizes whatever it is, and every plan
        # the library makes from a preset checks `toy` first. So its reads of the profile are display only.
        with display_only():
            return SizePreset(name or os.environ.get(PRESET_ENV) or preset_name(profile),
                              f"rehearsing the '{profile.name}' profile", toy=True)
    if name is None and os.environ.get(PRESET_ENV):
        name, reason = os.environ[PRESET_ENV], f"set by ${PRESET_ENV}"
    elif name is not None:
        reason = "chosen by the caller"
    else:
        name = preset_name(profile)
        reason = f"{profile.memory_gib:.0f} GiB GPU" if profile.on_gpu else ("Apple MPS" if profile.kind == "mps"
                                                                            else "no GPU in use")
    return SizePreset(name, reason)


def data_parallel_world(profile: DeviceProfile, global_batch: int) -> tuple[int, str]:
    """(processes, backend) for data-parallel runs of ``global_batch`` samples: the largest number of GPUs
    that divides the batch, with NCCL, when there are two or more GPUs; otherwise 2 CPU processes with gloo.
    (3, 5, 6 or 7 GPUs do not all divide a batch of 8; taking every GPU would break the run.)"""
    _check_profile(profile)
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise ValueError(f"global_batch must be an int >= 1, got {global_batch!r}")
    if profile.on_gpu and profile.gpu_count >= 2:
        world = max(n for n in range(1, profile.gpu_count + 1) if global_batch % n == 0)
        if world >= 2:  # rehearsed: the same number of processes, on the CPU with gloo
            return world, "gloo" if profile.rehearsal else "nccl"
    return 2, "gloo"


def collective_backend(profile: DeviceProfile, processes: int) -> str:
    """The ``torch.distributed`` backend for ``processes`` processes on one node: NCCL when each can have
    a GPU of its own, else gloo (CPU processes). Rehearsing a GPU profile always gives gloo: the profile's
    GPUs are not really there, so its processes run on the CPU."""
    _check_profile(profile)
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes must be an int >= 1, got {processes!r}")
    if profile.on_gpu and not profile.rehearsal and profile.gpu_count >= processes:
        return "nccl"
    return "gloo"
