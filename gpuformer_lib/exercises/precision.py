"""Checks for the exercises on number formats, loss scaling and mixed precision (chapter 8)."""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from gpuformer_lib.exercises._answers import _number, _truth
from gpuformer_lib.exercises._core import CheckResult, _report, _safe_check, _try


def _spacing(weight: float, dtype: torch.dtype) -> float:
    """The gap between ``dtype``'s numbers at ``weight``: eps x 2^floor(log2 |w|)."""
    return torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(abs(weight)))


_SURVIVE_CASES = [(1.0, 1e-4, torch.float16), (1.0, 1e-3, torch.float16), (1.0, 6e-4, torch.float16),
                  (1.0, 2.0 ** -11, torch.float16), (1.5, 1.2e-3, torch.float16), (1.0, 1e-3, torch.bfloat16),
                  (1.0, 1e-2, torch.bfloat16), (1000.0, 0.3, torch.float16), (1000.0, 0.1, torch.float16),
                  (1000.0, 1.0, torch.float16), (0.1, 1e-4, torch.float16), (-1000.0, 0.3, torch.float16),
                  (1.0, 1e-4, torch.float32)]
"""(weight, update, dtype): each plausible wrong rule below gets at least one of them wrong (a weight far from
1, one between powers of two, an update between half the spacing and the spacing, a tie, bf16, a negative
weight)."""

_SURVIVE_MISTAKES = {
    "eps without the weight's scale": (
        lambda w, u, d: abs(u) > torch.finfo(d).eps / 2,
        "You compared the update with eps itself: eps is the spacing near 1 only. Near a weight w the numbers are "
        "eps x 2^floor(log2 |w|) apart: 512 times wider at 1000, 16 times narrower at 0.1."),
    "eps, without the weight's scale or the half": (
        lambda w, u, d: abs(u) > torch.finfo(d).eps,
        "You compared the update with eps itself: eps is the spacing near 1 only. Near a weight w the numbers are "
        "eps x 2^floor(log2 |w|) apart, and a sum rounds to the nearest number, so half of that spacing is the "
        "threshold."),
    "the whole spacing as the threshold": (
        lambda w, u, d: abs(u) > _spacing(w, d),
        "The sum rounds to the nearest number: an update larger than half the spacing already moves the weight "
        "to its neighbour, so the threshold is half the spacing, not the whole."),
    "a relative threshold, update / |w| > eps": (
        lambda w, u, d: abs(u) / abs(w) > torch.finfo(d).eps,
        "Comparing update / |w| with eps is a relative threshold: the spacing is set by the power of two below "
        "|w|, 2^floor(log2 |w|), not by |w| itself (1.5 and 1.0 have the same spacing), and half of it "
        "decides."),
    "a relative threshold, update / |w| > eps / 2": (
        lambda w, u, d: abs(u) / abs(w) > torch.finfo(d).eps / 2,
        "Comparing update / |w| with eps / 2 is a relative threshold: the spacing is set by the power of two "
        "below |w|, 2^floor(log2 |w|), not by |w| itself (at 1000 the power of two is 512, half of 1000)."),
    ">= at the tie": (
        lambda w, u, d: abs(u) >= _spacing(w, d) / 2,
        "An update of exactly half the spacing is a tie, and a tie rounds to the even neighbour, here the "
        "weight itself: use >, not >=."),
    "fp16's eps for every format": (
        lambda w, u, d: abs(u) > _spacing(w, torch.float16) / 2,
        "You used float16's eps for every format: each format has its own eps, torch.finfo(dtype).eps (bf16 "
        "2^-7, float32 2^-23)."),
    "every update survives": (
        lambda w, u, d: True,
        "An update smaller than half the spacing rounds away: the weight does not move at all."),
}
"""Plausible wrong rules for :func:`check_update_survives`, each with the hint that names it."""


