"""Checks for the exercises on heads: grouped-query attention's parameters, the KV cache's size, decode speed.

Two of them are predictions graded against a model (:func:`gpuformer_lib.exercises.predictions.grade_model`):
the learner predicts the bytes of a KV cache, exact by its formula and read back from the cache's tensors, or
the speedup the cache gives a decoding step, graded against the cost model built from the step's counted work
and the device's measured costs, with the timed speedup shown beside it, not graded (its repeats spread by far
more than separates the right model from the wrong ones). Each names the plausible mistakes it recognises.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

from gpuformer_lib.exercises._answers import _number
from gpuformer_lib.exercises._core import CheckResult, _describe, _report, _safe_check, _try
from gpuformer_lib.exercises.predictions import grade_model, own_result


def _gqa_parameters(C: int, H: int, Hkv: int, bias: bool) -> int:
    kv = Hkv * (C // H)
    return C * C + 2 * C * kv + C * C + ((C + 2 * kv + C) if bias else 0)


@_safe_check
def check_gqa_parameters(fn: Callable[[int, int, int, bool], int]) -> CheckResult:
    """``fn(d_model, n_heads, n_kv_heads, bias)``: parameters of grouped-query attention (W_q, W_k, W_v,
    W_o and biases), where W_k and W_v map C to n_kv_heads * hs only."""
    for C, H, Hkv, bias in ((512, 8, 2, True), (768, 12, 12, False), (64, 8, 1, True), (256, 8, 4, False)):
        got, err = _try(fn, C, H, Hkv, bias, expect=_number)
        if err:
            return _report(False, err)
        want = _gqa_parameters(C, H, Hkv, bias)
        if got == want:
            continue
        if Hkv != H and got == _gqa_parameters(C, H, H, bias):
            return _report(False, f"For n_kv_heads={Hkv} of {H} you counted full C x C key and value projections "
                                  "(that is MHA): W_k and W_v map C to n_kv_heads * hs = n_kv_heads * C / n_heads.")
        if Hkv != H and got == _gqa_parameters(C, H, Hkv, bias) - C * C - (C if bias else 0):
            return _report(False, "You left out the output projection W_o (C x C, plus a bias).")
        if bias and got == _gqa_parameters(C, H, Hkv, False):
            return _report(False, "With bias=True each projection also has a bias: C for W_q and W_o, "
                                  "n_kv_heads * hs for W_k and for W_v.")
        kv = Hkv * (C // H)
        if got == C * C + 2 * C * kv + (C + 2 * kv if bias else 0):
            return _report(False, "You counted W_q, W_k and W_v; add the output projection W_o (C x C).")
        if Hkv != H and got == 2 * C * C + 2 * C * Hkv * C + ((2 * C + 2 * Hkv * C) if bias else 0):
            return _report(False, f"W_k and W_v map C to n_kv_heads * hs, with hs = C / n_heads = {C // H}, not to "
                                  "n_kv_heads * C: a key/value head is as wide as a query head.")
        if got == _gqa_parameters(C, H, Hkv, bias) - C * kv - (kv if bias else 0):
            return _report(False, "You counted one key/value projection; there are two, W_k and W_v "
                                  "(C x n_kv_heads * hs each).")
        return _report(False, f"For d_model={C}, n_heads={H}, n_kv_heads={Hkv}, bias={bias} expected {want:,}, "
                              f"got {got!r}. Count W_q (C x C), W_k and W_v (C x n_kv_heads*hs each), W_o (C x C).")
    return _report(True, "2 C^2 + 2 C * n_kv_heads * hs (+ biases): MQA and GQA shrink only the key and value "
                         "projections, so MQA removes up to about half of the attention layer's parameters, but "
                         "attention is only a third of a block (4 C^2 of 12 C^2 with a 4C MLP), so a block shrinks "
                         "by about 15 % and the whole model, embeddings included, by less (about 10 % of GPT-2's "
                         "124 M); the KV cache shrinks n_heads / n_kv_heads times.")


KV_CACHE_REL = 0.02
"""A predicted cache size passes within 2 % of the bytes its tensors hold (rounding; the formula is exact)."""


def _distinct(right: float, wrong: dict[str, tuple[float, str]], rel: float) -> dict[str, tuple[float, str]]:
    """The wrong models that give a positive value more than ``2 * rel`` from ``right``: one that gives the same
    number as the right model is no mistake on this configuration (and :func:`grade_model` would refuse it)."""
    return {name: (value, hint) for name, (value, hint) in wrong.items()
            if value > 0 and abs(value / right - 1) > 2 * rel}


def check_kv_cache_prediction(predicted: Mapping[str, float], measured: Mapping[str, float]) -> CheckResult:
    """Grade predicted KV-cache bytes (one number per configuration, e.g. ``{"MHA": ..., "GQA-4": ...,
    "MQA": ...}``) against the bytes read from the preallocated cache tensors, which are exactly the formula's
    2 * n_layers * n_kv_heads * hs * T * B * bytes per element: each must be within 2 % (rounding). A
    prediction that one plausible mistake gives (4-byte elements, K or V only, the query heads counted, GiB or
    MB instead of bytes) gets the hint that names it. The largest cache in ``measured`` is taken as the one with a
    key/value head per query head, to recognise the query heads counted where there are fewer key/value heads."""
    if not isinstance(predicted, Mapping):
        return own_result(False, f"Predict a dict {{configuration: bytes}}, not {_describe(predicted)}.")
    missing = [name for name in measured if name not in predicted]
    if missing:
        return own_result(False, f"Predict a number of bytes for every configuration; missing: {', '.join(missing)}.",
                          not_attempted=not predicted)
    most = max(measured.values())
    for name, nbytes in measured.items():
        wrong = {
            "counting the query heads": (
                most,
                f"The {name} cache stores its key/value heads only, not the query heads: n_kv_heads * hs per "
                "token, layer and K or V, so it is n_heads / n_kv_heads times smaller than MHA's."),
            "4 bytes per element": (
                2 * nbytes,
                "Too high by 2: the cache is in the model's dtype, bfloat16 here, 2 bytes per element, not 4 "
                "(float32)."),
            "half of the cache": (
                nbytes / 2,
                "Too low by 2: there is a K and a V for every layer, head and token (count both), each element "
                "is 2 bytes (bytes, not elements), and the batch is 2."),
            "GiB instead of bytes": (nbytes / 2**30, "Give bytes, not GiB: multiply by 2**30."),
            "MiB instead of bytes": (nbytes / 2**20, "Give bytes, not MiB: multiply by 2**20."),
            "MB instead of bytes": (nbytes / 1e6, "Give bytes, not MB: multiply by 10**6."),
        }
        result = grade_model(
            predicted[name], nbytes, quantity=f"the {name} KV cache", unit="bytes", rel=KV_CACHE_REL,
            wrong=_distinct(nbytes, wrong, KV_CACHE_REL),
            too_high="Count 2 (K and V) * n_layers * n_kv_heads * hs * T * B * bytes per element: the key/value "
                     "heads, not the query heads, and 2 bytes per bfloat16 element.",
            too_low="Count 2 (K and V) * n_layers * n_kv_heads * hs * T * B * bytes per element: every layer has "
                    "its own cache, preallocated for all max_len tokens of the batch.",
            why_close="The formula is exact for a preallocated cache: 2 * n_layers * n_kv_heads * hs * T * B * "
                      "bytes per element.")
        if not result:
            return result
    return own_result(True, "All three sizes match the tensors. The cache scales with n_kv_heads: MQA's is "
                            "n_heads times smaller than MHA's, and GQA sits in between.")


DECODE_REL = 0.05
"""A predicted speedup passes within 5 % of the cost model's (rounding: the model's inputs are given)."""


def _step_seconds(work: Sequence[float], costs: Sequence[float], *, flops: bool = True, elements: bool = True,
                  calls: bool = True) -> float:
    """The cost model of one decoding step: FLOPs / FLOP rate + elements * cost per element + calls * cost per
    call, with any of the three terms left out (to name the mistake of leaving it out)."""
    n_flops, n_calls, n_elements = work
    rate, per_element, per_call = costs
    return ((n_flops / rate if flops else 0.0) + (n_elements * per_element if elements else 0.0)
            + (n_calls * per_call if calls else 0.0))


def decode_speedup_model(work_with: Sequence[float], work_without: Sequence[float],
                         costs: Sequence[float]) -> float:
    """The speedup of one decoding step from the KV cache that the cost model gives: (time without) / (time
    with), each time FLOPs / rate + elements * cost per element + calls * cost per call. ``work_with`` and
    ``work_without`` are ``(FLOPs, PyTorch calls, elements)`` from ``kv_cache.decode_step_work``; ``costs`` is
    ``(FLOP rate in FLOP/s, seconds per element, seconds per call)``, measured on the device."""
    for name, values in (("work_with", work_with), ("work_without", work_without), ("costs", costs)):
        if len(values) != 3 or not all(isinstance(v, (int, float)) and v >= 0 for v in values):
            raise ValueError(f"{name} is three non-negative numbers, got {values!r}")
    if min(costs[0], costs[1], costs[2]) <= 0:
        raise ValueError(f"costs (FLOP rate, seconds per element, seconds per call) must be positive, got {costs!r}")
    return _step_seconds(work_without, costs) / _step_seconds(work_with, costs)


def check_decode_speedup_prediction(predicted, work_with: Sequence[float], work_without: Sequence[float],
                                    costs: Sequence[float], *, context: int, measured: float | None = None,
                                    measured_by: str = "this device measured (fastest repeats)") -> CheckResult:
    """Grade a predicted speedup of one decoding step from the KV cache (time without / time with) at a
    context of ``context`` tokens against the cost model's (:func:`decode_speedup_model`, from the step's work
    and the device's measured costs, which the exercise gives), within 5 %. Not against a timing of the steps:
    their repeats spread by several times on a busy machine, far more than separates the right model from the
    wrong ones. A prediction that a plausible mistake gives (the FLOP ratio, the context length, a term of the
    model left out, the ratio upside down) gets the hint that names it. ``measured`` (optional), a timed
    speedup, is shown beside the model, not graded."""
    right = decode_speedup_model(work_with, work_without, costs)
    t_with, t_without = _step_seconds(work_with, costs), _step_seconds(work_without, costs)
    calls_share = _step_seconds(work_with, costs, flops=False, elements=False) / t_with
    fixed = (f"A one-token step still makes {work_with[1]} PyTorch calls, each at a fixed cost (dispatch, on a "
             f"GPU a launch): {calls_share:.0%} of the cached step's modelled time here, and it does not shrink "
             "with the number of tokens.")
    wrong = {
        "the FLOP ratio": (work_without[0] / work_with[0] if work_with[0] else 0.0,
                           f"The FLOPs differ about {context}x, but the time does not: {fixed}"),
        "the context length": (float(context), f"The FLOP ratio is about the context, but the time is not: {fixed}"),
        "the model without the per-call cost": (
            _step_seconds(work_without, costs, calls=False) / _step_seconds(work_with, costs, calls=False),
            f"You left out the calls' fixed cost. {fixed}"),
        "the model without the per-element cost": (
            _step_seconds(work_without, costs, elements=False) / _step_seconds(work_with, costs, elements=False),
            "You left out the elements the other operations write (mask, softmax, GELU, norms, copies): "
            f"without the cache every layer writes B * H * {context}^2 attention scores, a memory-bound pass the "
            "cached step barely has."),
        "the ratio of the calls": (
            work_without[1] / work_with[1] if work_with[1] else 0.0,
            "The calls alone are not the time: without the cache each call works on all the tokens, so the "
            "FLOPs and elements count too (time = FLOPs / rate + elements * cost + calls * cost)."),
        "the ratio upside down": (
            1 / right,
            "Below 1 would mean the cache makes a step slower: speedup = time without the cache / time with it."),
    }
    return grade_model(
        predicted, right, quantity=f"the speedup from the KV cache at {context} tokens", unit="x", rel=DECODE_REL,
        wrong=_distinct(right, wrong, DECODE_REL), measured=measured, measured_by=measured_by,
        too_high=f"Time = FLOPs / rate + elements * cost per element + calls * cost per call for each step. {fixed}",
        too_low=f"Without the cache every step recomputes the keys and values of all {context} tokens in every "
                "layer: a (context x C) by (C x C) product where the cached step has a (1 x C) one. Time = FLOPs "
                "/ rate + elements * cost per element + calls * cost per call for each step.",
        why_close=f"The model: {t_with * 1e3:.3g} ms with the cache, {t_without * 1e3:.3g} ms without. The gap to "
                  f"the FLOP ratio is the cached step's fixed cost. {fixed}")
