"""The memory cap that out-of-memory recovery is tried under (finding B1): chosen from a measured
quarter-batch step on a GPU and from the calculator elsewhere, enforced by the allocator on a GPU and
simulated on a CPU, and both under a rehearsed GPU profile, so that the GPU path runs in CI.

The CUDA allocator is stubbed with monkeypatch where a test follows the real GPU path."""

import pytest
import torch
import torch.nn.functional as F

from gpuformer_lib import profiles
from gpuformer_lib.memory import (MemoryCap, SavedActivations, activation_limit, choose_memory_cap,
                                  fit_micro_batch, measure_peak_memory, measure_step_peak, memory_limit,
                                  training_memory)
from gpuformer_lib.model import DecoderLM, TransformerConfig, count_parameters
from gpuformer_lib.profiles import PROFILES

CONFIG = TransformerConfig(vocab_size=64, d_model=32, n_heads=4, n_decoder_layers=2, d_ff=64, dropout=0.0,
                           max_len=16)


@pytest.fixture(autouse=True)
def no_rehearsal(monkeypatch):
    monkeypatch.delenv(profiles.REHEARSE_ENV, raising=False)


@pytest.fixture
def fake_allocator(monkeypatch):
    """A CUDA allocator that holds `allocated` bytes and peaks at `peak`, and records the caps set."""
    state = {"allocated": 1_000, "peak": 1_500, "fractions": [], "emptied": 0}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: state["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: state["peak"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: state.__setitem__("emptied", state["emptied"] + 1))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: type("P", (), {"total_memory": 10_000})())
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, device=None: state["fractions"].append(fraction))
    return state


def test_a_cap_is_positive_bytes_of_at_least_one_kind():
    assert MemoryCap(allocator_bytes=5).activation_bytes is None
    for bad in (dict(), dict(allocator_bytes=0), dict(activation_bytes=-1), dict(allocator_bytes=1.5),
                dict(activation_bytes=True)):
        with pytest.raises(ValueError):
            MemoryCap(**bad)


def test_on_a_cpu_the_cap_is_simulated_from_the_calculator():
    ran = []
    cap = choose_memory_cap(PROFILES["cpu"], "cpu", lambda: ran.append(1), 1_000)
    assert cap == MemoryCap(activation_bytes=1_200) and not ran  # nothing to measure: no step runs
    with pytest.raises(ValueError, match="margin"):
        choose_memory_cap(PROFILES["cpu"], "cpu", lambda: None, 1_000, margin=0.9)
    with pytest.raises(ValueError, match="positive"):
        choose_memory_cap(PROFILES["cpu"], "cpu", lambda: None, 0)


def test_on_a_gpu_the_cap_is_what_is_held_plus_the_measured_peak(fake_allocator):
    ran = []
    cap = choose_memory_cap(PROFILES["t4"], "cuda:0", lambda: ran.append(1), 1_000)
    assert ran == [1] and fake_allocator["emptied"] == 1  # measured, then the cache given back
    assert cap == MemoryCap(allocator_bytes=1_000 + int(1.2 * 500))  # held + 1.2 x (peak - before)
    with memory_limit("cuda:0", cap):
        assert fake_allocator["fractions"] == [1_600 / 10_000]
    assert fake_allocator["fractions"][-1] == 1.0  # lifted afterwards
    with pytest.raises(RuntimeError), memory_limit("cuda:0", cap):
        raise RuntimeError("a failing step")
    assert fake_allocator["fractions"][-1] == 1.0  # lifted after an error too
    assert isinstance(activation_limit(None, cap), type(activation_limit(None, None)))  # the allocator's alone


def test_in_a_rehearsal_both_caps_are_set_and_the_gpu_call_is_checked(monkeypatch):
    monkeypatch.setenv(profiles.REHEARSE_ENV, "t4")
    ran = []
    cap = choose_memory_cap(profiles.current_profile(), "cpu", lambda: ran.append(1), 1_000)
    assert ran == [1]  # the quarter-batch step ran, through the stand-ins (which measure 0 bytes)
    assert cap == MemoryCap(allocator_bytes=1_200, activation_bytes=1_200)
    with memory_limit("cpu", cap):
        pass
    with pytest.raises(ValueError, match="cap_bytes"):  # larger than the T4: the stand-in refuses it
        with memory_limit("cpu", MemoryCap(allocator_bytes=16 * 2**30)):
            pass


