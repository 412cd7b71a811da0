"""The course's kernels against PyTorch on fresh random inputs, sizes that are not multiples of the
block size included; in Triton's interpreter on a machine without a GPU, compiled on one."""

import pytest
import torch

from gpuformer_lib import kernels

needs_triton = pytest.mark.skipif(kernels.kernel_support().triton_mode == "unavailable",
                                  reason="Triton is not installed")
DEVICE = "cuda" if kernels.kernel_support().triton_mode == "compiled" else "cpu"


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(2024)


@needs_triton
@pytest.mark.parametrize("n", [1, 127, 1024, 1025, 10_003])
@pytest.mark.parametrize("block_size", [128, 1024])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_vector_add(n, block_size, dtype):
    x, y = (torch.randn(n, device=DEVICE, dtype=dtype) for _ in range(2))
    assert torch.equal(kernels.vector_add(x, y, block_size), x + y)


@needs_triton
@pytest.mark.parametrize("stride", [1, 2, 7, 32])
def test_strided_copy(stride):
    x = torch.randn(5003, device=DEVICE)
    expected = x[(torch.arange(5003, device=DEVICE) * stride) % 5003]
    assert torch.equal(kernels.strided_copy(x, stride, block_size=256), expected)


@needs_triton
@pytest.mark.parametrize("shape", [(1, 1), (3, 1024), (67, 129), (5, 1000)])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.float16, 2e-3)])
def test_softmax(shape, dtype, tol):
    x = (10 * torch.randn(*shape, device=DEVICE)).to(dtype)  # large values: needs the stable form
    out = kernels.softmax(x)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), x.float().softmax(-1), rtol=tol, atol=tol)


@needs_triton
def test_softmax_of_a_strided_view():
    x = torch.randn(20, 64, device=DEVICE)[::2]  # every other row: row stride 128
    torch.testing.assert_close(kernels.softmax(x), x.softmax(-1))


