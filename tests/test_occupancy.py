"""The occupancy calculator against hand-worked cases, NVIDIA's documented per-SM limits, and a
block-by-block simulation of an SM's resources."""

import itertools

import pytest

from gpuformer_lib import occupancy as occ


def test_documented_limits():
    # CUDA C++ Programming Guide, technical specifications per compute capability
    t4, h100 = occ.limits("T4"), occ.limits("H100 SXM")
    assert (t4.arch, t4.max_blocks, t4.max_warps, t4.max_threads, t4.registers) == ("sm_75", 16, 32, 1024, 65536)
    assert (t4.smem_per_sm, t4.smem_per_block, t4.max_regs_per_thread) == (64 * 1024, 64 * 1024, 255)
    assert (h100.arch, h100.max_blocks, h100.max_warps, h100.max_threads, h100.registers) == ("sm_90", 32, 64, 2048, 65536)
    assert (h100.smem_per_sm, h100.smem_per_block, h100.smem_reserved_per_block) == (228 * 1024, 227 * 1024, 1024)
    assert occ.sm_count("T4") == 40 and occ.sm_count("H100 SXM") == 132


@pytest.mark.parametrize("gpu, threads, regs, smem, blocks, warps, fraction, limiter", [
    # 256 threads x 64 registers = 8 warps x 2048 registers: 32 warps fill the 64K register file
    ("H100 SXM", 256, 64, 0, 4, 32, 0.5, "registers"),
    ("T4", 256, 64, 0, 4, 32, 1.0, "warps"),  # the T4 holds only 32 warps anyway
    # Triton's 64x64x32 fp16 matmul, 3 stages: 3 x (64x32 + 32x64) x 2 B = 24 KB (+1 KB reserved) -> 9 blocks
    ("H100 SXM", 128, 32, 24 * 1024, 9, 36, 36 / 64, "shared memory"),
    ("T4", 128, 32, 24 * 1024, 2, 8, 8 / 32, "shared memory"),
    # one-warp blocks with few resources: the block slots run out first
    ("T4", 32, 16, 0, 16, 16, 0.5, "blocks"),
    ("H100 SXM", 32, 16, 0, 32, 32, 0.5, "blocks"),
    # 32 threads, 8 registers, 12 KB: (12 + 1) KB per block -> 228 // 13 = 17 blocks
    ("H100 SXM", 32, 8, 12 * 1024, 17, 17, 17 / 64, "shared memory"),
    # 1024-thread blocks: one fills a T4 SM, two an H100 SM
    ("T4", 1024, 32, 0, 1, 32, 1.0, "warps"),
    ("H100 SXM", 1024, 32, 0, 2, 64, 1.0, "warps"),
    # 40 registers x 32 = 1280 per warp (5 x 256): 51 warps fit, 6 blocks of 8 warps
    ("H100 SXM", 256, 40, 0, 6, 48, 0.75, "registers"),
])
def test_hand_worked(gpu, threads, regs, smem, blocks, warps, fraction, limiter):
    o = occ.occupancy(gpu, threads, regs, smem)
    assert (o.blocks_per_sm, o.warps_per_sm, o.limiter) == (blocks, warps, limiter)
    assert o.occupancy == pytest.approx(fraction)


