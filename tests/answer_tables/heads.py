"""Chapter 4: grouped-query attention's parameters, the KV cache's bytes, the speedup a cache gives a decoding step."""

import functools

import torch

from answer_tables import Table, Wrong
from gpuformer_lib.exercises import heads
from gpuformer_lib.kv_cache import CachedDecoder, DecoderShape


def gqa_parameters(d_model, n_heads, n_kv_heads, bias):
    """The chapter's solution."""
    kv = n_kv_heads * (d_model // n_heads)  # width of W_k and of W_v
    weights = d_model * d_model + 2 * d_model * kv + d_model * d_model  # W_q, W_k, W_v, W_o
    return weights + ((d_model + 2 * kv + d_model) if bias else 0)


@functools.cache
def kv_cache_measured():
    """What exercise 4.3's cell reads from the cache tensors (deterministic: sizes, not timings)."""
    shape = dict(vocab_size=64, d_model=256, n_heads=8, n_layers=6, max_len=1024)
    return {name: CachedDecoder(DecoderShape(**shape, n_kv_heads=n_kv)).to(torch.bfloat16).new_cache(batch=2).nbytes
            for name, n_kv in (("MHA", 8), ("GQA-4", 4), ("MQA", 1))}


def kv_cache_bytes(element=2, layers=6, kv_and_v=2, heads=None):
    """Exercise 4.3's caches by the formula 2 * n_layers * n_kv_heads * hs * T * B * bytes, with one term changed."""
    return {name: kv_and_v * layers * (heads or n_kv) * (256 // 8) * 1024 * 2 * element
            for name, n_kv in (("MHA", 8), ("GQA-4", 4), ("MQA", 1))}


# exercise 4.4's inputs, as its cell printed them on a 2-core CPU: (FLOPs, calls, elements) with and without the
# cache, and (FLOP/s, seconds per element, seconds per call); fixed numbers, so no row depends on a timing
WORK_WITH, WORK_WITHOUT = (8.65e6, 197, 8.97e4), (2.21e9, 148, 2.35e7)
COSTS = (103e9, 0.65e-9, 2.6e-6)
MODEL = heads.decode_speedup_model(WORK_WITH, WORK_WITHOUT, COSTS)


def grade_decode(answer):
    return heads.check_decode_speedup_prediction(answer, WORK_WITH, WORK_WITHOUT, COSTS, context=256, measured=35.4)


def _seconds(work, flops=True, elements=True, calls=True):
    return ((work[0] / COSTS[0] if flops else 0) + (work[2] * COSTS[1] if elements else 0)
            + (work[1] * COSTS[2] if calls else 0))


TABLES = [
    Table(
        "check_gqa_parameters", heads.check_gqa_parameters,
        right=(gqa_parameters,
               lambda C, H, Hkv, b: 2 * C * C + 2 * C * (C // H * Hkv) + (2 * C + 2 * (C // H * Hkv) if b else 0)),
        wrong=(Wrong("MHA's full key/value projections", lambda C, H, Hkv, b: gqa_parameters(C, H, H, b),
                     ("that is MHA",)),
               Wrong("no output projection", lambda C, H, Hkv, b: gqa_parameters(C, H, Hkv, b) - C * C - (C if b else 0),
                     ("output projection",)),
               Wrong("no biases", lambda C, H, Hkv, b: gqa_parameters(C, H, Hkv, False), ("bias",)),
               Wrong("key/value heads as wide as C",
                     lambda C, H, Hkv, b: 2 * C * C + 2 * C * Hkv * C + ((2 * C + 2 * Hkv * C) if b else 0),
                     ("hs = C / n_heads",)),
               Wrong("one key/value projection",
                     lambda C, H, Hkv, b: gqa_parameters(C, H, Hkv, b) - C * Hkv * (C // H) - (Hkv * (C // H) if b
                                                                                               else 0),
                     ("one key/value projection", "W_k and W_v")),
               Wrong("not a function", 4 * 768 * 768, ("Pass your function",))),
    ),
    Table(
        "check_kv_cache_prediction", lambda answer: heads.check_kv_cache_prediction(answer, kv_cache_measured()),
        right=(kv_cache_bytes(), {"MHA": 1.26e7, "GQA-4": 6.29e6, "MQA": 1.57e6}),
        wrong=(Wrong("float32's 4 bytes", kv_cache_bytes(element=4), ("2 bytes per element", "not 4")),
               Wrong("the query heads for every configuration", kv_cache_bytes(heads=8),
                     ("key/value heads only", "not the query heads")),
               Wrong("K or V only", kv_cache_bytes(kv_and_v=1), ("a K and a V",)),
               Wrong("one layer", kv_cache_bytes(layers=1), ("every layer has its own cache",)),
               Wrong("GiB", {k: v / 2**30 for k, v in kv_cache_bytes().items()}, ("bytes, not GiB",)),
               Wrong("a number, not a dict", 12_582_912, ("Predict a dict",))),
    ),
    Table(
        "check_decode_speedup_prediction", grade_decode,
        right=(MODEL, round(MODEL), _seconds(WORK_WITHOUT) / _seconds(WORK_WITH)),
        wrong=(Wrong("the FLOP ratio", WORK_WITHOUT[0] / WORK_WITH[0], ("FLOP ratio", "fixed cost")),
               Wrong("the context length", 256, ("fixed cost",)),
               Wrong("no per-element term", _seconds(WORK_WITHOUT, elements=False) / _seconds(WORK_WITH, elements=False),
                     ("per-element cost", "elements")),
               Wrong("the ratio of calls", WORK_WITHOUT[1] / WORK_WITH[1], ("calls alone",)),
               Wrong("upside down", 1 / MODEL, ("upside down", "slower")),
               Wrong("x3 band's 85", 85, ("too high", "calls")),
               Wrong("a word", "fast", ("Predict a number",))),
    ),
]
