"""The grouped tile order of Triton's matmul tutorial: the kernel's result equals torch's (in Triton's
interpreter without a GPU), the order written out in Python is a permutation of the tiles, and a wave of
programs in grouped order reads fewer panels of A and B than in row-major order."""

import math

import pytest
import torch

from gpuformer_lib import kernels

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(kernels.kernel_support().triton_mode == "unavailable",
                                  reason="Triton is not installed here")


@needs_triton
@pytest.mark.parametrize("m, n, k, group_m", [(80, 48, 40, 2), (64, 96, 32, 8), (33, 17, 20, 3), (16, 16, 16, 1)])
def test_grouped_matmul_equals_torch(m, n, k, group_m):
    g = torch.Generator().manual_seed(m + n + k)
    a = torch.randn(m, k, generator=g).to(DEVICE)
    b = torch.randn(k, n, generator=g).to(DEVICE)
    out = kernels.grouped_matmul(a, b, block_m=16, block_n=16, block_k=16, group_m=group_m)
    tol = 1e-4 if DEVICE == "cpu" else 2e-2  # TF32 on a GPU
    assert torch.allclose(out, a @ b, atol=tol * k, rtol=tol)


@pytest.mark.parametrize("tiles_m, tiles_n, group_m", [(5, 3, 2), (8, 8, 8), (7, 4, 3), (1, 9, 4), (6, 1, 1)])
def test_the_order_is_a_permutation_of_the_tiles(tiles_m, tiles_n, group_m):
    order = kernels.grouped_tile_order(tiles_m, tiles_n, group_m)
    assert sorted(order) == [(i, j) for i in range(tiles_m) for j in range(tiles_n)]


def test_group_of_one_row_is_row_major_and_groups_walk_columns():
    assert kernels.grouped_tile_order(2, 3, 1) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert kernels.grouped_tile_order(4, 2, 2)[:4] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert kernels.grouped_tile_order(3, 2, 2)[4:] == [(2, 0), (2, 1)]  # the short last group


def test_a_wave_in_grouped_order_reads_fewer_panels():
    wave = 64
    row_major = kernels.wave_working_set(kernels.grouped_tile_order(64, 128, 1), wave)
    grouped = kernels.wave_working_set(kernels.grouped_tile_order(64, 128, int(math.sqrt(wave))), wave)
    assert max(row_major) == wave + 1 and min(row_major) == wave + 1
    assert max(grouped) == 2 * int(math.sqrt(wave))


@pytest.mark.parametrize("args", [(0, 2, 1), (2, 2, 0), (2, 2.0, 1)])
def test_bad_sizes_raise(args):
    with pytest.raises(ValueError):
        kernels.grouped_tile_order(*args)
