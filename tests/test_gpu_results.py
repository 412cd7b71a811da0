"""The GPU views show every committed GPU measurement beside the page's own numbers (gpuformer_lib.gpu_results).

Synthetic result files for two devices, written as the suite writes them, must show both devices' numbers in
the views, and no file the plain "No GPU measurement committed yet"; the devices a view shows are the files
present. The notebooks' links must point at numbers the suite records.
"""

from __future__ import annotations

import html
import json
import re

import pytest

from gpuformer_lib import gpu_results
from gpuformer_lib.tools.notebooks import REPO_ROOT

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
STEP = "GPT-2 small training step (forward + backward), B=8, T=1024"


def record(seconds: float, *, status: str = "passed", rehearsal=None) -> dict:
    """An item's record as the suite writes it (only the fields the views read, and a few more)."""
    return {"status": status, "rehearsal": rehearsal, "date": "2026-11-28T04:08:35+00:00", "commit": "c7117571c4c8",
            "title": "one training step", "versions": {"torch": "2.11.0+cu130", "cuda": "13.0", "driver": "580"},
            "measurements": {"decoder_lm_step": {"median": seconds, "spread": 0.02, "n": 7, "repeats": [seconds]}},
            "values": {"decoder_lm_mfu": {"value": 0.25, "unit": "fraction", "how": "FLOPs / time / peak"}},
            "comparisons": {"adamw_step": {"before": {"label": "foreach", "median": 2 * seconds},
                                           "after": {"label": "fused", "median": seconds}, "speedup": 2.0,
                                           "verdict": "fused faster"}}}


def write_device(root, folder: str, name: str, items: dict) -> None:
    (root / folder).mkdir(parents=True)
    data = {"device": {"name": name, "sms": 132, "memory_gib": 79.2}, "items": items, "schema": 1}
    (root / folder / "ch05.json").write_text(json.dumps(data))


@pytest.fixture
def two_devices(tmp_path):
    root = tmp_path / "gpu"
    write_device(root, "nvidia-h100-80gb-hbm3", "NVIDIA H100 80GB HBM3", {"ch05.training_step": record(0.0296)})
    write_device(root, "nvidia-a100-sxm4-40gb", "NVIDIA A100-SXM4-40GB", {"ch05.training_step": record(0.0611)})
    return root


def spec(links=True) -> dict:
    rows = [
        {"quantity": "training step, C=128", "kind": "measured", "device": "this page's CPU (a test)", "value": 23.2,
         "unit": "ms", "basis": "bench.time_fn", "url": "", "key": ""},
        {"quantity": STEP, "kind": "predicted", "device": "H100 SXM (datasheet)", "value": 11.5, "unit": "ms",
         "basis": "roofline", "url": "", "key": ""},
        {"quantity": STEP, "kind": "predicted", "device": "T4 (datasheet)", "value": 155.0, "unit": "ms",
         "basis": "roofline", "url": "", "key": ""},
    ]
    link = {"quantity": STEP, "item": "ch05.training_step", "path": "measurements.decoder_lm_step", "unit": "ms",
            "scale": 1e3}
    return {"title": "Chapter 5: a step", "here": "this page's CPU (a test)", "rows": rows,
            "links": [link] if links else []}


def text(block: str) -> str:
    """What a reader reads of a view: its text, without its style sheet; inline code keeps its place in the sentence."""
    body = block.split(gpu_results.SPEC_ATTRIBUTE)[1].split('">', 1)[1].split("</style>", 1)[1]
    return html.unescape(re.sub(r"<[^>]+>", " ", re.sub(r"</?code>", "", body)))


