"""Chapter 2's checks: two roofs on two GPUs, the strided-copy and occupancy predictions, and the CUDA C
launcher's habits (current stream, launch check, 64-bit sizes), which cannot be compiled without a GPU."""

import re

import pytest
import torch

from gpuformer_lib import kernels, occupancy
from gpuformer_lib.exercises import kernels as ex
from gpuformer_lib.predict.roofline import datasheet_bandwidth as bandwidth, datasheet_ceiling as compute_ceiling


def _right_roofs():
    answers = {}
    for name, (flops, nbytes) in ex.KERNEL_ROOF_COSTS.items():
        matmul = "matmul" in name
        dtype = torch.float16 if matmul else torch.float32
        bounds = tuple("compute" if flops / nbytes > compute_ceiling(g, dtype, tensor_cores=matmul) / bandwidth(g)
                       else "memory" for g in ex.ROOF_GPUS)
        answers[name] = (flops / nbytes, *bounds)
    return answers


def test_roofs_right_answer_and_the_cases_that_need_two_roofs():
    right = _right_roofs()
    assert ex.check_kernel_roofs(right)
    # the element-wise polynomial is compute-bound on CUDA cores, 'memory' against the tensor-core ridge
    assert right["degree-128 polynomial (Horner), float32"][1:] == ("compute", "compute")
    # the 768-cube product clears the T4's tensor-core ridge (203) but not the H100's (295)
    assert right["tiled matmul 768 x 768 x 768, float16"][1:] == ("compute", "memory")
    assert right["vector add, float32"][1:] == ("memory", "memory")


def test_roofs_wrong_roof_is_named(capsys):
    right = _right_roofs()
    poly = "degree-128 polynomial (Horner), float32"
    result = ex.check_kernel_roofs({**right, poly: (32.0, "memory", "memory")})
    assert not result
    out = capsys.readouterr().out
    assert "CUDA-core" in out and "never runs on tensor cores" in out
    assert not ex.check_kernel_roofs({**right, poly: (1 / 32, "compute", "compute")})
    assert "upside down" in capsys.readouterr().out
    assert not ex.check_kernel_roofs({k: v for k, v in right.items() if k != poly})
    assert "missing" in capsys.readouterr().out
    assert not ex.check_kernel_roofs(None)


def test_old_roofline_check_uses_the_cuda_core_roof_for_float32_kernels():
    right = {name: (f / b, "compute" if "matmul" in name else "memory") for name, (f, b) in ex.KERNEL_COSTS.items()}
    assert ex.check_kernel_roofline(right)


def test_strided_copy_prediction(capsys):
    assert ex.check_strided_copy_prediction(4.5, 6.0, stride=8)
    assert not ex.check_strided_copy_prediction(1.0, 6.0, stride=8)
    assert "Too low" in capsys.readouterr().out
    assert not ex.check_strided_copy_prediction(40.0, 6.0, stride=8)
    assert "Too high" in capsys.readouterr().out
    assert not ex.check_strided_copy_prediction("4.5", 6.0, stride=8)


def test_occupancy_prediction(capsys):
    cfg = dict(threads_per_block=256, regs_per_thread=64, smem_per_block=24 * 1024, blocks=1000)
    want = {}
    for gpu in occupancy.GPUS:
        o = occupancy.occupancy(gpu, 256, 64, 24 * 1024)
        want[gpu] = (o.occupancy, occupancy.waves(gpu, 1000, o).waves)
    assert want == {"T4": (0.5, 13), "H100 SXM": (0.5, 2)}  # by hand: shared memory (T4), registers (H100)
    assert ex.check_occupancy_prediction(want, **cfg)
    assert not ex.check_occupancy_prediction({**want, "T4": (16, 13)}, **cfg)
    assert "resident warps" in capsys.readouterr().out
    assert not ex.check_occupancy_prediction({**want, "H100 SXM": (0.5, 3)}, **cfg)
    assert "waves are off" in capsys.readouterr().out
    assert not ex.check_occupancy_prediction({"T4": (0.5, 13)}, **cfg)


def test_cuda_launcher_habits():
    src = kernels.CUDA_ADD_SOURCE
    assert "at::cuda::getCurrentCUDAStream()" in src  # PyTorch's current stream, not the legacy default one
    launch = re.search(r"add_kernel<<<([^>]*)>>>", src).group(1)
    assert "getCurrentCUDAStream" in launch
    after = src[src.index("add_kernel<<<"):]
    assert "C10_CUDA_KERNEL_LAUNCH_CHECK();" in after  # a failed launch raises at the launch
    assert re.search(r"__global__ void add_kernel\(int64_t n,", src)  # 64-bit sizes: over 2^31 elements
    assert not re.search(r"\bint (n|i|index|stride)\b", src)
    assert "CUDAGuard" in src


