"""Fault injection for the training loop: a writer killed mid-checkpoint, NaN losses and gradients,
bad settings, empty batches, damaged checkpoints, an impossible device, a changed config on resume, and
a resume through a shuffling DataLoader with dropout. Each runs in seconds on a CPU."""

import dataclasses
import math
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gpuformer_lib import checkpoint
from gpuformer_lib.checkpoint import CheckpointError, NonFiniteWeightsError
from gpuformer_lib.data import StepBatches, repeating_patterns
from gpuformer_lib.device import DeviceNotAvailableError
from gpuformer_lib.losses import masked_cross_entropy
from gpuformer_lib.model import DecoderLM, TransformerConfig
from gpuformer_lib.speed import make_train_step
from gpuformer_lib.train import (ConfigChangedError, EmptyStepError, NonFiniteLossError, TrainConfig,
                                 load_checkpoint, lr_multiplier, make_optimizer, save_checkpoint, train)

REPO = Path(__file__).resolve().parents[1]
V = 12
CONFIG = TrainConfig(max_steps=4, lr=3e-3, warmup_steps=1, log_every=10, progress=False, weight_decay=0.01)


def model(dropout=0.0, seed=0, d_model=32):
    torch.manual_seed(seed)
    return DecoderLM(TransformerConfig(vocab_size=V, d_model=d_model, n_heads=4, n_decoder_layers=1, d_ff=64,
                                       dropout=dropout, max_len=32))


def get_batch(i):
    return repeating_patterns(i, V, batch_size=8, seq_len=16, seed=1000)


def loss_fn(m, batch):
    x, y = batch
    return F.cross_entropy(m(x).reshape(-1, V), y.reshape(-1)), y.numel()


def nan_from(first_bad_step, only=None):
    """A loss_fn whose loss is NaN from step ``first_bad_step`` (0-based, one micro-batch per step) on, or
    at the steps in ``only``."""
    calls = []

    def poisoned(m, batch):
        step = len(calls)
        calls.append(step)
        loss, n = loss_fn(m, batch)
        bad = step in only if only is not None else step >= first_bad_step
        return (loss * float("nan") if bad else loss), n

    return poisoned


def all_finite(m):
    return all(torch.isfinite(p).all() for p in m.parameters())


def temporaries(folder):
    """The hidden files in ``folder``: temporary files a checkpoint is written through."""
    return sorted(p.name for p in Path(folder).iterdir() if p.name.startswith("."))


# --------------------------------------------------------------------------- a writer killed mid-write

_KILLED_WRITER = textwrap.dedent("""
    import os, shutil, signal, sys
    import torch
    import torch.nn.functional as F
    from gpuformer_lib.data import repeating_patterns
    from gpuformer_lib.model import DecoderLM, TransformerConfig
    from gpuformer_lib.train import TrainConfig, train

    folder = sys.argv[1]
    def build(seed):
        torch.manual_seed(seed)
        return DecoderLM(TransformerConfig(vocab_size=12, d_model=32, n_heads=4, n_decoder_layers=1, d_ff=64,
                                           dropout=0.0, max_len=32))
    def loss_fn(m, batch):
        x, y = batch
        return F.cross_entropy(m(x).reshape(-1, 12), y.reshape(-1)), y.numel()
    get_batch = lambda i: repeating_patterns(i, 12, batch_size=8, seq_len=16, seed=1000)
    config = TrainConfig(max_steps=2, lr=3e-3, warmup_steps=1, progress=False, checkpoint_every=2,
                         checkpoint_path=folder + "/ckpt.pt")
    train(build(0), loss_fn, get_batch, config)              # a good checkpoint at step 2
    shutil.copy(folder + "/ckpt.pt", folder + "/../good.pt")

    def dying_save(obj, f, *args, **kwargs):                 # writes part of the file, then dies
        f = open(f, "wb") if isinstance(f, (str, os.PathLike)) else f
        f.write(b"PK\\x03\\x04" + bytes(5000))
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    torch.save = dying_save
    train(build(1), loss_fn, get_batch, config)              # its checkpoint write is killed
    print("not reached")
""")


