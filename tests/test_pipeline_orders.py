"""Hand-written pipeline orders (gpuformer_lib.pipeline_orders) in one process: GPipe and 1F1B give one
process's gradients, 1F1B holds at most p micro-batches on stage 0 (counted and in saved bytes), and a deadlock
is named. The chapter 12 exercise check's right and wrong orders are in tests/answer_tables/model_parallel.py."""

import copy

import pytest
import torch
import torch.nn.functional as F

from gpuformer_lib import pipeline_orders as P


def _setup(p, width=16, n_blocks=4, rows=32):
    torch.manual_seed(0)
    full = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.LayerNorm(width), torch.nn.Linear(width, width))
                                 for _ in range(n_blocks)])
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(rows, width, generator=g), torch.randn(rows, width, generator=g)
    F.mse_loss(full(x), y).backward()
    per = n_blocks // p
    stages = [copy.deepcopy(full[s * per:(s + 1) * per]) for s in range(p)]
    for s in stages:
        s.zero_grad(set_to_none=True)
    return full, stages, x, y


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("order", [P.gpipe_order, P.one_f_one_b_order])
def test_orders_give_one_process_gradients(p, order):
    full, stages, x, y = _setup(p)
    m = 8
    run = P.run_orders_one_process(stages, x, y, F.mse_loss, [order(s, p, m) for s in range(p)], m)
    ours = [q.grad for s in stages for q in s.parameters()]
    torch.testing.assert_close(ours, [q.grad for q in full.parameters()], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(run["loss"], F.mse_loss(full(x), y), rtol=1e-5, atol=1e-7)
    assert run["slots"] == 2 * (m + p - 1)  # the same step length: 1F1B buys memory, not time
    if order is P.gpipe_order:
        assert run["peak_in_flight"] == [m] * p
    else:
        assert run["peak_in_flight"] == [p - s for s in range(p)]  # stage s holds p - s micro-batches


def test_live_saved_bytes_scale_with_micro_batches_in_flight():
    """Saved bytes at the peak: m micro-batches' worth under GPipe, p under 1F1B (stage 0), exactly."""
    p, m = 2, 8
    peaks = {}
    for name, order, mb in (("one", P.gpipe_order, 1), ("gpipe", P.gpipe_order, m), ("1f1b", P.one_f_one_b_order, m)):
        _, stages, x, y = _setup(p, rows=4 * mb)
        peaks[name] = P.run_orders_one_process(stages, x, y, F.mse_loss, [order(s, p, mb) for s in range(p)],
                                               mb)["peak_saved_bytes"][0]
    assert peaks["gpipe"] == m * peaks["one"] and peaks["1f1b"] == p * peaks["one"]


def test_live_saved_bytes_returns_to_zero_after_backward():
    lin = torch.nn.Linear(8, 8)
    with P.LiveSavedBytes(lin) as counter:
        out = torch.tanh(lin(torch.randn(4, 8, requires_grad=True)))
    assert counter.bytes > 0 and counter.peak == counter.bytes
    out.sum().backward()
    assert counter.bytes == 0


def test_a_deadlock_and_a_malformed_order_are_named():
    _, stages, x, y = _setup(2)
    with pytest.raises(RuntimeError, match="deadlock.*stage 0: B0.*stage 1: F1"):
        P.run_orders_one_process(stages, x, y, F.mse_loss,
                                 [[("F", 0), ("B", 0), ("F", 1), ("B", 1)], [("F", 1), ("B", 1), ("F", 0), ("B", 0)]], 2)
    with pytest.raises(ValueError, match="before its forward"):
        P.check_order([("B", 0), ("F", 0)], 1)
    with pytest.raises(ValueError, match="never run their backward"):
        P.check_order([("F", 0), ("F", 1), ("B", 0)], 2)
