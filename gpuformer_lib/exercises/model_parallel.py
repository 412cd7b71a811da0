"""Checks for chapter 12's exercises (model parallel training): a hand-written 1F1B order, measured;
the bytes a tensor-parallel MLP all-reduces, predicted and counted; the pipeline bubble, predicted and
measured. The pipeline order runs in the notebook's own process (:func:`run_orders_one_process`);
the counted bytes and the measured idle share come from the chapter's gloo runs."""

from __future__ import annotations

import copy
from typing import Callable

import torch
import torch.nn.functional as F

from gpuformer_lib.exercises._core import CheckResult, _report, _safe_check, _try
from gpuformer_lib.exercises.predictions import grade_model, grade_prediction


def _order(value):
    if not isinstance(value, (list, tuple)):
        return None, f"expected a list of ('F', i) and ('B', i) steps, got {type(value).__name__}"
    return [tuple(step) if isinstance(step, (list, tuple)) else step for step in value], None


def _stack(width: int = 16, n_blocks: int = 4):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.GELU(),
                                                     torch.nn.Linear(2 * width, width)) for _ in range(n_blocks)])


@_safe_check
def check_one_f_one_b(order_fn: Callable[[int, int, int], list]) -> CheckResult:
    """``order_fn(stage, stages, micro_batches)``: this stage's steps, ``("F", i)`` and ``("B", i)``, in a
    1F1B order. Run for p = 2 and p = 4 stages with m = 8 micro-batches in one process (messages passed in
    memory, each stage waiting for its input): the gradients must equal one process's, the step must take
    no more time slots than GPipe's 2 (m + p - 1), and stage 0 may hold at most p micro-batches (in flight
    and in bytes saved for backward, measured)."""
    from gpuformer_lib.pipeline_orders import gpipe_order, run_orders_one_process

    m, width = 8, 16
    for p in (2, 4):
        orders = []
        for s in range(p):
            got, err = _try(order_fn, s, p, m, expect=_order)
            if err:
                return _report(False, f"stage {s} of {p}: {err}")
            orders.append(got)
        full = _stack(width, 4)
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(8 * m, width, generator=g), torch.randn(8 * m, width, generator=g)
        F.mse_loss(full(x), y).backward()
        per = len(full) // p
        stages = [copy.deepcopy(full[s * per:(s + 1) * per]) for s in range(p)]
        for st in stages:
            st.zero_grad(set_to_none=True)
        try:
            run = run_orders_one_process(stages, x, y, F.mse_loss, orders, m)
        except ValueError as e:
            return _report(False, f"p = {p}: {e}.")
        except RuntimeError as e:
            return _report(False, f"p = {p}, m = {m}: {e}. A stage that sends its forward output and then waits for "
                                  "a gradient is fine; two stages each waiting for the other is not: micro-batch i's "
                                  "backward on stage s needs stage s + 1 to have run its backward of i first.")
        gap = max((a.grad - b.grad).abs().max().item() for st, off in zip(stages, range(0, len(full), per))
                  for a, b in zip(st.parameters(), full[off:].parameters()))
        if gap > 1e-5:
            return _report(False, f"p = {p}: the gradients differ from one process by {gap:.1e}. Every micro-batch must "
                                  "run forward and backward exactly once on every stage.")
        if run["slots"] > 2 * (m + p - 1):
            return _report(False, f"p = {p}, m = {m}: correct gradients, but the step took {run['slots']} time slots "
                                  f"where a pipeline takes 2 (m + p - 1) = {2 * (m + p - 1)}: the stages mostly wait for "
                                  "each other, like the naive placement. Let stage s run p - s - 1 forwards before its "
                                  "first backward, so that later stages always have work.")
        # one micro-batch's saved bytes on stage 0, measured the same way (GPipe with m = 1)
        one = copy.deepcopy(stages)
        unit = run_orders_one_process(one, x[:8], y[:8], F.mse_loss, [gpipe_order(s, p, 1) for s in range(p)], 1)
        unit_bytes = unit["peak_saved_bytes"][0]
        held, saved = run["peak_in_flight"][0], run["peak_saved_bytes"][0]
        if held > p or saved > p * unit_bytes * 1.01:
            gpipe = " That is GPipe's order: every forward before any backward." if held == m else ""
            return _report(False, f"p = {p}, m = {m}: stage 0 held {held} micro-batches at once "
                                  f"({saved / unit_bytes:.1f} micro-batches' worth of saved activations); 1F1B holds at "
                                  f"most p = {p}.{gpipe} Start micro-batch i's backward as soon as the later stages "
                                  f"have returned its gradient: stage s runs p - s - 1 forwards, then alternates.")
    return _report(True, f"Gradients equal one process's, and stage 0 held at most p micro-batches (with p = 4: "
                         f"{held}, {saved / unit_bytes:.1f} micro-batches' worth of saved bytes, against GPipe's {m}). "
                         "The bubble is the same (p - 1) / (m + p - 1): 1F1B buys memory, not speed; interleaving "
                         "the stages (virtual stages) is what shrinks the bubble.")


