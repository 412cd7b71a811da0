"""Mixture of experts against a token-by-token reference, and expert parallelism (experts split over two gloo
processes, tokens moved by all-to-all) against the whole layer in one process."""

import pytest
import torch
import torch.nn.functional as F

from gpuformer_lib import distributed as D
from gpuformer_lib.expert_parallel import MoE, alltoall_bytes, load_balancing_loss, route


def token_by_token(moe, x):
    """The formula, one token at a time: y_t = sum over the top-k experts of softmax(top-k logits) * MLP_e(x_t)."""
    out = []
    for token in x.reshape(-1, x.shape[-1]):
        logits = moe.router(token)
        top, experts = logits.topk(moe.top_k)
        gates = top.softmax(-1)
        out.append(sum(g * moe.experts[int(e)](token) for g, e in zip(gates, experts)))
    return torch.stack(out).reshape(x.shape)


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_moe_equals_the_formula_token_by_token(top_k):
    torch.manual_seed(0)
    moe = MoE(8, 16, 4, top_k=top_k).double()
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    y, aux = moe(x)
    assert torch.allclose(y, token_by_token(moe, x), atol=1e-12)
    assert int(moe.last_load.sum()) == 15 * top_k


def test_moe_gradients_equal_the_formulas():
    torch.manual_seed(1)
    moe = MoE(6, 12, 3, top_k=2).double()
    x = torch.randn(10, 6, dtype=torch.float64)
    moe(x)[0].square().sum().backward()
    fast = [p.grad.clone() for p in moe.parameters()]
    moe.zero_grad()
    token_by_token(moe, x).square().sum().backward()
    for a, p in zip(fast, moe.parameters()):
        assert torch.allclose(a, p.grad, atol=1e-10)


def test_gates_sum_to_one_and_pick_the_highest_logits():
    logits = torch.tensor([[0.1, 3.0, 2.0, -1.0]])
    gates, experts = route(logits, 2)
    assert experts.tolist() == [[1, 2]] and gates.sum().item() == pytest.approx(1.0)
    assert gates[0, 0].item() == pytest.approx(torch.tensor([3.0, 2.0]).softmax(0)[0].item())


def test_the_load_balancing_loss_is_one_when_even_and_e_over_k_when_collapsed():
    even = torch.zeros(8, 4)  # uniform router probabilities
    experts = torch.arange(8).remainder(4)[:, None]  # each expert chosen twice
    assert load_balancing_loss(even, experts, 4).item() == pytest.approx(1.0)
    collapsed = torch.tensor([[50.0, 0, 0, 0]]).repeat(8, 1)
    assert load_balancing_loss(collapsed, torch.zeros(8, 1, dtype=torch.long), 4).item() == pytest.approx(4.0)
    # top-2: every token's two choices go to experts 0 and 1, but no expert takes more than half: E / k
    pair = torch.tensor([[0, 1]]).repeat(8, 1)
    assert load_balancing_loss(collapsed, pair, 4).item() == pytest.approx(4.0 / 2)


def test_alltoall_bytes():
    assert alltoall_bytes(100, 64, 2, 4, 2) == 2 * 2 * 100 * 64 * 2 * 3 / 4
    assert alltoall_bytes(100, 64, 1, 1, 4) == 0
    with pytest.raises(ValueError):
        alltoall_bytes(0, 64, 1, 2, 2)


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match="top_k"):
        MoE(8, 16, 2, top_k=3)


def test_expert_parallel_equals_one_process():
    from pathlib import Path

    worker = Path(D.worker_path("model_parallel"))
    result = D.launch(worker, 2, ["experts"], backend="gloo", echo=False, timeout_s=240).results["experts"]
    assert result["output"] < 1e-6 and result["router grad"] < 1e-5 and result["expert grads"] < 1e-5
    # each rank routes 12 tokens to 2 experts each: 24 rows, about half of them to the other rank's experts
    assert 0 < result["sent_rows_total"] < 2 * 24
    assert result["even_load_bytes_per_rank"] == 2 * 2 * 12 * 32 * 4 / 2
