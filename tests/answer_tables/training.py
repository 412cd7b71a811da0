"""Chapter 7: collating, language-model windows, bucketing, the padding of random batches, hidden host syncs.

(Chapter 6's checks of the same module, label smoothing and the warm-up schedule, are in ``optimizers.py``.)"""

import bisect
import random

import numpy as np
import torch

from answer_tables import Table, Wrong
from gpuformer_lib.data import pad, padding_fraction
from gpuformer_lib.exercises import training

# ---- 7.1 collate


def _collate(sequences, pad_id):
    """The chapter's solution."""
    longest = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), longest), pad_id, dtype=torch.long)
    for row, s in enumerate(sequences):
        ids[row, : len(s)] = s
    lengths = torch.tensor([len(s) for s in sequences])
    return ids, torch.arange(longest)[None, :] >= lengths[:, None]


def _collate_left(sequences, pad_id):
    longest = max(len(s) for s in sequences)
    ids = torch.stack([torch.cat([torch.full((longest - len(s),), pad_id), s]) for s in sequences])
    return ids, ids == pad_id


def _collate_zero(sequences, pad_id):
    longest = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), longest, dtype=torch.long)  # pad_id forgotten
    for row, s in enumerate(sequences):
        ids[row, : len(s)] = s
    return ids, ids == 0


def _collate_float(sequences, pad_id):
    longest = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), longest), float(pad_id))  # float32
    for row, s in enumerate(sequences):
        ids[row, : len(s)] = s
    return ids, ids == pad_id


# ---- 7.2 language-model windows


def _windows(ids, starts, block_size):
    x = torch.stack([ids[s: s + block_size] for s in starts])
    return x, torch.stack([ids[s + 1: s + block_size + 1] for s in starts])


def _lm_windows(ids, block_size, batch_size, generator):
    """The chapter's solution (it never draws the last window, which is allowed)."""
    starts = torch.randint(0, len(ids) - block_size - 1, (batch_size,), generator=generator)
    return _windows(ids, starts, block_size)


def _lm_unfold(ids, block_size, batch_size, generator):
    windows = ids.unfold(0, block_size + 1, 1)  # (len - block_size, block_size + 1): every window
    rows = windows[torch.randint(0, len(windows), (batch_size,), generator=generator)]
    return rows[:, :-1], rows[:, 1:]


CHECK_LM_BATCH = Table(
    "check_lm_batch", training.check_lm_batch,
    right=(_lm_windows, _lm_unfold,
           lambda ids, b, n, g: _windows(ids, torch.randint(0, len(ids) - b, (n,), generator=g), b)),
    wrong=(Wrong("targets equal the inputs", lambda ids, b, n, g: (lambda x: (x, x))(_lm_windows(ids, b, n, g)[0]),
                 ("t + 1",)),
           Wrong("targets shifted the wrong way", lambda ids, b, n, g: (lambda x: (x, x - 1))(
               _lm_windows(ids, b, n, g)[0] + 1), ("wrong way",)),
           Wrong("every row from the start", lambda ids, b, n, g: _windows(ids, [0] * n, b), ("same place",)),
           Wrong("the global random state", lambda ids, b, n, g: _windows(
               ids, torch.randint(0, len(ids) - b, (n,)), b), ("generator argument",)),
           Wrong("fixed starts", lambda ids, b, n, g: _windows(ids, [(i * b) % (len(ids) - b) for i in range(n)], b),
                 ("not random",)),
           Wrong("a window past the end", lambda ids, b, n, g: _windows(
               ids, torch.randint(0, len(ids) - b + 1, (n,), generator=g), b),
                 ("runs past the end", "block_size + 1"))),
)

# ---- 7.3 bucketing


def _bucket(lengths, batch_size):
    """The chapter's solution."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
    random.Random(0).shuffle(batches)
    return batches


def _bucket_numpy(lengths, batch_size):
    order = np.argsort(lengths, kind="stable")
    batches = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
    return [batches[i] for i in np.random.default_rng(0).permutation(len(batches))]


def _sorted_batches(lengths, batch_size):
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    return [order[i: i + batch_size] for i in range(0, len(order), batch_size)]


CHECK_BUCKET_BATCHES = Table(
    "check_bucket_batches", training.check_bucket_batches,
    right=(_bucket, _bucket_numpy),
    wrong=(Wrong("batches in length order", _sorted_batches, ("length order", "shuffle")),
           Wrong("longest batches first", lambda ls, b: _sorted_batches(ls, b)[::-1], ("length order",)),
           Wrong("batches in data order", lambda ls, b: [list(range(i, min(i + b, len(ls))))
                                                         for i in range(0, len(ls), b)], ("similar length",)),
           Wrong("the last sentence lost", lambda ls, b: [[i] for i in range(len(ls) - 1)], ("exactly one batch",)),
           Wrong("the lengths instead of the indices", lambda ls, b: (lambda s: [s[i: i + b] for i in
                                                                               range(0, len(s), b)])(sorted(ls)),
                 ("lengths themselves", "indices")),
           Wrong("batches one too large", lambda ls, b: _bucket(ls, b + 1), ("larger than batch_size",))),
)

# ---- 7.4 the padding of random batches

LENGTHS = [length for length, count in
           ((4, 1), (5, 10), (6, 41), (7, 112), (8, 209), (9, 313), (10, 361), (11, 355), (12, 328), (13, 253),
            (14, 187), (15, 143), (16, 91), (17, 63), (18, 47), (19, 31), (20, 24), (21, 16), (22, 12), (23, 7),
            (24, 6)) for _ in range(count)]
"""Chapter 7's sentence lengths (source or target, the longer), one tenth of the training pairs' histogram."""
random.Random(0).shuffle(LENGTHS)


def _expected_longest(lengths, batch_size):
    ranked = sorted(lengths)
    at_most = lambda v: bisect.bisect_right(ranked, v) / len(ranked)  # noqa: E731 - F(v)
    return sum(1 - at_most(v - 1) ** batch_size for v in range(1, ranked[-1] + 1))  # E[X] = sum P(X >= v)


def _predict_padding(lengths, batch_size):
    """The chapter's solution: 1 - mean / E[longest of B], P(longest <= v) = F(v)^B."""
    return 1 - sum(lengths) / len(lengths) / _expected_longest(lengths, batch_size)


