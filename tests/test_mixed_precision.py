"""Mixed precision (``gpuformer_lib.mixed_precision``): autocast's dtypes measured on the CPU against the
documented CUDA lists, the lost-update rule against the addition in the format, the benchmark's GPU
sizes against a launch floor (findings of the chapter 8 review), and the bytes per parameter."""

import math

import pytest
import torch

from gpuformer_lib import memory, mixed_precision as mp
from gpuformer_lib.device import SizePreset
from gpuformer_lib.model import DecoderLM, count_parameters, gpt2_config
from gpuformer_lib.profiles import PROFILES, size_preset


def test_cpu_autocast_keeps_softmax_and_layer_norm_in_bf16_and_cuda_documents_float32():
    cpu = mp.autocast_output_dtypes("cpu", torch.bfloat16, torch.bfloat16)
    assert cpu["matmul"] == cpu["linear"] == torch.bfloat16
    assert cpu["softmax"] == cpu["layer_norm"] == cpu["log_softmax"] == torch.bfloat16  # not upcast on a CPU
    assert cpu["cross_entropy"] == torch.float32
    cuda = mp.documented_cuda_dtypes(torch.bfloat16)
    assert cuda["softmax"] == cuda["log_softmax"] == cuda["layer_norm"] == torch.float32
    assert cuda["matmul"] == cuda["linear"] == torch.bfloat16 and cuda["add"] == torch.bfloat16
    differs = {k for k in cpu if cpu[k] != cuda[k]}
    assert {"softmax", "log_softmax", "layer_norm"} <= differs
    assert "differs" in mp.autocast_table(cpu, cuda)


def test_float32_inputs_hide_the_difference():
    # the review's finding: with float32 inputs softmax returns float32 by pass-through on a CPU too
    cpu32 = mp.autocast_output_dtypes("cpu", torch.bfloat16, torch.float32)
    assert cpu32["softmax"] == cpu32["layer_norm"] == torch.float32
    assert cpu32["matmul"] == torch.bfloat16


