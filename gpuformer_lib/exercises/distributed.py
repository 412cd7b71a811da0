"""Checks for the exercises on data parallel and model parallel training (chapters 11 and 12).

Each check runs in the notebook's own process: the ranks are simulated, so no process group is needed."""

from __future__ import annotations

from typing import Callable

import torch

from gpuformer_lib.exercises._answers import _indices, _number, _numbers
from gpuformer_lib.exercises._core import CheckResult, _close, _report, _run_limited, _safe_check, _try


@_safe_check
def check_allreduce_time(fn: Callable[[float, int, float, float], float]) -> CheckResult:
    """``fn(nbytes, world_size, alpha, bandwidth)``: seconds of a ring all-reduce in the alpha-beta model."""
    from gpuformer_lib.distributed import ring_allreduce_time

    for args in [(4e8, 8, 1e-5, 1e11), (4e8, 2, 1e-5, 1e11), (1e3, 64, 5e-6, 2.5e10), (1e9, 1, 1e-5, 1e11)]:
        got, err = _try(fn, *args, expect=_number)
        if err:
            return _report(False, err)
        want = ring_allreduce_time(*args)
        if not _close(got, want, 1e-6):
            nbytes, n, alpha, bw = args
            hint = ("One process has nothing to exchange: 0 s." if n == 1 else
                    "Each rank sends 2 (N - 1) / N of the bytes (reduce-scatter, then all-gather) in 2 (N - 1) "
                    "messages, each paying alpha.")
            return _report(False, f"{nbytes:.3g} bytes over {n} ranks (alpha {alpha:g} s, {bw:.3g} B/s): expected "
                                  f"{want:.4g} s, got {got!r}. {hint}")
    return _report(True, "The bandwidth factor 2 (N - 1) / N barely grows with N, but B is the bus bandwidth of the "
                         "ring's slowest link: 8 GPUs on NVLink and 64 GPUs on 8 nodes cost about the same only if "
                         "each node's network matches NVLink (one fast NIC per GPU); with one NIC per node the "
                         "64-GPU all-reduce is several times slower (collective_costs.hierarchical_allreduce_time). "
                         "The latency term grows with N too.")


@_safe_check
def check_scaling(fn: Callable[[float, float, int], tuple[float, float]]) -> CheckResult:
    """``fn(time_one, time_n, n)``: ``(speedup, efficiency)`` of running on ``n`` devices."""
    for args in [(10.0, 2.7, 4), (100.0, 60.0, 2), (8.0, 1.0, 8)]:
        got, err = _try(fn, *args, expect=_numbers(2, "a pair (speedup, efficiency)"))
        if err:
            return _report(False, err)
        speed, eff = got
        t1, tn, n = args
        if _close(speed, tn / t1, 1e-6) and not _close(speed, t1 / tn, 1e-6):
            return _report(False, "That speedup is upside down (the first seed's mistake): speedup is time before / "
                                  "time after, so 10 h -> 2.7 h is 3.7x, not 0.27.")
        if not _close(speed, t1 / tn, 1e-6) or not _close(eff, t1 / tn / n, 1e-6):
            return _report(False, f"{t1} -> {tn} on {n} devices: expected ({t1 / tn:.3f}, {t1 / tn / n:.3f}), "
                                  f"got {got!r}. Efficiency is the speedup divided by the number of devices.")
    return _report(True, "10 h -> 2.7 h on 4 GPUs is 3.7x at 93 % efficiency.")


@_safe_check
def check_rank_indices(fn: Callable[[int, int, int], list[int]]) -> CheckResult:
    """``fn(n_samples, world_size, rank)``: the sample indices ``DistributedSampler(shuffle=False)``
    gives ``rank``: every rank the same number, padding by wrapping around to the start."""
    from torch.utils.data import DistributedSampler

    for n, world, rank in [(8, 2, 0), (8, 2, 1), (10, 4, 3), (10, 4, 1), (3, 4, 3)]:
        got, err = _try(fn, n, world, rank, expect=_indices)
        if err:
            return _report(False, err)
        want = list(DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=False))
        if got != want:
            return _report(False, f"{n} samples, {world} ranks, rank {rank}: expected {want}, got {got!r}. Ranks take "
                                  "every world_size-th index starting at their rank, after the list is padded (by "
                                  "repeating its start) to a multiple of world_size.")
    return _report(True, "Equal shares keep the ranks in step: a rank with one batch more would wait in an "
                         "all-reduce nobody else joins.")