@_safe_check
def check_update_survives(fn: Callable[[float, float, torch.dtype], bool]) -> CheckResult:
    """``fn(weight, update, dtype)``: does ``weight + update``, stored in ``dtype``, differ from ``weight``?
    Predict it from the format's precision; the check measures it on cases chosen so that each plausible
    wrong rule (eps without the weight's scale, the whole spacing instead of half, a relative threshold,
    >= at a tie, one eps for every format) gets at least one of them wrong, and names the rule it finds."""
    answers, truths = [], []
    for w, u, dtype in _SURVIVE_CASES:
        got, err = _try(fn, w, u, dtype, expect=_truth)
        if err:
            negative = " (A weight can be negative: the spacing depends on |w|.)" if w < 0 and "raised" in err else ""
            return _report(False, err + negative)
        answers.append(bool(got))
        stored = torch.tensor(w, dtype=dtype)
        truths.append(bool((stored + torch.tensor(u, dtype=dtype)) != stored))
    if answers == truths:
        return _report(True, "An update survives only if it exceeds half the spacing eps x 2^floor(log2 |w|): fp16 "
                             "loses 1e-4 on a weight of 1, which is why weights are kept in float32.")
    index = next(i for i, (a, t) in enumerate(zip(answers, truths)) if a != t)
    w, u, dtype = _SURVIVE_CASES[index]
    case = (f"weight {w} + update {u} in {dtype}: {'kept' if truths[index] else 'lost'} when stored, and "
            f"{'kept' if answers[index] else 'lost'} by your rule. Near {w} the {dtype} values are "
            f"{_spacing(w, dtype):.3g} apart (eps x 2^floor(log2 |w|)); an update smaller than half of that "
            "rounds away.")
    for rule, hint in _SURVIVE_MISTAKES.values():
        if [bool(rule(*c)) for c in _SURVIVE_CASES] == answers:
            return _report(False, f"{hint} For example, {case}")
    return _report(False, case[0].upper() + case[1:])


def _loss_scale(scale: float, overflows: Sequence[bool], interval: int, *, reset_on_overflow: bool = True,
                reset_on_growth: bool = True, grow_after: int = 0, back_off: float = 0.5,
                grow: float = 2.0) -> float:
    """GradScaler's rule (the defaults), or one of its plausible misreadings (the keywords)."""
    clean = 0
    for overflow in overflows:
        if overflow:
            scale *= back_off
            clean = 0 if reset_on_overflow else clean
        else:
            clean += 1
            due = interval + grow_after
            if clean == due or (clean > due and not reset_on_growth):
                scale *= grow
                clean = 0 if reset_on_growth else clean
    return scale


_SCALE_MISTAKES = {
    "no restart of the count after an overflow": (
        dict(reset_on_overflow=False),
        "An overflow also restarts the count of clean steps: growth needs growth_interval clean steps in a row."),
    "no restart of the count after a growth": (
        dict(reset_on_growth=False),
        "After a growth the count starts again from 0: the next doubling needs another growth_interval clean "
        "steps, not one more."),
    "one step late": (
        dict(grow_after=1),
        "The scale doubles on the growth_interval-th clean step in a row, not on the one after."),
    "one step early": (
        dict(grow_after=-1),
        "The scale doubles on the growth_interval-th clean step in a row, not on the one before."),
    "no growth": (
        dict(grow=1.0),
        "Your scale never grew: growth_interval clean steps in a row double it, so it climbs back after an "
        "overflow."),
    "no back-off": (
        dict(back_off=1.0),
        "An overflow skips the step and also halves the scale: without the back-off the next step overflows "
        "again."),
    "doubling on an overflow": (
        dict(back_off=2.0),
        "An overflow means the scaled gradients were too large: the scale halves, it does not double."),
}
"""Plausible misreadings of GradScaler's rule, as keywords of :func:`_loss_scale`, each with its hint."""