@needs_triton
@pytest.mark.parametrize("m, k, n", [(67, 83, 45), (16, 16, 16), (1, 300, 5), (130, 33, 70)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matmul(m, k, n, dtype):
    a = torch.randn(m, k, device=DEVICE).to(dtype)
    b = torch.randn(k, n, device=DEVICE).to(dtype)
    expected = a.float() @ b.float()
    # float16 output rounding, or TF32 products for float32 on a GPU
    tol = 2e-2 if dtype == torch.float16 or DEVICE == "cuda" else 1e-4
    out = kernels.matmul(a, b, block_m=32, block_n=32, block_k=16)
    assert out.shape == (m, n) and out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, rtol=tol, atol=tol * k**0.5)


@needs_triton
@pytest.mark.parametrize("call, message", [
    (lambda: kernels.vector_add(torch.ones(3, device="meta"), torch.ones(3, device="meta")), "must be on the"),
    (lambda: kernels.vector_add(torch.ones(3, device=DEVICE), torch.ones(4, device=DEVICE)), "one shape and dtype"),
    (lambda: kernels.softmax(torch.ones(3, device=DEVICE)), "2-D"),
    (lambda: kernels.matmul(torch.ones(3, 4, device=DEVICE), torch.ones(5, 2, device=DEVICE)), r"\(M, K\) and \(K, N\)"),
    (lambda: kernels.matmul(torch.ones(3, 4, device=DEVICE), torch.ones(4, 2, device=DEVICE), block_k=24),
     "power of two"),
    (lambda: kernels.strided_copy(torch.ones(2, 2, device=DEVICE), 1), "1-D tensor"),
])
def test_kernel_input_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
def test_support_without_a_gpu():
    support = kernels.kernel_support()
    assert support.triton_mode in ("interpreted", "unavailable")
    assert not support.cuda_c and "CUDA GPU" in support.cuda_c_reason
    assert "interpreter" in str(support) or "not installed" in str(support)
    with pytest.raises(kernels.KernelUnavailableError, match="needs a CUDA GPU"):
        kernels.cuda_add(torch.ones(3), torch.ones(3))


@needs_triton
@pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter's limitation")
def test_interpreter_rejects_bfloat16_with_a_reason():
    with pytest.raises(ValueError, match="no bfloat16"):
        kernels.vector_add(torch.ones(3, dtype=torch.bfloat16), torch.ones(3, dtype=torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.skipif(not kernels.kernel_support().cuda_c, reason="needs a CUDA GPU, nvcc and ninja")
def test_cuda_c_add():
    x, y = torch.randn(100_001, device="cuda"), torch.randn(100_001, device="cuda")
    for blocks, threads in ((1, 32), (256, 256)):  # a tiny grid must still cover all of n
        assert torch.equal(kernels.cuda_add(x, y, blocks, threads), x + y)
    with pytest.raises(ValueError, match="threads must be an int from 1 to 1024"):  # checked before the launch
        kernels.cuda_add(x, y, 1, 2048)
    if torch.cuda.device_count() >= 2:  # tensors on another GPU than the current one: the device guard
        x1, y1 = x.to("cuda:1"), y.to("cuda:1")
        assert torch.equal(kernels.cuda_add(x1, y1), x1 + y1)


@pytest.fixture
def cuda_toolkit(monkeypatch, tmp_path):
    """A machine with a GPU, PyTorch built for CUDA 12.4, ninja, and a toolkit in a folder that is not on
    PATH (as /usr/local/cuda on many cloud images); returns a function that installs nvcc of a version."""
    from torch.utils import cpp_extension

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: True)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    kernels._nvcc_cuda_version.cache_clear()

    def install_nvcc(release: str) -> str:
        (tmp_path / "bin").mkdir(exist_ok=True)
        nvcc = tmp_path / "bin" / "nvcc"
        nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
        nvcc.chmod(0o755)
        kernels._nvcc_cuda_version.cache_clear()
        return str(nvcc)

    yield install_nvcc
    kernels._nvcc_cuda_version.cache_clear()


def test_cuda_c_support_uses_the_toolkit_pytorch_finds(cuda_toolkit):
    ok, reason = kernels._cuda_c_support()
    assert not ok and "needs the CUDA toolkit's compiler nvcc" in reason
    nvcc = cuda_toolkit("12.6")  # only where torch.utils.cpp_extension looks, not on PATH
    ok, reason = kernels._cuda_c_support()
    assert ok, reason
    assert reason == f"nvcc at {nvcc} (CUDA 12.6), PyTorch built for CUDA 12.4"


def test_cuda_c_support_refuses_another_cuda_major_version(cuda_toolkit):
    cuda_toolkit("11.8")
    ok, reason = kernels._cuda_c_support()
    assert not ok and "is CUDA 11.8, but PyTorch is built for CUDA 12.4" in reason
    assert not kernels.kernel_support().cuda_c  # so chapter 2 skips the kernel instead of failing to build


def test_cuda_c_support_needs_ninja(cuda_toolkit, monkeypatch):
    from torch.utils import cpp_extension

    cuda_toolkit("12.4")
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: False)
    assert kernels._cuda_c_support() == (False, "needs the ninja build tool: pip install ninja")


def test_triton_imported_before_the_interpreter_is_switched_on_is_explained(tmp_path):
    """On a machine without a GPU, an optimizer step imports Triton before gpuformer_lib.kernels can set
    TRITON_INTERPRET=1; its own jit'd helpers then fail inside an interpreted kernel with a cryptic error, so
    kernel_support says why and what to do (a fresh process: this one has imported kernels long ago)."""
    import subprocess
    import sys

    code = ("import os, sys, torch\n"
            "os.environ.pop('TRITON_INTERPRET', None)\n"
            "p = torch.nn.Parameter(torch.zeros(2)); o = torch.optim.AdamW([p]); p.grad = torch.ones(2); o.step()\n"
            "early = 'triton' in sys.modules\n"
            "from gpuformer_lib import kernels\n"
            "print(early, kernels.TOO_LATE in kernels.kernel_support().triton_reason)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""})
    early, explained = done.stdout.split()
    assert explained == early  # explained exactly when Triton came first
