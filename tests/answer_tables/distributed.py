"""Chapter 11: a bucketed data-parallel wrapper, the alpha-beta fit of all-reduce timings, DDP's message count."""

import math

import numpy as np
import torch
import torch.distributed as dist

from answer_tables import Table, Wrong
from gpuformer_lib.exercises import distributed

# --------------------------------------------------------------------------- 11.1: buckets for NaiveDataParallel


class Bucketed(torch.nn.Module):
    """The chapter's solution: a bucket is sent before the gradient that would overflow it, and the last
    one in ``finish_gradients``; each reduced bucket is averaged and copied back. The class attributes
    are the switches each wrong answer below turns."""

    average = True  # divide the summed bucket by the world size
    copy_back = True  # copy the reduced bucket back into p.grad
    send_last = True  # send the last, partly filled bucket in finish_gradients
    close_before = True  # send the bucket before the gradient that would overflow it (else after adding it)
    count = "bytes"  # what the cap counts: "bytes" or "elements"

    def __init__(self, module, bucket_bytes):
        super().__init__()
        self.module, self.bucket_bytes, self.bucket = module, bucket_bytes, []
        for p in module.parameters():
            dist.broadcast(p.data, 0)
            p.register_post_accumulate_grad_hook(self._ready)

    def _size(self, p):
        return p.grad.numel() * (p.grad.element_size() if self.count == "bytes" else 1)

    def _ready(self, p):
        filled = sum(self._size(q) for q in self.bucket)
        if self.close_before:
            if self.bucket and filled + self._size(p) > self.bucket_bytes:
                self._send()
            self.bucket.append(p)
        else:
            self.bucket.append(p)
            if filled + self._size(p) >= self.bucket_bytes:
                self._send()

    def _send(self):
        if not self.bucket:
            return
        flat = torch.cat([q.grad.flatten() for q in self.bucket])
        dist.all_reduce(flat)
        if self.average:
            flat /= dist.get_world_size()
        if self.copy_back:
            offset = 0
            for q in self.bucket:
                q.grad.copy_(flat[offset : offset + q.numel()].view_as(q))
                offset += q.numel()
        self.bucket = []

    def finish_gradients(self):
        if self.send_last:
            self._send()

    def forward(self, *args):
        return self.module(*args)


def variant(**switches):
    return type("BucketedDataParallel", (Bucketed,), switches)


class PerTensor(torch.nn.Module):
    """NaiveDataParallel: one averaged all-reduce per gradient, in a hook."""

    def __init__(self, module, bucket_bytes):
        super().__init__()
        self.module = module
        for p in module.parameters():
            p.register_post_accumulate_grad_hook(self._ready)

    def _ready(self, p):
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()

    def forward(self, *args):
        return self.module(*args)


class OneBucket(torch.nn.Module):
    """Every gradient in one message at the end, whatever the cap."""

    def __init__(self, module, bucket_bytes):
        super().__init__()
        self.module = module

    def finish_gradients(self):
        params = list(self.module.parameters())
        flat = torch.cat([p.grad.flatten() for p in params])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()

    def forward(self, *args):
        return self.module(*args)


# --------------------------------------------------------------------------- 11.2: alpha and B from timings


def weighted_fit(nbytes, seconds, world_size, *, factor=True, weight=True, intercept=True):
    """The chapter's solution (least squares, each point weighted by 1 / t); the switches are the mistakes."""
    s, t, n = np.asarray(nbytes, float), np.asarray(seconds, float), world_size
    share = 2 * (n - 1) / n if factor else 1.0
    design = np.stack([np.full_like(s, 2 * (n - 1) if intercept else 1.0), share * s], axis=1)
    w = 1 / t if weight else np.ones_like(t)
    (alpha, inverse_bandwidth), *_ = np.linalg.lstsq(design * w[:, None], t * w, rcond=None)
    return max(float(alpha), 0.0), 1 / float(inverse_bandwidth)


