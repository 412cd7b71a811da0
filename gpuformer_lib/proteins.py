"""Protein sequences as a case study (chapter 14): the data, a leak-free split, the baselines a protein
language model must beat, an antimicrobial-peptide classifier, padding and packing, and the harness's task.

- Data: :func:`load_proteins` reads UniProt's FASTA (``data.data_path("uniprot-db")``: the data folder,
  or downloaded from the MMseqs2 repository with its checksum verified); :func:`load_peptides` reads
  modlAMP's ``AMPvsUniProt.csv``, de-duplicated, sequences listed under both labels dropped.
- Tokens: 20 standard amino acids, ``X`` for the rare and ambiguous letters (B, Z, U, O, X), an end
  token (``END``, also the start of every sequence's context, as GPT's end-of-text) and padding.
- Split: :func:`kmer_filtered_split` splits at random, then moves out of the test set every sequence
  that shares more than ``max_shared`` of its k-mers with the training set (a crude homology filter: near
  copies and close relatives would make the test set measure memory). Real work clusters by sequence
  identity first (MMseqs2, Steinegger & Söding 2017; CD-HIT, Li & Godzik 2006) and splits by cluster.
- Baselines: :class:`NGramModel` (counts with interpolated add-k smoothing, dense tables; perplexity per
  residue including the end token); :func:`kmer_counts` + :func:`fit_logistic` (L2-regularised logistic
  regression by L-BFGS in float64) for peptides; metrics :func:`accuracy`, :func:`auc` (Mann-Whitney,
  ties counted half), :func:`mcc` (Matthews 1975).
- Models: the language model is ``model.DecoderLM``; :func:`lm_logits` runs it on packed rows with a
  per-document causal mask and positions that restart with each document (the model's own forward has
  no attention-mask argument); :class:`PeptideClassifier` is an encoder (``layers.EncoderLayer``) with
  mean pooling over real residues.
- Batching: :func:`crop_windows` (one random window of at most ``crop`` residues per protein per
  epoch), :func:`lm_batches` with ``"padded"`` (random batches padded to their longest), ``"bucketed"``
  (``packing.TokenBudgetBatchSampler``: similar lengths together) or ``"packed"`` (``packing.pack``:
  windows end to end in rows of ``crop + 1`` tokens, no padding inside a row); :func:`padding_share`.
- The harness: :func:`protein_lm_task` -> ``case_study.Task``, :func:`case_plan` per device,
  :func:`predicted_steps` (GPU rows from the course's predictor), :func:`packing_gain`, :func:`bottleneck` / :func:`fix_for`.

Leaves out: structure (no structure data ships with the course; chapter 14 cites what protein language
models reach at scale), multiple sequence alignments, and variable-length attention kernels (the mask here
is dense, (R, T, T), which is what they avoid materialising).
"""

from __future__ import annotations

import csv
import dataclasses
import math
import random
from typing import Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpuformer_lib import case_study, data, packing, speed
from gpuformer_lib.layers import EncoderLayer, LayerStack, PositionalEncoding
from gpuformer_lib.model import DecoderLM, TokenEmbedding, TransformerConfig, transformer_flops

# --------------------------------------------------------------------------- tokens

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
PAD, END, UNKNOWN = 0, 1, 2 + len(AMINO_ACIDS)
VOCAB_SIZE = UNKNOWN + 1  # pad, end, 20 amino acids, X
_CODE = np.full(256, UNKNOWN, dtype=np.int64)
for _i, _a in enumerate(AMINO_ACIDS):
    _CODE[ord(_a)] = 2 + _i


def encode(sequence: str) -> np.ndarray:
    """Residues -> ids 2..22 (rare letters -> X); no end token."""
    if not isinstance(sequence, str) or not sequence:
        raise ValueError(f"a protein sequence is a non-empty string of amino-acid letters, got {sequence!r}")
    return _CODE[np.frombuffer(sequence.upper().encode("ascii"), dtype=np.uint8)]


def decode(ids: Iterable[int]) -> str:
    letters = {2 + i: a for i, a in enumerate(AMINO_ACIDS)} | {UNKNOWN: "X"}
    return "".join(letters.get(int(i), "") for i in ids)


# --------------------------------------------------------------------------- data


def read_fasta(path) -> list[tuple[str, str]]:
    """(header, sequence) per record of a FASTA file."""
    records, header, parts = [], None, []
    with open(path, encoding="ascii") as f:
        for line in f:
            line = line.strip()
            if line.startswith(">"):
                if header is not None:
                    records.append((header, "".join(parts)))
                header, parts = line[1:], []
            elif line:
                if header is None:
                    raise ValueError(f"{path}: sequence text before the first '>' header: not a FASTA file")
                parts.append(line)
    if header is not None:
        records.append((header, "".join(parts)))
    if not records:
        raise ValueError(f"{path}: no FASTA records")
    return records


def load_proteins() -> list[str]:
    """The 20,000 UniProt sequences of MMseqs2's example database (distinct sequences, file order)."""
    seen, out = set(), []
    for _, seq in read_fasta(data.data_path("uniprot-db")):
        if seq not in seen:
            seen.add(seq)
            out.append(seq)
    return out


@dataclasses.dataclass(frozen=True)
class Peptides:
    sequences: list[str]
    labels: np.ndarray
    """1 antimicrobial, 0 random UniProt peptide."""
    rows: int
    duplicates: int
    """Rows beyond the first of each distinct sequence (whatever their label)."""
    conflicting: int
    """Distinct sequences listed under both labels (dropped)."""


