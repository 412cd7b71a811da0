"""The training loop: schedules, parameter groups, a stored reference loss curve, exact resume (batches
drawn from the global generator, a shuffling DataLoader), gradient accumulation, atomic checkpoints,
and the config's errors. Faults (NaN, kills, damaged files) are in test_faults_training.py."""

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gpuformer_lib.data import StepBatches, repeating_patterns
from gpuformer_lib.model import DecoderLM, TransformerConfig
from gpuformer_lib.train import (History, TrainConfig, compare_resumed, load_checkpoint, lr_multiplier,
                                 parameter_groups, resume_tolerance, train)

GOLDEN = Path(__file__).parent / "golden" / "decoder_lm_repeat_task.json"
V = 12


def model(dropout=0.0, seed=0):
    torch.manual_seed(seed)
    return DecoderLM(TransformerConfig(vocab_size=V, d_model=32, n_heads=4, n_decoder_layers=2, d_ff=64,
                                       dropout=dropout, max_len=32))


def get_batch(i, batch_size=16):
    return repeating_patterns(i, V, batch_size=batch_size, seq_len=16, seed=1000)  # a function of its index


def loss_fn(m, batch):
    x, y = batch
    logits = m(x)
    return F.cross_entropy(logits.reshape(-1, V), y.reshape(-1)), y.numel()


CONFIG = TrainConfig(max_steps=40, lr=1e-2, warmup_steps=5, log_every=1, progress=False, weight_decay=0.01)


def test_loss_follows_the_stored_reference_curve():
    history = train(model(), loss_fn, get_batch, CONFIG)
    assert len(history.loss) == 40 and history.tokens[-1] == 40 * 16 * 16
    assert abs(history.loss[0] - math.log(V)) < 0.15  # starts at an even guess over the V tokens
    assert sum(history.loss[-5:]) / 5 < math.log(V) - 0.1  # and learns
    reference = json.loads(GOLDEN.read_text())["loss"]
    torch.testing.assert_close(torch.tensor(history.loss), torch.tensor(reference), rtol=2e-2, atol=2e-2)


def test_resume_continues_exactly(tmp_path):
    path = tmp_path / "ckpt.pt"
    # checkpoints at step 12 only (not at the end, which would overwrite it), so the resumed run trains 12-19
    config = dataclasses.replace(CONFIG, max_steps=20, checkpoint_every=12, checkpoint_path=str(path))
    full = train(model(dropout=0.2), loss_fn, get_batch, config)
    assert load_checkpoint(path, model(dropout=0.2))[0] == 12
    resumed = train(model(dropout=0.2, seed=99), loss_fn, get_batch, config, resume_from=path)  # other init, same result
    assert resumed.step == full.step
    assert resumed.loss == full.loss  # bit for bit: same batches, same dropout masks, same optimizer state
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # written atomically, no temporary files


class _OnGpu:
    """Stands in for a CUDA ByteTensor, as ``torch.load(map_location="cuda")`` returns an RNG state:
    ``torch.set_rng_state`` rejects it (TypeError), its ``.cpu()`` is the CPU tensor."""

    device = torch.device("cuda", 0)

    def __init__(self, tensor):
        self._tensor = tensor

    def cpu(self):
        return self._tensor


def _load_with_rng_on_gpu(monkeypatch, cuda_states=None):
    """Make torch.load return the checkpoint's RNG states as if map_location had put them on a GPU."""
    real_load = torch.load

    def load(*args, **kwargs):
        state = real_load(*args, **kwargs)
        state["torch_rng"] = _OnGpu(state["torch_rng"])
        if cuda_states is not None:
            state["cuda_rng"] = [_OnGpu(s) for s in cuda_states]
        return state

    monkeypatch.setattr(torch, "load", load)


def _checkpointed_run(tmp_path, **changes):
    """(uninterrupted history, config, checkpoint path): 20 steps with dropout, one checkpoint at step 12."""
    path = tmp_path / "ckpt.pt"
    config = dataclasses.replace(CONFIG, max_steps=20, checkpoint_every=12, checkpoint_path=str(path), **changes)
    return train(model(dropout=0.2), loss_fn, get_batch, config), config, path


def test_resume_restores_rng_states_that_map_location_put_on_a_gpu(tmp_path, monkeypatch):
    full, config, path = _checkpointed_run(tmp_path)
    _load_with_rng_on_gpu(monkeypatch)
    resumed = train(model(dropout=0.2, seed=99), loss_fn, get_batch, config, resume_from=path)
    assert resumed.loss == full.loss  # same dropout masks after the resume: the RNG state was restored


