"""The training loop: schedules, parameter groups, a stored reference loss curve, exact resume,
gradient accumulation, atomic checkpoints, and the config's errors."""

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gpuformer_lib.data import repeating_patterns
from gpuformer_lib.model import DecoderLM, TransformerConfig
from gpuformer_lib.train import (History, TrainConfig, load_checkpoint, lr_multiplier, parameter_groups, train)

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


CONFIG = TrainConfig(max_steps=40, lr=3e-3, warmup_steps=5, log_every=1, progress=False, weight_decay=0.01)


def test_loss_follows_the_stored_reference_curve():
    history = train(model(), loss_fn, get_batch, CONFIG)
    assert len(history.loss) == 40 and history.tokens[-1] == 40 * 16 * 16
    assert sum(history.loss[-5:]) / 5 < 0.75 * sum(history.loss[:5]) / 5  # it learns
    reference = json.loads(GOLDEN.read_text())["loss"]
    torch.testing.assert_close(torch.tensor(history.loss), torch.tensor(reference), rtol=2e-2, atol=2e-2)


def test_resume_continues_exactly(tmp_path):
    path = tmp_path / "ckpt.pt"
    config = dataclasses.replace(CONFIG, max_steps=20, checkpoint_every=10, checkpoint_path=str(path))
    full = train(model(dropout=0.2), loss_fn, get_batch, config)
    resumed = train(model(dropout=0.2, seed=99), loss_fn, get_batch, config, resume_from=path)  # other init, same result
    assert resumed.step == full.step
    assert resumed.loss == full.loss  # bit for bit: same batches, same dropout masks, same optimizer state
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # written atomically, no temporary files


def test_checkpoint_loads_with_weights_only(tmp_path):
    path = tmp_path / "c.pt"
    train(model(), loss_fn, get_batch, dataclasses.replace(CONFIG, max_steps=4, checkpoint_every=2,
                                                            checkpoint_path=str(path)))
    m = model(seed=5)
    step, history = load_checkpoint(path, m)
    assert step == 4 and isinstance(history, History) and len(history.loss) == 4
    torch.load(path, weights_only=True)  # no pickled code inside


def test_gradient_accumulation_equals_one_large_batch():
    big = dataclasses.replace(CONFIG, max_steps=1, warmup_steps=0, schedule="constant", grad_clip=None)
    m1, m2 = model(), model()
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
