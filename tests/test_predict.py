"""The course's one step-time predictor (gpuformer_lib.predict): its kernel count against the profiler's, its
parts, and its validation against published GPU measurements held to the committed summary."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from gpuformer_lib import ladder, predict, published, speed
from gpuformer_lib.tools.notebooks import REPO_ROOT

CENSUSES = sorted((REPO_ROOT / "bench_results").glob("kernel-census-*.json"))

# The validation summary as committed: it may improve, never worsen (|log(predicted / measured)|).
HELD_OUT_MEDIAN, HELD_OUT_WORST, HELD_OUT_COUNT = 0.28, 0.90, 15
ALL_MEDIAN, ALL_WORST, ALL_COUNT = 0.27, 0.90, 22


def census_config(fused: bool):
    plan = speed.SpeedPlan(dtype=torch.bfloat16, check_token_ids=False, fused_optimizer=fused)
    return speed.model_config(ladder.PRESETS["gpt2-small"].config, plan)


@pytest.mark.parametrize("path", CENSUSES, ids=[p.stem for p in CENSUSES])
def test_the_kernel_count_made_on_a_cpu_matches_the_profilers_count_on_each_gpu(path):
    """The census profiled GPT-2 small's eager bf16 step on a GPU: 769 kernels with foreach AdamW, 722 fused.
    The count made here on a CPU at a tiny width is within 3 %, and its optimizer part is exact."""
    census = json.loads(path.read_text())
    for run in census["runs"]:
        fused = run["fused_optimizer"]
        count = predict.count_kernels(census_config(fused), dtype=torch.bfloat16,
                                      optimizer="fused" if fused else "foreach")
        assert abs(count.total / run["kernels_per_step"] - 1) < 0.03, (count, run["kernels_per_step"])
        optimizer = sum(v["kernels"] for n, v in run["operators"].items() if "foreach" in n or "fused_adamw" in n)
        assert count.optimizer == optimizer


def test_foreach_launches_fill_by_tensors_or_by_blocks():
    assert predict.foreach_launches([10] * 110, 1) == 1  # 110 one-chunk tensors: one launch
    assert predict.foreach_launches([10] * 111, 1) == 2
    assert predict.foreach_launches([10] * 37, 4) == 2  # 36 tensors a launch with four lists
    assert predict.foreach_launches([65536 * 320], 1) == 1  # 320 chunks of one tensor fill one launch
    assert predict.foreach_launches([65536 * 320 + 1], 1) == 2
    assert predict.optimizer_kernels([10] * 5, None) == 0
    assert predict.optimizer_kernels([10] * 5, "per-tensor") == 65
    with pytest.raises(ValueError, match="optimizer"):
        predict.optimizer_kernels([10], "adam")


def test_views_detaches_and_host_reads_launch_no_kernel_and_known_operators_launch_several():
    assert predict.kernels_of({"view": 10, "detach": 3, "_local_scalar_dense": 2, "mm": 4}) == 4
    assert predict.kernels_of({"native_layer_norm_backward": 1, "embedding_dense_backward": 1}) == 21


def test_a_step_is_set_by_the_slower_of_the_gpu_and_the_host():
    gpu = "H100 SXM"
    busy = predict.Work(1e13, 1e9, 1e9, 10, "bf16")  # lots of arithmetic, few kernels: compute-bound
    tiny = predict.Work(1e6, 1e3, 1e3, 1000, "bf16")  # little work, many kernels: host-bound
    a, b = predict.predict_step(busy, gpu), predict.predict_step(tiny, gpu)
    assert a.bound == "compute" and a.seconds == pytest.approx(a.gpu_s)
    rate = predict.achievable_rate(gpu, "bf16")[0]
    assert a.matrix_s == pytest.approx(1e13 / rate)
    assert b.bound == "host" and b.seconds == pytest.approx(1000 * predict.launch_seconds()["eager"])
    graphs = predict.predict_step(predict.Work(1e6, 1e3, 1e3, 1000, "bf16", "cuda-graphs"), gpu)
    assert graphs.host_s == pytest.approx(predict.launch_seconds()["cuda-graphs"])  # one launch a step


def test_the_achievable_rates_sit_below_the_datasheet_and_say_where_they_come_from():
    for gpu, fmt in [("A100 SXM 80GB", "bf16"), ("H100 SXM", "bf16"), ("V100 SXM2", "fp16"), ("T4", "fp16"),
                     ("H100 SXM", "fp32"), ("P100 SXM2", "fp32")]:
        rate, source = predict.achievable_rate(gpu, fmt)
        assert 0.5 < rate / predict.datasheet_rate(gpu, fmt) < 1, (gpu, fmt)
        assert source
    bandwidth, source = predict.achievable_bandwidth("H100 SXM")
    assert "copy" in source and 0.7 < bandwidth / 3.35e12 < 1
    with pytest.raises(ValueError, match="tensor cores"):
        predict.datasheet_rate("T4", "bf16")
    with pytest.raises(ValueError, match="datasheet table"):
        predict.datasheet_rate("H300", "bf16")


def test_an_allreduce_pays_nccls_latencies_and_picks_its_fastest_protocol():
    assert predict.allreduce_seconds(1e9, 1, 1e11) == 0
    ll = [predict.figure(k).value for k in predict.NCCL_PROTOCOLS["LL"][:2]]
    small = predict.allreduce_seconds(32, 2, 2e11)
    assert small == pytest.approx((ll[0] + 2 * ll[1]) * 1e-6, rel=1e-3)  # LL: latency-bound
    simple = [predict.figure(k).value for k in predict.NCCL_PROTOCOLS["Simple"][:2]]
    big = predict.allreduce_seconds(8e9, 8, 2e11)
    assert big == pytest.approx((simple[0] + 14 * simple[1]) * 1e-6 + 2 * 7 / 8 * 8e9 / 2e11)
    assert predict.allreduce_seconds(1e6, 8, 2e11, calls=100) > 100 * predict.allreduce_seconds(0, 8, 2e11)


@pytest.mark.parametrize("bad, match", [(dict(fmt="int4"), "fmt"), (dict(execution="jit"), "execution"),
                                        (dict(kernels=0), "kernels"), (dict(matrix_flops=-1.0), "matrix_flops")])
def test_work_refuses_what_it_cannot_mean(bad, match):
    with pytest.raises(ValueError, match=match):
        predict.Work(**{**dict(matrix_flops=1.0, matrix_bytes=1.0, other_bytes=1.0, kernels=1, fmt="bf16"), **bad})


@pytest.fixture(scope="module")
def rows():
    return predict.validate()


def test_every_case_is_a_registered_published_measurement_and_the_cases_span_what_the_issue_asks(rows):
    keys = [r.key for r in rows]
    assert len(keys) == len(set(keys)) >= 15
    for key in keys:
        assert 10 in published.figure(key).chapters, key
    kinds = {r.kind for r in rows}
    assert {"training", "inference"} <= kinds
    assert {"eager", "compiled"} <= {r.execution for r in rows}
    cases = {c.key: c for c in predict._cases()}
    assert {r.bound for r in rows} >= {"compute", "memory", "host"}
    generations = {r.gpu.split()[0] for r in rows}
    assert {"P100", "V100", "A100", "H100"} <= generations
    assert any("8x" in published.figure(k).hardware or "8 " in published.figure(k).hardware for k in keys)
    assert any(not c.held_out for c in cases.values()) and any(c.held_out for c in cases.values())


def test_every_case_off_by_more_than_1_5x_is_explained(rows):
    for r in rows:
        if abs(math.log(r.ratio)) > math.log(1.5):
            assert len(r.explanation) > 40, f"{r.key} is off by {max(r.ratio, 1 / r.ratio):.2f}x unexplained"


def test_the_validation_summary_holds_its_committed_values(rows):
    held = predict.summarize([r for r in rows if r.held_out])
    assert held.count >= HELD_OUT_COUNT
    assert held.median_abs_log_ratio <= HELD_OUT_MEDIAN and held.worst_abs_log_ratio <= HELD_OUT_WORST, held
    every = predict.summarize(rows)
    assert every.count >= ALL_COUNT
    assert every.median_abs_log_ratio <= ALL_MEDIAN and every.worst_abs_log_ratio <= ALL_WORST, every


def test_the_validate_command_prints_the_table_and_ends_with_its_summary(capsys):
    assert predict.main(["validate"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    summaries = [line for line in out if line.startswith(("held out:", "all:"))]
    assert len(summaries) == 2 and out[-1] == summaries[-1] and out[-1].startswith("all:")
    assert "median |log ratio|" in out[-1] and "worst" in out[-1]


def test_the_committed_validation_file_is_what_the_predictor_says_now():
    """The book shows bench_results/predictor-validation.json (it is built without torch): it must be this
    code's validation; rerun `python -m gpuformer_lib.predict validate --write` after changing the predictor."""
    committed = json.loads(predict.VALIDATION_FILE.read_text())
    fresh = predict.validation_record()
    for part in ("rows", "course_rows"):
        assert [r["key"] for r in committed[part]] == [r["key"] for r in fresh[part]], part
        for old, new in zip(committed[part], fresh[part]):
            assert old["predicted_s"] == pytest.approx(new["predicted_s"], rel=1e-9), old["key"]
            assert old["measured_s"] == pytest.approx(new["measured_s"], rel=1e-12), old["key"]
            assert old["explanation"] == new["explanation"]
    assert committed["constants"] == fresh["constants"]


