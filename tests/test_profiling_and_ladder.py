"""Profiling helpers and the training ladder (``python -m gpuformer_lib.ladder``) on the CPU."""

import dataclasses
import json
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from gpuformer_lib import bench, ladder, memory, speed
from gpuformer_lib.model import TransformerConfig
from gpuformer_lib.profiles import PROFILES
from gpuformer_lib.tools.notebooks import REPO_ROOT

MICRO = ladder.LadderPreset(TransformerConfig(vocab_size=64, d_model=32, n_heads=2, n_decoder_layers=1, d_ff=64,
                                              dropout=0.0, max_len=16, activation="gelu"), batch_size=2, seq_len=16)


def test_profiler_writes_a_trace_and_a_table(tmp_path):
    a = torch.randn(64, 64)
    calls = []

    def step():
        calls.append(1)
        (a @ a).relu_()

    trace = tmp_path / "traces" / "step.json"
    prof = bench.profile_steps(step, wait=1, warmup=1, active=2, trace_path=trace)
    assert len(calls) == 4
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(e.get("name") == "train_step" for e in events) == 2  # the active steps only
    assert any("aten::mm" in str(e.get("name")) for e in events)
    table = bench.profile_table(prof, row_limit=5)
    assert "aten::mm" in table and "Self CPU" in table
    assert [p.name for p in trace.parent.iterdir()] == ["step.json"]  # no temporary file left behind
    with pytest.raises(ValueError, match="active >= 1"):
        bench.profile_steps(step, active=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer without a GPU")
def test_nvml_sample_is_none_without_a_gpu():
    assert bench.nvml_sample() is None


def test_ladder_rungs_are_cumulative():
    rungs = {r.key: r for r in ladder.ladder_rungs()}
    assert list(rungs) == list(ladder.RUNG_KEYS)
    plans = {key: r.plan for key, r in rungs.items()}
    assert plans["fused_adamw"].compile and plans["fused_adamw"].fused_attention and plans["fused_adamw"].tf32
    assert plans["fused_adamw"].fused_optimizer and plans["cuda_graphs"].cuda_graphs
    assert plans["fused_adamw"].dtype == torch.bfloat16 and not plans["fp32"].tf32
    assert not plans["fp32"].fused_attention and not any(p.check_token_ids for p in plans.values())
    assert rungs["pytorch"].pytorch_model and not plans["pytorch"].compile and plans["pytorch"].fused_attention
    assert {r.plan.dtype for r in ladder.ladder_rungs(torch.float16)[2:]} == {torch.float16}


def test_ladder_on_the_cpu_measures_every_eager_rung():
    result = ladder.run_ladder(MICRO, "cpu", steps=2, warmup=1, skip=("compile", "fused_adamw"), verbose=False)
    rows = {r.key: r for r in result.rows}
    assert rows["fp32"].speedup == 1.0 and rows["fp32"].step_s > 0
    assert rows["tf32"].step_s is None and "GPU" in rows["tf32"].note  # skipped, with the reason
    assert rows["cuda_graphs"].note == "skipped: CUDA graphs need a CUDA device"
    assert rows["compile"].note == "skipped: asked to"
    for key in ("autocast", "sdpa", "pytorch"):
        r = rows[key]
        assert r.speedup == pytest.approx(rows["fp32"].step_s / r.step_s)
        assert r.tokens_per_s == pytest.approx(2 * 16 / r.step_s)
        assert r.mfu == pytest.approx(result.flops_per_step / r.step_s / result.peak_flops)
    # every rung trains the same model on the same batch: the same loss, up to bf16 rounding
    assert abs(rows["sdpa"].loss - rows["fp32"].loss) < 0.05
    assert "skipped" in result.table() and "fp32 eager" in result.table()
    a = result.attention
    assert a["shape"] == [2, 2, 16, 16] and a["speedup"] == pytest.approx(a["explicit_s"] / a["fused_s"])
    json.dumps(result.to_json(), default=str)


def test_ladder_errors():
    with pytest.raises(ValueError, match="unknown preset"):
        ladder.run_ladder("gpt3", "cpu")
    with pytest.raises(ValueError, match="unknown rungs"):
        ladder.run_ladder(MICRO, "cpu", skip=("flash",))


def test_command_line(tmp_path):
    out = tmp_path / "ladder.json"
    cmd = [sys.executable, "-m", "gpuformer_lib.ladder", "--device", "cpu", "--steps", "1", "--warmup", "1",
           "--skip", "autocast,sdpa,compile,fused_adamw,pytorch", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "fp32 eager (strict)" in done.stdout and f"wrote {out}" in done.stdout
    assert "causal attention forward + backward" in done.stdout
    saved = json.loads(out.read_text())
    assert saved["preset"] == "tiny" and saved["rows"][0]["step_s"] > 0 and saved["versions"]["torch"]
    refused = subprocess.run([sys.executable, "-m", "gpuformer_lib.ladder", "--device", "cpu", "--preset",
                              "gpt2-small"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--preset tiny" in refused.stderr


def a_ladder_result(date="2026-01-02T03:04:05+00:00"):
    """What run_ladder returns, without minutes of measuring: the command's file handling is under test."""
    row = ladder.LadderRow("fp32", "fp32 eager (strict)", step_s=0.1, tokens_per_s=320.0, speedup=1.0, loss=4.2)
    return ladder.LadderResult(preset="tiny", device="cpu", profile="cpu", hardware={}, batch_size=2, seq_len=16,
                               n_params=1000, flops_per_step=10**6, peak_flops=None, peak_source="no peak", rows=[row],
                               attention={"dtype": "float32", "shape": [2, 2, 16, 16], "explicit_s": 0.002,
                                          "fused_s": 0.001, "speedup": 2.0}, versions={"torch": torch.__version__},
                               date=date)


def test_a_run_writes_a_new_git_ignored_file_and_never_replaces_a_committed_result(tmp_path, monkeypatch, capsys):
    """A learner running the command from the repository used to replace bench_results/ladder-tiny-cpu.json,
    the committed result chapter 10 lists; now each run writes a new dated file under bench_results/runs/."""
    monkeypatch.chdir(tmp_path)
    committed = tmp_path / "bench_results" / "ladder-tiny-cpu.json"
    committed.parent.mkdir()
    committed.write_text('{"committed": true}\n')
    results = iter([a_ladder_result(), a_ladder_result("2026-01-02T03:04:06+00:00")])
    monkeypatch.setattr(ladder, "run_ladder", lambda *args, **kwargs: next(results))
    assert ladder.main(["--device", "cpu"]) == 0 and ladder.main(["--device", "cpu"]) == 0
    assert committed.read_text() == '{"committed": true}\n'
    written = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "bench_results").rglob("*.json"))
    assert written == ["bench_results/ladder-tiny-cpu.json", "bench_results/runs/ladder-tiny-cpu-20260102T030405Z.json",
                       "bench_results/runs/ladder-tiny-cpu-20260102T030406Z.json"]
    assert f"wrote {written[1]}" in capsys.readouterr().out
    assert json.loads((tmp_path / written[1]).read_text())["preset"] == "tiny"
    # chapter 10 lists ../bench_results/ladder-*.json: the runs are not among them
    assert [p.name for p in (tmp_path / "bench_results").glob("ladder-*.json")] == ["ladder-tiny-cpu.json"]


@pytest.mark.skipif(not (REPO_ROOT / ".git").exists() or shutil.which("git") is None, reason="needs the git checkout")
def test_the_ladders_default_folder_is_git_ignored_and_the_committed_result_is_not():
    def ignored(path):
        return subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=REPO_ROOT).returncode == 0

    assert ignored("bench_results/runs/ladder-tiny-cpu-20260102T030405Z.json")
    assert ignored("notebooks/bench_results/runs/ladder-tiny-cpu-20260102T030405Z.json")  # run from notebooks/
    assert not ignored("bench_results/ladder-tiny-cpu.json")
    assert ladder.RUNS_DIR.as_posix() == "bench_results/runs"


def test_an_existing_json_file_is_replaced_only_with_overwrite(tmp_path, monkeypatch, capsys):
    target = tmp_path / "ladder-tiny-cpu.json"
    target.write_text('{"committed": true}\n')
    ran = []
    monkeypatch.setattr(ladder, "run_ladder", lambda *args, **kwargs: ran.append(1) or a_ladder_result())
    with pytest.raises(SystemExit) as exit_info:
        ladder.main(["--device", "cpu", "--json", str(target)])
    assert exit_info.value.code == 2 and "--overwrite" in capsys.readouterr().err
    assert target.read_text() == '{"committed": true}\n' and not ran  # refused before the run, not after it
    assert ladder.main(["--device", "cpu", "--json", str(target), "--overwrite"]) == 0
    assert json.loads(target.read_text())["preset"] == "tiny" and ran == [1]


def test_bench_does_not_import_the_model_or_the_ladder():
    # the command lives in the ladder; bench measures whatever it is given (no bench <-> ladder cycle)
    code = "import sys, gpuformer_lib.bench; print(sorted(m for m in sys.modules if m.startswith('gpuformer_lib')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    imported = set(eval(done.stdout))
    assert "gpuformer_lib.bench" in imported
    assert not imported & {"gpuformer_lib.model", "gpuformer_lib.layers", "gpuformer_lib.ladder", "gpuformer_lib.speed"}


# --------------------------------------------------------------------------- what fits (audit finding B5)


def test_gpt2_small_at_batch_16_does_not_fit_a_t4():
    # the old default on every GPU: its fp32 rung keeps B*H*T^2 scores per layer
    gpt2 = ladder.PRESETS["gpt2-small"]
    need = ladder.step_memory(gpt2.config, 16, gpt2.seq_len, ladder.STRICT_FP32)
    assert need > PROFILES["t4"].memory_gib * 2**30 and need > PROFILES["a100-40gb"].memory_gib * 2**30


@pytest.mark.parametrize("name", ["t4", "a100-40gb", "h100-80gb"])
def test_default_preset_fp32_rung_fits_each_gpu_with_margin(name):
    profile = PROFILES[name]
    preset = ladder.preset_for(profile)
    assert preset.name == "gpt2-small" and preset.seq_len == 1024  # a GPU gets the real model, batch by memory
    fp32 = ladder.ladder_rungs()[0]
    assert fp32.key == "fp32" and not fp32.plan.fused_attention
    need = ladder.step_memory(preset.config, preset.batch_size, preset.seq_len, fp32.plan)
    assert need <= 0.8 * profile.memory_gib * 2**30, (name, preset.batch_size, need / 2**30)
    # and it is the largest batch that does: twice the batch would not fit with the margin
    if preset.batch_size < 16:
        twice = ladder.step_memory(preset.config, 2 * preset.batch_size, preset.seq_len, fp32.plan)
        assert twice > 0.8 * profile.memory_gib * 2**30


def test_step_memory_adds_the_loss_temporaries_to_the_calculator():
    c, B, T = MICRO.config, 3, 16
    plan = speed.SpeedPlan(dtype=torch.bfloat16)
    calculated = memory.training_memory(
        sum(p.numel() for p in ladder.DecoderLM(c).parameters()), n_layers=1, d_model=32, n_heads=2, d_ff=64,
        seq_len=T, batch_size=B, vocab_size=64, activation_bytes=2, autocast=True, fused_attention=True).total
    assert ladder.step_memory(c, B, T, plan) == calculated + 3 * B * T * 64 * 4


def test_preset_for_a_cpu_or_a_rehearsal_is_tiny():
    assert ladder.preset_for(PROFILES["cpu"]).name == "tiny"
    assert ladder.preset_for(dataclasses.replace(PROFILES["h100-80gb"], rehearsal=True)).name == "tiny"


def test_configs_that_fit_caps_a_sweep_by_memory():
    gpt2 = ladder.PRESETS["gpt2-small"]
    configs = [dataclasses.replace(gpt2.config, d_model=w, n_heads=4, d_ff=4 * w) for w in (256, 1024, 2048, 4096)]
    plan = speed.SpeedPlan(dtype=torch.bfloat16)
    widths = {name: [c.d_model for c in ladder.configs_that_fit(configs, 4, 1024, PROFILES[name], plan)]
              for name in ("t4", "a100-40gb", "h100-80gb", "cpu")}
    assert widths["cpu"] == [256, 1024, 2048, 4096]  # no GPU memory to respect
    assert widths["h100-80gb"][-1] > widths["a100-40gb"][-1] > widths["t4"][-1]
    for name in ("t4", "a100-40gb", "h100-80gb"):
        biggest = next(c for c in configs if c.d_model == widths[name][-1])
        assert ladder.step_memory(biggest, 4, 1024, plan) <= 0.8 * PROFILES[name].memory_gib * 2**30
    with pytest.raises(ValueError, match="none of the 4 models fits"):
        ladder.configs_that_fit(configs, 16, 1024, PROFILES["t4"], plan)


def test_a_rung_out_of_memory_is_recorded_and_the_ladder_goes_on(monkeypatch):
    measured, freed = [], []
    real = ladder.measure_rung

    def measure(rung, *args, **kwargs):
        measured.append(rung.key)
        if rung.key == "fp32":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.07 GiB")
        return real(rung, *args, **kwargs)

    monkeypatch.setattr(ladder, "measure_rung", measure)
    monkeypatch.setattr(memory, "free_cached_memory", lambda: freed.append(measured[-1]))
    result = ladder.run_ladder(MICRO, "cpu", steps=1, warmup=1, skip=("autocast", "compile", "fused_adamw", "pytorch"),
                               verbose=False)
    rows = {r.key: r for r in result.rows}
    assert rows["fp32"].note == "skipped: out of memory" and rows["fp32"].step_s is None
    assert rows["sdpa"].step_s > 0 and rows["sdpa"].speedup == 1.0  # the first measured rung is the baseline
    assert freed[0] == "fp32"  # cached blocks given back before the next rung
    assert "skipped: out of memory" in result.table()


def test_other_errors_in_a_rung_are_not_swallowed(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(ladder, "measure_rung", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        ladder.run_ladder(MICRO, "cpu", steps=1, warmup=1, verbose=False)


# --------------------------------------------------------------------------- where the time goes (B14)


def event(key, cpu_us=0.0, device_us=0.0, kernel=False, annotation=False):
    from torch.autograd import DeviceType

    return SimpleNamespace(key=key, self_cpu_time_total=cpu_us, self_device_time_total=device_us,
                           device_type=DeviceType.CUDA if kernel or annotation else DeviceType.CPU,
                           is_user_annotation=annotation)


def gpu_profile_events():
    """What ``key_averages()`` holds for one step on a GPU: each kernel appears once under the aten op that
    launched it (its self device time) and once as a kernel event of its own (device type CUDA), plus ranges,
    on the CPU and as GPU-side user annotations."""
    return [
        event("ProfilerStep#2", cpu_us=900, device_us=1000),
        event("train_step", cpu_us=800, device_us=1000),
        event("train_step", device_us=1000, annotation=True),  # the range drawn on the stream row
        event("aten::linear", cpu_us=30),  # composite: launches nothing itself
        event("aten::mm", cpu_us=40, device_us=500),
        event("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTN", device_us=500, kernel=True),  # cuBLAS 12.8+ kernel name
        event("aten::_scaled_dot_product_flash_attention", cpu_us=20, device_us=200),
        event("void pytorch_flash::flash_fwd_kernel<...>", device_us=200, kernel=True),
        event("aten::_log_softmax", cpu_us=10, device_us=100),
        event("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
              "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(...)", device_us=100, kernel=True),
        event("aten::_fused_adamw_", cpu_us=10, device_us=150),
        event("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...>", device_us=150, kernel=True),
        event("aten::gelu", cpu_us=5, device_us=50),
        event("void at::native::vectorized_elementwise_kernel<...>", device_us=50, kernel=True),
    ]


def test_time_by_category_counts_each_kernel_once_on_a_gpu():
    events = gpu_profile_events()
    shares = bench.time_by_category(events, "cuda")
    assert sum(shares.values()) == 1000  # the kernels' time once: summing every event gave 4000
    assert shares == {"matrix products": 500, "attention": 200, "loss (log-softmax, NLL)": 100, "optimizer": 150,
                      bench.OTHER_CATEGORY: 50}
    naive = sum(e.self_device_time_total for e in events if e.self_device_time_total > 0
                and not e.key.startswith("ProfilerStep") and e.key != "train_step")
    assert naive == 2 * sum(shares.values())  # what the chapter's old cell summed
    # a Triton kernel from torch.compile has no aten:: operator above it: counted all the same
    compiled = events + [event("triton_poi_fused_add_gelu_0", device_us=30, kernel=True)]
    assert bench.time_by_category(compiled, "cuda")[bench.OTHER_CATEGORY] == 80


@pytest.mark.parametrize("name, category", [
    ("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTN", "matrix products"),
    ("sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1_tensor16x8x16", "matrix products"),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn", "matrix products"),
    ("volta_sgemm_128x64_nn", "matrix products"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_bf16_128x128_32x4_nn_align8>(...)", "matrix products"),
    ("void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>(...)", "matrix products"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>::Params)", "attention"),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<...>", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x128_4x1x1_kernel0_0", "attention"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
     "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(...)", "attention"),  # explicit attention's softmax
    ("void at::native::(anonymous namespace)::cunn_SoftMaxBackward<4, float, float, float, "
     "at::native::(anonymous namespace)::LogSoftMaxBackwardEpilogue>(...)", "loss (log-softmax, NLL)"),
    ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(...)",
     "loss (log-softmax, NLL)"),
    ("triton_red_fused__log_softmax_0", "loss (log-softmax, NLL)"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...FusedAdamMathFunctor...>", "optimizer"),
    ("Memcpy HtoD (Pageable -> Device)", "copies"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl...>", bench.OTHER_CATEGORY),
])
def test_kernel_names_are_classified(name, category):
    assert bench.kernel_category(name) == category


def test_time_by_category_on_a_cpu_uses_self_cpu_time_of_aten_ops():
    shares = bench.time_by_category(gpu_profile_events(), "cpu")
    assert shares["matrix products"] == 70 and shares["loss (log-softmax, NLL)"] == 10
    assert sum(shares.values()) == 115
    assert bench.operator_category("aten::_log_softmax_backward_data") == "loss (log-softmax, NLL)"
    assert bench.operator_category("aten::nll_loss_forward") == "loss (log-softmax, NLL)"
    assert bench.operator_category("aten::_softmax") == "attention"


def test_time_by_category_of_a_real_cpu_profile():
    model = ladder.DecoderLM(MICRO.config)
    optimizer = torch.optim.AdamW(model.parameters())
    step = speed.make_train_step(model, optimizer, speed.next_token_loss)
    ids = torch.randint(0, 64, (2, 17))
    prof = bench.profile_steps(lambda: step([ids]), wait=1, warmup=1, active=2)
    shares = bench.time_by_category(prof.key_averages(), "cpu")
    assert shares["matrix products"] > 0 and shares["loss (log-softmax, NLL)"] > 0 and shares["attention"] > 0


def test_time_by_category_puts_a_for_loop_optimizer_step_under_optimizer_from_raw_events():
    model = ladder.DecoderLM(MICRO.config)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=False, fused=False)  # per-tensor aten::mul_, lerp_...
    step = speed.make_train_step(model, optimizer, speed.next_token_loss)
    ids = torch.randint(0, 64, (2, 17))
    prof = bench.profile_steps(lambda: step([ids]), wait=1, warmup=1, active=2)
    averaged = bench.time_by_category(prof.key_averages(), "cpu")
    raw = bench.time_by_category(prof.events(), "cpu")
    assert sum(raw.values()) == pytest.approx(sum(averaged.values()), rel=1e-6)  # the same time, moved, not added
    assert raw["optimizer"] > averaged.get("optimizer", 0.0)  # key_averages cannot see the range
    assert raw[bench.OTHER_CATEGORY] < averaged[bench.OTHER_CATEGORY]
    assert raw["matrix products"] == pytest.approx(averaged["matrix products"], rel=1e-6)  # no mm in AdamW's step


def test_sample_while_busy_runs_the_step_then_reads_the_gpu(monkeypatch):
    calls = []
    with pytest.raises(ValueError, match="not a CUDA device"):  # no GPU and no rehearsal: nothing to ask
        bench.sample_while_busy(lambda: calls.append(1), "cpu", steps=2)
    monkeypatch.setenv("GPUFORMER_REHEARSE", "t4")
    calls.clear()
    report = bench.sample_while_busy(lambda: calls.append(1), "cpu", steps=3)
    assert len(calls) == 3 and "allocated by PyTorch: 0.00 GiB" in report


def test_peak_flops_for_each_profile(monkeypatch):
    t4, h100 = PROFILES["t4"], PROFILES["h100-80gb"]
    assert ladder.peak_flops_for(t4, "cpu", torch.float16) == (65e12, "datasheet dense float16 peak")
    assert ladder.peak_flops_for(h100, "cpu", torch.bfloat16)[0] == pytest.approx(989.4e12)
    measured = []

    def fake_peak(device, dtype=torch.float32, **kwargs):
        measured.append(dtype)
        return {torch.float32: 1.0e11, torch.bfloat16: 3.0e11, torch.float16: 1.5e12}[dtype]

    monkeypatch.setattr(bench, "measured_peak_flops", fake_peak)
    unknown = dataclasses.replace(t4, gpu_name="NVIDIA GeForce GTX 1080")  # not in the datasheet table
    assert ladder.peak_flops_for(unknown, "cpu", torch.float16) == (1.5e12, "measured float16 matmul peak (fastest of 10)")
    # a CPU: the faster of float32 and the ladder's 16-bit format, so no rung can exceed it
    assert ladder.peak_flops_for(PROFILES["cpu"], "cpu", torch.bfloat16) == (3.0e11, "measured bfloat16 matmul peak "
                                                                              "(fastest of 10)")
    assert ladder.peak_flops_for(PROFILES["cpu"], "cpu", torch.float32)[0] == 1.0e11
    assert measured == [torch.float16, torch.float32, torch.bfloat16, torch.float32]


def test_interleaved_ladder_judges_each_step_of_the_climb_by_its_rounds(monkeypatch):
    """Chapter 10's CPU ladder (review 2026-11-27, ch10 error 2: a rung '36.3 -> 44.4 ms' from 3 steps timed one
    after the other): with ``interleaved=True`` the rungs are timed in interleaved rounds and each step of the
    climb carries a bench.Comparison. A fake clock makes every timed call last the same, so the verdicts are
    known: no difference, whatever this machine's load."""
    from fake_clock import FakeClock

    monkeypatch.setattr(bench, "time", FakeClock(tick=1e-3))
    result = ladder.run_ladder(MICRO, "cpu", steps=2, warmup=1, skip=("compile", "fused_adamw"), verbose=False,
                               interleaved=True)
    rows = {r.key: r for r in result.rows}
    assert rows["compile"].note == "skipped: asked to" and "GPU" in rows["tf32"].note
    assert set(result.comparisons) == {"autocast", "sdpa", "pytorch"}
    assert [(c.baseline, c.candidate) for c in result.comparisons.values()] == [
        ("fp32", "autocast"), ("autocast", "sdpa"), ("sdpa", "pytorch")]
    for key, c in result.comparisons.items():
        assert len(c.ratios) >= 5 and c.verdict == "no difference we can see"
        assert rows[key].step_s == c.timings[key].median  # the table's number is the rounds' median
    assert result.attention["verdict"] == "no difference we can see" and "phrase" in result.attention
    saved = result.to_json()["comparisons"]
    assert saved["sdpa"]["baseline"] == "autocast" and saved["sdpa"]["rounds"] >= 5
    json.dumps(result.to_json(), default=str)
    # the default keeps the suite's way: one rung at a time, no verdicts
    assert ladder.run_ladder(MICRO, "cpu", steps=1, warmup=1, skip=("compile", "fused_adamw", "autocast", "pytorch"),
                             verbose=False).comparisons == {}
