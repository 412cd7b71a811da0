"""Tests for device_checks (host syncs, hidden GPUs, misplaced tensors, profile summaries), seed_everything's
deterministic mode, and chapter 0's predict-then-measure checks."""

import os
import warnings

import pytest
import torch

from gpuformer_lib import device_checks as dc
from gpuformer_lib.device import HardwareSummary, hardware_summary, seed_everything
from gpuformer_lib.exercises.hardware import check_host_sync_prediction, check_training_state_prediction
from gpuformer_lib.memory import model_state_bytes


def test_host_sync_cost_is_positive_and_consistent():
    cost = dc.host_sync_cost("cpu", n=50, repeats=2)
    assert cost.read_each > 0 and cost.queued > 0 and cost.wait_per_read >= 0
    assert cost.device == "cpu" and cost.n == 50
    assert "us" in str(cost)
    with pytest.raises(ValueError):
        dc.host_sync_cost("cpu", n=0)


def test_visible_gpu_count_hides_every_gpu_with_an_empty_variable():
    assert dc.visible_gpu_count("") == 0
    assert dc.visible_gpu_count(None) == torch.cuda.device_count()
    with pytest.raises(TypeError):
        dc.visible_gpu_count(0)


def test_device_mismatch_error_is_pytorchs_device_check():
    message = dc.device_mismatch_error("cpu")
    assert message.startswith("RuntimeError: ")
    assert "device" in message and "meta" in message and "cpu" in message
    assert "cuda:0 and cpu" in dc.CUDA_MISMATCH_MESSAGE


@pytest.mark.parametrize("name, cc, memory", [("t4", "7.5", "14.7 GiB"), ("h100-80gb", "9.0", "79.1 GiB")])
def test_profile_summary_is_labelled_profile_data(name, cc, memory):
    text = dc.profile_summary(name)
    assert "profile data, not measured" in text and cc in text and memory in text
    assert ("no / no" in text) == (name == "t4")
    with pytest.raises(ValueError):
        dc.profile_summary("cpu")


def test_training_state_bytes_matches_adamw_after_one_step():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    n = sum(p.numel() for p in model.parameters())
    assert sum(model_state_bytes(model, opt).values()) == dc.training_state_bytes(n)
    assert dc.largest_trainable_params(16 * 1000 + 15) == 1000
    with pytest.raises(ValueError):
        dc.training_state_bytes(0)


def test_cpu_header_does_not_call_missing_bf16_slower():
    s = hardware_summary("cpu")
    no_bf16 = HardwareSummary(**{**s.as_dict(), "bf16": False})
    text = str(no_bf16)
    assert "slower" not in text and "no native instructions" in text


@pytest.fixture
def restore_determinism():
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.benchmark, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    torch.backends.cudnn.benchmark = before[2]
    if before[3] is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = before[3]


def test_deterministic_mode_is_warn_only_and_sets_cublas_config(restore_determinism, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seed_everything(0, deterministic=True)
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.is_deterministic_algorithms_warn_only_enabled()  # documented: warns, does not raise
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_deterministic_mode_warns_when_cuda_is_already_initialised(restore_determinism, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.warns(RuntimeWarning, match="CUBLAS_WORKSPACE_CONFIG"):
        seed_everything(0, deterministic=True)
    # set before: no warning, even with CUDA initialised
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seed_everything(0, deterministic=True)


def test_training_state_prediction_check():
    assert check_training_state_prediction(16 * 1000, 16 * 1000)
    miss = check_training_state_prediction(8 * 1000, 16 * 1000)
    assert not miss and "two float32 tensors" in str(miss.message if hasattr(miss, "message") else miss)
    assert not check_training_state_prediction(32 * 1000, 16 * 1000)
    assert not check_training_state_prediction("a lot", 16 * 1000)


def test_host_sync_prediction_check():
    assert check_host_sync_prediction(1.0e-3, 2.5e-3, per_read=1e-5)
    assert not check_host_sync_prediction(1.0e-6, 1.2e-3, per_read=1e-5)
    assert not check_host_sync_prediction(1.0, 1.2e-3, per_read=1e-5)


def test_nvidia_smi_report_says_why_when_absent(monkeypatch):
    import shutil
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert "not on this machine's PATH" in dc.nvidia_smi_report()


def test_gpu_view_shows_a_whole_published_number_whole():
    from gpuformer_lib.gpu_view import gpu_view, published

    assert "15102 MBytes" in str(gpu_view("t", [published("t4-devicequery-global-memory")]))


def test_profile_line_does_not_call_a_cpu_without_native_bf16_emulated():
    import dataclasses

    from gpuformer_lib.profiles import PROFILES

    line = dataclasses.replace(PROFILES["cpu"], bf16=False).describe()
    assert line == "cpu: bf16 not native"
