"""The FLOPs formula against PyTorch's FLOP counter, MFU, and the memory calculator against the bytes
a real model and optimizer hold."""

import functools

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import dataclasses

from gpuformer_lib import bench
from gpuformer_lib.memory import (SavedActivations, fit_micro_batch, layer_activation_bytes, measure_peak_memory,
                                  model_state_bytes, set_activation_checkpointing, training_memory)
from gpuformer_lib.model import DecoderLM, Transformer, TransformerConfig, count_parameters, transformer_flops

CONFIG = TransformerConfig(vocab_size=50, d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=3, d_ff=72,
                           dropout=0.0, max_len=32)
EXPLICIT = dataclasses.replace(CONFIG, fused_attention=False)  # FlopCounterMode does not see the CPU's fused kernel


def counted(fn):
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("B, T", [(2, 16), (3, 7)])
def test_decoder_lm_flops_match_the_flop_counter(B, T):
    lm = DecoderLM(EXPLICIT)
    x = torch.randint(0, 50, (B, T))
    assert counted(lambda: lm(x)) == transformer_flops(CONFIG, B, T, training=False)
    assert counted(lambda: lm(x).sum().backward()) == transformer_flops(CONFIG, B, T)


def test_encoder_decoder_flops_match_the_flop_counter():
    model = Transformer(EXPLICIT)
    src, tgt = torch.randint(0, 50, (2, 11)), torch.randint(0, 50, (2, 9))
    assert counted(lambda: model(src, tgt)) == transformer_flops(CONFIG, 2, 9, src_len=11, training=False)
    assert counted(lambda: model(src, tgt).sum().backward()) == transformer_flops(CONFIG, 2, 9, src_len=11)


def test_mfu():
    assert bench.mfu(1e15, 2.0, 1e15) == 0.5
    with pytest.raises(ValueError):
        bench.mfu(1.0, 0.0, 1.0)


def test_calculator_is_exact_for_weights_gradients_and_adamw_state():
    torch.manual_seed(0)
    lm = DecoderLM(CONFIG)
    opt = torch.optim.AdamW(lm.parameters(), lr=1e-3)
    lm(torch.randint(0, 50, (2, 8))).sum().backward()
    opt.step()
    held = model_state_bytes(lm, opt)
    estimate = training_memory(count_parameters(lm), param_bytes=4, optimizer="adamw")
    assert (estimate.weights, estimate.gradients, estimate.optimizer) == (held["weights"], held["gradients"],
                                                                           held["optimizer"])


def test_calculator_options():
    base = training_memory(1_000_000, optimizer="adamw")
    assert (base.weights, base.gradients, base.optimizer, base.total) == (4_000_000, 4_000_000, 8_000_000, 16_000_000)
    zero2 = training_memory(1_000_000, optimizer="adamw", shard_optimizer=4, shard_gradients=4)
    assert zero2.optimizer == 2_000_000 and zero2.gradients == 1_000_000 and zero2.weights == 4_000_000
    T, B, C, H = 1024, 8, 768, 12
    # Korthikanti et al.'s 34 T B C + 5 H T^2 B bytes (16 bits, dropout), plus the masked-weights copy
    # (2 H T^2 B) that the course's explicit attention keeps
    layer = layer_activation_bytes(d_model=C, n_heads=H, seq_len=T, batch_size=B, activation_bytes=2,
                                   fused_attention=False, dropout=True)
    assert layer == 34 * T * B * C + 7 * H * T * T * B
    act = dict(n_layers=12, d_model=C, n_heads=H, seq_len=T, batch_size=B, vocab_size=50257, activation_bytes=2)
    full, ckpt = training_memory(0, **act), training_memory(0, checkpointing=True, **act)
    head = T * B * (4 * C + 4 * 50257)
    assert full.activations == 12 * layer_activation_bytes(d_model=C, n_heads=H, seq_len=T, batch_size=B,
                                                           activation_bytes=2) + head
    assert ckpt.activations == 12 * 2 * T * B * C + head and ckpt.recomputed < full.activations / 12
    with pytest.raises(ValueError, match="optimizer must be"):
        training_memory(10, optimizer="lion")
    with pytest.raises(ValueError, match="seq_len"):
        training_memory(10, n_layers=2, d_model=8)


def lm_and_batch(fused=True, checkpointing=False, V=300, C=64, H=4, L=3, B=3, T=40):
    torch.manual_seed(0)
    lm = DecoderLM(TransformerConfig(vocab_size=V, d_model=C, n_heads=H, n_decoder_layers=L, d_ff=4 * C,
                                     dropout=0.0, max_len=64, activation="gelu", fused_attention=fused))
    assert set_activation_checkpointing(lm, checkpointing) == L  # layers wrapped (or left plain)
    ids = torch.randint(0, V, (B, T))
    estimate = functools.partial(training_memory, 0, n_layers=L, d_model=C, n_heads=H, seq_len=T, batch_size=B,
                                 vocab_size=V, fused_attention=fused, checkpointing=checkpointing)
    return lm, ids, estimate


