"""The standard long-horizon forecasting benchmark, ETTh1, as the papers run it, so that chapter 15's models can
stand beside their published rows.

ETTh1 (Zhou et al. 2021) is two years of hourly readings of one electricity transformer: six load features and
the oil temperature, seven channels. Informer, LTSF-Linear (Zeng et al. 2023) and PatchTST (Nie et al. 2023) all
split it the same way, and a number is only comparable under the same rules:

- **split** (:func:`split`): the first 12 months train, the next 4 validate, the 4 after that test (30-day
  months: 8,640 / 2,880 / 2,880 hours; the last 3,020 rows are not used). A validation or test window may look
  back into the part before it, so its first forecast starts at the part's first hour;
- **scale**: every channel standardised with the training part's mean and (population) standard deviation; the
  errors are reported on that scale, averaged over the seven channels, the horizon and every window (stride 1);
- **windows**: look-back 336 hours, horizon 96 (the rows this chapter reproduces).

The models: :class:`NLinear` and :class:`DLinear` (one linear map from the look-back to the horizon, shared by the
channels, after subtracting the window's last value, or after splitting a moving-average trend off), their
least-squares optimum (:func:`least_squares_nlinear`), and :class:`ChannelPatchTST` (PatchTST's channel-
independent encoder with a head per channel's own future). :func:`train` trains with early stopping on the
validation MSE and keeps the best weights; :func:`evaluate` scores every test window; :func:`block_bootstrap`
puts an interval on a test error, or on the difference of two models' errors over the same windows, by resampling
blocks of consecutive windows (neighbouring windows share most of their targets, so windows are not independent).

Leaves out: chapter 15's own electricity-demand task (``forecasting``), the harness of the case studies
(``case_study``).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpuformer_lib.forecasting import PatchConfig, patchify
from gpuformer_lib.intervals import Interval
from gpuformer_lib.layers import EncoderLayer

HOURS_PER_MONTH = 30 * 24
"""The benchmark's month: 30 days of hours (Informer's data loader, which the later papers reuse)."""
MONTHS = (12, 4, 4)
"""Months of training, validation and test data."""
CHANNELS = ("HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT")
"""ETTh1's seven columns after the date: six loads (high, middle, low; useful and useless) and oil temperature."""
CONTEXT = 336
HORIZON = 96


def load(path=None) -> tuple[list[str], np.ndarray]:
    """ETTh1's dates and its (17,420, 7) values (float64, columns :data:`CHANNELS`), from the course's data
    folder (``data.data_path('etth1')``, checksum verified) or ``path``."""
    import csv

    from gpuformer_lib.data import data_path

    path = path or data_path("etth1")
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    if tuple(header[1:]) != CHANNELS:
        raise ValueError(f"{path}: expected the columns date, {', '.join(CHANNELS)}; got {header}")
    values = np.array([[float(v) for v in r[1:]] for r in body], dtype=np.float64)
    return [r[0] for r in body], values