def test_a_writer_killed_mid_write_leaves_the_previous_checkpoint(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(folder)], cwd=REPO, env=env, timeout=120,
                          capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert len(temporaries(folder)) == 1  # the dead writer's half-written file is still there
    path = folder / "ckpt.pt"
    assert path.read_bytes() == (tmp_path / "good.pt").read_bytes()  # the checkpoint is the previous one
    restored, reference = model(seed=5), model(seed=6)
    assert load_checkpoint(path, restored)[0] == 2
    load_checkpoint(tmp_path / "good.pt", reference)
    for a, b in zip(restored.parameters(), reference.parameters()):
        assert torch.equal(a, b)
    assert temporaries(folder) == []  # loading removed the dead writer's temporary file


def _temporary_of(path, pid):
    """The temporary file name process ``pid`` on this host writes ``path`` through."""
    mine = checkpoint.temporary_path(path)
    return mine.with_name(mine.name.replace(f".{os.getpid()}.tmp", f".{pid}.tmp"))


def test_stale_temporaries_of_dead_writers_go_and_live_writers_stay(tmp_path):
    path = tmp_path / "ckpt.pt"
    config = dataclasses.replace(CONFIG, max_steps=2, checkpoint_every=2, checkpoint_path=str(path))
    train(model(), loss_fn, get_batch, config)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          timeout=60)
    # alive until the test kills it (it waits for an end of input that never comes), however long training takes
    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        _temporary_of(path, int(dead.stdout)).write_bytes(b"PK\x03\x04 half written")
        _temporary_of(path, live.pid).write_bytes(b"PK\x03\x04 being written")
        train(model(), loss_fn, get_batch, config)  # writes the checkpoint again
        assert temporaries(tmp_path) == [_temporary_of(path, live.pid).name]  # a live writer's: not ours to remove
    finally:
        live.kill()
        live.wait(timeout=10)
        live.stdin.close()
    load_checkpoint(path, model())
    assert temporaries(tmp_path) == []


# --------------------------------------------------------------------------- NaN and infinity


def test_a_nan_loss_stops_training_and_keeps_the_last_good_checkpoint(tmp_path):
    path = tmp_path / "ckpt.pt"
    config = dataclasses.replace(CONFIG, max_steps=8, checkpoint_every=2, checkpoint_path=str(path))
    with pytest.raises(NonFiniteLossError, match=r"step 3 has loss nan") as caught:
        train(model(), nan_from(3), get_batch, config)
    message = str(caught.value)
    assert str(path) in message and "after 2 steps" in message and "lr=" in message and "grad_clip" in message
    survivor = model(seed=9)
    assert load_checkpoint(path, survivor)[0] == 2 and all_finite(survivor)


def test_a_nan_is_caught_when_read_back_even_without_checkpoints():
    with pytest.raises(NonFiniteLossError, match="step 1 .*No checkpoint was written"):
        train(model(), nan_from(1), get_batch, CONFIG)  # log_every=10: read back at the end


def test_a_nan_gradient_with_a_finite_loss_stops_training(tmp_path):
    m = model()
    calls = []

    def poison(grad):  # NaN in one gradient from step 2 on, as an overflowing backward would give
        calls.append(1)
        return grad * float("nan") if len(calls) > 2 else grad

    next(m.parameters()).register_hook(poison)
    with pytest.raises(NonFiniteLossError, match="step 2 has loss [0-9.]+ and gradient norm nan"):
        train(m, loss_fn, get_batch, CONFIG)


def test_save_checkpoint_refuses_nonfinite_weights_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "ckpt.pt"
    m = model()
    train(m, loss_fn, get_batch, dataclasses.replace(CONFIG, max_steps=2, checkpoint_every=2,
                                                      checkpoint_path=str(path)))
    before = path.read_bytes()
    optimizer = make_optimizer(m, CONFIG)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(CONFIG))
    with torch.no_grad():
        next(m.parameters())[0, 0] = float("inf")
    step, history = 3, load_checkpoint(path, model())[1]
    with pytest.raises(NonFiniteWeightsError, match="NaN or infinity in 1 tensor"):
        save_checkpoint(path, m, optimizer, scheduler, torch.amp.GradScaler("cpu", enabled=False), step, history,
                        CONFIG)
    assert path.read_bytes() == before and temporaries(tmp_path) == []