def test_two_committed_devices_both_show_beside_the_prediction(two_devices):
    results = gpu_results.load_results(two_devices)
    assert list(results) == ["nvidia-a100-sxm4-40gb", "nvidia-h100-80gb-hbm3"]
    shown = text(gpu_results.render_view(spec(), results, book=True))
    assert "NVIDIA H100 80GB HBM3, 2026-11-28, torch 2.11.0+cu130" in shown
    assert "NVIDIA A100-SXM4-40GB, 2026-11-28, torch 2.11.0+cu130" in shown
    assert "29.6\xa0ms" in shown and "61.1\xa0ms" in shown
    # the H100's measurement sits in the H100 column with the H100's prediction, and their ratio
    assert "measured / predicted: 2.57" in shown
    assert "Measured on GPUs: NVIDIA A100-SXM4-40GB, NVIDIA H100 80GB HBM3" in shown
    assert "No GPU measurement committed yet" not in shown
    # one column per device: the page's own, the T4, the H100 and the A100 with its measurement
    head = re.search(r"<thead>(.*?)</thead>", gpu_results.render_view(spec(), results), re.S).group(1)
    assert re.findall(r"<th[^>]*>(.*?)</th>", head) == ["quantity", "this page", "T4", "H100", "A100"]


def test_without_result_files_a_view_says_so_plainly(tmp_path):
    empty = tmp_path / "gpu"
    empty.mkdir()
    shown = text(gpu_results.render_view(spec(), gpu_results.load_results(empty)))
    assert "No GPU measurement committed yet for this view (suite items ch05.training_step)" in shown
    assert "measured / predicted" not in shown and "torch 2.11" not in shown
    # a library installed without the course's checkout has no folder at all: it says where to look
    assert gpu_results.load_results(tmp_path / "absent") is None
    assert "which this copy of the library does not have" in text(gpu_results.render_view(spec(), None))
    assert "No item of the GPU suite measures these quantities yet" in text(gpu_results.render_view(
        spec(links=False), None))


def test_the_devices_shown_are_the_files_present(two_devices):
    for folder in list(two_devices.iterdir()):
        shown = text(gpu_results.render_view(spec(), gpu_results.load_results(two_devices)))
        present = {json.loads(p.read_text())["device"]["name"] for p in two_devices.glob("*/ch05.json")}
        named = set(re.search(r"Measured on GPUs: (.*?), from", shown).group(1).split(", "))
        assert named == present
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()
    assert "No GPU measurement committed yet" in text(gpu_results.render_view(
        spec(), gpu_results.load_results(two_devices)))


def test_rehearsals_and_failed_items_are_not_measurements(tmp_path):
    root = tmp_path / "gpu"
    write_device(root, "rehearsal-h100", "rehearsal-h100", {"ch05.training_step": record(0.5, rehearsal="h100")})
    write_device(root, "nvidia-h200", "NVIDIA H200", {"ch05.training_step": record(0.03, status="failed")})
    assert gpu_results.load_results(root) == {}
    bad = root / "broken"
    bad.mkdir()
    (bad / "ch05.json").write_text("{not json")
    with pytest.raises(gpu_results.ResultFileError, match="broken/ch05.json"):
        gpu_results.load_results(root)


def test_lookup_reads_medians_values_and_speedups():
    r = record(0.03)
    assert gpu_results.lookup(r, "measurements.decoder_lm_step") == 0.03
    assert gpu_results.lookup(r, "values.decoder_lm_mfu") == 0.25
    assert gpu_results.lookup(r, "comparisons.adamw_step.speedup") == 2.0
    assert gpu_results.lookup(r, "comparisons.adamw_step.before") == 0.06
    assert gpu_results.lookup(r, "values.missing") is None
    assert gpu_results.lookup(r, "comparisons.adamw_step.verdict") is None


def test_the_book_redraws_stored_views_with_the_committed_files(two_devices, tmp_path):
    """A page stored when nothing was committed shows both devices once the build redraws it."""
    empty = tmp_path / "none"
    empty.mkdir()
    page = "<p>before</p>" + gpu_results.render_view(spec(), gpu_results.load_results(empty)) + "<p>after</p>"
    assert "No GPU measurement committed yet" in page
    redrawn = gpu_results.redraw_views(page, gpu_results.load_results(two_devices))
    assert redrawn.startswith("<p>before</p>") and redrawn.endswith("<p>after</p>")
    assert "NVIDIA H100 80GB HBM3, 2026-11-28" in redrawn and "NVIDIA A100-SXM4-40GB, 2026-11-28" in redrawn
    assert "No GPU measurement committed yet" not in redrawn
    assert gpu_results.specs_in(redrawn) == [spec()]


