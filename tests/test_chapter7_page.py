"""Chapter 7's page keeps the fixes of the chapters 7-12 review (issue 13): each finding has a check here or an
assert in the notebook, so a later edit cannot bring it back silently. Also the chapter's exercise checks."""

import re

import pytest
import torch

from gpuformer_lib.exercises.training import SYNC_LOOP, check_host_syncs, check_padding_prediction

import notebook_pages as pages

cells = pages.cells_fixture("07_training_loop.ipynb")


def test_split_is_by_english_sentence_and_the_leak_is_asserted_away(cells):
    code = pages.text(cells, "code")
    assert "data.split_by_source(pairs, seed=0)" in code
    assert "assert data.shared_sources(train_pairs, test_pairs) == 0" in code
    assert re.search(r"split by sentence: 0 of [\d,]+", pages.outputs(cells))


def test_non_blocking_prose_is_correct(cells):
    prose = pages.text(cells, "markdown")
    assert "overlaps with computation that is already queued" not in prose, "the review's error (cell 9)"
    assert "do **not** make the copy overlap" in prose and "side stream" in prose.lower()
    assert "wait_stream" in prose and "record_stream" in prose
    assert "prefetch.Prefetcher(loader, device)" in pages.text(cells, "code")


def test_workers_measurement_is_fair_and_interpreted(cells):
    code = pages.text(cells, "code")
    assert "persistent_workers=num_workers > 0" in code
    assert "first = next(batches)" in code, "the first batch (worker start-up) is left out of the timing"
    assert "feed_model(b.src" in code, "the loop computes"
    assert "prefetch.loader_overlap_words(" in code and "{glue:text}`workers_words`" in pages.text(cells, "markdown")


def test_precision_has_one_rule_and_resume_explains_determinism(cells):
    code = pages.text(cells, "code")
    assert "is_bf16_supported" not in code
    assert "device_measurements.training_precision_on(profile, device)" in code
    prose = pages.text(cells, "markdown")
    assert "seed_everything(0, deterministic=True)" in prose and "CUBLAS_WORKSPACE_CONFIG" in prose
    assert "compare_resumed(" in code


def test_translator_is_judged_against_the_retrieval_baseline(cells):
    code, prose, out = pages.text(cells, "code"), pages.text(cells, "markdown"), pages.outputs(cells)
    assert "retrieval.RetrievalTranslator().fit(train_pairs)" in code
    assert "retrieval.winner_words(" in code and "{glue:text}`mt_verdict`" in prose
    scores = dict(re.findall(r"^\s+(translator|retrieval baseline)\s+BLEU\s+([\d.]+)", out, re.M))
    assert len(scores) == 2
    verdict = re.search(r"^(The retrieval baseline beats|The translator beats|Neither system).*$", out, re.M).group(0)
    bleu_t, bleu_r = float(scores["translator"]), float(scores["retrieval baseline"])
    if bleu_r > bleu_t + 0.5:
        assert "BLEU: the retrieval baseline wins" in verdict
    elif bleu_t > bleu_r + 0.5:
        assert "BLEU: the translator wins" in verdict
    assert "chrF" in out and "{glue:text}`chrf`" in prose


def test_gpu_view_has_three_kinds_and_no_typed_gpu_scores(cells):
    out = pages.outputs(cells)
    view = out[out.index("Chapter 7 on a GPU"):]
    for kind in ("measured", "predicted", "published"):
        assert f" {kind} " in view
    for key in ("transformer-base-batch-tokens", "packing-padding-share-common-datasets", "packing-bert-phase2-speedup"):
        assert f'gpu_view.published("{key}")' in pages.text(cells, "code")
    prose = pages.text(cells, "markdown")
    assert "{glue:text}`preset_scores`" in prose and "no GPU ran this page" in pages.text(cells, "code")


def test_packing_and_token_budget_are_checked_on_the_page(cells):
    code = pages.text(cells, "code")
    assert "assert max(gaps) < 1e-5 and leak > 1e-3" in code
    assert "packing.TokenBudgetBatchSampler(" in code


def test_interpreting_words_are_glued(cells):
    prose = pages.text(cells, "markdown")
    for key in ("bucket_speedup", "budget_vs_bucket", "workers_words", "mt_verdict", "leaked_pairs", "n_pairs",
                "pub_batch_tokens", "pub_padding", "pub_packing", "breakeven_h100"):
        assert "{glue:text}`" + key + "`" in prose, key
    assert "29,000" not in prose, "the pair count is glued"


def test_exercises_have_hidden_solutions(cells):
    solutions = [c for c in cells if c["cell_type"] == "code" and "solution" in c["metadata"].get("tags", [])]
    assert len(solutions) >= 5 and all("hide-cell" in c["metadata"]["tags"] for c in solutions)
    code = pages.text(cells, "code")
    assert "check_padding_prediction(predict_padding" in code and "check_host_syncs(syncing_lines)" in code


# ---- the exercise checks themselves (their right and wrong answers: tests/answer_tables/training.py)


def test_padding_check_refuses_bad_settings_and_names_the_sizes_it_grades():
    lengths = [3 + i % 20 for i in range(400)]
    for settings in ((lengths, 64, 1.2), (lengths, 1, None), ([7] * 50, 8, None), ([], 8, None)):
        with pytest.raises(ValueError):
            check_padding_prediction(lambda ls, b: 0.4, *settings)
    asked = []
    check_padding_prediction(lambda ls, b: asked.append(b) or 0.4, lengths, 64)
    assert asked == [8, 32, 64]


