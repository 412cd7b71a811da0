"""Comparing optimizers fairly: a learning-rate grid search whose optimum is inside the grid, over seeds.

An optimizer comparison is only as good as the learning rates it gives each optimizer. A grid whose
best point sits at its edge says nothing about the optimizer (the optimum may lie beyond it), and one
seed cannot tell a difference from noise. :func:`lr_grid_search` therefore

- runs every learning rate of a log-spaced grid (:func:`log_grid`) with several seeds,
- scores each learning rate by the mean over seeds of the final loss (the mean of the last ``tail``
  losses; a run that diverged scores infinity),
- and, while the best learning rate sits at an edge of the grid, adds the next point beyond that edge
  (one grid step further) until the best is inside, the next point diverges or scores worse (which
  brackets the optimum), or ``max_extensions`` is spent; :attr:`GridSearch.at_edge` then says so.

:func:`train_repeating_patterns` is the small training run the course compares optimizers with: a
decoder-only Transformer on :func:`gpuformer_lib.data.repeating_patterns`, the same batches for every
optimizer and learning rate of one seed.

Leaves out: schedules inside a run (constant learning rate), and other hyperparameters (one axis only).
Method: the usual practice of tuning each optimizer's learning rate on a log scale (e.g. Wilson et al.
2017, "The Marginal Value of Adaptive Gradient Methods in Machine Learning"; Choi et al. 2019, "On
Empirical Comparisons of Optimizers for Deep Learning", who show that rankings change with the tuning).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Callable, Sequence

import torch
import torch.nn.functional as F


def log_grid(center: float, n: int = 5, factor: float = 3.0) -> tuple[float, ...]:
    """``n`` learning rates spaced by ``factor`` on a log scale, centred on ``center`` (n odd) or just
    below it (n even): ``log_grid(1e-3, 5, 3)`` is about (1.1e-4, 3.3e-4, 1e-3, 3e-3, 9e-3)."""
    for name, value in (("center", center), ("factor", factor)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    if factor <= 1:
        raise ValueError(f"factor must be > 1 (the ratio of neighbouring learning rates), got {factor!r}")
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 2:
        raise ValueError(f"n must be an int >= 2, got {n!r}")
    first = -(int(n) // 2)
    return tuple(float(center) * float(factor) ** (first + i) for i in range(int(n)))


@dataclasses.dataclass(frozen=True)
class GridSearch:
    """The result of :func:`lr_grid_search` for one optimizer."""

    name: str
    lrs: tuple[float, ...]
    """Every learning rate run, ascending (the grid given, plus any added beyond its edges)."""
    finals: dict[float, tuple[float, ...]]
    """Per learning rate, the final loss of each seed (``inf`` for a run that diverged)."""
    curves: dict[float, tuple[tuple[float, ...], ...]]
    """Per learning rate, the loss curve of each seed."""
    best_lr: float
    at_edge: bool
    """True when the best learning rate is still the smallest or largest one run."""
    added: tuple[float, ...]
    """The learning rates added beyond the grid given."""

    def mean(self, lr: float) -> float:
        """Mean final loss over seeds at ``lr`` (``inf`` if any seed diverged)."""
        values = self.finals[lr]
        return sum(values) / len(values)

    def spread(self, lr: float) -> tuple[float, float]:
        """(lowest, highest) final loss over seeds at ``lr``."""
        return min(self.finals[lr]), max(self.finals[lr])

    @property
    def best(self) -> float:
        """Mean final loss over seeds at the best learning rate."""
        return self.mean(self.best_lr)

    def diverged(self, lr: float) -> bool:
        return any(not math.isfinite(v) for v in self.finals[lr])

    def sensitivity(self, width: float = 10.0) -> float:
        """How much the result depends on the learning rate: the worst mean final loss among the learning
        rates within a factor ``width`` either side of the best, minus the best (``inf`` if one of them
        diverged). A small number: a wide basin; a large one: the learning rate must be tuned finely."""
        near = [lr for lr in self.lrs if self.best_lr / width * (1 - 1e-9) <= lr <= self.best_lr * width * (1 + 1e-9)]
        return max(self.mean(lr) for lr in near) - self.best

    def neighbour_rise(self) -> tuple[float, float]:
        """How much worse the mean final loss is one grid step either side of the best, symmetrically:
        ``(rise, seed_spread)``. ``rise`` is the mean, over the two neighbours, of (neighbour's mean final
        loss - best), ``inf`` if a neighbour diverged. ``seed_spread`` bounds how far the seeds alone could
        move it: the mean of the neighbours' seed ranges (highest - lowest) plus the best's seed range
        (``inf`` with a diverged neighbour). Needs the best inside the grid (``at_edge`` False)."""
        if self.at_edge:
            raise ValueError(f"{self.name}: the best learning rate {self.best_lr:g} is at the edge of the grid: "
                             "it has only one neighbour")
        i = self.lrs.index(self.best_lr)
        low, high = self.lrs[i - 1], self.lrs[i + 1]
        if self.diverged(low) or self.diverged(high):
            return math.inf, math.inf
        rise = (self.mean(low) + self.mean(high)) / 2 - self.best
        width = lambda lr: self.spread(lr)[1] - self.spread(lr)[0]  # noqa: E731
        return rise, (width(low) + width(high)) / 2 + width(self.best_lr)

    def table_row(self) -> str:
        cells = []
        for lr in self.lrs:
            if self.diverged(lr):
                cells.append(f"{lr:.2g}: diverged")
            else:
                low, high = self.spread(lr)
                cells.append(f"{lr:.2g}: {self.mean(lr):.2f} [{low:.2f}-{high:.2f}]")
        return "; ".join(cells)


def _final(curve: Sequence[float], tail: int) -> float:
    if len(curve) == 0 or not all(math.isfinite(v) for v in curve):
        return math.inf
    last = list(curve)[-tail:]
    return sum(last) / len(last)


def lr_grid_search(train: Callable[[float, int], Sequence[float]], lrs: Sequence[float], seeds: Sequence[int], *,
                   name: str = "", tail: int = 20, max_extensions: int = 3,
                   diverge_above: float = math.inf) -> GridSearch:
    """Run ``train(lr, seed) -> loss curve`` for every learning rate of ``lrs`` and every seed; extend the
    grid beyond an edge while the best learning rate sits at it (see the module docstring).

    ``lrs`` must be ascending and log-spaced (a constant ratio: the step used to extend the grid). A run
    counts as diverged when its curve holds a non-finite loss or its final loss exceeds
    ``diverge_above`` (e.g. a little above the loss at initialisation)."""
    lrs = [float(lr) for lr in lrs]
    if len(lrs) < 3:
        raise ValueError(f"a learning-rate grid needs at least 3 points to have an inside, got {len(lrs)}")
    if any(not 0 < lr < math.inf for lr in lrs) or any(b <= a for a, b in zip(lrs, lrs[1:])):
        raise ValueError(f"lrs must be positive and ascending, got {lrs}")
    ratios = [b / a for a, b in zip(lrs, lrs[1:])]
    if max(ratios) / min(ratios) > 1.01:
        raise ValueError(f"lrs must be log-spaced (a constant ratio between neighbours), got ratios {ratios}")
    seeds = list(seeds)
    if not seeds:
        raise ValueError("give at least one seed (three or more to see the spread)")
    if isinstance(tail, bool) or not isinstance(tail, numbers.Integral) or tail < 1:
        raise ValueError(f"tail must be an int >= 1, got {tail!r}")
    step = ratios[0]
    finals: dict[float, tuple[float, ...]] = {}
    curves: dict[float, tuple[tuple[float, ...], ...]] = {}

    def run(lr: float) -> None:
        runs = [tuple(float(v) for v in train(lr, seed)) for seed in seeds]
        scores = tuple(_final(c, tail) for c in runs)
        finals[lr] = tuple(math.inf if s > diverge_above else s for s in scores)
        curves[lr] = tuple(runs)

    def score(lr: float) -> float:
        return sum(finals[lr]) / len(finals[lr])

    for lr in lrs:
        run(lr)
    added: list[float] = []
    for _ in range(max_extensions):
        ordered = sorted(finals)
        best = min(ordered, key=score)
        if math.isinf(score(best)):
            break  # every run diverged: there is no optimum to bracket
        if best == ordered[-1]:
            new = ordered[-1] * step
        elif best == ordered[0]:
            new = ordered[0] / step
        else:
            break
        run(new)
        added.append(new)
    ordered = tuple(sorted(finals))
    best = min(ordered, key=score)
    return GridSearch(name=name, lrs=ordered, finals=finals, curves=curves, best_lr=best,
                      at_edge=best in (ordered[0], ordered[-1]), added=tuple(added))


def train_repeating_patterns(make_optimizer: Callable[[torch.nn.Module, float], torch.optim.Optimizer], lr: float,
                             seed: int, *, steps: int = 120, vocab_size: int = 16, d_model: int = 32,
                             n_layers: int = 2, n_heads: int = 4, batch_size: int = 32,
                             device: torch.device | str = "cpu", check_every: int = 20) -> list[float]:
    """Train a small ``DecoderLM`` on ``data.repeating_patterns`` for ``steps`` steps with
    ``make_optimizer(model, lr)``; return the loss of each step (of the predictable positions, after the
    first period). ``seed`` sets the initial weights and the batches. A run whose loss becomes non-finite
    stops at the next check (every ``check_every`` steps: one read-back each, not one per step) and returns
    its curve so far, ending in the non-finite value."""
    from gpuformer_lib import data
    from gpuformer_lib.device import seed_everything
    from gpuformer_lib.model import DecoderLM, TransformerConfig

    seed_everything(seed)
    period = 4
    model = DecoderLM(TransformerConfig(vocab_size=vocab_size, d_model=d_model, n_heads=n_heads,
                                        n_decoder_layers=n_layers, d_ff=2 * d_model, dropout=0.0,
                                        max_len=32)).to(device)
    optimizer = make_optimizer(model, lr)
    losses = []
    for step in range(steps):
        x, y = data.repeating_patterns(step, vocab_size, batch_size=batch_size, period=period,
                                      seed=10_000 * seed)
        x, y = x.to(device), y.to(device)
        logits = model(x)  # (B, T, V)
        loss = F.cross_entropy(logits[:, period:].reshape(-1, vocab_size), y[:, period:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
        if (step + 1) % check_every == 0 and not torch.isfinite(torch.stack(losses[-check_every:])).all():
            break
    return torch.stack(losses).tolist()


def compare_sensitivity(a: GridSearch, b: GridSearch) -> str:
    """``'less'``, ``'more'`` or ``'about as'``: is ``a`` less or more sensitive to a one-grid-step change of
    learning rate than ``b``? By :meth:`GridSearch.neighbour_rise`: ``'less'`` only when ``b``'s rise exceeds
    ``a``'s by more than their seed spreads combined (so the seeds alone could not reverse it), ``'more'``
    the other way round, ``'about as'`` otherwise. A neighbour that diverged counts as infinitely worse: a
    run that diverges there is more sensitive than one that does not; two that both diverge are 'about as'."""
    rise_a, spread_a = a.neighbour_rise()
    rise_b, spread_b = b.neighbour_rise()
    if math.isinf(rise_a) or math.isinf(rise_b):
        return "about as" if math.isinf(rise_a) and math.isinf(rise_b) else "less" if math.isinf(rise_b) else "more"
    if rise_b - rise_a > spread_a + spread_b:
        return "less"
    if rise_a - rise_b > spread_a + spread_b:
        return "more"
    return "about as"
