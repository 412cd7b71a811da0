"""Checks for the exercises on losses, schedules and batching (chapters 6 and 7)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from gpuformer_lib.exercises._answers import _index_batches, _number, _tensors
from gpuformer_lib.exercises._core import (NOT_IMPLEMENTED_HINT, CheckResult, _close, _report, _safe_check, _timed_out,
                                            _try)


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
    ``F.cross_entropy(..., label_smoothing=eps)`` defines it (eps spread over all V classes)."""
    g = torch.Generator().manual_seed(1)
    logits, targets = torch.randn(9, 6, generator=g), torch.randint(0, 6, (9,), generator=g)
    for eps in (0.1, 0.3):
        got, err = _try(fn, logits, targets, eps, expect=_number)
        if err:
            return _report(False, err)
        want = F.cross_entropy(logits, targets, label_smoothing=eps).item()
        if _close(got, want, rel=1e-5):
            continue
        logp = logits.log_softmax(-1)
        nll, uniform = -logp.gather(1, targets[:, None]).squeeze(1), -logp.mean(-1)
        others = (-logp.sum(-1) - nll) / (logits.shape[1] - 1)
        if _close(got, ((1 - eps) * nll + eps * others).mean().item(), rel=1e-5):
            return _report(False, "You spread eps over the V - 1 wrong classes; PyTorch (and the exercise) spreads it "
                                  "over all V classes: (1 - eps) * nll + eps * mean over classes of -log p.")
        if _close(got, (nll + eps * uniform).mean().item(), rel=1e-5):
            return _report(False, "Weight the true-class term by (1 - eps): the target is a mixture of one-hot and "
                                  "uniform.")
        return _report(False, f"For eps={eps} expected {want:.4f}, got {got!r}.")
    return _report(True, "(1 - eps) * NLL + eps * the mean of -log p over all classes: it stops the model chasing "
                         "certainty.")


@_safe_check
def check_warmup_schedule(fn: Callable[[int, int, int], float]) -> CheckResult:
    """``fn(step, d_model, warmup)``: the paper's learning rate, d^-0.5 * min(step^-0.5, step * warmup^-1.5),
    for steps counted from 1."""
    for step, d, w in ((1, 512, 4000), (4000, 512, 4000), (100_000, 512, 4000), (10, 64, 100)):
        got, err = _try(fn, step, d, w, expect=_number)
        if err:
            return _report(False, err)
        want = d ** -0.5 * min(step ** -0.5, step * w ** -1.5)
        if _close(got, want, rel=1e-6):
            continue
        if _close(got, min(step ** -0.5, step * w ** -1.5), rel=1e-6):
            return _report(False, "Missing the factor d_model^-0.5: wider models get smaller steps.")
        if _close(got, d ** -0.5 * max(step ** -0.5, step * w ** -1.5), rel=1e-6):
            return _report(False, "Use min, not max: warm up linearly, then decay as 1/sqrt(step).")
        return _report(False, f"For step={step}, d_model={d}, warmup={w} expected {want:.3e}, got {got!r}.")
    peak = 512 ** -0.5 * 4000 ** -0.5
    return _report(True, f"The base model peaks at step 4000 at {peak:.2e} and then decays as 1/sqrt(step).")


@_safe_check
def check_collate(fn: Callable[[list[torch.Tensor], int], tuple[torch.Tensor, torch.Tensor]]) -> CheckResult:
    """``fn(sequences, pad_id)`` stacks 1-D id tensors into (B, T_max), padding on the right, and returns
    it with the padding mask (True at padding)."""
    seqs = [torch.tensor([5, 6, 7]), torch.tensor([8]), torch.tensor([9, 10])]
    got, err = _try(fn, seqs, 0, expect=_tensors(2, "two tensors (padded ids, padding mask)"))
    if err:
        return _report(False, err)
    ids, mask = got
    want = torch.tensor([[5, 6, 7], [8, 0, 0], [9, 10, 0]])
    want_mask = want == 0
    if ids.shape != want.shape:
        return _report(False, f"Pad to the longest sequence: expected shape {tuple(want.shape)}, "
                              f"got {tuple(ids.shape)}.")
    if torch.equal(ids, torch.tensor([[5, 6, 7], [0, 0, 8], [0, 9, 10]])):
        return _report(False, "That pads on the left; pad on the right, so position t is token t of every sequence.")
    if not torch.equal(ids, want):
        return _report(False, f"Expected ids\n{want}\ngot\n{ids}")
    if torch.equal(mask.bool(), ~want_mask):
        return _report(False, "The mask is inverted: True must mark padding.")
    if not torch.equal(mask, want_mask):
        return _report(False, "The mask should be a bool tensor, True exactly where padding was added.")
    return _report(True, "Right-padded ids and their mask; the model and the loss both need the mask.")


