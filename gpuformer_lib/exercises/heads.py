"""Checks for the exercises on heads: grouped-query attention's parameters, the KV cache's size, decode speed.

Two of them are predict-then-measure (:mod:`gpuformer_lib.exercises.predictions`): the learner predicts the
bytes of a KV cache, or the speedup the cache gives a decoding step; the notebook measures the same
quantity on its device; the check grades the prediction within a factor and explains the gap.
"""

from __future__ import annotations

from typing import Callable, Mapping

from gpuformer_lib.exercises._answers import _number
from gpuformer_lib.exercises._core import CheckResult, _describe, _report, _safe_check, _try
from gpuformer_lib.exercises.predictions import grade_prediction, own_result


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
        return _report(False, f"For d_model={C}, n_heads={H}, n_kv_heads={Hkv}, bias={bias} expected {want:,}, "
                              f"got {got!r}. Count W_q (C x C), W_k and W_v (C x n_kv_heads*hs each), W_o (C x C).")
    return _report(True, "2 C^2 + 2 C * n_kv_heads * hs (+ biases): MQA and GQA shrink only the key and value "
                         "projections, so MQA removes up to about half of the attention layer's parameters, but "
                         "attention is only a third of a block (4 C^2 of 12 C^2 with a 4C MLP), so the whole model "
                         "shrinks by about 15 %; the KV cache shrinks n_heads / n_kv_heads times.")


def check_kv_cache_prediction(predicted: Mapping[str, float], measured: Mapping[str, float]) -> CheckResult:
    """Grade predicted KV-cache bytes (one number per configuration, e.g. ``{"MHA": ..., "GQA-4": ...,
    "MQA": ...}``) against the bytes read from the cache tensors; each must be within 10 %."""
    if not isinstance(predicted, Mapping):
        return own_result(False, f"Predict a dict {{configuration: bytes}}, not {_describe(predicted)}.")
    missing = [name for name in measured if name not in predicted]
    if missing:
        return own_result(False, f"Predict a number of bytes for every configuration; missing: {', '.join(missing)}.",
                          not_attempted=not predicted)
    results = []
    for name, nbytes in measured.items():
        result = grade_prediction(
            predicted[name], nbytes, quantity=f"the {name} KV cache", unit="bytes", within=1.1,
            too_high="A factor of 2 too high: in float16/bf16 an element is 2 bytes, not 4 (the cache is in the "
                     "model's dtype). A factor n_heads / n_kv_heads too high: the cache stores the key/value heads, "
                     "not the query heads.",
            too_low="A factor of 2 too low: there is a K and a V for every layer, head and token. A factor of "
                    "n_layers too low: every layer has its own cache.",
            why_close="The formula is exact for a preallocated cache: 2 * n_layers * n_kv_heads * hs * T * B * "
                      "bytes per element.")
        results.append(result)
        if not result:
            return result
    return own_result(True, "All three sizes match the tensors. The cache scales with n_kv_heads: MQA's is "
                            "n_heads times smaller than MHA's, and GQA sits in between.")


def check_decode_speedup_prediction(predicted, measured, *, context: int,
                                    measured_by: str = "this device measured") -> CheckResult:
    """Grade a predicted speedup of one decoding step from the KV cache (time without / time with) at a
    context of ``context`` tokens, against the measured one; within a factor of 3 (timings are noisy and
    small models pay fixed per-step costs). ``measured`` is the measured speedup, or a function of no
    arguments that measures it: then a miss is re-measured (up to 3 measurements, graded against the
    closest; see :func:`~gpuformer_lib.exercises.predictions.grade_prediction`), because one timing on a
    busy machine can be far off."""
    value, hint = _number(predicted)
    if hint is None and value is not None and 0 < value < 1:
        return own_result(False, f"You predicted {value:.3g}: below 1 would mean the cache makes a step slower. "
                                 "Speedup = time without the cache / time with it.")
    return grade_prediction(
        predicted, measured, quantity=f"the speedup from the KV cache at {context} tokens", unit="x", within=3.0,
        measured_by=measured_by,
        too_high=f"Without the cache a step processes all {context} tokens, with it one: the FLOPs differ "
                 f"{context}x, but the time does not, because a one-token step still reads every weight and pays "
                 "a fixed cost per kernel (launch, Python), which at this size is much of its time.",
        too_low=f"Without the cache every step recomputes the keys and values of all {context} tokens in every "
                "layer: a (context x C) by (C x C) product where the cached step has a (1 x C) one.",
        why_close="Close. The gap to the FLOP ratio is the cached step's fixed cost: reading every weight and "
                  "launching every kernel does not shrink with the number of tokens.")
