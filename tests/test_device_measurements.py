"""The device-dependent measurements of the notebooks, checked for every profile on the CPU: which formats
and precision modes each GPU gets (findings B6, B15), host-to-GPU copies and kernel timing with their
rehearsal stand-ins, and the GPU's properties through ``gpu.device_properties``.

CUDA calls are stubbed with monkeypatch where a test follows the real GPU path."""

from types import SimpleNamespace

import pytest
import torch

from gpuformer_lib import bench, device_measurements, gpu, profiles
from gpuformer_lib.device_measurements import (EMULATED_MAX_SIZE, KernelRate, MatmulFormat, host_to_device_bandwidth,
                                               is_emulated, kernel_milliseconds, kernel_rate, matmul_formats,
                                               precision_modes, readback_cost, time_configs, training_precision_on)
from gpuformer_lib.profiles import PROFILES

GPU_PROFILES = [name for name, p in PROFILES.items() if p.on_gpu]
MPS = profiles.DeviceProfile(name="mps", kind="mps", bf16=True)


@pytest.fixture(autouse=True)
def no_rehearsal(monkeypatch):
    monkeypatch.delenv(profiles.REHEARSE_ENV, raising=False)


@pytest.fixture
def native_bf16(monkeypatch):
    def set_native(native: bool):
        monkeypatch.setattr(device_measurements, "_cpu_has_native_bf16", lambda: native)
    return set_native


@pytest.mark.parametrize("name, labels", [
    ("t4", ["float32", "float16"]),  # no TF32 and no native bf16 below sm_80 (B6)
    ("a100-40gb", ["float32", "tf32", "float16", "bfloat16"]),
    ("h100-80gb", ["float32", "tf32", "float16", "bfloat16"]),
    ("cpu", ["float64", "float32", "bfloat16", "float16"]),
])
def test_matmul_formats_follow_the_profile(name, labels):
    formats = matmul_formats(PROFILES[name], "cuda" if PROFILES[name].on_gpu else "cpu")
    assert [f.label for f in formats] == labels
    assert [f.label for f in formats if f.tf32] == (["tf32"] if "tf32" in labels else [])
    assert all(f.dtype == torch.float32 for f in formats if f.tf32)
    assert [f.label for f in matmul_formats(MPS, "mps")] == ["float32", "float16"]


def test_a_gpu_computes_every_format_natively_but_a_rehearsal_on_the_cpu_does_not(native_bf16):
    native_bf16(False)
    on_gpu = matmul_formats(PROFILES["h100-80gb"], "cuda:0")
    rehearsed = matmul_formats(PROFILES["h100-80gb"], "cpu")
    assert not any(f.emulated for f in on_gpu)
    assert {f.label for f in rehearsed if f.emulated} == {"float16", "bfloat16"}
    native_bf16(True)
    assert {f.label for f in matmul_formats(PROFILES["cpu"], "cpu") if f.emulated} == {"float16"}


def test_is_emulated(native_bf16):
    native_bf16(False)
    assert is_emulated(torch.float16, "cpu") and is_emulated(torch.bfloat16, "cpu")
    assert not is_emulated(torch.float32, "cpu") and not is_emulated(torch.float64, torch.device("cpu"))
    assert not is_emulated(torch.float16, "cuda:1") and not is_emulated(torch.bfloat16, "cuda")
    native_bf16(True)
    assert is_emulated(torch.float16, "cpu") and not is_emulated(torch.bfloat16, "cpu")


def test_an_emulated_format_is_timed_at_small_sizes_only():
    sizes = [64, 128, 256, 512, 4096]
    assert MatmulFormat("float16", torch.float16, emulated=True).sizes(sizes) == [s for s in sizes
                                                                                 if s <= EMULATED_MAX_SIZE]
    assert MatmulFormat("float16", torch.float16).sizes(sizes) == sizes
    with pytest.raises(ValueError, match="float32"):
        MatmulFormat("tf32", torch.float16, tf32=True)


@pytest.mark.parametrize("name, modes", [
    ("t4", ["fp32", "fp16"]),  # B15: no "tf32" row on a T4, where it would be float32 again
    ("a100-40gb", ["fp32", "tf32", "bf16", "fp16"]),
    ("h100-80gb", ["fp32", "tf32", "bf16", "fp16"]),
    ("8xh100", ["fp32", "tf32", "bf16", "fp16"]),
    ("cpu", ["fp32", "bf16", "fp16"]),
])
def test_precision_modes(name, modes):
    assert precision_modes(PROFILES[name]) == modes


def test_training_precision_is_the_gpus_and_a_rehearsal_stays_fast(native_bf16):
    native_bf16(False)
    assert training_precision_on(PROFILES["t4"], "cuda:0") == "fp16"  # B6: never emulated bf16 on a T4
    assert training_precision_on(PROFILES["h100-80gb"], "cuda") == "bf16"
    assert training_precision_on(PROFILES["t4"], "cpu") == "fp32"  # rehearsed: fp16 is emulated on a CPU
    assert training_precision_on(PROFILES["h100-80gb"], "cpu") == "fp32"
    assert training_precision_on(PROFILES["cpu"], "cpu") == "fp32"
    native_bf16(True)
    assert training_precision_on(PROFILES["h100-80gb"], "cpu") == "bf16"