@_safe_check
def check_lm_batch(
        fn: Callable[[torch.Tensor, int, int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]) -> CheckResult:
    """``fn(ids, block_size, batch_size, generator)``: random windows of a 1-D token stream, inputs x
    (B, T) and next-token targets y (B, T), y shifted one position to the right of x."""
    ids = torch.arange(1000)  # token i has id i, so windows are easy to read
    got, err = _try(fn, ids, 16, 8, torch.Generator().manual_seed(0), expect=_tensors(2, "two tensors (x, y)"))
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
    if not torch.equal(y, x + 1):
        return _report(False, "Each y row must be its x row moved one token to the right, from the same window.")
    if not torch.equal(x[:, 1:] - x[:, :-1], torch.ones(8, 15, dtype=x.dtype)):
        return _report(False, "Each row must be a contiguous window of the stream.")
    if int(x.max()) + 1 >= 1000 + 1 or int(y.max()) > 999:
        return _report(False, "A window runs past the end: start positions must leave room for block_size + 1 "
                              "tokens.")
    if len(set(x[:, 0].tolist())) == 1:
        return _report(False, "Every row starts at the same place: draw a random start per row.")
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

PADDING_WITHIN = 1.25
"""How far a padding-share prediction may be from the measurement (a factor): the share is a property of
the length distribution, which a good model of "a batch pads to its longest sentence" gets to within
a few points."""


def check_padding_prediction(predict: Callable[[list[int], int], float], lengths: list[int], batch_size: int,
                             measured: float) -> CheckResult:
    """``predict(lengths, batch_size)``: the share of padding (a fraction in (0, 1)) expected in batches of
    ``batch_size`` random sentences of these lengths, graded against the ``measured`` share
    (``data.padding_fraction`` over a random sampler's batches) within :data:`PADDING_WITHIN`."""
    from gpuformer_lib.exercises.predictions import grade_prediction, own_result

    if not 0 < measured < 1:
        raise ValueError(f"the measured padding share must be a fraction in (0, 1), got {measured!r}")
    value, err = _try(predict, list(lengths), batch_size, expect=_number)
    if err:
        return own_result(False, err, timed_out=_timed_out(err), not_attempted=err == NOT_IMPLEMENTED_HINT)
    return grade_prediction(
        value, measured, quantity=f"the padding share of random batches of {batch_size}", unit="(fraction)",
        within=PADDING_WITHIN, measured_by="the random sampler's batches measured",
        too_high=("Too high: did you pad every batch to the longest sentence of the whole data set? A batch pads to "
                  f"the longest of *its* {batch_size} sentences, which is usually shorter: about the "
                  f"{batch_size}/({batch_size} + 1) quantile of the lengths, not their maximum."),
        too_low=("Too low: a batch is padded to its longest sentence, not to the mean or the median length; with "
                 f"{batch_size} sentences, the longest is near the top of the distribution."),
        why_close=("Padding share = 1 - mean length / mean of each batch's longest; the longest of B random draws "
                   "sits near the B/(B + 1) quantile, and the data's long tail decides the rest."))


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


def show_sync_loop() -> str:
    """The loop of the host-sync exercise, with line numbers."""
    return "\n".join(f"{n:2d}  {line}" for n, line in enumerate(SYNC_LOOP, start=1))


@_safe_check
def check_host_syncs(lines) -> CheckResult:
    """``lines``: the numbers (1-based) of the lines of :data:`SYNC_LOOP` that make the host wait for the
    GPU at every step."""
    try:
        chosen = {int(n) for n in lines}
    except (TypeError, ValueError):
        return _report(False, f"Answer with a set of line numbers, e.g. {{3, 7}}; got {lines!r}.")
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
        said.append(f"{len(missed)} line(s) that sync every step are missing: look for an operation whose result "
                    "the host needs (a Python bool or number) or whose output size depends on the data.")
    return _report(False, " ".join(said))
