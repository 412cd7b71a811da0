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


def test_the_quoted_cuda_mismatch_form_is_in_the_installed_pytorch():
    """The page glues CUDA_MISMATCH_FORM as this PyTorch's wording: a new PyTorch that words it otherwise fails here."""
    found = dc.mismatch_form_fragments_in_torch()
    if found is None:
        pytest.skip("libtorch_cpu not found under torch/lib")
    assert found, f"the installed torch {torch.__version__} no longer carries {dc.CUDA_MISMATCH_FORM!r}"


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
    # right and wrong answers: tests/answer_tables/hardware.py; here the count alone, a non-number, a bad count
    assert check_training_state_prediction(16 * 1000, 16 * 1000)
    assert not check_training_state_prediction("a lot", 16 * 1000)
    with pytest.raises(ValueError, match="layers"):  # the notebook's count disagrees with its layers
        check_training_state_prediction(16 * 33088, 16 * 32768, layers=((64, 256), (256, 64)))


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


# --------------------------------------------------------------------------- second edition: the review's findings


@pytest.mark.parametrize("ratio, band", [(0.9, "about as much"), (1.2, "about as much"), (1.4, "somewhat more"),
                                         (3.0, "somewhat more"), (3.1, "several times"), (40.0, "several times")])
def test_sync_cost_words_follow_the_ratio_band(ratio, band):
    for device_type in ("cpu", "cuda", "mps"):
        words = dc.sync_cost_words(ratio, device_type)
        assert band in words
        # the CPU's reason is given on a CPU only: a GPU is never called synchronous
        assert ("on a CPU every operation has finished" in words) == (device_type == "cpu")
        assert "synchronous" not in words
    with pytest.raises(ValueError):
        dc.sync_cost_words(0.0, "cpu")


class _CountingTensor:
    """Stands in for a one-element tensor: counts adds and reads."""

    device = torch.device("cpu")

    def __init__(self):
        self.adds = self.reads = 0

    def add_(self, value):
        self.adds += 1

    def item(self):
        self.reads += 1
        return 0.0


def test_both_sync_loops_run_the_same_operation():
    x = _CountingTensor()
    dc._per_step(x, 10, 1)
    assert (x.adds, x.reads) == (10, 10)  # a read after every add
    x = _CountingTensor()
    dc._per_step(x, 10, 11)
    assert (x.adds, x.reads) == (10, 1)  # queued: one read at the end
    x = _CountingTensor()
    dc._per_step(x, 100, 50)
    assert (x.adds, x.reads) == (100, 2)


def test_host_sync_cost_times_both_loops_through_bench_compare(monkeypatch):
    from fake_clock import FakeClock

    from gpuformer_lib import bench

    clock, calls = FakeClock(), []

    def steps(x, n, read_every):  # a read after each step costs 3 us a step, queueing 1 us
        calls.append(read_every)
        clock.now += n * (3e-6 if read_every == 1 else 1e-6)

    monkeypatch.setattr(bench, "time", clock)
    monkeypatch.setattr(dc, "_steps", steps)
    cost = dc.host_sync_cost("cpu", n=20, repeats=2)
    assert sorted(set(calls)) == [1, 21]  # the same add, read after each step or once
    assert calls.count(1) == calls.count(21) >= 1 + 5  # a warm-up, then at least 5 interleaved rounds
    assert cost.read_each == pytest.approx(3e-6) and cost.queued == pytest.approx(1e-6)
    assert cost.comparison.verdict == "slower" and cost.comparison.baseline == "queued"
    words = dc.sync_comparison_words(cost, "cpu")
    assert words.startswith("reading after every step made a step 3.00x slower than queued")
    assert "cannot show" in words and "cannot show" not in dc.sync_comparison_words(cost, "cuda")
    # equal loops: said as a tie, never as slower
    monkeypatch.setattr(dc, "_steps", lambda x, n, every: setattr(clock, "now", clock.now + n * 1e-6))
    tie = dc.host_sync_cost("cpu", n=20)
    assert tie.comparison.verdict == "no difference we can see" and "x slower" not in tie.comparison.phrase()
    with pytest.raises(TypeError):
        dc.sync_comparison_words(dc.HostSyncCost("cpu", 1e-6, 1e-6, 20), "cpu")  # no comparison to word