def test_checkpoint_from_more_gpus_restores_the_gpus_present(tmp_path, monkeypatch):
    _, _, path = _checkpointed_run(tmp_path)
    saved = [torch.full((16,), i, dtype=torch.uint8) for i in range(2)]  # written on a 2-GPU machine
    _load_with_rng_on_gpu(monkeypatch, cuda_states=saved)
    restored = []

    def set_rng_state(state, device):  # as strict as torch.cuda.set_rng_state: a CPU ByteTensor
        assert isinstance(state, torch.Tensor) and state.device.type == "cpu" and state.dtype == torch.uint8
        restored.append((device, state[0].item()))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
    with pytest.warns(UserWarning, match="2 GPU.* has 1: restoring 1"):
        step, _ = load_checkpoint(path, model(dropout=0.2))
    assert step == 12 and restored == [(0, 0)]  # GPU 0's state, and no call for a GPU that is not there


def test_resume_tolerance_is_exact_on_a_cpu_and_rounding_sized_on_a_gpu():
    for precision in ("fp32", "bf16", "fp16"):
        assert resume_tolerance("cpu", precision) == {"rtol": 0.0, "atol": 0.0}
    fp32, bf16 = resume_tolerance("cuda", "fp32")["rtol"], resume_tolerance(torch.device("cuda", 1), "bf16")["rtol"]
    assert 0 < fp32 < bf16 < 1e-3
    with pytest.raises(ValueError, match="precision must be one of"):
        resume_tolerance("cuda", "fp8")
    assert compare_resumed([2.5, 2.0], [2.5, 2.0], "cpu", "fp32") == "all 2 losses identical, bit for bit"
    assert "largest relative difference 1.0e-04" in compare_resumed([2.0, 2.0002], [2.0, 2.0], "cuda", "bf16")
    with pytest.raises(AssertionError):
        compare_resumed([2.0, 2.0000001], [2.0, 2.0], "cpu", "fp32")
    with pytest.raises(ValueError, match="as many"):
        compare_resumed([2.0], [2.0, 2.0], "cpu", "fp32")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_gpu_resume_tolerance_allows_rounding_and_catches_a_broken_resume(tmp_path, monkeypatch, precision):
    """The GPU tolerance, tried on a CPU: 1% noise on every gradient element (far more than atomic adds
    in another order cause) passes; a resume that forgets the random-number state fails."""
    full, config, path = _checkpointed_run(tmp_path, precision=precision)
    noise = torch.Generator().manual_seed(1)
    noisy = model(dropout=0.2)
    for p in noisy.parameters():
        p.register_hook(lambda grad: grad * (1 + 0.01 * torch.randn(grad.shape, generator=noise)))
    rounded = train(noisy, loss_fn, get_batch, config, resume_from=path)
    assert rounded.loss[12:] != full.loss[12:]  # the noise did change the losses
    compare_resumed(rounded.loss[12:], full.loss[12:], "cuda", precision)

    monkeypatch.setattr(torch, "set_rng_state", lambda state: torch.manual_seed(123))  # forgets the saved state
    broken = train(model(dropout=0.2), loss_fn, get_batch, config, resume_from=path)
    with pytest.raises(AssertionError):
        compare_resumed(broken.loss[12:], full.loss[12:], "cuda", precision)


def test_checkpoint_loads_with_weights_only(tmp_path):
    path = tmp_path / "c.pt"
    train(model(), loss_fn, get_batch, dataclasses.replace(CONFIG, max_steps=4, checkpoint_every=2,
                                                            checkpoint_path=str(path)))
    m = model(seed=5)
    step, history = load_checkpoint(path, m)
    assert step == 4 and isinstance(history, History) and len(history.loss) == 4
    torch.load(path, weights_only=True)  # no pickled code inside


def test_gradient_accumulation_equals_one_large_batch():
    # eps = 1: AdamW's first step is lr * g / (|g| + eps), which for eps << |g| is lr * sign(g), blind to a
    # gradient's scale (an accumulation that forgot to divide by its steps would pass); with eps = 1 it follows g.
    # In float64: where a gradient is near 0, a float32 rounding difference between the two orders of summation
    # moved a weight by 1.7e-5 on one CPU (an Intel Xeon).
    big = dataclasses.replace(CONFIG, max_steps=1, warmup_steps=0, schedule="constant", grad_clip=None, eps=1.0)
    m1, m2 = model().double(), model().double()
    train(m1, loss_fn, lambda i: get_batch(0, batch_size=16), big)
    halves = lambda i: tuple(t[8 * i: 8 * (i + 1)] for t in get_batch(0, batch_size=16))  # noqa: E731
    train(m2, loss_fn, halves, dataclasses.replace(big, grad_accum_steps=2))
    for a, b in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def padded_batch(i):
    """Eight sequences whose padding differs a lot between the two halves of the batch."""
    x, y = get_batch(i, batch_size=8)
    lengths = torch.tensor([16, 15, 14, 16, 3, 2, 5, 4])
    padding = torch.arange(16) >= lengths[:, None]
    return x, y, padding


