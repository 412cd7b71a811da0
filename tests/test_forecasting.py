"""Chapter 15's pieces (gpuformer_lib.forecasting) against float64, brute-force or hand-computed references."""

import numpy as np
import pytest
import torch

from gpuformer_lib import case_study, forecasting as fc
from gpuformer_lib.profiles import current_profile


def test_ridge_matches_least_squares_with_an_unpenalised_intercept():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(50, 4)), rng.normal(size=50)
    w, b = fc.ridge_fit(X, y, 0.0)
    ref = np.linalg.lstsq(np.c_[X, np.ones(50)], y, rcond=None)[0]
    np.testing.assert_allclose(np.r_[w, b], ref, atol=1e-10)
    # with lam > 0: the augmented system [X 1; sqrt(lam) I 0] solved by least squares, intercept free
    lam = 3.0
    w, b = fc.ridge_fit(X, y, lam)
    A = np.r_[np.c_[X, np.ones(50)], np.c_[np.sqrt(lam) * np.eye(4), np.zeros(4)]]
    ref = np.linalg.lstsq(A, np.r_[y, np.zeros(4)], rcond=None)[0]
    np.testing.assert_allclose(np.r_[w, b], ref, atol=1e-10)
    with pytest.raises(ValueError):
        fc.ridge_fit(X, y[:10])


def test_chronological_bounds_and_windows_never_cross_into_the_next_part():
    a, b = fc.chronological_bounds(100, (0.7, 0.15, 0.15))
    assert (a, b) == (70, 85)
    t = fc.window_starts(70, 85, context=10, horizon=3)
    assert t.min() == 70 and t.max() + 3 == 85  # targets inside [70, 85); inputs reach back before 70
    assert fc.window_starts(0, 70, 10, 3).min() == 10  # a full context first
    with pytest.raises(ValueError):
        fc.chronological_bounds(100, (0.5, 0.5, 0.5))


def test_lookahead_check_passes_past_only_features_and_fails_on_leakage():
    series = np.arange(50, dtype=float)
    fc.check_no_lookahead(lambda s, t: fc.lag_matrix(s, np.array([t]), 5), series, 20)
    with pytest.raises(AssertionError, match="look-ahead"):
        fc.check_no_lookahead(lambda s, t: s[t - 4:t + 1], series, 20)  # includes the value at t itself
    with pytest.raises(AssertionError, match="look-ahead"):  # standardising by statistics of the whole series
        fc.check_no_lookahead(lambda s, t: (s[t - 5:t] - s.mean()) / s.std(), series, 20)


def test_ewma_volatility_brute_force_and_metrics():
    rng = np.random.default_rng(1)
    r = rng.normal(size=30) * 0.01
    sigma = fc.ewma_volatility(r, 0.9)
    for t in (1, 7, 29):  # var[t] = lam^t r0^2 + sum_{k<t} (1-lam) lam^(t-1-k) r_k^2
        ref = 0.9 ** t * r[0] ** 2 + sum((1 - 0.9) * 0.9 ** (t - 1 - k) * r[k] ** 2 for k in range(t))
        assert abs(sigma[t] ** 2 - ref) < 1e-15
    assert fc.realised_volatility(np.array([3.0, 4.0, 0.0]), np.array([0]), 2)[0] == pytest.approx(np.sqrt(12.5))
    assert fc.direction_accuracy([1, -1, 1, 0.5], [2, 1, -1, 0]) == pytest.approx(1 / 3)
    assert fc.mse([1, 2], [0, 0]) == 2.5 and fc.mae([1, -3], [0, 0]) == 2.0
    np.testing.assert_allclose(fc.log_returns(np.array([1.0, np.e, 1.0])), [1.0, -1.0])


