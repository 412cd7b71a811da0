"""Stock prices and a real forecasting benchmark, the honest way: chapter 15's data, splits, baselines, the
PatchTST-style model and the :class:`~gpuformer_lib.case_study.Task` the case-study harness trains.

Two data sets, read through :func:`gpuformer_lib.data.data_path` (local copy checked by sha256, downloaded
from its source when missing):

- ``stocks.csv.gz``: daily prices of AAPL, IBM, MSFT and GOOG (:func:`load_stocks`). Next-day **returns**
  (log returns of the adjusted close) against the random walk's forecast "no change" (a return of 0), a
  ridge regression on the last 20 returns (:func:`ridge_fit`, closed form) and a small Transformer; then
  5-day **volatility**, against the training period's mean and an exponentially weighted moving average
  (RiskMetrics, J.P. Morgan 1996: :func:`ewma_volatility`).
- ``elecdemand.csv``: half-hourly electricity demand of Victoria with temperature (:func:`load_elecdemand`):
  one week in (336 half-hours), the next day out (48), temperature as a covariate; baselines persistence,
  seasonal naive (same time last week), NLinear and DLinear (Zeng et al. 2023, *Are Transformers Effective
  for Time Series Forecasting?*; fitted here in closed form as ridge regressions, since both are linear in
  the window); :class:`PatchTST`, built from the library's :class:`~gpuformer_lib.layers.EncoderLayer`
  (Nie et al. 2023, *A Time Series is Worth 64 Words*: patches of the series as tokens, channel
  independence, instance normalisation); MSE and MAE on standardised demand.

Every split is **chronological** (:func:`chronological_bounds`): training data ends before validation
begins, validation before test; a window's input may reach back into an earlier part (the past is known
at forecast time) but its target never leaves its own part. :func:`check_no_lookahead` is the test that
fails on leakage: it changes every value from the forecast time on and demands identical features.

Leaves out: trading costs and strategies (a forecast is not a profit), intraday data, exogenous forecasts
of temperature (the covariate is the past week's measured temperature only), probabilistic forecasts, and
PatchTST's self-supervised pre-training.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import gzip
import io
import math
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpuformer_lib import case_study, data
from gpuformer_lib.layers import EncoderLayer

TICKERS = ("AAPL", "IBM", "MSFT", "GOOG")
"""The four long series of ``stocks.csv.gz`` (FB has only 196 days and is left out)."""
DAY = 48
"""Half-hours in a day: the electricity forecast's horizon."""
WEEK = 7 * DAY
"""Half-hours in a week: the electricity forecast's context."""


# --------------------------------------------------------------------------- data


def load_stocks(path=None, tickers: Sequence[str] = TICKERS) -> dict[str, tuple[list[str], np.ndarray]]:
    """``{ticker: (dates, adjusted close)}`` in date order, from ``stocks.csv.gz`` (default: the data folder)."""
    path = data.data_path("stocks") if path is None else path
    with gzip.open(path, "rt", newline="") as f:
        rows = list(csv.DictReader(f))
    out = {}
    for ticker in tickers:
        mine = sorted((r["Date"], float(r["Adj Close"])) for r in rows if r["Ticker"] == ticker)
        if not mine:
            raise ValueError(f"no rows for ticker {ticker!r} in {path}; known: {sorted({r['Ticker'] for r in rows})}")
        out[ticker] = ([d for d, _ in mine], np.array([p for _, p in mine], dtype=np.float64))
    return out


def log_returns(prices: np.ndarray) -> np.ndarray:
    """r[t] = log(p[t+1] / p[t]): one fewer than the prices; prices must be positive."""
    prices = np.asarray(prices, dtype=np.float64)
    if prices.ndim != 1 or len(prices) < 2 or not (prices > 0).all():
        raise ValueError("prices must be a 1-d array of at least 2 positive values")
    return np.diff(np.log(prices))


def load_elecdemand(path=None) -> dict[str, np.ndarray]:
    """``{"demand": GW, "workday": 0/1, "temperature": °C}``, 17,520 half-hours of 2014 in time order."""
    path = data.data_path("elecdemand") if path is None else path
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return {"demand": np.array([float(r["Demand"]) for r in rows]),
            "workday": np.array([float(r["WorkDay"]) for r in rows]),
            "temperature": np.array([float(r["Temperature"]) for r in rows])}


# --------------------------------------------------------------------------- chronological splits, no look-ahead