@_safe_check
def check_loss_scale(fn: Callable[[float, Sequence[bool], int], float]) -> CheckResult:
    """``fn(init_scale, overflow_per_step, growth_interval)``: the loss scale after these steps, with
    GradScaler's rules: an overflow halves the scale (the step is skipped) and restarts the count;
    ``growth_interval`` consecutive clean steps double it, and the count starts again. The cases are chosen
    so that each plausible misreading gives a wrong scale in one of them, and the hint names it."""
    cases = [(65536.0, [False] * 5, 5), (65536.0, [True, True, False], 5), (1024.0, [False, True] + [False] * 6, 3),
             (8.0, [True] * 3, 2), (1024.0, [False, False, True] + [False] * 4, 3), (256.0, [False] * 7, 2)]
    answers = []
    for init, overflows, interval in cases:
        got, err = _try(fn, init, list(overflows), interval, expect=_number)
        if err:
            return _report(False, err)
        answers.append(got)
    wants = [_loss_scale(*case) for case in cases]
    if answers != wants:
        index = next(i for i, (a, w) in enumerate(zip(answers, wants)) if a != w)
        init, overflows, interval = cases[index]
        case = (f"From {init} with overflows {overflows} and growth_interval {interval}: expected {wants[index]}, "
                f"got {answers[index]!r}.")
        for keywords, hint in _SCALE_MISTAKES.values():
            if [_loss_scale(*c, **keywords) for c in cases] == answers:
                return _report(False, f"{hint} {case}")
        return _report(False, f"{case} An overflow halves the scale and restarts the count of clean steps; "
                              "growth_interval clean steps in a row double it.")
    # the rules are GradScaler's: confirm with the real thing
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
    w = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([w], lr=0.0)
    for overflow in [False, True] + [False] * 6:
        scaler.scale((w * (float("inf") if overflow else 1.0)).sum()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    assert scaler.get_scale() == _loss_scale(1024.0, [False, True] + [False] * 6, 3)
    return _report(True, "Halve on overflow, double after a run of clean steps: the scale hovers just below overflow.")


# --------------------------------------------------------------------------- predict, then measure; diagnose


_FORMATS = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def check_half_loss_lr_prediction(predicted, measured: float, *, fmt: str = "bf16", fp16_lr: float) -> CheckResult:
    """Predict the learning rate at which SGD loses half its updates when the weights are kept in ``fmt``,
    given ``fp16_lr``, the one measured for fp16 (``mixed_precision.half_loss_lr``). Graded against the model,
    within 5 %: everything but eps is the same for the two formats (the weights, the gradients), so the
    learning rate moves with eps, eps(fmt) / eps(fp16) x ``fp16_lr``. ``measured``, where the addition in
    ``fmt`` loses half, is shown beside the model, not graded; the mistakes (fp16's rate, the ratio upside
    down, the ratio of mantissa bits, one bit off) are named."""
    from gpuformer_lib.exercises.predictions import grade_model

    if fmt not in _FORMATS or fmt == "fp16":
        raise ValueError(f"fmt is one of {sorted(set(_FORMATS) - {'fp16'})} (compared with fp16), got {fmt!r}")
    if isinstance(fp16_lr, bool) or not isinstance(fp16_lr, (int, float)) or not 0 < fp16_lr < math.inf:
        raise ValueError(f"fp16_lr is fp16's measured half-loss learning rate, a positive number; got {fp16_lr!r}")
    eps16, eps = torch.finfo(torch.float16).eps, torch.finfo(_FORMATS[fmt]).eps
    ratio = eps / eps16
    bits16, bits = -math.log2(eps16), -math.log2(eps)
    wrong = {
        "fp16's learning rate": (
            fp16_lr, f"That is fp16's learning rate: {fmt}'s numbers are {ratio:g} times farther apart (eps "
                     f"2^-{bits:g} against 2^-{bits16:g}), so its updates must be {ratio:g} times larger to survive."),
        "the eps ratio upside down": (
            fp16_lr / ratio, f"The ratio is upside down: {fmt}'s eps is {ratio:g} times fp16's, so its spacing is "
                             "wider and the learning rate must be larger, not smaller."),
        "the ratio of mantissa bits": (
            fp16_lr * bits16 / bits, f"The spacing is eps = 2^-(mantissa bits): the ratio is 2^({bits16:g} - "
                                     f"{bits:g}) = {ratio:g}, not {bits16:g}/{bits:g}."),
        "one mantissa bit too many": (
            fp16_lr * ratio * 2, f"One bit off: eps is 2^-(explicit mantissa bits), {bits16:g} for fp16 and "
                                 f"{bits:g} for {fmt}; count the implicit leading 1 for both or for neither: "
                                 f"a ratio of {ratio:g}."),
        "one mantissa bit too few": (
            fp16_lr * ratio / 2, f"One bit off: eps is 2^-(explicit mantissa bits), {bits16:g} for fp16 and "
                                 f"{bits:g} for {fmt}; count the implicit leading 1 for both or for neither: "
                                 f"a ratio of {ratio:g}."),
    }
    return grade_model(
        predicted, ratio * fp16_lr, quantity=f"the learning rate at which {fmt} loses half the updates", unit="lr",
        wrong=wrong, rel=0.05, measured=measured, measured_by=f"adding the updates in {fmt} measured",
        too_high=(f"Too high: the spacing eps x 2^floor(log2 |w|) scales with eps, and {fmt}'s eps is {ratio:g} "
                  f"times fp16's: start from fp16's learning rate and multiply by {ratio:g}, not more."),
        too_low=(f"Too low: {fmt}'s numbers are {ratio:g} times farther apart than fp16's at the same weight, so "
                 f"its updates must be {ratio:g} times larger to survive: about {ratio:g} times fp16's rate."),
        why_close=(f"Everything but eps is the same for the two formats (the weights, the gradients), so the "
                   f"learning rate that loses half the updates moves with eps: {ratio:g} times fp16's for {fmt}. "
                   "Pure bf16 training without a float32 master copy needs that large a step, or stochastic "
                   "rounding."))


_OVERFLOW_NAMES = ("embed", "proj_in", "mix", "expand", "gate", "proj_out", "head")


def overflow_chain(seed: int):
    """A planted fp16 diagnosis: ``(model, x, name)``, an ``nn.Sequential`` of named linear layers, each but the
    planted ones followed by a tanh, in which the module ``name`` is the first whose float16 output holds an
    infinity. An even seed scales the culprit's weights up (outputs of a few hundred thousand, past fp16's
    65504); an odd seed grows the activations over two layers: the layer before the culprit has the largest
    weights but finite outputs of a few thousand, and the culprit's moderate weights carry them past 65504.
    Odd seeds also plant a decoy with large weights whose output stays finite, so "the layer with the largest
    weights" names the wrong module."""
    import collections

    import torch.nn as nn

    g = torch.Generator().manual_seed(seed)
    culprit = 1 + int(torch.randint(1, len(_OVERFLOW_NAMES) - 2, (1,), generator=g))
    growing = seed % 2 == 1
    scales = {culprit: 4e5} if not growing else {culprit - 1: 2000.0, culprit: 300.0, 0: 5000.0}
    layers = []
    for i, name in enumerate(_OVERFLOW_NAMES):
        lin = nn.Linear(32, 32)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(32, 32, generator=g) / 32 ** 0.5 * scales.get(i, 1.0))
            lin.bias.zero_()
        layers.append((name, lin))
        layers.append((f"{name}_act", nn.Identity() if i in (culprit, culprit - 1) and i in scales else nn.Tanh()))
    model = nn.Sequential(collections.OrderedDict(layers)).half()
    x = torch.randn(4, 32, generator=g).half()
    first = _flagged(model, x, lambda output: not torch.isfinite(output).all())
    if not first or first[0] != _OVERFLOW_NAMES[culprit]:  # the plant did not take: a bug here, not the learner's
        raise RuntimeError(f"overflow_chain({seed}): the first overflow is in {first[:1]}, not in "
                           f"{_OVERFLOW_NAMES[culprit]!r}")
    return model, x, _OVERFLOW_NAMES[culprit]