def test_moving_average_and_seasonal_baselines_by_hand():
    x = np.array([[1.0, 2.0, 6.0, 4.0, 5.0]])
    np.testing.assert_allclose(fc.moving_average(x, 3), [[4 / 3, 3.0, 4.0, 5.0, 14 / 3]])
    w = np.arange(2 * 10, dtype=float).reshape(1, 2, 10)
    np.testing.assert_array_equal(fc.seasonal_naive(w, 3, season=7), [[3.0, 4.0, 5.0]])
    np.testing.assert_array_equal(fc.persistence(w, 2), [[9.0, 9.0]])


def test_linear_forecasters_recover_a_linear_rule():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(400, 2, 12))
    y = x[:, 0, -3:] + 0.5 * x[:, 1, -1:]  # linear in the window, level-following (NLinear can express it)
    for kind in ("nlinear", "dlinear"):
        model = fc.LinearForecaster.fit(x, y, kind, covariate=True, lam=1e-8)
        np.testing.assert_allclose(model.predict(x), y, atol=1e-6)


def test_patchify_and_patch_count_against_a_loop():
    x = torch.arange(2 * 3 * 20, dtype=torch.float32).reshape(2, 3, 20)
    p = fc.patchify(x, 6, 4)
    config = fc.PatchConfig(context=20, horizon=4, channels=3, patch_len=6, stride=4, d_model=8, n_heads=2)
    assert p.shape == (2, 3, config.n_patches, 6)
    padded = torch.cat([x, x[..., -1:].repeat(1, 1, 4)], -1)
    for n in range(config.n_patches):
        torch.testing.assert_close(p[:, :, n], padded[..., 4 * n:4 * n + 6])


def test_patchtst_shapes_instance_norm_and_channel_independence():
    torch.manual_seed(0)
    config = fc.PatchConfig(context=48, horizon=8, channels=2, patch_len=8, stride=8, d_model=16, n_heads=2,
                            n_layers=1, d_ff=32, dropout=0.0)
    model = fc.PatchTST(config).eval()
    x = torch.randn(3, 2, 48)
    y = model(x)
    assert y.shape == (3, 8)
    # instance normalisation: shifting and scaling a window's channels moves the forecast the same way
    shifted = x.clone()
    shifted[:, 0] = x[:, 0] * 2 + 5
    torch.testing.assert_close(model(shifted), y * 2 + 5, atol=1e-4, rtol=1e-4)
    # channel independence: the encoder sees each channel alone (changing channel 1 changes only its tokens)
    h = {}
    model.layers[0].register_forward_hook(lambda m, i, o: h.__setitem__("out", o))
    model(x)
    a = h["out"].reshape(3, 2, -1)
    x2 = x.clone()
    x2[:, 1] = torch.randn(3, 48)
    model(x2)
    torch.testing.assert_close(h["out"].reshape(3, 2, -1)[:, 0], a[:, 0])
    with pytest.raises(ValueError):
        model(torch.randn(3, 1, 48))


def test_patch_flops_against_a_hand_count():
    c = fc.PatchConfig(context=16, horizon=4, channels=1, patch_len=8, stride=8, d_model=4, n_heads=2, n_layers=1,
                       d_ff=8)
    n = c.n_patches  # (16-8)//8 + 2 = 3
    per_token = 2 * (4 * 16 + 2 * 4 * 8) + 4 * n * 4
    forward = n * (2 * 8 * 4 + per_token) + 2 * 1 * n * 4 * 4
    assert fc.patch_flops(c, 1) == 3 * forward
    assert 0 < fc.attention_share(c) < 1


def _toy_elec():
    t = np.arange(3000)
    raw = {"demand": 4 + np.sin(2 * np.pi * t / 48) + 0.1 * np.sin(2 * np.pi * t / 336),
           "temperature": 20 + 3 * np.cos(2 * np.pi * t / 48), "workday": np.ones(3000)}
    return fc.prepare_elec(raw, context=96, horizon=12, stride=4)