def test_published_values_link_to_their_appendix_entry():
    s = spec()
    s["rows"].append({"quantity": STEP, "kind": "published", "device": "NVIDIA A100 80GB", "value": 50.0, "unit": "ms",
                      "basis": "a paper, table 2", "url": "https://example.org/paper",
                      "key": "zero-gpt2-1.5b-adam-model-states"})
    book = gpu_results.render_view(s, None, book=True)
    assert 'href="../book/published_figures.html#fig-zero-gpt2-1-5b-adam-model-states"' in book
    appendix = (REPO_ROOT / "book" / "published_figures.md").read_text()
    assert "(fig-zero-gpt2-1-5b-adam-model-states)=" in appendix
    assert 'href="https://example.org/paper"' in gpu_results.render_view(s, None)  # in JupyterLab: the source


def stored_specs():
    return gpu_results.notebook_specs(NOTEBOOKS)


def test_every_chapter_links_its_view_to_numbers_the_suite_records():
    """Each link names a suite item and a number that a committed GPU run recorded (a misspelt path would show
    'no GPU measurement' for ever), and every chapter has at least one."""
    from gpuformer_lib.gpu_suite.core import ordered_items

    keys = {it.key for it in ordered_items()}
    results = gpu_results.load_results()
    assert results, "no GPU results are committed under bench_results/gpu"
    chapters = set()
    for stem, s in stored_specs():
        for link in s["links"]:
            assert link["item"] in keys, f"{stem}: {link['item']} is not a suite item"
            found = [f for f, run in results.items() if link["item"] in run["items"]
                     and gpu_results.lookup(run["items"][link["item"]], link["path"]) is not None]
            assert found, f"{stem}: no committed run records {link['item']} {link['path']}"
            chapters.add(stem)
    assert chapters == {p.stem for p in NOTEBOOKS}, sorted({p.stem for p in NOTEBOOKS} - chapters)


def test_the_appendix_lists_every_committed_device_and_item():
    results = gpu_results.load_results()
    page = gpu_results.appendix_html(results, stored_specs())
    for run in results.values():
        assert html.escape(run["device"]["name"]) in page
        for key in run["items"]:
            assert f"<h3>{key}</h3>" in page
    # the measured-against-predicted table has the chapter 5 step on every device, with its ratio
    rows = re.findall(r'<tr><td data-label="chapter"><a href="\.\./notebooks/05_encoder_decoder\.html">05</a></td>'
                      r"(.*?)</tr>", page)
    assert len(rows) >= len(results)
    assert "none on the page" in page
    assert gpu_results.appendix_html({}, []).count("No GPU measurement has been committed yet") == 1


def test_a_noisy_committed_timing_says_so_beside_its_number(tmp_path):
    root = tmp_path / "gpu"
    noisy = record(0.0296)
    noisy["measurements"]["decoder_lm_step"]["spread"] = 2.1
    write_device(root, "nvidia-h100-80gb-hbm3", "NVIDIA H100 80GB HBM3", {"ch05.training_step": noisy})
    shown = text(gpu_results.render_view(spec(), gpu_results.load_results(root)))
    assert "noisy: spread 210%" in shown and "spread 210%" in shown
    quiet = text(gpu_results.render_view(spec(), gpu_results.load_results(tmp_path / "none") or {}))
    assert "noisy" not in quiet


def test_the_suites_own_prediction_fills_the_columns_of_gpus_the_page_predicts_nothing_for(two_devices):
    """The A100 gets the prediction its suite run recorded, with its ratio; the H100 keeps the page's own."""
    for path in two_devices.glob("*/ch05.json"):
        data = json.loads(path.read_text())
        data["items"]["ch05.training_step"]["values"]["decoder_lm_predicted_s"] = {
            "value": 0.0102, "unit": "s", "how": "layer_cost.step_time_prediction"}
        path.write_text(json.dumps(data))
    s = spec()
    s["links"][0]["predicted_path"] = "values.decoder_lm_predicted_s"
    page = gpu_results.render_view(s, gpu_results.load_results(two_devices))
    shown = text(page)
    assert shown.count("the suite's prediction, same model") == 1  # the A100's; the H100 has the page's
    assert "10.2\xa0ms" in shown and "measured / predicted: 5.99" in shown and "measured / predicted: 2.57" in shown
    assert "Measured on GPUs: NVIDIA A100-SXM4-40GB, NVIDIA H100 80GB HBM3, from" in shown