def overflow_transformer():
    """A real Transformer with a planted fp16 overflow: ``(model, ids)``, a small float32 ``DecoderLM`` (2
    layers, width 64, GELU feed-forwards, no dropout, in eval mode) and a (2, 16) batch of token ids, built
    the same every call without touching the global random state. One weight matrix is scaled by 1e5:
    in float32 and bfloat16 the loss is finite; in float16 a product passes 65,504, turns into inf, and
    the GELU after it turns -inf into NaN, so the loss is NaN. Where it starts is exercise 8.4's
    question (``mixed_precision.first_nonfinite`` answers it)."""
    from gpuformer_lib.model import DecoderLM, TransformerConfig

    config = TransformerConfig(d_model=64, n_heads=4, n_decoder_layers=2, d_ff=256, vocab_size=50, max_len=32,
                               dropout=0.0, activation="gelu")  # ReLU would zero a -inf; GELU makes it NaN
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = DecoderLM(config).eval()
    with torch.no_grad():
        model.blocks.layers[1].linear1.weight.mul_(1e5)
    return model, torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))


def _flagged(model, x, test: Callable[[torch.Tensor], bool], *, leaves: bool = False) -> list[str]:
    """The names of ``model``'s children (or, with ``leaves``, of its modules without children) whose output
    passes ``test``, in the order the forward pass runs them."""
    flagged: list[str] = []
    modules = ([(name, m) for name, m in model.named_modules() if name and not any(True for _ in m.children())]
               if leaves else list(model.named_children()))
    handles = [module.register_forward_hook(
        lambda module, inputs, output, name=name: flagged.append(name)
        if isinstance(output, torch.Tensor) and test(output) else None)
        for name, module in modules]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    return flagged


