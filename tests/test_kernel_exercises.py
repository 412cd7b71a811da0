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


def test_roofs_answers_of_the_wrong_form(capsys):
    """(The plausible wrong answers, with their hints, are in tests/answer_tables/kernels.py.)"""
    right = _right_roofs()
    poly = "degree-128 polynomial (Horner), float32"
    assert not ex.check_kernel_roofs({k: v for k, v in right.items() if k != poly})
    assert "missing" in capsys.readouterr().out
    assert not ex.check_kernel_roofs(None)
    assert not ex.check_kernel_roofs({**right, poly: (32.0, "memory")})
    assert "triple" in capsys.readouterr().out
    # a miss that matches no known mistake names the method, not the numbers
    assert not ex.check_kernel_roofs({**right, poly: (7.0, "compute", "compute")})
    out = capsys.readouterr().out
    assert "Count the FLOPs" in out and "256" not in out


def test_roofs_intensity_mistakes_are_told_apart():
    """Each kernel's known mistakes give intensities distinct from the right one and from each other."""
    for name, (flops, nbytes) in ex.KERNEL_ROOF_COSTS.items():
        values = [flops / nbytes] + [v for v, _ in ex._intensity_mistakes(name, flops, nbytes)]
        for i, a in enumerate(values):
            assert all(abs(a / b - 1) > 0.04 for b in values[i + 1:]), name


def test_old_roofline_check_uses_the_cuda_core_roof_for_float32_kernels():
    right = {name: (f / b, "compute" if "matmul" in name else "memory") for name, (f, b) in ex.KERNEL_COSTS.items()}
    assert ex.check_kernel_roofline(right)


def test_strided_copy_prediction_grades_the_byte_count_not_the_timing(capsys):
    """(The right answer and the plausible wrong ones are in tests/answer_tables/kernels.py.) The measurement is
    shown, not graded: the sector count passes whatever a busy machine measured, and a wrong model that
    happens to sit near the measurement still fails."""
    assert ex.strided_gather_bytes(1) == 16 and ex.strided_gather_bytes(8) == 44 and ex.strided_gather_bytes(64) == 44
    assert ex.check_strided_copy_prediction(2.75, 6.0, stride=8)
    assert "shown beside the model, not graded" in capsys.readouterr().out
    assert not ex.check_strided_copy_prediction(4.5, 4.5, stride=8)  # the index left out, measured 4.5x
    assert "leaving out the index" in capsys.readouterr().out
    assert not ex.check_strided_copy_prediction("2.75", 2.75, stride=8)
    assert ex.check_strided_copy_prediction(44 / 16, None, stride=8)  # no measurement at all
    with pytest.raises(ValueError):
        ex.check_strided_copy_prediction(2.75, 2.75, stride=1)  # the notebook's stride: bad input raises
    assert ex.check_strided_copy_prediction(2.75, 3.0, stride=16)  # (8 + 32 + 4) / 16 still: one sector each


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


def test_strided_copy_prediction_takes_a_measuring_function(capsys):
    """A measuring function is called once, for the number shown beside the model; a slow timing changes no grade."""
    calls = []

    def measure():
        calls.append(1)
        return 12.0  # 4x too slow: a busy machine

    assert ex.check_strided_copy_prediction(2.75, measure, stride=8)
    assert len(calls) == 1 and "this device measured 12 x" in capsys.readouterr().out
    assert not ex.check_strided_copy_prediction(100.0, lambda: 3.0, stride=8)  # a real miss stays a miss
    assert "too high" in capsys.readouterr().out
    assert ex.check_strided_copy_prediction(2.75, 3.0, stride=8, measured_by="a test measured")
    assert "a test measured 3" in capsys.readouterr().out


def test_occupancy_limiter(capsys):
    cfg = dict(threads_per_block=256, regs_per_thread=64, smem_per_block=24 * 1024)
    t4, h100 = (occupancy.occupancy(g, 256, 64, 24 * 1024) for g in ("T4", "H100 SXM"))
    assert (t4.limiter, h100.limiter) == ("shared memory", "registers")  # by hand: 64/24 -> 2 blocks; 65,536/2,048/8 -> 4
    # (the right answer and the plausible wrong ones are in tests/answer_tables/kernels.py)
    right = {"T4": ("shared memory", {"smem_per_block": 16 * 1024}), "H100 SXM": ("registers", {"regs_per_thread": 32})}
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
