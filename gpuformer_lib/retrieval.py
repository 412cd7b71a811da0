"""The nearest-neighbour retrieval baseline for translation, and the scores it is compared by.

A translator should beat the simplest system that uses the same training data: for a test sentence,
find the training pair whose source is most similar and output *its* target. Similarity here is the
cosine of TF-IDF vectors of character n-grams (n = 1..3) of the lower-cased source, the classic
information-retrieval weighting (Salton and Buckley 1988, "Term-weighting approaches in automatic text
retrieval"); translation memories in computer-aided translation work this way, and Khandelwal et al.
(2021, "Nearest Neighbor Machine Translation") mix such retrieval into a neural decoder.

The weights follow scikit-learn's ``TfidfVectorizer(analyzer="char", ngram_range=(1, 3))`` defaults:
raw counts ``tf``, smoothed ``idf(g) = ln((1 + N) / (1 + df(g))) + 1`` over the N training sources,
each vector scaled to unit length, so the cosine is a dot product. Written with torch only (a sparse
training matrix times a dense block of queries); ``tests/test_retrieval.py`` checks it against a
float64 brute-force reference.

Scores: :func:`translation_scores` gives corpus BLEU with sacrebleu's Chinese tokenizer (Papineni et al.
2002) and chrF (Popović 2015, "chrF: character n-gram F-score for automatic MT evaluation"), both 0-100
against one reference per sentence.

Leaves out: n-grams of words, approximate search (FAISS-style indexes), and choosing among a source's
several translations (the first training pair with the best score wins).
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from typing import Sequence

import torch


def normalise(text: str) -> str:
    """Lower-case, whitespace runs collapsed to one space (what the n-grams are taken from)."""
    return " ".join(text.lower().split())


def char_ngrams(text: str, n_min: int = 1, n_max: int = 3) -> Counter:
    """Counts of the character n-grams (``n_min`` <= n <= ``n_max``) of ``normalise(text)``."""
    if not 1 <= n_min <= n_max:
        raise ValueError(f"need 1 <= n_min <= n_max, got {n_min}, {n_max}")
    t = normalise(text)
    return Counter(t[i:i + n] for n in range(n_min, n_max + 1) for i in range(len(t) - n + 1))


class RetrievalTranslator:
    """``RetrievalTranslator().fit(pairs).translate(sentences)``: each sentence's output is the target
    of the training pair whose source has the highest TF-IDF cosine with it (ties: the earliest pair)."""

    def __init__(self, ngram_range: tuple[int, int] = (1, 3), dtype: torch.dtype = torch.float32,
                 chunk: int = 256):
        self.ngram_range, self.dtype, self.chunk = tuple(ngram_range), dtype, chunk
        char_ngrams("", *self.ngram_range)  # checks the range
        self.vocabulary: dict[str, int] = {}
        self.targets: list[str] = []

    def _counts(self, texts: Sequence[str], grow: bool) -> tuple[list[int], list[int], list[float]]:
        rows, cols, vals = [], [], []
        for r, text in enumerate(texts):
            for gram, count in char_ngrams(text, *self.ngram_range).items():
                col = self.vocabulary.get(gram)
                if col is None and grow:
                    col = self.vocabulary[gram] = len(self.vocabulary)
                if col is not None:
                    rows.append(r)
                    cols.append(col)
                    vals.append(float(count))
        return rows, cols, vals

    def _tfidf(self, texts: Sequence[str], grow: bool = False) -> torch.Tensor:
        """Unit-length TF-IDF rows (len(texts), n_features) as a sparse COO tensor."""
        rows, cols, vals = self._counts(texts, grow)
        if grow:
            # each (row, n-gram) appears once (the counts are per row), so df is a count of columns
            df = torch.bincount(torch.tensor(cols, dtype=torch.long), minlength=len(self.vocabulary)).double()
            self.idf = (torch.log((1 + len(texts)) / (1 + df)) + 1).to(self.dtype)
        idx = torch.tensor([rows, cols], dtype=torch.long).reshape(2, -1)
        weights = torch.tensor(vals, dtype=self.dtype) * self.idf[idx[1]]
        norms = torch.zeros(len(texts), dtype=self.dtype).index_add_(0, idx[0], weights * weights).sqrt()
        weights = weights / norms[idx[0]].clamp_min(torch.finfo(self.dtype).tiny)
        return torch.sparse_coo_tensor(idx, weights, (len(texts), len(self.vocabulary)),
                                       check_invariants=False).coalesce()

    def fit(self, pairs: Sequence[tuple[str, str]]) -> "RetrievalTranslator":
        """Index the sources of ``pairs`` ((source, target) strings); remember their targets."""
        if len(pairs) == 0:
            raise ValueError("need some training pairs to retrieve from")
        self.vocabulary = {}
        with warnings.catch_warnings():  # "sparse CSR support is in beta": the product used here is not
            warnings.simplefilter("ignore", UserWarning)
            self.matrix = self._tfidf([src for src, _ in pairs], grow=True).to_sparse_csr()  # (N, F)
        self.targets = [tgt for _, tgt in pairs]
        return self

    def nearest(self, sentences: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(index of the nearest training pair, its cosine) for each sentence."""
        if not self.targets:
            raise RuntimeError("call fit(pairs) before nearest/translate")
        best, score = [], []
        for start in range(0, len(sentences), self.chunk):
            queries = self._tfidf(sentences[start:start + self.chunk]).to_dense()  # (Q, F)
            sims = self.matrix @ queries.T  # (N, Q): cosines, rows already unit length
            value, index = sims.max(dim=0)  # the first maximum: the earliest pair on a tie
            best.append(index)
            score.append(value)
        return torch.cat(best), torch.cat(score)

    def translate(self, sentences: Sequence[str]) -> list[str]:
        """The retrieved target of each sentence."""
        index, _ = self.nearest(list(sentences))
        return [self.targets[i] for i in index.tolist()]


