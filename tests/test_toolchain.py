"""The stack report and its diagnosis (every branch on synthetic reports), graph breaks found and removed, the
kernels' sources picked out of an Inductor module (the real
compile of a fused LayerNorm + GELU is asserted in chapter 16's notebook, which CI runs: a cold C++ compile costs
seconds), the compile's break-even arithmetic, and the determinism switches put back afterwards."""

import dataclasses
import os
import time

import pytest
import torch

from fake_clock import FakeClock

from gpuformer_lib import bench
from gpuformer_lib import toolchain as tc


def cpu_report(**changes) -> tc.StackReport:
    """A healthy CPU-only machine with a CPU wheel."""
    base = dict(torch_version="2.13.0+cpu", build="CPU", cuda_runtime=None, hip_runtime=None, cudnn=None, nccl=None,
                triton="3.9.0", cpu_capability="AVX2", onednn=True, mkl=True, threads=4, gpu_usable=False,
                gpu_name=None, mps_available=False, driver=None, driver_cuda=None, driver_gpus=0)
    base.update(changes)
    return tc.StackReport(**base)


def cuda_report(**changes) -> tc.StackReport:
    """A healthy NVIDIA machine with a cu128 wheel and a driver that serves CUDA 12.8."""
    base = dict(build="CUDA", torch_version="2.13.0+cu128", cuda_runtime="12.8", cudnn=91002, nccl="2.27.3",
                gpu_usable=True, gpu_name="NVIDIA H100 80GB HBM3", driver="570.124.06", driver_cuda="12.8",
                driver_gpus=1)
    base.update(changes)
    return cpu_report(**base)


# --------------------------------------------------------------------------- the stack


def test_this_machine_reports_a_consistent_stack():
    r = tc.stack_report()
    assert r.torch_version == torch.__version__ and r.cuda_runtime == torch.version.cuda
    assert r.gpu_usable == torch.cuda.is_available() and r.threads == torch.get_num_threads()
    assert (r.build == "CPU") == (torch.version.cuda is None and getattr(torch.version, "hip", None) is None
                                  and not torch.backends.mps.is_built())
    assert r.nccl is None or r.gpu_usable  # read only where a GPU is usable
    layers = [row[0] for row in r.rows()]
    for layer in ("NVIDIA driver", "CUDA runtime", "cuDNN", "NCCL", "Triton", "HIP (ROCm)"):
        assert layer in layers
    assert "PyTorch" in r.table() and r.cpu_capability in r.table()


def test_healthy_reports_have_no_problem():
    assert tc.diagnose_stack(cpu_report()) == []
    assert tc.diagnose_stack(cuda_report()) == []
    assert tc.diagnose_stack(cuda_report(driver_cuda="12.9")) == []  # a newer driver serves older runtimes


def test_cpu_wheel_on_a_gpu_machine():
    [line] = tc.diagnose_stack(cpu_report(driver="550.54.15", driver_cuda="12.4", driver_gpus=2))
    assert line.startswith("problem:") and "CPU-only" in line and "2 GPU(s)" in line and "whl/cu124" in line
    assert "torch 2.6" in line and line.index("update the NVIDIA driver") < line.index("whl/cu124")
    [line] = tc.diagnose_stack(cpu_report(driver="535.1", driver_cuda="12.2", driver_gpus=1))
    assert "whl/cu121" in line and "cu122" not in line  # PyTorch never published a cu122 index


def test_wheel_index_names_only_published_tags():
    assert tc.wheel_index_for_driver("12.4") == ("cu124", "2.6")
    assert tc.wheel_index_for_driver("12.5") == ("cu124", "2.6")  # no cu125: the newest tag below it
    assert tc.wheel_index_for_driver("13.1")[0] == "cu130"
    assert tc.wheel_index_for_driver("11.4") is None and tc.wheel_index_for_driver(None) is None
    assert not {"cu122", "cu123", "cu125", "cu127"} & set(tc.PYTORCH_CUDA_INDEXES)
    for tag, ((major, minor), newest) in tc.PYTORCH_CUDA_INDEXES.items():
        assert tag == f"cu{major}{minor}" and newest.startswith("2.")


