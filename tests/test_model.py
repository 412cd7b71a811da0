"""Layers and whole models against PyTorch's nn.Transformer* with the same weights; causality,
padding invariance, input checks and the config's errors."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpuformer_lib.layers import DecoderLayer, EncoderLayer, PositionalEncoding, sinusoidal_encoding
from gpuformer_lib.model import DecoderLM, Transformer, TransformerConfig, count_parameters, paper_base_config

TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (3e-2, 3e-2), torch.float16: (1e-2, 1e-2)}
C, H, FF = 24, 4, 40  # odd-ish sizes: head size 6, d_ff not a power of two


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(7)


def padding(B, T, lengths):
    return torch.arange(T)[None, :] >= torch.tensor(lengths)[:, None]  # True at padding


@pytest.mark.parametrize("norm_first", [True, False])
def test_encoder_layer_equals_pytorch(norm_first):
    ref = nn.TransformerEncoderLayer(C, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first)
    ours = EncoderLayer(C, H, FF, dropout=0.0, norm_first=norm_first)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(3, 9, C, requires_grad=True)
    pad = padding(3, 9, [9, 5, 7])
    out, ref_out = ours(x, pad), ref(x, src_key_padding_mask=pad)
    torch.testing.assert_close(out, ref_out)
    g, = torch.autograd.grad(out[~pad].sum(), x)
    rg, = torch.autograd.grad(ref_out[~pad].sum(), x)
    torch.testing.assert_close(g, rg)


@pytest.mark.parametrize("norm_first", [True, False])
def test_decoder_layer_equals_pytorch(norm_first):
    ref = nn.TransformerDecoderLayer(C, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first)
    ours = DecoderLayer(C, H, FF, dropout=0.0, norm_first=norm_first)
    ours.load_state_dict(ref.state_dict())
    x, mem = torch.randn(2, 6, C, requires_grad=True), torch.randn(2, 5, C, requires_grad=True)
    pad, mem_pad = padding(2, 6, [6, 4]), padding(2, 5, [3, 5])
    out = ours(x, mem, pad, mem_pad)
    ref_out = ref(x, mem, tgt_mask=~torch.ones(6, 6, dtype=torch.bool).tril(), tgt_is_causal=True,
                  tgt_key_padding_mask=pad, memory_key_padding_mask=mem_pad)
    torch.testing.assert_close(out, ref_out)
    g = torch.autograd.grad(out.sum(), (x, mem))
    rg = torch.autograd.grad(ref_out.sum(), (x, mem))
    for a, b in zip(g, rg):
        torch.testing.assert_close(a, b)


def small_config(**changes):
    base = TransformerConfig(vocab_size=37, src_vocab_size=29, d_model=C, n_heads=H, n_encoder_layers=2,
                             n_decoder_layers=2, d_ff=FF, dropout=0.0, max_len=32)
    return dataclasses.replace(base, **changes)


def reference_logits(model: Transformer, src, tgt, src_pad, tgt_pad, dtype=None):
    """The same computation through torch.nn.Transformer, loaded with the model's weights."""
    c = model.config
    ref = nn.Transformer(c.d_model, c.n_heads, c.n_encoder_layers, c.n_decoder_layers, c.d_ff, dropout=0.0,
                         batch_first=True, norm_first=c.norm_first)
    ref.encoder.load_state_dict(model.encoder.state_dict())
    ref.decoder.load_state_dict(model.decoder.state_dict())
    src_x = model.src_pos(model.src_embed(src))
    tgt_x = model.tgt_pos(model.tgt_embed(tgt))
    causal = ~torch.ones(tgt.shape[1], tgt.shape[1], dtype=torch.bool).tril()  # torch: True = blocked
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        y = ref(src_x, tgt_x, tgt_mask=causal, tgt_is_causal=True, src_key_padding_mask=src_pad,
                tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad)
        return model.generator(y)


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float16])
def test_transformer_equals_nn_transformer(norm_first, dtype):
    model = Transformer(small_config(norm_first=norm_first))
    src, tgt = torch.randint(0, 29, (3, 8)), torch.randint(0, 37, (3, 6))
    src_pad, tgt_pad = padding(3, 8, [8, 3, 6]), padding(3, 6, [6, 6, 2])
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        logits = model(src, tgt, src_pad, tgt_pad)
    ref = reference_logits(model, src, tgt, src_pad, tgt_pad, dtype)
    assert logits.shape == (3, 6, 37)
    rtol, atol = TOLERANCE[dtype or torch.float32]
    real = ~tgt_pad
    torch.testing.assert_close(logits[real].float(), ref[real].float(), rtol=rtol, atol=atol)