def test_the_appendix_shows_the_validation_with_every_case_linked_to_its_source():
    from gpuformer_lib import gpu_results

    assert "not been committed yet" in gpu_results.validation_html(None)
    record = gpu_results.load_validation()
    page = gpu_results.validation_html(record)
    for row in record["rows"]:
        assert f'#{published.figure_anchor(row["key"])}"' in page
    assert "Held out (" in page and "The constants, each stated once" in page


# --------------------------------------------------------------------------- one home for predictions

OLD_COST_MODULES = ("roofline", "layer_cost", "optimizer_cost", "collective_costs", "parallel_costs")
DATASHEET_CALLS = re.compile(r"datasheet_(ceiling|bandwidth|seconds|matmul)\(|compute_ceiling\(|gpu_bandwidth\(")


def _predicted_calls(code: str) -> list[str]:
    """The text of every ``gpu_view.predicted(...)`` call in ``code``, parentheses balanced."""
    calls = []
    for match in re.finditer(r"gpu_view\.predicted\(", code):
        depth, i = 1, match.end()
        while depth and i < len(code):
            depth += {"(": 1, ")": -1}.get(code[i], 0)
            i += 1
        calls.append(code[match.start():i])
    return calls


def _value_argument(call: str) -> str:
    """The second argument of a ``gpu_view.predicted(quantity, value, ...)`` call: the predicted number (the
    datasheet may stand beside it in the ``model`` text)."""
    args, depth, start = [], 0, call.index("(") + 1
    for i, ch in enumerate(call[start:], start):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if (ch == "," and depth == 0) or depth < 0:
            args.append(call[start:i])
            start = i + 1
        if depth < 0:
            break
    return args[1] if len(args) > 1 else ""