@dataclasses.dataclass(frozen=True)
class Split:
    """ETTh1 cut as the benchmark cuts it: each part standardised with the training part's statistics.

    ``parts[name]`` is the (T, C) array a part's windows are read from; a validation or test part starts
    ``context`` hours before its first forecast."""

    parts: dict[str, np.ndarray]
    mean: np.ndarray
    std: np.ndarray
    context: int
    horizon: int

    def n_windows(self, part: str) -> int:
        return len(self.parts[part]) - self.context - self.horizon + 1

    def windows(self, part: str, starts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Windows of ``part`` (every one, stride 1, or those starting at ``starts``): x (N, C, context) and
        y (N, C, horizon), float32, channels first as the models take them."""
        series = self.parts[part]
        if starts is None:
            starts = np.arange(self.n_windows(part))
        starts = np.asarray(starts)
        if len(starts) and (starts.min() < 0 or starts.max() >= self.n_windows(part)):
            raise IndexError(f"window starts must be in [0, {self.n_windows(part)}) for {part!r}")
        idx = starts[:, None] + np.arange(self.context + self.horizon)  # (N, L + H)
        w = series[idx].transpose(0, 2, 1).astype(np.float32)  # (N, C, L + H)
        return w[..., :self.context], w[..., self.context:]


def split(values: np.ndarray, context: int = CONTEXT, horizon: int = HORIZON,
          months: Sequence[int] = MONTHS) -> Split:
    """The benchmark's split of ``values`` (T, C): train, val and test borders at 12, 16 and 20 months of
    30 days; the later parts reach back ``context`` hours; standardised with the training part's mean and
    population standard deviation (what scikit-learn's StandardScaler, used by the papers' code, computes)."""
    values = np.asarray(values, dtype=np.float64)
    ends = np.cumsum([m * HOURS_PER_MONTH for m in months])
    if values.ndim != 2 or len(values) < ends[-1]:
        raise ValueError(f"values must be (T, C) with T >= {ends[-1]} hours, got {values.shape}")
    if context < 1 or horizon < 1 or context + horizon > months[1] * HOURS_PER_MONTH + context:
        raise ValueError(f"context and horizon must be >= 1 and a window must fit a part; got {context}, {horizon}")
    train = values[:ends[0]]
    mean, std = train.mean(0), train.std(0)
    if np.any(std == 0):
        raise ValueError("a channel is constant over the training part: it cannot be standardised")
    z = (values - mean) / std
    parts = {"train": z[:ends[0]], "val": z[ends[0] - context:ends[1]], "test": z[ends[1] - context:ends[2]]}
    return Split(parts, mean, std, context, horizon)


def scored_windows(n: int, batch_size: int, drop_last: bool) -> int:
    """How many of ``n`` test windows a loop over batches of ``batch_size`` scores: all of them, or, with
    ``drop_last`` (as the LTSF-Linear and PatchTST code set for their test loaders), only whole batches."""
    if n < 0 or batch_size < 1:
        raise ValueError(f"need n >= 0 and batch_size >= 1, got {n}, {batch_size}")
    return (n // batch_size) * batch_size if drop_last else n


# --------------------------------------------------------------------------- models


class NLinear(nn.Module):
    """LTSF-Linear's NLinear: subtract each channel's last look-back value, one linear map from the look-back
    to the horizon shared by all channels, add the value back. x (B, C, L) -> (B, C, H)."""

    def __init__(self, context: int = CONTEXT, horizon: int = HORIZON):
        super().__init__()
        self.linear = nn.Linear(context, horizon)

    def forward(self, x: Tensor) -> Tensor:
        last = x[..., -1:]  # (B, C, 1)
        return self.linear(x - last) + last  # (B, C, L) @ (L, H) -> (B, C, H)


def trend(x: Tensor, kernel: int = 25) -> Tensor:
    """DLinear's trend: a centred moving average over the last axis, the ends padded by repeating the first and
    last values (equal to ``forecasting.moving_average``, its NumPy twin)."""
    if kernel % 2 != 1:
        raise ValueError(f"kernel must be odd, got {kernel}")
    half = kernel // 2
    padded = torch.cat([x[..., :1].expand(*x.shape[:-1], half), x, x[..., -1:].expand(*x.shape[:-1], half)], -1)
    return padded.unfold(-1, kernel, 1).mean(-1)


class DLinear(nn.Module):
    """LTSF-Linear's DLinear: the look-back split into a moving-average trend and the remainder, one linear map
    for each, shared by all channels, the two forecasts added. x (B, C, L) -> (B, C, H)."""

    def __init__(self, context: int = CONTEXT, horizon: int = HORIZON, kernel: int = 25):
        super().__init__()
        self.kernel = kernel
        self.linear_trend = nn.Linear(context, horizon)
        self.linear_seasonal = nn.Linear(context, horizon)

    def forward(self, x: Tensor) -> Tensor:
        t = trend(x, self.kernel)
        return self.linear_trend(t) + self.linear_seasonal(x - t)


def least_squares_nlinear(split_: Split, ridge: float = 1e-6) -> NLinear:
    """The NLinear whose map minimises the training MSE exactly (least squares over every training window and
    channel, a ``ridge`` times the mean diagonal added to the normal equations only for conditioning): the
    optimum that training NLinear by gradient descent approaches."""
    x, y = split_.windows("train")
    last = x[..., -1:]
    X = torch.as_tensor((x - last).reshape(-1, split_.context), dtype=torch.float64)  # (N*C, L)
    Y = torch.as_tensor((y - last).reshape(-1, split_.horizon), dtype=torch.float64)  # (N*C, H)
    Xb = torch.cat([X, torch.ones(len(X), 1, dtype=torch.float64)], 1)  # bias as a last column
    gram = Xb.T @ Xb  # (L+1, N*C) @ (N*C, L+1)
    gram += ridge * gram.diagonal().mean() * torch.eye(len(gram), dtype=torch.float64)
    W = torch.linalg.solve(gram, Xb.T @ Y)  # (L+1, H)
    model = NLinear(split_.context, split_.horizon)
    with torch.no_grad():
        model.linear.weight.copy_(W[:-1].T.float())
        model.linear.bias.copy_(W[-1].float())
    return model


ETTH1_PATCHTST = PatchConfig(context=CONTEXT, horizon=HORIZON, channels=len(CHANNELS), patch_len=16, stride=8,
                             d_model=16, n_heads=4, n_layers=3, d_ff=128, dropout=0.3)
"""PatchTST's sizes for ETTh1 (the paper's scripts use a small model on this small data set): chapter 15's
:class:`~gpuformer_lib.forecasting.PatchConfig`, whose ``channels`` here are the benchmark's seven."""


