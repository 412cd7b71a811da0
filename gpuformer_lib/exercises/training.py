"""Checks for the exercises on losses, schedules and batching (chapters 6 and 7)."""

from __future__ import annotations

import bisect
import math
import numbers
from typing import Callable

import torch
import torch.nn.functional as F

from gpuformer_lib.exercises._answers import _index_batches, _number, _tensors
from gpuformer_lib.exercises._core import (NOT_IMPLEMENTED_HINT, CheckResult, _close, _describe, _report, _safe_check,
                                            _timed_out, _try)


@_safe_check
def check_masked_cross_entropy(
        fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> CheckResult:
    """``fn(logits (B, T, V), targets (B, T), padding_mask (B, T), True at padding)``: the mean
    cross-entropy over the real (non-padding) tokens."""
    g = torch.Generator().manual_seed(0)
    logits, targets = torch.randn(3, 7, 11, generator=g), torch.randint(0, 11, (3, 7), generator=g)
    padding = torch.arange(7)[None, :] >= torch.tensor([7, 2, 4])[:, None]
    got, err = _try(fn, logits, targets, padding, expect=_number)
    if err:
        return _report(False, err)
    per_token = F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1), reduction="none").view(3, 7)
    want = per_token[~padding].mean()
    if _close(got, want.item(), rel=1e-5):
        return _report(True, "Sum the losses of the real tokens and divide by their number: every real token "
                             "counts once.")
    if _close(got, per_token.mean().item(), rel=1e-5):
        return _report(False, "You averaged over every position, padding included: padding adds losses that "
                              "mean nothing. Keep only the positions where padding_mask is False.")
    per_sequence = torch.stack([per_token[b][~padding[b]].mean() for b in range(3)]).mean()
    if _close(got, per_sequence.item(), rel=1e-5):
        return _report(False, "You averaged each sequence, then the sequences: short sequences then weigh as much "
                              "as long ones. Average over all real tokens of the batch at once.")
    if _close(got, (per_token * ~padding).sum().item() / per_token.numel(), rel=1e-5):
        return _report(False, "The masked sum is right; divide by the number of real tokens, not of all positions.")
    return _report(False, f"Expected {want.item():.4f}, got {got!r}. Per-token losses: "
                          "F.cross_entropy(..., reduction='none').")


@_safe_check
def check_label_smoothing(fn: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]) -> CheckResult:
    """``fn(logits (N, V), targets (N,), eps)``: cross-entropy with label smoothing ``eps``, as
    ``F.cross_entropy(..., label_smoothing=eps)`` defines it (eps spread over all V classes), averaged over the
    N rows. Graded exactly (to float rounding) for two values of eps; each plausible wrong formula (eps over
    V - 1 classes, no (1 - eps) weight, eps ignored, a sum over the rows or over the classes) gets its hint."""
    g = torch.Generator().manual_seed(1)
    logits, targets = torch.randn(9, 6, generator=g), torch.randint(0, 6, (9,), generator=g)
    for eps in (0.1, 0.3):
        got, err = _try(fn, logits, targets, eps, expect=_number)
        if err:
            return _report(False, err)
        want = F.cross_entropy(logits, targets, label_smoothing=eps).item()
        if _close(got, want, rel=1e-5):
            continue
        logp = logits.log_softmax(-1)  # (N, V)
        nll, uniform = -logp.gather(1, targets[:, None]).squeeze(1), -logp.mean(-1)  # (N,) each
        others = (-logp.sum(-1) - nll) / (logits.shape[1] - 1)
        if _close(got, ((1 - eps) * nll + eps * others).mean().item(), rel=1e-5):
            return _report(False, "You spread eps over the V - 1 wrong classes; PyTorch (and the exercise) spreads it "
                                  "over all V classes: (1 - eps) * nll + eps * mean over classes of -log p.")
        if _close(got, (nll + eps * uniform).mean().item(), rel=1e-5):
            return _report(False, "Weight the true-class term by (1 - eps): the target is a mixture of one-hot and "
                                  "uniform.")
        if _close(got, nll.mean().item(), rel=1e-5):
            return _report(False, f"For eps={eps} you returned the plain cross-entropy: eps is ignored. Mix the "
                                  "target: (1 - eps) * nll + eps * the mean over classes of -log p.")
        if _close(got, ((1 - eps) * nll + eps * uniform).sum().item(), rel=1e-5):
            return _report(False, "You summed over the N rows; F.cross_entropy averages them (reduction='mean'): "
                                  "take the mean over the batch.")
        if _close(got, ((1 - eps) * nll + eps * -logp.sum(-1)).mean().item(), rel=1e-5):
            return _report(False, "You summed -log p over the classes; eps is spread as eps / V on each class, so "
                                  "take the mean over the V classes, not the sum.")
        return _report(False, f"For eps={eps} expected {want:.4f}, got {got!r}.")
    return _report(True, "(1 - eps) * NLL + eps * the mean of -log p over all classes: it stops the model chasing "
                         "certainty.")