@_safe_check
def check_bubble(fn: Callable[[int, int], float]) -> CheckResult:
    """``fn(stages, micro_batches)``: the share of time a GPipe stage idles."""
    for p, m in [(2, 1), (4, 1), (4, 4), (8, 32), (1, 7)]:
        got, err = _try(fn, p, m, expect=_number)
        if err:
            return _report(False, err)
        want = (p - 1) / (m + p - 1)
        if not _close(got, want, 1e-9):
            return _report(False, f"{p} stages, {m} micro-batches: expected {want:.4f}, got {got!r}. "
                                  "The pipeline takes m + p - 1 slots to fill and drain; each stage works in m of "
                                  "them.")
    return _report(True, "Bubble (p - 1) / (m + p - 1): with m = 4p micro-batches it is under 20 %.")


# --------------------------------------------------------------------------- chapter 11, second edition


class _DoneWork:
    """What a simulated ``dist.all_reduce(..., async_op=True)`` returns: already finished."""

    def wait(self, *args, **kwargs):
        return True

    def is_completed(self):
        return True


class _TwoRanks:
    """Patch ``torch.distributed`` so that code written for a process group runs in this process as rank 0
    of 2 ranks. The other rank's gradients are ``OTHER`` times this rank's (its batch's loss is that many
    times larger), so ``all_reduce`` multiplies the tensor in place by ``1 + OTHER`` and records the
    message's bytes; ``broadcast`` and ``barrier`` do nothing. The average over the ranks is then
    ``(1 + OTHER) / 2`` times this rank's gradient: unlike with two identical ranks, a bucket never
    sent, or reduced but not copied back, leaves a gradient the check can tell from the average."""

    OTHER = 3

    def __init__(self):
        import torch.distributed as dist

        self.dist, self.messages, self.saved = dist, [], {}

    def __enter__(self):
        d = self.dist

        def all_reduce(tensor, op=None, group=None, async_op=False):
            self.messages.append(tensor.numel() * tensor.element_size())
            with torch.no_grad():
                tensor.mul_(1 + self.OTHER)
            return _DoneWork() if async_op else None

        fakes = {"all_reduce": all_reduce, "broadcast": lambda tensor, src=0, group=None, async_op=False: None,
                 "barrier": lambda *a, **k: None, "get_world_size": lambda group=None: 2,
                 "get_rank": lambda group=None: 0, "is_initialized": lambda: True}
        for name, fake in fakes.items():
            self.saved[name] = getattr(d, name)
            setattr(d, name, fake)
        return self

    def __exit__(self, *exc):
        for name, real in self.saved.items():
            setattr(self.dist, name, real)
        return False


def _bucket_model():
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 8))  # 6 tensors, 32 .. 16,384 bytes, 27,168 in all
    x, y = torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)
    return model, x, y


