"""Prediction checks for the chapter on losses and optimizers (chapter 6).

Both quantities have a formula: the loss of an untrained model is ln V (uniform predictions score ln V against
any target distribution, label-smoothed or not), and AdamW's state is two moments per parameter in the
parameter's dtype. So each check grades the prediction against its formula with
:func:`~gpuformer_lib.exercises.predictions.grade_model`, names the plausible mistakes it recognises, and shows
the notebook's measurement beside the model without grading against it: an untrained model's measured loss
sits a little off ln V by its random initialisation, and a band wide enough for that admitted wrong answers.
"""

from __future__ import annotations

import math

import torch

from gpuformer_lib.exercises._core import CheckResult
from gpuformer_lib.exercises.predictions import grade_model

INITIAL_LOSS_REL = 0.02
"""An initial-loss prediction passes within 2 % of ln V (0.14 nats at V = 1000): rounding, not a wrong model."""

ADAMW_STATE_REL = 0.02
"""A prediction of AdamW's state passes within 2 % of the formula's bytes (rounding)."""


def _merged(right: float, wrong: list[tuple[str, float, str]], rel: float) -> dict[str, tuple[float, str]]:
    """The wrong models as :func:`grade_model` takes them: one that gives the right number is no mistake here and
    is left out; two that give the same number are one entry whose hint names both."""
    merged: dict[str, tuple[float, str]] = {}
    for name, value, hint in wrong:
        if value <= 0 or abs(value / right - 1) <= 2 * rel:
            continue
        same = next((key for key, (other, _) in merged.items() if abs(value / other - 1) <= 2 * rel), None)
        if same is None:
            merged[name] = (value, hint)
        else:
            merged[f"{same} or {name}"] = (merged[same][0], f"{merged.pop(same)[1]} Or: {hint}")
    return merged


