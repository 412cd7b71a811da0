"""The learning-rate grid search keeps the optimum inside the grid (gpuformer_lib.lr_search)."""

import math

import pytest
import torch

from gpuformer_lib import lr_search


def test_log_grid():
    grid = lr_search.log_grid(1e-3, 5, 3.0)
    assert len(grid) == 5 and grid[2] == pytest.approx(1e-3)
    assert all(b / a == pytest.approx(3.0) for a, b in zip(grid, grid[1:]))
    with pytest.raises(ValueError, match="factor"):
        lr_search.log_grid(1e-3, 5, 1.0)
    with pytest.raises(ValueError, match="n must"):
        lr_search.log_grid(1e-3, 1)


def _bowl(optimum, diverge_at=math.inf, noise=0.0):
    """A fake training run whose final loss is a bowl in log(lr) around ``optimum``."""
    def train(lr, seed):
        if lr >= diverge_at:
            return [1.0, float("nan")]
        final = (math.log10(lr) - math.log10(optimum)) ** 2 + 1.0 + noise * seed
        return [3.0] * 5 + [final] * 5
    return train


def test_interior_optimum_is_found_without_extension():
    result = lr_search.lr_grid_search(_bowl(1e-2), lr_search.log_grid(1e-2, 5, 3), seeds=[0, 1, 2], tail=5)
    assert result.best_lr == pytest.approx(1e-2) and not result.at_edge and result.added == ()
    assert result.best == pytest.approx(1.0)


def test_edge_optimum_extends_the_grid_until_inside():
    grid = lr_search.log_grid(1e-3, 5, 3)  # optimum 3e-2 lies above 9e-3, the top of the grid
    result = lr_search.lr_grid_search(_bowl(3e-2), grid, seeds=[0, 1, 2], tail=5)
    assert not result.at_edge
    assert result.best_lr == pytest.approx(2.7e-2)
    assert len(result.added) == 2 and result.lrs[-1] == pytest.approx(8.1e-2)


def test_extension_to_the_low_side_and_divergence_brackets():
    grid = lr_search.log_grid(1.0, 5, 3)
    low = lr_search.lr_grid_search(_bowl(1e-2), grid, seeds=[0], tail=5, max_extensions=5)
    assert not low.at_edge and low.best_lr < grid[0]
    # best at the top edge, the next point diverges: bracketed, the best stays where it is
    diverging = lr_search.lr_grid_search(_bowl(100.0, diverge_at=10.0), grid, seeds=[0, 1], tail=5)
    assert diverging.best_lr == pytest.approx(grid[-1]) and not diverging.at_edge
    assert diverging.diverged(diverging.lrs[-1])
    assert "diverged" in diverging.table_row()


def test_edge_reported_when_extensions_run_out_and_spread():
    result = lr_search.lr_grid_search(_bowl(1e3), lr_search.log_grid(1e-3, 5, 3), seeds=[0, 1, 2], tail=5,
                                      max_extensions=1)
    assert result.at_edge
    noisy = lr_search.lr_grid_search(_bowl(1e-2, noise=0.1), lr_search.log_grid(1e-2, 5, 3), seeds=[0, 1, 2],
                                     tail=5)
    assert noisy.spread(noisy.best_lr) == pytest.approx((1.0, 1.2))
    assert noisy.sensitivity(width=3.5) == pytest.approx(
        max(noisy.mean(lr) for lr in noisy.lrs[1:4]) - noisy.best)


def test_grid_inputs_checked():
    with pytest.raises(ValueError, match="at least 3"):
        lr_search.lr_grid_search(_bowl(1), [1, 2], seeds=[0])
    with pytest.raises(ValueError, match="log-spaced"):
        lr_search.lr_grid_search(_bowl(1), [1, 2, 5], seeds=[0])
    with pytest.raises(ValueError, match="ascending"):
        lr_search.lr_grid_search(_bowl(1), [3, 2, 1], seeds=[0])
    with pytest.raises(ValueError, match="seed"):
        lr_search.lr_grid_search(_bowl(1), [1, 2, 4], seeds=[])


def test_train_repeating_patterns_learns_and_stops_on_divergence():
    adam = lambda m, lr: torch.optim.Adam(m.parameters(), lr=lr)  # noqa: E731
    curve = lr_search.train_repeating_patterns(adam, 1e-2, 0, steps=40, d_model=16, n_layers=1)
    assert len(curve) == 40 and abs(curve[0] - math.log(16)) < 0.3 and curve[-1] < curve[0]
    again = lr_search.train_repeating_patterns(adam, 1e-2, 0, steps=40, d_model=16, n_layers=1)
    assert curve == again  # the seed fixes everything
    sgd = lambda m, lr: torch.optim.SGD(m.parameters(), lr=lr)  # noqa: E731
    blown = lr_search.train_repeating_patterns(sgd, 1e6, 0, steps=100, d_model=16, n_layers=1, check_every=10)
    assert len(blown) < 100 and not math.isfinite(blown[-1])


def _search(finals_by_lr, name="x"):
    """A GridSearch from given per-seed final losses (lr -> tuple of finals)."""
    lrs = tuple(sorted(finals_by_lr))
    score = {lr: sum(v) / len(v) for lr, v in finals_by_lr.items()}
    best = min(lrs, key=score.get)
    return lr_search.GridSearch(name=name, lrs=lrs, finals=dict(finals_by_lr), curves={}, best_lr=best,
                                at_edge=best in (lrs[0], lrs[-1]), added=())


def test_neighbour_rise_is_symmetric_and_carries_the_seed_spread():
    s = _search({0.1: (2.5, 2.7), 0.3: (2.0, 2.1), 0.9: (2.2, 2.2)})
    rise, spread = s.neighbour_rise()
    assert rise == pytest.approx((2.6 + 2.2) / 2 - 2.05)  # both neighbours, not the worse one
    assert spread == pytest.approx((0.2 + 0.0) / 2 + 0.1)
    diverging = _search({0.1: (2.5, 2.7), 0.3: (2.0, 2.1), 0.9: (2.2, math.inf)})
    assert diverging.neighbour_rise() == (math.inf, math.inf)
    with pytest.raises(ValueError, match="edge"):
        _search({0.1: (1.0,), 0.3: (2.0,), 0.9: (3.0,)}).neighbour_rise()


def test_compare_sensitivity_needs_more_than_the_seed_spread():
    flat = _search({0.1: (2.10, 2.12), 0.3: (2.00, 2.02), 0.9: (2.10, 2.12)})  # rise 0.10, spread 0.04
    steep = _search({0.1: (2.60, 2.62), 0.3: (2.00, 2.02), 0.9: (2.60, 2.62)})  # rise 0.60, spread 0.04
    assert lr_search.compare_sensitivity(flat, steep) == "less"
    assert lr_search.compare_sensitivity(steep, flat) == "more"
    # the review's case: a difference smaller than the seeds' spreads is no verdict
    noisy = _search({0.1: (2.30, 2.60), 0.3: (2.20, 2.30), 0.9: (2.30, 2.60)})  # rise 0.20, spread 0.40
    assert lr_search.compare_sensitivity(flat, noisy) == "about as"
    diverging = _search({0.1: (2.6, 2.6), 0.3: (2.0, 2.0), 0.9: (math.inf, math.inf)})
    assert lr_search.compare_sensitivity(flat, diverging) == "less"
    assert lr_search.compare_sensitivity(diverging, flat) == "more"
    assert lr_search.compare_sensitivity(diverging, diverging) == "about as"