def masked_loss_fn(m, batch):
    x, y, padding = batch
    logits = m(x, padding_mask=padding)
    real = ~padding
    return F.cross_entropy(logits[real], y[real]), real.sum()


@pytest.mark.parametrize("normalize_by, equal", [("tokens", True), ("micro_batches", False)])
def test_accumulation_with_uneven_padding(normalize_by, equal):
    big = dataclasses.replace(CONFIG, max_steps=1, warmup_steps=0, schedule="constant", grad_clip=None,
                              lr=1e-2, normalize_by=normalize_by)
    m1, m2 = model(), model()
    h1 = train(m1, masked_loss_fn, lambda i: padded_batch(0), big)
    halves = lambda i: tuple(t[4 * i: 4 * (i + 1)] for t in padded_batch(0))  # noqa: E731
    h2 = train(m2, masked_loss_fn, halves, dataclasses.replace(big, grad_accum_steps=2))
    assert h1.tokens == h2.tokens == [int((~padded_batch(0)[2]).sum())]
    gap = max((a - b).abs().max().item() for a, b in zip(m1.parameters(), m2.parameters()))
    if equal:  # the token-weighted mean is the large batch's loss, so the update is the same
        assert gap < 1e-6 and abs(h1.loss[0] - h2.loss[0]) < 1e-5
    else:  # the mean of two means over-weights the short (padded) half: a different update
        assert gap > 1e-4


def test_token_counts_may_stay_on_the_device():
    def tensor_count_loss(m, batch):
        loss, n = loss_fn(m, batch)
        return loss, torch.tensor(n)  # as a loss_fn computing (~padding_mask).sum() would return it

    history = train(model(), tensor_count_loss, get_batch, dataclasses.replace(CONFIG, max_steps=3))
    assert history.tokens == [256, 512, 768] and all(isinstance(t, int) for t in history.tokens)


def test_bf16_autocast_trains_on_cpu():
    history = train(model(), loss_fn, get_batch, dataclasses.replace(CONFIG, max_steps=5, precision="bf16"))
    assert all(math.isfinite(x) for x in history.loss)


def test_evaluation_is_recorded():
    calls = []

    def eval_fn(m):
        calls.append(m.training)
        return 1.5

    history = train(model(), loss_fn, get_batch, dataclasses.replace(CONFIG, max_steps=6, eval_every=3), eval_fn=eval_fn)
    assert history.eval_step == [2, 5] and history.eval_loss == [1.5, 1.5] and calls == [False, False]


def test_schedules():
    warm = TrainConfig(max_steps=100, warmup_steps=10, schedule="inverse_sqrt")
    f = lr_multiplier(warm)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0) and f(39) == pytest.approx(0.5)
    cos = lr_multiplier(dataclasses.replace(warm, schedule="cosine", min_lr_ratio=0.1))
    assert cos(9) == pytest.approx(1.0) and cos(99) == pytest.approx(0.1) and 0.1 < cos(50) < 1
    assert lr_multiplier(dataclasses.replace(warm, schedule="constant"))(80) == 1.0