def loss_of(lm, ids):
    return torch.nn.functional.cross_entropy(lm(ids).flatten(0, 1), ids.flatten())


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("bf16", [False, True])
def test_activation_formula_matches_what_autograd_keeps(fused, checkpointing, bf16):
    lm, ids, estimate = lm_and_batch(fused, checkpointing)
    with SavedActivations(lm) as saved, torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss_of(lm, ids)
    predicted = estimate(activation_bytes=2 if bf16 else 4, autocast=bf16, autocast_device="cpu").activations
    assert abs(predicted - saved.bytes) / saved.bytes < 0.02, (predicted, saved.bytes)


def test_checkpointing_saves_memory_and_gives_the_same_gradients():
    grads, kept = [], []
    for checkpointing in (False, True):
        lm, ids, _ = lm_and_batch(checkpointing=checkpointing)
        with SavedActivations(lm) as saved:
            loss = loss_of(lm, ids)
        loss.backward()
        grads.append([p.grad for p in lm.parameters()])
        kept.append(saved.bytes)
    assert kept[1] < kept[0] / 2
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_simulated_cap_raises_out_of_memory():
    lm, ids, _ = lm_and_batch()
    with pytest.raises(torch.OutOfMemoryError, match="simulated"):
        with SavedActivations(lm, cap=100_000):
            loss_of(lm, ids)


def test_fit_micro_batch_recovers_from_out_of_memory():
    lm, ids, estimate = lm_and_batch(B=16)
    cap = estimate(batch_size=5).activations  # room for a micro-batch of 4, not 8
    tried = []

    def step(micro):
        tried.append(micro)
        lm.zero_grad(set_to_none=True)
        for chunk in ids.split(micro):
            with SavedActivations(lm, cap=cap):
                loss = loss_of(lm, chunk) * len(chunk) / len(ids)
            loss.backward()

    assert fit_micro_batch(step, 16, verbose=False) == (4, 4)
    assert tried == [16, 8, 4]


def test_fit_micro_batch_errors():
    def never_fits(micro):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with pytest.raises(torch.OutOfMemoryError, match="cannot be halved further"):
        fit_micro_batch(never_fits, 8, verbose=False)

    def broken(micro):
        raise KeyError("not a memory problem")

    with pytest.raises(KeyError):  # other errors are not swallowed
        fit_micro_batch(broken, 8, verbose=False)
    with pytest.raises(ValueError):
        fit_micro_batch(never_fits, 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a GPU")
def test_peak_memory_needs_cuda():
    with pytest.raises(ValueError, match="CUDA allocator"):
        measure_peak_memory(lambda: None, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_peak_memory_on_gpu():
    assert measure_peak_memory(lambda: torch.empty(2**28, dtype=torch.uint8, device="cuda")) >= 2**28


def test_memory_calculator_shows_a_first_result_and_recomputes():
    """The page's first result is Python's; the script's results are compared with Python's on every control value
    in tests/test_memory_calculator_js.py."""
    pytest.importorskip("IPython")
    from gpuformer_lib.viz import CalculatorChoice, calculator_data, calculator_report_html, memory_calculator

    page = memory_calculator().data
    assert "124 M parameters" in page and "Fits in 79.1 GiB" in page
    assert "saved tensors" in page and "predicted peak (at the loss backward)" in page
    data = calculator_data()
    large = calculator_report_html(data, CalculatorChoice("GPT-2 XL (48 x 1600)", batch_size=32))
    assert "Does not fit" in large
    assert calculator_report_html(data, CalculatorChoice("GPT-2 XL (48 x 1600)", batch_size=32,
                                                         checkpointing=True)) != large


@pytest.mark.parametrize("norm_first", [True, False])
def test_checkpointed_training_flops_counts_only_what_the_backward_recomputes(norm_first):
    """HFU's numerator (chapter 10; review 2026-11-27, ch10 error 1): checkpointing wraps the layer stack only,
    so the output projection is not recomputed, and PyTorch's early stop skips a pre-LN layer's last product:
    PyTorch's own FLOP counter, run on a checkpointed step, agrees exactly; the 4/3 rule overstates it."""
    from torch.utils.flop_counter import FlopCounterMode

    from gpuformer_lib import speed
    from gpuformer_lib.model import DecoderLM, TransformerConfig, checkpointed_training_flops, transformer_flops

    c = TransformerConfig(vocab_size=100, d_model=64, n_heads=4, n_decoder_layers=3, d_ff=256, dropout=0.0,
                          max_len=64, fused_attention=False, norm_first=norm_first)
    lm = DecoderLM(c)
    n = speed.apply_activation_checkpointing(lm)
    x = torch.randint(0, 100, (2, 48))
    with FlopCounterMode(display=False) as counter:
        lm(x).sum().backward()
    assert n == 3
    assert counter.get_total_flops() == checkpointed_training_flops(c, 2, 48, n)
    assert transformer_flops(c, 2, 48) < checkpointed_training_flops(c, 2, 48, n) < transformer_flops(c, 2, 48) * 4 / 3
    assert checkpointed_training_flops(c, 2, 48, 0) == transformer_flops(c, 2, 48)
    with pytest.raises(ValueError, match="checkpointed_layers"):
        checkpointed_training_flops(c, 2, 48, 4)