def test_skip_mode_skips_and_lists_nonfinite_steps():
    config = dataclasses.replace(CONFIG, schedule="constant", on_nonfinite="skip")
    skipping, reference = model(), model()
    history = train(skipping, nan_from(None, only={1, 3}), get_batch, config)
    assert history.skipped_steps == [1, 3] and all_finite(skipping)
    assert math.isnan(history.loss[1]) and math.isfinite(history.loss[2])
    # the skipped steps changed nothing: the same weights as two steps on the batches of steps 0 and 2
    train(reference, loss_fn, lambda i: get_batch(2 * i), dataclasses.replace(config, max_steps=2))
    for a, b in zip(skipping.parameters(), reference.parameters()):
        assert torch.equal(a, b)


def test_a_run_that_only_skips_stops():
    config = dataclasses.replace(CONFIG, max_steps=40, on_nonfinite="skip")
    with pytest.raises(NonFiniteLossError, match="last 30 steps, up to step 29, were all skipped"):
        train(model(), nan_from(0), get_batch, config)


def test_fp16_scaler_overflows_do_not_stop_a_run_but_endless_ones_do():
    def overflowing(m, batch):  # an fp16 overflow on every step: the scaler skips them all
        loss, n = loss_fn(m, batch)
        return loss * float("inf"), n

    with pytest.raises(NonFiniteLossError, match="were all skipped.*bf16 instead of fp16"):
        train(model(), overflowing, get_batch, dataclasses.replace(CONFIG, max_steps=40, precision="fp16"))


@pytest.mark.parametrize("grad_clip", [float("nan"), float("inf"), -1.0, 0.0])
def test_grad_clip_must_be_positive_and_finite(grad_clip):
    with pytest.raises(ValueError, match="grad_clip"):
        TrainConfig(grad_clip=grad_clip)


def test_make_train_step_refuses_a_nan_grad_clip_and_measures_with_inf():
    m = model()
    opt = torch.optim.AdamW(m.parameters())
    with pytest.raises(ValueError, match="grad_clip must be a positive number"):
        make_train_step(m, opt, loss_fn, grad_clip=float("nan"))
    out = make_train_step(m, opt, loss_fn, grad_clip=float("inf"))([get_batch(0)])
    assert math.isfinite(out.grad_norm.item()) and all_finite(m)


# --------------------------------------------------------------------------- empty batches


def padded(i, empty):
    """Micro-batch i: 4 sequences with some padding, or all padding when ``empty``."""
    x, y = repeating_patterns(i, V, batch_size=4, seq_len=16, seed=7)
    lengths = torch.zeros(4, dtype=torch.long) if empty else torch.tensor([16, 9, 12, 3])
    return x, y, torch.arange(16) >= lengths[:, None]


def indexing_loss(m, batch):  # NaN on an empty batch: the mean over nothing
    x, y, padding = batch
    real = ~padding
    return F.cross_entropy(m(x, padding_mask=padding)[real], y[real]), real.sum()


def library_loss(m, batch):
    x, y, padding = batch
    return masked_cross_entropy(m(x, padding_mask=padding), y, padding, allow_empty=True), (~padding).sum()