def parse_peptides(lines: Iterable[str]) -> Peptides:
    """modlAMP's CSV (a header line, then ``SEQUENCE, label``) de-duplicated; conflicting sequences dropped."""
    labels: dict[str, set[int]] = {}
    order: list[str] = []
    rows = 0
    reader = csv.reader(lines)
    next(reader, None)  # header "5200,1,UniProt,AMP"
    for row in reader:
        if not row:
            continue
        if len(row) != 2 or row[1].strip() not in ("0", "1"):
            raise ValueError(f"expected 'SEQUENCE, 0|1', got {row!r}")
        seq, label = row[0].strip().upper(), int(row[1])
        rows += 1
        if seq not in labels:
            labels[seq] = set()
            order.append(seq)
        labels[seq].add(label)
    keep = [s for s in order if len(labels[s]) == 1]
    conflicting = len(order) - len(keep)
    return Peptides(keep, np.array([next(iter(labels[s])) for s in keep]), rows, rows - len(order), conflicting)


def load_peptides() -> Peptides:
    with open(data.data_path("amp-vs-uniprot"), encoding="ascii") as f:
        return parse_peptides(f)


# --------------------------------------------------------------------------- split


def kmer_codes(ids: np.ndarray, k: int) -> np.ndarray:
    """The k-mers of an id sequence as int64 codes (base VOCAB_SIZE), (len - k + 1,)."""
    if len(ids) < k:
        return np.zeros(0, dtype=np.int64)
    codes = np.zeros(len(ids) - k + 1, dtype=np.int64)
    for j in range(k):
        codes = codes * VOCAB_SIZE + ids[j:len(ids) - k + 1 + j]
    return codes


