"""Speed techniques applied from outside (``speed``): checkpointing wraps layers without changing the
computation or the state_dict, construction-time choices, and the one training step against a step
written out by hand."""

import contextlib
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from gpuformer_lib import speed
from gpuformer_lib.bench import float32_matmul_precision
from gpuformer_lib.memory import SavedActivations, set_activation_checkpointing
from gpuformer_lib.model import DecoderLM, Transformer, TransformerConfig

CONFIG = TransformerConfig(vocab_size=61, d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=3, d_ff=64,
                           dropout=0.0, max_len=32)


def lm(config=CONFIG, seed=0):
    torch.manual_seed(seed)
    return DecoderLM(config)


def batch(B=3, T=12, seed=1):
    return torch.randint(0, CONFIG.vocab_size, (B, T + 1), generator=torch.Generator().manual_seed(seed))


def test_plan_validation():
    with pytest.raises(ValueError, match="compile=True"):
        speed.SpeedPlan(cuda_graphs=True)
    with pytest.raises(ValueError, match="bfloat16, torch.float16 or None"):
        speed.SpeedPlan(dtype=torch.float64)
    with pytest.raises(ValueError, match="CUDA device"):
        speed.apply_plan(lm(), speed.SpeedPlan(compile=True, cuda_graphs=True), "cpu")


def test_model_config_sets_the_construction_time_choices():
    plan = speed.SpeedPlan(fused_attention=False, check_token_ids=False)
    model = DecoderLM(speed.model_config(CONFIG, plan))
    assert not any(layer.self_attn.fused for layer in model.blocks.layers)
    assert not model.embed.check_ids
    bad = torch.full((1, 4), CONFIG.vocab_size + 5)
    with pytest.raises(IndexError):  # unchecked (no host sync): the lookup itself fails, with torch's message
        model(bad)
    with pytest.raises(ValueError, match="token ids must lie in"):
        lm()(bad)


@pytest.mark.parametrize("build", [lm, lambda: Transformer(CONFIG)])
def test_checkpointing_wraps_every_layer_and_keeps_the_state_dict(build):
    torch.manual_seed(0)
    model = build()
    keys = list(model.state_dict())
    layers = CONFIG.n_decoder_layers + (CONFIG.n_encoder_layers if isinstance(model, Transformer) else 0)
    assert speed.apply_activation_checkpointing(model) == layers
    assert speed.apply_activation_checkpointing(model) == layers  # idempotent: nothing wrapped twice
    assert sum(isinstance(m, speed.CheckpointedLayer) for m in model.modules()) == layers
    assert list(model.state_dict()) == keys  # checkpoints load into an unwrapped model and back
    torch.manual_seed(0)
    plain = build()
    plain.load_state_dict(model.state_dict())
    model.load_state_dict(plain.state_dict())
    assert speed.remove_activation_checkpointing(model) == layers
    assert not any(isinstance(m, speed.CheckpointedLayer) for m in model.modules())


def test_checkpointing_keeps_less_and_gives_the_same_loss_and_gradients():
    ids = batch()
    results = []
    for checkpointing in (False, True):
        model = lm()
        assert set_activation_checkpointing(model, checkpointing) == CONFIG.n_decoder_layers
        with SavedActivations(model) as saved:
            loss, _ = speed.next_token_loss(model, ids)
        loss.backward()
        results.append((saved.bytes, loss.detach(), [p.grad for p in model.parameters()]))
    (kept_off, loss_off, grads_off), (kept_on, loss_on, grads_on) = results
    assert kept_on < kept_off / 2
    torch.testing.assert_close(loss_on, loss_off)
    for a, b in zip(grads_on, grads_off):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_checkpointed_layers_are_plain_in_eval_and_without_gradients():
    model = lm()
    speed.apply_activation_checkpointing(model)
    model.eval()
    with SavedActivations(model) as saved:
        model(batch()[:, :-1])
    reference = lm().eval()
    with SavedActivations(reference) as plain:
        reference(batch()[:, :-1])
    assert saved.bytes == plain.bytes
    with torch.no_grad():
        torch.testing.assert_close(model(batch()[:, :-1]), reference(batch()[:, :-1]))


def reference_step(model, optimizer, micro_batches, *, by_tokens=False, clip=None):
    """A training step written out by hand, the way the course first writes one."""
    total_tokens = sum(ids[:, 1:].numel() for ids in micro_batches)
    for ids in micro_batches:
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        weight = ids[:, 1:].numel() / total_tokens if by_tokens else 1 / len(micro_batches)
        (loss * weight).backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("by_tokens", [False, True])
@pytest.mark.parametrize("accum", [1, 3])
def test_train_step_equals_a_step_written_out(by_tokens, accum):
    micro = [batch(B=2, T=5 + 3 * i, seed=i) for i in range(accum)]  # unequal token counts
    ours, ref = lm(), lm()
    # SGD: AdamW would turn the key bias's gradient, zero up to rounding, into full-size updates
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.5, momentum=0.9)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.5, momentum=0.9)
    step = speed.make_train_step(ours, opt_ours, speed.next_token_loss, grad_accum_steps=accum,
                                 normalize_by="tokens" if by_tokens else "micro_batches", grad_clip=0.5)
    for _ in range(2):
        out = step(iter(micro))  # a generator works: micro-batches are fetched one at a time
        reference_step(ref, opt_ref, micro, by_tokens=by_tokens, clip=0.5)
    for a, b in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert out.tokens == sum(ids[:, 1:].numel() for ids in micro) and out.grad_norm > 0
    assert all(p.grad is None for p in ours.parameters())