def test_interpreter_slowdown_is_not_typed_in_the_docstring():
    # the notebook measures it; a typed factor was wrong by 3-10x (review of chapter 2)
    assert not re.search(r"(thousand|\d+ ?x) (times )?slower", kernels.__doc__ + kernels._choose_triton_mode.__code__.co_consts.__repr__())


def test_strided_copy_prediction_measures_again(capsys):
    """A measuring function is passed through to grade_prediction: a slow first timing is re-measured."""
    timings = iter([12.0, 3.0, 3.0])  # the first measurement is 4x too slow (a busy machine)
    calls = []

    def measure():
        calls.append(1)
        return next(timings)

    assert ex.check_strided_copy_prediction(2.75, measure, stride=8)
    assert len(calls) == 2 and "closest of 2 measurements" in capsys.readouterr().out
    assert not ex.check_strided_copy_prediction(100.0, lambda: 3.0, stride=8)  # a real miss stays a miss
    assert "Too high" in capsys.readouterr().out
    assert ex.check_strided_copy_prediction(2.75, 3.0, stride=8, measured_by="a test measured")  # still a number
    assert "a test measured 3" in capsys.readouterr().out


def test_occupancy_limiter(capsys):
    cfg = dict(threads_per_block=256, regs_per_thread=64, smem_per_block=24 * 1024)
    t4, h100 = (occupancy.occupancy(g, 256, 64, 24 * 1024) for g in ("T4", "H100 SXM"))
    assert (t4.limiter, h100.limiter) == ("shared memory", "registers")  # by hand: 64/24 -> 2 blocks; 65,536/2,048/8 -> 4
    right = {"T4": ("shared memory", {"smem_per_block": 16 * 1024}), "H100 SXM": ("registers", {"regs_per_thread": 32})}
    assert ex.check_occupancy_limiter(right, **cfg)
    assert not ex.check_occupancy_limiter({**right, "T4": ("registers", {"smem_per_block": 16 * 1024})}, **cfg)
    assert "not 'registers'" in capsys.readouterr().out
    # halving shared memory on the H100 does nothing: registers still limit it
    assert not ex.check_occupancy_limiter({**right, "H100 SXM": ("registers", {"smem_per_block": 12 * 1024})}, **cfg)
    assert "not twice" in capsys.readouterr().out
    # too small a cut: 20 KB still allows only 3 blocks on a T4
    assert not ex.check_occupancy_limiter({**right, "T4": ("shared memory", {"smem_per_block": 20 * 1024})}, **cfg)
    assert not ex.check_occupancy_limiter({**right, "T4": ("shared memory", {"smem_per_block": 100 * 1024})}, **cfg)
    assert "does not launch" in capsys.readouterr().out
    assert not ex.check_occupancy_limiter({**right, "T4": ("shared memory", {"smem": 1})}, **cfg)
    assert not ex.check_occupancy_limiter({"T4": right["T4"]}, **cfg)


def test_triton_matmul_prediction_uses_the_units_tl_dot_runs_on():
    """Triton >= 3.2 runs tl.dot on FMA units below sm_80: the T4's prediction sits at the CUDA-core roof."""
    from gpuformer_lib.profiles import PROFILES

    assert not kernels.triton_dot_uses_tensor_cores("T4") and kernels.triton_dot_uses_tensor_cores("H100 SXM")
    # the same rule as the device profiles' flag
    assert kernels.triton_dot_uses_tensor_cores("T4") == PROFILES["t4"].triton_tensor_cores
    assert kernels.triton_dot_uses_tensor_cores("H100 SXM") == PROFILES["h100-80gb"].triton_tensor_cores
    t4, t4_tc = kernels.triton_matmul_prediction(4096, 4096, 4096, torch.float16, "T4")
    h100, h100_tc = kernels.triton_matmul_prediction(4096, 4096, 4096, torch.float16, "H100 SXM")
    assert (t4_tc, h100_tc) == (False, True)
    from gpuformer_lib import predict
    cuda_cores = predict.achievable_rate("T4", "fp32")[0]
    assert abs(t4.flops_per_second - cuda_cores) / cuda_cores < 1e-9  # the CUDA cores' rate, not the tensor cores'
    assert t4.flops_per_second < compute_ceiling("T4", torch.float16, tensor_cores=True) / 4
    assert h100.flops_per_second == pytest.approx(predict.achievable_rate("H100 SXM", "fp16")[0])
    assert h100.bound == "compute" and h100.flops_per_second < compute_ceiling("H100 SXM", torch.float16,
                                                                              tensor_cores=True)


def test_strided_copy_tolerance():
    assert ex.STRIDED_COPY_WITHIN == 2.5  # the notebook's exercise 2.4 states this factor
    assert ex.check_strided_copy_prediction(2.75, 2.75 * 2.4, stride=8)  # a CPU's ~5x against the sector count
    assert not ex.check_strided_copy_prediction(1.0, 2.75, stride=8)  # ignoring the sectors misses on a GPU