def test_autocast_defaults_fp16_on_cuda():
    assert mp.autocast_default_dtype("cuda") == torch.float16
    assert mp.autocast_default_dtype("cpu") == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_spacing_is_the_gap_to_the_next_number(dtype):
    x = (torch.randn(500, dtype=torch.float64) * 10 ** torch.empty(500, dtype=torch.float64).uniform_(-3, 3))
    xd = x.to(dtype).abs()
    nxt = torch.nextafter(xd, torch.full_like(xd, math.inf))
    torch.testing.assert_close(mp.spacing(x, dtype), (nxt.double() - xd.double()), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_lost_share_rule_matches_the_addition(dtype):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(20000, generator=g) * 0.05
    grad = torch.randn(20000, generator=g) * 0.02
    for lr in (1e-1, 1e-2, 1e-3):
        predicted = mp.predicted_lost_share(w, -lr * grad, dtype)
        measured = mp.measured_lost_share(w, -lr * grad, dtype)
        assert abs(predicted - measured) < 0.01, (lr, predicted, measured)
    assert mp.measured_lost_share(w, -1e-2 * grad, torch.float32) < 0.01


def test_lr_sweep_rises_as_the_learning_rate_falls():
    g = torch.Generator().manual_seed(1)
    w, grad = torch.randn(5000, generator=g) * 0.05, torch.randn(5000, generator=g) * 0.02
    sweep = mp.lr_sweep(w, grad, [1e-1, 1e-2, 1e-3, 1e-4], torch.float16)
    assert mp.trend_words(sweep) == "rises as the learning rate falls"
    assert mp.trend_words(list(reversed(sweep))) == "rises as the learning rate falls"  # order-free
    with pytest.raises(ValueError):
        mp.lr_sweep(w, grad, [], torch.float16)


@pytest.mark.parametrize("preset, gpu, dtype", [("gpu-small", "T4", torch.float16), ("gpu", "H100 SXM", torch.bfloat16),
                                                ("gpu", "H100 SXM", torch.float32)])
def test_gpu_benchmark_is_compute_bound(preset, gpu, dtype):
    # review: 32 x 24 tokens a step on a GPU is launch-bound, and every format reads about 1x
    run = mp.precision_benchmark_run(SizePreset(preset, "test"))
    assert run.seq_len >= 512 and run.batch_size >= 16
    check = mp.launch_check(run, gpu, dtype)
    assert check.compute_bound, (check.compute_seconds, check.launch_seconds)


def test_toy_sizes_would_be_launch_bound_on_a_gpu():
    run = mp.precision_benchmark_run(SizePreset("cpu", "test"))
    check = mp.launch_check(run, "H100 SXM", torch.bfloat16)
    assert check.ratio < 0.05  # why the GPU presets are large


def test_rehearsal_uses_toy_sizes_and_each_profile_picks_its_preset():
    for name in ("t4", "h100-80gb"):
        profile = PROFILES[name]
        assert mp.precision_benchmark_run(size_preset(profile)).seq_len >= 512
    toy = mp.precision_benchmark_run(SizePreset("gpu", "rehearsal", toy=True))
    assert toy.seq_len == 24 and toy.batch_size == 32


@pytest.mark.parametrize("preset, gib", [("gpu-small", 14.7), ("gpu", 24.0)])
def test_gpu_benchmark_fits_in_float32(preset, gib):
    run = mp.precision_benchmark_run(SizePreset(preset, "test"))
    c = run.config
    with torch.device("meta"):
        n = count_parameters(DecoderLM(c))
    peak = memory.training_memory(n, n_layers=c.n_decoder_layers, d_model=c.d_model, n_heads=c.n_heads, d_ff=c.d_ff,
                                  seq_len=run.seq_len, batch_size=run.batch_size, vocab_size=c.vocab_size).total
    assert peak < 0.6 * gib * 2**30


def test_operator_count_grows_with_depth_and_autocast_adds_casts():
    run = mp.precision_benchmark_run(SizePreset("gpu-small", "test"))
    fp32 = mp.count_training_operators(run.config)
    bf16 = mp.count_training_operators(run.config, torch.bfloat16)
    assert bf16 > fp32 > 100


def test_bytes_per_parameter():
    totals = {r: sum(mp.state_bytes_per_param(r).values()) for r in mp.RECIPES}
    assert totals == {"fp32": 16, "autocast": 18, "fp16 + fp32 master": 16, "bf16 + fp32 master": 16,
                      "bf16 + fp32 master + fp32 grads": 20}
    with pytest.raises(ValueError):
        mp.state_bytes_per_param("fp8")


def test_autocast_weight_copies_are_what_the_memory_calculator_counts():
    C, F = 64, 256
    kw = dict(d_model=C, n_heads=4, d_ff=F, seq_len=8, batch_size=2, activation_bytes=2)
    extra = (memory.layer_activation_bytes(autocast=True, **kw)
             - memory.layer_activation_bytes(autocast=False, **kw))
    matrix_params = 4 * C * C + 2 * C * F
    assert extra >= mp.state_bytes_per_param("autocast")["16-bit weight copies"] * matrix_params


def test_vocab_padding_and_alignment():
    assert mp.padded_size(50257) == 50304 == gpt2_config().vocab_size
    assert mp.padded_size(64) == 64
    assert mp.misaligned_dims(gpt2_config()) == {}
    cfg = mp.precision_benchmark_run(SizePreset("cpu", "t")).config
    assert mp.misaligned_dims(cfg, 64) == {"head size": 16, "vocab_size": 16}
    with pytest.raises(ValueError):
        mp.padded_size(0)


def _tiny():
    from gpuformer_lib.model import TransformerConfig

    cfg = TransformerConfig(vocab_size=16, d_model=32, n_heads=2, n_decoder_layers=1, d_ff=64, dropout=0.0, max_len=16)

    def make():
        torch.manual_seed(0)
        return DecoderLM(cfg)

    def loss_fn(model, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x).flatten(0, 1).float(), y.flatten()), y.numel()

    def batch(seed):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, 16, (4, 9), generator=g)
        return ids[:, :-1], ids[:, 1:]

    return make, loss_fn, batch


def test_unscale_before_clipping():
    make, loss_fn, batch = _tiny()
    r = mp.clip_with_scaler(make, loss_fn, batch(0), scale=2.0**12, max_norm=1.0, lr=0.1)
    assert r.scaled_norm == pytest.approx(r.scale * r.true_norm, rel=1e-2)
    assert r.update_unscaled_first == pytest.approx(0.1 * min(r.true_norm, 1.0), rel=1e-2)
    assert r.update_clipped_scaled == pytest.approx(0.1 / r.scale, rel=1e-2)  # clipped to 1, then divided by S


def test_accumulation_with_scaler_matches_one_batch_and_misuse_is_refused():
    make, loss_fn, batch = _tiny()
    r = mp.accumulation_with_scaler(make, loss_fn, [batch(1), batch(2)])
    assert r.relative_error < 1e-2
    assert "inf checks" in r.update_between and "already been called" in r.unscale_twice


def test_half_loss_lr_moves_with_eps():
    g = torch.Generator().manual_seed(2)
    w, grad = torch.randn(20000, generator=g) * 0.05, torch.randn(20000, generator=g) * 0.02
    fp16, bf16 = mp.half_loss_lr(w, grad, torch.float16), mp.half_loss_lr(w, grad, torch.bfloat16)
    assert mp.measured_lost_share(w, -fp16 * grad, torch.float16) == pytest.approx(0.5, abs=0.01)
    assert bf16 / fp16 == pytest.approx(8, rel=0.1)  # eps 2^-7 against 2^-10
    from gpuformer_lib.exercises.precision import check_half_loss_lr_prediction

    assert check_half_loss_lr_prediction(8 * fp16, bf16, fp16_lr=fp16)
    assert not check_half_loss_lr_prediction(fp16, bf16, fp16_lr=fp16)