def test_read_interval_run_measures_the_three_loops_together(monkeypatch):
    cost, seconds = dc.read_interval_run("cpu", n=100, read_every=10, chunk=50, repeats=1)
    assert seconds > 0 and cost.read_each > 0 and cost.queued > 0 and cost.n == 50
    calls = []
    monkeypatch.setattr(dc, "_per_step", lambda x, n, every: calls.append(every) or 1e-6)
    dc.read_interval_run("cpu", n=1000, read_every=50, chunk=200, repeats=3)
    assert calls == [1, 201, 50] * 3  # interleaved: one run of each loop per round
    with pytest.raises(ValueError):
        dc.read_interval_run("cpu", read_every=0)
    with pytest.raises(ValueError):
        dc.read_interval_run("cpu", read_every=30, chunk=200)


def test_state_fit_needs_room_for_the_context_and_activations():
    n = 1_300_000_000
    fits, words = dc.state_fit(n, 16, 14.7)
    assert not fits and words.endswith("4.7 GiB short")
    fits, words = dc.state_fit(n, 12, 14.7)  # 14.53 GiB: fits on paper only
    assert not fits and "not a real fit" in words
    fits, words = dc.state_fit(n, 10, 14.7)
    assert fits and "2.6 GiB left" in words
    assert dc.state_fit(n, 16, 79.1)[0]
    options = dict(dc.TRAINING_STATE_OPTIONS)
    mixed = next(b for name, b in options.items() if name.startswith("mixed precision"))
    assert mixed == 16  # "mixed precision barely shrinks this": it keeps a float32 master copy
    with pytest.raises(ValueError):
        dc.state_fit(n, 0, 14.7)


def test_gpu_view_shows_a_compute_capability_with_its_minor_version():
    from gpuformer_lib.gpu_view import gpu_view, published

    text = str(gpu_view("t", [published("h100-compute-capability"), published("t4-devicequery-compute-capability")]))
    assert "9.0 (major.minor)" in text and "7.5 (major.minor)" in text
    html = gpu_view("t", [published("h100-compute-capability")])._repr_html_()
    assert "9.0&nbsp;(major.minor)" in html  # the number keeps its unit's first word on its line


@pytest.mark.parametrize("threads, words", [(1, "torch uses 1 thread)"), (2, "torch uses 2 threads)")])
def test_device_label_names_torchs_thread_count_in_good_grammar(monkeypatch, threads, words):
    import dataclasses

    from gpuformer_lib import device, gpu_view
    from gpuformer_lib.profiles import PROFILES

    monkeypatch.delenv("GPUFORMER_REHEARSE", raising=False)
    monkeypatch.setattr("gpuformer_lib.profiles.current_profile", lambda *a, **k: PROFILES["cpu"])
    real = device.hardware_summary("cpu")
    monkeypatch.setattr(device, "hardware_summary",
                        lambda *a, **k: dataclasses.replace(real, gpu_name=None, torch_threads=threads))
    label = gpu_view.device_label()
    assert label.endswith(words) and "1 threads" not in label


def test_precision_choice_check_grades_against_the_course_and_explains():
    from gpuformer_lib.exercises.hardware import check_precision_choice, precision_devices
    from gpuformer_lib.profiles import training_precision

    devices = precision_devices()
    right = {d: training_precision(p) for d, p in devices.items()}
    assert sorted(set(right.values())) == ["bf16", "fp16", "fp32"]  # every answer occurs
    # right and wrong answers: tests/answer_tables/hardware.py; here answers that are not a precision
    cpu = next(d for d in devices if "CPU" in d)
    assert not check_precision_choice({**right, cpu: "float32"})
    assert not check_precision_choice({d: None for d in devices})
    assert not check_precision_choice("bf16")


def test_read_interval_prediction_check_needs_the_model():
    from gpuformer_lib.exercises.hardware import check_read_interval_prediction

    # right and wrong answers: tests/answer_tables/hardware.py; here the loop's time is shown, not graded
    n, k, queued, read_each = 2000, 50, 5e-6, 20e-6  # GPU-like: a read waits for the queue
    model = n * queued + n // k * (read_each - queued)
    kw = dict(n=n, read_every=k, queued=queued, read_each=read_each)
    far = check_read_interval_prediction(model, model * 3, **kw)  # a loop disturbed by other work
    assert far and f"{model * 3:.3g} s" in far.message
    assert not check_read_interval_prediction(model * 3, model * 3, **kw)  # matching the timing is not the model
