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


class _TwoIdenticalRanks:
    """Patch ``torch.distributed`` so that code written for a process group runs in this process as rank 0
    of 2 ranks holding the same data: ``all_reduce`` sums (doubles) the tensor in place and records the
    message's bytes; ``broadcast`` and ``barrier`` do nothing."""

    def __init__(self):
        import torch.distributed as dist

        self.dist, self.messages, self.saved = dist, [], {}

    def __enter__(self):
        d = self.dist

        def all_reduce(tensor, op=None, group=None, async_op=False):
            self.messages.append(tensor.numel() * tensor.element_size())
            with torch.no_grad():
                tensor.mul_(2)
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
                                torch.nn.Linear(64, 8))  # 6 tensors, 1,664 .. 16,384 bytes, 28,960 in all
    x, y = torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)
    return model, x, y


@_safe_check
def check_bucketed_data_parallel(cls) -> CheckResult:
    """``cls(module, bucket_bytes)``: a data-parallel wrapper (``forward`` calls the module; gradients averaged
    over the ranks by the end of backward, or after ``finish_gradients()`` if it has one) that packs the
    gradients into buckets of at most ``bucket_bytes`` (a tensor larger than that alone in its own) and
    sends one all-reduce per bucket. Run in this process as one of 2 simulated ranks holding the same data
    (``torch.distributed`` patched: call its functions as ``dist.all_reduce(...)``), so the averaged gradient
    must equal one process's gradient."""
    import torch.nn.functional as F

    cap = 8192
    reference, x, y = _bucket_model()
    F.mse_loss(reference(x), y).backward()
    want = [p.grad.clone() for p in reference.parameters()]
    sizes = [p.numel() * p.element_size() for p in reference.parameters()]
    bound = 2 * -(-sum(sizes) // cap)  # next-fit packing never needs more than twice the optimum
    model, _, _ = _bucket_model()  # the same initial weights as the reference
    with _TwoIdenticalRanks() as ranks:
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
    ratio = got[0].flatten()[0] / want[0].flatten()[0]
    if all(torch.allclose(g, 2 * w, rtol=1e-5, atol=1e-7) for g, w in zip(got, want)):
        return _report(False, "the gradients are twice one process's: all_reduce sums over the ranks; divide by "
                              "dist.get_world_size() to average")
    if not all(torch.allclose(g, w, rtol=1e-5, atol=1e-7) for g, w in zip(got, want)):
        return _report(False, f"the gradients differ from one process's (first element {float(ratio):.3g}x): check "
                              "that each gradient is copied into the bucket before the all-reduce and copied back "
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
                              "may go alone)")
    return _report(True, f"{len(messages)} messages ({', '.join(map(str, messages))} bytes) instead of {len(sizes)}, "
                         "and the gradients of one process. DDP does the same with 25 MB buckets (bucket_cap_mb), "
                         "in the order backward produces the gradients, and starts each bucket's all-reduce as "
                         "soon as it is full, so communication overlaps the rest of backward.")


@_safe_check
def check_alpha_beta_fit(fn: Callable) -> CheckResult:
    """``fn(nbytes, seconds, world_size) -> (alpha, bandwidth)``: the ring model's latency (s) and bandwidth
    (bytes/s) fitted to measured all-reduce times of several message sizes."""
    from gpuformer_lib.distributed import ring_allreduce_time

    g = torch.Generator().manual_seed(11)
    sizes = [2**k for k in range(10, 25, 2)]
    for world, alpha, bw in ((2, 250e-6, 1.5e9), (8, 4e-6, 3.7e11), (4, 40e-6, 2.0e10)):
        times = [ring_allreduce_time(s, world, alpha, bw) * (1 + 0.1 * float(torch.rand((), generator=g)))
                 for s in sizes]
        got, err = _try(fn, list(sizes), list(times), world, expect=_numbers(2, "a pair (alpha, bandwidth)"))
        if err:
            return _report(False, err)
        a, b = got
        if b > 0 and _close(1 / b, bw, 0.15) and not _close(b, bw, 0.15):
            return _report(False, "the bandwidth is upside down: the slope of time against bytes is 2 (N - 1) / N / B, "
                                  "seconds per byte; B is its inverse, in bytes per second")
        if not (0 < b and abs(b / bw - 1) <= 0.15):
            hint = ("Fitting through the smallest and largest message only lets one noisy point decide; fit all of "
                    "them (least squares), weighting by 1 / t so small messages count." if abs(b / bw - 1) < 0.6
                    else "Did you include the 2 (N - 1) / N of the bytes each rank sends? t = 2 (N - 1) alpha + "
                         "2 (N - 1) / N * S / B.")
            return _report(False, f"{world} ranks, true B = {bw:.3g} B/s: got {b:.3g}. {hint}")
        if not abs(a - alpha) <= 0.3 * alpha:
            return _report(False, f"{world} ranks, true alpha = {alpha * 1e6:.3g} µs: got {a * 1e6:.3g} µs. The "
                                  "intercept of the fit is 2 (N - 1) alpha (every step of the ring pays alpha), not "
                                  "alpha; and an ordinary least-squares line lets the large messages swamp the "
                                  "intercept: weight each point by 1 / t.")
    return _report(True, "alpha and B from timings. On GPUs NCCL-tests reports the same fit the other way round: "
                         "the time of small messages (latency) and the bus bandwidth algbw x 2 (N - 1) / N of large "
                         "ones, comparable with the link's peak whatever N is.")


def check_bucket_count_prediction(predicted, measured: int, *, total_bytes: int, bucket_bytes: int, n_tensors: int):
    """Grade a predicted number of all-reduce messages per step of DDP (after its first) against the number a
    communication hook counted (``distributed.ddp_messages``)."""
    from gpuformer_lib.exercises.predictions import grade_prediction

    return grade_prediction(
        predicted, measured, quantity="all-reduce messages per DDP step", unit="messages", within=1.3,
        measured_by="a DDP communication hook counted",
        too_high=(f"DDP does not send one message per tensor ({n_tensors} here): it packs gradients into buckets of "
                  f"bucket_cap_mb ({bucket_bytes:,} bytes), so about {total_bytes:,} / {bucket_bytes:,} messages, "
                  "rounded up."),
        too_low=("A bucket is closed once it reaches the cap and the remainder makes a message of its own: round "
                 f"{total_bytes:,} / {bucket_bytes:,} up, not down; and tensors are not split across buckets."),
        why_close=("The count is the gradient bytes over the cap, rounded up: a bucket closes once its tensors reach "
                   "the cap (so buckets run slightly over it), and the last one holds the remainder. The first step "
                   "is different: DDP rebuilds its buckets after the first iteration, in the order the gradients "
                   "arrived."))