@pytest.mark.parametrize("normalize_by", ["tokens", "micro_batches"])
@pytest.mark.parametrize("masked_loss", [indexing_loss, library_loss])
def test_an_empty_micro_batch_contributes_nothing(normalize_by, masked_loss):
    config = dataclasses.replace(CONFIG, max_steps=2, schedule="constant", warmup_steps=0, grad_clip=None,
                                 normalize_by=normalize_by, log_every=1)
    with_empty, alone = model(), model()
    # micro-batch 1 of each step is all padding
    history = train(with_empty, masked_loss, lambda i: padded(i // 2, empty=i % 2 == 1),
                    dataclasses.replace(config, grad_accum_steps=2))
    assert all(math.isfinite(x) for x in history.loss + history.grad_norm)
    assert all_finite(with_empty)
    if normalize_by == "tokens":  # then the step is exactly the one over the non-empty micro-batch
        reference = train(alone, masked_loss, lambda i: padded(i, empty=False), config)
        for a, b in zip(with_empty.parameters(), alone.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(history.loss, reference.loss)


def test_a_step_without_tokens_is_an_error_naming_it():
    config = dataclasses.replace(CONFIG, max_steps=4, normalize_by="tokens", grad_accum_steps=2)
    with pytest.raises(EmptyStepError, match=r"step 2 trained on 0 tokens.*get_batch\(4\) to get_batch\(5\)"):
        train(model(), indexing_loss, lambda i: padded(i, empty=i in (4, 5)), config)


# --------------------------------------------------------------------------- damaged checkpoints


GOOD = dataclasses.replace(CONFIG, max_steps=2, checkpoint_every=2, checkpoint_path="ckpt.pt")


@pytest.fixture(scope="module")
def good_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("good") / "ckpt.pt"
    train(model(), loss_fn, get_batch, dataclasses.replace(GOOD, checkpoint_path=str(path)))
    return path


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):  # what an unsafe pickle does: runs code when it is loaded
        return (open, (str(self.marker), "w"))


def _damage(kind, good, path):
    data = good.read_bytes()
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "random bytes":
        path.write_bytes(os.urandom(4000))
    elif kind == "missing keys":
        state = torch.load(good, weights_only=True)
        del state["optimizer"], state["history"]
        torch.save(state, path)
    elif kind == "other model":
        torch.save(dict(torch.load(good, weights_only=True), model=model(d_model=64).state_dict()), path)
    elif kind == "unsafe pickle":
        torch.save({"model": _Payload(path.parent / "code-ran")}, path)


@pytest.mark.parametrize("kind, problem", [
    ("empty", "is empty"),
    ("truncated", "truncated or corrupted"),
    ("random bytes", "is not a file torch.save writes"),
    ("missing keys", r"lacks the keys \['optimizer', 'history'\]"),
    ("other model", r"weights of another model .*shaped otherwise"),
    ("unsafe pickle", "weights_only=True\\) refuses"),
])
def test_a_damaged_checkpoint_says_what_is_wrong_and_leaves_the_model_alone(tmp_path, good_checkpoint, kind,
                                                                            problem):
    path = tmp_path / "damaged.pt"
    _damage(kind, good_checkpoint, path)
    m = model(seed=3)
    before = [p.detach().clone() for p in m.parameters()]
    with pytest.raises(CheckpointError, match=problem) as caught:
        load_checkpoint(path, m)
    assert str(path) in str(caught.value) and "bytes)" in str(caught.value)
    assert "earlier checkpoint" in str(caught.value) or "configuration it was trained with" in str(caught.value)
    with pytest.raises(CheckpointError, match=problem):
        train(m, loss_fn, get_batch, GOOD, resume_from=path)
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters()))
    assert not (tmp_path / "code-ran").exists()  # weights_only=True stays: nothing in the file ran


def test_a_missing_checkpoint_names_its_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nope.pt")):
        load_checkpoint(tmp_path / "nope.pt", model())


# --------------------------------------------------------------------------- devices


