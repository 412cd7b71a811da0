"""Chapter 14's page (the protein case study) keeps the house rules: every number in the prose glued, every
verdict word chosen from its value, no share above 100 %, the acceleration table with its speedup column, the
baselines scored, the GPU view's three kinds, and three exercises with hidden solutions."""

import re

import notebook_pages as pages

cells = pages.cells_fixture("14_protein_case_study.ipynb")


def test_every_glued_value_is_used_and_every_used_one_is_glued(cells):
    pages.assert_glues_match(cells)


def test_no_stored_share_above_100_percent(cells):
    pages.assert_no_share_above_100(cells)
    assert pages.text(cells, "code").count("bench.check_fraction(") >= 4


def test_the_acceleration_table_is_shown_with_its_speedup_column(cells):
    html = pages.outputs(cells, mimes=("text/html",))
    assert "<th>speedup</th>" in html and "<th>time to quality</th>" in html
    for row in ("baseline", "+ bucketed batches", "+ packed rows"):
        assert row in html
    prose = pages.text(cells, "markdown")
    assert r"\frac{\text{time to quality before}}{\text{time to quality after}}" in prose


def test_verdict_words_agree_with_the_glued_values(cells):
    g = pages.glued(cells)
    m = re.search(r"(\d+\.\d+)x", g["speed_words"])
    if m:
        value = float(m.group(1))  # printed to two decimals: either word of a boundary it may have been rounded to
        pages.assert_speed_words(g["speed_words"])
    spread, tolerance = float(g["spread"]), float(g["tolerance"])
    assert g["tolerance_words"].startswith("larger") == (tolerance > spread)
    loss, uni, tol = float(g["lm_loss"]), float(g["uni_window"]), float(g["tolerance"])
    assert g["lm_vs"].startswith("below") == (loss <= uni - tol + 1e-3), g["lm_vs"]
    assert g["lm_vs"].startswith("above") == (loss >= uni + tol - 1e-3), g["lm_vs"]
    assert g["four_vs"].startswith("below") == (loss < float(g["four_window"]) - tol)
    drop = float(g["lm_drop"])
    assert abs(float(g["lm_initial"]) - loss - drop) < 2e-3
    assert g["drop_words"].startswith("left") == (drop > 3 * tol)
    gap = float(g["enc_auc"]) - float(g["lr_auc"])
    expected = "the encoder beats" if gap > 0.01 else "the k-mer baseline beats" if gap < -0.01 else "about even"
    assert expected in g["pep_winner"], g["pep_winner"]
    probe, comp = float(g["probe_auc"]), float(g["comp_auc"])
    expected = "better than" if probe > comp + 0.01 else "about as well" if probe > comp - 0.01 else "less well"
    assert expected in g["probe_words"]
    trained, control = probe, float(g["control_auc"])
    m = re.search(r"AUC ([+-][\d.]+), 95 % interval ([+-][\d.]+) to ([+-][\d.]+)", g["learned_words"])
    assert m, g["learned_words"]
    gap, low, high = (float(v) for v in m.groups())
    assert abs(gap - (trained - control)) <= 0.0011 and low <= gap <= high
    expected = "training added" if low > 0 else "separated them better" if high < 0 else "cannot tell"
    assert expected in g["learned_words"], g["learned_words"]
    m = re.search(r"ran it at (\d+\.\d+)x the rate of the row before it \(\"(.*)\"\): (.*)$", g["fix_effect"])
    assert m or g["fix_effect"] == "no row of this device's table applies it", g["fix_effect"]
    if m:  # the table's rule (bench.Comparison of the interleaved rounds): a gain is above 1, a loss below
        ratio, words = float(m.group(1)), m.group(3)
        assert words in ("a clear gain", "a loss", "within the spread of the interleaved rounds"), words
        assert (words != "a clear gain" or ratio >= 1) and (words != "a loss" or ratio <= 1), g["fix_effect"]
    assert "table.gain(fix)" in pages.text(cells, "code")
    words, ratio = g["packed_words"], float(g["packed_ratio"].rstrip("x"))
    assert (words != "a clear gain" or ratio >= 1) and (words != "a loss" or ratio <= 1), (words, ratio)
    assert abs(float(g["pack_ceiling"].rstrip("x")) - 1 / (1 - float(g["pad_here"].rstrip("%")) / 100)) < 0.01
    assert ("little to win" in g["pad_words"]) == (float(g["pad_here"].rstrip("%")) < 10)
    profile = next(o for o in pages.outputs(cells).split("\n") if o.startswith("bottleneck: "))
    assert g["top_category"] in profile
    assert ("tie" in g["tie_words"]) == (" and " in g["top_category"])
    code = pages.text(cells, "code")
    assert "time_by_category(prof.events()" in code and "case_study.row_step(" in code
    assert "table.summary()" in code


