"""Device profiles, the choices made from them, rehearsal, and the CUDA-only wrappers' stand-ins.

Every profile is checked here on the CPU: the choices a notebook makes on a T4 or an H100 are library
functions, so they run in CI although no GPU is present.
"""

import pytest
import torch

from gpuformer_lib import bench, gpu, profiles
from gpuformer_lib.device import choose_preset, pick_device
from gpuformer_lib.profiles import PROFILES

GPU_PROFILES = [name for name, p in PROFILES.items() if p.on_gpu]


@pytest.fixture
def rehearse(monkeypatch):
    def set_profile(name):
        monkeypatch.setenv(profiles.REHEARSE_ENV, name)
        monkeypatch.delenv("GPUFORMER_PRESET", raising=False)
        return profiles.current_profile()
    return set_profile


def test_the_named_profiles_exist_and_are_consistent():
    assert {"cpu", "t4", "a100-40gb", "h100-80gb", "8xh100"} <= set(PROFILES)
    for p in PROFILES.values():
        if p.on_gpu:
            assert p.fp16_tensor_cores and p.memory_gib > 10 and p.compute_capability >= (7, 5)
            assert p.tf32 == p.bf16 == (p.compute_capability >= (8, 0)) == p.triton_tensor_cores
            assert "math" in p.sdpa_kernels["float16"]


def test_t4_facts():
    t4 = PROFILES["t4"]
    assert t4.compute_capability == (7, 5) and not t4.bf16 and not t4.tf32
    assert "flash" not in t4.sdpa_kernels["float16"] and t4.sdpa_kernels["bfloat16"] == ("math",)
    assert t4.tensor_core_generation.startswith("2nd")


@pytest.mark.parametrize("name, precision, dtype, preset", [
    ("cpu", "fp32", None, "cpu"),
    ("t4", "fp16", torch.float16, "gpu-small"),  # never emulated bf16 on a T4
    ("a100-40gb", "bf16", torch.bfloat16, "gpu"),
    ("h100-80gb", "bf16", torch.bfloat16, "gpu"),
    ("8xh100", "bf16", torch.bfloat16, "gpu"),
])
def test_choices_for_every_profile(name, precision, dtype, preset):
    p = PROFILES[name]
    assert profiles.training_precision(p) == precision
    assert profiles.low_precision_dtype(p) == dtype
    assert profiles.preset_name(p) == preset
    assert profiles.compute_dtype(p) == (dtype if p.on_gpu else torch.float32)


def test_a_cpu_with_native_bf16_autocasts_to_bf16_but_trains_in_fp32():
    import dataclasses

    cpu = dataclasses.replace(PROFILES["cpu"], bf16=True)
    assert profiles.low_precision_dtype(cpu) == torch.bfloat16
    assert profiles.training_precision(cpu) == "fp32" and profiles.compute_dtype(cpu) == torch.float32


@pytest.mark.parametrize("gpus", range(0, 9))
def test_data_parallel_world_always_divides_the_batch(gpus):
    import dataclasses

    p = PROFILES["cpu"] if gpus == 0 else dataclasses.replace(PROFILES["h100-80gb"], gpu_count=gpus)
    world, backend = profiles.data_parallel_world(p, 8)
    assert 8 % world == 0 and world <= max(gpus, 2)
    assert backend == ("nccl" if gpus >= 2 else "gloo")
    if gpus in (3, 5, 6, 7):  # every GPU would not divide a batch of 8 (finding B12)
        assert world < gpus


def test_rehearsal_reports_the_profile_and_computes_on_the_cpu(rehearse):
    p = rehearse("t4")
    assert p.rehearsal and p.on_gpu and p.gpu_name == "Tesla T4"
    assert profiles.compute_device(p) == torch.device("cpu")
    preset = choose_preset()
    assert preset.name == "gpu-small" and preset.toy
    assert preset.pick(cpu=1, gpu=3, gpu_small=2) == 1  # toy sizes
    assert "REHEARSAL" in p.describe()
    assert profiles.data_parallel_world(rehearse("8xh100"), 8) == (8, "gloo")  # the same processes, on gloo


def test_an_unknown_rehearsal_profile_is_refused(monkeypatch):
    monkeypatch.setenv(profiles.REHEARSE_ENV, "v100")
    with pytest.raises(ValueError, match="not a profile"):
        profiles.current_profile()


def test_without_rehearsal_this_machine_is_described(monkeypatch):
    monkeypatch.delenv(profiles.REHEARSE_ENV, raising=False)
    p = profiles.current_profile("cpu")
    assert p.name == "this machine" and not p.rehearsal and p.kind == "cpu" and not p.on_gpu


# --------------------------------------------------------------------------- gpu.py wrappers


def test_cuda_calls_on_a_cpu_without_rehearsal_say_what_to_do(monkeypatch):
    monkeypatch.delenv(profiles.REHEARSE_ENV, raising=False)
    with pytest.raises(ValueError, match="needs a GPU"):
        gpu.memory_allocated("cpu")
    with pytest.raises(ValueError, match="needs a GPU"):
        with gpu.memory_cap("cpu", 2**20):
            pass