@pytest.mark.parametrize("device, error, message", [
    ("meta", ValueError, "meta"),
    ("gpu0", ValueError, "not a device name"),
    pytest.param("cuda", DeviceNotAvailableError, "CUDA was requested",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")),
])
def test_an_impossible_device_is_refused_before_the_model_is_touched(device, error, message):
    m = model()
    before = [p.detach().clone() for p in m.parameters()]
    with pytest.raises(error, match=message):
        train(m, loss_fn, get_batch, CONFIG, device=device)
    assert all(p.device.type == "cpu" and torch.equal(a, p) for a, p in zip(before, m.parameters()))


# --------------------------------------------------------------------------- a changed config on resume


def _checkpoint_at_2(tmp_path, **changes):
    path = tmp_path / "ckpt.pt"
    config = dataclasses.replace(CONFIG, max_steps=4, checkpoint_every=2, checkpoint_path=str(path), log_every=1,
                                 **{"schedule": "constant", **changes})
    train(model(), loss_fn, get_batch, dataclasses.replace(config, max_steps=2))
    return config, path


def test_resuming_with_a_changed_config_lists_every_difference(tmp_path):
    config, path = _checkpoint_at_2(tmp_path)
    changed = dataclasses.replace(config, lr=1e-3, betas=(0.8, 0.9), grad_clip=None)
    with pytest.raises(ConfigChangedError) as caught:
        train(model(), loss_fn, get_batch, changed, resume_from=path)
    message = str(caught.value)
    for difference in ("lr: 0.003 -> 0.001", "betas: [0.9, 0.98] -> [0.8, 0.9]", "grad_clip: 1.0 -> None"):
        assert difference in message
    assert "allow_config_change=True" in message
    # how far, how often and where: safe to change
    train(model(), loss_fn, get_batch, dataclasses.replace(config, max_steps=3, log_every=2), resume_from=path)


def test_cosine_max_steps_is_a_change_of_schedule(tmp_path):
    config, path = _checkpoint_at_2(tmp_path, schedule="cosine")
    with pytest.raises(ConfigChangedError, match="max_steps: 2 -> 6"):
        train(model(), loss_fn, get_batch, dataclasses.replace(config, max_steps=6), resume_from=path)


def test_an_allowed_config_change_really_applies(tmp_path, monkeypatch):
    config, path = _checkpoint_at_2(tmp_path)
    changed = dataclasses.replace(config, lr=1e-3, weight_decay=0.2, betas=(0.8, 0.9))
    made = []

    def recording(m, c):
        made.append(make_optimizer(m, c))
        return made[-1]

    monkeypatch.setattr("gpuformer_lib.train.make_optimizer", recording)
    with pytest.warns(UserWarning, match="lr: 0.003 -> 0.001.*weight_decay: 0.01 -> 0.2"):
        history = train(model(), loss_fn, get_batch, changed, resume_from=path, allow_config_change=True)
    assert history.lr == [3e-3, 3e-3, 1e-3, 1e-3]  # the checkpoint's steps, then the new lr from the schedule
    decay, no_decay = made[-1].param_groups
    assert decay["initial_lr"] == 1e-3 and decay["weight_decay"] == 0.2 and no_decay["weight_decay"] == 0.0
    assert decay["betas"] == no_decay["betas"] == (0.8, 0.9)


# --------------------------------------------------------------------------- resume through a DataLoader


def _loader_run(config, resume_from=None, generator_seed=None):
    torch.manual_seed(123)  # a fresh process's state; the loop reseeds anyway
    sequences = repeating_patterns(0, V, batch_size=40, seq_len=16, seed=5)
    dataset = torch.utils.data.TensorDataset(*sequences)
    generator = torch.Generator().manual_seed(generator_seed) if generator_seed is not None else None
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, shuffle=True, generator=generator)  # 5 a epoch
    return train(model(dropout=0.2), loss_fn, StepBatches(loader), config, resume_from=resume_from)


@pytest.mark.parametrize("generator_seed", [None, 0])
def test_resume_mid_epoch_through_a_shuffling_loader_with_dropout_is_exact(tmp_path, generator_seed):
    path = tmp_path / "ckpt.pt"
    config = dataclasses.replace(CONFIG, max_steps=12, checkpoint_every=7, checkpoint_path=str(path), log_every=1)
    full = _loader_run(config, generator_seed=generator_seed)
    resumed = _loader_run(config, resume_from=path, generator_seed=generator_seed)  # a new loader, from step 7
    assert resumed.step == full.step
    assert resumed.loss == full.loss  # bit for bit: same batches, same dropout masks


def test_make_train_step_can_skip_a_nonfinite_step_itself():
    m = model()
    before = [p.detach().clone() for p in m.parameters()]
    step = make_train_step(m, torch.optim.AdamW(m.parameters()), nan_from(0), grad_clip=None, skip_nonfinite=True)
    out = step([get_batch(0)])
    assert out.skipped is True and math.isnan(out.loss.item()) and out.grad_norm is not None
    assert all(torch.equal(a, p) and p.grad is None for a, p in zip(before, m.parameters()))