def _simulated_padding(lengths, batch_size):
    """A simulation: three shuffled epochs, cut into batches, their padding measured."""
    shares = []
    for seed in range(3):
        order = list(range(len(lengths)))
        random.Random(seed).shuffle(order)
        shares.append(padding_fraction([order[i: i + batch_size] for i in range(0, len(order), batch_size)], lengths))
    return sum(shares) / len(shares)


def _quantile_shortcut(lengths, batch_size):
    """The chapter's former solution: the longest of B draws taken as the B/(B + 1) quantile."""
    ranked = sorted(lengths)
    longest = ranked[min(len(ranked) - 1, int(len(ranked) * batch_size / (batch_size + 1)))]
    return 1 - sum(lengths) / len(lengths) / longest


CHECK_PADDING_PREDICTION = Table(
    "check_padding_prediction",
    lambda predict: training.check_padding_prediction(predict, LENGTHS, 64, measured=0.457),
    right=(_predict_padding, _simulated_padding),
    wrong=(Wrong("the longest of the whole data set", lambda ls, b: 1 - sum(ls) / len(ls) / max(ls),
                 ("whole data set",)),
           Wrong("the share of real tokens", lambda ls, b: 1 - _predict_padding(ls, b), ("share of real tokens",)),
           Wrong("padding over real tokens", lambda ls, b: _expected_longest(ls, b) / (sum(ls) / len(ls)) - 1,
                 ("divided the padding by the real tokens",)),
           Wrong("the median for the mean", lambda ls, b: 1 - sorted(ls)[len(ls) // 2] / _expected_longest(ls, b),
                 ("median",)),
           Wrong("the B/(B + 1) quantile shortcut", _quantile_shortcut, ("quantile", "F(v)^B")),
           Wrong("section 7.2's number copied", lambda ls, b: 0.45, ("alike", "batch size"))),
)

# ---- 7.5 hidden host syncs

CHECK_HOST_SYNCS = Table(
    "check_host_syncs", training.check_host_syncs,
    right=({5, 8}, [8, 5], (5, 8)),
    wrong=(Wrong("the boolean-mask line missed", {8}, ("output's size depends on the data",)),
           Wrong("the Python bool missed", {5}, ("python bool",)),
           Wrong("the print every 1000 steps", {5, 8, 15}, ("every 1000 steps",)),
           Wrong("clip_grad_norm_ counted", {5, 7, 8}, ("line 7 does not sync", "returns a tensor")),
           Wrong("the non-blocking copy counted", {2, 5, 8}, ("line 2 does not sync", "non-blocking")),
           Wrong("the token count on the device counted", {5, 8, 12}, ("stays on the device",)),
           Wrong("the answer as a string", "5, 8", ("set of line numbers",)),
           Wrong("a line outside the loop", {5, 8, 99}, ("lines 1 to 15", "99"))),
)

TABLES = [
    Table(
        "check_collate", training.check_collate,
        right=(_collate, lambda seqs, pad_id: pad(seqs, pad_id),
               lambda seqs, pad_id: (lambda ids: (ids, ids == pad_id))(
                   torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=pad_id))),
        wrong=(Wrong("padding on the left", _collate_left, ("pads on the left",)),
               Wrong("padding with 0 whatever pad_id", _collate_zero, ("padded with 0", "pad_id")),
               Wrong("float ids", _collate_float, ("integer tensor", "dtype=torch.long")),
               Wrong("an integer mask", lambda seqs, pad_id: (lambda ids, mask: (ids, mask.long()))(
                   *_collate(seqs, pad_id)), ("bool tensor",)),
               Wrong("the mask inverted", lambda seqs, pad_id: (lambda ids, mask: (ids, ~mask))(
                   *_collate(seqs, pad_id)), ("inverted",)),
               Wrong("padding to a fixed length", lambda seqs, pad_id: (lambda ids: (ids, ids == pad_id))(
                   torch.stack([torch.cat([s, torch.full((8 - len(s),), pad_id)]) for s in seqs])),
                   ("longest sequence",))),
    ),
    CHECK_LM_BATCH,
    CHECK_BUCKET_BATCHES,
    CHECK_PADDING_PREDICTION,
    CHECK_HOST_SYNCS,
]
