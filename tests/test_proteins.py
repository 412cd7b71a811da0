"""gpuformer_lib.proteins against brute-force and float64 references: the parsers, the k-mer filter, the
n-gram model, AUC / MCC / logistic regression, padding shares, and the packed forward pass (each protein
alone computes what it computes packed)."""

import itertools
import math

import numpy as np
import pytest
import torch

from fake_clock import FakeClock
from gpuformer_lib import proteins as P
from gpuformer_lib.model import DecoderLM


def test_encode_maps_rare_letters_to_x_and_decodes_back():
    ids = P.encode("ACDWYBZUOX")
    assert ids[:5].tolist() == [2, 3, 4, 20, 21] and set(ids[5:].tolist()) == {P.UNKNOWN}
    assert P.decode(P.encode("MKVL")) == "MKVL"
    with pytest.raises(ValueError):
        P.encode("")


def test_read_fasta(tmp_path):
    f = tmp_path / "x.fasta"
    f.write_text(">a one\nMKV\nLL\n>b\nAC\n")
    assert P.read_fasta(f) == [("a one", "MKVLL"), ("b", "AC")]
    (tmp_path / "bad.fasta").write_text("MKV\n")
    with pytest.raises(ValueError, match="before the first"):
        P.read_fasta(tmp_path / "bad.fasta")


def test_parse_peptides_drops_repeats_and_conflicting_labels():
    lines = ["3,1,UniProt,AMP", "AAK, 1", "AAK, 1", "GGG, 0", "KKK, 1", "KKK, 0"]
    p = P.parse_peptides(lines)
    assert p.sequences == ["AAK", "GGG"] and p.labels.tolist() == [1, 0]
    assert (p.rows, p.duplicates, p.conflicting) == (5, 2, 1)  # 5 data rows, 3 distinct sequences
    with pytest.raises(ValueError):
        P.parse_peptides(["h", "AAK, 2"])


def _brute_share(train, query, k):
    known = {tuple(s[i:i + k]) for s in train for i in range(len(s) - k + 1)}
    q = [tuple(query[i:i + k]) for i in range(len(query) - k + 1)]
    return 0.0 if not q else sum(x in known for x in q) / len(q)


def test_shared_kmer_share_matches_brute_force():
    rng = np.random.default_rng(0)
    train = [rng.integers(2, 6, rng.integers(3, 30)) for _ in range(20)]
    queries = [rng.integers(2, 6, rng.integers(1, 30)) for _ in range(15)] + [train[0].copy()]
    got = P.shared_kmer_share(train, queries, k=3)
    want = [_brute_share(train, q, 3) for q in queries]
    np.testing.assert_allclose(got, want)
    assert got[-1] == 1.0


def test_kmer_filtered_split_leaves_no_held_out_relative():
    rng = np.random.default_rng(1)
    base = ["".join(rng.choice(list(P.AMINO_ACIDS), 60)) for _ in range(40)]
    seqs = base + [s[:50] + "W" for s in base[:20]]  # fragments: near copies
    sp = P.kmer_filtered_split(seqs, fractions=(0.8, 0.1, 0.1), k=5, max_shared=0.5, seed=0)
    assert len(sp.train) + len(sp.val) + len(sp.test) == len(seqs)
    for part in (sp.val, sp.test):
        if part:
            assert P.shared_kmer_share(sp.train, part, 5).max() <= 0.5
    control = P.shared_kmer_share([P.encode(s) for s in base], [P.encode(s) for s in seqs[40:]], 5)
    assert control.min() > 0.5  # the filter had something to find
    if sp.val and sp.test:
        assert P.shared_kmer_share(sp.val, sp.test, 5).max() <= 0.5


def _brute_share(train, query, k):
    """Share of the query's k-mers (positions) found in any training sequence, by Python sets."""
    seen = {tuple(t[i:i + k]) for t in train for i in range(len(t) - k + 1)}
    grams = [tuple(query[i:i + k]) for i in range(len(query) - k + 1)]
    return sum(g in seen for g in grams) / len(grams) if grams else 0.0