def test_a_wheel_without_the_gpus_architecture():
    cu126 = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")
    [line] = tc.diagnose_stack(cuda_report(gpu_capability="12.0", arch_list=cu126))
    assert "no kernel image is available" in line and "12.0" in line
    assert tc.diagnose_stack(cuda_report(gpu_capability="8.9", arch_list=cu126)) == []  # sm_86 cubin runs on 8.9
    assert tc.arch_supported("12.0", ("sm_90", "compute_90"))  # PTX: the driver compiles it for newer GPUs
    assert not tc.arch_supported("9.1", ("sm_90a",)) and tc.arch_supported("9.0", ("sm_90a",))
    assert not tc.arch_supported("7.5", ("sm_80", "sm_90"))  # an old GPU, a wheel that dropped it
    with pytest.raises(ValueError, match="capability"):
        tc.arch_supported("Turing", cu126)


def test_system_cuda_libraries_shadowing_the_wheels(tmp_path):
    (tmp_path / "libcudnn.so.8").write_bytes(b"")
    assert tc._shadowing_libraries(f"{tmp_path}:/nonexistent") == (str(tmp_path),)
    [line] = tc.diagnose_stack(cuda_report(shadowing_libraries=(str(tmp_path),)))
    assert "LD_LIBRARY_PATH" in line and "undefined symbol" in line


def test_driver_older_than_the_runtime():
    [minor] = tc.diagnose_stack(cuda_report(driver_cuda="12.2"))
    assert "12.8" in minor and "12.2" in minor and "minor-version" in minor and "PTX" in minor
    assert "TRITON_PTXAS_PATH" in minor and "device kernel image is invalid" in minor and "whl/cu121" in minor
    [major] = tc.diagnose_stack(cuda_report(driver_cuda="11.8", gpu_usable=False, gpu_name=None))
    assert "older major version" in major and "is_available() is False" in major and "too old" in major


def test_cuda_wheel_without_a_usable_gpu():
    [no_driver] = tc.diagnose_stack(cuda_report(gpu_usable=False, gpu_name=None, nccl=None, driver=None,
                                                driver_cuda=None, driver_gpus=0))
    assert "no NVIDIA driver" in no_driver and "whl/cpu" in no_driver
    [hidden] = tc.diagnose_stack(cuda_report(gpu_usable=False, gpu_name=None, nccl=None))
    assert "CUDA_VISIBLE_DEVICES" in hidden


def test_gpu_without_nccl_or_triton():
    lines = tc.diagnose_stack(cuda_report(nccl=None, triton=None))
    assert len(lines) == 2 and "gloo" in lines[0] and "torch.compile" in lines[1]


def test_rocm_and_mps_get_notes_not_problems():
    [rocm] = tc.diagnose_stack(cpu_report(build="ROCm (HIP)", hip_runtime="6.4", nccl="2.26.6", gpu_usable=True,
                                          gpu_name="AMD Instinct MI300X"))
    assert rocm.startswith("note:") and "torch.cuda" in rocm and "MIOpen" in rocm
    assert "no TF32 on MI200" in rocm and "MI300 can use it" in rocm and "there is no TF32," not in rocm
    rows = dict((r[0], r[1]) for r in cpu_report(build="ROCm (HIP)", hip_runtime="6.4", cudnn=30400).rows())
    assert "cuDNN / MIOpen" in rows and "cuDNN" not in rows
    [mps] = tc.diagnose_stack(cpu_report(build="MPS", mps_available=True))
    assert mps.startswith("note:") and "device='mps'" in mps and "not available" not in mps
    assert "torch.mps.Event" in mps and "set_per_process_memory_fraction" in mps and "memory caps" not in mps
    [mps_off] = tc.diagnose_stack(cpu_report(build="MPS"))
    assert "not available here" in mps_off


def test_bad_reports_are_refused():
    with pytest.raises(ValueError, match="build must be"):
        cpu_report(build="TPU")
    with pytest.raises(ValueError, match="look like"):
        cuda_report(cuda_runtime="twelve")
    with pytest.raises(TypeError, match="StackReport"):
        tc.diagnose_stack({"build": "CPU"})


