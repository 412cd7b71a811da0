"""The timer on known work, measured throughput, the peak table and the roofline arithmetic."""

import time

import pytest
import torch

from fake_clock import FakeClock
from gpuformer_lib import bench


def test_timer_measures_known_work():
    calls = []

    def work():
        calls.append(1)
        time.sleep(0.02)

    timing = bench.time_fn(work, warmup=2, repeats=5)
    assert len(calls) == 2 + 5
    assert len(timing.times) == 5
    assert timing.median >= 0.019  # the real clock: a sleep lasts at least as long as asked, on any load
    assert timing.min <= timing.median


# The timer's arithmetic on a clock of the test's own (each call moves it by a known amount), so that the
# values are exact: a real sleep can last any time longer than asked on a busy machine.


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(bench, "time", fake)
    return fake


def test_timer_divides_by_calls_per_repeat(clock):
    timing = bench.time_fn(lambda: clock.sleep(0.005), warmup=0, repeats=3, number=4)
    assert timing.times == pytest.approx((0.005,) * 3)


def test_timer_median_ignores_one_outlier(clock):
    delays = iter([0.0] + [0.01, 0.01, 0.2, 0.01, 0.01])
    timing = bench.time_fn(lambda: clock.sleep(next(delays)), warmup=1, repeats=5)
    assert timing.median == pytest.approx(0.01) and max(timing.times) == pytest.approx(0.2)


def test_timer_stops_at_its_time_limit(clock):
    timing = bench.time_fn(lambda: clock.sleep(0.0625), warmup=0, repeats=100, max_seconds=0.2)
    assert len(timing.times) == 4  # the first repeat past 0.2 s: 4 x 0.0625 = 0.25
    timing = bench.time_fn(lambda: clock.sleep(1.0), warmup=0, repeats=100, max_seconds=0.2)
    assert len(timing.times) == 3  # never fewer than 3 repeats


@pytest.mark.parametrize("kwargs", [dict(repeats=0), dict(warmup=-1), dict(number=0)])
def test_timer_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        bench.time_fn(lambda: None, **kwargs)


def test_speedup_is_before_over_after():
    assert bench.speedup(10.0, 2.7) == pytest.approx(3.7037, rel=1e-4)
    assert bench.speedup(1.0, 2.0) == 0.5
    with pytest.raises(ValueError):
        bench.speedup(0.0, 1.0)


def test_matmul_flops():
    assert bench.matmul_flops(2, 3, 4) == 48


def test_measure_matmul_on_cpu():
    result = bench.measure_matmul(64, torch.float32, "cpu", repeats=3)
    assert result.dtype == "float32" and result.n == 64
    assert result.flops_per_s == pytest.approx(2 * 64**3 / result.timing.median)
    assert bench.measure_matmul(32, torch.bfloat16, "cpu", repeats=3).dtype == "bfloat16"
    with pytest.raises(ValueError, match="float32"):
        bench.measure_matmul(32, torch.float16, "cpu", tf32=True)


def test_tf32_setting_is_restored():
    before = torch.get_float32_matmul_precision()
    bench.measure_matmul(32, torch.float32, "cpu", tf32=True, repeats=3)
    assert torch.get_float32_matmul_precision() == before


def test_copy_bandwidth_is_plausible():
    bandwidth = bench.measure_copy_bandwidth(2**22, "cpu", repeats=3)
    assert 1e8 < bandwidth < 1e13  # between 0.1 GB/s and 10 TB/s


def test_transfer_bandwidth_needs_cuda():
    with pytest.raises(ValueError, match="CUDA"):
        bench.measure_transfer_bandwidth(1024, "cpu", pinned=True)


@pytest.mark.parametrize("name, expected", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200 SXM"),
    ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"),
    ("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB"),
    ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
    ("NVIDIA A100-PCIE-40GB", "A100 40GB PCIe"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA A10", "A10"),
    ("Tesla T4", "T4"),
    ("Tesla V100-SXM2-16GB", "V100 SXM2"),
    ("Tesla V100-PCIE-32GB", "V100 PCIe"),
    ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090"),
    ("NVIDIA GeForce RTX 3090", "GeForce RTX 3090"),
    ("NVIDIA RTX A6000", "RTX A6000"),
])
def test_peak_lookup(name, expected):
    assert bench.lookup_gpu_peak(name).name == expected


@pytest.mark.parametrize("name", ["NVIDIA A10G", "NVIDIA L40", "NVIDIA GH200 480GB",
                                  "NVIDIA GeForce RTX 3080 Ti", "NVIDIA GeForce RTX 4090 D", "AMD Instinct MI300X"])
def test_peak_lookup_does_not_guess(name):
    assert bench.lookup_gpu_peak(name) is None