def test_shared_kmer_share_matches_sets_and_test_is_kept_from_validation():
    rng = np.random.default_rng(4)
    train = [rng.integers(2, 6, rng.integers(3, 30)) for _ in range(15)]
    queries = [rng.integers(2, 6, rng.integers(1, 30)) for _ in range(15)]
    got = P.shared_kmer_share(train, queries, 3)
    np.testing.assert_allclose(got, [_brute_share(train, q, 3) for q in queries])
    # relatives only across validation and test: the second filter must find them
    base = ["".join(np.random.default_rng(i).choice(list(P.AMINO_ACIDS), 60)) for i in range(60)]
    seqs = base + [s[:55] + "WW" for s in base]
    moved = 0
    for seed in range(6):
        sp = P.kmer_filtered_split(seqs, fractions=(0.5, 0.25, 0.25), k=5, max_shared=0.5, seed=seed)
        assert len(sp.train) + len(sp.val) + len(sp.test) == len(seqs)
        assert P.shared_kmer_share(sp.val, sp.test, 5).max(initial=0) <= 0.5
        assert P.shared_kmer_share(sp.train, sp.test, 5).max(initial=0) <= 0.5
        moved += sp.test_to_val
    assert moved > 0


def _brute_ngram_prob(train, order, k, context, a):
    """Interpolated add-k probability computed from dict counts."""
    V = P.VOCAB_SIZE
    padded = [[P.END] * (order - 1) + list(s) + [P.END] for s in train]
    p = 1.0 / V
    for n in range(1, order + 1):
        h = tuple(context[len(context) - (n - 1):]) if n > 1 else ()
        c_ha = c_h = 0
        for s in padded:
            for i in range(order - 1, len(s)):
                if tuple(s[i - (n - 1):i]) == h:
                    c_h += 1
                    c_ha += s[i] == a
        p = (c_ha + k * p) / (c_h + k)
    return p


def test_ngram_matches_dict_counts_and_normalises():
    rng = np.random.default_rng(2)
    train = [rng.integers(2, 8, rng.integers(2, 12)) for _ in range(12)]
    m = P.NGramModel(3, k=2.0).fit(train)
    for context, a in (((3, 4), 5), ((P.END, P.END), 2), ((7, 7), P.END), ((20, 21), 3)):
        code = (context[0] * P.VOCAB_SIZE + context[1]) * P.VOCAB_SIZE + a
        assert math.isclose(m.probs[-1].reshape(-1)[code], _brute_ngram_prob(train, 3, 2.0, context, a), rel_tol=1e-12)
    np.testing.assert_allclose(m.probs[-1].sum(1), 1.0)
    test = [rng.integers(2, 8, 5)]
    assert len(m.log_probs(test)) == 6  # 5 residues and the end token
    np.testing.assert_array_equal(m.log_probs(test, end=False), m.log_probs(test)[:-1])
    # windows: exactly the LM's targets w[1:], the END only where the window holds it
    whole = np.concatenate([[P.END], test[0], [P.END]])
    cropped = whole[:4]  # END and three residues: no end to predict
    brute = [math.log(_brute_ngram_prob(train, 3, 2.0, ([P.END, P.END] + list(w[1:]))[i:i + 2], w[1 + i]))
             for w in (whole, cropped) for i in range(len(w) - 1)]
    assert math.isclose(m.window_nll([whole, cropped]), -np.mean(brute), rel_tol=1e-12)
    with pytest.raises(ValueError):
        m.log_probs(test, end=[True, False])
    refit = m.with_k(5.0)
    np.testing.assert_array_equal(refit.probs[-1], P.NGramModel(3, k=5.0).fit(train).probs[-1])
    uniform = P.NGramModel(1, k=1e9).fit(train)
    assert math.isclose(uniform.perplexity(test), P.VOCAB_SIZE, rel_tol=1e-6)