# --------------------------------------------------------------------------- the compiler


def with_a_break(x):
    y = torch.sin(x)
    if y.sum().item() > 0:  # a Python branch on a tensor's value: Dynamo must leave the graph to read it
        y = y * 2
    return torch.cos(y)


def without_a_break(x):
    y = torch.sin(x)
    y = torch.where(y.sum() > 0, y * 2, y)  # the same choice, made inside the graph
    return torch.cos(y)


def test_a_graph_break_is_found_and_removed():
    x = torch.randn(32)
    torch.testing.assert_close(with_a_break(x), without_a_break(x))
    broken, fixed = tc.graph_breaks(with_a_break, x), tc.graph_breaks(without_a_break, x)
    assert broken.graphs == 2 and broken.breaks == 1
    assert len(broken.reasons) == 1 and "item()" in broken.reasons[0]
    assert fixed.graphs == 1 and fixed.breaks == 0 and fixed.reasons == ()
    assert "1 break(s)" in str(broken)


CPP_MODULE = """
cpp_fused_gelu_0 = async_compile.cpp_pybinding(['float*', 'const float*'], r'''
extern "C" void kernel(float* out, const float* in) { out[0] = in[0]; }
''')
"""
TRITON_MODULE = """
triton_per_fused_gelu_0 = async_compile.triton('triton_per_fused_gelu_0', '''
import triton
@triton.jit
def triton_per_fused_gelu_0(in_ptr0, out_ptr0, xnumel, r0_numel):
    pass
''', device_str='cuda')
"""


def test_kernel_sources_finds_cpp_and_triton_kernels():
    [cpp] = tc.kernel_sources(CPP_MODULE)
    assert cpp.startswith('extern "C" void kernel') and "async_compile" not in cpp
    [triton] = tc.kernel_sources(TRITON_MODULE)
    assert "@triton.jit" in triton and "device_str" not in triton
    assert tc.kernel_sources(CPP_MODULE + TRITON_MODULE) == (cpp, triton)
    assert tc.kernel_sources("def call(args): pass") == ()


def test_break_even_arithmetic():
    calls, how = tc.break_even_calls(3.0, 0.5, 0.25)  # 3 s to compile, 0.25 s saved per call
    assert calls == 12 and "250000.0 µs saved" in how
    assert tc.break_even_calls(3.0001, 0.5, 0.25)[0] == 13  # a part of a call still needs the whole call
    assert tc.break_even_calls(1e-9, 30e-6, 10e-6)[0] == 1
    slower, why = tc.break_even_calls(2.0, 10e-6, 30e-6)
    assert slower is None and "never pays back" in why
    with pytest.raises(ValueError, match="finite"):
        tc.break_even_calls(float("nan"), 1.0, 1.0)


def test_compile_cost_times_both_paths_and_agrees_with_its_parts():
    x = torch.randn(16, 16)
    cost = tc.compile_cost(without_a_break, x, repeats=5, number=2, backend="eager")
    assert cost.compile_s >= 0 and cost.eager_s > 0 and cost.compiled_s > 0
    assert cost.speedup == pytest.approx(cost.eager_s / cost.compiled_s)
    assert (cost.comparison.baseline, cost.comparison.candidate) == ("eager", "compiled")
    if cost.comparison.verdict == "faster":
        assert (cost.break_even_calls, cost.reason) == tc.break_even_calls(cost.compile_s, cost.eager_s,
                                                                           cost.compiled_s)
    else:
        assert cost.break_even_calls is None and "never pays" in cost.reason
    with pytest.raises(ValueError, match="repeats"):
        tc.compile_cost(without_a_break, x, repeats=3)