def chrf(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus chrF (0-100) of one reference per hypothesis, with sacrebleu (character 6-grams, beta 2)."""
    import sacrebleu

    if len(hypotheses) != len(references) or not hypotheses:
        raise ValueError(f"need as many hypotheses as references, and some: got {len(hypotheses)} and "
                         f"{len(references)}")
    return sacrebleu.corpus_chrf(list(hypotheses), [list(references)]).score


def translation_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """{"BLEU": corpus BLEU with the Chinese tokenizer, "chrF": corpus chrF}, both 0-100."""
    from gpuformer_lib.generate import bleu

    return {"BLEU": bleu(hypotheses, references, tokenize="zh"), "chrF": chrf(hypotheses, references)}


def bootstrap_scores(systems: dict[str, Sequence[str]], references: Sequence[str], *, baseline: str | None = None,
                     draws: int = 1000, level: float = 0.95, seed: int = 0) -> dict[tuple[str, str], "Interval"]:
    """Corpus BLEU and chrF of each system in ``systems`` (name -> one hypothesis per reference), each with a
    bootstrap interval: the test sentences resampled with replacement ``draws`` times, every system scored on
    the same draw (sacrebleu's per-sentence statistics summed over the draw, so a draw costs a sum, not a
    re-tokenisation). With ``baseline``, also each other system's score minus the baseline's, paired on the same
    draws: an interval that leaves out 0 says which system wins on this test set.

    Returns ``{(name, metric): Interval}`` for metric "BLEU" and "chrF", and ``{(f"{name} - {baseline}",
    metric): Interval}`` for the differences (``intervals.Interval``: value, low, high, level)."""
    import numpy as np
    from sacrebleu.metrics import BLEU, CHRF

    from gpuformer_lib.intervals import Interval

    n = len(references)
    if n < 2 or any(len(h) != n for h in systems.values()):
        raise ValueError(f"every system needs one hypothesis per reference ({n}), and at least 2 sentences")
    if baseline is not None and baseline not in systems:
        raise ValueError(f"baseline {baseline!r} is not one of the systems {list(systems)}")
    if draws < 100 or not 0 < level < 1:
        raise ValueError(f"need draws >= 100 and 0 < level < 1, got {draws}, {level}")
    metrics = {"BLEU": BLEU(tokenize="zh"), "chrF": CHRF()}
    rng = np.random.default_rng(seed)
    counts = np.stack([np.bincount(rng.integers(0, n, n), minlength=n) for _ in range(draws)])  # (draws, n)
    tail = (1 - level) / 2
    out: dict[tuple[str, str], Interval] = {}
    for metric, scorer in metrics.items():
        per_draw, whole = {}, {}
        for name, hyps in systems.items():
            stats = np.asarray(scorer._extract_corpus_statistics(list(hyps), [list(references)]), dtype=np.float64)
            whole[name] = scorer._compute_score_from_stats(list(stats.sum(0))).score
            summed = counts @ stats  # (draws, statistics): each draw's corpus statistics
            per_draw[name] = np.array([scorer._compute_score_from_stats(list(row)).score for row in summed])
        for name in systems:
            values = per_draw[name]
            out[(name, metric)] = Interval(float(whole[name]), float(np.quantile(values, tail)),
                                           float(np.quantile(values, 1 - tail)), level)
            if baseline is not None and name != baseline:
                diff = values - per_draw[baseline]
                out[(f"{name} - {baseline}", metric)] = Interval(
                    float(whole[name] - whole[baseline]), float(np.quantile(diff, tail)),
                    float(np.quantile(diff, 1 - tail)), level)
    return out


def winner_words(system: dict[str, float], baseline: dict[str, float], name: str = "the translator",
                 baseline_name: str = "the retrieval baseline") -> str:
    """A plain sentence, chosen from the scores, saying which system wins on each metric."""
    said = []
    for metric in system:
        a, b = system[metric], baseline[metric]
        if not (math.isfinite(a) and math.isfinite(b)):
            raise ValueError(f"{metric} scores must be finite, got {a} and {b}")
        if abs(a - b) < 0.5:
            said.append(f"{metric}: a tie ({a:.1f} for {name}, {b:.1f} for {baseline_name})")
        else:  # the winner's score first, so "X wins (28.9 against 0.5)" reads right
            who = name if a > b else baseline_name
            said.append(f"{metric}: {who} wins ({max(a, b):.1f} against {min(a, b):.1f})")
    verdicts = {("tie" if "tie" in s else s.split(": ")[1].split(" wins")[0]) for s in said}
    if verdicts == {name}:
        head = f"{name[0].upper() + name[1:]} beats {baseline_name} on every metric"
    elif verdicts == {baseline_name}:
        head = f"{baseline_name[0].upper() + baseline_name[1:]} beats {name} on every metric"
    else:
        head = "Neither system wins on every metric"
    return head + " (" + "; ".join(said) + ")"