@_safe_check
def check_warmup_schedule(fn: Callable[[int, int, int], float]) -> CheckResult:
    """``fn(step, d_model, warmup)``: the paper's learning rate, d^-0.5 * min(step^-0.5, step * warmup^-1.5),
    for steps counted from 1. Graded exactly (to float rounding) in the warm-up, at its peak and in the decay;
    each plausible wrong formula (no d_model factor or its sign flipped, max for min, warmup^-0.5, no decay after
    the warm-up, steps shifted by one) gets its hint."""
    for step, d, w in ((1, 512, 4000), (4000, 512, 4000), (100_000, 512, 4000), (10, 64, 100)):
        got, err = _try(fn, step, d, w, expect=_number)
        if err:
            return _report(False, err)
        want = d ** -0.5 * min(step ** -0.5, step * w ** -1.5)
        if _close(got, want, rel=1e-6):
            continue
        if _close(got, min(step ** -0.5, step * w ** -1.5), rel=1e-6):
            return _report(False, "Missing the factor d_model^-0.5: wider models get smaller steps.")
        if _close(got, d ** 0.5 * min(step ** -0.5, step * w ** -1.5), rel=1e-6):
            return _report(False, "The factor is d_model^-0.5, a negative exponent: wider models get smaller steps, "
                                  "not larger.")
        if _close(got, d ** -0.5 * max(step ** -0.5, step * w ** -1.5), rel=1e-6):
            return _report(False, "Use min, not max: warm up linearly, then decay as 1/sqrt(step).")
        if _close(got, d ** -0.5 * min(step ** -0.5, step * w ** -0.5), rel=1e-6):
            return _report(False, "The warm-up slope is warmup^-1.5, not warmup^-0.5: with -1.5 the two branches "
                                  "meet at step = warmup, where step * warmup^-1.5 = warmup^-0.5.")
        if _close(got, d ** -0.5 * min(w ** -0.5, step * w ** -1.5), rel=1e-6):
            return _report(False, f"At step {step}, past the warm-up, the rate must decay as step^-0.5 "
                                  "(1/sqrt(step)); yours stays at its peak.")
        if _close(got, d ** -0.5 * min((step + 1) ** -0.5, (step + 1) * w ** -1.5), rel=1e-6):
            return _report(False, "Steps are counted from 1: use step as given, not step + 1 (off by one).")
        return _report(False, f"For step={step}, d_model={d}, warmup={w} expected {want:.3e}, got {got!r}.")
    peak = 512 ** -0.5 * 4000 ** -0.5
    return _report(True, f"The base model peaks at step 4000 at {peak:.2e} and then decays as 1/sqrt(step).")


