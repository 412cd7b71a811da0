"""Chapter 8: does an update survive, the loss scale, bf16's half-loss learning rate, the first fp16 overflow."""

import math

import numpy as np
import torch

from answer_tables import Table, Wrong
from gpuformer_lib.exercises import precision
from gpuformer_lib.mixed_precision import first_nonfinite

# ---- 8.1 does the update survive?


def _spacing(weight, dtype):
    return torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(abs(weight)))


def _survives(weight, update, dtype):
    """The chapter's solution."""
    return abs(update) > _spacing(weight, dtype) / 2


def _survives_by_adding(weight, update, dtype):
    w = torch.tensor(weight, dtype=dtype)
    return np.bool_((w + torch.tensor(update, dtype=dtype)) != w)


CHECK_UPDATE_SURVIVES = Table(
    "check_update_survives", precision.check_update_survives,
    right=(_survives, _survives_by_adding,
           lambda w, u, d: abs(u) > torch.finfo(d).eps * 2.0 ** (math.frexp(abs(w))[1] - 1) / 2),
    wrong=(Wrong("eps without the weight's scale", lambda w, u, d: abs(u) > torch.finfo(d).eps / 2,
                 ("spacing near 1 only",)),
           Wrong("eps alone", lambda w, u, d: abs(u) > torch.finfo(d).eps, ("spacing near 1 only", "half")),
           Wrong("the whole spacing", lambda w, u, d: abs(u) > _spacing(w, d), ("half the spacing, not the whole",)),
           Wrong("relative to |w|", lambda w, u, d: abs(u) / abs(w) > torch.finfo(d).eps,
                 ("relative threshold", "power of two")),
           Wrong("relative to |w|, halved", lambda w, u, d: abs(u / w) > torch.finfo(d).eps / 2,
                 ("relative threshold", "512")),
           Wrong(">= at the tie", lambda w, u, d: abs(u) >= _spacing(w, d) / 2, ("tie", "even")),
           Wrong("fp16's eps for every format", lambda w, u, d: abs(u) > _spacing(w, torch.float16) / 2,
                 ("own eps",)),
           Wrong("log2 of a negative weight", lambda w, u, d: abs(u) > torch.finfo(d).eps * 2.0 ** math.floor(
               math.log2(w)) / 2, ("can be negative", "|w|")),
           Wrong("always True", lambda w, u, d: True, ("rounds away",))),
)

# ---- 8.2 the loss scale


def _final_scale(init_scale, overflows, growth_interval):
    """The chapter's solution."""
    scale, clean = init_scale, 0
    for overflow in overflows:
        if overflow:
            scale, clean = scale / 2, 0
        else:
            clean += 1
            if clean == growth_interval:
                scale, clean = scale * 2, 0
    return scale