def test_host_to_device_bandwidth_needs_a_gpu_or_a_rehearsal(monkeypatch):
    with pytest.raises(ValueError, match="CUDA device"):
        host_to_device_bandwidth(2**16, "cpu", pinned=True)
    monkeypatch.setenv(profiles.REHEARSE_ENV, "t4")
    for pinned in (False, True):  # no pinned allocator without a GPU: the stand-in copies host to host
        assert host_to_device_bandwidth(2**16, "cpu", pinned=pinned, repeats=3) > 0
    with pytest.raises(ValueError, match="nbytes"):
        host_to_device_bandwidth(0, "cpu", pinned=False)
    monkeypatch.setenv(profiles.REHEARSE_ENV, "cpu")
    with pytest.raises(ValueError, match="CUDA device"):
        host_to_device_bandwidth(2**16, "cpu", pinned=False)


def test_host_to_device_bandwidth_on_a_gpu_measures_the_real_copy(monkeypatch):
    calls = []
    monkeypatch.setattr(bench, "measure_transfer_bandwidth",
                        lambda nbytes, device, *, pinned, repeats: calls.append((nbytes, device, pinned)) or 1e10)
    assert host_to_device_bandwidth(2**20, "cuda:1", pinned=True) == 1e10
    assert calls == [(2**20, torch.device("cuda", 1), True)]


def test_kernel_milliseconds_uses_do_bench_on_a_gpu_and_the_clock_elsewhere(monkeypatch):
    import triton.testing

    ran = []
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn: ran.append(fn) or 0.25)
    assert kernel_milliseconds(lambda: None, "cuda:0") == 0.25 and len(ran) == 1
    assert 0 < kernel_milliseconds(lambda: sum(range(1000)), "cpu") < 1e3
    assert len(ran) == 1


def test_time_configs_records_a_configuration_that_does_not_run(monkeypatch):
    speeds = {(64, 64): 2.0, (128, 128): 1.0, (128, 256): None}
    monkeypatch.setattr(device_measurements, "kernel_milliseconds", lambda fn, device: fn())

    def run(config):
        if speeds[config] is None:
            raise RuntimeError("out of resource: shared memory")  # what Triton raises for too-large tiles
        return speeds[config]

    timings = time_configs(run, list(speeds), "cuda")
    assert timings.milliseconds == speeds and timings.best == (128, 128) and timings.best_milliseconds == 1.0
    with pytest.raises(ValueError, match="no configuration ran"):
        time_configs(run, [(128, 256)], "cuda").best
    with pytest.raises(ValueError):
        time_configs(run, [], "cuda")


def test_readback_cost_times_both_ways_after_a_warm_up():
    calls = []

    def step():
        calls.append(1)
        return torch.tensor(float(len(calls)))

    cost = readback_cost(step, "cpu", steps=3, warmup=2)
    assert len(calls) == 2 + 3 + 3
    assert cost.every_step > 0 and cost.at_the_end > 0 and cost.speedup > 0
    assert str(cost).startswith(".item() every step:")
    with pytest.raises(ValueError):
        readback_cost(step, "cpu", steps=0)


def test_device_properties_in_rehearsal_and_on_a_gpu(monkeypatch):
    monkeypatch.setenv(profiles.REHEARSE_ENV, "t4")
    assert gpu.device_properties("cpu") == {"name": "Tesla T4", "total_memory": int(14.7 * 2**30)}
    monkeypatch.delenv(profiles.REHEARSE_ENV)
    with pytest.raises(ValueError, match="not a CUDA device"):
        gpu.device_properties("cpu")
    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", multi_processor_count=132, warp_size=32,
                            total_memory=80 * 2**30)  # an older PyTorch without the other fields
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: props)
    assert gpu.device_properties("cuda:0") == {"name": props.name, "multi_processor_count": 132, "warp_size": 32,
                                               "total_memory": 80 * 2**30}


def test_kernel_rate_gives_bandwidth_and_the_roofline_point(monkeypatch):
    rate = KernelRate("vector add", milliseconds=2.0, nbytes=12 * 1000, flops=1000)
    assert rate.bytes_per_s == pytest.approx(6e6) and rate.flops_per_s == pytest.approx(5e5)
    assert rate.roofline_point() == ("vector add", pytest.approx(1 / 12), pytest.approx(5e5))
    for bad in (dict(milliseconds=0.0, nbytes=1), dict(milliseconds=1.0, nbytes=0), dict(milliseconds=1.0, nbytes=1,
                                                                                      flops=-1)):
        with pytest.raises(ValueError):
            KernelRate("bad", **bad)
    monkeypatch.setattr(device_measurements, "kernel_milliseconds", lambda fn, device: fn())
    assert kernel_rate("copy", lambda: 4.0, "cuda", nbytes=8_000) == KernelRate("copy", 4.0, 8_000, 0)
