"""Compression (``gpuformer_lib.compression``): the from-scratch int8 quantizer against its float64
rounding bound, the int8 product against exact integer arithmetic, ``Int8Linear`` against the float
layer within the derived bound (and no worse than ``torch.ao``'s dynamic int8 Linear), quantized models
against fp32 with smaller state dicts, the distillation loss and its gradient against a float64 reference
written independently, the hard-label control of ``distill``, and the clear errors."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fake_clock import FakeClock

from gpuformer_lib import bench
from gpuformer_lib import compression as C
from gpuformer_lib.model import DecoderLM, TransformerConfig

VOCAB = 23


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _weights(rows=48, cols=40, seed=0):
    magnitudes = 10 ** torch.empty(rows, 1).uniform_(-3, 1, generator=_gen(seed + 1))  # rows of very different sizes
    w = torch.randn(rows, cols, generator=_gen(seed)) * magnitudes
    w[3] = 0.0  # an all-zero row: scale 1, codes 0
    return w


# --------------------------------------------------------------------------- int8 from scratch


def test_per_channel_rounding_within_half_a_step_in_float64():
    w = _weights()
    q, scale = C.quantize_per_channel(w)
    assert q.dtype == torch.int8 and scale.shape == (w.shape[0],) and q.abs().max() <= C.INT8_MAX
    err = (w.double() - q.double() * scale.double()[:, None]).abs()
    assert (err <= scale.double()[:, None] / 2 * (1 + 1e-6)).all()
    assert scale[3] == 1 and (q[3] == 0).all()
    nonzero = [i for i in range(w.shape[0]) if i != 3]
    assert (q[nonzero].abs().amax(1) == C.INT8_MAX).all()  # each row's largest entry uses the full range
    torch.testing.assert_close(C.dequantize(q, scale), q.float() * scale[:, None], rtol=0, atol=0)


@pytest.mark.parametrize("use_int_mm", [True, False], ids=["int_mm", "int32_matmul"])
def test_int8_matmul_exact(monkeypatch, use_int_mm):
    if not use_int_mm:
        monkeypatch.delattr(torch, "_int_mm", raising=False)
    a = torch.randint(-127, 128, (33, 200), generator=_gen(0), dtype=torch.int8)
    b = torch.randint(-127, 128, (200, 17), generator=_gen(1), dtype=torch.int8)
    out = C.int8_matmul(a, b)
    assert out.dtype == torch.int32
    assert torch.equal(out.long(), a.long() @ b.long())
    assert torch.equal(C._int8_matmul_float64(a, b).long(), a.long() @ b.long())  # the path off the CPU


def test_int8_linear_within_derived_bound_and_no_worse_than_torch():
    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    x = torch.randn(5, 7, 64, generator=_gen(2)) * 3
    reference = F.linear(x.double(), linear.weight.double(), linear.bias.double()).reshape(-1, 48)
    own = C.Int8Linear.from_float(linear)(x)
    assert own.shape == (5, 7, 48)
    err = (own.reshape(-1, 48).double() - reference).abs()
    bound = C.int8_linear_error_bound(x, linear)
    assert (err <= bound + 1e-5 * reference.abs().max()).all()
    assert bound.max() < 0.1 * reference.abs().max()  # the bound says something: int8 is close
    # and the int8 path computes exactly the quantized product: dequantized x' w'^T + b in float64
    q_x, s_x = C.quantize_per_channel(x.reshape(-1, 64))
    q_w, s_w = C.quantize_per_channel(linear.weight)
    exact = C.dequantize(q_x, s_x).double() @ C.dequantize(q_w, s_w).double().T + linear.bias.double()
    torch.testing.assert_close(own.reshape(-1, 48).double(), exact, rtol=1e-6, atol=1e-6)
    torch_int8, _ = C.torch_quantize_dynamic(nn.Sequential(linear))
    torch_err = (torch_int8(x).reshape(-1, 48).double() - reference).abs().max()
    # per-row activations and per-channel weights are finer steps than torch's per-tensor ones
    assert err.max() <= 1.5 * torch_err


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=VOCAB, d_model=64, n_heads=4, n_decoder_layers=2, d_ff=256, dropout=0.0,
                               max_len=32, positional="learned", activation="gelu")
    return DecoderLM(config).eval()


def test_quantized_models_close_to_fp32_and_smaller(lm):
    ids = torch.randint(0, VOCAB, (4, 32), generator=_gen(3))
    with torch.no_grad():
        ref = lm(ids)
        own_model = C.quantize_model(lm)
        torch_model, texts = C.torch_quantize_dynamic(lm)
        own, theirs = own_model(ids), torch_model(ids)
    assert all(type(m) is not nn.Linear for m in own_model.modules())
    assert any(type(m) is nn.Linear for m in lm.modules())  # the original is untouched
    scale = ref.abs().max()
    assert (own - ref).abs().max() < 0.02 * scale and (theirs - ref).abs().max() < 0.05 * scale
    # each (M, K) linear weight goes from 4 MK bytes to MK + 4 M (codes + scales): the saving, by design
    saving = sum(3 * m.weight.numel() - 4 * m.out_features for m in lm.modules() if type(m) is nn.Linear)
    fp32, own_bytes, torch_bytes = (C.state_dict_bytes(m) for m in (lm, own_model, torch_model))
    assert fp32 - own_bytes == pytest.approx(saving, rel=0.05)
    assert torch_bytes < fp32 - 0.9 * saving
    assert 0 < C.linear_share(lm) < 1
    assert all(isinstance(t, str) for t in texts)


def test_compare_quantization_result(lm):
    stream = torch.randint(0, VOCAB, (2000,), generator=_gen(4))
    result = C.compare_quantization(lm, stream, batch=4, block=32, warmup=1, repeats=5, loss_batches=1)
    assert result.size_ratio == pytest.approx(result.fp32_bytes / result.int8_bytes) and result.size_ratio > 1.5
    assert result.own_size_ratio > 1.5
    assert result.speedup == pytest.approx(result.fp32_ms / result.int8_ms)
    assert abs(result.loss_change) < 0.05 and abs(result.own_loss_change) < 0.05
    assert result.loss_change == pytest.approx(result.int8_loss - result.fp32_loss)
    assert result.threads == 1 and result.input_shape == (4, 32)
    assert {k: (c.baseline, c.candidate) for k, c in result.comparisons.items()} == {
        "int8": (C.FLOAT32, C.TORCH_INT8), "own": (C.FLOAT32, C.OWN_INT8), "own vs int8": (C.TORCH_INT8, C.OWN_INT8)}
    assert result.comparisons["int8"].speedup == pytest.approx(result.speedup)


def test_quantization_timing_goes_through_the_interleaved_helper(lm, monkeypatch):
    # every timed forward lasts one tick of a fake clock: equal times, so every verdict must be a tie
    monkeypatch.setattr(bench, "time", FakeClock(tick=1e-3))
    stream = torch.randint(0, VOCAB, (2000,), generator=_gen(4))
    result = C.compare_quantization(lm, stream, batch=4, block=32, warmup=1, repeats=5, loss_batches=1)
    assert result.fp32_ms == result.int8_ms == result.own_int8_ms == pytest.approx(1.0)
    assert all(len(c.ratios) == 5 and c.verdict == "no difference we can see" for c in result.comparisons.values())


def test_int8_errors():
    with pytest.raises(ValueError, match="2-D"):
        C.quantize_per_channel(torch.randn(3))
    with pytest.raises(ValueError, match="floating-point"):
        C.quantize_per_channel(torch.ones(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="NaN"):
        C.quantize_per_channel(torch.tensor([[1.0, math.nan]]))
    with pytest.raises(ValueError, match="int8"):
        C.dequantize(torch.ones(2, 2), torch.ones(2))
    with pytest.raises(ValueError, match="int8 operands"):
        C.int8_matmul(torch.ones(2, 2), torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"\(N, K\)"):
        C.int8_matmul(torch.ones(2, 3, dtype=torch.int8), torch.ones(2, 2, dtype=torch.int8))
    with pytest.raises(ValueError, match=r"\(\.\.\., 8\)"):
        C.Int8Linear.from_float(nn.Linear(8, 4))(torch.randn(2, 5))
    with pytest.raises(TypeError, match="nn.Linear"):
        C.Int8Linear.from_float(nn.Conv1d(2, 2, 1))


# --------------------------------------------------------------------------- distillation


def _reference_distillation(s, t, y, T, alpha, ignore_index):
    """Float64, written out: softmax by exp / sum, KL and CE per kept position, then the mean."""
    s, t = s.double().reshape(-1, s.shape[-1]), t.double().reshape(-1, t.shape[-1])
    y = y.reshape(-1)
    total, kept = 0.0, 0
    for i in range(s.shape[0]):
        if y[i] == ignore_index:
            continue
        kept += 1
        ps = torch.exp(s[i] / T) / torch.exp(s[i] / T).sum()
        pt = torch.exp(t[i] / T) / torch.exp(t[i] / T).sum()
        kl = (pt * (torch.log(pt) - torch.log(ps))).sum()
        ce = -(s[i][y[i]] - torch.log(torch.exp(s[i]).sum()))
        total += alpha * T * T * kl + (1 - alpha) * ce
    return total / kept


@pytest.mark.parametrize("T,alpha", [(1.0, 0.5), (2.0, 0.5), (4.0, 0.9), (0.5, 0.1), (3.0, 1.0), (2.0, 0.0)])
def test_distillation_loss_matches_float64_reference_with_padding(T, alpha):
    g = _gen(int(T * 10 + alpha * 100))
    s, t = torch.randn(3, 6, 11, generator=g) * 2, torch.randn(3, 6, 11, generator=g) * 2
    y = torch.randint(0, 11, (3, 6), generator=g)
    y[0, 4:] = -100
    y[2, 1] = -100
    got = C.distillation_loss(s, t, y, temperature=T, alpha=alpha)
    torch.testing.assert_close(got.double(), _reference_distillation(s, t, y, T, alpha, -100), rtol=1e-5, atol=1e-6)
    # padding ignored: changing padded positions' logits changes nothing
    s2 = s.clone()
    s2[0, 4:] += 5 * torch.randn(2, 11, generator=g)
    torch.testing.assert_close(C.distillation_loss(s2, t, y, temperature=T, alpha=alpha), got)
    if alpha == 0:
        torch.testing.assert_close(got, F.cross_entropy(s.flatten(0, 1), y.flatten(), ignore_index=-100))


def test_distillation_gradient_matches_closed_form_and_gradcheck():
    g = _gen(7)
    s = (torch.randn(8, 9, generator=g, dtype=torch.float64) * 2).requires_grad_()
    t = torch.randn(8, 9, generator=g, dtype=torch.float64) * 2
    y = torch.randint(0, 9, (8,), generator=g)
    y[5] = 3  # a custom ignore index below
    T, alpha = 2.5, 0.7
    assert torch.autograd.gradcheck(lambda x: C.distillation_loss(x, t, y, T, alpha, ignore_index=3), (s,))
    C.distillation_loss(s, t, y, T, alpha, ignore_index=-100).backward()
    # d/ds of alpha T^2 KL(p_t || p_s(s/T)) = alpha T (p_s^T - p_t^T); of CE = p_s - onehot; over N positions
    ps_T, pt_T, ps = F.softmax(s.detach() / T, -1), F.softmax(t / T, -1), F.softmax(s.detach(), -1)
    expected = (alpha * T * (ps_T - pt_T) + (1 - alpha) * (ps - F.one_hot(y, 9))) / 8
    torch.testing.assert_close(s.grad, expected)


def test_distillation_teacher_gets_no_gradient():
    s, t = torch.randn(4, 5, requires_grad=True), torch.randn(4, 5, requires_grad=True)
    C.distillation_loss(s, t, torch.tensor([0, 1, 2, 3])).backward()
    assert t.grad is None and s.grad is not None


def test_distillation_errors():
    s, t, y = torch.randn(4, 5), torch.randn(4, 5), torch.tensor([0, 1, 2, 3])
    for T in (0.0, -1.0, math.inf):
        with pytest.raises(ValueError, match="temperature"):
            C.distillation_loss(s, t, y, temperature=T)
    for a in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\]"):
            C.distillation_loss(s, t, y, alpha=a)
    with pytest.raises(ValueError, match="one shape"):
        C.distillation_loss(s, torch.randn(4, 6), y)
    with pytest.raises(ValueError, match="integer class ids"):
        C.distillation_loss(s, t, y.float())
    with pytest.raises(ValueError, match="without V"):
        C.distillation_loss(s, t, y[:3])
    with pytest.raises(ValueError, match="every target"):
        C.distillation_loss(s, t, torch.full((4,), -100))


def test_distill_control_is_the_same_run_on_hard_labels():
    text = ("To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer "
            "the slings and arrows of outrageous fortune, or to take arms against a sea of troubles. ") * 8
    data = C.char_lm_data(text)
    torch.manual_seed(0)
    teacher = C.train_lm(DecoderLM(C.demo_config(data.vocab_size, d_model=32, n_layers=1)), data.train,
                         steps=3, batch=4, block=16)
    student = C.demo_config(data.vocab_size, d_model=16, n_layers=1)
    kwargs = dict(steps=3, seeds=(0, 1), batch=4, block=16, loss_batches=1)
    control = C.distill(teacher, student, data, alpha=0.0, **kwargs)  # alpha 0: both arms are the same run
    assert control.distilled_losses == pytest.approx(control.hard_label_losses, abs=1e-6)
    result = C.distill(teacher, student, data, temperature=2.0, alpha=0.5, **kwargs)
    assert result.hard_label_losses == control.hard_label_losses  # same seeds, batches and steps
    assert result.distilled_losses != result.hard_label_losses
    assert result.differences == tuple(h - d for h, d in zip(result.hard_label_losses, result.distilled_losses))
    assert result.student_parameters < result.teacher_parameters
    assert not (result.helped_every_seed and result.hurt_every_seed)
    with pytest.raises(ValueError, match="alpha"):
        C.distill(teacher, student, data, alpha=2.0, **kwargs)


# --------------------------------------------------------------------------- distillation of a translator

PAIRS = [(f"sentence {i % 60} here {'very ' * (i % 5)}long", f"句子{i % 60}" + "长" * (i % 9)) for i in range(240)]


@pytest.fixture(scope="module")
def prepared():
    from gpuformer_lib import translation_task

    return translation_task.prepare(PAIRS, max_len=16, min_freq=1)


def _tiny_translator_config(prepared, d_model, layers=1):
    return TransformerConfig(vocab_size=len(prepared.tgt_vocab), src_vocab_size=len(prepared.src_vocab),
                             d_model=d_model, n_heads=2, n_encoder_layers=layers, n_decoder_layers=layers,
                             d_ff=2 * d_model, dropout=0.1, max_len=16, tie_embeddings=False)


def test_translation_distillation_loss_ignores_padding_and_spares_the_teacher(prepared):
    from gpuformer_lib import data
    from gpuformer_lib.model import Transformer

    torch.manual_seed(0)
    student = Transformer(_tiny_translator_config(prepared, 16)).eval()
    teacher = Transformer(_tiny_translator_config(prepared, 32, layers=2)).eval()
    batch = data.collate_translation(prepared.train_set[:12])
    pad_src, pad_tgt = batch.src_padding_mask, batch.tgt_padding_mask
    assert pad_src.any() and pad_tgt.any()  # the batch has padding to change
    g = _gen(11)
    other = data.TranslationBatch(  # the same pairs with other ids at every padded slot (never PAD)
        src=torch.where(pad_src, torch.randint(4, len(prepared.src_vocab), pad_src.shape, generator=g), batch.src),
        src_padding_mask=pad_src,
        tgt_in=torch.where(pad_tgt, torch.randint(4, len(prepared.tgt_vocab), pad_tgt.shape, generator=g),
                           batch.tgt_in),
        tgt_out=torch.where(pad_tgt, torch.randint(4, len(prepared.tgt_vocab), pad_tgt.shape, generator=g),
                            batch.tgt_out),
        tgt_padding_mask=pad_tgt)

    def loss_and_grads(b, **kw):
        student.zero_grad(set_to_none=True)
        # ignore_index is PAD: the other batch marks its padding by the masks only, so give it PAD targets back
        loss = C.translation_distillation_loss(student, teacher, b, **kw)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in student.parameters()]

    ref_loss, ref_grads = loss_and_grads(batch, temperature=2.0, alpha=0.5)
    restored = data.TranslationBatch(other.src, pad_src, other.tgt_in,
                                     torch.where(pad_tgt, data.Vocab.PAD, other.tgt_out), pad_tgt)
    loss, grads = loss_and_grads(restored, temperature=2.0, alpha=0.5)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    assert all(p.grad is None for p in teacher.parameters())  # the teacher is not differentiated
    # the check can fail: garbage targets at padded slots, or a changed real target, change the loss
    assert not torch.allclose(C.translation_distillation_loss(student, teacher, other), ref_loss)
    changed = batch.tgt_out.clone()
    changed[0, 0] = (changed[0, 0] + 1 - 4) % (len(prepared.tgt_vocab) - 4) + 4
    assert not torch.allclose(C.translation_distillation_loss(
        student, teacher, data.TranslationBatch(batch.src, pad_src, batch.tgt_in, changed, pad_tgt)), ref_loss)
    # alpha 0: exactly the hard-label loss, which is cross-entropy over the real target tokens
    hard = C.hard_label_translation_loss(student, batch)
    assert torch.equal(C.translation_distillation_loss(student, teacher, batch, alpha=0.0), hard)
    with torch.no_grad():
        logits = student(batch.src, batch.tgt_in, pad_src, pad_tgt)
    real = ~pad_tgt
    torch.testing.assert_close(hard.detach().double(),
                               F.cross_entropy(logits[real].double(), batch.tgt_out[real]), rtol=1e-6, atol=1e-6)


def test_distill_translator_control_teacher_untouched_and_errors(prepared):
    from gpuformer_lib.model import Transformer

    torch.manual_seed(0)
    teacher = C.train_translator(Transformer(_tiny_translator_config(prepared, 32, layers=2)), prepared, steps=3,
                                 batch_size=8)
    teacher.zero_grad(set_to_none=True)  # its own training left gradients; distillation must add none
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    student = _tiny_translator_config(prepared, 16)
    kwargs = dict(steps=3, seeds=(0, 1), batch_size=8, val_pairs=16)
    control = C.distill_translator(teacher, student, prepared, alpha=0.0, **kwargs)
    assert control.distilled_losses == control.hard_label_losses  # alpha 0 is the hard-label run, to the bit
    result = C.distill_translator(teacher, student, prepared, temperature=1.0, alpha=0.5, **kwargs)
    assert result.hard_label_losses == control.hard_label_losses  # same seeds, initial weights, batches, steps
    assert result.distilled_losses != result.hard_label_losses
    assert result.hard_label_losses[0] != result.hard_label_losses[1]  # the seeds differ
    assert all(torch.equal(v, before[k]) for k, v in teacher.state_dict().items())
    assert all(p.grad is None for p in teacher.parameters()) and not teacher.training
    assert result.student_parameters < result.teacher_parameters and result.seconds > 0
    assert result.teacher_loss == control.teacher_loss
    with pytest.raises(ValueError, match="vocabularies"):  # a language model's config: one vocabulary
        C.distill_translator(teacher, C.demo_config(len(prepared.tgt_vocab)), prepared, 1)
    with pytest.raises(ValueError, match="vocabularies"):
        C.distill_translator(teacher, _tiny_translator_config(prepared, 16).__class__(
            vocab_size=50, src_vocab_size=40, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1,
            d_ff=32, max_len=16), prepared, 1)
    with pytest.raises(ValueError, match="temperature"):
        C.distill_translator(teacher, student, prepared, 1, temperature=0.0)


def test_translator_distillation_plan_and_one_call(prepared):
    from gpuformer_lib.device import SizePreset
    from gpuformer_lib.model_sizes import translation_run

    plan = C.translator_distillation_plan(prepared)
    cpu = translation_run(SizePreset("cpu", "test"), len(prepared.src_vocab), len(prepared.tgt_vocab),
                          prepared.max_len).config
    assert plan.teacher_config == cpu  # chapter 13's CPU translator
    s = plan.student_config
    assert (s.d_model, s.n_encoder_layers, s.n_decoder_layers) == (cpu.d_model // 2, 1, 1)
    assert (s.vocab_size, s.src_vocab_size) == (cpu.vocab_size, cpu.src_vocab_size)
    assert plan.teacher_steps > plan.student_steps and len(plan.seeds) == 2
    quick = C.translator_distillation_plan(prepared, quick=True)
    tiny = C.TranslatorDistillationPlan(  # the quick plan's steps on tiny models
        _tiny_translator_config(prepared, 32), _tiny_translator_config(prepared, 16), teacher_steps=quick.teacher_steps,
        student_steps=quick.student_steps, batch_size=quick.batch_size, lr=quick.lr, temperature=quick.temperature,
        alpha=quick.alpha, seeds=quick.seeds, val_pairs=16, other_temperatures=quick.other_temperatures)
    assert plan.other_temperatures == quick.other_temperatures == (2.0,) and plan.temperature == 1.0
    result = C.translator_distillation(prepared, tiny)
    assert result.teacher_steps == quick.teacher_steps and result.teacher_seconds > 0
    assert len(result.distilled_losses) == len(quick.seeds) and result.steps == quick.student_steps
    [(t2, t2_losses)] = result.other_temperatures
    assert t2 == 2.0 and len(t2_losses) == len(quick.seeds) and all(loss > 0 for loss in t2_losses)
    assert result.helped_every_seed_at(2.0) == all(d < h for d, h in zip(t2_losses, result.hard_label_losses))
    assert result.helped_every_seed_at(1.0) == result.helped_every_seed
    with pytest.raises(ValueError, match="no run at T = 3"):
        result.helped_every_seed_at(3.0)


def test_unigram_loss_against_a_count_by_hand():
    import math

    train, heldout = torch.tensor([0, 0, 0, 1]), torch.tensor([0, 1])
    assert C.unigram_loss(train, heldout) == pytest.approx(-(math.log(3 / 4) + math.log(1 / 4)) / 2)
    with pytest.raises(ValueError, match="never occur"):
        C.unigram_loss(train, torch.tensor([2]))
    with pytest.raises(ValueError, match="1-D int64"):
        C.unigram_loss(train.float(), heldout)
    with pytest.raises(TypeError, match="TranslatorDistillationPlan"):
        C.translator_distillation(prepared, plan={"teacher_steps": 1})


@pytest.mark.parametrize("diffs, words", [
    ((0.05, 0.03), "lower than the control on every seed"),
    ((-0.05, -0.021), "higher than the control on every seed"),
    ((0.01, -0.02), "within 0.02 nats of the control on every seed: no clear effect"),
    ((0.0,), "within 0.02 nats of the control on every seed: no clear effect"),
    ((0.05, 0.01), "lower on some seeds and higher on others: no effect beyond seed-to-seed noise"),
    ((0.05, -0.05), "lower on some seeds and higher on others: no effect beyond seed-to-seed noise"),
    ((-0.03, 0.0), "lower on some seeds and higher on others: no effect beyond seed-to-seed noise"),
])
def test_distillation_words_one_threshold_every_branch(diffs, words):
    assert C.distillation_words(diffs, 0.02) == words


def test_distillation_words_threshold_and_errors():
    assert C.distillation_words((0.05, 0.03), threshold=0.04).startswith("lower on some seeds")
    assert C.distillation_words((0.05, 0.03), threshold=0.1).startswith("within 0.1 nats")
    for bad in ((), (float("nan"),)):
        with pytest.raises(ValueError, match="one finite number per seed"):
            C.distillation_words(bad)
    with pytest.raises(ValueError, match="threshold"):
        C.distillation_words((0.1,), threshold=-0.01)