def _by_gradscaler(init_scale, overflows, growth_interval):
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    w = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([w], lr=0.0)
    for overflow in overflows:
        scaler.scale((w * (float("inf") if overflow else 1.0)).sum()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    return scaler.get_scale()


def _scale_keeping_count(init_scale, overflows, growth_interval):
    scale, clean = init_scale, 0
    for overflow in overflows:
        if overflow:
            scale /= 2  # the count of clean steps goes on
        else:
            clean += 1
            if clean == growth_interval:
                scale, clean = scale * 2, 0
    return scale


def _scale_never_restarting(init_scale, overflows, growth_interval):
    scale, clean = init_scale, 0
    for overflow in overflows:
        if overflow:
            scale, clean = scale / 2, 0
        else:
            clean += 1
            if clean >= growth_interval:  # doubles at every clean step after the first growth
                scale *= 2
    return scale


def _scale_late(init_scale, overflows, growth_interval):
    scale, clean = init_scale, 0
    for overflow in overflows:
        if overflow:
            scale, clean = scale / 2, 0
        elif clean == growth_interval:  # counts, then compares: one step late
            scale, clean = scale * 2, 0
        else:
            clean += 1
    return scale


def _scale_no_back_off(init_scale, overflows, growth_interval):
    scale, clean = init_scale, 0
    for overflow in overflows:
        if overflow:
            clean = 0  # the step is skipped, the scale kept
        else:
            clean += 1
            if clean == growth_interval:
                scale, clean = scale * 2, 0
    return scale


def _scale_up_on_overflow(init_scale, overflows, growth_interval):
    scale, clean = init_scale, 0
    for overflow in overflows:
        if overflow:
            scale, clean = scale * 2, 0
        else:
            clean += 1
            if clean == growth_interval:
                scale, clean = scale * 2, 0
    return scale


CHECK_LOSS_SCALE = Table(
    "check_loss_scale", precision.check_loss_scale,
    right=(_final_scale, _by_gradscaler),
    wrong=(Wrong("the count kept over an overflow", _scale_keeping_count, ("restarts the count",)),
           Wrong("the count kept after a growth", _scale_never_restarting, ("starts again from 0",)),
           Wrong("doubling one step late", _scale_late, ("growth_interval-th", "not on the one after")),
           Wrong("never growing", lambda s, o, i: s / 2 ** sum(o), ("never grew",)),
           Wrong("no back-off", _scale_no_back_off, ("also halves",)),
           Wrong("doubling on an overflow", _scale_up_on_overflow, ("halves, it does not double",))),
)

# ---- 8.3 bf16's half-loss learning rate (fp16's measured 0.102, bf16's 0.815, as in the chapter)

FP16_LR, BF16_MEASURED = 0.102, 0.815
EPS_RATIO = torch.finfo(torch.bfloat16).eps / torch.finfo(torch.float16).eps

CHECK_HALF_LOSS_LR_PREDICTION = Table(
    "check_half_loss_lr_prediction",
    lambda predicted: precision.check_half_loss_lr_prediction(predicted, BF16_MEASURED, fmt="bf16", fp16_lr=FP16_LR),
    right=(EPS_RATIO * FP16_LR, 8 * FP16_LR, 0.82, torch.tensor(0.8)),
    wrong=(Wrong("fp16's rate", FP16_LR, ("fp16's learning rate", "8 times")),
           Wrong("the ratio upside down", FP16_LR / 8, ("upside down",)),
           Wrong("the ratio of mantissa bits", FP16_LR * 10 / 7, ("2^(10 - 7)",)),
           Wrong("the implicit bit counted for bf16 only", FP16_LR * 2 ** (10 - 8), ("one bit off", "implicit")),
           Wrong("the implicit bit counted for fp16 only", FP16_LR * 2 ** (11 - 7), ("one bit off", "implicit")),
           Wrong("float32's eps", FP16_LR * 2 ** 13, ("too high", "multiply by 8"))),
)

# ---- 8.4 the first module whose fp16 output overflows


def _overflow_hooks(model, x, pre=False):
    found = []

    def record(name):
        def hook(module, *args):
            tensor = args[0][0] if pre else args[1]
            if not torch.isfinite(tensor).all():
                found.append(name)

        return hook

    leaves = [(name, m) for name, m in model.named_modules() if name and not list(m.children())]
    register = "register_forward_pre_hook" if pre else "register_forward_hook"
    handles = [getattr(m, register)(record(name)) for name, m in leaves]
    try:
        model(x)
    finally:
        for handle in handles:
            handle.remove()
    return found


def _first_overflow(model, x):
    """The chapter's solution."""
    found = _overflow_hooks(model, x)
    return found[0] if found else ""


def _stepping_through(model, x):
    for name, module in model.named_children():
        x = module(x)
        if not torch.isfinite(x).all():
            return name
    return ""


def _first_nan(model, x):
    for name, module in model.named_children():
        x = module(x)
        if torch.isnan(x).any():
            return name
    return None


def _largest_weights(model, x):
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    return max(linears, key=lambda item: item[1].weight.detach().abs().max().item())[0]


def _hooks_on_every_module(model, x):
    """Hooks on the containers too: a leaf finishes before its container, so the first name is still right."""
    found = []
    handles = [m.register_forward_hook(lambda m, i, out, name=name: found.append(name)
                                       if isinstance(out, torch.Tensor) and not torch.isfinite(out).all() else None)
               for name, m in model.named_modules() if name]
    try:
        model(x)
    finally:
        for handle in handles:
            handle.remove()
    return found[0] if found else ""


def _by_first_nonfinite(model, x):
    found = first_nonfinite(model, lambda: model(x))
    return found.module if found else ""


def _hooks_on_children(model, x):
    """Right on a flat chain; on a Transformer it stops at the container the overflow is in."""
    found = []
    handles = [m.register_forward_hook(lambda m, i, out, name=name: found.append(name)
                                       if not torch.isfinite(out).all() else None)
               for name, m in model.named_children()]
    try:
        model(x)
    finally:
        for handle in handles:
            handle.remove()
    return found[0] if found else ""


CHECK_OVERFLOW_DIAGNOSIS = Table(
    "check_overflow_diagnosis", precision.check_overflow_diagnosis,
    right=(_first_overflow, _hooks_on_every_module, _by_first_nonfinite),
    wrong=(Wrong("the last module that overflows", lambda m, x: _overflow_hooks(m, x)[-1], ("after the overflow",)),
           Wrong("the first module whose input overflows", lambda m, x: _overflow_hooks(m, x, pre=True)[0],
                 ("input already held inf",)),
           Wrong("the layer with the largest weights", _largest_weights, ("largest weights", "outputs, not weights")),
           Wrong("NaN only", _first_nan, ("isnan misses",)),
           Wrong("the module itself", lambda m, x: dict(m.named_modules())[_first_overflow(m, x)],
                 ("not the module itself",)),
           Wrong("stepping through the children (right on the chains only)", _stepping_through,
                 ("Transformer", "container", "leaves")),
           Wrong("hooks on the children only", _hooks_on_children, ("Transformer", "container", "leaves")),
           Wrong("the last part of the dotted name", lambda m, x: _first_overflow(m, x).split(".")[-1],
                 ("Transformer", "whole dotted name")),
           Wrong("the first NaN, with hooks on the leaves",
                 lambda m, x: next((n for n in _overflow_hooks(m, x) if torch.isnan(_output_of(m, x, n)).any()),
                                   None),
                 ("isnan misses",))),
)


def _output_of(model, x, name):
    """The output of the module ``name`` in one forward pass."""
    out = []
    handle = dict(model.named_modules())[name].register_forward_hook(lambda m, i, o: out.append(o))
    try:
        model(x)
    finally:
        handle.remove()
    return out[0]


TABLES = [CHECK_UPDATE_SURVIVES, CHECK_LOSS_SCALE, CHECK_HALF_LOSS_LR_PREDICTION, CHECK_OVERFLOW_DIAGNOSIS]