def test_elec_preparation_standardises_with_training_statistics_only():
    e = _toy_elec()
    a, _ = e.bounds
    np.testing.assert_allclose(e.series[:, :a].mean(1), 0, atol=1e-5)
    np.testing.assert_allclose(e.series[:, :a].std(1), 1, atol=1e-5)
    x, y = e.windows("test")
    s = e.times["test"][0]
    np.testing.assert_array_equal(x[0], e.series[:, s - 96:s])
    np.testing.assert_array_equal(y[0], e.series[0, s:s + 12])
    assert e.times["train"].max() + 12 <= a  # no training target in the validation part


def test_resident_batches_equal_host_batches_and_the_task_trains():
    e = _toy_elec()
    resident = fc.ResidentSeries(e.series, 96, 12)
    times = torch.as_tensor(e.times["train"][:5])
    host = resident.gather(times, "cpu")
    x, y = e.windows("train")
    np.testing.assert_array_equal(host.x.numpy(), x[:5])
    np.testing.assert_array_equal(host.y.numpy(), y[:5])
    via = fc.TimesBatch(times, resident).to("cpu")
    torch.testing.assert_close(via.x, host.x)
    config = fc.PatchConfig(context=96, horizon=12, patch_len=24, stride=24, d_model=8, n_heads=2, n_layers=1,
                            d_ff=16)
    task = fc.forecasting_task(e, config, batch_size=16, budget=case_study.Budget(tokens=96), evaluations=2,
                               val_windows=20)
    for resident_flag in (False, True):
        setting = case_study.Setting().with_options(resident=resident_flag)
        run, _ = case_study.train_run(task, setting, "cpu", current_profile(torch.device("cpu")))
        assert run.tokens == 96 and len(run.curve) == 2 and np.isfinite(run.quality)


def test_case_plan_per_device_and_the_predictors():
    from gpuformer_lib.device import SizePreset
    from gpuformer_lib.profiles import PROFILES

    cpu = fc.case_plan(current_profile(torch.device("cpu")), SizePreset("cpu", "test"))
    assert cpu.seeds == (0,) and cpu.budget_windows == 6_400 and cpu.config.n_patches == 15
    toy = fc.case_plan(PROFILES["t4"], SizePreset("gpu-small", "test", toy=True))
    assert toy.budget_windows < cpu.budget_windows
    h100 = fc.case_plan(PROFILES["h100-80gb"], SizePreset("gpu", "test"))
    assert len(h100.seeds) == 3 and h100.config.n_patches == 42  # the paper's patches of 16 every 8
    with pytest.raises(ValueError):
        fc.case_plan(PROFILES["t4"], "gpu")
    # a GPU step of the gpu preset is arithmetic-heavier than the CPU preset's
    assert fc.patch_flops(h100.config, h100.batch_size) > 100 * fc.patch_flops(cpu.config, cpu.batch_size)
    assert [fc.tokens_for(336, p) for p in (1, 24, 48, 336)] == [336, 15, 8, 2]
    assert fc.attention_flops(30, 8, 2, 1) == 4 * fc.attention_flops(15, 8, 2, 1)
    assert fc.encoder_step_seconds(4, d_model=8, n_heads=2, n_layers=1, sequences=2, repeats=1) > 0


def test_fix_for_and_verdict_words():
    rows = ["baseline", "+ data resident on the device", "+ bf16 autocast", "+ fused attention, no id check",
            "+ fused AdamW"]
    assert fc.fix_for("matrix products", rows) == "+ bf16 autocast"
    assert fc.fix_for("attention", rows) == "+ fused attention, no id check"
    assert fc.fix_for("copies", rows) == "+ data resident on the device"
    assert fc.fix_for("loss (log-softmax, NLL)", rows) is None
    assert fc.verdict(0.9, 1.0) == "beats" and fc.verdict(1.005, 1.0) == "ties with" and fc.verdict(1.2, 1.0) == "loses to"
    with pytest.raises(ValueError):
        fc.verdict(1.0, 0.0)


