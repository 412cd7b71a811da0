"""Chapter 12's cost models (gpuformer_lib.predict.parallel_costs) against counts done another way. The
prediction checks of its exercises are graded by their tables in tests/answer_tables/model_parallel.py."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from gpuformer_lib import published
from gpuformer_lib.predict import parallel_costs as C
from gpuformer_lib.memory import training_memory


def test_tp_bytes_per_layer_are_four_activations():
    b = C.tp_allreduce_bytes_per_layer(8, 1024, 768, bytes_per_value=2)
    assert b["message_bytes"] == 8 * 1024 * 768 * 2 and b["forward"] == b["backward"] == 2 * b["message_bytes"]
    with pytest.raises(ValueError):
        C.tp_allreduce_bytes_per_layer(0, 1, 1)


def test_tp_time_is_slower_across_infiniband_than_on_nvlink_by_the_bandwidth_ratio():
    links = C.tp_links()
    nv, ib, pcie = (C.tp_layer_comm_seconds(8, 1024, 768, 2, links[k]) for k in
                    ("H100 SXM, NVLink 4", "H100 SXM, InfiniBand NDR", "T4, PCIe 3.0 x16"))
    assert nv < ib < pcie
    ratio = links["H100 SXM, NVLink 4"].bus_bandwidth / links["H100 SXM, InfiniBand NDR"].bus_bandwidth
    assert 1 < ib / nv < ratio  # latencies narrow the bandwidth ratio (issue 29: NCCL's base latency per call)
    link, base = links["H100 SXM, NVLink 4"], published.figure("nccl-ring-simple-base-latency").value * 1e-6
    message = 8 * 1024 * 768 * 2
    assert nv == pytest.approx(4 * (base + 2 * link.alpha + message / link.bus_bandwidth))  # 2 ranks: 2 steps


def test_layer_flops_match_pytorchs_counter():
    B, T, C_, F_ = 2, 16, 32, 128
    q, k, v, o = (torch.nn.Linear(C_, C_, bias=False) for _ in range(4))
    f1, f2 = torch.nn.Linear(C_, F_, bias=False), torch.nn.Linear(F_, C_, bias=False)
    x = torch.randn(B, T, C_, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        att = torch.softmax(q(x) @ k(x).transpose(1, 2), -1) @ v(x)  # one head: (B, T, T) x (B, T, C)
        y = f2(torch.relu(f1(o(att))))
        y.sum().backward()
    assert counter.get_total_flops() == C.layer_train_flops(B, T, C_, F_)


def test_zero_communication_is_two_psi_until_stage_three():
    assert [C.zero_communication_elements(10, s) for s in range(4)] == [20, 20, 20, 30]
    with pytest.raises(ValueError):
        C.zero_communication_elements(10, 4)


def test_zero3_memory_adds_the_gathered_layers_to_the_calculators_shards():
    n, layer = C.LLAMA2_7B.n_params, 202_383_360  # one Llama-2-7B layer: 4 C^2 + 3 C F
    z = C.zero3_rank_bytes(n, layer, 8)
    calc = training_memory(n, param_bytes=2, optimizer="adamw", master_weights=True, shard_weights=8,
                           shard_gradients=8, shard_optimizer=8)
    assert z.sharded_states == pytest.approx(calc.weights + calc.gradients + calc.optimizer + calc.master_weights,
                                             rel=1e-6)  # chapter 9's calculator: 2 + 2 + 8 + 4 bytes, each / 8
    # the gradient buffer is in reduce_dtype: float32 by default, as chapter 12 recommends (the review of
    # 2026-11-27 found it sized in bf16); bf16 only when asked
    assert z.plain_ddp_states == 16 * n and z.gathered_layers == 2 * 2 * layer and z.gradient_buffer == 4 * layer
    assert C.zero3_rank_bytes(n, layer, 8, reduce_bytes=2).gradient_buffer == 2 * layer
    with pytest.raises(ValueError, match="reduce_bytes"):
        C.zero3_rank_bytes(n, layer, 8, reduce_bytes=1)
    assert 100e9 < z.plain_ddp_states < 120e9 and 13e9 < z.total < 16e9  # the review's 112 GB against ~14 GB


def test_sizing_keeps_7b_data_parallel_and_needs_model_parallel_for_70b():
    seven8 = C.plan_parallelism(C.LLAMA2_7B, 8)
    assert (seven8.tp, seven8.pp, seven8.dp, seven8.fits) == (1, 1, 8, True)
    seventy8 = C.plan_parallelism(C.LLAMA2_70B, 8)
    assert not seventy8.fits  # 16 B x 69 B parameters = 1.1 TB of states: more than 8 x 80 GB
    seventy64 = C.plan_parallelism(C.LLAMA2_70B, 64)
    assert seventy64.fits and seventy64.tp * seventy64.pp > 1 and seventy64.tp <= 8
    assert seventy64.tp * seventy64.pp * seventy64.dp == 64
    assert seventy64.total <= 0.8 * 80e9


def test_grade_model_refuses_a_wrong_model_it_cannot_tell_from_the_right_one():
    from gpuformer_lib.exercises.predictions import grade_model

    with pytest.raises(ValueError, match="could not tell them apart"):
        grade_model(20, 20.0, quantity="q", unit="%", wrong={"almost right": (20.5, "hint")}, rel=0.03)