def test_auc_equals_pairwise_brute_force_with_ties():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 60)
    s = rng.integers(0, 5, 60).astype(float)  # many ties
    pos, neg = s[y == 1], s[y == 0]
    want = np.mean([(p > n) + 0.5 * (p == n) for p, n in itertools.product(pos, neg)])
    assert math.isclose(P.auc(y, s), want, rel_tol=1e-12)
    with pytest.raises(ValueError):
        P.auc([1, 1], [0.1, 0.2])


def test_mcc_and_accuracy_hand_cases():
    assert P.mcc([1, 1, 0, 0], [1, 1, 0, 0]) == 1.0 and P.mcc([1, 1, 0, 0], [0, 0, 1, 1]) == -1.0
    assert P.mcc([1, 0, 1, 0], [1, 1, 1, 1]) == 0.0  # a margin is empty
    # TP=2 TN=1 FP=1 FN=1: (2 - 1) / sqrt(3 * 3 * 2 * 2) = 1/6
    assert math.isclose(P.mcc([1, 1, 1, 0, 0], [1, 1, 0, 1, 0]), 1 / 6)
    assert P.accuracy([1, 0, 1], [1, 1, 1]) == pytest.approx(2 / 3)


def test_logistic_regression_reaches_newtons_optimum():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(80, 4))
    y = (X @ [1.0, -2.0, 0.5, 0.0] + rng.normal(size=80) > 0).astype(int)
    l2 = 1.0
    m = P.fit_logistic(X, y, l2=l2)
    Z = np.hstack([(X - m.mean) / m.scale, np.ones((80, 1))])
    w = np.zeros(5)
    s = 2 * y - 1
    reg = np.diag([l2] * 4 + [0.0])
    for _ in range(50):  # Newton's method in float64
        p = 1 / (1 + np.exp(s * (Z @ w)))  # sigma(-s z)
        grad = -(Z.T @ (s * p)) + reg @ w
        H = (Z.T * (p * (1 - p))) @ Z + reg
        w -= np.linalg.solve(H, grad)
    np.testing.assert_allclose(np.append(m.weights, m.bias), w, atol=1e-5)


def test_kmer_counts_are_frequencies():
    X = P.kmer_counts(["AAC"], ks=(1, 2))
    assert X.shape == (1, 21 + 21 ** 2)
    assert X[0, 0] == pytest.approx(2 / 3) and X[0, 1] == pytest.approx(1 / 3)  # A, C
    assert X[0, 21 + 0] == pytest.approx(1 / 3) and X[0, 21 + 1] == pytest.approx(1 / 3)  # AA, AC


def test_padding_share_and_crop_windows():
    assert P.padding_share([2, 4, 4, 1], [[0, 1], [2, 3]]) == pytest.approx(1 - 11 / 16)
    seqs = [np.arange(2, 12), np.array([2, 3])]
    w = P.crop_windows(seqs, crop=4, seed=0, epoch=0)
    assert [len(x) for x in w] == [5, 4]
    full = np.concatenate([[P.END], seqs[0], [P.END]])
    assert any(np.array_equal(w[0], full[i:i + 5]) for i in range(len(full) - 4))
    assert P.first_windows(seqs, 4)[1].tolist() == [P.END, 2, 3, P.END]


def _tiny_lm():
    torch.manual_seed(0)
    return DecoderLM(P.lm_config(16, 2, 2, 32)).eval()


def test_padded_batches_go_through_the_model_itself():
    model = _tiny_lm()
    b = P.collate_padded([np.array([1, 2, 3, 4, 1]), np.array([1, 5, 1])])
    torch.testing.assert_close(P.lm_logits(model, b), model(b.ids, b.padding_mask))
    assert b.real == 6 and b.targets[1].tolist() == [5, 1, 0, 0]