def test_stand_ins_check_their_arguments(rehearse, tmp_path):
    rehearse("t4")
    assert gpu.memory_allocated("cpu") == 0 and gpu.max_memory_allocated() == 0
    free, total = gpu.mem_get_info("cpu")
    assert free == total == int(14.7 * 2**30)
    with gpu.memory_cap("cpu", 2**30):
        pass
    for bad in (0, -1, 2**40, 1.5e9, True):
        with pytest.raises(ValueError, match="cap_bytes"):
            with gpu.memory_cap("cpu", bad):
                pass
    with pytest.raises(ValueError, match="does not exist on the rehearsed 't4'"):
        gpu.synchronize("cuda:1")
    gpu.synchronize("cuda:0")
    with gpu.memory_history(tmp_path / "snap.pickle", "cpu"):
        pass
    with pytest.raises(ValueError, match="not a folder"):
        with gpu.memory_history(tmp_path / "missing" / "snap.pickle", "cpu"):
            pass
    assert gpu.event_seconds(lambda: None, "cpu", number=3) >= 0


@pytest.mark.parametrize("real_gpus", [1, 8])
def test_under_rehearsal_the_profile_wins_on_a_machine_with_gpus(rehearse, monkeypatch, real_gpus):
    """`make test` on a GPU machine: the rehearsed profile decides, not the GPUs present. Before, gpu.py treated
    cuda:N as real whenever CUDA was available: cuda:1 under the T4 profile raised CUDA's invalid-ordinal error on
    one GPU and was accepted on eight (the test above said "DID NOT RAISE"). CUDA is faked here; no real CUDA call
    may happen under rehearsal."""
    def no_cuda_call(*args, **kwargs):
        raise AssertionError("a real CUDA call under rehearsal")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: real_gpus)
    for name in ("synchronize", "set_device", "memory_allocated", "max_memory_allocated", "memory_reserved",
                 "reset_peak_memory_stats", "get_device_properties", "mem_get_info"):
        monkeypatch.setattr(torch.cuda, name, no_cuda_call)
    rehearse("t4")
    with pytest.raises(ValueError, match="does not exist on the rehearsed 't4'"):
        gpu.synchronize("cuda:1")
    gpu.synchronize("cuda:0")
    gpu.set_current(0)
    assert gpu.memory_allocated("cuda:0") == gpu.max_memory_allocated("cuda") == gpu.memory_reserved(0) == 0
    gpu.reset_peak_memory_stats("cuda:0")
    assert gpu.total_memory("cuda:0") == int(PROFILES["t4"].memory_gib * 2**30)
    assert gpu.mem_get_info("cuda:0")[0] == gpu.total_memory("cuda:0")
    assert gpu.device_properties("cuda:0")["name"] == "Tesla T4"
    rehearse("8xh100")  # eight rehearsed GPUs, whatever this machine has
    gpu.synchronize("cuda:7")
    with pytest.raises(ValueError, match="does not exist on the rehearsed '8xh100'"):
        gpu.synchronize("cuda:8")


def test_memory_cap_is_lifted_after_an_error(monkeypatch):
    """On a GPU the cap is set, and lifted again even when the block raises (stubbed CUDA calls)."""
    calls = []
    monkeypatch.delenv(profiles.REHEARSE_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: calls.append(f))

    class Props:
        total_memory = 16 * 2**30
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: Props)
    with pytest.raises(RuntimeError, match="inside"):
        with gpu.memory_cap("cuda:0", 4 * 2**30):
            raise RuntimeError("inside")
    assert calls == [0.25, 1.0]


# --------------------------------------------------------------------------- B10: timing on cuda:N


class _FakeEvent:
    log: list = []

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        _FakeEvent.log.append(("record", stream))
        self.t = len(_FakeEvent.log)

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return float(other.t - self.t)


def test_event_timing_records_on_the_timed_devices_stream(monkeypatch):
    """Finding B10: events recorded with no stream land on the *current* GPU's stream; timing work on
    cuda:1 then measures an empty stream on cuda:0. The events must be recorded on cuda:1's stream."""
    monkeypatch.delenv(profiles.REHEARSE_ENV, raising=False)
    current = {"device": 0}
    entered = []

    class DeviceGuard:
        def __init__(self, device):
            self.index = torch.device(device).index

        def __enter__(self):
            entered.append(self.index)
            self.prev, current["device"] = current["device"], self.index

        def __exit__(self, *exc):
            current["device"] = self.prev

    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "device", DeviceGuard)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: f"stream of cuda:{torch.device(d).index}")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: None)
    _FakeEvent.log = []
    timing = bench.time_fn(lambda: None, device="cuda:1", warmup=0, repeats=2)
    assert entered == [1, 1]
    assert {stream for _, stream in _FakeEvent.log} == {"stream of cuda:1"}
    assert len(timing.times) == 2


def test_pick_device_makes_the_chosen_gpu_current(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    made_current = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: made_current.append(d))
    assert pick_device("cuda:1") == torch.device("cuda", 1)
    assert made_current == [1]