def test_pure_bf16_sums_stall_and_kahan_or_stochastic_rounding_recover():
    values = torch.full((3000,), 1e-3)
    exact = float(values.double().sum())
    nearest = mp.running_sum(values, torch.bfloat16, "nearest")
    assert nearest < 0.2 * exact  # stalls where 1e-3 is below half the gap
    assert mp.running_sum(values, torch.bfloat16, "kahan") == pytest.approx(exact, rel=0.02)
    assert mp.running_sum(values, torch.bfloat16, "stochastic") == pytest.approx(exact, rel=0.1)
    with pytest.raises(ValueError):
        mp.running_sum(values, torch.float16, "stochastic")


def test_stochastic_rounding_is_unbiased_and_lands_on_bf16_values():
    x = torch.full((200_000,), 1.0 + 2**-9)  # a quarter of the way from 1 to the next bf16 number
    r = mp.stochastic_round_bf16(x, torch.Generator().manual_seed(0)).float()
    assert set(r.unique().tolist()) == {1.0, 1.0 + 2**-7}
    assert float(r.double().mean()) == pytest.approx(1.0 + 2**-9, abs=2e-5)
    neg = mp.stochastic_round_bf16(-x, torch.Generator().manual_seed(1)).float()
    assert float(neg.double().mean()) == pytest.approx(-(1.0 + 2**-9), abs=2e-5)


# ---- compare_precisions: the modes' step times through bench.compare (issue 30), on a fake clock


def _pattern_loss(fake_seconds, calls):
    """A loss function that moves the fake clock by the seconds of the mode it runs in (read from autocast)."""
    import torch.nn.functional as F

    from gpuformer_lib import bench

    def loss_fn(model, batch):
        x, y = batch
        mode = (("bf16" if torch.get_autocast_dtype("cpu") == torch.bfloat16 else "fp16")
                if torch.is_autocast_enabled("cpu") else "fp32")
        calls.append(mode)
        bench.time.sleep(fake_seconds[mode])
        return F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten()), y.numel()

    return loss_fn


@pytest.fixture
def fake_time(monkeypatch):
    from fake_clock import FakeClock

    from gpuformer_lib import bench

    clock = FakeClock()
    monkeypatch.setattr(bench, "time", clock)
    return clock


def _tiny_config():
    from gpuformer_lib.model import TransformerConfig

    return TransformerConfig(vocab_size=16, d_model=16, n_heads=2, n_decoder_layers=1, d_ff=32, dropout=0.0,
                             max_len=8, check_token_ids=False)


def test_compare_precisions_words_each_mode_by_its_rounds(fake_time):
    from gpuformer_lib import data

    calls: list[str] = []
    loss_fn = _pattern_loss({"fp32": 3.0, "bf16": 1.0, "fp16": 3.0}, calls)
    batch = data.repeating_patterns(0, 16, batch_size=2, seq_len=8)
    result = mp.compare_precisions(_tiny_config(), loss_fn, batch, ["fp32", "bf16", "fp16"], device="cpu", warmup=2,
                                   repeats=5)
    assert set(result) == {"bf16", "fp16"} and all(c.baseline == "fp32" for c in result.values())
    assert result["bf16"].verdict == "faster" and result["bf16"].speedup == pytest.approx(3.0)
    assert result["bf16"].phrase() == "3.00x faster than fp32"
    assert result["fp16"].verdict == "no difference we can see"
    assert calls[:6] == ["fp32", "bf16", "fp16"] * 2, "the warm-up runs every mode before the rounds"
    assert calls.count("bf16") == 2 + 5 and len(result["bf16"].ratios) == 5


def test_compare_precisions_shares_one_model_and_refuses_a_missing_baseline(fake_time):
    from gpuformer_lib import data

    seen = []

    def loss_fn(model, batch):
        seen.append(id(model))
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()), y.numel()

    batch = data.repeating_patterns(0, 16, batch_size=2, seq_len=8)
    mp.compare_precisions(_tiny_config(), loss_fn, batch, ["fp32", "bf16"], device="cpu", warmup=0, repeats=5)
    assert len(set(seen)) == 1
    for modes in (["bf16", "fp32"], ["fp32"], ["fp32", "fp32"], ["fp32", "fp8"]):
        with pytest.raises(ValueError):
            mp.compare_precisions(_tiny_config(), loss_fn, batch, modes, device="cpu")
