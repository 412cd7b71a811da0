"""Chapter 12's page keeps the fixes of the chapters 7-12 review (issue 13): each finding has a check here or
an assert in the notebook, so a later edit cannot bring it back silently."""

import re

import notebook_pages as pages

cells = pages.cells_fixture("12_model_parallel.ipynb")


def _joined(out, html):
    """An output's text as a reader sees it: streams, text/plain, and (``html``) text/html without its tags."""
    parts = [out.get("text", "")] + [out.get("data", {}).get(k, "") for k in ("text/plain",) + ("text/html",) * html]
    return re.sub(r"<[^>]+>", " ", "".join("".join(p) if isinstance(p, list) else p for p in parts))


def test_every_glued_value_is_used_and_every_used_one_is_glued(cells):
    pages.assert_glues_match(cells)


def test_a_cpu_run_does_not_teach_the_pipeline_speedup(cells):
    """Review of 2026-11-27: 'GPipe with m = 8 is 1.77x slower than m = 1' on two CPU processes sharing two
    cores, worded as the lesson. On gloo the page says the machine cannot show it and gives the prediction; on
    GPUs the words come from a bench.Comparison of interleaved rounds."""
    glued = pages.glued(cells)
    code = pages.text(cells, "code")
    words = glued["step_sentence"]
    assert "distributed.comparisons_from_rounds(" in code and "step_cmp.phrase()" in code
    assert "measured_speedup" not in code and "step_words" not in glued
    assert words.startswith("This machine cannot show that speedup") or re.search(r"was (\d\.\d\dx (faster|slower) than one micro-batch|no faster or slower)", words)
    assert "{glue:text}`step_sentence`" in pages.text(cells, "markdown")
    assert float(glued["step_speedup_pred"].rstrip("x")) > 1


def test_exercise_12_3_asks_for_a_setting_the_page_does_not_show(cells):
    """Review: exercise 12.3 asked for the bubble at p = 2, m = 4, printed in section 12.1's table and plot."""
    code = pages.text(cells, "code")
    assert "check_bubble_prediction(predicted_idle, None, 3, 6)" in code
    shown = {int(m) for m in re.findall(r"^\s+(\d+)\s+[\d.]+ ms", pages.outputs(cells), re.M)}
    assert shown == {1, 2, 4, 8}  # the 2-stage table: no p = 3, m = 6 anywhere on the page
    # its answer, 25 %, not given above the exercise
    assert "25 %" not in pages.text(cells, "markdown")


def test_one_f_one_b_memory_is_measured_and_asserted(cells):
    """Review: 1F1B's memory was stated, never measured."""
    code = pages.text(cells, "code")
    assert "assert worth <= p_mem * 1.01" in code and 'ofob0["peak_in_flight"] <= p_mem' in code
    glued = pages.glued(cells)
    assert float(glued["pm_worth"]) <= int(glued["pm_p"]) + 0.01


def test_tp_bytes_are_counted_and_zero3_volume_is_the_papers(cells):
    code = pages.text(cells, "code")
    assert 'assert tp_bytes["forward"] == [message] and tp_bytes["backward"] == [message]' in code
    assert 'assert ratio_z3 == figure("zero3-communication-vs-ddp").value' in code


def test_no_dated_or_false_claims(cells):
    prose = pages.text(cells, "markdown")
    assert "(up to 8 GPUs)" not in prose, "the NVLink domain is no longer one 8-GPU board (NVLink 5: cited)"
    assert "Every number in this chapter was measured" not in prose, "the GPU figures are predicted or published"
    assert "GPT-2 small on 8 ranks" not in prose, "the ZeRO motivation uses a 7B model whose states do not fit"
    assert "{glue:text}`nvlink5_domain`" in prose and "puts 72" not in prose and "{glue:text}`z7_transient`" in prose
    assert "{glue:text}`z7_acts`" in prose, "ZeRO does not shard activations: said with the number"


def test_gpu_view_has_its_three_kinds_and_no_impossible_value(cells):
    code = pages.text(cells, "code")
    assert "gpu_view.gpu_view(" in code and 'view.kinds() == {"measured", "predicted", "published"}' in code
    for cell in cells:
        if cell["cell_type"] == "code":
            view = "gpu_view.gpu_view(" in "".join(cell["source"])  # source listings' HTML has CSS percentages
            text = "".join(_joined(out, view) for out in cell.get("outputs", []))
            for share in re.findall(r"(\d+(?:\.\d+)?)\s?%", text):
                assert float(share) <= 100, text[:200]


def test_exercises_measure_or_predict(cells):
    code = pages.text(cells, "code")
    for check in ("check_one_f_one_b(order)", "check_tp_bytes_prediction(", "check_bubble_prediction("):
        assert check in code
    solutions = [c for c in cells if "solution" in c.get("metadata", {}).get("tags", [])]
    assert len(solutions) >= 3 and all("hide-cell" in c["metadata"]["tags"] for c in solutions)


def test_expert_parallelism_is_checked_and_counted(cells):
    """Review of 2026-11-27: 'Nothing on expert parallelism'. Section 12.8 runs the worker's experts command in
    the chapter's one two-rank launch, equal to one process, and counts its all-to-alls against TP's bytes."""
    code = pages.text(cells, "code")
    assert 'ep = run["experts"]' in code and code.count("distributed.launch(") == 2  # two_ranks and the mesh
    assert "assert ep_gap < 1e-5" in code and "assert abs(ep_b / tp_b - 2 / P) < 1e-12" in code
    glued = pages.glued(cells)
    assert float(glued["ep_gap"]) < 1e-5 and 0 < int(glued["ep_sent"]) < int(glued["ep_rows"])
    ceiling = float(re.search(r"= ([\d.]+):", glued["moe_max"]).group(1))  # E / k: no expert takes over 1/k
    assert 1 < float(glued["moe_skewed"]) <= ceiling + 1e-9 and abs(float(glued["moe_aux"]) - 1) < 0.1
    # k / P = 2 / 8 of tensor parallel's bytes per rank
    ep8, tp8 = (float(glued[n].split()[0]) for n in ("ep8_mib", "tp8_mib"))
    assert abs(ep8 / tp8 - 0.25) < 0.01
    headings = re.findall(r"^## (12\.\d+) ", pages.text(cells, "markdown"), re.M)
    assert headings == [f"12.{i}" for i in range(1, len(headings) + 1)]