def two_point_fit(nbytes, seconds, world_size):
    """A line through the smallest and the largest message."""
    n = world_size
    share = 2 * (n - 1) / n
    inverse_bandwidth = (seconds[-1] - seconds[0]) / (nbytes[-1] - nbytes[0]) / share
    alpha = (seconds[0] - share * nbytes[0] * inverse_bandwidth) / (2 * (n - 1))
    return alpha, 1 / inverse_bandwidth


def np_solution(nbytes, seconds, world_size):
    """The notebook's solution, as written there (each row of the design divided by t)."""
    s, t, n = np.asarray(nbytes, float), np.asarray(seconds, float), world_size
    design = np.stack([np.full_like(s, 2 * (n - 1)), 2 * (n - 1) / n * s], axis=1) / t[:, None]
    (alpha, inverse_bandwidth), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    return max(alpha, 0.0), 1 / inverse_bandwidth


# --------------------------------------------------------------------------- 11.3: DDP's messages per step

TOTAL_BYTES, BUCKET_BYTES, N_TENSORS = 1_718_272, 524_288, 27  # the notebook's model, bucket_cap_mb = 0.5


def bucket_count(predicted):
    return distributed.check_bucket_count_prediction(predicted, 4, total_bytes=TOTAL_BYTES,
                                                     bucket_bytes=BUCKET_BYTES, n_tensors=N_TENSORS)


TABLES = [
    Table(
        "check_bucketed_data_parallel", distributed.check_bucketed_data_parallel,
        right=(Bucketed,),
        wrong=(Wrong("summed, not averaged", variant(average=False), ("sum over the ranks", "get_world_size")),
               Wrong("reduced copy never copied back", variant(copy_back=False), ("copied back", "torch.cat")),
               Wrong("last bucket never sent", variant(send_last=False), ("never sent", "last")),
               Wrong("one all-reduce per tensor", PerTensor, ("no bucketing",)),
               Wrong("one bucket for everything", OneBucket, ("passes the bucket cap",)),
               Wrong("bucket closed after it overflows", variant(close_before=False), ("passes the bucket cap",)),
               Wrong("cap counted in elements", variant(count="elements"), ("passes the bucket cap", "not elements"))),
    ),
    Table(
        "check_alpha_beta_fit", distributed.check_alpha_beta_fit,
        right=(weighted_fit, np_solution),
        wrong=(Wrong("unweighted least squares", lambda *a: weighted_fit(*a, weight=False), ("weighting", "1 / t")),
               Wrong("a line through two points", two_point_fit, ("smallest and largest", "least squares")),
               Wrong("bytes not scaled by 2 (N - 1) / N", lambda *a: weighted_fit(*a, factor=False),
                     ("2 (N - 1) / N", "too low")),
               Wrong("intercept taken for alpha", lambda *a: weighted_fit(*a, intercept=False),
                     ("2 (N - 1) alpha", "divide it by")),
               Wrong("bandwidth upside down", lambda *a: (weighted_fit(*a)[0], 1 / weighted_fit(*a)[1]),
                     ("upside down",)),
               Wrong("bandwidth in GB/s", lambda *a: (weighted_fit(*a)[0], weighted_fit(*a)[1] / 1e9),
                     ("bytes per second", "GB/s")),
               Wrong("alpha in microseconds", lambda *a: (weighted_fit(*a)[0] * 1e6, weighted_fit(*a)[1]),
                     ("seconds, not microseconds",)),
               Wrong("pair swapped", lambda *a: weighted_fit(*a)[::-1], ("wrong way round",))),
    ),
    Table(
        "check_bucket_count_prediction", bucket_count,
        right=(math.ceil(TOTAL_BYTES / BUCKET_BYTES), 4.0),
        wrong=(Wrong("rounded up, plus one for the remainder", 5, ("already counts", "last")),
               Wrong("rounded down", 3, ("rounded down", "round")),
               Wrong("not rounded", TOTAL_BYTES / BUCKET_BYTES, ("whole number",)),
               Wrong("one message per tensor", N_TENSORS, ("one message per tensor",)),
               Wrong("cap left in MiB", TOTAL_BYTES / 0.5, ("convert it to bytes",))),
    ),
]
