"""Chapter 6: AdamW from scratch, against torch.optim.AdamW."""

from answer_tables import Table, Wrong
from gpuformer_lib.exercises import adamw
from gpuformer_lib.exercises.adamw import reference_step


def mistaken(**switches):
    return lambda *args: reference_step(*args, **switches)


def learner_style(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    """The update as a learner writes it, in place on copies, not through the reference's switches."""
    param = param.clone().mul_(1 - lr * weight_decay)
    exp_avg = exp_avg.clone().mul_(beta1).add_(grad, alpha=1 - beta1)
    exp_avg_sq = exp_avg_sq.clone().mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    denom = (exp_avg_sq / (1 - beta2**step)).sqrt() + eps
    return param - lr * (exp_avg / (1 - beta1**step)) / denom, exp_avg, exp_avg_sq


TABLES = [
    Table(
        "check_adamw_step", adamw.check_adamw_step,
        right=(reference_step, learner_style),
        wrong=(Wrong("no bias correction", mistaken(bias_correction=False), ("without bias correction",)),
               Wrong("L2 decay", mistaken(decoupled=False), ("L2", "decouples")),
               Wrong("decay without lr", mistaken(decay_times_lr=False), ("scales it by the learning rate",)),
               Wrong("eps inside sqrt", mistaken(eps_inside=True), ("inside the square root",)),
               Wrong("first moment uncorrected", mistaken(first_correction=False), ("first's",)),
               Wrong("betas swapped", mistaken(swap_betas=True), ("swapped",)),
               Wrong("abs for square", mistaken(abs_second=True), ("g * g",)),
               Wrong("plain SGD", lambda p, g, m, v, *rest: (p - rest[1] * g, m, v),
                     ("differs from torch.optim.AdamW",)),
               Wrong("returns only param", lambda p, g, m, v, *rest: p, ("three tensors",))),
    ),
]