def test_packed_rows_compute_what_each_protein_alone_computes():
    model = _tiny_lm()
    rng = np.random.default_rng(5)
    windows = [np.concatenate([[P.END], rng.integers(2, 22, n)]) for n in (9, 4, 6, 3)]
    packed = P.collate_packed(windows, row_len=12)
    assert packed.padding_mask.sum() < packed.ids.numel() - packed.real + 1
    logits = P.lm_logits(model, packed)
    for k, w in enumerate(windows):
        alone = model(torch.from_numpy(w[:-1]).long()[None])[0]
        torch.testing.assert_close(logits[packed.document == k], alone, atol=1e-5, rtol=1e-5)
        assert packed.targets[packed.document == k].tolist() == w[1:].tolist()
    loss_packed, n = P.lm_loss(model, packed)
    assert int(n) == sum(len(w) - 1 for w in windows)


def test_lm_batches_kinds_hold_the_same_real_tokens():
    rng = np.random.default_rng(6)
    windows = [np.concatenate([[P.END], rng.integers(2, 22, n)]) for n in rng.integers(3, 30, 40)]
    real = {k: sum(b.real for b in P.lm_batches(windows, k, 4, 32, 0, 0)) for k in ("padded", "bucketed", "packed")}
    assert len(set(real.values())) == 1
    with pytest.raises(ValueError):
        P.lm_batches(windows, "sorted", 4, 32, 0, 0)


def test_classifier_scores_keep_the_order_and_ignore_padding():
    torch.manual_seed(0)
    clf = P.PeptideClassifier(d_model=16, n_layers=1, n_heads=2, max_len=20, dropout=0.0).eval()
    ids = P.peptide_ids(["KKLLKK", "GA", "AKLWKKA"], 20)
    batched = P.classifier_scores(clf, ids, batch_size=2)
    with torch.no_grad():
        one = [float(clf(ids[i:i + 1, :int((ids[i] != 0).sum())])) for i in range(3)]
    np.testing.assert_allclose(batched, one, atol=1e-5)


def test_case_plan_and_predictions():
    from gpuformer_lib.device import SizePreset
    from gpuformer_lib.profiles import PROFILES

    cpu = P.case_plan(PROFILES["cpu"], SizePreset("cpu", "test"))
    rehearsal = P.case_plan(PROFILES["t4"], SizePreset("gpu-small", "test", toy=True))
    gpu = P.case_plan(PROFILES["h100-80gb"], SizePreset("gpu", "test"))
    assert rehearsal.budget_tokens < cpu.budget_tokens < gpu.budget_tokens and len(gpu.seeds) == 3
    with pytest.raises(ValueError):
        P.case_plan(PROFILES["cpu"], "cpu")
    cfg = P.lm_config(512, 6, 8, 1024)
    rows = P.predicted_steps(cfg, 32, 1024, 0.5, "H100 SXM", torch.bfloat16)
    assert [r for r, _ in rows] == ["baseline (fp32, padded batches)", "+ packed rows", "+ TF32 matmuls",
                                    "+ bf16 autocast"]
    # the predictor's own steps: 32 padded windows, then the same residues in 16 full ones
    from gpuformer_lib import predict
    assert rows[1][1].seconds == predict.predict_step(predict.training_work(cfg, tokens=16 * 1024, seq_len=1024,
                                                                            fmt="fp32"), "H100 SXM").seconds
    # a compute-bound fp32 step halves with half the windows, a little less (launches and the optimizer stay)
    assert rows[0][1].bound == "compute" and 1.3 < rows[0][1].seconds / rows[1][1].seconds < 2
    assert P.packing_gain(rows, 32, 0.5) == pytest.approx(rows[0][1].seconds / rows[1][1].seconds)
    assert rows[2][1].seconds < rows[1][1].seconds  # TF32 tensor cores
    assert [r for r, _ in P.predicted_steps(cfg, 32, 1024, 0.5, "T4", torch.float16)][-1] == "+ fp16 autocast"
    assert len(P.predicted_steps(cfg, 32, 1024, 0.5, "T4", torch.float16)) == 3  # no TF32 on a T4
    with pytest.raises(ValueError, match="padded slots"):
        P.predicted_steps(cfg, 32, 1024, 1.0, "T4", torch.float16)
    assert P.bottleneck({"attention": 1.0, "matrix products": 3.0}) == (("matrix products",), 0.75)
    tie = P.bottleneck({"element-wise, norms, copies": 47.3, "matrix products": 47.7, "optimizer": 5.0})
    assert tie[0] == ("matrix products", "element-wise, norms, copies") and tie[1] == pytest.approx(0.477)
    assert P.bottleneck({"a": 1.0, "b": 0.85})[0] == ("a",)
    assert P.fix_for("optimizer", ["baseline", "+ fused AdamW"]) == "+ fused AdamW"
    assert P.fix_for("attention", ["baseline"]) is None
    rows = ["baseline", "+ packed rows", "+ bf16 autocast", "+ torch.compile"]
    assert P.fix_for("element-wise, norms, copies", rows) == "+ torch.compile"
    assert P.fix_for("element-wise, norms, copies", rows[:3]) == "+ bf16 autocast"
    with pytest.raises(ValueError):
        P.fix_for("nonsense", [])


