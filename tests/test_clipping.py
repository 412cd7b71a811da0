"""Gradient clipping from scratch (gpuformer_lib.clipping) against torch.nn.utils.clip_grad_norm_, and the
optimizer-cost predictors (gpuformer_lib.predict.optimizer_cost) against what torch.optim really holds."""

import math

import pytest
import torch

from gpuformer_lib import clipping
from gpuformer_lib.predict import optimizer_cost


def _params(seed, scale=1.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    shapes = [(7, 5), (5,), (3, 4, 2), (1,)]
    params = [torch.nn.Parameter(torch.randn(s, generator=g, dtype=dtype)) for s in shapes]
    for p in params:
        p.grad = scale * torch.randn(p.shape, generator=g, dtype=dtype)
    return params


def _copy(params):
    out = []
    for p in params:
        q = torch.nn.Parameter(p.detach().clone())
        q.grad = p.grad.clone()
        out.append(q)
    return out


@pytest.mark.parametrize("foreach", [None, False, True])
@pytest.mark.parametrize("scale,max_norm", [(1.0, 1.0), (10.0, 1.0), (0.01, 1.0), (3.0, 0.5)])
@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_clip_grad_norm_equals_pytorch(foreach, scale, max_norm, norm_type):
    ours, theirs = _params(0, scale), None
    theirs = _copy(ours)
    n_ours = clipping.clip_grad_norm(ours, max_norm, norm_type=norm_type)
    n_theirs = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type=norm_type, foreach=foreach)
    torch.testing.assert_close(n_ours, n_theirs)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad)
    after = clipping.global_grad_norm(ours, norm_type)
    assert after <= max_norm * (1 + 1e-5)
    if n_theirs < max_norm:  # below the threshold: untouched
        for a, b in zip(ours, _params(0, scale)):
            torch.testing.assert_close(a.grad, b.grad)


def test_global_norm_is_the_norm_of_the_concatenation_float64():
    params = _params(1, 5.0, dtype=torch.float64)
    flat = torch.cat([p.grad.flatten() for p in params])
    torch.testing.assert_close(clipping.global_grad_norm(params), flat.norm())
    assert clipping.global_grad_norm(params).dtype == torch.float64


def test_direction_kept_and_coefficient():
    params = _params(2, 100.0)
    before = torch.cat([p.grad.flatten() for p in params])
    total = clipping.clip_grad_norm(params, 1.0)
    after = torch.cat([p.grad.flatten() for p in params])
    torch.testing.assert_close(after, before * (1.0 / (total + clipping.EPS)))
    assert clipping.clip_coefficient(0.5, 1.0) == 1.0
    torch.testing.assert_close(clipping.clip_coefficient(4.0, 1.0), torch.tensor(1.0 / (4.0 + 1e-6)))


@pytest.mark.parametrize("bad", [math.inf, math.nan])
@pytest.mark.parametrize("foreach", [False, True])
def test_nonfinite_gradients_like_pytorch(bad, foreach):
    ours = _params(3)
    ours[1].grad[2] = bad
    theirs = _copy(ours)
    n_ours = clipping.clip_grad_norm(ours, 1.0)
    n_theirs = torch.nn.utils.clip_grad_norm_(theirs, 1.0, foreach=foreach)
    assert not math.isfinite(n_ours) and not math.isfinite(n_theirs)
    assert math.isnan(n_ours) == math.isnan(n_theirs)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad, equal_nan=True)
    with pytest.raises(RuntimeError, match="non-finite"):
        clipping.clip_grad_norm(_params(3) + [ours[1]], 1.0, error_if_nonfinite=True)
    with pytest.raises(RuntimeError, match="non-finite"):
        torch.nn.utils.clip_grad_norm_(_copy(_params(3)) + [theirs[1]], 1.0, error_if_nonfinite=True)


def test_no_gradients_and_single_tensor():
    p = torch.nn.Parameter(torch.ones(3))
    assert clipping.clip_grad_norm([p], 1.0) == 0
    p.grad = torch.full((3,), 2.0)
    total = clipping.clip_grad_norm(p, 1.0)
    torch.testing.assert_close(total, torch.tensor(math.sqrt(12.0)))
    torch.testing.assert_close(p.grad.norm(), torch.tensor(1.0), atol=1e-5, rtol=0)


def test_clip_inputs_checked():
    with pytest.raises(ValueError, match="max_norm"):
        clipping.clip_grad_norm(_params(0), 0.0)
    with pytest.raises(ValueError, match="max_norm"):
        clipping.clip_grad_norm(_params(0), float("nan"))
    with pytest.raises(ValueError, match="norm_type"):
        clipping.global_grad_norm(_params(0), 1.0)


def test_training_step_clipped_equals_pytorch():
    torch.manual_seed(0)
    model_a = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    model_b = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    model_b.load_state_dict(model_a.state_dict())
    x = 50 * torch.randn(16, 6)
    for model, clip in ((model_a, clipping.clip_grad_norm), (model_b, torch.nn.utils.clip_grad_norm_)):
        model(x).pow(2).mean().backward()
        clip(model.parameters(), 0.1)
        torch.optim.SGD(model.parameters(), lr=0.1).step()
    for a, b in zip(model_a.parameters(), model_b.parameters()):
        torch.testing.assert_close(a, b)


# ------------------------------------------------------------------ optimizer_cost


