"""The GPU suite's items of chapters 2-6: registered, within their cap allotment, and their helpers.

Their code is rehearsed at toy sizes by tests/test_gpu_suite.py (the whole suite, under the T4 and H100 profiles)."""

import torch

from gpuformer_lib.gpu_suite import core, items_ch02_06

KEYS = {"ch02.triton_kernels", "ch02.cuda_c_add", "ch03.explicit_vs_fused", "ch04.heads_loop_vs_batch",
        "ch04.kv_cache_decode", "ch05.training_step", "ch06.adamw_fused_vs_foreach"}


def test_the_items_are_registered_within_their_allotment():
    items = {it.key: it for it in core.ordered_items() if 2 <= it.chapter <= 6}
    assert KEYS <= set(items)
    # about 95 s for chapters 2-6 on one H100, the optional CUDA C build (nvcc) apart
    assert sum(items[k].cap_s for k in KEYS - {"ch02.cuda_c_add"}) <= 95
    assert items["ch02.triton_kernels"].heavy and items["ch02.cuda_c_add"].heavy  # they compile
    assert not any(items[k].heavy for k in KEYS - {"ch02.triton_kernels", "ch02.cuda_c_add"})


def test_helpers_on_the_cpu():
    ctx = core.Context(torch.device("cpu"), toy=True, cap_s=5)
    assert items_ch02_06._fits(ctx, 10**15, "anything")  # no memory check off CUDA (toy sizes)
    assert items_ch02_06._peak_bytes(ctx, lambda: 1 / 0) is None  # CUDA allocator only: fn is not run
    assert items_ch02_06._tolerance(torch.bfloat16) > items_ch02_06._tolerance(torch.float32)
    assert items_ch02_06._time_for(ctx, "x", need_s=1.0)
    assert not items_ch02_06._time_for(ctx, "y", need_s=1000.0)
    assert len(ctx.record["notes"]) == 1 and ctx.record["notes"][0].startswith("y and what follows left out")
    entry = ctx.compare("c", ("a b", lambda: None), ("c.d", lambda: None), repeats=3)
    items_ch02_06._rates(ctx, "c", entry, 100.0, "B", "100 bytes")
    assert set(ctx.record["values"]) == {"c_a_b_rate", "c_c_d_rate"}