def test_baselines_and_split(cells):
    g = pages.glued(cells)
    assert int(g["moved"]) > 0  # the filter found relatives across a random split
    assert "assert max(brute) <= split.max_shared" in pages.text(cells, "code")
    assert "window_nll(eval_windows)" in pages.text(cells, "code")  # the n-grams score the LM's exact targets
    assert "assert ks[0] < best.k < ks[-1]" in pages.text(cells, "code")
    assert 1 < float(g["four_ppl"]) <= float(g["uni_ppl"]) < 20  # both below uniform over 20 letters
    assert float(g["lr_auc"]) > 0.5 and float(g["pep_majority"]) > 0.5
    # the peptides split by the chapter's own filter, and the L2 grid with its optimum inside at the book size
    assert float(g["pep_after"].rstrip("%")) <= 50 and int(g["pep_moved"].replace(",", "")) > 0
    assert "l2_grid[0] < best_l2 < l2_grid[-1]" in pages.text(cells, "code")
    from gpuformer_lib import book_run

    if book_run.read_stamp(pages.outputs(cells))[0] == "book":
        assert g["best_l2"].endswith(", inside the grid"), g["best_l2"]


def test_plots_are_shown(cells):
    images = [o for c in cells if c["cell_type"] == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert len(images) >= 3  # memory by crop, padding by crop, validation loss against training seconds


def test_gpu_view_has_its_three_kinds(cells):
    pages.assert_gpu_view(cells)
    assert "proteins.predicted_steps(" in pages.text(cells, "code")


def test_three_exercises_with_hidden_solutions_two_predict_then_measure(cells):
    assert len(pages.hidden_solutions(cells)) >= 3
    code = pages.text(cells, "code")
    for check in ("check_packing_prediction", "check_padding_prediction", "check_mcc"):
        assert f"assert {check}(" in code


def test_prose_length(cells):
    assert len(pages.text(cells, "markdown").split()) >= 2000


def test_the_model_trained_longer_is_judged_against_the_4gram_on_the_test_proteins(cells):
    from gpuformer_lib import book_run

    g = pages.glued(cells)
    out = pages.outputs(cells)
    seeds = re.findall(r"^seed \d+: [\d,]+ residues in [\d.]+ min; validation [\d.]+, test ([\d.]+) nats", out, re.M)
    assert len(seeds) == int(g["long_seeds"]) >= 2
    values = [float(v) for v in seeds]
    mean = sum(values) / len(values)
    sd = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    assert abs(mean - float(g["lm_test"])) < 1e-4 and abs(sd - float(g["lm_test_sd"])) < 1e-4
    margin = float(g["four_test"]) - mean
    words = g["lm_four_words"]
    expected = ("beats the 4-gram" if margin > 3 * sd and margin > 0 else "not a clear win" if margin > 0
                else "does not beat it")
    assert expected in words, (margin, sd, words)
    size, _ = book_run.read_stamp(out)
    if size == "book":  # the bar: below the 4-gram by more than three seed standard deviations, 3 seeds
        assert len(values) >= 3 and margin > 3 * sd, (margin, sd)