def _all_kmer_codes(seqs: Sequence[np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes of every k-mer of every sequence in one vectorised pass, and the index of its sequence."""
    lengths = np.array([len(s) for s in seqs])
    flat = np.concatenate(seqs)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    owner = np.repeat(np.arange(len(seqs)), lengths)
    n = len(flat) - k + 1
    codes = np.zeros(max(n, 0), dtype=np.int64)
    for j in range(k):
        codes = codes * VOCAB_SIZE + flat[j:j + n]
    pos = np.arange(max(n, 0))
    inside = pos - starts[owner[:n]] <= lengths[owner[:n]] - k  # the k-mer does not cross into the next sequence
    return codes[inside], owner[:n][inside]


def _query_hits(train: Sequence[np.ndarray], codes: np.ndarray, k: int) -> np.ndarray:
    """Per query k-mer code, whether some sequence of ``train`` contains it."""
    if len(train) == 0 or len(codes) == 0:
        return np.zeros(len(codes), dtype=bool)
    distinct, where = np.unique(codes, return_inverse=True)  # the queries' k-mers (few), sorted
    train_codes = _all_kmer_codes(train, k)[0]
    at = np.searchsorted(distinct, train_codes).clip(max=len(distinct) - 1)
    seen = np.zeros(len(distinct), dtype=bool)
    seen[at[distinct[at] == train_codes]] = True
    return seen[where]


def _shares(hit: np.ndarray, owner: np.ndarray, n: int) -> np.ndarray:
    total = np.bincount(owner, minlength=n)
    shared = np.bincount(owner, weights=hit, minlength=n)
    return np.where(total > 0, shared / np.maximum(total, 1), 0.0)


def shared_kmer_share(train: Sequence[np.ndarray], queries: Sequence[np.ndarray], k: int = 8) -> np.ndarray:
    """Per query, the share of its k-mers that occur anywhere in ``train`` (0 for a query shorter than k)."""
    codes, owner = _all_kmer_codes(queries, k)
    return _shares(_query_hits(train, codes, k), owner, len(queries))


@dataclasses.dataclass(frozen=True)
class ProteinSplit:
    train: list[np.ndarray]
    val: list[np.ndarray]
    test: list[np.ndarray]
    moved: int
    """Held-out sequences moved to training because they shared too many k-mers with it."""
    held_out_before: int
    k: int
    max_shared: float
    test_to_val: int = 0
    """Test sequences moved to validation because they shared too many k-mers with it (the validation set
    tunes what the test set reports)."""


@dataclasses.dataclass(frozen=True)
class FilteredIndices:
    """A homology-filtered split as indices into the sequences (:func:`kmer_filtered_indices`)."""

    train: list[int]
    val: list[int]
    test: list[int]
    moved: int
    """Held-out sequences moved to training because they shared too many k-mers with it."""
    held_out_before: int
    test_to_val: int
    """Test sequences moved to validation because they shared too many k-mers with training and validation."""


def kmer_filtered_indices(encoded: Sequence[np.ndarray], *, fractions=(0.9, 0.05, 0.05), k: int = 8,
                          max_shared: float = 0.5, seed: int = 0) -> FilteredIndices:
    """Random split of the encoded sequences (``fractions`` train, validation, test); a validation or test
    sequence sharing more than ``max_shared`` of its ``k``-mers with training is moved to training (after
    that, none is near a training sequence by this measure); then a test sequence sharing more than
    ``max_shared`` with training and validation together is moved to validation. An 8-mer of 21 letters is very unlikely to recur by
    chance (21^8 ~ 4e10), so a shared share near 1 means a copy or a close homologue; short sequences
    (peptides) use a shorter k. A sequence shorter than k has no k-mers and is never moved."""
    if not 0 <= max_shared < 1 or k < 2:
        raise ValueError(f"need 0 <= max_shared < 1 and k >= 2, got {max_shared} and {k}")
    if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(f"fractions are three shares summing to 1, got {fractions}")
    order = list(range(len(encoded)))
    random.Random(seed).shuffle(order)
    n_val, n_test = round(fractions[1] * len(order)), round(fractions[2] * len(order))
    val_i, test_i, train_i = order[:n_val], order[n_val:n_val + n_test], order[n_val + n_test:]
    held = val_i + test_i
    codes, owner = _all_kmer_codes([encoded[i] for i in held], k)
    hit = _query_hits([encoded[i] for i in train_i], codes, k)
    near: set[int] = set()
    while True:  # a moved sequence's relatives among the held-out ones now have a relative in training too
        share = _shares(hit, owner, len(held))
        new = [j for j in range(len(held)) if share[j] > max_shared and held[j] not in near]
        if not new:
            break
        near.update(held[j] for j in new)
        hit |= _query_hits([encoded[held[j]] for j in new], codes, k)
    train = train_i + [i for i in held if i in near]
    val = [i for i in val_i if i not in near]
    test = [i for i in test_i if i not in near]
    # then test against training and validation together (a test sequence can share a little with each and
    # too much with both): a moved one joins validation, so repeat until none moves
    codes, owner = _all_kmer_codes([encoded[i] for i in test], k) if test else (np.zeros(0, np.int64), np.zeros(0, int))
    from_train = _query_hits([encoded[i] for i in train], codes, k)
    alive = np.ones(len(test), dtype=bool)
    to_val = 0
    while alive.any() and val:
        hit = from_train | _query_hits([encoded[i] for i in val], codes, k)
        close = (_shares(hit, owner, len(test)) > max_shared) & alive
        if not close.any():
            break
        val += [test[j] for j in np.flatnonzero(close)]
        alive &= ~close
        to_val += int(close.sum())
    test = [t for t, a in zip(test, alive) if a]
    return FilteredIndices(train, val, test, len(near), len(held), to_val)


def kmer_filtered_split(sequences: Sequence[str], *, fractions=(0.9, 0.05, 0.05), k: int = 8, max_shared: float = 0.5,
                        seed: int = 0) -> ProteinSplit:
    """The proteins split by :func:`kmer_filtered_indices` (held-out proteins with a relative in training moved
    to training, test proteins with one in validation moved to validation), as encoded sequences."""
    encoded = [encode(s) for s in sequences]
    idx = kmer_filtered_indices(encoded, fractions=fractions, k=k, max_shared=max_shared, seed=seed)
    pick = lambda ids: [encoded[i] for i in ids]  # noqa: E731
    return ProteinSplit(pick(idx.train), pick(idx.val), pick(idx.test), idx.moved, idx.held_out_before, k, max_shared,
                        idx.test_to_val)


# --------------------------------------------------------------------------- n-gram baselines


class NGramModel:
    """An order-n model over the protein alphabet with interpolated add-k smoothing (Jelinek & Mercer 1980):
    P_n(a | h) = (c(h, a) + k * P_{n-1}(a | h')) / (c(h) + k), with h' the shorter context and P_0 uniform.
    Each sequence is scored as END, residues..., END: its residues and the end token are predicted."""

    def __init__(self, order: int, k: float = 1.0):
        if order < 1 or k <= 0:
            raise ValueError(f"need order >= 1 and k > 0, got {order} and {k}")
        self.order, self.k, self.V = order, float(k), VOCAB_SIZE

    @staticmethod
    def _padded(seq: np.ndarray, order: int) -> np.ndarray:
        return np.concatenate([np.full(order - 1, END), seq, [END]])

    def _codes(self, seqs: Sequence[np.ndarray], n: int, end: bool | Sequence[bool] = True) -> np.ndarray:
        """Codes of every n-gram ending at a predicted token (contexts padded with END); without ``end`` (per
        sequence or for all) the final END target is left out."""
        ends = [end] * len(seqs) if isinstance(end, (bool, np.bool_)) else list(end)
        if len(ends) != len(seqs):
            raise ValueError(f"end must be a bool or one bool per sequence: {len(ends)} for {len(seqs)} sequences")
        out = []
        for s, e in zip(seqs, ends):
            p = self._padded(s, self.order)
            start = self.order - n
            codes = kmer_codes(p[start:], n)
            out.append(codes if e else codes[:-1])
        return np.concatenate(out)

    def fit(self, seqs: Sequence[np.ndarray]) -> "NGramModel":
        self.counts = [np.bincount(self._codes(seqs, n), minlength=self.V ** n).astype(np.float64).reshape(-1, self.V)
                       for n in range(1, self.order + 1)]  # counts[n-1]: (V^(n-1), V)
        return self._smooth()

    def with_k(self, k: float) -> "NGramModel":
        """The same counts smoothed with another ``k`` (a grid over k without counting again)."""
        if not hasattr(self, "counts"):
            raise ValueError("fit the model before changing its k")
        other = NGramModel(self.order, k)
        other.counts = self.counts
        return other._smooth()

    def _smooth(self) -> "NGramModel":
        self.probs = []
        lower = np.full((1, self.V), 1.0 / self.V)
        for n, c in enumerate(self.counts, start=1):
            lower_b = lower[np.arange(c.shape[0]) % lower.shape[0]]  # context h -> its suffix h' (drop the oldest)
            p = (c + self.k * lower_b) / (c.sum(1, keepdims=True) + self.k)
            self.probs.append(p)
            lower = p
        return self

    def log_probs(self, seqs: Sequence[np.ndarray], end: bool | Sequence[bool] = True) -> np.ndarray:
        """Natural-log probability of every predicted token (residues and end tokens), in order. ``end=False``
        (for all sequences, or one bool each) leaves out the END target: a window cropped inside a protein
        has no end to predict."""
        codes = self._codes(seqs, self.order, end)
        return np.log(self.probs[-1].reshape(-1)[codes])

    def perplexity(self, seqs: Sequence[np.ndarray]) -> float:
        return float(np.exp(-self.log_probs(seqs).mean()))

    def window_nll(self, windows: Sequence[np.ndarray]) -> float:
        """Mean negative log-likelihood (nats) of exactly the language model's targets on ``windows``
        (``crop_windows``/``first_windows``: END, residues..., END only if the protein ended inside): each
        window's targets ``w[1:]``, the END predicted only where the window holds it."""
        bodies, ends = [], []
        for w in windows:
            t = np.asarray(w[1:])
            if len(t) == 0 or w[0] != END:
                raise ValueError("windows start with the END start token and predict at least one token")
            ended = bool(t[-1] == END)
            bodies.append(t[:-1] if ended else t)
            ends.append(ended)
        return float(-self.log_probs(bodies, ends).mean())


# --------------------------------------------------------------------------- metrics


def accuracy(labels: Sequence[int], predicted: Sequence[int]) -> float:
    labels, predicted = np.asarray(labels), np.asarray(predicted)
    return float(np.mean(labels == predicted))


def auc(labels: Sequence[int], scores: Sequence[float]) -> float:
    """Area under the ROC curve as the Mann-Whitney statistic: the chance a random positive scores above a
    random negative, ties counted half (average ranks)."""
    labels, scores = np.asarray(labels), np.asarray(scores, dtype=np.float64)
    n_pos, n_neg = int(labels.sum()), int(len(labels) - labels.sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUC needs both classes among the labels")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):  # average ranks over ties
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[labels == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def auc_difference(labels: Sequence[int], scores: Sequence[float], other: Sequence[float], *, draws: int = 1000,
                   level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """AUC of ``scores`` minus AUC of ``other`` on the same examples, and a paired bootstrap interval on it
    (examples resampled with replacement, both scorers on the same draw; a draw holding one class only is
    drawn again): (difference, low, high). An interval above 0 says ``scores`` separates the classes better
    on this test set; one that holds 0 says the test set cannot tell them apart."""
    y, a, b = np.asarray(labels), np.asarray(scores, dtype=np.float64), np.asarray(other, dtype=np.float64)
    if not (len(y) == len(a) == len(b)) or len(set(y.tolist())) != 2:
        raise ValueError("need labels of two classes and two score arrays of the same length")
    if draws < 100 or not 0 < level < 1:
        raise ValueError(f"need draws >= 100 and 0 < level < 1, got {draws}, {level}")
    rng = np.random.default_rng(seed)
    diffs = []
    while len(diffs) < draws:
        i = rng.integers(0, len(y), len(y))
        if y[i].min() == y[i].max():
            continue
        diffs.append(auc(y[i], a[i]) - auc(y[i], b[i]))
    tail = (1 - level) / 2
    return auc(y, a) - auc(y, b), float(np.quantile(diffs, tail)), float(np.quantile(diffs, 1 - tail))


def mcc(labels: Sequence[int], predicted: Sequence[int]) -> float:
    """Matthews correlation coefficient (0 when a row or column of the confusion matrix is empty)."""
    y, p = np.asarray(labels).astype(bool), np.asarray(predicted).astype(bool)
    tp, tn, fp, fn = (float(np.sum(y & p)), float(np.sum(~y & ~p)), float(np.sum(~y & p)), float(np.sum(y & ~p)))
    den = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return 0.0 if den == 0 else (tp * tn - fp * fn) / den


def kmer_counts(sequences: Sequence[str], ks: Sequence[int] = (1, 2, 3)) -> np.ndarray:
    """Counts of every k-mer (k in ``ks``) over the 21-letter alphabet, divided by the sequence's length:
    (N, sum 21^k) float64."""
    A = VOCAB_SIZE - 2  # 20 amino acids and X, ids 2..22 -> 0..20
    blocks = []
    for k in ks:
        X = np.zeros((len(sequences), A ** k))
        for i, s in enumerate(sequences):
            ids = encode(s) - 2
            if len(ids) >= k:
                codes = np.zeros(len(ids) - k + 1, dtype=np.int64)
                for j in range(k):
                    codes = codes * A + ids[j:len(ids) - k + 1 + j]
                X[i] = np.bincount(codes, minlength=A ** k) / len(ids)
        blocks.append(X)
    return np.concatenate(blocks, axis=1)


@dataclasses.dataclass
class LogisticModel:
    weights: np.ndarray
    bias: float
    mean: np.ndarray
    scale: np.ndarray

    def scores(self, X: np.ndarray) -> np.ndarray:
        return ((X - self.mean) / self.scale) @ self.weights + self.bias

    def predict(self, X: np.ndarray) -> np.ndarray:
        return (self.scores(X) > 0).astype(int)


def fit_logistic(X: np.ndarray, y: np.ndarray, l2: float = 1.0, max_iter: int = 200) -> LogisticModel:
    """L2-regularised logistic regression on standardised features: minimise
    sum_i log(1 + exp(-s_i (w.x_i + b))) + l2/2 |w|^2 (s = 2y - 1) by L-BFGS in float64."""
    X, y = np.asarray(X, dtype=np.float64), np.asarray(y)
    if X.ndim != 2 or len(X) != len(y) or set(np.unique(y)) - {0, 1}:
        raise ValueError(f"need X (N, D) and labels 0/1 of length N, got {X.shape} and {np.unique(y)}")
    mean, scale = X.mean(0), X.std(0) + 1e-8
    Xt = torch.from_numpy((X - mean) / scale)
    s = torch.from_numpy(2.0 * y - 1.0)
    w = torch.zeros(X.shape[1] + 1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w], lr=1, max_iter=max_iter, tolerance_grad=1e-9, tolerance_change=1e-12,
                            history_size=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.softplus(-s * (Xt @ w[:-1] + w[-1])).sum() + 0.5 * l2 * (w[:-1] ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    w = w.detach().numpy()
    return LogisticModel(w[:-1], float(w[-1]), mean, scale)


# --------------------------------------------------------------------------- windows, batches, padding


def crop_windows(sequences: Sequence[np.ndarray], crop: int, seed: int, epoch: int) -> list[np.ndarray]:
    """Per protein, one window of its tokens END, residues..., END of at most ``crop + 1`` tokens (inputs
    are its first ``crop``, targets its last ``crop``), at a random start per (seed, epoch)."""
    rng = np.random.default_rng([seed, epoch])
    out = []
    for s in sequences:
        full = np.concatenate([[END], s, [END]])
        start = int(rng.integers(0, len(full) - crop)) if len(full) > crop + 1 else 0
        out.append(full[start:start + crop + 1])
    return out


def first_windows(sequences: Sequence[np.ndarray], crop: int) -> list[np.ndarray]:
    """Each held-out protein's first window (deterministic): what the language model is evaluated on."""
    return [np.concatenate([[END], s, [END]])[:crop + 1] for s in sequences]


@dataclasses.dataclass
class LMBatch:
    """Inputs and targets (B, T); padding mask (B, T) True at padding; for packed rows, each token's
    document id (-1 at padding) and its position within its document."""

    ids: Tensor
    targets: Tensor
    padding_mask: Tensor
    document: Tensor | None = None
    positions: Tensor | None = None

    def to(self, device, non_blocking: bool = False) -> "LMBatch":
        move = lambda t: None if t is None else t.to(device, non_blocking=non_blocking)  # noqa: E731
        return LMBatch(move(self.ids), move(self.targets), move(self.padding_mask), move(self.document),
                       move(self.positions))

    @property
    def real(self) -> int:
        return int((~self.padding_mask).sum())


def collate_padded(windows: Sequence[np.ndarray]) -> LMBatch:
    T = max(len(w) for w in windows) - 1
    ids = torch.full((len(windows), T), PAD, dtype=torch.long)
    targets = torch.full((len(windows), T), PAD, dtype=torch.long)
    for i, w in enumerate(windows):
        w = torch.from_numpy(np.asarray(w, dtype=np.int64))
        ids[i, :len(w) - 1], targets[i, :len(w) - 1] = w[:-1], w[1:]
    return LMBatch(ids, targets, ids == PAD)


def collate_packed(windows: Sequence[np.ndarray], row_len: int) -> LMBatch:
    """Windows packed end to end (``packing.pack``) into rows of ``row_len`` input tokens; each window
    contributes its inputs and its targets as one document."""
    inputs = [torch.from_numpy(np.asarray(w[:-1], dtype=np.int64)) for w in windows]
    packed = packing.pack(inputs, row_len, pad_id=PAD)
    targets = torch.full_like(packed.ids, PAD)
    for k, w in enumerate(windows):
        where = packed.document == k
        targets[where] = torch.from_numpy(np.asarray(w[1:], dtype=np.int64))
    return LMBatch(packed.ids, targets, packed.document < 0, packed.document, packed.positions)


def padding_share(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    """Share of padded slots when each batch (indices into ``lengths``) is padded to its longest."""
    slots = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    return 1 - sum(lengths[i] for b in batches for i in b) / slots


def padded_share_by_crop(sequences: Sequence[np.ndarray], crops: Sequence[int], batch_size: int, seed: int = 0
                         ) -> dict[int, float]:
    """Padding share of random batches of ``batch_size`` proteins cropped to each ``crop`` (first windows)."""
    out = {}
    order = list(range(len(sequences)))
    random.Random(seed).shuffle(order)
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    for crop in crops:
        lengths = [min(len(s) + 1, crop) for s in sequences]  # inputs: END + residues, cropped
        out[crop] = padding_share(lengths, batches)
    return out


def lm_batches(windows: Sequence[np.ndarray], kind: str, batch_size: int, crop: int, seed: int, epoch: int
               ) -> list[LMBatch]:
    """One epoch of batches: ``padded`` (random batches of ``batch_size`` windows, padded to their longest),
    ``bucketed`` (token-budget batches of at most ``batch_size * crop`` padded tokens, similar lengths
    together) or ``packed`` (windows laid end to end in rows of ``crop`` tokens: each batch takes as many windows as fill
    about ``batch_size`` rows at the mean window length, so its row count is whatever ``packing.pack`` makes of
    them, usually ``batch_size`` or one more, the last row partly filled)."""
    lengths = [len(w) - 1 for w in windows]
    rng = random.Random(1000 * seed + epoch)
    if kind == "padded":
        order = list(range(len(windows)))
        rng.shuffle(order)
        return [collate_padded([windows[i] for i in order[j:j + batch_size]]) for j in range(0, len(order), batch_size)]
    if kind == "bucketed":
        sampler = packing.TokenBudgetBatchSampler(lengths, max_tokens=batch_size * crop, seed=seed, pool_size=512)
        sampler.set_epoch(epoch)
        return [collate_padded([windows[i] for i in b]) for b in sampler]
    if kind == "packed":
        order = list(range(len(windows)))
        rng.shuffle(order)
        per = max(1, round(batch_size * crop / (sum(lengths) / len(lengths))))  # windows per batch of ~B rows
        return [collate_packed([windows[i] for i in order[j:j + per]], crop) for j in range(0, len(order), per)]
    raise ValueError(f"kind must be 'padded', 'bucketed' or 'packed', not {kind!r}")


# --------------------------------------------------------------------------- models


def lm_config(d_model: int, n_layers: int, n_heads: int, max_len: int, dropout: float = 0.0) -> TransformerConfig:
    """A DecoderLM config over the protein alphabet (pre-LN, GELU, learned positions, tied embeddings)."""
    return TransformerConfig(vocab_size=VOCAB_SIZE, d_model=d_model, n_heads=n_heads, n_encoder_layers=0,
                             n_decoder_layers=n_layers, d_ff=4 * d_model, dropout=dropout, max_len=max_len,
                             activation="gelu", positional="learned")


def lm_logits(model: DecoderLM, batch: LMBatch) -> Tensor:
    """Logits (B, T, V) of ``model`` on ``batch``. Padded batches go through ``model`` itself; packed rows
    run its layers with a per-document causal mask and per-document positions, so each window computes
    what it would alone (tests/test_proteins.py checks it)."""
    if batch.document is None:
        return model(batch.ids, batch.padding_mask)
    x = model.embed(batch.ids)
    pe = model.pos.pe
    x = model.dropout(x + pe[batch.positions].to(x.dtype))  # positions restart with each document
    mask = packing.document_attention_mask(batch.document)[:, None]  # (R, 1, T, T), True = may attend
    for layer in model.blocks.layers:
        if not layer.norm_first:
            raise ValueError("lm_logits' packed path implements pre-LN layers only (norm_first=True)")
        h = layer.norm1(x)
        y, _ = layer.self_attn(h, h, h, attn_mask=mask)
        x = x + layer.dropout1(y)
        h = layer.linear2(layer.dropout(layer.activation(layer.linear1(layer.norm2(x)))))  # (R, T, C)
        x = x + layer.dropout2(h)  # nn.TransformerEncoderLayer's feed-forward block, from its public parts
    return model.lm_head(model.blocks.norm(x))


def lm_loss(model: nn.Module, batch: LMBatch) -> tuple[Tensor, Tensor]:
    """Mean cross-entropy over real target tokens, and their count."""
    logits = lm_logits(model, batch)
    loss = F.cross_entropy(logits.float().flatten(0, 1), batch.targets.flatten(), ignore_index=PAD)
    return loss, (~batch.padding_mask).sum()


@torch.no_grad()
def lm_eval_loss(model: nn.Module, batches: Sequence[LMBatch], device) -> float:
    """Cross-entropy per real target token (nats) over ``batches``, in float32."""
    total, n = 0.0, 0
    for b in batches:
        b = b.to(device)
        logits = lm_logits(model, b).float()
        real = ~b.padding_mask
        total += float(F.cross_entropy(logits[real], b.targets[real], reduction="sum"))
        n += int(real.sum())
    return total / n


class PeptideClassifier(nn.Module):
    """An encoder over residues (``layers.EncoderLayer``, bidirectional), mean-pooled over the real residues,
    then a linear layer to one logit (antimicrobial or not)."""

    def __init__(self, d_model: int = 64, n_layers: int = 2, n_heads: int = 4, max_len: int = 128,
                 dropout: float = 0.1):
        super().__init__()
        self.embed = TokenEmbedding(VOCAB_SIZE, d_model)
        self.pos = PositionalEncoding(d_model, max_len, "learned")
        self.encoder = LayerStack([EncoderLayer(d_model, n_heads, 4 * d_model, dropout, True, "gelu")
                                   for _ in range(n_layers)], d_model)
        self.head = nn.Linear(d_model, 1)
        self.max_len = max_len

    def pooled(self, ids: Tensor) -> Tensor:
        """(B, T) ids -> (B, C): the mean of the encoder's outputs over real (non-padding) residues."""
        padding = ids == PAD
        x = self.encoder(self.pos(self.embed(ids)), padding_mask=padding)
        keep = (~padding).unsqueeze(-1).to(x.dtype)
        return (x * keep).sum(1) / keep.sum(1).clamp(min=1)

    def forward(self, ids: Tensor) -> Tensor:
        return self.head(self.pooled(ids)).squeeze(-1)  # (B,)


def peptide_ids(sequences: Sequence[str], max_len: int) -> Tensor:
    """Sequences -> (N, T) ids, padded, cropped to ``max_len`` residues."""
    T = min(max_len, max(len(s) for s in sequences))
    out = torch.full((len(sequences), T), PAD, dtype=torch.long)
    for i, s in enumerate(sequences):
        e = torch.from_numpy(encode(s)[:T])
        out[i, :len(e)] = e
    return out


def _trimmed(ids: Tensor) -> Tensor:
    """A batch cut to its longest real sequence (columns that are padding in every row dropped)."""
    real = (ids != PAD).any(0).nonzero()
    return ids[:, :int(real.max()) + 1] if len(real) else ids


def length_batches(ids: Tensor, batch_size: int, seed: int, pool: int = 512) -> list[Tensor]:
    """Index batches of similar lengths: shuffle, sort within pools of ``pool``, cut, shuffle the batches."""
    g = random.Random(seed)
    order = list(range(len(ids)))
    g.shuffle(order)
    lengths = (ids != PAD).sum(1).tolist()
    batches = []
    for j in range(0, len(order), pool):
        chunk = sorted(order[j:j + pool], key=lengths.__getitem__)
        batches += [torch.tensor(chunk[i:i + batch_size]) for i in range(0, len(chunk), batch_size)]
    g.shuffle(batches)
    return batches


def train_classifier(model: PeptideClassifier, ids: Tensor, labels: Tensor, *, epochs: int, batch_size: int = 64,
                     lr: float = 1e-3, seed: int = 0) -> list[float]:
    """AdamW on binary cross-entropy over length-bucketed batches, each cut to its longest peptide; returns
    the mean loss per epoch."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    losses = []
    model.train()
    for epoch in range(epochs):
        total = 0.0
        for b in length_batches(ids, batch_size, 1000 * seed + epoch):
            loss = F.binary_cross_entropy_with_logits(model(_trimmed(ids[b])), labels[b].float())
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(b)
        losses.append(total / len(ids))
    model.eval()
    return losses


@torch.no_grad()
def classifier_scores(model: PeptideClassifier, ids: Tensor, batch_size: int = 256) -> np.ndarray:
    """Logits per peptide, computed on length-sorted batches each cut to its longest (order preserved)."""
    model.eval()
    order = torch.argsort((ids != PAD).sum(1))
    out = torch.empty(len(ids))
    for j in range(0, len(ids), batch_size):
        b = order[j:j + batch_size]
        out[b] = model(_trimmed(ids[b]))
    return out.numpy()


@torch.no_grad()
def lm_embeddings(model: DecoderLM, sequences: Sequence[str], max_len: int, batch_size: int = 256) -> np.ndarray:
    """Mean of the language model's last hidden states over each sequence's positions: its END start token and
    its residues (at most ``max_len - 1``), padding left out: (N, C), float64. Length-sorted batches, order preserved."""
    model.eval()
    ids = peptide_ids(sequences, max_len - 1)
    ids = torch.cat([torch.full((len(ids), 1), END), ids], 1)
    order = torch.argsort((ids != PAD).sum(1))
    out = torch.empty(len(ids), model.config.d_model)
    for j in range(0, len(ids), batch_size):
        b = order[j:j + batch_size]
        part = _trimmed(ids[b])
        padding = part == PAD
        x = model.blocks(model.pos(model.embed(part)), padding_mask=padding)
        keep = (~padding).unsqueeze(-1).float()
        out[b] = (x * keep).sum(1) / keep.sum(1)
    return out.numpy().astype(np.float64)


# --------------------------------------------------------------------------- the harness's task and the plan


@dataclasses.dataclass(frozen=True)
class CasePlan:
    """Chapter 14's sizes on a device: the language model, its crop and batch, the residues every row of the
    table trains on, seeds, tolerance (nats per residue), evaluations, the held-out proteins scored, the
    proteins the rows draw windows from, and the classifier's epochs."""

    d_model: int
    n_layers: int
    n_heads: int
    crop: int
    batch_size: int
    budget_tokens: int
    seeds: tuple[int, ...]
    tolerance: float
    evaluations: int
    val_proteins: int
    train_proteins: int | None
    classifier_epochs: int
    lr: float = 2e-3
    kmer_ks: tuple[int, ...] = (1, 2, 3)
    """The k-mer lengths of the peptide baseline's features (1-3 as in the data folder's measured baseline)."""


def case_plan(profile, preset) -> CasePlan:
    """Chapter 14's plan for ``profile`` (``profiles.DeviceProfile``) and ``preset`` (``device.SizePreset``).

    - rehearsal (a GPU profile at toy sizes on the CPU): the code paths only; 4,000 residues a row, one
      classifier epoch, 1- and 2-mers for the peptide baseline;
    - ``cpu``: a 2-layer, width-64 model on windows of 128 residues, batches of 8, 60,000 residues a row
      (about 60 optimizer steps at lr 6e-3, four evaluations; 48,000 left the model short of the unigram
      baseline, 72,000 reached it and ran the page further past its time budget), one seed, tolerance 0.02 nats (about 3x the measured seed-to-seed spread, 0.003-0.007),
      one classifier epoch;
    - ``gpu-small`` (T4): width 256, 4 layers, crop 512, 20 M residues a row, seeds 0-1, tolerance 0.02;
    - ``gpu`` (A100/H100): width 512, 6 layers, crop 1,024, 50 M residues (about 6 epochs of the training proteins' ~8 M residues),
      seeds 0-2, tolerance 0.02.
    """
    from gpuformer_lib.device import PRESET_NAMES

    if getattr(preset, "name", None) not in PRESET_NAMES:
        raise ValueError(f"preset must be a device.SizePreset named one of {PRESET_NAMES}, got {preset!r}")
    if getattr(profile, "rehearsal", False) or getattr(preset, "toy", False):
        return CasePlan(32, 1, 2, 64, 8, 4_000, (0,), 0.05, 2, 48, 2_000, 1, kmer_ks=(1, 2))
    if preset.name == "cpu":
        return CasePlan(64, 2, 4, 128, 8, 60_000, (0,), 0.02, 4, 100, 4_000, 1, 6e-3)
    if preset.name == "gpu-small":
        return CasePlan(256, 4, 4, 512, 32, 20_000_000, (0, 1), 0.02, 8, 900, None, 20, 1e-3)
    return CasePlan(512, 6, 8, 1024, 32, 50_000_000, (0, 1, 2), 0.02, 8, 900, None, 30, 6e-4)


def protein_lm_task(split: ProteinSplit, plan: CasePlan, *, name: str = "protein language model") -> case_study.Task:
    """The harness's task: ``DecoderLM`` over amino acids trained on crop windows of the training proteins
    (the first ``plan.train_proteins``), quality = validation loss per residue (nats) on the first windows
    of ``plan.val_proteins`` validation proteins. Option ``batching``: ``"padded"`` (default), ``"bucketed"``
    or ``"packed"``."""
    train = split.train[:plan.train_proteins] if plan.train_proteins else split.train
    val = lm_batches(first_windows(split.val[:plan.val_proteins], plan.crop), "padded", 64, plan.crop, 0, 0)
    config = lm_config(plan.d_model, plan.n_layers, plan.n_heads, plan.crop)

    def build(setting: case_study.Setting) -> nn.Module:
        return DecoderLM(speed.model_config(config, setting.plan))

    def batches(setting: case_study.Setting, seed: int, epoch: int):
        windows = crop_windows(train, plan.crop, seed, epoch)
        yield from lm_batches(windows, setting.option("batching", "padded"), plan.batch_size, plan.crop, seed, epoch)

    def flops(batch: LMBatch) -> float:
        B, T = batch.ids.shape
        return transformer_flops(config, B, T) * batch.real / (B * T)

    return case_study.Task(
        name=name, build_model=build, batches=batches, loss_fn=lm_loss, count=lambda b: b.real,
        evaluate=lambda model, device: lm_eval_loss(model, val, device), quality_name="validation loss (nats/residue)",
        higher_is_better=False, tolerance=plan.tolerance, budget=case_study.Budget(tokens=plan.budget_tokens),
        lr=plan.lr, weight_decay=0.01, warmup=0.1, grad_clip=1.0, evaluations=plan.evaluations, flops=flops,
        unit="residues")


def lm_memory_gib(plan_like: CasePlan, crop: int, batch_size: int, autocast: bool) -> float:
    """Chapter 9's calculator (``memory.training_memory``) for this plan's model at ``crop`` and ``batch_size``
    (fused attention: no (T, T) scores kept), in GiB."""
    from gpuformer_lib import memory
    from gpuformer_lib.model import count_parameters

    config = lm_config(plan_like.d_model, plan_like.n_layers, plan_like.n_heads, max(crop, 1))
    with torch.device("meta"):
        params = count_parameters(DecoderLM(config))
    m = memory.training_memory(params, n_layers=config.n_decoder_layers, d_model=config.d_model,
                               n_heads=config.n_heads, d_ff=config.d_ff, seq_len=crop, batch_size=batch_size,
                               vocab_size=config.vocab_size, autocast=autocast, activation_bytes=2 if autocast else 4,
                               fused_attention=True)
    return m.total / 2**30


def predicted_steps(config: TransformerConfig, batch_size: int, crop: int, padding_before: float, gpu: str,
                    low_precision: torch.dtype) -> list[tuple[str, object]]:
    """(row, ``predict.Prediction``) of the measured ladder's rows predicted for ``gpu`` (a datasheet name) by
    the course's predictor (``gpuformer_lib.predict``), for ``batch_size`` windows of ``crop`` residues of
    ``config``, eager, foreach AdamW: random padded batches (``padding_before``, the share of padded slots)
    in float32; packed rows, which carry the same real residues in ``round(batch_size x (1 - padding_before))``
    full windows; TF32 matrix products (where the GPU has them); ``low_precision`` autocast. Every row keeps
    its launches, memory traffic and host time, so a launch-bound step gains less than its FLOPs say."""
    from gpuformer_lib import gpu_view, predict

    if not 0 <= padding_before < 1:
        raise ValueError(f"padding_before is a share of padded slots, 0 <= share < 1; got {padding_before!r}")
    packed = max(1, round(batch_size * (1 - padding_before)))
    rows = [("baseline (fp32, padded batches)", batch_size, "fp32"), ("+ packed rows", packed, "fp32")]
    if gpu_view.datasheet(gpu).tf32 is not None:
        rows.append(("+ TF32 matmuls", packed, "tf32"))
    fmt = predict.format_of(low_precision)
    rows.append((f"+ {fmt} autocast", packed, fmt))
    return [(name, predict.predict_step(predict.training_work(config, tokens=windows * crop, seq_len=crop,
                                                              fmt=f), gpu))
            for name, windows, f in rows]


def packing_gain(steps: Sequence[tuple[str, object]], batch_size: int, padding_before: float) -> float:
    """Residues per second of the packed row over the padded baseline's, from :func:`predicted_steps`: the
    packed step carries ``round(batch_size x (1 - padding_before))`` full windows of real residues, the
    padded one ``batch_size x (1 - padding_before)`` windows' worth."""
    packed = max(1, round(batch_size * (1 - padding_before)))
    return (packed / steps[1][1].seconds) / (batch_size * (1 - padding_before) / steps[0][1].seconds)


_FIXES = (  # profile category (bench.time_by_category) -> words of the rows that address it, in order
    ("matrix products", ("autocast", "TF32")),
    ("attention", ("fused attention",)),
    ("loss (log-softmax, NLL)", ("autocast",)),
    ("optimizer", ("fused AdamW",)),
    ("element-wise, norms, copies", ("torch.compile", "autocast")),  # fused kernels; else half the bytes moved
    ("copies", ("packed",)),  # a GPU's host-to-device copies: no padded slots to copy
)


def bottleneck(times: dict[str, float], tie: float = 0.1) -> tuple[tuple[str, ...], float]:
    """The largest categories of a profile (``bench.time_by_category``) and the largest one's share of the total:
    the top category alone, or the top two when the second is within ``tie`` (relative) of the first (one
    profile's timings cannot tell them apart)."""
    if not times or any(not v >= 0 for v in times.values()) or sum(times.values()) <= 0:
        raise ValueError(f"times must map categories to times >= 0 with a positive total, got {times!r}")
    if not 0 <= tie < 1:
        raise ValueError(f"tie is a relative margin, 0 <= tie < 1; got {tie!r}")
    ranked = sorted(times, key=times.get, reverse=True)
    tops = tuple(ranked[:2]) if len(ranked) > 1 and times[ranked[1]] >= (1 - tie) * times[ranked[0]] else ranked[:1]
    return tuple(tops), times[ranked[0]] / sum(times.values())


def fix_for(category: str, row_names: Sequence[str]) -> str | None:
    """The first table row (by name) whose acceleration addresses ``category``; None when none does."""
    return case_study.fixing_row(category, row_names, _FIXES)


def setting_rate_ratio(task: case_study.Task, before: case_study.Setting, after: case_study.Setting, device, *,
                       steps: int = 6, seed: int = 0) -> float:
    """Real residues per second under ``after`` over those under ``before``: each setting's model, optimizer and
    step built as the table's row builds them, timed interleaved (``case_study.interleaved_rates``)."""
    rate_before, rate_after = case_study.interleaved_rates(task, before, after, device, steps=steps, seed=seed)
    return rate_after / rate_before


def batching_rate_ratio(task: case_study.Task, kind: str, device, *, steps: int = 6, seed: int = 0) -> float:
    """Real residues per second with batching ``kind`` over those with ``"padded"`` batches, the baseline's
    settings otherwise (:func:`setting_rate_ratio`, interleaved)."""
    base = case_study.Setting()
    return setting_rate_ratio(task, base, base.with_options(batching=kind), device, steps=steps, seed=seed)
