"""Checks for the exercises on FLOPs, MFU and planning a training run (chapter 10)."""

from __future__ import annotations

from typing import Callable

import torch

from gpuformer_lib.exercises._answers import _number, _numbers
from gpuformer_lib.exercises._core import CheckResult, _close, _report, _safe_check, _try


@_safe_check
def check_training_flops(fn: Callable[[object, int, int], float]) -> CheckResult:
    """Predict, then measure: ``fn(config, batch_size, seq_len)`` returns the matrix-product FLOPs of
    one training step (forward and backward) of a ``DecoderLM``. The check counts them with
    ``torch.utils.flop_counter.FlopCounterMode`` on the explicit attention path and accepts 1 %."""
    from torch.utils.flop_counter import FlopCounterMode

    from gpuformer_lib.model import DecoderLM, TransformerConfig

    for C, H, L, F, V, B, T in [(32, 4, 2, 64, 50, 2, 16), (48, 3, 1, 192, 97, 3, 40)]:
        config = TransformerConfig(vocab_size=V, d_model=C, n_heads=H, n_decoder_layers=L, d_ff=F, dropout=0.0,
                                   max_len=64, fused_attention=False)  # the counter does not see the CPU's fused kernel
        got, err = _try(fn, config, B, T, expect=_number)
        if err:
            return _report(False, err)
        torch.manual_seed(0)
        model = DecoderLM(config)
        with FlopCounterMode(display=False) as counter:
            model(torch.randint(0, V, (B, T))).sum().backward()
        measured = counter.get_total_flops()
        ratio = got / measured
        if not 0.99 <= ratio <= 1.01:
            hint = ("You counted the forward pass only: the backward pass costs twice as much." if 0.3 < ratio < 0.36
                    else "Per token and layer: 8C^2 for Q, K, V and the output, 4C d_ff for the feed-forward, 4TC "
                         "for scores and weighted sum; 2CV per token for the output layer; x3 for training.")
            return _report(False, f"C={C}, layers={L}, d_ff={F}, V={V}, B={B}, T={T}: measured {measured:,} FLOPs, "
                                  f"you predicted {float(got):,.0f} ({ratio:.2f}x). {hint}")
    return _report(True, "About 6 FLOPs per parameter per token, plus attention's 12 T C per layer and token: "
                         "model.transformer_flops is this formula.")


@_safe_check
def check_mfu_hfu(fn: Callable[[float, float, float, bool], tuple[float, float]]) -> CheckResult:
    """``fn(model_flops, step_seconds, peak_flops, checkpointing)`` returns ``(mfu, hfu)``. The model's
    FLOPs are 3x its forward pass; with activation checkpointing the hardware also repeats the
    forward pass, so it does 4x."""
    for flops, seconds, peak, ckpt in [(3e15, 10.0, 1e15, False), (3e15, 10.0, 1e15, True), (6e14, 2.0, 9.89e14, True)]:
        got, err = _try(fn, flops, seconds, peak, ckpt, expect=_numbers(2, "a pair (mfu, hfu)"))
        if err:
            return _report(False, err)
        mfu = flops / seconds / peak
        hfu = mfu * (4 / 3 if ckpt else 1)
        g_mfu, g_hfu = got
        if not _close(g_mfu, mfu, 1e-6):
            return _report(False, f"MFU for {flops:.3g} FLOPs in {seconds} s on a {peak:.3g} FLOP/s peak: expected "
                                  f"{mfu:.3f}, got {g_mfu}. MFU = model FLOPs per second / peak.")
        if not _close(g_hfu, hfu, 1e-6):
            return _report(False, f"HFU with checkpointing={ckpt}: expected {hfu:.3f}, got {g_hfu}. Recomputing the "
                                  "forward pass adds one forward's FLOPs to the three of a training step.")
    return _report(True, "MFU counts the FLOPs the model needs; HFU also the ones the hardware repeats. Compare "
                         "runs by MFU: recomputation makes HFU look better without training faster.")


@_safe_check
def check_training_plan(fn: Callable[[float, float, float, float], tuple[float, float]]) -> CheckResult:
    """``fn(n_tokens, hours, flops_per_token, peak_flops)`` returns ``(tokens_per_second, mfu)``: the
    throughput needed to see ``n_tokens`` in ``hours``, and the MFU that takes on that peak."""
    for tokens, hours, per_token, peak in [(1e10, 24.0, 6 * 124e6, 9.89e14), (3e11, 720.0, 6 * 1.3e9, 3.12e14 * 8)]:
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
            return _report(False, f"expected MFU {mfu:.3f}, got {g_mfu}: tokens/s x FLOPs per token / peak.")
    return _report(True, "A GPT-2-small run over 10 B tokens in a day needs about 116k tokens/s: 9 % MFU on one "
                         "H100's bf16 peak. Check the plan against the MFU your ladder reached before you book GPUs.")