def test_a_tie_and_a_chart_of_gpu_measurements_alone(tmp_path):
    root = tmp_path / "gpu"
    tie = record(0.0296)
    tie["comparisons"]["adamw_step"]["verdict"] = "no difference beyond the spread"
    tie["comparisons"]["adamw_step"]["before"]["spread"] = 0.5
    write_device(root, "nvidia-h100-80gb-hbm3", "NVIDIA H100 80GB HBM3", {"ch05.training_step": tie})
    write_device(root, "nvidia-h200", "NVIDIA H200", {"ch05.training_step": record(0.0297)})
    s = spec()
    s["rows"] = s["rows"][:1]
    s["links"].append({"quantity": "AdamW, foreach / fused", "item": "ch05.training_step",
                       "path": "comparisons.adamw_step.speedup", "unit": "x", "scale": 1.0})
    results = gpu_results.load_results(root)
    shown = text(gpu_results.render_view(s, results))
    assert "noisy: spread 50%, no difference beyond the spread" in shown
    # only GPU measurements on a line: the table says it, no chart stretches 29.6 against 29.7 across its width
    assert 'class="gv-chart"' not in gpu_results.render_view(s, results)
    s["rows"].append({**spec()["rows"][1]})
    chart = gpu_results.render_view(s, results)
    positions = [float(x) for x in re.findall(r'class="gv-mark gv-measured" style="left:([\d.]+)%"', chart)]
    assert len(positions) == 2 and abs(positions[0] - positions[1]) < 5  # a tenth of a percent apart stays close


def test_the_appendix_uses_si_prefixes_and_names_skipped_items(two_devices):
    (two_devices / "nvidia-h100-80gb-hbm3" / "suite.json").write_text(json.dumps({"items": [
        {"key": "ch11.allreduce_busbw", "status": "skipped", "why": "needs 2 GPUs"}]}))
    page = gpu_results.appendix_html(gpu_results.load_results(two_devices), [])
    assert "skipped: <code>ch11.allreduce_busbw</code> (needs 2 GPUs)" in page
    assert "29.6\xa0ms" in page and "commit c7117571" not in page and "commit c711757" in page
    assert gpu_results.si(2.93e12, "B/s") == "2.93\xa0TB/s" and gpu_results.si(6.49e-6, "s") == "6.49\xa0µs"


def test_chart_labels_of_close_marks_go_on_different_lines():
    # chapter 5's step: the H100's and H200's measurements and the H100's prediction within a few percent
    labels = [(6.9, "H200 pred."), (36.4, "H100 pred."), (36.9, "H100"), (38.0, "H200"), (93.0, "T4 pred.")]
    rows = gpu_results.label_rows(labels)
    assert len(set(rows[1:4])) == 3, rows  # the three close ones each on their own line
    assert rows[0] == 0 and rows[4] == 0  # far apart: the first line is enough
    for i, (a, ra) in enumerate(zip(labels, rows)):
        for b, rb in zip(labels[i + 1:], rows[i + 1:]):
            if ra == rb:
                (s1, e1), (s2, e2) = gpu_results.label_extent(*a), gpu_results.label_extent(*b)
                assert e1 <= s2 or e2 <= s1, (a, b)


def test_labels_far_apart_share_the_first_line():
    assert gpu_results.label_rows([(10.0, "this page"), (50.0, "H100"), (90.0, "T4 pred.")]) == [0, 0, 0]
    assert gpu_results.label_rows([(50.0, "H100"), (50.0, "H100"), (50.0, "H100")]) == [0, 1, 2]