def test_host_sync_loop_has_its_fifteen_lines():
    assert len(SYNC_LOOP) == 15
    assert check_host_syncs({5, 8})


# ---- issue 30: the batchings are timed through bench, and the kernel count is the course's one count

COMPARISON_LINE = re.compile(
    r"^(?P<candidate>[\w -]+): (?:(?P<factor>[\d.]+)x (?P<verdict>faster|slower) than (?P<baseline>[\w -]+?)"
    r"|no faster or slower than (?P<tie_baseline>[\w -]+?) that we can see \((?P<tie>[\d.]+)x, within the spread "
    r"of the rounds\)) \(median of (?P<rounds>\d+) interleaved rounds, .*middle half of the rounds' speedups "
    r"(?P<low>[\d.]+)x-(?P<high>[\d.]+)x\)$", re.M)


def printed_comparisons(out: str) -> dict[tuple[str, str], re.Match]:
    return {(m["baseline"] or m["tie_baseline"], m["candidate"]): m for m in COMPARISON_LINE.finditer(out)}


def assert_verdict_follows_the_rounds(m: re.Match) -> None:
    """The printed verdict agrees with the printed middle half of the rounds' speedups (rounded to 2 places)."""
    low, high = float(m["low"]), float(m["high"])
    assert int(m["rounds"]) >= 5, m.group(0)
    if m["verdict"] == "faster":
        assert low >= 1.0 and float(m["factor"]) > 1.0, m.group(0)
    elif m["verdict"] == "slower":
        assert high <= 1.0 and float(m["factor"]) > 1.0, m.group(0)
    else:
        assert not (low > 1.005 and float(m["tie"]) > 1.025) and not (high < 0.995 and float(m["tie"]) < 0.975)


def test_batchings_are_timed_in_interleaved_rounds_with_their_spread(cells):
    code, out, glued = pages.text(cells, "code"), pages.outputs(cells), pages.glued(cells)
    assert "def throughput(" not in code, "one timing per batching, no warm-up (the review's error 2)"
    assert "bench.time_interleaved(" in code and "bench.Comparison(" in code
    found = printed_comparisons(out)
    pairs = {("random batches", "bucketed batches"): "bucket_speedup",
             ("random batches", "token-budget batches"): "budget_speedup",
             ("bucketed batches", "token-budget batches"): "budget_vs_bucket"}
    for pair, key in pairs.items():
        m = found[pair]
        assert_verdict_follows_the_rounds(m)
        phrase = m.group(0)[len(pair[1]) + 2:m.group(0).index(" (median of")]
        assert glued[key] == phrase, (key, glued[key], phrase)


def test_kernel_count_is_the_course_count_with_views_left_out(cells):
    """The review's error 1: the page counted every dispatched operator (views, detaches and the model's own
    initialisation included) as a kernel launch. The count is the predictor's (predict.count_kernels, the
    model built outside the count), and the break-even launch cost is the GPU's work over that count."""
    import dataclasses

    from gpuformer_lib import model_sizes, predict
    from gpuformer_lib.profiles import SizePreset

    code, prose, out = pages.text(cells, "code"), pages.text(cells, "markdown"), pages.outputs(cells)
    assert "TorchDispatchMode" not in code and "__torch_dispatch__" not in code
    assert "at least one kernel launch" not in prose
    assert "predict.training_work(" in code and "work.kernels" in code
    glued = pages.glued(cells)
    src_vocab, tgt_vocab = (int(v.replace(",", "")) for v in re.search(
        r"vocabularies: ([\d,]+) English words, ([\d,]+) Chinese characters", out).groups())
    run = model_sizes.translation_run(SizePreset("gpu", reason="test"), src_vocab, tgt_vocab, 24)
    cfg = dataclasses.replace(run.config, check_token_ids=False)
    kernels = predict.count_kernels(cfg, src_len=8, dtype=torch.bfloat16).total
    assert int(glued["ops_h100"].replace(",", "")) == kernels
    gpu_ms = float(glued["gpu_h100"].split()[0])
    breakeven_us = float(glued["breakeven_h100"].split()[0])
    assert breakeven_us == pytest.approx(1e3 * gpu_ms / kernels, rel=0.01)


def test_token_shard_is_two_bytes_a_token_and_memmap_batches_equal_the_in_memory_ones(cells):
    code, out, glued = pages.text(cells, "code"), pages.outputs(cells), pages.glued(cells)
    assert "data.write_token_shard(" in code and "data.memmap_batches(" in code
    assert "assert all(same) and not os.path.exists(shard)" in code
    assert "20 batches read through np.memmap equal lm_batch's: True" in out
    m = re.search(r"^([\d,]+) training tokens: ([\d.]+) MiB as int64 in memory \(8 bytes a token\), ([\d.]+) MiB "
                  r"on disk as uint16$", out, re.M)
    assert m and abs(float(m.group(2)) - 4 * float(m.group(3))) < 0.15  # a quarter of int64's bytes
    assert int(glued["shard_pages"]) <= 2 * int(glued["shard_batch"])