def check_tp_bytes_prediction(predicted, measured: float, rows: int, width: int, element_bytes: int) -> CheckResult:
    """Predict the bytes a Megatron tensor-parallel MLP all-reduces in one forward and backward (each
    message counted once, as the tensor handed to ``all_reduce``): graded against the model, one (rows, C)
    activation of ``element_bytes`` each way, 2 rows C element_bytes, within rounding. ``measured`` (what the
    counting hook recorded on gloo) is shown beside the model, not graded. The usual mistakes get their own
    hints: one direction only, the hidden layer (4C) communicated, elements or bits counted instead of bytes."""
    if min(rows, width, element_bytes) <= 0:
        raise ValueError(f"rows, width and element_bytes are positive, got {rows!r}, {width!r}, {element_bytes!r}")
    one = rows * width * element_bytes
    shape = f"(rows, C) = ({rows}, {width}) x {element_bytes} B = {one} B"
    wrong = {
        "one direction only": (
            one, "Forward and backward each all-reduce once: g sums the partial outputs forward, f sums the partial "
                 f"gradients of the input backward (every rank used the whole input). Each message is {shape}."),
        "the hidden layer (4C wide) communicated": (
            2 * 4 * one, "The hidden layer (4C wide) is never communicated: the column-parallel layer's output stays "
                         f"on its rank. Only the MLP's output, {shape}, is summed forward (g), and the input's "
                         "gradient, the same shape, backward (f)."),
        "elements counted, not bytes": (
            2 * rows * width, f"That counts elements; each is {element_bytes} bytes: multiply by element_bytes."),
        "bits counted, not bytes": (
            2 * one * 8, "That counts bits; the question asks bytes (8 bits each)."),
    }
    return grade_model(
        predicted, 2 * one, quantity="bytes all-reduced by one tensor-parallel MLP, forward + backward", unit="B",
        wrong={k: v for k, v in wrong.items() if abs(v[0] / (2 * one) - 1) > 0.1}, rel=0.01,
        too_high=(f"Only the MLP's output, {shape}, is summed forward (g), and the input's gradient, the same shape, "
                  "backward (f). The number of ranks does not change the message; a ring splits it into 2 (N - 1) "
                  "pieces."),
        too_low=(f"Forward and backward each all-reduce once: g sums the partial outputs, f sums the partial "
                 f"gradients of the input. Each message is {shape}."),
        measured=measured, measured_by="The counting hook recorded on gloo",
        why_close=(f"Two messages of B T C values: {one} B forward, {one} B backward. A Transformer layer has two "
                   "such blocks (attention's output projection is row-parallel too): 4 all-reduces of B T C per "
                   "layer, in every layer, which is why tensor parallel stays on NVLink."))


def check_bubble_prediction(predicted, measured: float | None, stages: int, micro_batches: int) -> CheckResult:
    """Predict the share of a GPipe step each stage idles, in percent (30 for 30 %). Graded against the
    fill-and-drain formula (p - 1) / (m + p - 1), within rounding; the usual mistakes get their own hints:
    the naive placement's (p - 1) / p, the idle time over the busy time (p - 1) / m, the busy share
    m / (m + p - 1), and a fraction where a percent was asked. ``measured`` (the idle share, a fraction, the
    gloo run measured) is shown beside the model, not graded: on shared CPU cores a run idles more than the
    formula, and its timing could pass a wrong model. ``measured=None`` where no run measured that setting."""
    p, m = stages, micro_batches
    bubble = 100 * (p - 1) / (m + p - 1)
    wrong = {
        "the naive placement without micro-batches, (p - 1) / p": (
            100 * (p - 1) / p, "With m micro-batches in flight the pipeline fills and drains once a step: a stage "
                               "idles p - 1 slots of m + p - 1, not p - 1 of p."),
        "idle time over busy time, (p - 1) / m": (
            100 * (p - 1) / m, "That divides the idle slots by the busy ones; the share of the step divides them "
                               "by all m + p - 1 slots."),
        "the busy share, m / (m + p - 1)": (
            100 * m / (m + p - 1), "That is the share each stage works; the question asks the share it idles."),
        "the right share as a fraction, not in percent": (
            bubble / 100, "The answer is in percent: 30 for 30 %, not 0.3."),
    }
    return grade_model(
        predicted, bubble, quantity=f"the idle share of a GPipe step (p = {p}, m = {m})", unit="%",
        wrong={k: v for k, v in wrong.items() if abs(v[0] / bubble - 1) > 0.1}, rel=0.03,
        too_high=f"A stage idles p - 1 slots of m + p - 1: ({p} - 1) / ({m} + {p} - 1).",
        too_low=("The fill-and-drain bubble: the last stage waits for the first micro-batch and the first stage for "
                 "the last gradient, p - 1 slots of m + p - 1."),
        measured=None if measured is None else 100 * measured,
        measured_by="" if measured is None else "The run of section 12.1 idled",
        why_close="" if measured is None else (
            "A run idles more than the formula: every hand-over pays a message latency (chapter 11's alpha) "
            "and smaller micro-batches compute less efficiently, neither of which it counts."))