def test_activation_limit_raises_out_of_memory_past_the_cap():
    model = DecoderLM(CONFIG)
    ids = torch.randint(0, 64, (4, 16))
    assert isinstance(activation_limit(model, MemoryCap(activation_bytes=10**9)), SavedActivations)
    with activation_limit(model, MemoryCap(activation_bytes=10**9)):
        model(ids).sum()
    with pytest.raises(torch.OutOfMemoryError), activation_limit(model, MemoryCap(activation_bytes=1_000)):
        model(ids).sum()


@pytest.mark.parametrize("rehearse", [None, "t4", "h100-80gb"])
def test_out_of_memory_recovery_finds_a_quarter_batch_under_every_profile(monkeypatch, rehearse):
    """Chapter 9's experiment, as its cell runs it: with room for a quarter of the batch, the full and the
    half batch run out of memory and the quarter fits. Under a rehearsed GPU profile this is the GPU path
    (measured cap, allocator cap); a name the cell rebinds (finding B1) fails here."""
    if rehearse:
        monkeypatch.setenv(profiles.REHEARSE_ENV, rehearse)
    profile = profiles.current_profile("cpu")
    torch.manual_seed(0)
    model = DecoderLM(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    B, T = 8, 16
    ids = torch.randint(0, 64, (B, T + 1))
    inputs, targets = ids[:, :-1], ids[:, 1:]

    def step_with(micro, cap=None):
        model.zero_grad(set_to_none=True)
        for x, y in zip(inputs.split(micro), targets.split(micro)):
            with activation_limit(model, cap):
                loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()) * len(x) / B
            loss.backward()
        optimizer.step()

    n = count_parameters(model)
    quarter = training_memory(n, n_layers=2, d_model=32, n_heads=4, d_ff=64, seq_len=T, batch_size=B // 4,
                              vocab_size=64).activations
    cap = choose_memory_cap(profile, "cpu", lambda: step_with(B // 4), quarter)
    assert (cap.allocator_bytes is not None) == profile.on_gpu and cap.activation_bytes is not None
    with memory_limit("cpu", cap):
        plan = fit_micro_batch(lambda m: step_with(m, cap), B, verbose=False)
    assert plan == (2, 4)


def test_measure_peak_memory_runs_in_a_rehearsal_and_refuses_a_plain_cpu(monkeypatch):
    with pytest.raises(ValueError, match="CUDA allocator"):
        measure_peak_memory(lambda: None, "cpu")
    monkeypatch.setenv(profiles.REHEARSE_ENV, "h100-80gb")
    ran = []
    assert measure_peak_memory(lambda: ran.append(1), "cpu") == 0 and ran == [1]


def test_measure_step_peak(monkeypatch, tmp_path, fake_allocator):
    predicted = training_memory(1_000, n_layers=1, d_model=8, n_heads=2, seq_len=4, batch_size=1, vocab_size=8)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", lambda path: open(path, "wb").close())
    ran = []
    peak = measure_step_peak(lambda: ran.append(1), "cuda:0", predicted, str(tmp_path / "snapshot.pickle"))
    assert ran == [1, 1] and (tmp_path / "snapshot.pickle").exists()  # measured, then recorded
    assert peak.measured == 500 and peak.predicted == predicted.activations + predicted.gradients
    assert f"({peak.predicted / 500:.2f}x)" in str(peak)
    monkeypatch.setenv(profiles.REHEARSE_ENV, "t4")
    rehearsed = measure_step_peak(lambda: None, "cpu", predicted, str(tmp_path / "rehearsed.pickle"))
    assert rehearsed.measured == 0 and "nothing measured" in str(rehearsed)