@_safe_check
def check_collate(fn: Callable[[list[torch.Tensor], int], tuple[torch.Tensor, torch.Tensor]]) -> CheckResult:
    """``fn(sequences, pad_id)`` stacks 1-D id tensors into (B, T_max), padding on the right with
    ``pad_id``, and returns it with the padding mask (True at padding). Graded with pad ids 0 and 3, so a
    collate that pads with a hard-coded 0 is caught; the ids must stay integer token ids and the mask
    a bool tensor (``~`` on an integer 0/1 mask gives -1 and -2, not its complement)."""
    seqs = [torch.tensor([5, 6, 7]), torch.tensor([8]), torch.tensor([9, 10])]
    for pad_id in (0, 3):
        got, err = _try(fn, seqs, pad_id, expect=_tensors(2, "two tensors (padded ids, padding mask)"))
        if err:
            return _report(False, err)
        ids, mask = got
        want_mask = torch.tensor([[False, False, False], [False, True, True], [False, False, True]])
        want = torch.tensor([[5, 6, 7], [8, 0, 0], [9, 10, 0]]).masked_fill(want_mask, pad_id)
        if ids.shape != want.shape:
            return _report(False, f"Pad to the longest sequence: expected shape {tuple(want.shape)}, "
                                  f"got {tuple(ids.shape)}.")
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            return _report(False, f"The ids are token ids: an integer tensor (torch.long, the sequences' dtype), "
                                  f"not {str(ids.dtype).removeprefix('torch.')}. torch.zeros and torch.full with a "
                                  "float fill make floats: pass dtype=torch.long, and an embedding refuses floats.")
        if torch.equal(ids, torch.tensor([[5, 6, 7], [pad_id, pad_id, 8], [pad_id, 9, 10]])):
            return _report(False, "That pads on the left; pad on the right, so position t is token t of every "
                                  "sequence.")
        if pad_id != 0 and torch.equal(ids, want.masked_fill(want_mask, 0)):
            return _report(False, f"With pad_id={pad_id} you padded with 0: fill with the pad_id argument "
                                  "(torch.full(..., pad_id)); every vocabulary numbers its padding token "
                                  "its own way.")
        if not torch.equal(ids, want):
            return _report(False, f"With pad_id={pad_id} expected ids\n{want}\ngot\n{ids}")
        if mask.shape != want_mask.shape:
            return _report(False, f"The mask has one entry per slot of the ids, shape {tuple(want_mask.shape)}, "
                                  f"not {tuple(mask.shape)}.")
        if mask.dtype != torch.bool:
            inverted = " (and it is inverted: True must mark padding)" if torch.equal(mask, ~want_mask) else ""
            return _report(False, f"The mask must be a bool tensor, not {str(mask.dtype).removeprefix('torch.')}"
                                  f"{inverted}: ~ on an integer 0/1 mask gives -1 and -2, not the real tokens, "
                                  "and masked_fill wants bool. Build it with a comparison (positions >= lengths, or "
                                  "ids == pad_id) and keep it bool: no .int() or .long().")
        if torch.equal(mask, ~want_mask):
            return _report(False, "The mask is inverted: True must mark padding.")
        if not torch.equal(mask, want_mask):
            return _report(False, "The mask should be True exactly where padding was added, False at every real "
                                  "token.")
    return _report(True, "Right-padded ids and their mask; the model and the loss both need the mask.")