def test_exercise_checks_grade_right_and_wrong_answers():
    import math

    from gpuformer_lib.exercises import forecasting as ex

    counted = fc.attention_flops(fc.tokens_for(336, 8), 32, 1, 1) / fc.attention_flops(fc.tokens_for(336, 24), 32, 1, 1)
    right = (fc.tokens_for(336, 8) / fc.tokens_for(336, 24)) ** 2
    assert ex.check_patch_attention_prediction(right, counted, short_patch=8, long_patch=24, context=336)
    assert not ex.check_patch_attention_prediction(3.0, counted, short_patch=8, long_patch=24, context=336)
    assert not ex.check_trailing_mean(lambda s, t, k: float(np.mean(s[t - k // 2:t + k // 2 + 1])))
    assert not ex.check_trailing_mean(lambda s, t, k: float(np.mean(s[t - k + 1:t + 1])))  # includes t
    assert ex.check_trailing_mean(lambda s, t, k: float(np.mean(s[t - k:t])))
    measured = ex.ewma_half_life(0.94)
    assert measured == math.ceil(math.log(0.5) / math.log(0.94))
    assert ex.check_ewma_half_life_prediction(math.log(0.5) / math.log(0.94), measured, lam=0.94)
    assert not ex.check_ewma_half_life_prediction(1 / (1 - 0.94) * 2, measured, lam=0.94)


def test_real_files_load_with_their_known_shapes():
    stocks = fc.load_stocks()
    assert set(stocks) == set(fc.TICKERS) and len(stocks["AAPL"][1]) == 3270 and stocks["GOOG"][0][0] == "2004-08-19"
    assert all(d1 < d2 for d1, d2 in zip(stocks["IBM"][0], stocks["IBM"][0][1:]))  # in date order
    raw = fc.load_elecdemand()
    assert len(raw["demand"]) == 17_520 and set(np.unique(raw["workday"])) == {0.0, 1.0}
    e = fc.prepare_elec(raw)
    assert e.times["train"].max() + fc.DAY <= e.bounds[0] <= e.times["val"].min()  # no target crosses the cut


def test_the_gpu_preset_model_runs_a_step_at_its_sizes():
    from gpuformer_lib.device import SizePreset
    from gpuformer_lib.profiles import PROFILES

    plan = fc.case_plan(PROFILES["h100-80gb"], SizePreset("gpu", "test"))
    model = fc.PatchTST(plan.config)
    x, y = torch.randn(2, 2, fc.WEEK), torch.randn(2, fc.DAY)
    loss, n = fc.forecast_loss(model, fc.WindowBatch(x, y))
    loss.backward()
    assert n == 2 and torch.isfinite(loss) and model.embed.weight.grad is not None


def test_graph_timing_says_why_it_does_not_run_off_cuda():
    e = _toy_elec()
    config = fc.PatchConfig(context=96, horizon=12, patch_len=24, stride=24, d_model=8, n_heads=2, n_layers=1,
                            d_ff=16)
    task = fc.forecasting_task(e, config, batch_size=16, budget=case_study.Budget(tokens=96), evaluations=1)
    timing = fc.graph_step_timing(task, "cpu")
    assert timing.speedup is None and "CUDA" in timing.reason
    assert fc.GraphTiming(2e-3, 1e-3).speedup == 2.0


def test_expanding_mean_volatility_against_a_loop():
    rng = np.random.default_rng(1)
    r = rng.normal(size=80)
    times = np.arange(10, 70, 7)
    got = fc.expanding_mean_volatility(r, times, 5)
    for t, value in zip(times, got):
        known = [s for s in range(1, 80 - 5 + 1) if s + 5 <= t]  # windows ending before t only
        ref = np.mean([np.sqrt(np.mean(r[s:s + 5] ** 2)) for s in known])
        assert value == pytest.approx(ref, rel=1e-12)
    # no look-ahead: the future changed, the forecast at 40 unchanged
    r2 = r.copy()
    r2[40:] = 100.0
    assert fc.expanding_mean_volatility(r2, np.array([40]), 5)[0] == pytest.approx(
        fc.expanding_mean_volatility(r, np.array([40]), 5)[0])
    with pytest.raises(ValueError):
        fc.expanding_mean_volatility(r, np.array([3]), 5)


def _weekly_elec():
    t = np.arange(6 * 7 * 48)
    demand = np.sin(2 * np.pi * t / 48) + 0.3 * np.sin(2 * np.pi * t / (7 * 48)) + 0.01 * t / 48
    temperature = np.cos(2 * np.pi * t / 48) + np.random.default_rng(0).normal(0, 0.1, len(t))
    return fc.prepare_elec({"demand": demand, "temperature": temperature}, stride=48)


def test_elec_baselines_name_every_variant_and_the_choice_is_made_on_validation():
    scores = fc.elec_baselines(_weekly_elec())
    assert tuple(scores) == fc.ELEC_BASELINES
    for name, s in scores.items():
        assert {"val MSE", "MSE", "MAE"} <= set(s)
        assert ("fit_s" in s) == ("Linear" in name)
    best = fc.best_on_validation(scores)
    assert scores[best]["val MSE"] == min(s["val MSE"] for s in scores.values())
    fake = {"a": {"val MSE": 1.0, "MSE": 0.1}, "b": {"val MSE": 0.5, "MSE": 0.9}}
    assert fc.best_on_validation(fake) == "b"  # the validation score decides, not the test score
    assert fc.best_on_validation(fake, ["a"]) == "a"
    with pytest.raises(ValueError):
        fc.best_on_validation({"a": {"MSE": 1.0}})


def test_top_level_operators_count_a_linear_once():
    layer = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            layer(x)
    events = prof.events()
    every = sum(1 for e in events if e.name.startswith("aten::")) / 2
    top = fc.top_level_operators(events, 2)
    assert top == 1  # aten::linear, not its aten::t and aten::addmm
    assert every > top
    with pytest.raises(ValueError):
        fc.top_level_operators(events, 0)


def test_step_prediction_counts_the_real_step_and_the_allreduce_prediction():
    from gpuformer_lib import predict
    config = fc.PatchConfig(patch_len=16, stride=8, d_model=32, n_heads=4, n_layers=2, d_ff=64)
    fp32 = fc.step_prediction(config, 64, "H100 SXM", torch.float32)
    bf16 = fc.step_prediction(config, 64, "H100 SXM", torch.bfloat16)
    work = fc._step_work(config, 64)
    # the FLOPs counted from the real step agree with the closed form to 10 % (fused attention's backward is
    # counted at 2.5x its forward, FlashAttention's count; the closed form prices every backward at 2x)
    assert work.matrix_flops == pytest.approx(fc.patch_flops(config, 64), rel=0.1)
    # every kernel of a small eager step is issued by the host: launches x the census's per-kernel cost
    assert fp32.host_s == pytest.approx(work.kernels * predict.launch_seconds()["eager"])
    assert fp32.bound == bf16.bound == "host" and fp32.seconds == bf16.seconds  # bf16 cannot help a host-bound step
    assert bf16.matrix_s < fp32.matrix_s  # though its products are faster
    big = fc.step_prediction(config, 4096, "T4", torch.float32)
    assert big.bound != "host" and big.gpu_s > 10 * fc.step_prediction(config, 64, "T4", torch.float32).gpu_s
    with pytest.raises(ValueError, match="batch_size"):
        fc.step_prediction(config, 0, "T4", torch.float32)
    from gpuformer_lib import predict
    ref = predict.allreduce_seconds(4 * 1000, 8, predict.nvlink_bus_bandwidth("H100 SXM")[0])  # the predictor's
    assert fc.dp_allreduce_prediction(1000, 8) == pytest.approx(ref)
    ll = [predict.figure(k).value for k in predict.NCCL_PROTOCOLS["LL"][:2]]
    assert ref >= (ll[0] + 14 * ll[1]) * 1e-6  # at least NCCL's base latency and 14 ring steps
    assert fc.dp_allreduce_prediction(1000, 1) == 0.0
    with pytest.raises(ValueError):
        fc.dp_allreduce_prediction(1000, 8, link="carrier pigeon")


def test_returns_train_mse_of_a_silent_model_is_no_change():
    rng = np.random.default_rng(0)
    prices = np.exp(np.cumsum(rng.normal(0, 0.01, 300))) * 100
    prepared = fc.prepare_returns({"X": ([str(i) for i in range(300)], prices)}, lags=5)
    model = fc.ReturnsTransformer(5, d_model=8, n_heads=2, n_layers=1)
    torch.nn.init.zeros_(model.head.weight)
    torch.nn.init.zeros_(model.head.bias)
    got, none = fc.returns_train_mse(model, prepared)
    y = prepared.parts["X"]["train"][2]
    assert none == pytest.approx(np.mean(y ** 2)) and got == pytest.approx(none)


def test_gpu_step_verdict_names_the_prediction_or_why_there_is_none():
    config = fc.PatchConfig(patch_len=16, stride=8, d_model=32, n_heads=4, n_layers=2, d_ff=64)
    words = fc.gpu_step_verdict(config, 64, "NVIDIA H100 80GB HBM3", 0.004)
    predicted = fc.step_prediction(config, 64, "H100 SXM", torch.float32)
    assert f"{predicted.seconds * 1e3:.2f} ms ({predicted.bound}-bound" in words and "4.00 ms" in words
    assert "not in the course's datasheet table" in fc.gpu_step_verdict(config, 64, "Radeon 7900", 0.004)
    with pytest.raises(ValueError, match="measured_s"):
        fc.gpu_step_verdict(config, 64, "T4", 0.0)


def test_each_baseline_forecast_is_the_one_elec_baselines_scores():
    e = _weekly_elec()
    scores = fc.elec_baselines(e)
    x, y = e.windows("test")
    for name in fc.ELEC_BASELINES:
        assert fc.mse(fc.elec_baseline(e, name)(x), y) == pytest.approx(scores[name]["MSE"])
    with pytest.raises(ValueError, match="unknown baseline"):
        fc.elec_baseline(e, "NLinear")


def test_patchtst_trains_to_convergence_on_the_elec_windows_with_ltsf_train():
    from gpuformer_lib import ltsf

    e = _toy_elec()
    x, y = e.windows("val", np.array([2, 0]))  # windows picked by position, as ltsf.train asks for them
    full_x, full_y = e.windows("val")
    np.testing.assert_array_equal(x, full_x[[2, 0]])
    np.testing.assert_array_equal(y, full_y[[2, 0]])
    assert e.n_windows("val") == len(full_x)
    config = fc.PatchConfig(context=96, horizon=12, patch_len=24, stride=24, d_model=8, n_heads=2, n_layers=1,
                            d_ff=16, dropout=0.0)
    torch.manual_seed(0)
    model = fc.PatchTST(config)
    before = ltsf.window_errors(model, e, "val")[0].mean()
    trained = ltsf.train(model, e, epochs=4, batch_size=16, lr=3e-3, patience=2, seed=0, progress=False)
    se, ae = ltsf.window_errors(trained.model, e, "test")
    assert se.shape == ae.shape == (e.n_windows("test"),)  # one error per window: what the bootstrap resamples
    assert min(trained.val_mse) == trained.val_mse[trained.best_epoch] < before  # it learned; the best epoch kept
    assert ltsf.evaluate(trained.model, e, "val")["MSE"] == pytest.approx(min(trained.val_mse), rel=1e-5)