def check_initial_loss_prediction(predicted, measured: float, vocab_size: int, *,
                                  label_smoothing: float = 0.0) -> CheckResult:
    """Predict the cross-entropy (in nats) of an untrained language model over ``vocab_size`` tokens, trained
    with ``label_smoothing``; ``measured`` is its loss on a batch before any step, shown beside the model. Graded
    against ln V within 2 %: small logits give every token about 1/V, and a uniform prediction scores ln V
    against any target distribution, so label smoothing does not change it."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
        raise ValueError(f"vocab_size is an int >= 2, got {vocab_size!r}")
    if not 0 <= label_smoothing < 1:
        raise ValueError(f"label_smoothing is in [0, 1), got {label_smoothing!r}")
    chance = math.log(vocab_size)
    eps = label_smoothing
    wrong = [
        ("log base 2", math.log2(vocab_size),
         f"That is log2 V, in bits. PyTorch's cross-entropy uses the natural log: nats, ln V = {chance:.2f}."),
        ("log base 10", math.log10(vocab_size),
         f"That is log10 V. PyTorch's cross-entropy uses the natural log: nats, ln V = {chance:.2f}."),
        ("the probability 1/V", 1 / vocab_size,
         "That is the probability of each token, 1/V; the loss is its negative log, -ln(1/V) = ln V."),
    ]
    if eps > 0:
        target = 1 - eps + eps / vocab_size
        floor = -(target * math.log(target) + (vocab_size - 1) * (eps / vocab_size) * math.log(eps / vocab_size))
        wrong += [
            ("label smoothing adding eps * ln V", (1 + eps) * chance,
             f"Label smoothing does not add to the loss at initialisation: a uniform prediction gives -ln(1/V) = "
             f"ln V to every class, so any mix of targets, one-hot or smoothed, scores ln V = {chance:.2f}."),
            ("label smoothing removing eps * ln V", (1 - eps) * chance,
             f"Label smoothing does not lower the loss at initialisation: the eps share of the target is spread "
             f"over classes that each cost ln V too, so the loss stays ln V = {chance:.2f}."),
            ("the smoothed target's entropy", floor,
             f"{floor:.2f} nats is the entropy of the smoothed target, the lowest loss a perfectly trained model "
             f"can reach with label smoothing, not the loss of an untrained one (ln V = {chance:.2f})."),
        ]
    return grade_model(
        predicted, chance, quantity="the loss of an untrained model", unit="nats", rel=INITIAL_LOSS_REL,
        wrong=_merged(chance, wrong, INITIAL_LOSS_REL), measured=measured,
        measured_by="this model's loss before the first step measured",
        too_high=(f"An untrained model with small logits gives every token about 1/V, so its loss is about "
                  f"ln V = ln {vocab_size} = {chance:.2f}. A prediction above that assumes confident wrong "
                  "guesses; a measured loss far above it would mean the model's logits start too large."),
        too_low=(f"Below ln V = {chance:.2f} an untrained model cannot be, on average: it knows nothing of the "
                 "data yet. Natural log, not log2 or log10: PyTorch's cross-entropy is in nats."),
        why_close=(f"Small logits at initialisation give every token about 1/V: loss about ln V = {chance:.2f}, "
                   "with label smoothing or without. Check it before training: a loss far above ln V means the "
                   "initialisation is off."))


def check_adamw_state_prediction(predicted, measured: float, *, n_parameters: int,
                                 dtype: torch.dtype = torch.float32) -> CheckResult:
    """Predict the bytes of AdamW's optimizer state after one step, for a model of ``n_parameters`` parameters
    of ``dtype`` (plain ``torch.optim.AdamW``, no float32 master copy); ``measured`` is what
    ``optimizer.state`` holds (its tensors, not the scalar step counters), shown beside the model. Graded
    against the formula, within 2 %: two moments, m and v, per parameter, each in the parameter's dtype
    (AdamW creates them with ``torch.zeros_like(param)``)."""
    if isinstance(n_parameters, bool) or not isinstance(n_parameters, int) or n_parameters < 1:
        raise ValueError(f"n_parameters is a positive int, got {n_parameters!r}")
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype is a torch.dtype (the parameters'), got {dtype!r}")
    item = torch.empty((), dtype=dtype).element_size()
    n = n_parameters
    name = str(dtype).removeprefix("torch.")
    right = 2 * item * n
    wrong = [
        ("float32 moments", 8 * n,
         f"8 B per parameter is two float32 moments. AdamW creates m and v with torch.zeros_like(param): in the "
         f"parameter's dtype, {name} here, {item} B each."),
        ("the whole training state", 4 * item * n,
         f"{4 * item} B per parameter counts the weights and gradients too ({item} B each); they belong to the "
         "model, not to optimizer.state, which holds only the moments m and v."),
        ("mixed precision's 12 B", 12 * n,
         "12 B per parameter is mixed-precision training's state (ZeRO's K = 12): a float32 master copy plus "
         f"float32 moments. Plain AdamW on a {name} model keeps no master copy and makes its moments in {name}."),
        ("one moment", item * n,
         "AdamW keeps two moments per parameter, m (the mean of the gradient) and v (the mean of its square); "
         "one buffer is SGD with momentum."),
        ("the parameter count", float(n),
         f"That is the number of parameters; the state is bytes: two moments of {item} B per parameter."),
    ]
    if item != 4:  # for a float32 model this is the whole training state, named above
        wrong.append(("float32 training's 16 B", 16 * n,
                      "16 B per parameter is the whole state of float32 AdamW training: weights, gradients and two "
                      f"moments, 4 B each. optimizer.state holds only the moments, in {name} here: {item} B each."))
    return grade_model(
        predicted, right, quantity="AdamW's optimizer state", unit="bytes", rel=ADAMW_STATE_REL,
        wrong=_merged(right, wrong, ADAMW_STATE_REL), measured=measured, measured_by="optimizer.state held",
        too_high=f"The state is two {name} tensors per parameter, the moments m and v: {2 * item} B per parameter.",
        too_low=f"AdamW keeps two running averages per parameter, m and v, each {name} ({item} B): {2 * item} B "
                "per parameter.",
        why_close=(f"Two {name} moments per parameter: {2 * item} B each parameter, twice the weights. The scalar "
                   "step counters are a few bytes per tensor, not per parameter."))