class ChannelPatchTST(nn.Module):
    """PatchTST (Nie et al. 2023) for a multivariate benchmark: each channel of each window normalised by its
    own mean and standard deviation (RevIN without affine parameters), cut into patches
    (:func:`~gpuformer_lib.forecasting.patchify`, with its padding patch), encoded alone by the shared
    Transformer encoder (channel independence), and its representation flattened into a linear head to the
    channel's own horizon, mapped back to the channel's scale. x (B, C, L) -> (B, C, H).

    Where chapter 15's :class:`~gpuformer_lib.forecasting.PatchTST` forecasts one channel from all of them,
    this one forecasts every channel from itself, as the paper does; the sizes are the same
    :class:`~gpuformer_lib.forecasting.PatchConfig`. The course's encoder layer is pre-norm with LayerNorm;
    the paper's is post-norm with BatchNorm and adds the previous layer's attention scores to the next
    (residual attention). The page measures what that costs against the published row rather than assuming
    it."""

    def __init__(self, config: PatchConfig = ETTH1_PATCHTST):
        super().__init__()
        self.config = c = config
        self.embed = nn.Linear(c.patch_len, c.d_model)
        self.pos = nn.Parameter(torch.empty(c.n_patches, c.d_model).uniform_(-0.02, 0.02))
        self.drop = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(EncoderLayer(c.d_model, c.n_heads, c.d_ff, dropout=c.dropout, activation="gelu",
                                                 fused_attention=c.fused_attention) for _ in range(c.n_layers))
        self.norm = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.n_patches * c.d_model, c.horizon)

    def forward(self, x: Tensor) -> Tensor:
        c = self.config
        if x.dim() != 3 or x.shape[1:] != (c.channels, c.context):
            raise ValueError(f"x must be (B, {c.channels}, {c.context}), got {tuple(x.shape)}")
        B = x.shape[0]
        mean = x.mean(-1, keepdim=True)
        std = (x.var(-1, keepdim=True, unbiased=False) + 1e-5).sqrt()
        patches = patchify((x - mean) / std, c.patch_len, c.stride)  # (B, C, N, P)
        h = self.drop(self.embed(patches) + self.pos).reshape(B * c.channels, c.n_patches, c.d_model)  # channel indep.
        for layer in self.layers:
            h = layer(h)
        h = self.norm(h).reshape(B, c.channels, c.n_patches * c.d_model)  # (B, C, N*D)
        return self.head(h) * std + mean  # (B, C, N*D) @ (N*D, H) -> (B, C, H)