def test_compile_cost_times_through_the_interleaved_helper_and_a_tie_never_pays(monkeypatch):
    # every timed round lasts one tick of a fake clock: equal times, a tie, so no break-even is claimed
    monkeypatch.setattr(bench, "time", FakeClock(tick=1e-3))
    cost = tc.compile_cost(without_a_break, torch.randn(16, 16), repeats=5, number=2, backend="eager")
    assert len(cost.comparison.ratios) == 5 and cost.comparison.verdict == "no difference we can see"
    assert cost.eager_s == cost.compiled_s == pytest.approx(0.5e-3)  # one tick over 2 calls
    assert cost.break_even_calls is None and "never pays" in cost.reason


def test_cuda_graphs_speedup_refuses_a_cpu_and_rehearses_the_loop(monkeypatch):
    from gpuformer_lib.compression import demo_config

    config = dataclasses.replace(demo_config(16, d_model=16, n_layers=1), max_len=8)
    monkeypatch.delenv("GPUFORMER_REHEARSE", raising=False)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        tc.cuda_graphs_speedup(config, "cpu")
    with pytest.raises(TypeError, match="TransformerConfig"):
        tc.cuda_graphs_speedup(None, "cuda")
    monkeypatch.setenv("GPUFORMER_REHEARSE", "t4")
    result = tc.cuda_graphs_speedup(config, "cpu", steps=2, batch=2, seq=8, warmup=1)
    assert result.rehearsed and result.steps == 2 and result.compiled_step_s > 0 and result.graphed_step_s > 0
    assert result.speedup == pytest.approx(result.compiled_step_s / result.graphed_step_s)


def test_cuda_graphs_are_refused_on_a_plain_cpu_and_skipped_in_rehearsal(monkeypatch):
    model = torch.nn.Linear(4, 4)
    monkeypatch.delenv("GPUFORMER_REHEARSE", raising=False)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        tc.cuda_graphs_compile(model, "cpu")
    monkeypatch.setenv("GPUFORMER_REHEARSE", "t4")
    assert tc.cuda_graphs_compile(model, "cpu") is model


# --------------------------------------------------------------------------- determinism


def test_deterministic_switches_are_set_inside_and_put_back():
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark,
              torch.backends.cudnn.deterministic, os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
              torch.is_deterministic_algorithms_warn_only_enabled())
    torch.backends.cudnn.benchmark = True
    try:
        with tc.deterministic_algorithms():
            assert torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.benchmark
            assert torch.backends.cudnn.deterministic
            # not set late: cuBLAS reads it only when CUDA starts (enable_reproducible_cublas does it in time)
            assert os.environ.get("CUBLAS_WORKSPACE_CONFIG") == before[3]
            with pytest.raises(RuntimeError, match="does not have a deterministic implementation"):
                torch.zeros(3).put_(torch.tensor([0, 0]), torch.ones(2))  # two writes to one place: which wins?
        assert torch.backends.cudnn.benchmark  # put back
        assert (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
                os.environ.get("CUBLAS_WORKSPACE_CONFIG")) == (before[0], before[2], before[3])
        with tc.deterministic_algorithms(warn_only=True):
            assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled() == before[4]  # put back, whatever it was
        with pytest.raises(KeyError), tc.deterministic_algorithms():
            raise KeyError("an error inside")
        assert torch.backends.cudnn.benchmark and torch.are_deterministic_algorithms_enabled() == before[0]
    finally:
        torch.backends.cudnn.benchmark = before[1]