def test_adamw_state_bytes_match_optimizer_state():
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.Linear(20, 5))
    n = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 10)).sum().backward()
    opt.step()
    from gpuformer_lib.memory import model_state_bytes

    per = optimizer_cost.adamw_bytes_per_param()
    assert model_state_bytes(model, opt)["optimizer"] == per["moments (m, v)"] * n
    assert sum(per.values()) == 16
    assert sum(optimizer_cost.adamw_bytes_per_param(mixed_precision=True).values()) == 16


def test_step_bytes_and_logits():
    assert optimizer_cost.adamw_step_bytes(10, implementation="fused") == 280
    assert optimizer_cost.adamw_step_bytes(10, implementation="foreach") == 800
    assert optimizer_cost.adamw_step_bytes(10, implementation="fused", state_bytes=2) == 140
    assert optimizer_cost.logits_bytes(8, 1024, 50257) == 8 * 1024 * 50257 * 4
    assert optimizer_cost.logits_bytes(8, 1024, 50257) / 2 ** 30 == pytest.approx(1.53, abs=0.01)
    with pytest.raises(ValueError, match="implementation"):
        optimizer_cost.adamw_step_bytes(10, implementation="loop")
    with pytest.raises(ValueError, match="n_params"):
        optimizer_cost.adamw_step_bytes(-1)
    with pytest.raises(TypeError):
        optimizer_cost.adamw_bytes_per_param(mixed_precision=1)


def test_foreach_pass_count_matches_torch_source():
    """The foreach passes the predictor counts are the _foreach_ calls of torch's AdamW (non-capturable path)."""
    import inspect

    import torch.optim.adam as adam

    source = inspect.getsource(adam._multi_tensor_adam)
    tail = source[source.index("else:\n            bias_correction1 = ["):]
    for call in ("_foreach_sqrt(", "_foreach_div_(", "_foreach_add_(", "_foreach_addcdiv_("):
        assert call in tail
    for call in ("_foreach_lerp_(", "_foreach_mul_(device_exp_avg_sqs", "_foreach_addcmul_(",
                 "_foreach_mul_(device_params, 1 - lr * weight_decay)"):
        assert call in source
    assert len(optimizer_cost._FOREACH_PASSES) == 8


@pytest.mark.parametrize("implementation", ["for-loop", "foreach", "fused"])
def test_time_adamw_step(implementation):
    timing = optimizer_cost.time_adamw_step(10_000, implementation, n_tensors=3, repeats=3)
    assert len(timing.times) == 3 and timing.median > 0
    with pytest.raises(ValueError, match="implementation"):
        optimizer_cost.time_adamw_step(10, "apex")


def test_compare_adamw_steps_times_each_implementation_in_interleaved_rounds(monkeypatch):
    """On a clock of its own (no verdict on a real clock): each implementation's step is wrapped to take a
    fixed time, so the comparison's baseline, speedup and verdict are exact; the steps still update the
    parameters (a real AdamW step runs inside each timed call)."""
    from fake_clock import FakeClock
    from gpuformer_lib import bench

    clock = FakeClock()
    monkeypatch.setattr(bench, "time", clock)
    made = []
    real = optimizer_cost.adamw_step

    def slow_or_fast(n_params, implementation, device="cpu", *, n_tensors=8):
        step = real(n_params, implementation, device, n_tensors=n_tensors)
        made.append(implementation)

        def timed():
            clock.sleep({"foreach": 3e-3, "fused": 1e-3}[implementation])
            return step()

        return timed

    monkeypatch.setattr(optimizer_cost, "adamw_step", slow_or_fast)
    result = optimizer_cost.compare_adamw_steps(1_000, n_tensors=2, repeats=5, warmup=0)
    assert made == ["foreach", "fused"] and list(result) == ["fused"]
    fused = result["fused"]
    assert fused.baseline == "foreach" and fused.speedup == pytest.approx(3.0) and fused.verdict == "faster"
    assert len(fused.ratios) == 5


def test_adamw_step_updates_the_weights_each_call():
    step = optimizer_cost.adamw_step(100, "foreach", n_tensors=2)
    weights = step.__self__.param_groups[0]["params"]
    before = [w.detach().clone() for w in weights]
    step()
    assert all(not torch.equal(a, w) for a, w in zip(before, weights))
    with pytest.raises(ValueError, match="n_tensors"):
        optimizer_cost.adamw_step(2, "fused", n_tensors=3)


def test_inf_gradient_zeroes_the_finite_ones_and_makes_the_inf_entry_nan():
    """The docstring's claim: an inf norm gives coefficient 0, so finite gradients become 0 and only the inf
    entries NaN (0 * inf); PyTorch does the same."""
    ours = _params(4)
    ours[1].grad[2] = math.inf
    theirs = _copy(ours)
    assert math.isinf(clipping.clip_grad_norm(ours, 1.0))
    torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert clipping.clip_coefficient(math.inf, 1.0) == 0.0
    for grads in (ours, theirs):
        nan = torch.cat([torch.isnan(p.grad).flatten() for p in grads])
        assert nan.sum() == 1 and torch.isnan(grads[1].grad[2])
        finite = torch.cat([p.grad.flatten() for p in grads])[~nan]
        assert (finite == 0).all()


def test_nan_gradient_makes_every_gradient_nan():
    """A NaN norm gives a NaN coefficient, so every gradient becomes NaN; PyTorch does the same."""
    ours = _params(5)
    ours[0].grad[1, 1] = math.nan
    theirs = _copy(ours)
    assert math.isnan(clipping.clip_grad_norm(ours, 1.0))
    torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert math.isnan(clipping.clip_coefficient(math.nan, 1.0))
    for grads in (ours, theirs):
        assert all(torch.isnan(p.grad).all() for p in grads)