def _overflow_cases():
    """The planted models :func:`check_overflow_diagnosis` grades on: ``(label, model, x, want)``, four toy
    chains, then the float16 Transformer of :func:`overflow_transformer` with the module
    ``mixed_precision.first_nonfinite`` names."""
    from gpuformer_lib.mixed_precision import first_nonfinite

    for seed in (0, 1, 2, 3):
        yield (f"Planted model {seed}", *overflow_chain(seed))
    model, ids = overflow_transformer()
    model = model.half()
    with torch.no_grad():
        found = first_nonfinite(model, lambda: model(ids))
    if found is None:  # the plant did not take: a bug here, not the learner's
        raise RuntimeError("overflow_transformer(): its float16 forward stayed finite")
    yield "The planted Transformer (a DecoderLM in float16)", model, ids, found.module


@_safe_check
def check_overflow_diagnosis(fn: Callable) -> CheckResult:
    """``fn(model, x)``: the name (as ``model.named_modules()`` gives it) of the first module, in the order
    the forward pass runs them, whose float16 output holds an inf or NaN. Checked on planted models
    (:func:`overflow_chain`), some of which overflow through activations that grow over two layers, so the
    layer with the largest weights is not always the answer, and last on a real Transformer
    (:func:`overflow_transformer`, in float16), where the answer is a dotted name inside containers and is
    the module ``mixed_precision.first_nonfinite`` names."""
    hooks = (" Register a forward hook on every leaf module (register_forward_hook) that records its name when "
             "not torch.isfinite(output).all(), run the model once, and return the first name recorded; "
             "remove the hooks afterwards.")
    for label, model, x, want in _overflow_cases():
        real = label.startswith("The planted Transformer")
        got, err = _try(fn, model, x, none_ok=True)
        if err:
            return _report(False, f"{label}: {err}" if real else err)
        if got is None or got == "":
            what = "returned None" if got is None else "returned the empty string"
            return _report(False, f"{label}: your function {what}, as if no module overflowed. An "
                                  "overflow gives inf, which torch.isnan misses: test not "
                                  f"torch.isfinite(output).all().{hooks}")
        if isinstance(got, torch.nn.Module):
            return _report(False, "Return the module's name as a string (e.g. 'proj_in'), not the module itself: "
                                  "named_modules() gives (name, module) pairs.")
        if not isinstance(got, str):
            return _report(False, f"Return the module's name as a string (e.g. 'proj_in'), got {got!r}.")
        if got == want:
            continue
        names = [n for n, _ in model.named_modules() if n]
        # the order the forward pass runs them (the order they were registered in, for a Transformer, is not)
        order = _flagged(model, x, lambda output: True, leaves=True)
        weights = {n: float(m.weight.detach().float().abs().max()) for n, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear)}
        if got not in names:
            if real and any(n.endswith("." + got) for n in names):
                return _report(False, f"{label}: the model has no module named {got!r}: give the whole dotted "
                                      "name, as model.named_modules() gives it, with the containers above the "
                                      "module (like 'blocks.layers.0.norm1').")
            listed = names if len(names) <= 16 else names[:8] + ["..."]
            return _report(False, f"{label}: the model has no module named {got!r}; its modules are "
                                  f"{listed}. Return a name as model.named_modules() gives it.{hooks}")
        nans = _flagged(model, x, lambda output: bool(torch.isnan(output).any()), leaves=True)
        if want.startswith(got + "."):
            hint = ("that is a container: its output is non-finite because the overflow began inside it, in one "
                    "of its own modules. Stepping through model.named_children(), or hooking only them, stops "
                    "at the container; hook every module without children (the leaves), in the order the "
                    "forward pass runs them")
        elif nans and got == nans[0]:
            hint = ("that module's output is the first to hold a NaN; the overflow came earlier, as an inf, which "
                    "torch.isnan misses: test not torch.isfinite(output).all()")
        elif got in order and order.index(got) == order.index(want) + 1:
            hint = ("that module runs right after the overflow: its input already held inf. Test each module's "
                    "output, not its input (a forward hook, not a pre-hook)")
        elif got in order and order.index(got) > order.index(want):
            hint = "that module runs after the overflow: its inf came from an earlier one"
        elif got == max(weights, key=weights.get):
            hint = ("its output is still finite in float16, although it has the largest weights: an overflow is in "
                    "the values a module produces, which depend on its input too. Look at outputs, not weights")
        else:
            hint = "that module's output is still finite in float16"
        return _report(False, f"{label}: you named {got!r}, but {hint}.{hooks}")
    return _report(True, "Forward hooks find the first module whose fp16 output overflows, in a real Transformer "
                         "too: the place to compute in float32 (autocast's float32 list), rescale, or normalise, "
                         "instead of lowering the learning rate blindly.")