def test_predictions_have_one_home():
    """Issue 29: the older cost modules live inside ``gpuformer_lib.predict`` (no top-level module of their
    names), no notebook imports one from the top level, and no predicted row of a GPU view is computed from a
    datasheet roof (those are shown beside predictions, never as them)."""
    import json

    from gpuformer_lib.tools.notebooks import REPO_ROOT

    library = REPO_ROOT / "gpuformer_lib"
    assert not [m for m in OLD_COST_MODULES if (library / f"{m}.py").exists()]
    assert all((library / "predict" / f"{m}.py").exists() for m in OLD_COST_MODULES)
    found = []
    for path in sorted((REPO_ROOT / "notebooks").glob("*.ipynb")):
        code = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                         if c["cell_type"] == "code")
        for m in OLD_COST_MODULES:
            if re.search(rf"from gpuformer_lib import [^\n]*\b{m}\b|gpuformer_lib\.{m}\b", code):
                found.append(f"{path.name} imports {m} from outside gpuformer_lib.predict")
        found += [f"{path.name}: a predicted row from a datasheet roof: {call[:120]}"
                  for call in _predicted_calls(code) if DATASHEET_CALLS.search(_value_argument(call))]
    assert not found, "\n".join(found)


def test_the_one_home_check_sees_a_datasheet_row():
    code = 'rows.append(gpu_view.predicted("x", roofline.datasheet_ceiling("T4", dt, tensor_cores=True) / 1e12,'\
           ' "TFLOP/s", gpu="T4", model="peak"))\nother(1)'
    calls = _predicted_calls(code)
    assert len(calls) == 1 and calls[0].endswith('model="peak")') and DATASHEET_CALLS.search(
        _value_argument(calls[0]))
    beside = 'gpu_view.predicted("x", rate / 1e12, "TFLOP/s", model=f"datasheet {roofline.datasheet_bandwidth(g)}")'
    assert _value_argument(beside).strip() == "rate / 1e12" and not DATASHEET_CALLS.search(_value_argument(beside))
    assert not DATASHEET_CALLS.search('gpu_view.predicted("x", predict.achievable_rate("T4", "fp16")[0], "x")')