def test_norms_and_biases_do_not_decay():
    m = model()
    decay, no_decay = parameter_groups(m, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    assert any(p is m.blocks.norm.weight for p in no_decay["params"])
    assert sum(p.numel() for g in (decay, no_decay) for p in g["params"]) == sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("changes, message", [
    (dict(schedule="linear"), "schedule must be"),
    (dict(precision="fp8"), "precision must be"),
    (dict(max_steps=0), "max_steps >= 1"),
    (dict(schedule="inverse_sqrt", warmup_steps=0), "warmup_steps > 0"),
    (dict(checkpoint_every=10), "checkpoint_path"),
    (dict(grad_clip=0.0), "grad_clip"),
    (dict(normalize_by="sequences"), "normalize_by"),
    (dict(lr=float("nan")), "lr must be a finite number"),
    (dict(lr=float("inf")), "lr must be a finite number"),
    (dict(lr=0.0), "lr > 0"),
    (dict(eps=0.0), "eps > 0"),
    (dict(weight_decay=-0.1), "weight_decay >= 0"),
    (dict(weight_decay=float("nan")), "weight_decay must be a finite number"),
    (dict(min_lr_ratio=float("nan")), "min_lr_ratio must be a finite number"),
    (dict(betas=(0.9, 1.0)), r"betas must be two numbers in \[0, 1\)"),
    (dict(betas=(float("nan"), 0.9)), "betas"),
    (dict(betas=(0.9,)), "betas"),
    (dict(max_steps=2.5), "max_steps >= 1"),
    (dict(log_every=0), "log_every >= 1"),
    (dict(eval_every=-1), "eval_every >= 0"),
    (dict(on_nonfinite="ignore"), "on_nonfinite must be one of"),
])
def test_config_errors(changes, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**changes)


def test_fp16_scaler_skips_a_step_whose_gradients_overflow():
    def batches(i):
        x, y = get_batch(i)
        if i == 1:
            x = x.clone()
            x[0, 0] = -1  # marks the batch; the id is replaced below before the model sees it
        return x, y

    def guarded(m, batch):
        x, y = batch
        marked = bool((x[0, 0] == -1).item())
        x = x.clamp(min=0)
        loss, n = loss_fn(m, (x, y))
        return (loss * float("inf") if marked else loss), n

    config = dataclasses.replace(CONFIG, precision="fp16", grad_clip=None)
    one, two = model(), model()
    train(one, guarded, batches, dataclasses.replace(config, max_steps=1))
    history = train(two, guarded, batches, dataclasses.replace(config, max_steps=2))
    assert math.isinf(history.loss[1])
    assert history.loss_scale[1] == history.loss_scale[0] / 2  # the scaler backed off
    for a, b in zip(one.parameters(), two.parameters()):
        assert torch.equal(a, b)  # the overflowing step changed nothing


def random_batch(i, extra_draws=0):
    """A batch drawn from the global generator, as hand-written get_batch functions often are; then
    ``extra_draws`` more numbers that nothing uses."""
    seq = torch.randint(0, V, (16, 17))
    torch.rand(extra_draws)
    return seq[:, :-1], seq[:, 1:]


def test_batches_drawn_from_the_global_generator_depend_on_the_step_only(tmp_path):
    path = tmp_path / "ckpt.pt"
    config = dataclasses.replace(CONFIG, max_steps=20, checkpoint_every=12, checkpoint_path=str(path))
    drawn = {}

    def recorded(i, extra_draws=0):
        batch = random_batch(i, extra_draws)
        drawn.setdefault(extra_draws, []).append(batch[0])
        return batch

    full = train(model(dropout=0.2), loss_fn, recorded, config)
    resumed = train(model(dropout=0.2, seed=99), loss_fn, recorded, config, resume_from=path)
    assert resumed.loss == full.loss  # bit for bit
    # more draws in get_batch move neither the batches nor the model's dropout masks ...
    unsaved = dataclasses.replace(config, checkpoint_every=0)
    assert train(model(dropout=0.2), loss_fn, lambda i: recorded(i, 100), unsaved).loss == full.loss
    # ... and a model without dropout (no draws of its own) sees the same batches
    train(model(dropout=0.0), loss_fn, lambda i: recorded(i, 1), unsaved)
    assert all(torch.equal(a, b) for a, b in zip(drawn[0][:20], drawn[1], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(drawn[0][:20], drawn[100], strict=True))


def _shuffling_loader():
    dataset = torch.utils.data.TensorDataset(torch.arange(20))
    return torch.utils.data.DataLoader(dataset, batch_size=4, shuffle=True)  # 5 batches an epoch


def test_step_batches_give_a_step_the_same_batch_however_they_get_there():
    in_order = StepBatches(_shuffling_loader())
    batches = [in_order(s)[0] for s in range(12)]
    rng_before = torch.get_rng_state()
    jumped = StepBatches(_shuffling_loader())(7)[0]  # a resumed run's first call: mid-epoch 1
    assert torch.equal(jumped, batches[7])
    assert torch.equal(torch.get_rng_state(), rng_before)  # drawing batches left the global generator alone
    assert sorted(torch.cat(batches[:5]).tolist()) == list(range(20))  # an epoch is a permutation ...
    assert not torch.equal(torch.cat(batches[:5]), torch.cat(batches[5:10]))  # ... a new one each epoch
    other_seed = [StepBatches(_shuffling_loader(), seed=1)(s)[0] for s in range(5)]
    assert not torch.equal(torch.cat(other_seed), torch.cat(batches[:5]))
