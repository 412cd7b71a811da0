"""The all-reduce cost models of chapter 11 (gpuformer_lib.predict.collective_costs) against their references:
NCCL-tests' own busbw column, the flat ring model, NCCL's latency count, and a known alpha and B; and the
data-parallel step's token normalisation and NaiveDataParallel's accumulation in one process (no launch)."""

import math

import pytest
import torch
import torch.distributed as dist

from gpuformer_lib.predict import collective_costs as C
from gpuformer_lib import distributed as D
from gpuformer_lib import speed


def test_busbw_reproduces_an_nccl_tests_row():
    # all_reduce_perf on 16 H100s (2 nodes): 8589934592 B in 47535 us -> algbw 180.71, busbw 338.82 GB/s
    assert C.busbw(8589934592, 47535e-6, 16) / 1e9 == pytest.approx(338.82, abs=0.01)
    assert 8589934592 / 47535e-6 / 1e9 == pytest.approx(180.71, abs=0.01)
    assert C.algbw(C.busbw(1e9, 1e-2, 8), 8) == pytest.approx(1e11)
    assert C.busbw(1e9, 1.0, 1) == 0.0
    with pytest.raises(ValueError, match="one rank"):
        C.algbw(1e9, 1)


def test_one_node_is_the_flat_ring_and_one_gpu_per_node_is_the_network_ring():
    nvlink = C.Link("nvlink", 3.4e-6, 370e9)
    net = C.Link("ib", 14e-6, 48e9)
    base = 8.4e-6  # NCCL's base latency per call (nccl-ring-simple-base-latency), on top of the ring's steps
    for n in (2, 4, 8):
        t = C.hierarchical_allreduce_time(5e8, n, 1, nvlink)
        assert t.seconds == pytest.approx(base + D.ring_allreduce_time(5e8, n, 3.4e-6, 370e9))
        t = C.hierarchical_allreduce_time(5e8, 1, n, nvlink, net)
        assert t.seconds == pytest.approx(base + D.ring_allreduce_time(5e8, n, 14e-6, 48e9))
        assert C.hierarchical_allreduce_time(5e8, 1, n, nvlink, net, base_latency=0).seconds == pytest.approx(
            D.ring_allreduce_time(5e8, n, 14e-6, 48e9))
        assert t.bottleneck == "inter-node"
    assert C.hierarchical_allreduce_time(5e8, 1, 1, nvlink).seconds == 0.0


def test_latency_counts_like_nccls_tuning_model_and_the_slowest_level_sets_the_bandwidth():
    nvlink, fast_net, slow_net = C.Link("nvlink", 3.4e-6, 370e9), C.Link("8 NICs", 14e-6, 396e9), C.Link("1 NIC", 14e-6, 48e9)
    g, m = 8, 8
    n = g * m
    t = C.hierarchical_allreduce_time(0, g, m, nvlink, slow_net)
    assert t.latency == pytest.approx(8.4e-6 + (2 * (n - 1) - 2 * (m - 1)) * 3.4e-6 + 2 * (m - 1) * 14e-6)  # tuning.cc's count, less its 2 extra network steps
    one_nic = C.hierarchical_allreduce_time(5e8, g, m, nvlink, slow_net)
    rails = C.hierarchical_allreduce_time(5e8, g, m, nvlink, fast_net)
    node = C.hierarchical_allreduce_time(5e8, 8, 1, nvlink)
    assert one_nic.bottleneck == "inter-node" and rails.bottleneck == "intra-node"
    assert one_nic.bandwidth / node.bandwidth > 7  # the 8 -> 64 drop with one NIC per node: about an order of magnitude
    assert rails.bandwidth / node.bandwidth < 1.2  # one NIC per GPU: hardly any
    two_phase = C.hierarchical_allreduce_time(5e8, g, m, nvlink, slow_net, schedule="two-phase")
    assert two_phase.bandwidth >= one_nic.bandwidth * 0.99  # phases in series: never faster than the pipelined ring
    with pytest.raises(ValueError, match="need the link between them"):
        C.hierarchical_allreduce_time(1e6, 8, 2, nvlink)


def test_fit_recovers_alpha_and_bandwidth_from_noisy_times():
    g = torch.Generator().manual_seed(0)
    sizes = [2**k for k in range(10, 25, 2)]
    for world, alpha, bw in ((2, 200e-6, 1.7e9), (4, 5e-6, 3.7e11)):
        exact = [D.ring_allreduce_time(s, world, alpha, bw) for s in sizes]
        noisy = [t * (1 + 0.05 * float(torch.rand((), generator=g))) for t in exact]
        a, b = C.fit_alpha_beta(sizes, noisy, world)
        assert a == pytest.approx(alpha, rel=0.1) and b == pytest.approx(bw, rel=0.1)
    with pytest.raises(ValueError, match="two distinct sizes"):
        C.fit_alpha_beta([1, 1], [1.0, 1.0], 2)