@_safe_check
def check_lm_batch(
        fn: Callable[[torch.Tensor, int, int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]) -> CheckResult:
    """``fn(ids, block_size, batch_size, generator)``: random windows of a 1-D token stream, inputs x
    (B, T) and next-token targets y (B, T), y shifted one position to the right of x. The starts are drawn
    with ``generator`` (the same seed gives the same batch, another seed another one), and every start
    leaves room for block_size + 1 tokens, the last window included (checked on a stream only a few
    tokens longer than a window)."""
    ids = torch.arange(1000)  # token i has id i, so windows are easy to read
    shape = _tensors(2, "two tensors (x, y)")
    got, err = _try(fn, ids, 16, 8, torch.Generator().manual_seed(0), expect=shape)
    if err:
        return _report(False, err)
    x, y = got
    if x.shape != (8, 16) or y.shape != (8, 16):
        return _report(False, f"x and y must both be (batch_size, block_size) = (8, 16); got {tuple(x.shape)}, "
                              f"{tuple(y.shape)}.")
    if any(t.is_floating_point() or t.is_complex() or t.dtype == torch.bool for t in (x, y)):
        return _report(False, f"x and y hold token ids: integer tensors, as ids is, not {x.dtype} and {y.dtype}.")
    if torch.equal(y, x):
        return _report(False, "y equals x: the target of position t is the token at t + 1.")
    if torch.equal(y, x - 1):
        return _report(False, "y is shifted the wrong way: y[t] must be the token after x[t].")
    if not torch.equal(x[:, 1:] - x[:, :-1], torch.ones(8, 15, dtype=x.dtype)):
        return _report(False, "Each row must be a contiguous window of the stream.")
    if not torch.equal(y, x + 1):
        return _report(False, "Each y row must be its x row moved one token to the right, from the same window.")
    if len(set(x[:, 0].tolist())) == 1:
        return _report(False, "Every row starts at the same place: draw a random start per row.")
    again, err = _try(fn, ids, 16, 8, torch.Generator().manual_seed(0), expect=shape)
    if err:
        return _report(False, err)
    if not torch.equal(again[0], x):
        return _report(False, "Called twice with generators seeded alike, your function gave different windows: "
                              "draw the starts with the generator argument (torch.randint(..., "
                              "generator=generator)), not the global random state, so a seed reproduces a run.")
    other, err = _try(fn, ids, 16, 8, torch.Generator().manual_seed(1), expect=shape)
    if err:
        return _report(False, err)
    if torch.equal(other[0], x):
        return _report(False, "Another generator seed gave the same windows: the starts are not random. Draw "
                              "them with torch.randint(0, len(ids) - block_size, (batch_size,), "
                              "generator=generator).")
    short = torch.arange(20)  # starts 0 to 3 fit a window of 16 and its target
    room = ("a start must leave room for block_size + 1 tokens (the window and its last target): starts run from "
            "0 to len(ids) - block_size - 1, so torch.randint(0, len(ids) - block_size, ...)")
    got, err = _try(fn, short, 16, 64, torch.Generator().manual_seed(0), expect=shape)
    if err:
        if _timed_out(err) or err == NOT_IMPLEMENTED_HINT:
            return _report(False, err)
        return _report(False, f"On a stream of 20 tokens with block_size 16: {err} A window runs past the end: "
                              f"{room}.")
    x, y = got
    if x.shape != (64, 16) or y.shape != (64, 16) or not torch.equal(y, x + 1) or int(y.max()) > 19:
        return _report(False, f"On a stream of 20 tokens with block_size 16 the windows came out wrong (shapes "
                              f"{tuple(x.shape)}, {tuple(y.shape)}): a window runs past the end. {room}.")
    return _report(True, "Random windows, targets shifted by one: every position of every window is a training "
                         "example.")


@_safe_check
def check_bucket_batches(fn: Callable[[list[int], int], list[list[int]]]) -> CheckResult:
    """``fn(lengths, batch_size)`` returns batches of indices (every index once) grouped by similar
    length, so that padding each batch to its longest wastes little."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(2, 60, (500,), generator=g).tolist()
    got, err = _try(fn, lengths, 16, expect=_index_batches)
    if err:
        return _report(False, err)
    flat = sorted(i for batch in got for i in batch)
    if flat != list(range(500)) and flat == sorted(lengths):
        return _report(False, "Your batches hold the lengths themselves, not the indices of the sentences: sort "
                              "the indices by their length, sorted(range(len(lengths)), key=lengths.__getitem__), "
                              "then cut.")
    if flat != list(range(500)):
        return _report(False, "Every index must appear in exactly one batch.")
    if any(len(b) == 0 for b in got):
        return _report(False, "A batch is empty: leave out empty batches.")
    if max(len(b) for b in got) > 16:
        return _report(False, "A batch is larger than batch_size.")
    from gpuformer_lib.data import padding_fraction

    waste = padding_fraction(got, lengths)
    in_order = padding_fraction([list(range(i, min(i + 16, 500))) for i in range(0, 500, 16)], lengths)
    if waste > 0.5 * in_order:
        return _report(False, f"{waste:.0%} of the slots are padding, against {in_order:.0%} for batches in data "
                              "order: group indices of similar length (sort by length, then cut).")
    trend = _length_trend([max(lengths[i] for i in b) for b in got])
    if len(got) >= 8 and abs(trend) > 0.7:
        way = "short sentences first and long ones last" if trend > 0 else "long sentences first and short ones last"
        return _report(False, f"{waste:.0%} padding instead of {in_order:.0%}, but the batches come in length order "
                              f"(rank correlation {trend:+.2f} between a batch's place and its length): training "
                              f"would see {way}, a curriculum nobody asked for. Shuffle the batches after cutting "
                              "them (random.shuffle(batches)).")
    return _report(True, f"{waste:.0%} padding instead of {in_order:.0%}, and the batches in a shuffled order, so "
                         "training meets every length throughout the epoch.")


def _length_trend(values: list[float]) -> float:
    """Spearman rank correlation between position and value (0 for no trend, +-1 for sorted)."""
    n = len(values)
    if n < 2:
        return 0.0
    order = sorted(range(n), key=lambda i: values[i])
    ranks = [0.0] * n
    i = 0
    while i < n:  # average ranks over ties
        j = i
        while j + 1 < n and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    mean = (n - 1) / 2
    pos = [k - mean for k in range(n)]
    val = [r - sum(ranks) / n for r in ranks]
    denom = (sum(p * p for p in pos) * sum(v * v for v in val)) ** 0.5
    return sum(p * v for p, v in zip(pos, val)) / denom if denom else 0.0


# --------------------------------------------------------------------------- chapter 7, second edition

PADDING_REL = 0.03
"""How close a padding-share prediction must be to the model's (relative): a learner's exact expectation, a
simulation of random batches (one epoch of 26k pairs varies by under 1 %) and the quantile shortcut at the
chapter's batch size all land within it; the longest sentence of the whole data set, the median in place
of the mean, and the shortcut at small batches do not."""


def expected_padding_share(lengths: list[int], batch_size: int) -> float:
    """The model: 1 - mean length / E[longest of ``batch_size`` random draws]. The longest of B independent
    draws is at most v with probability F(v)^B (F: the share of lengths <= v), so
    E[longest] = sum over v of v (F(v)^B - F(v-1)^B). A random sampler draws without replacement, which
    differs by far less than the rounding for thousands of sentences."""
    ranked = sorted(lengths)
    n, longest, below = len(ranked), 0.0, 0.0
    for value in sorted(set(ranked)):
        at_most = bisect.bisect_right(ranked, value) / n
        longest += value * (at_most ** batch_size - below ** batch_size)
        below = at_most
    return 1 - sum(ranked) / n / longest


def _padding_mistakes(lengths: list[int], batch_size: int) -> dict[str, tuple[float, str]]:
    """The plausible wrong models of the padding share of random batches of ``batch_size``."""
    ranked = sorted(lengths)
    n, mean = len(ranked), sum(ranked) / len(ranked)
    right = expected_padding_share(lengths, batch_size)
    longest = mean / (1 - right)  # E[longest of B]
    median = ranked[(n - 1) // 2] if n % 2 else (ranked[n // 2 - 1] + ranked[n // 2]) / 2
    quantile = ranked[min(n - 1, int(n * batch_size / (batch_size + 1)))]
    return {
        "padding every batch to the longest sentence of the whole data set": (
            1 - mean / ranked[-1],
            f"A batch pads to the longest of *its* {batch_size} sentences, not to the longest of the whole data "
            "set: with few sentences a batch rarely holds the longest one. The longest of B random draws is at "
            "most v with probability F(v)^B."),
        "the share of real tokens": (
            mean / longest,
            "That is the share of real tokens in the slots; the padding share is 1 minus it."),
        "padding per real token": (
            longest / mean - 1,
            "You divided the padding by the real tokens; the padding share is of all token slots: "
            "(B x longest - real) / (B x longest) = 1 - mean length / E[longest]."),
        "the median length in place of the mean": (
            1 - median / longest,
            "The real tokens of a batch are B x the mean length, not B x the median: the median ignores how "
            "long the long tail is."),
        "the B/(B + 1) quantile as the longest": (
            1 - mean / quantile,
            f"The B/(B + 1) quantile is only a rough guess at the longest of B draws; with few distinct "
            f"lengths and small batches it is far off (here B = {batch_size}). Compute the expectation: the "
            "longest is at most v with probability F(v)^B, so E[longest] = sum over v of v (F(v)^B - "
            "F(v - 1)^B)."),
    }


def _random_batches_padding(lengths: list[int], batch_size: int) -> float:
    """One epoch of random batches (a seeded ``RandomSampler``), measured as chapter 7 does."""
    from gpuformer_lib.data import padding_fraction

    order = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(0)).tolist()
    return padding_fraction([order[i:i + batch_size] for i in range(0, len(order), batch_size)], lengths)


def check_padding_prediction(predict: Callable[[list[int], int], float], lengths: list[int], batch_size: int,
                             measured: float | None = None) -> CheckResult:
    """``predict(lengths, batch_size)``: the share of padding (a fraction in (0, 1)) expected in batches of
    ``batch_size`` random sentences of these lengths. Graded against the model
    (:func:`expected_padding_share`, within :data:`PADDING_REL`) at the chapter's batch size and at 1/8 and
    1/2 of it, so that a number copied from section 7.2's measurement, or a shortcut that holds at one size
    only, does not pass. The padding of random batches, measured (``measured``, the notebook's own, at
    ``batch_size``; at the other sizes one seeded epoch measured here), is shown beside the model, never
    graded: one epoch varies by well under the gaps between the models."""
    from gpuformer_lib.exercises.predictions import grade_model, own_result

    lengths = list(lengths)
    if not lengths or any(isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1 for n in lengths):
        raise ValueError("lengths must be a non-empty list of positive ints")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 2:
        raise ValueError(f"batch_size must be an int >= 2, got {batch_size!r}")
    if measured is not None and not 0 < measured < 1:
        raise ValueError(f"the measured padding share must be a fraction in (0, 1), got {measured!r}")
    if min(lengths) == max(lengths):
        raise ValueError("every sentence has the same length: random batches hold no padding to predict")
    sizes = sorted({max(2, batch_size // 8), max(2, batch_size // 2), batch_size})
    got = {}
    for size in sizes:
        value, err = _try(predict, lengths, size, expect=_number)
        if err:
            return own_result(False, err, timed_out=_timed_out(err), not_attempted=err == NOT_IMPLEMENTED_HINT)
        try:
            got[size] = float(value)
        except OverflowError:  # an int beyond float's range
            got[size] = math.inf
    rights = {size: expected_padding_share(lengths, size) for size in sizes}
    missed = [size for size in sizes if not abs(got[size] / rights[size] - 1) <= PADDING_REL]
    mistakes = {size: _padding_mistakes(lengths, size) for size in sizes}

    def near(value, model: float) -> bool:
        return model > 0 and abs(value / model - 1) <= PADDING_REL

    # a mistake is named only if the answers follow it at every size (a coincidence at one size is not it)
    followed = [name for name in mistakes[sizes[0]]
                if all(near(got[s], mistakes[s][name][0]) or near(got[s], rights[s]) for s in sizes)]
    if missed and not followed and len(sizes) > 1 and len(set(got.values())) == 1:
        return own_result(False, f"Your function gives {got[sizes[0]]:.3g} for batches of "
                                 f"{', '.join(map(str, sizes))} sentences alike: a number, not a prediction from "
                                 "the lengths and batch_size. The padding share grows with the batch size (a larger "
                                 "batch reaches further into the long tail): 1 - mean length / E[longest of B], "
                                 "where the longest of B draws is at most v with probability F(v)^B.")
    if missed:
        size = missed[0]
        right = rights[size]
        wrong = {name: mistakes[size][name] for name in followed  # one that agrees with the model here is no mistake
                 if mistakes[size][name][0] > 0 and abs(mistakes[size][name][0] / right - 1) > 2 * PADDING_REL}
        seen = measured if size == batch_size and measured is not None else _random_batches_padding(lengths, size)
        return grade_model(
            got[size], right, quantity=f"the padding share of random batches of {size}", unit="(fraction)",
            wrong=wrong, rel=PADDING_REL, measured=seen, measured_by="random batches measured",
            too_high=("A batch pads to its own longest sentence: 1 - mean length / E[longest of B], where the "
                      "longest of B draws is at most v with probability F(v)^B. A share is below 1."),
            too_low=("A batch pads to its longest sentence, not to the mean or the median length; with "
                     f"{size} sentences the longest is near the top of the distribution: E[longest] from "
                     "P(longest <= v) = F(v)^B."))
    said = ", ".join(f"{got[s]:.3f} for {s}" for s in sizes)
    model = ", ".join(f"{expected_padding_share(lengths, s):.3f}" for s in sizes)
    shown = [measured if s == batch_size and measured is not None else _random_batches_padding(lengths, s)
             for s in sizes]
    return own_result(True, f"You predicted padding shares of {said} sentences a batch; the model "
                            f"1 - mean length / E[longest of B] gives {model}, and random batches measured "
                            f"{', '.join(f'{m:.3f}' for m in shown)}. The longest of B draws is at most v with "
                            "probability F(v)^B: larger batches reach further into the long tail, so they pad "
                            "more.")


SYNC_LOOP = (
    "for step, batch in enumerate(loader):                      # DataLoader(pin_memory=True)",
    "    batch = batch.to(device, non_blocking=True)",
    "    logits = model(batch.src, batch.tgt_in, batch.src_padding_mask, batch.tgt_padding_mask)",
    "    real = ~batch.tgt_padding_mask",
    "    loss = F.cross_entropy(logits[real], batch.tgt_out[real])",
    "    loss.backward()",
    "    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
    "    if norm > 10:",
    "        warnings.warn('large gradient')",
    "    optimizer.step()",
    "    optimizer.zero_grad(set_to_none=True)",
    "    tokens_seen += real.sum()",
    "    losses.append(loss.detach())",
    "    if step % 1000 == 0:",
    "        print(f'step {step}: loss {torch.stack(losses).mean():.3f}')",
)
"""A training loop on a GPU, numbered from 1 in :func:`show_sync_loop`: which lines make the host wait
for the GPU at *every* step?"""

_SYNC_ANSWERS = {
    5: "boolean-mask indexing (logits[real]): the output's size depends on how many entries are True, so the "
       "host must read the mask's count from the GPU before it can allocate the result",
    8: "`if norm > 10` turns a GPU tensor into a Python bool: it waits for everything queued so far",
}
_NOT_SYNCS = {
    1: "taking the next batch from the loader is host work (workers, pinning); nothing waits for the GPU",
    2: "a non-blocking copy from pinned memory is queued; the host goes on",
    3: "the forward pass only queues kernels",
    4: "an element-wise op on the GPU: queued",
    6: "backward queues kernels",
    7: "clip_grad_norm_ computes the norm and scales on the GPU; it returns a tensor, it does not read it",
    9: "runs only when the condition was true; the wait happened on line 8",
    10: "the optimizer step queues kernels (a fused or foreach AdamW reads nothing back)",
    11: "setting gradients to None is host bookkeeping",
    12: "adding a GPU tensor into a GPU tensor stays on the device (if tokens_seen is a tensor; `+= ... .item()` "
        "would sync)",
    13: "detach() and a Python list append: no read-back",
    14: "a comparison of Python ints",
    15: "formatting a tensor reads it back, but only every 1000 steps: not every step",
}


_MISSED_SYNCS = {
    5: "an operation whose output's size depends on the data: the host must learn that size from the GPU before "
       "it can allocate the result",
    8: "a GPU tensor turned into a Python bool or number: the host waits for everything queued so far to learn "
       "its value",
}
"""What each syncing line is, said without its number: the hint for a learner who missed it."""


def show_sync_loop() -> str:
    """The loop of the host-sync exercise, with line numbers."""
    return "\n".join(f"{n:2d}  {line}" for n, line in enumerate(SYNC_LOOP, start=1))


@_safe_check
def check_host_syncs(lines) -> CheckResult:
    """``lines``: the numbers (1-based) of the lines of :data:`SYNC_LOOP` that make the host wait for the
    GPU at every step. Each line wrongly named gets the reason it does not sync; each line missed, what
    kind of operation it is (not its number)."""
    if isinstance(lines, (str, bytes)) or not isinstance(lines, (set, frozenset, list, tuple, range)):
        return _report(False, f"Answer with a set of line numbers, e.g. {{3, 7}}; got {_describe(lines)}.")
    if any(isinstance(n, bool) or not isinstance(n, numbers.Real) or n != int(n) for n in lines):
        return _report(False, f"Answer with a set of line numbers (ints), e.g. {{3, 7}}; got {lines!r}.")
    chosen = {int(n) for n in lines}
    outside = sorted(n for n in chosen if not 1 <= n <= len(SYNC_LOOP))
    if outside:
        return _report(False, f"The loop has lines 1 to {len(SYNC_LOOP)}; {outside} are not among them.")
    wrong = sorted(chosen - set(_SYNC_ANSWERS))
    missed = sorted(set(_SYNC_ANSWERS) - chosen)
    if not wrong and not missed:
        return _report(True, "Lines 5 and 8. " + " ".join(f"Line {n}: {why}." for n, why in _SYNC_ANSWERS.items())
                       + " Fixes: compute the loss with ignore_index=PAD instead of indexing, and check the norm "
                         "when the loss is read back anyway (every log_every steps). On a GPU, "
                         "torch.cuda.set_sync_debug_mode('warn') names every syncing call as it happens.")
    said = [f"Line {n} does not sync: {_NOT_SYNCS[n]}." for n in wrong]
    if missed:
        said.append(f"{len(missed)} line(s) that sync every step are missing: "
                    + "; ".join(_MISSED_SYNCS[n] for n in missed) + ".")
    return _report(False, " ".join(said))
