"""Attention against PyTorch: forward and gradients, fp32 tight, fp16/bf16 under autocast, masks; the inputs
attention and the layers around it refuse (probes of dtype, rank, shape, device and mask kind)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpuformer_lib.attention import MultiHeadAttention, causal_mask, scaled_dot_product_attention
from gpuformer_lib.layers import DecoderLayer, EncoderLayer, PositionalEncoding, sinusoidal_encoding
from gpuformer_lib.profiles import describe_device, low_precision_dtype

# (rtol, atol) per dtype under autocast: the course's tolerances for comparing against PyTorch
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (5e-3, 5e-3)}


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(1234)


def qkv(*lead, tq=7, tk=11, hs=5, requires_grad=False):
    return tuple(torch.randn(*lead, t, hs, requires_grad=requires_grad) for t in (tq, tk, tk))


@pytest.mark.parametrize("mask_kind", ["none", "bool", "float", "causal"])
def test_sdpa_equals_pytorch_forward_and_backward(mask_kind):
    q, k, v = qkv(2, 3, tq=7, tk=7, requires_grad=True)
    kwargs = {}
    if mask_kind == "bool":
        kwargs["attn_mask"] = torch.rand(7, 7) > 0.3
        kwargs["attn_mask"][:, 0] = True  # no fully masked rows here (tested below)
    elif mask_kind == "float":
        kwargs["attn_mask"] = torch.randn(2, 1, 7, 7)
    elif mask_kind == "causal":
        kwargs["is_causal"] = True
    out, weights = scaled_dot_product_attention(q, k, v, **kwargs)
    ref = F.scaled_dot_product_attention(q, k, v, **kwargs)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 7))
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


def test_sdpa_matches_a_float64_reference_and_passes_gradcheck():
    q, k, v = (t.double().requires_grad_() for t in qkv(2, tq=3, tk=4, hs=3))
    mask = torch.tensor([[True, True, False, True]] * 3)
    assert torch.autograd.gradcheck(lambda q, k, v: scaled_dot_product_attention(q, k, v, attn_mask=mask)[0],
                                    (q, k, v))


def test_masked_keys_get_zero_weight_and_full_masking_gives_zeros_not_nan():
    q, k, v = qkv(1, 2)
    mask = torch.rand(7, 11) > 0.5
    mask[3] = False  # query 3 sees nothing
    out, weights = scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.all(weights[..., ~mask] == 0)
    assert not out.isnan().any() and not weights.isnan().any()
    assert torch.all(out[..., 3, :] == 0)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    float_mask = torch.zeros(7, 11).masked_fill(~mask, float("-inf"))
    out_f, _ = scaled_dot_product_attention(q, k, v, attn_mask=float_mask)
    torch.testing.assert_close(out_f, out)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_masks_are_safe_in_half_precision(dtype):
    q, k, v = (t.to(dtype) for t in qkv(2, 2))
    mask = torch.rand(7, 11) > 0.5
    mask[0] = False
    out, weights = scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert out.dtype == dtype and torch.isfinite(out).all() and torch.isfinite(weights).all()
    assert torch.all(weights[..., ~mask] == 0)


def test_causal_mask_blocks_information_from_later_positions():
    q, k, v = qkv(1, tq=6, tk=6)
    out, _ = scaled_dot_product_attention(q, k, v, is_causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[..., 4:, :] += 10 * torch.randn_like(k2[..., 4:, :])  # change the future
    v2[..., 4:, :] += 10 * torch.randn_like(v2[..., 4:, :])
    out2, _ = scaled_dot_product_attention(q, k2, v2, is_causal=True)
    torch.testing.assert_close(out[..., :4, :], out2[..., :4, :])
    assert not torch.allclose(out[..., 4:, :], out2[..., 4:, :])
    assert torch.equal(causal_mask(3), torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool))


@pytest.mark.parametrize("call, message", [
    (lambda q, k, v: scaled_dot_product_attention(q[0, 0, 0], k, v), "shape"),
    (lambda q, k, v: scaled_dot_product_attention(q[..., :3], k, v), "same head size"),
    (lambda q, k, v: scaled_dot_product_attention(q, k, v[..., :4, :]), "same number of keys"),
    (lambda q, k, v: scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(3, 3, dtype=torch.bool)),
     "does not broadcast"),
    (lambda q, k, v: scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(7, 11, dtype=torch.bool),
                                                  is_causal=True), "not both"),
])
def test_sdpa_input_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call(*qkv(2, 2))


SDPA_PROBES = {  # inputs that computed a wrong answer quietly, or failed deep inside torch
    "integer q, k, v": (lambda q, k, v: (q.long(), k.long(), v.long()), {}, TypeError, "floating-point"),
    "mixed dtypes": (lambda q, k, v: (q, k.double(), v), {}, TypeError, "share one dtype"),
    "k on another device": (lambda q, k, v: (q, k.to("meta"), v), {}, ValueError, "one device"),
    "k without the head dimension": (lambda q, k, v: (q, k[:, 0], v[:, 0]), {}, ValueError, "number of dimensions"),
    "batch sizes differ": (lambda q, k, v: (q, k[:1].repeat(3, 1, 1, 1), v[:1].repeat(3, 1, 1, 1)), {}, ValueError,
                           "do not match or broadcast"),
    "head size 0": (lambda q, k, v: (q[..., :0], k[..., :0], v), {}, ValueError, "at least 1"),
    "q is a list": (lambda q, k, v: (q.tolist(), k, v), {}, TypeError, "must be a tensor"),
    "int64 mask": (None, dict(attn_mask=torch.ones(7, 11, dtype=torch.long)), TypeError, "ambiguous"),
    "bool-valued float mask": (None, dict(attn_mask=torch.ones(7, 11).tril()), ValueError, "only 0s and 1s"),
    "mask adding a dimension": (None, dict(attn_mask=torch.ones(3, 1, 1, 7, 11, dtype=torch.bool)), ValueError,
                                "does not broadcast"),
    "(B, Tq, Tk) mask against (B, H, Tq, Tk)": (None, dict(attn_mask=torch.ones(2, 7, 11, dtype=torch.bool)),
                                                ValueError, "fewer dimensions"),
    "mask on another device": (None, dict(attn_mask=torch.ones(7, 11, dtype=torch.bool, device="meta")),
                               ValueError, "move it"),
}


@pytest.mark.parametrize("probe", list(SDPA_PROBES))
def test_sdpa_refuses_inputs_it_would_compute_wrongly(probe):
    change, kwargs, error, message = SDPA_PROBES[probe]
    q, k, v = qkv(2, 2)
    if change is not None:
        q, k, v = change(q, k, v)
    with pytest.raises(error, match=message):
        scaled_dot_product_attention(q, k, v, **kwargs)


def test_sdpa_accepts_what_is_unambiguous():
    q, k, v = qkv(2, 2)
    shared = scaled_dot_product_attention(q, k[:, :1], v[:, :1])[0]  # one k, v for every head: size-1 dimension
    torch.testing.assert_close(shared, F.scaled_dot_product_attention(q, k[:, :1], v[:, :1]))
    additive = torch.zeros(7, 11).masked_fill(torch.rand(7, 11) > 0.5, float("-inf"))
    additive[:, 0] = 0
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, attn_mask=additive)[0],
                               F.scaled_dot_product_attention(q, k, v, attn_mask=additive))
    out, _ = scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(7, 11))  # all 0: no 1s, nothing masked
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))


def make_pair(d_model=24, n_heads=4, bias=True, fused=True):
    ref = nn.MultiheadAttention(d_model, n_heads, bias=bias, batch_first=True)
    ours = MultiHeadAttention(d_model, n_heads, bias=bias, fused=fused)
    ours.load_state_dict(ref.state_dict())
    return ours, ref


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("case", ["self", "cross", "padding", "causal", "causal+padding", "bool mask", "no bias"])
def test_mha_equals_nn_multiheadattention(fused, case):
    ours, ref = make_pair(bias=case != "no bias", fused=fused)
    B, T, S = 3, 7, 5
    x = torch.randn(B, T, 24, requires_grad=True)
    mem = torch.randn(B, S, 24, requires_grad=True)
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[0, -3:] = pad[2, -1:] = True
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    if case == "cross":
        args, ours_kw, ref_kw = (x, mem, mem), {}, {}
    elif case == "padding":
        args, ours_kw, ref_kw = (x, x, x), dict(key_padding_mask=pad), dict(key_padding_mask=pad)
    elif case == "causal":
        args, ours_kw, ref_kw = (x, x, x), dict(is_causal=True), dict(attn_mask=~causal)
    elif case == "causal+padding":
        args = (x, x, x)
        ours_kw, ref_kw = dict(is_causal=True, key_padding_mask=pad), dict(attn_mask=~causal, key_padding_mask=pad)
    elif case == "bool mask":
        m = torch.rand(T, T) > 0.4
        m[:, 0] = True
        args, ours_kw, ref_kw = (x, x, x), dict(attn_mask=m), dict(attn_mask=~m)  # torch's MHA: True = blocked
    else:
        args, ours_kw, ref_kw = (x, x, x), {}, {}
    out, _ = ours(*args, **ours_kw)
    ref_out, _ = ref(*args, **ref_kw, need_weights=False)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    g = torch.autograd.grad(out.sum(), [x, ours.in_proj_weight])
    rg = torch.autograd.grad(ref_out.sum(), [x, ref.in_proj_weight])
    for a, b in zip(g, rg):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_mha_weights_match_pytorch_per_head():
    ours, ref = make_pair()
    x = torch.randn(2, 6, 24)
    _, weights = ours(x, x, x, need_weights=True)
    _, ref_weights = ref(x, x, x, need_weights=True, average_attn_weights=False)
    assert weights.shape == (2, 4, 6, 6)
    torch.testing.assert_close(weights, ref_weights)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mha_under_autocast(dtype):
    x = torch.randn(2, 9, 32)
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[1, -4:] = True
    rtol, atol = TOLERANCE[dtype]
    for fused in (True, False):
        ours, ref = make_pair(d_model=32, fused=fused)
        with torch.autocast("cpu", dtype=dtype):
            out, _ = ours(x, x, x, key_padding_mask=pad)
            ref_out, _ = ref(x, x, x, key_padding_mask=pad, need_weights=False)
        assert out.dtype == dtype
        torch.testing.assert_close(out.float(), ref_out.float(), rtol=rtol, atol=atol)


def test_mha_explicit_and_fused_paths_agree_with_dropout_off_in_eval():
    ours, _ = make_pair()
    explicit_mha = MultiHeadAttention(24, 4, fused=False)
    explicit_mha.load_state_dict(ours.state_dict())
    for m in (ours, explicit_mha):
        m.dropout = 0.5
        m.eval()
    x = torch.randn(2, 5, 24)
    fused, _ = ours(x, x, x, is_causal=True)
    explicit, _ = explicit_mha(x, x, x, is_causal=True)
    torch.testing.assert_close(fused, explicit)


def test_mha_kernel_choice_is_fixed_at_construction():
    # no switch for other code to flip by walking modules: build the model with the choice instead
    assert MultiHeadAttention(24, 4).fused and not MultiHeadAttention(24, 4, fused=False).fused
    with pytest.raises(AttributeError):
        MultiHeadAttention(24, 4).fused = False


@pytest.mark.parametrize("call, message", [
    (lambda m, x: m(x[0], x[0], x[0]), r"shape \(B, T, 24\)"),
    (lambda m, x: m(x[..., :16], x, x), r"shape \(B, T, 24\)"),
    (lambda m, x: m(x, x[:1], x[:1]), "must share B"),
    (lambda m, x: m(x, x, x, key_padding_mask=torch.zeros(2, 3, dtype=torch.bool)), "key_padding_mask"),
    (lambda m, x: m(x, x, x, attn_mask=torch.ones(4, 4, dtype=torch.bool)), "does not broadcast"),
])
def test_mha_input_errors(call, message):
    ours, _ = make_pair()
    with pytest.raises(ValueError, match=message):
        call(ours, torch.randn(2, 6, 24))


MHA_PROBES = {
    "integer inputs": (lambda m, x: m(x.long(), x.long(), x.long()), TypeError, "floating-point"),
    "float64 key, float32 weights": (lambda m, x: m(x, x.double(), x.double()), TypeError, "share one dtype"),
    "key on another device": (lambda m, x: m(x, x.to("meta"), x.to("meta")), ValueError, "one device"),
    "int64 causal mask": (lambda m, x: m(x, x, x, attn_mask=torch.ones(6, 6, dtype=torch.long).tril()), TypeError,
                          "ambiguous"),
    "float 0/1 causal mask": (lambda m, x: m(x, x, x, attn_mask=torch.ones(6, 6).tril()), ValueError, "only 0s and 1s"),
    "(B, Tq, Tk) mask, B = H": (lambda m, x: m(x.repeat(2, 1, 1), x.repeat(2, 1, 1), x.repeat(2, 1, 1),
                                               attn_mask=torch.ones(4, 6, 6, dtype=torch.bool)), ValueError,
                                "fewer dimensions"),
    "int64 key_padding_mask": (lambda m, x: m(x, x, x, key_padding_mask=torch.zeros(2, 6, dtype=torch.long)),
                               TypeError, "bool tensor"),
    "float key_padding_mask": (lambda m, x: m(x, x, x, key_padding_mask=torch.zeros(2, 6)), TypeError, "bool tensor"),
    "key_padding_mask on another device": (
        lambda m, x: m(x, x, x, key_padding_mask=torch.zeros(2, 6, dtype=torch.bool, device="meta")), ValueError,
        "key_padding_mask is on meta"),
}


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("probe", list(MHA_PROBES))
def test_mha_refuses_inputs_it_would_compute_wrongly(probe, fused):
    call, error, message = MHA_PROBES[probe]
    with pytest.raises(error, match=message):
        call(MultiHeadAttention(24, 4, fused=fused), torch.randn(2, 6, 24))


def test_mha_accepts_mixed_dtypes_under_autocast():
    x = torch.randn(2, 6, 24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = MultiHeadAttention(24, 4)(x, x.bfloat16(), x.bfloat16())
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


def _layers():
    return EncoderLayer(24, 4, 40, dropout=0.0), DecoderLayer(24, 4, 40, dropout=0.0)


LAYER_PROBES = {
    "encoder, token ids": (lambda enc, dec, x: enc(torch.zeros(2, 6, 24, dtype=torch.long)), TypeError,
                           "floating-point"),
    "encoder, (T, C)": (lambda enc, dec, x: enc(x[0]), ValueError, r"shape \(B, T, 24\)"),
    "encoder, wrong width": (lambda enc, dec, x: enc(x[..., :16]), ValueError, r"shape \(B, T, 24\)"),
    "encoder, int padding mask": (lambda enc, dec, x: enc(x, torch.zeros(2, 6, dtype=torch.long)), TypeError,
                                  "bool tensor"),
    "decoder, memory of another batch": (lambda enc, dec, x: dec(x, x[:1]), ValueError, "same batch size"),
    "decoder, integer memory": (lambda enc, dec, x: dec(x, x.long()), TypeError, "memory must be a floating"),
    "positions, token ids": (lambda enc, dec, x: PositionalEncoding(24, 8)(torch.zeros(2, 6, 24, dtype=torch.long)),
                             TypeError, "floating-point"),
    "positions, wrong width": (lambda enc, dec, x: PositionalEncoding(24, 8)(x[..., :16]), ValueError, "shape"),
    "positions, on another device": (lambda enc, dec, x: PositionalEncoding(24, 8)(x.to("meta")), ValueError,
                                     "move the model"),
    "positions, max_len 0": (lambda enc, dec, x: PositionalEncoding(24, 0), ValueError, "max_len must be a positive"),
    "sinusoids, negative length": (lambda enc, dec, x: sinusoidal_encoding(-1, 24), ValueError, "positive int"),
}


@pytest.mark.parametrize("probe", list(LAYER_PROBES))
def test_layers_refuse_inputs_they_would_compute_wrongly(probe):
    call, error, message = LAYER_PROBES[probe]
    with pytest.raises(error, match=message):
        call(*_layers(), torch.randn(2, 6, 24))


def test_mha_config_errors():
    with pytest.raises(ValueError, match="d_model=250 is not divisible by n_heads=8"):
        MultiHeadAttention(250, 8)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_mha_on_gpu_equals_pytorch(dtype):
    if dtype == torch.bfloat16 and low_precision_dtype(describe_device("cuda")) != torch.bfloat16:
        # not torch.cuda.is_bf16_supported(): it counts emulation, so it says True on a T4 (finding B6)
        pytest.skip("this GPU has no native bf16 (a T4 would emulate it)")
    x = torch.randn(4, 33, 64, device="cuda")
    pad = torch.zeros(4, 33, dtype=torch.bool, device="cuda")
    pad[1, 20:] = True
    rtol, atol = TOLERANCE[dtype]
    for fused in (True, False):
        ours, ref = make_pair(d_model=64, fused=fused)
        ours, ref = ours.cuda(), ref.cuda()
        with torch.autocast("cuda", dtype=dtype):
            out, _ = ours(x, x, x, key_padding_mask=pad, is_causal=True)
            causal = ~torch.ones(33, 33, dtype=torch.bool, device="cuda").tril()
            ref_out, _ = ref(x, x, x, key_padding_mask=pad, attn_mask=causal, need_weights=False)
        torch.testing.assert_close(out.float(), ref_out.float(), rtol=rtol, atol=atol)
