"""The ETTh1 benchmark as the papers run it (gpuformer_lib.ltsf): its split, scale, models, training and intervals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from gpuformer_lib import forecasting, ltsf


def synthetic(T: int = 14_400, C: int = 3, seed: int = 0) -> np.ndarray:
    """A daily cycle, a slow trend and noise per channel, long enough for the benchmark's 20 months."""
    rng = np.random.default_rng(seed)
    t = np.arange(T)[:, None]
    return 10 + np.sin(2 * np.pi * t / 24 + np.arange(C)) + 1e-4 * t + 0.3 * rng.standard_normal((T, C))


def test_the_split_has_the_papers_borders_and_window_counts():
    s = ltsf.split(synthetic(), context=336, horizon=96)
    assert [len(s.parts[p]) for p in ("train", "val", "test")] == [8640, 2880 + 336, 2880 + 336]
    assert [s.n_windows(p) for p in ("train", "val", "test")] == [8209, 2785, 2785]
    # the first test window forecasts from hour 11,520 on, its look-back reaching into the validation months
    raw = synthetic()
    _, y = s.windows("test", np.array([0]))
    np.testing.assert_allclose(y[0], ((raw[11_520:11_616] - s.mean) / s.std).T.astype(np.float32), rtol=1e-6)
    x, _ = s.windows("val", np.array([0]))
    np.testing.assert_allclose(x[0, :, -1], ((raw[8639] - s.mean) / s.std).astype(np.float32), rtol=1e-6)


def test_only_the_training_months_set_the_scale():
    raw = synthetic()
    changed = raw.copy()
    changed[8640:] *= 100  # the validation and test months cannot move the statistics
    a, b = ltsf.split(raw), ltsf.split(changed)
    np.testing.assert_array_equal(a.mean, b.mean)
    np.testing.assert_array_equal(a.std, b.std)
    np.testing.assert_allclose(a.parts["train"].std(0), 1.0, rtol=1e-12)  # population std, as StandardScaler
    with pytest.raises(ValueError, match="T >= 14400"):
        ltsf.split(raw[:10_000])
    with pytest.raises(IndexError):
        a.windows("test", np.array([a.n_windows("test")]))


def test_the_etth1_file_gives_the_benchmarks_window_counts():
    dates, values = ltsf.load()
    assert values.shape == (17_420, 7) and dates[0] == "2016-07-01 00:00:00"
    s = ltsf.split(values)
    assert [s.n_windows(p) for p in ("train", "val", "test")] == [8209, 2785, 2785]


def test_a_test_loader_that_drops_the_last_batch_scores_fewer_windows():
    assert ltsf.scored_windows(2785, 128, drop_last=True) == 2688
    assert ltsf.scored_windows(2785, 32, drop_last=True) == 2784
    assert ltsf.scored_windows(2785, 128, drop_last=False) == 2785


def test_dlinears_trend_is_the_numpy_moving_average():
    x = np.random.default_rng(1).standard_normal((4, 3, 50))
    np.testing.assert_allclose(ltsf.trend(torch.as_tensor(x), 25).numpy(), forecasting.moving_average(x, 25),
                               atol=1e-12)
    with pytest.raises(ValueError, match="odd"):
        ltsf.trend(torch.zeros(1, 1, 10), 4)


def test_nlinear_moves_with_a_level_shift_and_dlinear_is_linear():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 336)
    n = ltsf.NLinear()
    torch.testing.assert_close(n(x + 5.0), n(x) + 5.0)
    d = ltsf.DLinear()
    zero = d(torch.zeros_like(x))
    torch.testing.assert_close(d(2 * x) - zero, 2 * (d(x) - zero), rtol=1e-5, atol=1e-5)


def test_least_squares_is_the_training_optimum():
    s = ltsf.split(synthetic(C=2), context=48, horizon=12)
    best = ltsf.least_squares_nlinear(s).double()
    x, y = s.windows("train")
    x, y = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64)
    loss = torch.nn.functional.mse_loss(best(x), y)
    loss.backward()
    grad = max(p.grad.abs().max().item() for p in best.parameters())
    assert grad < 1e-4, grad  # a stationary point of the training MSE (float32 weights, float64 loss)
    trained = ltsf.train(ltsf.NLinear(48, 12), s, epochs=2, batch_size=64, lr=1e-3, patience=2, seed=0,
                         progress=False)
    with torch.no_grad():
        assert loss.item() <= torch.nn.functional.mse_loss(trained.model.double()(x), y).item() + 1e-9


