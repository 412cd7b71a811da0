"""Profiling helpers and the training ladder (``python -m gpuformer_lib.bench``) on the CPU."""

import json
import subprocess
import sys

import pytest
import torch

from gpuformer_lib import bench, ladder
from gpuformer_lib.model import TransformerConfig

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
    assert rungs["fused_adamw"].compile and rungs["fused_adamw"].fused_attention and rungs["fused_adamw"].tf32
    assert rungs["fused_adamw"].dtype == torch.bfloat16 and not rungs["fp32"].tf32
    assert rungs["pytorch"].pytorch_model and not rungs["pytorch"].compile and rungs["pytorch"].fused_attention
    assert {r.dtype for r in ladder.ladder_rungs(torch.float16)[2:]} == {torch.float16}


def test_ladder_on_the_cpu_measures_every_eager_rung():
    result = ladder.run_ladder(MICRO, "cpu", steps=2, warmup=1, skip=("compile", "fused_adamw"), verbose=False)
    rows = {r.key: r for r in result.rows}
    assert rows["fp32"].speedup == 1.0 and rows["fp32"].step_s > 0
    assert rows["tf32"].step_s is None and "GPU" in rows["tf32"].note  # skipped, with the reason
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
    cmd = [sys.executable, "-m", "gpuformer_lib.bench", "--device", "cpu", "--steps", "1", "--warmup", "1",
           "--skip", "autocast,sdpa,compile,fused_adamw,pytorch", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "fp32 eager (strict)" in done.stdout and f"wrote {out}" in done.stdout
    assert "causal attention forward + backward" in done.stdout
    saved = json.loads(out.read_text())
    assert saved["preset"] == "tiny" and saved["rows"][0]["step_s"] > 0 and saved["versions"]["torch"]
    refused = subprocess.run([sys.executable, "-m", "gpuformer_lib.bench", "--device", "cpu", "--preset",
                              "gpt2-small"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--preset tiny" in refused.stderr