def test_exercise_checks():
    from gpuformer_lib.exercises import proteins as ex

    assert ex.check_packing_prediction(1 / (1 - 0.3), 1.35, padding_share=0.3)
    assert not ex.check_packing_prediction(3.0, 1.35, padding_share=0.3)
    # graded by the model: a timing far from it neither fails the right answer nor passes itself
    calls = []
    slow = ex.check_packing_prediction(1 / 0.7, lambda: calls.append(1) or 0.9, padding_share=0.3)
    assert slow and len(calls) == 1 and "not graded" in slow.message
    assert not ex.check_packing_prediction(0.9, 0.9, padding_share=0.3)
    for wrong, words in ((1.3, "one plus the padding share"), (0.7, "real slots before packing"),
                         (1 / 0.3, "counts the padded slots")):
        result = ex.check_packing_prediction(wrong, None, padding_share=0.3)
        assert not result and words in result.message, result.message
    assert ex.check_padding_prediction(0.75, 0.72, crop=2048)
    assert not ex.check_padding_prediction(0.2, 0.72, crop=2048)
    good = lambda tp, tn, fp, fn: P.mcc([1] * tp + [0] * tn + [0] * fp + [1] * fn,  # noqa: E731
                                        [1] * tp + [0] * tn + [1] * fp + [0] * fn)
    assert ex.check_mcc(good)
    assert not ex.check_mcc(lambda tp, tn, fp, fn: (tp + tn) / (tp + tn + fp + fn))


def test_task_trains_in_the_harness_and_rates_compare():
    from gpuformer_lib import bench, case_study
    from gpuformer_lib.profiles import PROFILES

    rng = np.random.default_rng(7)
    seqs = ["".join(rng.choice(list(P.AMINO_ACIDS), n)) for n in rng.integers(5, 60, 60)]
    sp = P.kmer_filtered_split(seqs, fractions=(0.7, 0.15, 0.15), k=6)
    plan = P.CasePlan(16, 1, 2, 32, 4, 600, (0,), 0.05, 1, 8, None, 1)
    task = P.protein_lm_task(sp, plan)
    for kind in ("padded", "packed"):
        run, _ = case_study.train_run(task, case_study.Setting().with_options(batching=kind), "cpu", PROFILES["cpu"])
        assert run.tokens >= 600 and math.isfinite(run.quality)
    ratio = P.batching_rate_ratio(task, "packed", "cpu", steps=1)
    assert 0 < ratio < math.inf
    # the same setting against itself, on a clock where every timed step lasts one tick: exactly 1 (on the real
    # clock one step's noise on a busy machine can be any factor)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bench, "time", FakeClock(tick=1e-3))
        same = P.setting_rate_ratio(task, case_study.Setting(), case_study.Setting(), "cpu", steps=2)
    assert same == pytest.approx(1.0)
    with pytest.raises(ValueError):
        P.setting_rate_ratio(task, case_study.Setting(), case_study.Setting(), "cpu", steps=0)


