"""Checks for the exercises on FLOPs, MFU and planning a training run (chapter 10)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

from gpuformer_lib.exercises._answers import _number, _numbers
from gpuformer_lib.exercises._core import CheckResult, _close, _report, _safe_check, _try

if TYPE_CHECKING:
    from gpuformer_lib.model import TransformerConfig


# --------------------------------------------------------------------------- second edition: diagnose, predict


@_safe_check
def check_read_backs_per_step(fn: Callable[[list], float], trace_path: str) -> CheckResult:
    """Diagnose from a recorded trace: ``fn(events)`` gets the trace's complete events (``bottlenecks.load_trace``)
    and returns how many times per training step the host read a value back from the device (each one a host
    sync on a GPU). Checked against the trace: the ``aten::_local_scalar_dense`` events inside the
    ``ProfilerStep#N`` windows, per window."""
    from gpuformer_lib import bottlenecks

    events = bottlenecks.load_trace(trace_path)
    steps = bottlenecks.profiler_steps(events)
    truth = bottlenecks.syncs_per_step(events)
    items = sum(1 for e in events if e.get("name") == "aten::item" and any(bottlenecks._inside(e, s) for s in steps))
    got, err = _try(fn, events, expect=_number)
    if err:
        return _report(False, err)
    if _close(got, truth, 1e-9):
        return _report(True, f"{truth:g} read-backs per step, each an aten::item -> aten::_local_scalar_dense in the "
                             "trace. On a GPU each one waits in cudaStreamSynchronize until every queued kernel has "
                             "run, so the host cannot queue the next step ahead: build the model without the id "
                             "check and read the loss every log_every steps.")
    total = len(bottlenecks.host_syncs(events))
    if truth and _close(got, 2 * truth, 1e-9):
        hint = ("You counted each read twice: aten::item contains aten::_local_scalar_dense (the copy of one "
                "number to the host). Count one of the two.")
    elif _close(got, total, 1e-9) or _close(got, items + total, 1e-9):
        hint = (f"That is the whole trace ({len(steps)} recorded steps, plus anything outside them): count inside "
                "each ProfilerStep#N window and divide by the number of windows.")
    elif got == 0:
        hint = ("Look for the names: .item(), int(t), float(t) and bool(t) on a tensor all show as aten::item with an "
                "aten::_local_scalar_dense inside.")
    elif 0 < got < truth:
        hint = ("Fewer than the trace holds: the loop's loss.item() is not the only read-back of a step; code inside "
                "the model's forward pass reads values back too. Count every aten::_local_scalar_dense inside the "
                "ProfilerStep#N windows (and divide by the number of windows once).")
    else:
        hint = ("Take the events named aten::_local_scalar_dense whose [ts, ts + dur] lies inside a ProfilerStep#N "
                "window; count them per window.")
    return _report(False, f"You found {float(got):g} per step. {hint}")


def check_width_flops_prediction(predicted_ratio, measured_ratio: float, *, width: int,
                                 config: TransformerConfig | None = None) -> CheckResult:
    """Predict, then measure: the FLOPs of a training step when the model's width doubles (``width`` -> 2 x
    ``width``, d_ff = 4 C), as a ratio, for ``config`` (its layers, vocabulary and ``max_len`` as T; by default
    the ladder's "tiny" preset, chapter 10's CPU model). Graded against the count of ``model.transformer_flops``
    (24 C^2 + 4 T C per layer and token, 2 C V for the output layer) within 1.5 %, because the usual mistakes
    lie within 10 % of the right ratio (attention left out: 3.50 against 3.20 from width 64, 3.64 against 3.38
    from 96; attention halved for the causal mask, 6N) and a measurement could pass them; each gets its own
    hint. ``measured_ratio`` (what ``FlopCounterMode`` counted) is shown beside the model, not graded."""
    import dataclasses

    import torch

    from gpuformer_lib.exercises.predictions import _positive, grade_model
    from gpuformer_lib.model import DecoderLM, TransformerConfig, count_parameters, transformer_flops

    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"width must be a positive int, got {width!r}")
    if config is None:
        from gpuformer_lib import ladder

        config = ladder.PRESETS["tiny"].config
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
    measured_ratio = _positive("measured_ratio", measured_ratio)
    L, T, V = config.n_decoder_layers, config.max_len, config.vocab_size

    def per_token(C: int, square: int = 24, attention: int = 4, output: int = 2) -> float:
        # forward FLOPs per token; the backward's x3 and the batch cancel in a ratio
        return L * (square * C * C + attention * T * C) + output * C * V

    def ratio(**terms: int) -> float:
        return per_token(2 * width, **terms) / per_token(width, **terms)

    wide = dataclasses.replace(config, d_model=2 * width, d_ff=8 * width)
    narrow = dataclasses.replace(config, d_model=width, d_ff=4 * width)
    right = transformer_flops(wide, 1, T) / transformer_flops(narrow, 1, T)  # = ratio(): the same terms
    with torch.device("meta"):  # parameters counted, not allocated
        n_wide, n_narrow = count_parameters(DecoderLM(wide)), count_parameters(DecoderLM(narrow))
    wrong = {
        "counting the C^2 terms alone": (
            4.0, "4x is right only for the terms in C^2 (projections, feed-forward: 24 C^2 per layer and token); "
                 "the output layer's 2CV and attention's 4TC per layer grow only 2x with C, and at a small width "
                 "they are a large share: weigh each term by its size at this width."),
        "counting every term as linear in C": (
            2.0, "The projections and the feed-forward are C x C and C x 4C products: their FLOPs grow 4x when C "
                 "doubles. Only the output layer's 2CV and attention's 4TC grow 2x."),
        "leaving out attention's 4TC (or the output layer's 2CV)": (
            ratio(attention=0), "A term that grows only 2x is missing: attention's scores and weighted sum, 4TC per "
                                "layer and token (T x T x C products, no weights), or the output layer's 2CV. Both "
                                "count at this width."),
        "attention halved for the causal mask": (
            ratio(attention=2), "Causal masking does not halve attention's FLOPs: the kernels compute the full T x T "
                                "scores and mask them, 4TC per layer and token."),
        "the feed-forward counted as one product": (
            ratio(square=16), "The feed-forward has two products, C -> 4C and 4C -> C: 16 C^2 per token, "
                              "plus 8 C^2 for Q, K, V and the output projection."),
        "6N, from the parameter counts": (
            n_wide / n_narrow, "6N counts parameters: it misses attention's 4TC (scores have no weights) and counts "
                               "the embedding tables, whose lookups do no matrix product. Count the products."),
        "the ratio upside down": (
            1 / right, "Upside down: the ratio is the wider model's FLOPs over the narrower one's, above 1."),
    }
    wrong = {k: v for k, v in wrong.items() if abs(v[0] / right - 1) > 0.03}
    value, _ = _number(predicted_ratio)
    if isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
        # 6N and the halved attention lie 1.5 % apart: the hint of the nearer one first
        wrong = dict(sorted(wrong.items(), key=lambda item: abs(math.log(item[1][0] / value))))
    return grade_model(
        predicted_ratio, right, quantity=f"the FLOP ratio of width {2 * width} to width {width}", unit="x",
        wrong=wrong, rel=0.015,
        measured=measured_ratio, measured_by="FlopCounterMode counted",
        too_high="Not every FLOP grows 4x: the output layer (2CV) and attention (4TC per layer) grow 2x.",
        too_low="Doubling C doubles every term at least: the C^2 terms (projections, feed-forward) grow 4x, the "
                "output layer (2CV) and attention (4TC) 2x, so the ratio lies between 2 and 4.",
        why_close="The ratio lies between 2x (every FLOP linear in C) and 4x (every FLOP in C^2), nearer 4 as the "
                  "width grows and the C^2 terms dominate: why a wider model reaches a higher MFU.")