def chronological_bounds(n: int, fractions: Sequence[float] = (0.7, 0.15, 0.15)) -> tuple[int, int]:
    """The two cut points (train ends, validation ends) of ``n`` time steps split in order by ``fractions``."""
    if len(fractions) != 3 or any(f <= 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(f"fractions must be three positive shares that sum to 1, got {fractions!r}")
    a = int(round(n * fractions[0]))
    b = int(round(n * (fractions[0] + fractions[1])))
    if not 0 < a < b < n:
        raise ValueError(f"{n} steps are too few to split by {fractions!r}")
    return a, b


def window_starts(start: int, stop: int, context: int, horizon: int, stride: int = 1) -> np.ndarray:
    """Forecast times t (the first target step) whose target ``t .. t+horizon`` lies in ``[start, stop)`` and whose
    input ``t-context .. t`` starts at or after 0: the input may reach back before ``start`` (the past is known
    at forecast time), the target never leaves its part."""
    first = max(start, context)
    return np.arange(first, stop - horizon + 1, stride)


def lag_matrix(series: np.ndarray, times: np.ndarray, lags: int) -> np.ndarray:
    """Row i holds ``series[times[i]-lags : times[i]]``: the values strictly before each forecast time."""
    series = np.asarray(series)
    times = np.asarray(times)
    if len(times) and (times.min() < lags or times.max() > len(series)):
        raise ValueError(f"forecast times must lie in [{lags}, {len(series)}], got {times.min()}..{times.max()}")
    return np.stack([series[t - lags:t] for t in times]) if len(times) else np.zeros((0, lags))


def check_no_lookahead(features: Callable[[np.ndarray, int], np.ndarray], series: np.ndarray, t: int,
                       seed: int = 0) -> None:
    """Raise ``AssertionError`` if ``features(series, t)`` (the inputs of a forecast made at time ``t``) changes
    when every value from ``t`` on is replaced: such features read the future they are meant to forecast."""
    series = np.asarray(series, dtype=np.float64)
    if not 0 < t < len(series):
        raise ValueError(f"t must lie inside the series (0 < t < {len(series)}), got {t}")
    changed = series.copy()
    changed[t:] = np.random.default_rng(seed).normal(size=len(series) - t) * (series.std() + 1) + 1e3
    before, after = np.asarray(features(series, t)), np.asarray(features(changed, t))
    if before.shape != after.shape or not np.array_equal(before, after):
        raise AssertionError(f"look-ahead: the features of a forecast at t={t} changed when values from t on changed")


# --------------------------------------------------------------------------- linear models and metrics


def ridge_fit(X: np.ndarray, y: np.ndarray, lam: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Ridge regression with an unpenalised intercept, in closed form (float64): minimise
    ``|y - X w - b|^2 + lam |w|^2``. ``y`` (N,) or (N, K). Returns (w (D,) or (D, K), b)."""
    X, y = np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if X.ndim != 2 or y.shape[0] != X.shape[0] or lam < 0:
        raise ValueError(f"need X (N, D), y (N,) or (N, K) with the same N and lam >= 0; got {X.shape}, {y.shape}, {lam}")
    mx, my = X.mean(0), y.mean(0)
    Xc, yc = X - mx, y - my
    w = np.linalg.solve(Xc.T @ Xc + lam * np.eye(X.shape[1]), Xc.T @ yc)
    return w, my - mx @ w


def mse(pred, target) -> float:
    return float(np.mean((np.asarray(pred, dtype=np.float64) - np.asarray(target, dtype=np.float64)) ** 2))


def mae(pred, target) -> float:
    return float(np.mean(np.abs(np.asarray(pred, dtype=np.float64) - np.asarray(target, dtype=np.float64))))


def direction_accuracy(pred, target) -> float:
    """Share of steps whose predicted sign matches the realised one (zeros in ``target`` left out)."""
    pred, target = np.asarray(pred), np.asarray(target)
    keep = target != 0
    return float(np.mean(np.sign(pred[keep]) == np.sign(target[keep])))


def ewma_volatility(returns: np.ndarray, lam: float = 0.94) -> np.ndarray:
    """sigma[t] = sqrt of the exponentially weighted mean of r[0..t-1]^2 with decay ``lam`` (RiskMetrics'
    0.94 for daily data): a forecast made before r[t] is seen. sigma[0] uses r[0]^2 as its start."""
    r2 = np.asarray(returns, dtype=np.float64) ** 2
    var = np.empty_like(r2)
    var[0] = r2[0]
    for t in range(1, len(r2)):
        var[t] = lam * var[t - 1] + (1 - lam) * r2[t - 1]
    return np.sqrt(var)


def realised_volatility(returns: np.ndarray, times: np.ndarray, horizon: int = 5) -> np.ndarray:
    """sqrt(mean(r[t..t+horizon)^2)) for each forecast time t: the volatility a forecast at t must predict."""
    r2 = np.asarray(returns, dtype=np.float64) ** 2
    return np.sqrt(np.stack([r2[t:t + horizon].mean() for t in times]))


# --------------------------------------------------------------------------- stock returns: the experiment


@dataclasses.dataclass(frozen=True)
class ReturnsData:
    """Per ticker: the returns, the (train end, validation end) cut points, lagged inputs and targets."""

    returns: dict[str, np.ndarray]
    bounds: dict[str, tuple[int, int]]
    lags: int
    parts: dict[str, dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]]
    """parts[ticker][part] = (forecast times, X (N, lags), y (N,)), part in train, val, test."""


def prepare_returns(stocks: dict[str, tuple[list[str], np.ndarray]] | None = None, lags: int = 20,
                    fractions: Sequence[float] = (0.7, 0.15, 0.15)) -> ReturnsData:
    """Log returns of each ticker split chronologically; inputs the ``lags`` returns before each forecast time."""
    stocks = load_stocks() if stocks is None else stocks
    returns, bounds, parts = {}, {}, {}
    for ticker, (_, prices) in stocks.items():
        r = log_returns(prices)
        a, b = chronological_bounds(len(r), fractions)
        returns[ticker], bounds[ticker] = r, (a, b)
        parts[ticker] = {}
        for name, (lo, hi) in (("train", (0, a)), ("val", (a, b)), ("test", (b, len(r)))):
            t = window_starts(lo, hi, lags, 1)
            parts[ticker][name] = (t, lag_matrix(r, t, lags), r[t])
    return ReturnsData(returns, bounds, lags, parts)


RIDGE_GRID = (0.0, 1e-3, 1e-2, 1e-1, 1.0)
"""Ridge strengths tried for the returns model, as multiples of (training windows x the inputs' variance)."""


def returns_baselines(prepared: ReturnsData, grid: Sequence[float] = RIDGE_GRID) -> dict[str, dict[str, float]]:
    """Per ticker, test MSE of "no change" (a return of 0: the random walk's forecast) and of ridge on the lags,
    with its strength chosen on the validation part from ``grid`` (each a multiple of the training windows
    times the inputs' variance), and ridge's direction accuracy (share of days with the sign right)."""
    out = {}
    for ticker, parts in prepared.parts.items():
        _, Xtr, ytr = parts["train"]
        _, Xva, yva = parts["val"]
        _, Xte, yte = parts["test"]
        scale = len(Xtr) * Xtr.var()
        fits = [ridge_fit(Xtr, ytr, lam * scale) for lam in grid]
        best = min(range(len(grid)), key=lambda i: mse(Xva @ fits[i][0] + fits[i][1], yva))
        w, b = fits[best]
        pred = Xte @ w + b
        out[ticker] = {"no change": mse(np.zeros_like(yte), yte), "ridge": mse(pred, yte),
                       "ridge direction": direction_accuracy(pred, yte), "ridge lam": grid[best],
                       "n_test": len(yte)}
    return out


class ReturnsTransformer(nn.Module):
    """A small encoder over the last ``lags`` returns (each return a token: a linear embedding of one number
    plus a learned position), read out from the last token to the next return. Inputs are scaled by
    ``scale`` (the training returns' standard deviation) so that the model sees values of order 1."""

    def __init__(self, lags: int = 20, d_model: int = 32, n_heads: int = 2, n_layers: int = 2, scale: float = 1.0,
                 dropout: float = 0.1):
        super().__init__()
        self.embed = nn.Linear(1, d_model)
        self.pos = nn.Parameter(torch.zeros(lags, d_model))
        self.layers = nn.ModuleList(EncoderLayer(d_model, n_heads, 2 * d_model, dropout=dropout)
                                    for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, 1)
        self.scale = scale

    def forward(self, x: Tensor) -> Tensor:
        """x (B, lags) returns -> (B,) the next return."""
        h = self.embed((x / self.scale).unsqueeze(-1)) + self.pos  # (B, L, C)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h[:, -1])).squeeze(-1) * self.scale


def train_returns_transformer(prepared: ReturnsData, steps: int = 300, batch_size: int = 256, lr: float = 1e-3,
                              seed: int = 0, d_model: int = 32) -> tuple[ReturnsTransformer, dict[str, float]]:
    """Train one :class:`ReturnsTransformer` on all tickers' training windows (MSE), return it and each ticker's
    test MSE. CPU, float32: the model is tiny."""
    torch.manual_seed(seed)
    X = torch.tensor(np.concatenate([p["train"][1] for p in prepared.parts.values()]), dtype=torch.float32)
    y = torch.tensor(np.concatenate([p["train"][2] for p in prepared.parts.values()]), dtype=torch.float32)
    model = ReturnsTransformer(prepared.lags, d_model=d_model, scale=float(y.std()))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        idx = torch.randint(len(X), (batch_size,), generator=g)
        loss = F.mse_loss(model(X[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    out = {}
    with torch.no_grad():
        for ticker, parts in prepared.parts.items():
            _, Xte, yte = parts["test"]
            out[ticker] = mse(model(torch.tensor(Xte, dtype=torch.float32)).numpy(), yte)
    return model, out


def returns_train_mse(model: ReturnsTransformer, prepared: ReturnsData) -> tuple[float, float]:
    """(the model's MSE, "no change"'s MSE) on all tickers' training windows: a model that has learned nothing
    from the lags ties with "no change" there too, so this tells under-training from an efficient market."""
    X = np.concatenate([p["train"][1] for p in prepared.parts.values()])
    y = np.concatenate([p["train"][2] for p in prepared.parts.values()])
    model.eval()
    with torch.no_grad():
        pred = model(torch.tensor(X, dtype=torch.float32)).numpy()
    return mse(pred, y), mse(np.zeros_like(y), y)


def volatility_baselines(prepared: ReturnsData, horizon: int = 5, lam: float = 0.94) -> dict[str, dict[str, float]]:
    """Per ticker, test MSE of forecasts of the next ``horizon`` days' realised volatility: the training
    period's mean realised volatility (a constant), the expanding-window mean (:func:`expanding_mean_volatility`:
    every realised volatility known before the forecast time, so it follows a change of regime slowly) and the
    EWMA of past squared returns."""
    out = {}
    for ticker, r in prepared.returns.items():
        a, b = prepared.bounds[ticker]
        t_train = window_starts(0, a, 1, horizon)
        t_test = window_starts(b, len(r), 1, horizon)
        mean_vol = realised_volatility(r, t_train, horizon).mean()
        target = realised_volatility(r, t_test, horizon)
        ewma = ewma_volatility(r, lam)[t_test]
        expanding = expanding_mean_volatility(r, t_test, horizon)
        out[ticker] = {"historical mean": mse(np.full_like(target, mean_vol), target),
                       "expanding mean": mse(expanding, target), "EWMA": mse(ewma, target)}
    return out


def expanding_mean_volatility(returns: np.ndarray, times: np.ndarray, horizon: int = 5) -> np.ndarray:
    """At each forecast time t, the mean of every realised volatility (:func:`realised_volatility`) whose window
    ends before t (starts s with s + horizon <= t, s >= 1): all the past, no look-ahead. (N,) for ``times`` (N,)."""
    times = np.asarray(times)
    if times.min() < horizon + 1:
        raise ValueError(f"every time needs one whole past window: times must be >= {horizon + 1}")
    starts = np.arange(1, len(returns) - horizon + 1)
    rv = realised_volatility(returns, starts, horizon)
    c = np.concatenate([[0.0], np.cumsum(rv)])
    known = times - horizon  # windows starting at 1 .. t - horizon are known at t
    return c[known] / known


# --------------------------------------------------------------------------- electricity: data and baselines


@dataclasses.dataclass(frozen=True)
class ElecData:
    """Standardised channels (demand, temperature) (2, T) as float32, the cut points, the forecast times of
    each part and the training statistics used to standardise."""

    series: np.ndarray
    bounds: tuple[int, int]
    times: dict[str, np.ndarray]
    mean: np.ndarray
    std: np.ndarray
    context: int
    horizon: int

    def n_windows(self, part: str) -> int:
        return len(self.times[part])

    def windows(self, part: str, starts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(inputs (N, 2, context), demand targets (N, horizon)) of ``part``'s forecast times (all of them, or
        those at positions ``starts``: the interface ``ltsf.train`` trains through)."""
        t = self.times[part] if starts is None else self.times[part][np.asarray(starts)]
        x = np.stack([self.series[:, s - self.context:s] for s in t])
        y = np.stack([self.series[0, s:s + self.horizon] for s in t])
        return x, y


def prepare_elec(raw: dict[str, np.ndarray] | None = None, context: int = WEEK, horizon: int = DAY,
                 fractions: Sequence[float] = (0.7, 0.1, 0.2), stride: int = 1) -> ElecData:
    """Demand and temperature standardised by the **training part's** mean and standard deviation (statistics
    from later data would leak), split chronologically 70/10/20; a forecast at every ``stride`` half-hours."""
    raw = load_elecdemand() if raw is None else raw
    values = np.stack([raw["demand"], raw["temperature"]])  # (2, T)
    a, b = chronological_bounds(values.shape[1], fractions)
    mean, std = values[:, :a].mean(1), values[:, :a].std(1)
    series = ((values - mean[:, None]) / std[:, None]).astype(np.float32)
    times = {"train": window_starts(0, a, context, horizon, stride), "val": window_starts(a, b, context, horizon, stride),
             "test": window_starts(b, values.shape[1], context, horizon, stride)}
    return ElecData(series, (a, b), times, mean, std, context, horizon)


def persistence(x: np.ndarray, horizon: int) -> np.ndarray:
    """The last demand value, repeated: x (N, C, L) -> (N, horizon)."""
    return np.repeat(x[:, 0, -1:], horizon, axis=1)


def seasonal_naive(x: np.ndarray, horizon: int, season: int = WEEK) -> np.ndarray:
    """The same half-hours one ``season`` earlier: x (N, C, L >= season) -> (N, horizon)."""
    if x.shape[-1] < season:
        raise ValueError(f"the context ({x.shape[-1]}) must hold a whole season ({season})")
    start = x.shape[-1] - season
    return x[:, 0, start:start + horizon]


def moving_average(x: np.ndarray, kernel: int = 25) -> np.ndarray:
    """DLinear's trend: a centred moving average along the last axis, the ends padded by repeating the first
    and last values (as its code does)."""
    if kernel % 2 != 1:
        raise ValueError(f"kernel must be odd, got {kernel}")
    half = kernel // 2
    padded = np.concatenate([np.repeat(x[..., :1], half, -1), x, np.repeat(x[..., -1:], half, -1)], -1)
    c = np.cumsum(np.concatenate([np.zeros(x.shape[:-1] + (1,)), padded], -1), -1)
    return (c[..., kernel:] - c[..., :-kernel]) / kernel


def linear_features(x: np.ndarray, kind: str, covariate: bool = True, kernel: int = 25) -> tuple[np.ndarray, np.ndarray]:
    """Features of a linear forecaster and the offset added back to its output, x (N, C, L) ->
    (features (N, D), offset (N, 1)). ``kind``: ``"nlinear"`` (subtract the window's last demand value: NLinear's
    normalisation) or ``"dlinear"`` (demand split into a moving-average trend and the remainder, each with its
    own weights). With ``covariate`` the temperature window joins the features."""
    demand = x[:, 0]
    if kind == "nlinear":
        last = demand[:, -1:]
        feats = [demand - last]
        offset = last
    elif kind == "dlinear":
        trend = moving_average(demand, kernel)
        feats = [trend, demand - trend]
        offset = np.zeros((len(x), 1))
    else:
        raise ValueError(f"kind must be 'nlinear' or 'dlinear', not {kind!r}")
    if covariate:
        feats.append(x[:, 1])
    return np.concatenate(feats, 1), offset


@dataclasses.dataclass(frozen=True)
class LinearForecaster:
    """NLinear or DLinear fitted in closed form (ridge): one linear map from the window to the horizon."""

    kind: str
    w: np.ndarray
    b: np.ndarray
    covariate: bool

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray, kind: str = "nlinear", covariate: bool = True,
            lam: float = 1.0) -> "LinearForecaster":
        feats, offset = linear_features(x, kind, covariate)
        w, b = ridge_fit(feats, y - offset, lam)
        return cls(kind, w, b, covariate)

    def predict(self, x: np.ndarray) -> np.ndarray:
        feats, offset = linear_features(x, self.kind, self.covariate)
        return feats @ self.w + self.b + offset


ELEC_BASELINES = ("persistence", "seasonal naive (last week)", "NLinear, demand only", "DLinear, demand only",
                  "NLinear, with temperature", "DLinear, with temperature")
"""The names :func:`elec_baselines` returns, in order."""


def elec_baselines(prepared: ElecData, lam: float = 1.0) -> dict[str, dict[str, float]]:
    """Every electricity baseline's validation MSE ("val MSE") and test MSE and MAE ("MSE", "MAE"), on
    standardised demand: persistence, seasonal naive, and NLinear and DLinear each without and with the
    temperature window (:data:`ELEC_BASELINES`), fitted on the training windows; the linear ones also carry
    "fit_s", the seconds of :meth:`LinearForecaster.fit` alone (windows built beforehand). Choose among them
    on validation (:func:`best_on_validation`), report test."""
    import time

    xtr, ytr = prepared.windows("train")
    parts = {part: prepared.windows(part) for part in ("val", "test")}
    out = {}
    for name in ELEC_BASELINES:
        started = time.perf_counter()
        predict = elec_baseline(prepared, name, lam=lam, train=(xtr, ytr))
        fit_s = None if name == "persistence" or name.startswith("seasonal naive") else time.perf_counter() - started
        pv, pt = predict(parts["val"][0]), predict(parts["test"][0])
        out[name] = {"val MSE": mse(pv, parts["val"][1]), "MSE": mse(pt, parts["test"][1]),
                     "MAE": mae(pt, parts["test"][1])}
        if fit_s is not None:
            out[name]["fit_s"] = fit_s
    return out


def elec_baseline(prepared: ElecData, name: str, lam: float = 1.0,
                  train: tuple[np.ndarray, np.ndarray] | None = None) -> Callable[[np.ndarray], np.ndarray]:
    """The forecast function of the baseline ``name`` (one of :data:`ELEC_BASELINES`): x (N, C, L) -> (N, horizon);
    the linear ones fitted in closed form on the training windows (``train``, if already built)."""
    if name not in ELEC_BASELINES:
        raise ValueError(f"unknown baseline {name!r}; choose one of {ELEC_BASELINES}")
    h = prepared.horizon
    if name == "persistence":
        return lambda x: persistence(x, h)
    if name.startswith("seasonal naive"):
        return lambda x: seasonal_naive(x, h)
    xtr, ytr = prepared.windows("train") if train is None else train
    kind, covariate = name.split(",")[0].lower(), name.endswith("with temperature")
    return LinearForecaster.fit(xtr, ytr, kind, covariate=covariate, lam=lam).predict


def best_on_validation(scores: dict[str, dict[str, float]], names: Sequence[str] | None = None) -> str:
    """The name with the lowest validation MSE among ``names`` (default: all of ``scores``): the choice a
    forecaster can make without looking at the test part."""
    names = list(scores) if names is None else list(names)
    missing = [n for n in names if n not in scores or "val MSE" not in scores[n]]
    if not names or missing:
        raise ValueError(f"every name needs a 'val MSE' in scores; missing or empty: {missing or names}")
    return min(names, key=lambda n: scores[n]["val MSE"])


# --------------------------------------------------------------------------- PatchTST


@dataclasses.dataclass(frozen=True)
class PatchConfig:
    """A PatchTST-style model's sizes. ``patch_len`` / ``stride``: the tokens are windows of ``patch_len`` steps
    every ``stride`` steps (the context is padded at its end by ``stride`` repeats of the last value, as in the
    paper), so a channel has ``(context - patch_len) // stride + 2`` tokens."""

    context: int = WEEK
    horizon: int = DAY
    channels: int = 2
    patch_len: int = 16
    stride: int = 8
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 64
    dropout: float = 0.1
    fused_attention: bool = True

    def __post_init__(self):
        for name in ("context", "horizon", "channels", "patch_len", "stride", "d_model", "n_heads", "n_layers", "d_ff"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.patch_len > self.context or self.d_model % self.n_heads:
            raise ValueError(f"need patch_len <= context and d_model divisible by n_heads; got {self}")

    @property
    def n_patches(self) -> int:
        return (self.context - self.patch_len) // self.stride + 2


def patchify(x: Tensor, patch_len: int, stride: int) -> Tensor:
    """(B, C, L) -> (B, C, N, patch_len): the series padded at its end with ``stride`` copies of its last value,
    then cut into windows of ``patch_len`` every ``stride`` steps (PatchTST's padding patch)."""
    x = torch.cat([x, x[..., -1:].expand(*x.shape[:-1], stride)], -1)
    return x.unfold(-1, patch_len, stride)


class PatchTST(nn.Module):
    """PatchTST (Nie et al. 2023), supervised, at course scale:

    1. instance normalisation (RevIN without its affine parameters): each window's channels minus their mean,
       over their standard deviation; the demand forecast is mapped back with the demand channel's;
    2. patches as tokens (:func:`patchify`), each embedded linearly, plus a learned position;
    3. **channel independence**: every channel is its own sequence through the same encoder
       (:class:`~gpuformer_lib.layers.EncoderLayer`, pre-norm), so a batch of B windows of C channels is B*C
       sequences;
    4. a flatten head: all channels' patch representations -> the demand horizon. The paper's head maps each
       channel to its own future; here only demand is forecast, so its head also reads the temperature
       channel's representation (the covariate enters there, after the channel-independent encoder).
    """

    def __init__(self, config: PatchConfig):
        super().__init__()
        self.config = c = config
        self.embed = nn.Linear(c.patch_len, c.d_model)
        self.pos = nn.Parameter(torch.randn(c.n_patches, c.d_model) * 0.02)
        self.drop = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(EncoderLayer(c.d_model, c.n_heads, c.d_ff, dropout=c.dropout, activation="gelu",
                                                 fused_attention=c.fused_attention) for _ in range(c.n_layers))
        self.norm = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.channels * c.n_patches * c.d_model, c.horizon)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, C, context) -> (B, horizon) demand forecast, in x's units."""
        c = self.config
        if x.dim() != 3 or x.shape[1] != c.channels or x.shape[2] != c.context:
            raise ValueError(f"x must be (B, {c.channels}, {c.context}), got {tuple(x.shape)}")
        mean = x.mean(-1, keepdim=True)
        std = (x.var(-1, keepdim=True, unbiased=False) + 1e-5).sqrt()
        z = (x - mean) / std  # (B, C, L)
        B = z.shape[0]
        tokens = self.embed(patchify(z, c.patch_len, c.stride)) + self.pos  # (B, C, N, D)
        h = self.drop(tokens.reshape(B * c.channels, c.n_patches, c.d_model))  # channel independence
        for layer in self.layers:
            h = layer(h)
        h = self.norm(h).reshape(B, -1)  # (B, C*N*D)
        return self.head(h) * std[:, 0] + mean[:, 0]


def patch_flops(config: PatchConfig, batch_size: int) -> float:
    """Training FLOPs of one step (forward + backward = 3 x forward, 2 FLOPs a multiply-add): the patch
    embedding, each layer's projections (4 D^2 per token), feed-forward (2 D d_ff) and attention
    (2 N D for scores and 2 N D for the weighted sum per token), and the head."""
    c = config
    seqs, n = batch_size * c.channels, c.n_patches
    per_token_layer = 2 * (4 * c.d_model ** 2 + 2 * c.d_model * c.d_ff) + 4 * n * c.d_model
    forward = seqs * n * (2 * c.patch_len * c.d_model + c.n_layers * per_token_layer)
    forward += batch_size * 2 * c.channels * n * c.d_model * c.horizon
    return 3.0 * forward


def attention_share(config: PatchConfig) -> float:
    """Share of a layer's FLOPs per token spent on the (N, N) attention arithmetic: 4 N D over the total."""
    c = config
    att = 4 * c.n_patches * c.d_model
    return att / (2 * (4 * c.d_model ** 2 + 2 * c.d_model * c.d_ff) + att)


# --------------------------------------------------------------------------- the harness's task


@dataclasses.dataclass
class WindowBatch:
    """A batch of windows: x (B, C, context), y (B, horizon)."""

    x: Tensor
    y: Tensor

    def to(self, device, non_blocking: bool = False) -> "WindowBatch":
        return WindowBatch(self.x.to(device, non_blocking=non_blocking), self.y.to(device, non_blocking=non_blocking))


class ResidentSeries:
    """The whole standardised series kept once per device; batches are built there from forecast times, so a
    step copies B integers to the device instead of B windows (the data set "resident on the device")."""

    def __init__(self, series: np.ndarray, context: int, horizon: int):
        self.host = torch.as_tensor(series)
        self.context, self.horizon = context, horizon
        self._copies: dict[str, Tensor] = {}

    def on(self, device) -> Tensor:
        key = str(torch.device(device))
        if key not in self._copies:
            self._copies[key] = self.host.to(device)
        return self._copies[key]

    def gather(self, times: Tensor, device) -> WindowBatch:
        s = self.on(device)  # (C, T)
        times = times.to(s.device)
        x_idx = times[:, None] + torch.arange(-self.context, 0, device=s.device)  # (B, L)
        y_idx = times[:, None] + torch.arange(self.horizon, device=s.device)  # (B, H)
        return WindowBatch(s[:, x_idx].transpose(0, 1), s[0, y_idx])


@dataclasses.dataclass
class TimesBatch:
    """Forecast times only; ``.to(device)`` gathers the windows from the device's resident copy."""

    times: Tensor
    resident: ResidentSeries

    def to(self, device, non_blocking: bool = False) -> WindowBatch:
        return self.resident.gather(self.times, device)


def forecast_loss(model: nn.Module, batch: WindowBatch) -> tuple[Tensor, int]:
    """Mean squared error of the demand forecast (standardised units), and the number of windows."""
    pred = model(batch.x)
    return F.mse_loss(pred.float(), batch.y), batch.y.shape[0]


@torch.no_grad()
def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray, device, batch_size: int = 1024) -> dict[str, float]:
    """MSE and MAE of ``model``'s forecasts of ``y`` from ``x`` (float32, in batches)."""
    preds = []
    for i in range(0, len(x), batch_size):
        preds.append(model(torch.as_tensor(x[i:i + batch_size], device=device)).float().cpu().numpy())
    pred = np.concatenate(preds)
    return {"MSE": mse(pred, y), "MAE": mae(pred, y)}


def forecasting_task(prepared: ElecData, config: PatchConfig, *, batch_size: int, budget: case_study.Budget,
                     lr: float = 1e-3, tolerance: float = 0.02, evaluations: int = 4, val_windows: int | None = None,
                     name: str = "electricity demand, PatchTST") -> case_study.Task:
    """The harness's task: :class:`PatchTST` with ``config`` (fused attention from each row's plan), MSE on
    standardised demand, budget counted in training windows; quality the validation MSE (lower is better),
    kept within ``tolerance``. Option ``resident``: batches gathered from a device-resident copy of the
    series (:class:`ResidentSeries`) instead of stacked on the host and copied."""
    times = prepared.times["train"]
    xv, yv = prepared.windows("val")
    if val_windows:
        pick = np.linspace(0, len(xv) - 1, val_windows).round().astype(int)
        xv, yv = xv[pick], yv[pick]
    resident = ResidentSeries(prepared.series, prepared.context, prepared.horizon)

    def build(setting: case_study.Setting) -> nn.Module:
        return PatchTST(dataclasses.replace(config, fused_attention=setting.plan.fused_attention))

    def batches(setting: case_study.Setting, seed: int, epoch: int):
        g = torch.Generator().manual_seed(1000 * seed + epoch)
        order = torch.as_tensor(times)[torch.randperm(len(times), generator=g)]
        for i in range(0, len(order) - batch_size + 1, batch_size):  # whole batches only: fixed shapes
            chosen = order[i:i + batch_size]
            if setting.option("resident", False):
                yield TimesBatch(chosen, resident)
            else:
                yield resident.gather(chosen, "cpu")  # stacked on the host, copied whole each step

    def count(batch) -> int:
        return int(batch.times.shape[0] if isinstance(batch, TimesBatch) else batch.y.shape[0])

    return case_study.Task(
        name=name, build_model=build, batches=batches, loss_fn=forecast_loss, count=count,
        evaluate=lambda model, device: evaluate(model, xv, yv, device)["MSE"], quality_name="validation MSE",
        higher_is_better=False, tolerance=tolerance, budget=budget, lr=lr, weight_decay=0.01, warmup=0.1,
        grad_clip=1.0, evaluations=evaluations, flops=lambda batch: patch_flops(config, count(batch)),
        unit="windows")


# --------------------------------------------------------------------------- chapter 15's sizes, predictions, diagnosis


@dataclasses.dataclass(frozen=True)
class CasePlan:
    """How much chapter 15 trains on a device: the budget of training windows of every row of the table, the
    seeds per row, the tolerance (validation MSE), the evaluations per run, the validation windows the
    quality is measured on (None: all), the batch, the learning rate and the model."""

    budget_windows: int
    seeds: tuple[int, ...]
    tolerance: float
    evaluations: int
    val_windows: int | None
    batch_size: int
    lr: float
    config: PatchConfig
    returns_steps: int
    """Training steps of the Transformer on stock returns (section 2)."""


def case_plan(profile, preset) -> CasePlan:
    """Chapter 15's plan for ``profile`` (``profiles.DeviceProfile``) and ``preset`` (``device.SizePreset``).

    - rehearsal (a GPU profile at toy sizes on the CPU): only the code paths matter: 640 windows, one seed,
      2 evaluations, a one-layer model;
    - ``cpu``: 6,400 windows a row (about half an epoch of the 11,881 training windows; about 40 ms a step of
      64 windows for the baseline on a 2-core CPU, so a row takes a few seconds), one seed, tolerance 0.01 MSE
      (about twice the spread of two seeds, 0.0056 when this was set; the chapter measures it again); patches of 24
      half-hours (half a day) without overlap: 15 tokens a channel;
    - ``gpu-small`` (T4): 120,000 windows (about 10 epochs), seeds 0-1, width 64, PatchTST's patches of 16
      every 8 steps (42 tokens), tolerance 0.01;
    - ``gpu`` (A100/H100): 240,000 windows (about 20 epochs), seeds 0-2, width 128, 3 layers, tolerance 0.01.
    """
    from gpuformer_lib.device import PRESET_NAMES

    if getattr(preset, "name", None) not in PRESET_NAMES:
        raise ValueError(f"preset must be a device.SizePreset named one of {PRESET_NAMES}, got {preset!r}")
    if getattr(profile, "rehearsal", False) or getattr(preset, "toy", False):
        return CasePlan(640, (0,), 0.05, 2, 200, 64, 3e-3,
                        PatchConfig(patch_len=24, stride=24, d_model=16, n_heads=2, n_layers=1, d_ff=32), 20)
    if preset.name == "cpu":
        return CasePlan(6_400, (0,), 0.01, 4, 400, 64, 3e-3,
                        PatchConfig(patch_len=24, stride=24, d_model=32, n_heads=4, n_layers=2, d_ff=64), 150)
    if preset.name == "gpu-small":
        return CasePlan(120_000, (0, 1), 0.01, 8, None, 128, 1e-3,
                        PatchConfig(patch_len=16, stride=8, d_model=64, n_heads=8, n_layers=3, d_ff=128), 2_000)
    return CasePlan(240_000, (0, 1, 2), 0.01, 8, None, 256, 1e-3,
                    PatchConfig(patch_len=16, stride=8, d_model=128, n_heads=16, n_layers=3, d_ff=256), 2_000)


def encoder_step_seconds(n_tokens: int, *, d_model: int = 32, n_heads: int = 4, n_layers: int = 2,
                         sequences: int = 128, device="cpu", repeats: int = 3, fused_attention: bool = True) -> float:
    """Measured seconds of one forward + backward pass of ``n_layers`` encoder layers over ``sequences``
    sequences of ``n_tokens`` tokens (the median of ``repeats`` after one warm-up): the cost of attention as
    the patch length sets the token count."""
    import statistics
    import time

    from gpuformer_lib import bench

    torch.manual_seed(0)
    layers = nn.Sequential(*[EncoderLayer(d_model, n_heads, 2 * d_model, dropout=0.0, fused_attention=fused_attention)
                             for _ in range(n_layers)]).to(device)
    x = torch.randn(sequences, n_tokens, d_model, device=device, requires_grad=True)
    times = []
    for i in range(repeats + 1):
        bench.synchronize(device)
        start = time.perf_counter()
        layers(x).sum().backward()
        bench.synchronize(device)
        if i:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def tokens_for(context: int, patch_len: int) -> int:
    """Tokens a channel's window becomes with patches of ``patch_len`` and no overlap (stride = patch length),
    PatchTST's padding patch included; ``patch_len`` 1 is a token per time step (no padding patch)."""
    if not 1 <= patch_len <= context:
        raise ValueError(f"patch_len must lie in [1, {context}], got {patch_len}")
    return context if patch_len == 1 else (context - patch_len) // patch_len + 2


def attention_flops(n_tokens: int, d_model: int, sequences: int, n_layers: int) -> float:
    """Training FLOPs of attention's two (N, N) matrix products (scores and weighted sum) over all layers,
    forward + backward (3x): 3 * 2 * 2 N^2 D per sequence and layer. Grows with the square of the tokens."""
    return 3.0 * 4 * n_tokens ** 2 * d_model * sequences * n_layers


@functools.lru_cache(maxsize=16)
def _step_work(config: PatchConfig, batch_size: int):
    """``predict.step_work`` of one float32 training step of :class:`PatchTST` (counted once per size)."""
    from gpuformer_lib import predict

    torch.manual_seed(0)
    model = PatchTST(config)
    x = torch.randn(batch_size, config.channels, config.context)
    y = torch.randn(batch_size, config.horizon)

    def step():
        F.mse_loss(model(x), y).backward()

    return predict.step_work(step, fmt="fp32", optimizer_numels=[p.numel() for p in model.parameters()])


def step_prediction(config: PatchConfig, batch_size: int, gpu: str, dtype: torch.dtype):
    """One eager training step of :class:`PatchTST` (``config``, ``batch_size`` windows, MSE, foreach AdamW)
    predicted for ``gpu`` (a datasheet name) with matrix products in ``dtype`` by the course's predictor
    (``predict.step_work``: the step's kernels, FLOPs and bytes counted from a run of the real step on this
    CPU at that size; ``predict.predict_step``). Returns a ``predict.Prediction``: its ``bound`` says whether
    arithmetic, memory traffic or the host's launches set the time."""
    from gpuformer_lib import predict

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    fmt = predict.format_of(dtype)
    work = _step_work(config, batch_size)
    work = dataclasses.replace(work, fmt=fmt, matrix_bytes=work.matrix_bytes * predict.ACTIVATION_BYTES[fmt] / 4)
    return predict.predict_step(work, gpu)


def gpu_step_verdict(config: PatchConfig, batch_size: int, gpu_name: str, measured_s: float) -> str:
    """Chapter 15's words for a page run on a GPU: the float32 step the course's predictor gives this GPU
    (:func:`step_prediction`) beside the step the page measured, or why there is none (a GPU the datasheet
    table does not know)."""
    from gpuformer_lib import gpu_view

    if not measured_s > 0:
        raise ValueError(f"measured_s must be a time > 0, got {measured_s!r}")
    try:
        name = gpu_view.datasheet(gpu_name).name
    except ValueError:
        return (f"this GPU ({gpu_name}) is not in the course's datasheet table, so the predictor has no step for it; "
                f"its measured baseline step is {measured_s * 1e3:.2f} ms")
    here = step_prediction(config, batch_size, name, torch.float32)
    return (f"on this GPU the float32 step is predicted at {here.seconds * 1e3:.2f} ms ({here.bound}-bound, the "
            f"course's predictor) and measured at {measured_s * 1e3:.2f} ms; a CPU is the right device for this "
            "model where its step is shorter than that")


def top_level_operators(events, steps: int) -> float:
    """Operator calls per step that are not inside another ``aten::`` operator, from a profile's raw events
    (``prof.events()``, which keep their parents): ``aten::linear`` counts once, not again for the ``aten::t``
    and ``aten::addmm`` it calls. On a GPU each such call launches about one kernel or a few (views launch none),
    so it is the count a launch latency multiplies. Backward operators under autograd's ranges count too."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")

    def nested(e) -> bool:
        parent = getattr(e, "cpu_parent", None)
        while parent is not None:
            if parent.name.startswith("aten::"):
                return True
            parent = getattr(parent, "cpu_parent", None)
        return False

    return sum(1 for e in events if e.name.startswith("aten::") and not nested(e)) / steps


def dp_allreduce_prediction(n_params: int, gpus: int = 8, link: str = "H100 NVLink", bytes_per_grad: int = 4) -> float:
    """Predicted seconds of one data-parallel step's gradient all-reduce (``n_params`` gradients of
    ``bytes_per_grad`` bytes) over ``gpus`` GPUs of one node: the course's predictor
    (``predict.allreduce_seconds``: NCCL's base and per-step latencies and the fastest protocol) on the H100's
    NVLink (``predict.nvlink_bus_bandwidth``), the one link it prices."""
    from gpuformer_lib import predict

    if link != "H100 NVLink":
        raise ValueError(f"link must be 'H100 NVLink' (the predictor's), got {link!r}")
    return predict.allreduce_seconds(n_params * bytes_per_grad, gpus, predict.nvlink_bus_bandwidth("H100 SXM")[0])


_FIXES = (  # profile category (bench.time_by_category) -> words of the table rows that address it, in order
    ("matrix products", ("autocast", "TF32")),
    ("attention", ("fused attention",)),
    ("optimizer", ("fused AdamW",)),
    ("element-wise, norms, copies", ("torch.compile",)),
    # Only a GPU's profile has a "copies" category (host-to-device memcpy kernels, bench.kernel_category); a CPU's
    # operators never fall in it, so on a CPU this entry cannot match.
    ("copies", ("resident",)),
)


def fix_for(category: str, row_names: Sequence[str]) -> str | None:
    """The first row of chapter 15's table (by name) whose acceleration addresses profile ``category``; None
    when no row does (or the category is one no row targets, e.g. the loss)."""
    return case_study.fixing_row(category, row_names, _FIXES, strict=False)


def verdict(model_score: float, baseline_score: float, *, margin: float = 0.01) -> str:
    """'beats', 'ties with' or 'loses to': the model's error (lower is better) against the baseline's, a tie
    when they differ by less than ``margin`` (relative) of the baseline's."""
    if not (baseline_score > 0 and model_score >= 0):
        raise ValueError(f"scores must be errors >= 0 (baseline > 0), got {model_score!r}, {baseline_score!r}")
    ratio = model_score / baseline_score
    return "beats" if ratio < 1 - margin else "loses to" if ratio > 1 + margin else "ties with"


@dataclasses.dataclass(frozen=True)
class GraphTiming:
    """One training step of the task's model timed eagerly and with CUDA graphs (``torch.compile`` in
    ``mode="reduce-overhead"``), same plan otherwise; or why it was not measured."""

    eager_s: float | None
    graphed_s: float | None
    reason: str | None = None

    @property
    def speedup(self) -> float | None:
        return None if self.eager_s is None or self.graphed_s is None else self.eager_s / self.graphed_s


def graph_step_timing(task: case_study.Task, device, plan=None, *, steps: int = 20, warmup: int = 3) -> GraphTiming:
    """Time ``task``'s training step (one fixed batch of its first epoch, on ``device``) eagerly and replayed as
    CUDA graphs, as chapter 10's ladder does (``speed.apply_plan`` with compile + cuda_graphs, then
    ``speed.make_train_step(cuda_graphs=True)``). Every batch of this task has the same shape, which a graph
    needs. On a device without CUDA, returns the reason instead (nothing is timed)."""
    from gpuformer_lib import bench, speed

    device = torch.device(device)
    if device.type != "cuda":
        return GraphTiming(None, None, f"CUDA graphs need a CUDA device; this page runs on {device.type}")
    plan = plan or speed.SpeedPlan(dtype=None, tf32=False, fused_attention=True, check_token_ids=False)
    setting = case_study.Setting(plan=plan)
    batch = next(iter(task.batches(setting, 0, 0))).to(device)
    times = {}
    for name, p in (("eager", plan), ("graphed", dataclasses.replace(plan, compile=True, cuda_graphs=True))):
        torch.manual_seed(0)
        model = speed.apply_plan(task.build_model(case_study.Setting(plan=p)).to(device), p, device)
        optimizer = speed.make_adamw(model.parameters(), p, lr=task.lr)
        step = speed.make_train_step(model, optimizer, task.loss_fn, dtype=p.dtype, scaler=speed.grad_scaler(p, device),
                                     tf32=p.tf32, cuda_graphs=p.cuda_graphs, grad_clip=task.grad_clip)
        times[name] = bench.time_fn(lambda: step([batch]), device=device, warmup=warmup, repeats=steps).median
    return GraphTiming(times["eager"], times["graphed"])