def test_reproducible_cublas_is_set_only_before_cuda_starts(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setattr(tc, "_cublas_set_before_cuda", None)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # CUDA already started: too late
    assert tc.enable_reproducible_cublas() is False and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    assert tc.cublas_config_before_cuda() is False
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert tc.enable_reproducible_cublas() is True and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert tc.cublas_config_before_cuda() is True


def test_determinism_check_runs_the_same_training_twice_in_each_mode():
    result = tc.determinism_check(steps=3, batch=2, seq=8)
    assert result.nondeterministic_ops == ()  # every op of this model has a deterministic CPU kernel
    assert result.equal_deterministic  # same seed, same device, deterministic kernels: the same bits
    assert len(result.losses) == 3 and all(loss > 0 for loss in result.losses)
    assert result.step_s_default > 0 and result.step_s_deterministic > 0
    assert result.cost == pytest.approx(result.step_s_deterministic / result.step_s_default)
    assert not torch.are_deterministic_algorithms_enabled()
    assert result.cublas_config_before_cuda is None  # a CPU run: cuBLAS plays no part
    with pytest.raises(ValueError, match="steps"):
        tc.determinism_check(steps=1)


def test_decode_prediction_is_bandwidth_over_weight_bytes():
    from gpuformer_lib import predict

    bf16 = tc.decode_tokens_per_s(7e9, 2, "H100 SXM")
    assert bf16 == pytest.approx(predict.achievable_bandwidth("H100 SXM")[0] / 14e9)  # the predictor's bandwidth
    assert tc.decode_tokens_per_s(7e9, 1, "H100 SXM") == pytest.approx(2 * bf16)  # int8 reads half the bytes
    assert tc.decode_tokens_per_s(7e9, 2, "T4") < bf16
    with pytest.raises(ValueError, match="positive"):
        tc.decode_tokens_per_s(7e9, 0, "T4")


def test_tool_sizes_per_device():
    cpu, gpu, toy = tc.tool_sizes(False, False), tc.tool_sizes(True, False), tc.tool_sizes(True, True)
    assert toy.teacher_steps < cpu.teacher_steps == gpu.teacher_steps  # CPU paths on every machine
    assert gpu.rows * gpu.width * 4 >= 64 * 2**20 > cpu.rows * cpu.width * 4  # a GPU's caches are far smaller
    assert toy.rows * toy.width < cpu.rows * cpu.width and toy.timing_repeats < cpu.timing_repeats
    with pytest.raises(ValueError, match="positive"):
        dataclasses.replace(cpu, batch=0)


def test_fusion_halves_the_bytes_of_layer_norm_and_gelu():
    assert tc.layer_norm_gelu_bytes(2, 3, fused=False) == (4 * 6 + 6) * 4  # 4 passes over 6 floats + w and b
    assert tc.layer_norm_gelu_bytes(2, 3, fused=True) == (2 * 6 + 6) * 4
    eager, fused = tc.fusion_prediction(4096, 4096, "H100 SXM")
    assert eager / fused == pytest.approx(2, rel=1e-3)
    from gpuformer_lib import predict

    assert fused == pytest.approx(2 * 4096 * 4096 * 4 / predict.achievable_bandwidth("H100 SXM")[0], rel=1e-3)


@pytest.mark.parametrize("cost, device, words", [
    (1.0, "cpu", "cost nothing measurable"), (1.09, "cuda", "cost nothing measurable"),
    (0.92, "cpu", "cost nothing measurable"), (1.1, "cuda", "slowed the step down"),
    (1.5, "cpu", "slowed the step down"), (0.9, "cuda", "did not slow the step down"),
])
def test_determinism_cost_words_follow_the_value(cost, device, words):
    assert tc.determinism_cost_words(cost, device) == words


def test_determinism_cost_words_call_a_faster_cpu_noise_and_refuse_bad_input():
    words = tc.determinism_cost_words(0.83, "cpu")
    assert words.startswith("ran faster, which can only be noise here") and "change no kernel" in words
    for bad in (0.0, -1.0, float("inf"), float("nan"), True):
        with pytest.raises(ValueError, match="positive finite ratio"):
            tc.determinism_cost_words(bad, "cpu")


def test_cold_caches_use_whichever_name_this_torch_gives_inductors_fresh_cache(monkeypatch):
    """torch._inductor.utils.fresh_cache is fresh_inductor_cache in older torch (2.13 has both names); before,
    cold_compile_caches imported only the new name. Neither: a clear error, not an ImportError."""
    from torch._inductor import utils

    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.delattr(utils, "fresh_cache")
    with tc.cold_compile_caches():
        inside = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        assert inside and inside != before and os.path.isdir(inside)  # an empty folder of its own
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") == before and not os.path.exists(inside)
    monkeypatch.delattr(utils, "fresh_inductor_cache")
    with pytest.raises(RuntimeError, match="neither torch._inductor.utils.fresh_cache nor fresh_inductor_cache"):
        with tc.cold_compile_caches():
            pass
