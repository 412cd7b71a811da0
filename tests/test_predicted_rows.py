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