def test_source_padding_does_not_change_real_outputs():
    model = Transformer(small_config()).eval()
    src, tgt = torch.randint(0, 29, (1, 5)), torch.randint(0, 37, (1, 4))
    padded = torch.cat([src, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    short = model(src, tgt)
    long = model(padded, tgt, src_padding_mask=padding(1, 8, [5]))
    torch.testing.assert_close(short, long)


def test_decoder_lm_is_causal_by_perturbation_and_gradient():
    lm = DecoderLM(small_config(n_decoder_layers=3, positional="learned", activation="gelu")).eval()
    ids = torch.randint(0, 37, (2, 10))
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % 37
    torch.testing.assert_close(lm(ids)[:, :6], lm(changed)[:, :6])
    assert not torch.allclose(lm(ids)[:, 6:], lm(changed)[:, 6:])
    x = lm.pos(lm.embed(ids)).detach().requires_grad_()
    out = lm.lm_head(lm.blocks(x))
    g, = torch.autograd.grad(out[:, 4].sum(), x)
    assert torch.all(g[:, 5:] == 0) and torch.all(g[:, :5].abs().sum(-1) > 0)


def test_transformer_decoder_is_causal():
    model = Transformer(small_config()).eval()
    src, tgt = torch.randint(0, 29, (2, 5)), torch.randint(0, 37, (2, 7))
    changed = tgt.clone()
    changed[:, 4:] = (changed[:, 4:] + 5) % 37
    torch.testing.assert_close(model(src, tgt)[:, :4], model(src, changed)[:, :4])


def test_first_losses_start_near_chance():
    lm = DecoderLM(small_config(n_decoder_layers=2))
    ids, targets = torch.randint(0, 37, (8, 12)), torch.randint(0, 37, (8, 12))
    loss = torch.nn.functional.cross_entropy(lm(ids).reshape(-1, 37), targets.reshape(-1)).item()
    chance = torch.log(torch.tensor(37.0)).item()
    assert chance - 0.5 < loss < chance + 1.5  # N(0, 1) embeddings, tied, gave about 10 times chance


def test_tied_and_shared_embeddings():
    model = Transformer(small_config(vocab_size=31, src_vocab_size=None, share_src_tgt_embeddings=True))
    assert model.src_embed is model.tgt_embed and model.generator.weight is model.tgt_embed.weight
    untied = Transformer(small_config(tie_embeddings=False))
    assert count_parameters(untied) - count_parameters(Transformer(small_config())) == 37 * C


def test_count_parameters_of_the_papers_base_model():
    c = paper_base_config()
    attention = 4 * c.d_model * c.d_model + 4 * c.d_model  # W_q, W_k, W_v, W_o and their biases
    feed_forward = 2 * c.d_model * c.d_ff + c.d_ff + c.d_model
    norm = 2 * c.d_model
    encoder_layer = attention + feed_forward + 2 * norm
    decoder_layer = 2 * attention + feed_forward + 3 * norm
    expected = c.vocab_size * c.d_model + 6 * encoder_layer + 6 * decoder_layer + 2 * norm
    assert count_parameters(Transformer(c)) == expected == 63_084_544
    ref = nn.Transformer(batch_first=True)  # PyTorch's defaults are the paper's base sizes
    assert count_parameters(ref) + c.vocab_size * c.d_model == expected


@pytest.mark.parametrize("changes, message", [
    (dict(d_model=250, n_heads=8), "d_model=250 is not divisible by n_heads=8"),
    (dict(dropout=1.0), "dropout"),
    (dict(vocab_size=0), "vocab_size must be a positive int"),
    (dict(share_src_tgt_embeddings=True), "needs one vocabulary"),
    (dict(activation="swish"), "activation"),
    (dict(positional="rotary"), "positional"),
    (dict(n_decoder_layers=0), "n_decoder_layers >= 1"),
    (dict(d_model=15, n_heads=5), "even d_model"),
])
def test_config_rejects_impossible_settings(changes, message):
    with pytest.raises(ValueError, match=message):
        small_config(**changes)


@pytest.mark.parametrize("call, message", [
    (lambda m: m(torch.randint(0, 29, (2, 5)), torch.tensor([[1, 2, 37]] * 2)), r"token ids must lie in \[0, 37\)"),
    (lambda m: m(torch.randint(0, 29, (2, 5)), torch.randn(2, 3)), "must be integers"),
    (lambda m: m(torch.randint(0, 29, (2, 40)), torch.randint(0, 37, (2, 3))), "longer than max_len=32"),
    (lambda m: m(torch.randint(0, 29, (5,)), torch.randint(0, 37, (2, 3))), r"\(B, S\) and \(B, T\)"),
    (lambda m: m(torch.randint(0, 29, (2, 5)), torch.randint(0, 37, (2, 3)),
                 src_padding_mask=torch.zeros(2, 4, dtype=torch.bool)), "src_padding_mask must have the shape"),
    (lambda m: m(torch.randint(0, 29, (2, 5)), torch.randint(0, 37, (2, 3)),
                 tgt_padding_mask=torch.zeros(2, 3)), "must be a bool tensor"),
])
def test_transformer_input_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call(Transformer(small_config()))


def test_decoder_lm_input_errors():
    lm = DecoderLM(small_config())
    with pytest.raises(ValueError, match=r"shape \(B, T\)"):
        lm(torch.randint(0, 37, (5,)))
    with pytest.raises(ValueError, match="padding_mask must have the shape"):
        lm(torch.randint(0, 37, (2, 5)), padding_mask=torch.zeros(2, 4, dtype=torch.bool))


def test_positional_encodings():
    pe = sinusoidal_encoding(50, 16)
    assert torch.allclose(pe[0, 0::2], torch.zeros(8)) and torch.allclose(pe[0, 1::2], torch.ones(8))
    assert torch.allclose(pe[7, 0], torch.sin(torch.tensor(7.0)))
    assert torch.allclose(pe[7, 3], torch.cos(torch.tensor(7.0 / 10000 ** (2 / 16))))
    with pytest.raises(ValueError, match="longer than max_len=4"):
        PositionalEncoding(16, 4)(torch.randn(1, 5, 16))


def test_the_input_checks_keep_one_compiled_graph():
    """The checks of ids, masks and memory read shapes, dtypes and devices only (the ids' range is skipped
    while compiling), so ``torch.compile(fullgraph=True)`` traces the models without a graph break."""
    lm, tr = DecoderLM(small_config()).eval(), Transformer(small_config()).eval()
    ids, tgt = torch.randint(0, 29, (2, 5)), torch.randint(0, 37, (2, 3))
    mask = padding(2, 5, [5, 3])
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(lm, fullgraph=True, backend="eager")(ids, mask), lm(ids, mask))
    memory = tr.encode(ids, mask)
    decode = torch.compile(tr.decode, fullgraph=True, backend="eager")
    torch.testing.assert_close(decode(tgt, memory, mask), tr.decode(tgt, memory, mask))


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("vocab, width", [(16, 64), (1000, 256)])
def test_an_untrained_model_starts_near_the_loss_of_an_even_guess(tie, vocab, width):
    # log(V) is what a model that spreads its bets evenly scores; a tied head without its C^-1/2 scale
    # started at 6.28 for V = 16, C = 64 (log 16 = 2.77), predicting its input token everywhere
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=vocab, d_model=width, n_heads=4, n_encoder_layers=2, n_decoder_layers=2,
                               d_ff=2 * width, dropout=0.0, max_len=64, tie_embeddings=tie)
    ids = torch.randint(0, vocab, (8, 32))
    targets = torch.randint(0, vocab, (8, 32))
    for logits in (DecoderLM(config)(ids), Transformer(config)(ids, ids)):
        loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1)).item()
        assert abs(loss - math.log(vocab)) < 0.3, (loss, math.log(vocab))