# --------------------------------------------------------------------------- training and scoring


@torch.no_grad()
def predict(model: nn.Module, x: np.ndarray, batch_size: int = 512) -> np.ndarray:
    """``model``'s forecasts of the windows ``x`` (N, C, L), in evaluation mode, as float64 (N, C, H) (or what
    shape the model forecasts), computed on the device of the model's parameters."""
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        out = [model(torch.as_tensor(x[i:i + batch_size], device=device)).double().cpu().numpy()
               for i in range(0, len(x), batch_size)]
    finally:
        model.train(was)
    if not out:
        raise ValueError("no windows to forecast")
    return np.concatenate(out)


def window_errors(model: nn.Module, split_: Split, part: str) -> tuple[np.ndarray, np.ndarray]:
    """Squared and absolute error of every window of ``part``, each averaged over channels and horizon: (N,),
    (N,), in window order (what :func:`block_bootstrap` resamples). ``split_``: a :class:`Split`, or any data
    with ``windows(part)`` (chapter 15's ``forecasting.ElecData``)."""
    x, y = split_.windows(part)
    err = (predict(model, x) - y).reshape(len(y), -1)
    return (err ** 2).mean(1), np.abs(err).mean(1)


def evaluate(model: nn.Module, split_: Split, part: str = "test") -> dict[str, float]:
    """MSE and MAE over every window of ``part``, channels and horizon, on the standardised scale: the
    benchmark's metrics."""
    se, ae = window_errors(model, split_, part)
    return {"MSE": float(se.mean()), "MAE": float(ae.mean()), "windows": int(len(se))}


@dataclasses.dataclass
class Trained:
    """What :func:`train` returns: the model with its best validation weights, the validation MSE after each
    epoch, the epoch kept, the optimizer steps taken, the wall time and the learning rate each epoch started at."""

    model: nn.Module
    val_mse: list[float]
    best_epoch: int
    steps: int
    seconds: float
    epoch_lrs: list[float] = dataclasses.field(default_factory=list)

    @property
    def stopped_early(self) -> bool:
        """Whether validation stopped improving before the epochs ran out (it converged on validation)."""
        return self.best_epoch < len(self.val_mse) - 1