def test_overlap_efficiency():
    assert C.overlap_efficiency(1.0, 0.5) == pytest.approx(1 / 1.5)
    assert C.overlap_efficiency(1.0, 0.5, overlap=1.0) == 1.0
    assert C.overlap_efficiency(0.3, 1.0, overlap=1.0) == pytest.approx(0.3 / (1.3 - 0.2))


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_the_step_all_reduces_the_token_count_of_a_data_parallel_model(one_rank_group, monkeypatch):
    """make_train_step detects DDP / NaiveDataParallel and all-reduces the token count under 'tokens'."""
    model = torch.nn.Linear(4, 3)
    assert not speed.averages_gradients_over_ranks(model)
    naive = D.NaiveDataParallel(model)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 3))
    assert speed.averages_gradients_over_ranks(naive) and speed.averages_gradients_over_ranks(ddp)
    calls = []
    real = dist.all_reduce
    monkeypatch.setattr(dist, "all_reduce", lambda t, *a, **k: calls.append(t.dtype) or real(t, *a, **k))

    def loss_fn(m, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(m(x), y), x.shape[0]

    step = speed.make_train_step(naive, torch.optim.SGD(naive.parameters(), lr=0.1), loss_fn, normalize_by="tokens",
                                 grad_accum_steps=2, no_sync=naive.no_sync)
    step([(torch.randn(5, 4), torch.randn(5, 3)), (torch.randn(2, 4), torch.randn(2, 3))])
    assert torch.float64 in calls  # the token count, summed exactly


def test_naive_data_parallel_accumulates_like_one_process(one_rank_group):
    """Two micro-batches, the first inside no_sync, and two without it: both equal one large batch's sum."""
    torch.manual_seed(0)
    ref, model = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    model.load_state_dict(ref.state_dict())
    naive = D.NaiveDataParallel(model)
    x = torch.randn(6, 4)
    ref(x).pow(2).sum().backward()
    with naive.no_sync():
        naive(x[:3]).pow(2).sum().backward()
    naive(x[3:]).pow(2).sum().backward()
    naive.finish_gradients()  # already done at the end of backward: a no-op now
    torch.testing.assert_close(model.weight.grad, ref.weight.grad)
    model.zero_grad()
    naive(x[:3]).pow(2).sum().backward()  # without no_sync: each backward is reduced and averaged on its own
    naive(x[3:]).pow(2).sum().backward()
    torch.testing.assert_close(model.weight.grad, ref.weight.grad)


def test_train_holds_back_ddp_all_reduces_and_sums_the_tokens_when_accumulating(one_rank_group, monkeypatch):
    """train() under DDP with 2 micro-batches per step: the first runs inside no_sync (one round of bucket
    all-reduces per step, not two), and normalize_by='tokens' all-reduces the step's token count."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from gpuformer_lib import train as T

    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 3))
    rounds = []
    ddp.register_comm_hook(None, lambda state, bucket: rounds.append(bucket.index()) or
                           default_hooks.allreduce_hook(state, bucket))
    tokens_reduced = []
    real = dist.all_reduce
    monkeypatch.setattr(dist, "all_reduce",
                        lambda t, *a, **k: tokens_reduced.append(t.dtype == torch.float64) or real(t, *a, **k))

    def loss_fn(m, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(m(x), y), x.shape[0]

    config = T.TrainConfig(max_steps=3, grad_accum_steps=2, normalize_by="tokens", warmup_steps=0, progress=False,
                           log_every=1, lr=1e-2)
    T.train(ddp, loss_fn, lambda i: (torch.randn(3, 4), torch.randn(3, 3)), config)
    buckets = len(set(rounds))
    assert len(rounds) == 3 * buckets  # one round per step: the first micro-batch was held back
    assert sum(tokens_reduced) == 3  # the token count, once per step


def test_naive_data_parallel_without_the_engines_callback_says_what_is_missing(monkeypatch):
    """NaiveDataParallel averages the gradients when backward ends through the autograd engine's queue_callback
    (private; DDP uses it too). A torch without it is refused when the wrapper is built, with what to use instead,
    not with an AttributeError in the middle of a backward pass. Refused before any collective: no group needed."""
    monkeypatch.delattr(torch.autograd.Variable, "_execution_engine")
    with pytest.raises(RuntimeError, match="queue_callback.*use DistributedDataParallel"):
        D.NaiveDataParallel(torch.nn.Linear(4, 3))