def test_patchtst_keeps_channels_apart_and_follows_each_channels_scale():
    sizes = dataclasses.replace(ltsf.ETTH1_PATCHTST, context=64, horizon=8, channels=3, n_layers=2, dropout=0.0)
    torch.manual_seed(0)
    m = ltsf.ChannelPatchTST(sizes).eval()
    x = torch.randn(2, 3, 64)
    y = m(x)
    assert y.shape == (2, 3, 8)
    other = x.clone()
    other[:, 1] = torch.randn(2, 64) * 10
    torch.testing.assert_close(m(other)[:, [0, 2]], y[:, [0, 2]])  # channel independence
    torch.testing.assert_close(m(3 * x + 7), 3 * y + 7, rtol=1e-4, atol=1e-3)  # instance normalisation
    with pytest.raises(ValueError, match="64"):
        m(torch.randn(2, 3, 63))
    with pytest.raises(ValueError, match="3, 64"):  # the channels it was built for
        m(torch.randn(2, 4, 64))


def test_training_stops_early_and_keeps_the_best_validation_weights():
    s = ltsf.split(synthetic(C=2), context=48, horizon=12)
    run = ltsf.train(ltsf.NLinear(48, 12), s, epochs=6, batch_size=256, lr=0.05, patience=1, seed=3,
                     val_windows=200, progress=False)
    assert run.best_epoch == int(np.argmin(run.val_mse))
    x, y = s.windows("val", np.linspace(0, s.n_windows("val") - 1, 200).round().astype(int))
    assert float(((ltsf.predict(run.model, x) - y) ** 2).mean()) == pytest.approx(min(run.val_mse), rel=1e-6)
    assert run.steps == len(run.val_mse) * (s.n_windows("train") // 256)
    halving = ltsf.train(ltsf.NLinear(48, 12), s, epochs=4, batch_size=256, lr=0.08, patience=4, seed=3,
                         max_steps_per_epoch=2, val_windows=200, progress=False)
    assert halving.epoch_lrs == pytest.approx([0.08, 0.08, 0.04, 0.02])  # LTSF-Linear's type1 schedule
    with pytest.raises(ValueError, match="schedule"):
        ltsf.train(ltsf.NLinear(48, 12), s, epochs=1, batch_size=8, lr=1e-3, patience=1, seed=0, schedule="cosine")


def test_block_bootstrap_intervals():
    rng = np.random.default_rng(0)
    e = 1.0 + 0.1 * rng.standard_normal(2000)
    ci = ltsf.block_bootstrap(e, block=50)
    assert ci.low < 1.0 < ci.high and ci.high - ci.low < 0.05
    same = ltsf.block_bootstrap(e, e, block=50)
    assert same.value == same.low == same.high == 0.0
    better = ltsf.block_bootstrap(e - 0.05, e, block=50)
    assert better.excludes(0.0) and better.high < 0  # the first model's errors are lower over the same windows
    # dependent errors (a slow wave) get a wider interval than the same values shuffled
    wave = 1.0 + 0.1 * np.sin(np.arange(2000) / 40)
    assert (ltsf.block_bootstrap(wave, block=200).high - ltsf.block_bootstrap(wave, block=200).low
            > ltsf.block_bootstrap(rng.permutation(wave), block=200).high
            - ltsf.block_bootstrap(rng.permutation(wave), block=200).low)
    with pytest.raises(ValueError, match="same windows"):
        ltsf.block_bootstrap(e, e[:-1])
    with pytest.raises(ValueError, match="two blocks"):
        ltsf.block_bootstrap(e[:100], block=96)


def test_seed_summary_and_the_reproduction_target():
    assert ltsf.seed_summary([0.37, 0.38, 0.39]) == pytest.approx((0.38, 0.01))
    assert ltsf.seed_summary([0.4]) == (0.4, 0.0)
    assert ltsf.within(0.40, 0.37) and not ltsf.within(0.41, 0.37)
    with pytest.raises(ValueError):
        ltsf.within(0.4, 0.0)
