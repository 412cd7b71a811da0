"""Device choice and its errors, the hardware summary, size presets and seeding.

CUDA is simulated with monkeypatch where a test needs a GPU that this machine may not have.
"""

from types import SimpleNamespace

import pytest
import torch

from gpuformer_lib import device as dev
from gpuformer_lib.device import (DeviceNotAvailableError, SizePreset, choose_preset, hardware_summary,
                                  pick_device, run_header, seed_everything)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    monkeypatch.delenv(dev.DEVICE_ENV, raising=False)
    monkeypatch.delenv(dev.PRESET_ENV, raising=False)


@pytest.fixture
def no_accelerator(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


@pytest.fixture
def fake_gpus(monkeypatch):
    """Pretend two CUDA GPUs of 16 GiB are present (only the calls pick_device and presets make)."""
    def fake(count=2, memory_gib=16):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda d: SimpleNamespace(total_memory=memory_gib * 2**30, major=7, minor=5,
                                                      name="Tesla T4"))
    return fake


def test_auto_choice_falls_back_to_cpu(no_accelerator):
    assert pick_device() == torch.device("cpu")


def test_auto_choice_prefers_cuda(fake_gpus):
    fake_gpus()
    assert pick_device() == torch.device("cuda", 0)


def test_cuda_on_a_cpu_only_build_says_so(no_accelerator, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(DeviceNotAvailableError, match="CPU-only build") as err:
        pick_device("cuda")
    assert "Getting PyTorch" in str(err.value)
    assert 'pick_device("cpu")' in str(err.value)


def test_cuda_build_without_gpu_lists_what_to_check(no_accelerator, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(DeviceNotAvailableError) as err:
        pick_device("cuda:0")
    message = str(err.value)
    assert "nvidia-smi" in message and "CUDA 12.8" in message and "CUDA_VISIBLE_DEVICES" in message


def test_gpu_index_past_the_last(fake_gpus):
    fake_gpus(count=2)
    assert pick_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(DeviceNotAvailableError, match=r"shows 2 GPU\(s\): cuda:0 to cuda:1"):
        pick_device("cuda:2")


def test_missing_mps(no_accelerator):
    with pytest.raises(DeviceNotAvailableError, match="Apple MPS"):
        pick_device("mps")


@pytest.mark.parametrize("name", ["gpu", "cuda:x", "", 3.5])
def test_nonsense_device_names(name):
    with pytest.raises(ValueError, match="not a device name"):
        pick_device(name)


def test_environment_variable_chooses(no_accelerator, monkeypatch):
    monkeypatch.setenv(dev.DEVICE_ENV, "cpu")
    assert pick_device() == torch.device("cpu")
    monkeypatch.setenv(dev.DEVICE_ENV, "cuda")
    with pytest.raises(DeviceNotAvailableError):
        pick_device()


def test_hardware_summary_on_cpu():
    summary = hardware_summary("cpu")
    assert summary.device == "cpu"
    assert summary.gpu_name is None and summary.sm_count is None and summary.compute_capability is None
    assert summary.tf32 is False
    assert summary.cpu_threads >= 1 and summary.torch_threads >= 1
    assert summary.torch_version == torch.__version__
    text = str(summary)
    assert "CPU" in text and torch.__version__ in text
    assert summary.as_dict()["device"] == "cpu"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_hardware_summary_on_gpu():
    summary = hardware_summary("cuda")
    props = torch.cuda.get_device_properties(0)
    assert summary.gpu_name == props.name and summary.sm_count == props.multi_processor_count
    assert summary.compute_capability == (props.major, props.minor)
    assert summary.bf16 == (props.major >= 8)


def test_presets_by_device(no_accelerator, fake_gpus):
    assert choose_preset("cpu").name == "cpu"
    fake_gpus(memory_gib=15)
    assert choose_preset("cuda").name == "gpu-small"
    fake_gpus(memory_gib=80)
    assert choose_preset("cuda").name == "gpu"


def test_preset_override_and_validation(monkeypatch):
    monkeypatch.setenv(dev.PRESET_ENV, "gpu")
    assert choose_preset("cpu").name == "gpu"
    assert choose_preset("cpu", name="cpu").name == "cpu"
    with pytest.raises(ValueError, match="Unknown size preset 'huge'"):
        choose_preset("cpu", name="huge")


def test_preset_pick():
    assert SizePreset("cpu", "").pick(cpu=1, gpu=3, gpu_small=2) == 1
    assert SizePreset("gpu-small", "").pick(cpu=1, gpu=3, gpu_small=2) == 2
    assert SizePreset("gpu-small", "").pick(cpu=1, gpu=3) == 3
    assert SizePreset("gpu", "").pick(cpu=1, gpu=3, gpu_small=2) == 3


def test_run_header_names_device_and_preset():
    header = run_header("cpu")
    assert header.startswith("device") and "size preset 'cpu'" in header


def test_seeding_repeats_and_validates():
    seed_everything(123)
    a = torch.randn(5)
    seed_everything(123)
    b = torch.randn(5)
    seed_everything(124)
    c = torch.randn(5)
    assert torch.equal(a, b) and not torch.equal(a, c)
    with pytest.raises(ValueError):
        seed_everything(-1)


def _library_imports(module_path):
    """Every ``gpuformer_lib`` module a file imports, at top level or inside a function."""
    import ast

    tree = ast.parse(module_path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpuformer_lib"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names if node.module == "gpuformer_lib"}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("gpuformer_lib")}
    return found


def test_device_and_profiles_no_longer_import_each_other():
    """One direction only: hardware (choosing the device, the summary) <- profiles <- device. Before, profiles
    imported device at top level and device imported profiles inside choose_preset and run_header."""
    import pathlib
    import subprocess
    import sys

    lib = pathlib.Path(dev.__file__).parent
    assert _library_imports(lib / "hardware.py") == set()
    assert _library_imports(lib / "profiles.py") == {"gpuformer_lib.hardware"}
    assert "gpuformer_lib.profiles" in _library_imports(lib / "device.py")
    code = ("import sys, gpuformer_lib.profiles; assert 'gpuformer_lib.device' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_every_name_the_notebooks_import_from_device_and_profiles_is_still_there():
    import importlib
    import json
    import pathlib
    import re

    root = pathlib.Path(dev.__file__).parents[1]
    wanted = {"device": set(), "profiles": set()}
    for path in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"]) if cell["cell_type"] == "code" else ""
            for module, names in re.findall(r"from gpuformer_lib\.(device|profiles) import (\([^)]*\)|[^\n]*)", source):
                wanted[module] |= {n.strip() for n in names.strip("()").split(",") if n.strip()}
    assert {"choose_preset", "run_header", "SizePreset", "pick_device"} <= wanted["device"]
    for module, names in wanted.items():
        imported = importlib.import_module(f"gpuformer_lib.{module}")
        assert not [n for n in names if not hasattr(imported, n)], (module, names)
    assert dev.SizePreset is importlib.import_module("gpuformer_lib.profiles").SizePreset