def _simulate(lim, threads, regs, smem):
    """Place blocks on an empty SM one at a time until one more would not fit."""
    warps = -(-threads // 32)
    regs_per_block = warps * (-(-(regs * 32) // lim.reg_alloc_unit) * lim.reg_alloc_unit)
    smem_per_block = (-(-smem // lim.smem_alloc_unit) * lim.smem_alloc_unit + lim.smem_reserved_per_block) if smem else 0
    free = dict(blocks=lim.max_blocks, warps=lim.max_warps, regs=lim.registers, smem=lim.smem_per_sm)
    placed = 0
    while (free["blocks"] >= 1 and free["warps"] >= warps and free["regs"] >= regs_per_block
           and free["smem"] >= smem_per_block):
        free["blocks"] -= 1
        free["warps"] -= warps
        free["regs"] -= regs_per_block
        free["smem"] -= smem_per_block
        placed += 1
    return placed


@pytest.mark.parametrize("arch", ["sm_75", "sm_90"])
def test_against_simulation(arch):
    lim = occ.limits(arch)
    for threads, regs, smem in itertools.product((32, 64, 96, 128, 256, 512, 1024), (16, 32, 40, 64, 96, 128, 255),
                                                 (0, 1, 4096, 16 * 1024, 48 * 1024)):
        want = _simulate(lim, threads, regs, smem)
        if want == 0:
            with pytest.raises(ValueError):
                occ.occupancy(arch, threads, regs, smem)
            continue
        o = occ.occupancy(arch, threads, regs, smem)
        assert o.blocks_per_sm == want, (threads, regs, smem)
        assert 0 < o.occupancy <= 1


@pytest.mark.parametrize("call, match", [
    (lambda: occ.occupancy("T4", 1025), "at most 1024"),
    (lambda: occ.occupancy("T4", 128, 256), "at most 255"),
    (lambda: occ.occupancy("T4", 128, 32, 64 * 1024 + 1), "shared memory per block"),
    (lambda: occ.occupancy("H100 SXM", 128, 32, 227 * 1024 + 1), "shared memory per block"),
    (lambda: occ.occupancy("H100 SXM", 1024, 255), "more than the SM"),
    (lambda: occ.occupancy("A100", 128), "unknown GPU"),
    (lambda: occ.occupancy("T4", 0), "threads_per_block"),
    (lambda: occ.occupancy("T4", True), "threads_per_block"),
    (lambda: occ.waves("T4", 10, occ.occupancy("H100 SXM", 128)), "sm_90"),
    (lambda: occ.waves("T4", 0, occ.occupancy("T4", 128)), "blocks"),
])
def test_refuses(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_waves_and_tail():
    # 4096 x 4096 output in 128 x 128 tiles: 1024 blocks; 2 per SM on an H100 (96 KB each) -> 264 slots
    o = occ.occupancy("H100 SXM", 256, 128, 96 * 1024)
    assert o.blocks_per_sm == 2
    w = occ.waves("H100 SXM", 1024, o)
    assert (w.slots, w.waves) == (264, 4)
    assert w.tail_efficiency == pytest.approx(1024 / 1056)
    # one block more than a full wave: a second wave with one block in it
    one = occ.occupancy("H100 SXM", 1024, 64)
    assert one.blocks_per_sm == 1
    w = occ.waves("H100 SXM", 133, one)
    assert w.waves == 2 and w.tail_efficiency == pytest.approx(133 / 264)
    w = occ.waves("T4", 40 * 4, occ.occupancy("T4", 256, 64))
    assert w.waves == 1 and w.tail_efficiency == 1.0


@pytest.mark.parametrize("stride, ways", [(0, 1), (1, 1), (2, 2), (3, 1), (4, 4), (8, 8), (16, 16), (32, 32),
                                          (33, 1), (64, 32)])
def test_bank_conflicts(stride, ways):
    assert occ.bank_conflict_ways(stride) == ways


def test_limits_agree_with_the_published_figures():
    # the registry quotes NVIDIA's Turing and Hopper tuning guides; the calculator must use the same numbers
    from gpuformer_lib.published import figure

    for arch, prefix in (("sm_75", "sm75"), ("sm_90", "sm90")):
        lim = occ.LIMITS[arch]
        assert lim.max_warps == figure(f"{prefix}-max-warps-per-sm").value
        assert lim.max_blocks == figure(f"{prefix}-max-blocks-per-sm").value
        assert lim.smem_per_sm == figure(f"{prefix}-shared-memory-per-sm").value * 1024