@_safe_check
def check_bucketed_data_parallel(cls) -> CheckResult:
    """``cls(module, bucket_bytes)``: a data-parallel wrapper (``forward`` calls the module; gradients averaged
    over the ranks by the end of backward, or after ``finish_gradients()`` if it has one) that packs the
    gradients into buckets of at most ``bucket_bytes`` (a tensor larger than that alone in its own) and
    sends one all-reduce per bucket. Run in this process as rank 0 of 2 simulated ranks (``torch.distributed``
    patched: call its functions as ``dist.all_reduce(...)``) whose other rank's gradients are 3 times this
    one's, so the averaged gradient must be twice one process's: a bucket never sent, or reduced and not
    copied back, or summed and not averaged, shows. Every gradient byte must travel in exactly one message."""
    import torch.nn.functional as F

    cap = 8192
    reference, x, y = _bucket_model()
    F.mse_loss(reference(x), y).backward()
    average = (1 + _TwoRanks.OTHER) / 2  # the mean over the two ranks, in units of this rank's gradient
    want = [average * p.grad for p in reference.parameters()]
    own = [p.grad.clone() for p in reference.parameters()]
    sizes = [p.numel() * p.element_size() for p in reference.parameters()]
    bound = 2 * -(-sum(sizes) // cap)  # next-fit packing never needs more than twice the optimum
    model, _, _ = _bucket_model()  # the same initial weights as the reference
    with _TwoRanks() as ranks:
        wrapped, err = _try(cls, model, cap)
        if err:
            return _report(False, err)
        if not isinstance(wrapped, torch.nn.Module):
            return _report(False, f"cls(module, bucket_bytes) should give an nn.Module, got {type(wrapped).__name__}")
        ranks.messages.clear()  # what the constructor sent (broadcasts are free here) does not count

        def step() -> None:  # the learner's forward, backward hooks and finish_gradients
            F.mse_loss(wrapped(x), y).backward()
            if hasattr(wrapped, "finish_gradients"):
                wrapped.finish_gradients()

        try:
            _, hint = _run_limited(step, what="Your wrapper's forward, backward or finish_gradients")
        except Exception as error:  # noqa: BLE001 - the learner's code
            return _report(False, f"forward/backward through your wrapper raised {type(error).__name__}: {error}")
        if hint:
            return _report(False, hint)
        messages = list(ranks.messages)
    got = [p.grad for p in wrapped.parameters()]  # the check passed a copy of the model to cls
    if len(got) != len(want):
        return _report(False, f"the wrapper has {len(got)} parameters where the module has {len(want)}: keep the "
                              "module as an attribute and add no parameters of your own")
    if any(g is None for g in got):
        return _report(False, "some parameters have no gradient after backward: the wrapper must leave every "
                              "gradient in p.grad (copy each bucket's reduced values back)")
    if not messages:
        return _report(False, "no all-reduce was sent: call dist.all_reduce on each bucket (as dist.all_reduce, so "
                              "that the check can see it)")

    def close(scale: float) -> list[bool]:
        return [torch.allclose(g, scale * w, rtol=1e-5, atol=1e-7) for g, w in zip(got, own)]

    if sum(messages) < sum(sizes):
        return _report(False, f"the all-reduces carried {sum(messages)} bytes where the gradients hold {sum(sizes)}: "
                              "some gradients were never sent. Send the last, partly filled bucket too, at the end of "
                              "backward (in finish_gradients, or when the last gradient arrives)")
    if sum(messages) > sum(sizes):
        return _report(False, f"the all-reduces carried {sum(messages)} bytes where the gradients hold {sum(sizes)}: "
                              "some gradients were sent twice. Empty the bucket once it is sent, and put each "
                              "gradient in one bucket only")
    if all(close(1 + _TwoRanks.OTHER)):
        return _report(False, "the gradients are the sum over the ranks, not their mean: all_reduce sums; divide "
                              "by dist.get_world_size() to average")
    if all(close(1.0)):
        return _report(False, "every gradient is still this rank's own, not the average over the ranks: the "
                              "all-reduce went to a copy (torch.cat makes one) that was never copied back into "
                              "p.grad. Copy each reduced bucket's slices back into the right p.grad")
    if not all(torch.allclose(g, w, rtol=1e-5, atol=1e-7) for g, w in zip(got, want)):
        ratio = got[0].flatten()[0] / own[0].flatten()[0]
        return _report(False, f"the gradients differ from the average over the ranks (first element "
                              f"{float(ratio):.3g}x this rank's, where the average is {average:g}x): check that "
                              "each gradient is copied into the bucket before the all-reduce and copied back "
                              "(averaged) into the right slice of the right p.grad after it")
    if len(messages) >= len(sizes):
        return _report(False, f"{len(messages)} all-reduces for {len(sizes)} gradient tensors: no bucketing yet. "
                              f"Pack gradients until the bucket would pass {cap} bytes, then send it as one message")
    if len(messages) > bound:
        return _report(False, f"{len(messages)} messages where {bound} at most are needed for {sum(sizes)} bytes in "
                              f"buckets of {cap}: fill each bucket before sending it")
    too_big = [m for m in messages if m > cap and m not in sizes]
    if too_big:
        return _report(False, f"a message of {too_big[0]} bytes passes the bucket cap of {cap}: close a bucket "
                              "before the tensor that would overflow it (only a single tensor larger than the cap "
                              "may go alone), and count bytes, numel() * element_size(), not elements")
    return _report(True, f"{len(messages)} messages ({', '.join(map(str, messages))} bytes) instead of {len(sizes)}, "
                         "and the gradients averaged over the ranks. DDP does the same with 25 MB buckets "
                         "(bucket_cap_mb), in the order backward produces the gradients, and starts each bucket's "
                         "all-reduce as soon as it is full, so communication overlaps the rest of backward.")


def _alpha_beta_timings(world: int, alpha: float, bandwidth: float, slow: int, g: torch.Generator) -> list[float]:
    """Ring all-reduce times of the sizes ``_FIT_SIZES`` as a busy machine measures them: +-3 % noise on
    every size, and the size at index ``slow`` timed 40 % slow (one repeat the machine interrupted)."""
    from gpuformer_lib.distributed import ring_allreduce_time

    return [ring_allreduce_time(s, world, alpha, bandwidth)
            * (1 + 0.03 * (2 * float(torch.rand((), generator=g)) - 1) + (0.4 if i == slow else 0.0))
            for i, s in enumerate(_FIT_SIZES)]


_FIT_SIZES = [2**k for k in range(10, 25, 2)]  # 1 KiB .. 16 MiB
_FIT_CASES = ((2, 250e-6, 1.5e9, len(_FIT_SIZES) - 1), (8, 4e-6, 3.7e11, 0), (4, 40e-6, 2.0e10, 0))
"""(world size, alpha, bus bandwidth, the index of the slow timing): the slowest link of a gloo pair with the
largest message timed slow; NVLink-like and PCIe-like rings with the smallest message timed slow."""


@_safe_check
def check_alpha_beta_fit(fn: Callable) -> CheckResult:
    """``fn(nbytes, seconds, world_size) -> (alpha, bandwidth)``: the ring model's latency (s) and bandwidth
    (bytes/s) fitted to measured all-reduce times of several message sizes.

    Graded on timings made from known alpha and B with a busy machine's noise: a few percent on every size,
    and one timing 40 % slow (the largest message's in one case, the smallest's in the others). A least-squares
    fit of all the sizes, weighted by 1 / t, recovers B within 15 % and alpha within 30 %; a line through the
    smallest and largest message, or an unweighted fit, follows the slow timing out of that band. Each usual
    mistake gets its own hint: the order of the pair, B upside down or in GB/s, alpha in µs, the 2 (N - 1) / N
    left out of the bytes, the intercept 2 (N - 1) alpha taken for alpha."""
    g = torch.Generator().manual_seed(11)
    for world, alpha, bw, slow in _FIT_CASES:
        times = _alpha_beta_timings(world, alpha, bw, slow, g)
        got, err = _try(fn, list(_FIT_SIZES), list(times), world, expect=_numbers(2, "a pair (alpha, bandwidth)"))
        if err:
            return _report(False, err)
        a, b = got
        share = 2 * (world - 1) / world  # of the bytes each rank sends, and receives
        near = lambda value, true, rel: value > 0 and abs(value / true - 1) <= rel  # noqa: E731
        said = f"{world} ranks, true alpha = {alpha * 1e6:.3g} µs and B = {bw:.3g} B/s: got ({a:.3g}, {b:.3g})."
        if near(a, bw, 0.15) and near(b, alpha, 0.3):
            return _report(False, f"{said} The pair is the wrong way round: return (alpha, bandwidth), alpha first.")
        if b > 0 and near(1 / b, bw, 0.15) and not near(b, bw, 0.15):
            return _report(False, "the bandwidth is upside down: the slope of time against bytes is 2 (N - 1) / N / B, "
                                  "seconds per byte; B is its inverse, in bytes per second")
        if near(b * 1e9, bw, 0.15):
            return _report(False, f"{said} B is in bytes per second, not GB/s: do not divide by 1e9.")
        if world > 2 and near(b * share, bw, 0.15):
            return _report(False, f"{said} B is too low by 2 (N - 1) / N = {share:.3g}: each rank sends 2 (N - 1) / N "
                                  "of the bytes, so t = 2 (N - 1) alpha + 2 (N - 1) / N * S / B; fit the slope "
                                  "against 2 (N - 1) / N * S, not S.")
        if not near(b, bw, 0.15):
            hint = ("One slow timing moved your line: a line through the smallest and largest message lets those two "
                    "points decide, and an unweighted fit lets the largest messages decide. Fit all the sizes by "
                    "least squares, weighting each point by 1 / t (relative errors count alike)."
                    if b > 0 and abs(b / bw - 1) < 0.6
                    else "Did you include the 2 (N - 1) / N of the bytes each rank sends? t = 2 (N - 1) alpha + "
                         "2 (N - 1) / N * S / B.")
            return _report(False, f"{world} ranks, true B = {bw:.3g} B/s: got {b:.3g}. {hint}")
        if near(a, alpha * 1e6, 0.3):
            return _report(False, f"{said} alpha is in seconds, not microseconds: do not multiply by 1e6.")
        if near(a, 2 * (world - 1) * alpha, 0.3):
            return _report(False, f"{world} ranks, true alpha = {alpha * 1e6:.3g} µs: got {a * 1e6:.3g} µs, "
                                  f"2 (N - 1) = {2 * (world - 1)} times too much. The intercept of the fit is "
                                  "2 (N - 1) alpha (every step of the ring pays alpha), not alpha: divide it by "
                                  "2 (N - 1).")
        if not abs(a - alpha) <= 0.3 * alpha:
            return _report(False, f"{world} ranks, true alpha = {alpha * 1e6:.3g} µs: got {a * 1e6:.3g} µs. One slow "
                                  "timing moved your intercept: a line through two points lets them decide, and an "
                                  "ordinary least-squares line lets the large messages swamp the intercept. Fit all "
                                  "the sizes, weighting each point by 1 / t; the intercept is 2 (N - 1) alpha.")
    return _report(True, "alpha and B from timings, with one slow timing among them. On GPUs NCCL-tests reports the "
                         "same fit the other way round: the time of small messages (latency) and the bus bandwidth "
                         "algbw x 2 (N - 1) / N of large ones, comparable with the link's peak whatever N is.")


def check_bucket_count_prediction(predicted, measured: int, *, total_bytes: int, bucket_bytes: int, n_tensors: int):
    """Predict DDP's all-reduce messages per step (after its first): graded against the bucket model
    ceil(total_bytes / bucket_bytes) exactly (a count), not against the count a communication hook
    measured (``distributed.ddp_messages``), which is shown beside it: a band around that count would pass
    the model's neighbours (5 for 4). The usual mistakes get their own hints: one message per tensor, the
    division rounded down, not rounded at all, or rounded up and then one more added for the remainder, and
    the cap left in MiB. ``total_bytes``, ``bucket_bytes`` and ``n_tensors`` are the notebook's model's."""
    import math

    from gpuformer_lib.exercises.predictions import grade_model

    if min(total_bytes, bucket_bytes, n_tensors) <= 0:
        raise ValueError(f"total_bytes, bucket_bytes and n_tensors are positive, got {total_bytes!r}, "
                         f"{bucket_bytes!r}, {n_tensors!r}")
    exact = total_bytes / bucket_bytes
    right = math.ceil(exact)
    rel = 0.01 / right  # a count: only the whole number passes (within 0.01)
    wrong = {
        "one message per gradient tensor": (
            n_tensors, f"DDP does not send one message per tensor ({n_tensors} here): it packs gradients into "
                       f"buckets of bucket_cap_mb ({bucket_bytes:,} bytes) and sends one all-reduce per bucket."),
        "the division rounded down": (
            math.floor(exact), "Rounded down: a bucket is closed once it reaches the cap and the remainder makes "
                               f"a message of its own, so round {total_bytes:,} / {bucket_bytes:,} up."),
        "the division not rounded": (
            exact, f"A number of messages is a whole number: round {total_bytes:,} / {bucket_bytes:,} up (the "
                   "last, partly filled bucket is one more message)."),
        "the division rounded up, plus one for the remainder": (
            right + 1, "Rounding up already counts the last, partly filled bucket: do not add one more for the "
                       "remainder."),
        "the cap left in MiB, not converted to bytes": (
            total_bytes / (bucket_bytes / 2**20), "The cap is bucket_cap_mb MiB: convert it to bytes (x 2**20) "
                                                  "before dividing the gradient bytes by it."),
    }
    wrong = {name: (value, hint) for name, (value, hint) in wrong.items()
             if value > 0 and abs(value / right - 1) > 2.5 * rel}
    return grade_model(
        predicted, right, quantity="all-reduce messages per DDP step", unit="messages", wrong=wrong, rel=rel,
        too_high=(f"DDP packs the gradients ({total_bytes:,} bytes in {n_tensors} tensors) into buckets of "
                  f"{bucket_bytes:,} bytes: about {total_bytes:,} / {bucket_bytes:,} messages, rounded up."),
        too_low=("Each bucket holds at most about the cap: the gradient bytes over the cap, rounded up, and tensors "
                 "are not split across buckets."),
        measured=measured, measured_by="a DDP communication hook counted",
        why_close=("The count is the gradient bytes over the cap, rounded up: a bucket closes once its tensors reach "
                   "the cap (so buckets run slightly over it), and the last one holds the remainder. The first step "
                   "is different: DDP rebuilds its buckets after the first iteration, in the order the gradients "
                   "arrived."))