@_safe_check
def check_run_plan(fn: Callable[[float, float, float, float], tuple[float, float]]) -> CheckResult:
    """``fn(n_tokens, hours, flops_per_token, peak_flops)`` returns ``(tokens_per_second, mfu)``. The cases use
    the chapter's FLOPs per token, attention included (``model.transformer_flops``), as its MFU does. Both are
    formulas, graded exactly; hours not turned into seconds, an MFU in percent, upside down, multiplied by 3 or
    6 again (``flops_per_token`` counts the training step already) or without the FLOPs get their own hints."""
    from gpuformer_lib.model import gpt2_config, transformer_flops

    per_token = transformer_flops(gpt2_config(), 1, 1024) / 1024  # GPT-2 small at T = 1024, attention included
    for tokens, hours, peak in [(1e10, 24.0, 989.4e12), (3e11, 720.0, 312e12 * 8)]:
        got, err = _try(fn, tokens, hours, per_token, peak, expect=_numbers(2, "a pair (tokens_per_second, mfu)"))
        if err:
            return _report(False, err)
        rate = tokens / (hours * 3600)
        mfu = rate * per_token / peak
        g_rate, g_mfu = got
        if not _close(g_rate, rate, 1e-6):
            return _report(False, f"{tokens:.3g} tokens in {hours} h: expected {rate:,.0f} tokens/s, got {g_rate}. "
                                  "Hours are 3600 seconds.")
        if not _close(g_mfu, mfu, 1e-6):
            mistakes = [
                (100 * mfu, "MFU is a fraction of the peak (0.1 for 10 %), not a percent."),
                (1 / mfu, "Upside down: the FLOPs the run needs per second over the peak, not the peak over them."),
                (3 * mfu, "flops_per_token already counts the training step, forward and backward (3x the forward): "
                          "do not multiply by 3 again."),
                (6 * mfu, "flops_per_token already counts the whole training step (the 6N of a parameter count): "
                          "do not multiply by 6 again."),
                (rate / peak, "A rate in tokens/s over a peak in FLOP/s: multiply by the FLOPs per token first."),
            ]
            # each a formula, computed to float rounding (at 10 % MFU the percent and the upside-down ratio
            # are both near 10: a loose tolerance would confuse them)
            hint = next((h for value, h in mistakes if _close(g_mfu, value, 1e-6)), "")
            return _report(False, f"expected MFU {mfu:.3f}, got {g_mfu}: tokens/s x FLOPs per token / peak. {hint}"
                           .strip())
    rate = 1e10 / (24 * 3600)
    return _report(True, f"GPT-2 small over 10 B tokens in a day needs {rate / 1e3:.0f}k tokens/s: "
                         f"{rate * per_token / 989.4e12:.0%} MFU on one H100's dense bf16 peak, counting attention "
                         f"({per_token / 1e6:.0f} MFLOP per token, as this chapter's MFU does). Check the plan against "
                         "the MFU your own run reaches before you book GPUs.")