def train(model: nn.Module, split_: Split, *, epochs: int, batch_size: int, lr: float, patience: int, seed: int,
          schedule: str = "halve", max_steps_per_epoch: int | None = None, val_windows: int | None = None,
          progress: bool = True, desc: str = "") -> Trained:
    """Adam on the training windows' MSE, shuffled each epoch (``seed``), validated after each epoch; stops
    after ``patience`` epochs without a lower validation MSE and restores the best epoch's weights.

    ``schedule``: ``'halve'`` (LTSF-Linear's ``type1``: the first two epochs at ``lr``, then half the rate after
    each epoch, as its ``adjust_learning_rate(optimizer, epoch + 1, ...)`` computes ``lr * 0.5 ** (epoch - 1)``)
    or ``'onecycle'`` (a one-cycle schedule over all planned steps, 30 % warm-up: PatchTST's code offers it as
    ``--lradj TST``; its ETTh1 script runs the default ``type3``, 100 epochs). ``max_steps_per_epoch`` shrinks a
    run for tests and CI; ``val_windows`` validates on that many evenly spaced validation windows instead of all
    (early stopping only: :func:`evaluate` scores every window).

    ``split_`` is a :class:`Split` or any data with ``n_windows(part)`` and ``windows(part, starts)`` (chapter
    15's own ``forecasting.ElecData``); the batches go to the device of the model's parameters."""
    from tqdm.auto import tqdm

    if epochs < 1 or batch_size < 1 or patience < 1 or lr <= 0:
        raise ValueError(f"need epochs, batch_size, patience >= 1 and lr > 0; got {epochs}, {batch_size}, "
                         f"{patience}, {lr}")
    if schedule not in ("halve", "onecycle"):
        raise ValueError(f"schedule must be 'halve' or 'onecycle', got {schedule!r}")
    n = split_.n_windows("train")
    per_epoch = n // batch_size if max_steps_per_epoch is None else min(n // batch_size, max_steps_per_epoch)
    if per_epoch < 1:
        raise ValueError(f"batch_size {batch_size} is larger than the {n} training windows")
    vx, vy = split_.windows("val", None if val_windows is None else
                            np.linspace(0, split_.n_windows("val") - 1, val_windows).round().astype(int))
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    device = next(model.parameters()).device
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = (torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=epochs * per_epoch, pct_start=0.3)
             if schedule == "onecycle" else None)
    best, best_state, best_epoch, history, steps = math.inf, None, -1, [], 0
    start = time.perf_counter()
    bar = tqdm(total=epochs * per_epoch, desc=desc or type(model).__name__, disable=not progress, leave=False)
    epoch_lrs = []
    for epoch in range(epochs):
        model.train()
        epoch_lrs.append(opt.param_groups[0]["lr"])
        order = rng.permutation(n)
        for i in range(per_epoch):
            x, y = split_.windows("train", order[i * batch_size:(i + 1) * batch_size])
            loss = F.mse_loss(model(torch.as_tensor(x, device=device)), torch.as_tensor(y, device=device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
            steps += 1
            bar.update(1)
        if schedule == "halve" and epoch >= 1:  # LTSF-Linear's type1: lr * 0.5 ** epoch for the next epoch
            for group in opt.param_groups:
                group["lr"] = lr * 0.5 ** epoch
        val = float(((predict(model, vx) - vy) ** 2).mean())
        history.append(val)
        bar.set_postfix(val_mse=f"{val:.4f}")
        if val < best:
            best, best_epoch, best_state = val, epoch, copy.deepcopy(model.state_dict())
        elif epoch - best_epoch >= patience:
            break
    bar.close()
    model.load_state_dict(best_state)
    model.eval()
    return Trained(model, history, best_epoch, steps, time.perf_counter() - start, epoch_lrs)


# --------------------------------------------------------------------------- intervals


def block_bootstrap(errors: np.ndarray, other: np.ndarray | None = None, *, block: int = 2 * HORIZON,
                    draws: int = 2000, level: float = 0.95, seed: int = 0) -> Interval:
    """A moving-block bootstrap interval on the mean of ``errors`` (one number per window, in time order), or,
    with ``other``, on the mean of ``errors - other`` over the same windows (a paired comparison: an interval
    that excludes 0 says which model wins on this test period).

    Blocks of ``block`` consecutive windows keep the dependence between neighbours (windows fewer than a
    horizon apart share targets); the default spans two horizons."""
    e = np.asarray(errors, dtype=np.float64)
    if other is not None:
        o = np.asarray(other, dtype=np.float64)
        if o.shape != e.shape:
            raise ValueError(f"paired errors need the same windows: {e.shape} against {o.shape}")
        e = e - o
    if e.ndim != 1 or len(e) < 2 * block:
        raise ValueError(f"need a 1-d series of at least two blocks ({2 * block} windows), got {e.shape}")
    if not 0 < level < 1 or draws < 100:
        raise ValueError(f"need 0 < level < 1 and draws >= 100, got {level}, {draws}")
    rng = np.random.default_rng(seed)
    k = math.ceil(len(e) / block)
    c = np.concatenate([[0.0], np.cumsum(e)])
    starts = rng.integers(0, len(e) - block + 1, size=(draws, k))
    sums = (c[starts + block] - c[starts]).sum(1)  # each draw: k whole blocks
    means = sums / (k * block)
    tail = (1 - level) / 2
    return Interval(float(e.mean()), float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail)), level)


def seed_summary(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation of a metric over seeds (the standard deviation 0 for one seed)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        raise ValueError("no values")
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0


def within(ours: float, published: float, rel: float = 0.10) -> bool:
    """Whether ``ours`` is within ``rel`` of the published value (the issue's reproduction target)."""
    if published <= 0:
        raise ValueError(f"a published error must be positive, got {published}")
    return abs(ours - published) <= rel * published