def test_memory_grows_with_the_crop():
    plan = P.CasePlan(64, 2, 4, 128, 8, 1, (0,), 0.1, 1, 1, None, 1)
    sizes = [P.lm_memory_gib(plan, crop, 8, autocast=True) for crop in (128, 256, 512)]
    assert sizes[0] < sizes[1] < sizes[2]


def test_kmer_filtered_indices_partition_the_sequences_and_match_the_split():
    rng = np.random.default_rng(1)
    base = ["".join(rng.choice(list(P.AMINO_ACIDS), 30)) for _ in range(40)]
    seqs = base + [s[:25] + "W" for s in base[:20]] + ["KK"]  # near copies, and one shorter than k
    encoded = [P.encode(s) for s in seqs]
    idx = P.kmer_filtered_indices(encoded, fractions=(0.6, 0.2, 0.2), k=5, max_shared=0.5, seed=3)
    assert sorted(idx.train + idx.val + idx.test) == list(range(len(seqs)))  # a partition, nothing lost
    pick = lambda ids: [encoded[i] for i in ids]  # noqa: E731
    assert P.shared_kmer_share(pick(idx.train), pick(idx.test), 5).max(initial=0) <= 0.5
    assert P.shared_kmer_share(pick(idx.val), pick(idx.test), 5).max(initial=0) <= 0.5
    # a test sequence that shares a little with training and a little with validation, too much with both
    assert P.shared_kmer_share(pick(idx.train + idx.val), pick(idx.test), 5).max(initial=0) <= 0.5
    assert idx.moved > 0 and idx.held_out_before == 24
    # composites: the first half of one sequence and the second half of the next share 6 of their 16 5-mers
    # with each parent, 12 with both; with one parent in training and the other in validation only the union
    # shows it
    rng = np.random.default_rng(7)
    parents = ["".join(rng.choice(list(P.AMINO_ACIDS), 20)) for _ in range(60)]
    pool = [P.encode(s) for s in parents + [a[:10] + b[10:] for a, b in zip(parents, parents[1:])]]
    for seed in range(5):
        mixed = P.kmer_filtered_indices(pool, fractions=(0.4, 0.3, 0.3), k=5, max_shared=0.5, seed=seed)
        seen = [pool[i] for i in mixed.train + mixed.val]
        assert P.shared_kmer_share(seen, [pool[i] for i in mixed.test], 5).max(initial=0) <= 0.5
    sp = P.kmer_filtered_split(seqs, fractions=(0.6, 0.2, 0.2), k=5, max_shared=0.5, seed=3)
    for part, ids in ((sp.train, idx.train), (sp.val, idx.val), (sp.test, idx.test)):
        assert len(part) == len(ids) and all(np.array_equal(a, encoded[i]) for a, i in zip(part, ids))
    with pytest.raises(ValueError, match="three shares"):
        P.kmer_filtered_indices(encoded, fractions=(0.5, 0.2, 0.2))


def test_auc_difference_interval_holds_zero_for_equal_scorers_and_not_for_a_better_one():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 300)
    noise = rng.normal(size=300)
    good = y + 0.5 * rng.normal(size=300)
    diff, low, high = P.auc_difference(y, noise, noise)
    assert diff == 0 and low == 0 and high == 0
    diff, low, high = P.auc_difference(y, good, noise)
    assert diff == pytest.approx(P.auc(y, good) - P.auc(y, noise)) and 0 < low < diff < high
    diff, low, high = P.auc_difference(y, noise, good)
    assert high < 0  # the other way round
    with pytest.raises(ValueError, match="two classes"):
        P.auc_difference(np.ones(10), noise[:10], noise[:10])
