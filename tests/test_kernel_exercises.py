"""Chapter 2's checks: two roofs on two GPUs, the strided-copy and occupancy predictions, and the CUDA C
launcher's habits (current stream, launch check, 64-bit sizes), which cannot be compiled without a GPU."""

import re

import torch

from gpuformer_lib import kernels, occupancy
from gpuformer_lib.exercises import kernels as ex
from gpuformer_lib.gpu_view import bandwidth, compute_ceiling


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