def test_peak_table_is_consistent():
    for peak in bench.known_gpus():
        assert peak.fp16 > peak.fp32 > 0 and peak.memory_bandwidth_gbs > 0
        if peak.bf16 is not None:
            assert peak.bf16 == peak.fp16
        if peak.tf32 is not None:
            assert peak.fp32 <= peak.tf32 <= peak.fp16


def test_peak_flops_by_dtype():
    h100 = "NVIDIA H100 80GB HBM3"
    assert bench.peak_flops(torch.bfloat16, gpu_name=h100) == pytest.approx(989.4e12)
    assert bench.peak_flops(torch.float32, gpu_name=h100, tf32=True) == pytest.approx(494.7e12)
    assert bench.peak_flops(torch.float32, gpu_name=h100) == pytest.approx(67e12)
    with pytest.raises(ValueError, match="no fast bfloat16"):
        bench.peak_flops(torch.bfloat16, gpu_name="Tesla T4")
    with pytest.raises(ValueError, match="not in the course's peak table"):
        bench.peak_flops(torch.bfloat16, gpu_name="Mystery GPU 9000")
    with pytest.raises(ValueError, match="NVIDIA GPUs only"):
        bench.peak_flops(torch.bfloat16, "cpu")


def test_roofline():
    peak, bw = 1e15, 2e12
    assert bench.ridge_intensity(peak, bw) == 500
    assert bench.attainable_flops(10, peak, bw) == 2e13
    assert bench.attainable_flops(1000, peak, bw) == peak
    with pytest.raises(ValueError):
        bench.attainable_flops(0, peak, bw)


def test_formatting():
    assert bench.format_rate(3.1e12, "FLOP/s") == "3.1 TFLOP/s"
    assert bench.format_rate(512, "B/s") == "512 B/s"
    assert bench.format_seconds(0.0123) == "12.3 ms"
    assert bench.format_seconds(2e-6) == "2 µs"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_timer_uses_events_and_waits_for_the_work():
    a = torch.randn(4096, 4096, device="cuda")
    timing = bench.time_fn(lambda: a @ a, device="cuda", warmup=2, repeats=5)
    # a 4096^3 float32 product cannot finish in under 10 microseconds on any GPU
    assert timing.median > 1e-5
    assert bench.measure_transfer_bandwidth(2**24, "cuda", pinned=True) > 1e9


class _FakeNVML:
    """A stand-in for ``pynvml`` on a machine with two GPUs, where NVML's index 0 is another GPU than
    ``cuda:0`` (as with CUDA_VISIBLE_DEVICES=1) and the power reading is not supported (some vGPUs)."""

    NVML_TEMPERATURE_GPU = 0

    class NVMLError(Exception):
        pass

    def __init__(self):
        self.calls = []

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetHandleByIndex(self, index):  # the physical numbering: must not be used
        return {0: "other-gpu", 1: "our-gpu"}[index]

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.calls.append(uuid)
        return {"GPU-00000000-0000-0000-0000-000000000001": "our-gpu"}[uuid]

    def nvmlDeviceGetUtilizationRates(self, handle):
        return type("Util", (), {"gpu": 87 if handle == "our-gpu" else 0})()

    def nvmlDeviceGetMemoryInfo(self, handle):
        return type("Mem", (), {"used": 3 * 2**30 if handle == "our-gpu" else 0})()

    def nvmlDeviceGetPowerUsage(self, handle):
        raise self.NVMLError("Not Supported")

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 61 if handle == "our-gpu" else 30


def test_nvml_sample_finds_the_gpu_by_uuid_and_reads_each_field_on_its_own(monkeypatch):
    import sys

    fake = _FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    uuid = "00000000-0000-0000-0000-000000000001"  # torch's spelling: no "GPU-" in front
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: type("Props", (), {"uuid": uuid})())
    sample = bench.nvml_sample("cuda:0")
    assert sample == {"utilization_pct": 87.0, "memory_used_gib": 3.0, "power_w": None, "temperature_c": 61.0}
    assert fake.calls == ["init", f"GPU-{uuid}", "shutdown"]
    assert bench.nvml_sample() == sample  # the current GPU
    assert bench.nvml_sample("cpu") is None
    monkeypatch.setattr(bench, "synchronize", lambda device=None: None)
    for counter in ("memory_allocated", "memory_reserved"):
        monkeypatch.setattr(bench.gpu, counter, lambda device=None: 0)
    lines = bench.sample_while_busy(lambda: None, "cuda:0", steps=1).splitlines()[0]
    assert lines == "utilization_pct 87.0, memory_used_gib 3.0, power_w not reported, temperature_c 61.0"