def test_train_step_by_tokens_equals_one_large_batch():
    ids = batch(B=4, T=10)
    one, split = lm(), lm()
    steps = [speed.make_train_step(m, torch.optim.SGD(m.parameters(), lr=0.1), speed.next_token_loss,
                                   grad_accum_steps=k, normalize_by="tokens")
             for m, k in ((one, 1), (split, 2))]
    big = steps[0]([ids]).loss
    small = steps[1]([ids[:1], ids[1:]]).loss  # 1 + 3 sequences: unequal micro-batches
    torch.testing.assert_close(small, big)
    for a, b in zip(one.parameters(), split.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_train_step_checks_its_arguments():
    model = lm()
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(ValueError, match="GradScaler"):
        speed.make_train_step(model, opt, speed.next_token_loss, dtype=torch.float16)
    with pytest.raises(ValueError, match="grad_accum_steps"):
        speed.make_train_step(model, opt, speed.next_token_loss, grad_accum_steps=0)
    with pytest.raises(ValueError, match="normalize_by"):
        speed.make_train_step(model, opt, speed.next_token_loss, normalize_by="sequences")
    step = speed.make_train_step(model, opt, speed.next_token_loss, grad_accum_steps=2)
    with pytest.raises(ValueError, match="got 1 micro-batches"):
        step([batch()])


class RecordingNoSync:
    """A stand-in for ``ddp.no_sync``: records, for each forward and each backward, whether it ran inside."""

    def __init__(self, model):
        self.inside, self.forwards, self.backwards = False, [], []
        model.embed.weight.register_hook(lambda grad: self.backwards.append(self.inside))

    def loss_fn(self, model, ids):
        self.forwards.append(self.inside)
        return speed.next_token_loss(model, ids)

    @contextlib.contextmanager
    def __call__(self):
        assert not self.inside, "no_sync entered twice"
        self.inside = True
        try:
            yield
        finally:
            self.inside = False


@pytest.mark.parametrize("accum", [1, 3])
def test_train_step_holds_back_the_all_reduce_in_every_micro_batch_but_the_last(accum):
    model, ref = lm(), lm()
    fake = RecordingNoSync(model)
    step = speed.make_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), fake.loss_fn,
                                 grad_accum_steps=accum, no_sync=fake)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    micro = [batch(seed=s) for s in range(accum)]
    for _ in range(2):
        step(iter(micro))
        reference_step(ref, opt_ref, micro)
    expected = [True] * (accum - 1) + [False]  # forward and backward of all but the last inside no_sync
    assert fake.forwards == expected * 2 and fake.backwards == expected * 2
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_train_step_with_no_sync_refuses_a_wrong_number_of_micro_batches():
    model = lm()
    fake = RecordingNoSync(model)
    step = speed.make_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), fake.loss_fn,
                                 grad_accum_steps=2, no_sync=fake)
    with pytest.raises(ValueError, match="more than 2 micro-batches"):
        step(batch(seed=s) for s in range(3))
    assert fake.forwards == [True, False]  # the third never ran: it would have come after the all-reduce
    model.zero_grad(set_to_none=True)
    with pytest.raises(ValueError, match="got 1 micro-batches"):
        step([batch()])  # its only micro-batch ran inside no_sync: the gradients were never reduced


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_train_step_in_low_precision_stays_close_to_float32(dtype):
    plan = speed.SpeedPlan(dtype=dtype)
    losses = {}
    for name, d in (("fp32", None), ("low", dtype)):
        model = lm()
        step = speed.make_train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), speed.next_token_loss,
                                     dtype=d, scaler=speed.grad_scaler(dataclasses.replace(plan, dtype=d), "cpu"))
        losses[name] = [float(step([batch(seed=s)]).loss) for s in range(3)]
    assert losses["low"] == pytest.approx(losses["fp32"], rel=2e-2)


def test_train_step_sets_and_restores_matmul_precision():
    seen = []

    def loss_fn(model, ids):
        seen.append(torch.get_float32_matmul_precision())
        return speed.next_token_loss(model, ids)

    model = lm()
    with float32_matmul_precision("medium"):
        for tf32, expected in ((True, "high"), (False, "highest"), (None, "medium")):
            speed.make_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn, tf32=tf32)([batch()])
            assert seen[-1] == expected and torch.get_float32_matmul_precision() == "medium"


def test_fused_optimizer_follows_the_plan():
    model = lm()
    assert speed.make_adamw(model.parameters(), speed.SpeedPlan(fused_optimizer=True)).defaults["fused"]
    assert not speed.make_adamw(model.parameters(), speed.SpeedPlan()).defaults["fused"]


def test_the_step_divides_by_tokens_the_same_without_torchs_private_foreach_kernel(monkeypatch):
    """normalize_by='tokens' divides every gradient with torch._foreach_div_ (private: one launch for all) where
    torch has it, else one tensor at a time: the same weights either way. SGD without foreach: only the step
    divides."""
    micro = [batch(B=2, T=5, seed=0), batch(B=3, T=7, seed=1)]
    weights = []
    for private in (True, False):
        if not private:
            monkeypatch.delattr(torch, "_foreach_div_")
        model = lm()
        step = speed.make_train_step(model, torch.optim.SGD(model.parameters(), lr=0.5, foreach=False),
                                     speed.next_token_loss, grad_accum_steps=2, normalize_by="tokens")
        step(iter(micro))
        weights.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*weights):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_loss_scale_is_read_from_the_device_or_through_the_public_getter():
    """speed.current_scale: GradScaler's device tensor (private ``_scale``, read without a host sync) where it
    has one, else the public get_scale()'s number."""
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(torch.ones(()))  # creates the scale tensor
    assert speed.current_scale(scaler) is scaler._scale and speed.current_scale(scaler).item() == 1024.0

    class PublicOnly:
        def get_scale(self):
            return 512.0

    assert speed.current_scale(PublicOnly()).item() == 512.0
