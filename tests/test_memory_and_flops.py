"""The FLOPs formula against PyTorch's FLOP counter, MFU, and the memory calculator against the bytes
a real model and optimizer hold."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from gpuformer_lib import bench
from gpuformer_lib.attention import MultiHeadAttention
from gpuformer_lib.memory import measure_peak_memory, model_state_bytes, training_memory
from gpuformer_lib.model import DecoderLM, Transformer, TransformerConfig, count_parameters

CONFIG = TransformerConfig(vocab_size=50, d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=3, d_ff=72,
                           dropout=0.0, max_len=32)


def explicit(model):
    for m in model.modules():
        if isinstance(m, MultiHeadAttention):
            m.use_sdpa = False  # FlopCounterMode does not see the fused kernel on the CPU
    return model


def counted(fn):
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("B, T", [(2, 16), (3, 7)])
def test_decoder_lm_flops_match_the_flop_counter(B, T):
    lm = explicit(DecoderLM(CONFIG))
    x = torch.randint(0, 50, (B, T))
    assert counted(lambda: lm(x)) == bench.transformer_flops(CONFIG, B, T, training=False)
    assert counted(lambda: lm(x).sum().backward()) == bench.transformer_flops(CONFIG, B, T)


def test_encoder_decoder_flops_match_the_flop_counter():
    model = explicit(Transformer(CONFIG))
    src, tgt = torch.randint(0, 50, (2, 11)), torch.randint(0, 50, (2, 9))
    assert counted(lambda: model(src, tgt)) == bench.transformer_flops(CONFIG, 2, 9, src_len=11, training=False)
    assert counted(lambda: model(src, tgt).sum().backward()) == bench.transformer_flops(CONFIG, 2, 9, src_len=11)


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
    act = dict(n_layers=12, d_model=768, n_heads=12, seq_len=1024, batch_size=8)
    full, ckpt = training_memory(0, **act), training_memory(0, checkpointing=True, **act)
    assert full.activations == int(12 * 1024 * 8 * 768 * (34 + 5 * 12 * 1024 / 768))
    assert ckpt.activations == 12 * 2 * 1024 * 8 * 768 and ckpt.activations < full.activations / 10
    with pytest.raises(ValueError, match="optimizer must be"):
        training_memory(10, optimizer="lion")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a GPU")
def test_peak_memory_needs_cuda():
    with pytest.raises(ValueError, match="CUDA allocator"):
        measure_peak_memory(lambda: None, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_peak_memory_on_gpu():
    assert measure_peak_memory(lambda: torch.empty(2**28, dtype=torch.uint8, device="cuda")) >= 2**28
