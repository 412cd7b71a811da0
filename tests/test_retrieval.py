"""The retrieval baseline against a float64 brute-force TF-IDF, and the scores beside it."""

import math
from collections import Counter

import pytest
import torch

from gpuformer_lib.retrieval import RetrievalTranslator, char_ngrams, chrf, translation_scores, winner_words

PAIRS = [("I am tired.", "我累了。"), ("I'm exhausted.", "我累死了。"), ("Where is the station?", "车站在哪里？"),
         ("Where is the bank?", "银行在哪里？"), ("The cat sleeps.", "猫在睡觉。"), ("I like cats.", "我喜欢猫。"),
         ("He is tired too.", "他也累了。"), ("Is the station far?", "车站远吗？")]
QUERIES = ["i am so tired", "where's the station", "cats sleep", "is the bank far?", "xyz", "I LIKE CATS."]


def _brute_force(pairs, queries):
    """TF-IDF cosine in float64 with plain Python dictionaries: idf = ln((1 + N) / (1 + df)) + 1."""
    docs = [char_ngrams(s) for s, _ in pairs]
    df = Counter(g for d in docs for g in d)
    idf = {g: math.log((1 + len(docs)) / (1 + n)) + 1 for g, n in df.items()}

    def vec(counts):
        v = {g: c * idf[g] for g, c in counts.items() if g in idf}
        norm = math.sqrt(sum(x * x for x in v.values())) or 1.0
        return {g: x / norm for g, x in v.items()}

    vecs = [vec(d) for d in docs]
    out = []
    for q in queries:
        qv = vec(char_ngrams(q))
        sims = [sum(x * d.get(g, 0.0) for g, x in qv.items()) for d in vecs]
        best = max(range(len(sims)), key=lambda i: (sims[i], -i))  # the earliest on a tie
        out.append((best, sims[best]))
    return out


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_nearest_matches_float64_brute_force(dtype, tol):
    model = RetrievalTranslator(dtype=dtype, chunk=4).fit(PAIRS)  # chunk < queries: the chunking is exercised
    index, score = model.nearest(QUERIES)
    for (want_i, want_s), got_i, got_s in zip(_brute_force(PAIRS, QUERIES), index.tolist(), score.tolist()):
        assert got_i == want_i
        assert got_s == pytest.approx(want_s, abs=tol)
    assert model.translate(["Where is the station?"]) == ["车站在哪里？"]  # an exact source retrieves itself
    assert model.translate(QUERIES)[5] == "我喜欢猫。"  # lower-cased


def test_char_ngrams_and_errors():
    assert char_ngrams("Ab", 1, 2) == Counter({"a": 1, "b": 1, "ab": 1})
    assert char_ngrams("a  b", 3, 3) == Counter({"a b": 1})
    with pytest.raises(RuntimeError, match="fit"):
        RetrievalTranslator().translate(["x"])
    with pytest.raises(ValueError):
        RetrievalTranslator(ngram_range=(2, 1))


def test_scores_and_the_winner_sentence():
    refs = ["我累了。", "车站在哪里？"]
    perfect = translation_scores(refs, refs)
    assert perfect["BLEU"] == pytest.approx(100) and perfect["chrF"] == pytest.approx(100)
    assert chrf(["猫。", "狗"], refs) < 30
    said = winner_words({"BLEU": 8.0, "chrF": 20.0}, {"BLEU": 28.0, "chrF": 25.0})
    assert said.startswith("The retrieval baseline beats the translator on every metric")
    said = winner_words({"BLEU": 30.0, "chrF": 20.0}, {"BLEU": 28.0, "chrF": 25.0})
    assert said.startswith("Neither system wins")
    assert "a tie" in winner_words({"BLEU": 28.2, "chrF": 40.0}, {"BLEU": 28.0, "chrF": 25.0})


def test_bootstrap_scores_match_the_corpus_scores_and_pair_the_systems():
    import random

    from gpuformer_lib.retrieval import bootstrap_scores

    rng = random.Random(0)
    chars = "我你他她是在有不的了人大小猫狗喜欢吃饭水"
    refs = ["".join(rng.choice(chars) for _ in range(rng.randint(4, 9))) + "。" for _ in range(120)]
    good = [r if i % 4 else r[:-2] + "。" for i, r in enumerate(refs)]  # mostly right
    bad = ["".join(rng.choice(chars) for _ in range(6)) + "。" for _ in refs]  # unrelated
    out = bootstrap_scores({"good": good, "bad": bad, "same": bad}, refs, baseline="bad", draws=300)
    for name, hyps in (("good", good), ("bad", bad)):
        whole = translation_scores(hyps, refs)
        for metric in ("BLEU", "chrF"):
            iv = out[(name, metric)]
            assert iv.value == pytest.approx(whole[metric]) and iv.low <= iv.value <= iv.high, (name, metric, iv)
    for metric in ("BLEU", "chrF"):
        assert out[("good - bad", metric)].low > 0  # paired: a clear winner
        same = out[("same - bad", metric)]
        assert same.value == same.low == same.high == 0  # the same hypotheses tie on every draw
    with pytest.raises(ValueError, match="one hypothesis per reference"):
        bootstrap_scores({"a": good[:-1]}, refs)
    with pytest.raises(ValueError, match="not one of the systems"):
        bootstrap_scores({"a": good}, refs, baseline="b")
