"""Stored predicted rows of the GPU views are what the course's predictor says now (issue 29): each row below
is recomputed with gpuformer_lib.predict from the same inputs the page used and compared with the value the
page stored, so a change to the predictor that is not re-executed into the pages fails here."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gpuformer_lib import gpu_results, ladder, predict, speed
from gpuformer_lib.predict.layer_cost import step_time_prediction
from gpuformer_lib.model import gpt2_config
from gpuformer_lib.profiles import PROFILES, compute_dtype
from gpuformer_lib.tools.notebooks import REPO_ROOT


def stored(notebook: str, quantity: str, gpu: str) -> float:
    specs = gpu_results.notebook_specs([REPO_ROOT / "notebooks" / notebook])
    rows = [r for _, spec in specs for r in spec["rows"]
            if r["kind"] == "predicted" and r["quantity"] == quantity and r["device"].startswith(gpu)]
    assert len(rows) == 1, (notebook, quantity, gpu, len(rows))
    return rows[0]["value"]


@pytest.mark.parametrize("gpu, name", [("T4", "t4"), ("H100 SXM", "h100-80gb")])
def test_chapter_10_eager_step_rows(gpu, name):
    p = ladder.preset_for(PROFILES[name])
    dtype = compute_dtype(PROFILES[name])
    work = predict.training_work(speed.model_config(p.config, speed.SpeedPlan(dtype=dtype, check_token_ids=False)),
                                 tokens=p.batch_size * p.seq_len, seq_len=p.seq_len,
                                 fmt={torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype])
    fresh = predict.predict_step(work, gpu).seconds * 1e3
    quantity = "GPT-2 small eager training step, 16-bit autocast, fused attention"
    assert stored("10_monitoring_and_profiling.ipynb", quantity, gpu) == pytest.approx(fresh, rel=1e-9)


@pytest.mark.parametrize("gpu, dtype", [("T4", torch.float16), ("H100 SXM", torch.bfloat16)])
def test_chapter_5_gpt2_step_rows(gpu, dtype):
    fresh = step_time_prediction(gpt2_config(), 8, 1024, dtype, gpu).seconds * 1e3
    quantity = "GPT-2 small training step (forward + backward), B=8, T=1024"
    assert stored("05_encoder_decoder.ipynb", quantity, gpu) == pytest.approx(fresh, rel=1e-9)


def test_chapter_13_v100_row_against_nvidias_measurement():
    steps = {fmt: predict.predict_step(predict.training_work(predict.transformer_big_config(), tokens=2560,
                                                             seq_len=32, src_len=32, fmt=fmt, optimizer="fused"),
                                       "V100 SXM2").seconds for fmt in ("fp32", "fp16")}
    quantity = ("training throughput, mixed precision over float32, Transformer big, 1 V100, 2,560 tokens a step")
    assert stored("13_translation_case_study.ipynb", quantity, "V100") == pytest.approx(
        steps["fp32"] / steps["fp16"], rel=1e-9)


def test_chapter_9_micro_step_rows():
    config = dataclasses.replace(gpt2_config(), check_token_ids=False)
    kernels = predict.count_kernels(config, dtype=torch.bfloat16, optimizer=None)
    for gpu, fmt in (("T4", "fp16"), ("H100 SXM", "bf16")):
        step = predict.predict_step(predict.training_work(config, tokens=1024, seq_len=1024, fmt=fmt, optimizer=None,
                                                          kernels=kernels), gpu)
        nb = "09_memory_and_accumulation.ipynb"
        assert stored(nb, "GPU time of a micro-step of one sequence", gpu) == pytest.approx(step.gpu_s * 1e3,
                                                                                          rel=1e-9)
        assert stored(nb, "host time to launch a micro-step's kernels", gpu) == pytest.approx(step.host_s * 1e3,
                                                                                            rel=1e-9)


@pytest.mark.parametrize("gpu, name, low", [("T4", "gpu-small", torch.float16), ("H100 SXM", "gpu", torch.bfloat16)])
def test_chapter_8_precision_rows(gpu, name, low):
    from gpuformer_lib import mixed_precision as mp
    from gpuformer_lib.device import SizePreset

    run = mp.precision_benchmark_run(SizePreset(name, gpu))
    steps = {fmt: predict.predict_step(predict.training_work(run.config, tokens=run.batch_size * run.seq_len,
                                                             seq_len=run.seq_len, fmt=fmt), gpu).seconds
             for fmt in ("fp32", predict.format_of(low))}
    fmt = predict.format_of(low)
    quantity = f"training step, {fmt} autocast ({run.batch_size} x {run.seq_len} tokens, width {run.config.d_model})"
    assert stored("08_mixed_precision.ipynb", quantity, gpu) == pytest.approx(steps[fmt] * 1e3, rel=1e-9)
    assert stored("08_mixed_precision.ipynb", "speedup of 16-bit autocast over float32, whole step", gpu) == \
        pytest.approx(steps["fp32"] / steps[fmt], rel=1e-9)


def test_chapter_8_v100_row_is_chapter_13s():
    quantity = "speedup of fp16 mixed precision over float32, Transformer big, 1 V100"
    chapter_13 = ("training throughput, mixed precision over float32, Transformer big, 1 V100, 2,560 tokens a step")
    assert stored("08_mixed_precision.ipynb", quantity, "V100") == pytest.approx(
        stored("13_translation_case_study.ipynb", chapter_13, "V100"), rel=1e-9)


@pytest.mark.parametrize("gpu, name", [("T4", "t4"), ("H100 SXM", "h100-80gb")])
def test_chapter_10_tokens_per_second_rows(gpu, name):
    p = ladder.preset_for(PROFILES[name])
    step = stored("10_monitoring_and_profiling.ipynb",
                  "GPT-2 small eager training step, 16-bit autocast, fused attention", gpu) / 1e3
    assert stored("10_monitoring_and_profiling.ipynb", "GPT-2 small training tokens/s, eager step", gpu) == \
        pytest.approx(p.batch_size * p.seq_len / step, rel=1e-9)


@pytest.fixture(scope="module")
def protein_split():
    from gpuformer_lib import proteins

    return proteins.kmer_filtered_split(proteins.load_proteins(), k=8, max_shared=0.5, seed=0)


@pytest.mark.parametrize("gpu, name, profile, low", [("T4", "gpu-small", "t4", torch.float16),
                                                     ("H100 SXM", "gpu", "h100-80gb", torch.bfloat16)])
def test_chapter_14_ladder_rows(protein_split, gpu, name, profile, low):
    """The padding share is measured from the proteins at the preset's crop, as the page does (the shipped data
    set, read from ../shared/data), and every rung recomputed with the predictor."""
    from gpuformer_lib import proteins
    from gpuformer_lib.device import SizePreset

    p = proteins.case_plan(PROFILES[profile], SizePreset(name, "x"))
    pad = proteins.padded_share_by_crop(protein_split.train, (p.crop,), batch_size=p.batch_size)[p.crop]
    fresh = proteins.predicted_steps(proteins.lm_config(p.d_model, p.n_layers, p.n_heads, p.crop), p.batch_size,
                                     p.crop, pad, gpu, low)
    nb = "14_protein_case_study.ipynb"
    for row, step in fresh:
        assert stored(nb, f"training step, {row}", gpu) == pytest.approx(step.seconds * 1e3, rel=1e-9)
    assert stored(nb, "residues per second, packed rows / padded baseline", gpu) == pytest.approx(
        proteins.packing_gain(fresh, p.batch_size, pad), rel=1e-9)


@pytest.mark.parametrize("gpu, name, low", [("T4", "gpu-small", torch.float16), ("H100 SXM", "gpu", torch.bfloat16)])
def test_chapter_15_step_rows(gpu, name, low):
    from gpuformer_lib import forecasting
    from gpuformer_lib.device import SizePreset
    from gpuformer_lib.profiles import current_profile

    p = forecasting.case_plan(current_profile(torch.device("cpu")), SizePreset(name, "prediction"))
    nb = "15_forecasting_case_study.ipynb"
    fp32 = forecasting.step_prediction(p.config, p.batch_size, gpu, torch.float32).seconds
    half = forecasting.step_prediction(p.config, p.batch_size, gpu, low).seconds
    assert stored(nb, "training step, fp32", gpu) == pytest.approx(fp32 * 1e3, rel=1e-9)
    assert stored(nb, f"training step, {predict.format_of(low)} autocast", gpu) == pytest.approx(half * 1e3, rel=1e-9)


@pytest.mark.parametrize("gpu, fmt", [("T4", "fp16"), ("H100 SXM", "bf16")])
def test_chapter_1_rates(gpu, fmt):
    nb = "01_why_gpus.ipynb"
    assert stored(nb, "fastest matrix product", gpu) == pytest.approx(predict.achievable_rate(gpu, fmt)[0] / 1e12,
                                                                      rel=1e-9)
    assert stored(nb, "float32 matrix product without tensor cores", gpu) == pytest.approx(
        predict.achievable_rate(gpu, "fp32")[0] / 1e12, rel=1e-9)
    assert stored(nb, "memory bandwidth (largest copy)", gpu) == pytest.approx(
        predict.achievable_bandwidth(gpu)[0] / 1e12, rel=1e-9)
    assert stored(nb, "host-to-GPU copy (pinned)", gpu) == pytest.approx(predict.host_link_bandwidth(gpu)[0] / 1e9,
                                                                         rel=1e-9)


@pytest.mark.parametrize("gpu", ["T4", "H100 SXM"])
def test_chapter_2_kernels(gpu):
    from gpuformer_lib import kernels

    nb = "02_gpu_programming.ipynb"
    n = 2**26
    add_s, _ = predict.kernel_time(n, 12 * n, gpu, "fp32", matrix=False)
    assert stored(nb, "vector add bandwidth", gpu) == pytest.approx(12 * n / add_s / 1e9, rel=1e-9)
    elements = 4096 * 1024
    fused, unfused = (predict.predict_step(predict.Work(0.0, 0.0, b * elements, k, "fp32", "eager-op"), gpu).seconds
                      for b, k in ((8, 1), (32, 5)))
    assert stored(nb, "softmax time: unfused / fused, eager, 4096 x 1024 fp32", gpu) == pytest.approx(
        unfused / fused, rel=1e-9)
    mm, _ = kernels.triton_matmul_prediction(4096, 4096, 4096, torch.float16, gpu)
    assert stored(nb, "Triton tiled matmul 4096^3 fp16", gpu) == pytest.approx(mm.flops_per_second / 1e12, rel=1e-9)
    # the gather: 32-byte sectors, 44 bytes an element at stride 8 against 16 at stride 1, both memory-bound
    assert stored(nb, "gather time: stride 8 / stride 1, float32 with int64 indices", gpu) == pytest.approx(
        44 / 16, rel=1e-9)


def test_chapter_8_fp8_products_row():
    from gpuformer_lib import mixed_precision as mp
    from gpuformer_lib.device import SizePreset

    run = mp.precision_benchmark_run(SizePreset("gpu", "H100"))
    work = predict.training_work(run.config, tokens=run.batch_size * run.seq_len, seq_len=run.seq_len, fmt="bf16")
    fp8 = predict.kernel_time(work.matrix_flops, work.matrix_bytes / 2, "H100 SXM", "fp8", matrix=True)[0]
    quantity = f"matrix products of one step, fp8 ({run.batch_size} x {run.seq_len} tokens, width {run.config.d_model})"
    assert stored("08_mixed_precision.ipynb", quantity, "H100 SXM") == pytest.approx(fp8 * 1e3, rel=1e-9)
