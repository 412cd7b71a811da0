"""Chapter 6: the loss of an untrained model, label smoothing, AdamW's state, the paper's warm-up schedule."""

import functools
import math

import torch
import torch.nn.functional as F

from answer_tables import Table, Wrong
from gpuformer_lib.exercises import optimizers, training
from gpuformer_lib.model import DecoderLM, TransformerConfig

V, EPS = 1000, 0.1
"""Exercise 6.1's vocabulary and label smoothing."""


def grade_initial_loss(answer):
    # 6.97 nats: what the notebook measured for its untrained model (shown beside the model, not graded)
    return optimizers.check_initial_loss_prediction(answer, 6.97, vocab_size=V, label_smoothing=EPS)


@functools.cache
def adamw_parameters() -> int:
    """Exercise 6.3's model (its parameter count does not depend on the seed)."""
    model = DecoderLM(TransformerConfig(vocab_size=100, d_model=64, n_heads=4, n_decoder_layers=2, d_ff=128))
    return sum(p.numel() for p in model.parameters())


def grade_adamw(answer):
    n = adamw_parameters()
    # the notebook's model is bfloat16: optimizer.state holds two bfloat16 moments, 4 B per parameter
    return optimizers.check_adamw_state_prediction(answer, 4 * n, n_parameters=n, dtype=torch.bfloat16)


def per_parameter(bytes_each):
    return lambda: bytes_each * adamw_parameters()



def smoothed(logits, targets, eps):
    """The chapter's solution."""
    log_p = logits.log_softmax(dim=-1)  # (N, V)
    nll = -log_p.gather(1, targets[:, None]).squeeze(1)  # the true class
    uniform = -log_p.mean(dim=-1)  # every class, equally
    return ((1 - eps) * nll + eps * uniform).mean()


def _parts(logits, targets):
    log_p = logits.log_softmax(-1)
    return log_p, -log_p.gather(1, targets[:, None]).squeeze(1)


def paper_lr(step, d_model, warmup):
    """The chapter's solution."""
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


TABLES = [
    Table(
        "check_initial_loss_prediction", grade_initial_loss,
        right=(math.log(V), 6.9, round(math.log(V), 2)),
        wrong=(Wrong("label smoothing adds about 0.6 nats", 7.5, ("does not add",)),
               Wrong("label smoothing removes eps * ln V", (1 - EPS) * math.log(V), ("does not lower",)),
               Wrong("bits (log2)", math.log2(V), ("log2", "nats")),
               Wrong("log10", math.log10(V), ("log10", "natural log")),
               Wrong("the probability 1/V", 1 / V, ("1/V", "negative log")),
               Wrong("the smoothed target's entropy", 1.01, ("entropy of the smoothed target",)),
               Wrong("a formula as text", "ln 1000", ("Predict a number",))),
    ),
    Table(
        "check_label_smoothing", training.check_label_smoothing,
        right=(smoothed, lambda lg, t, e: F.cross_entropy(lg, t, label_smoothing=e)),
        wrong=(Wrong("eps over V - 1 classes",
                     lambda lg, t, e: ((1 - e) * _parts(lg, t)[1]
                                       + e * (-_parts(lg, t)[0].sum(-1) - _parts(lg, t)[1]) / (lg.shape[1] - 1)).mean(),
                     ("V - 1", "all V classes")),
               Wrong("no (1 - eps) weight",
                     lambda lg, t, e: (_parts(lg, t)[1] - e * _parts(lg, t)[0].mean(-1)).mean(), ("(1 - eps)",)),
               Wrong("eps ignored", lambda lg, t, e: F.cross_entropy(lg, t), ("eps is ignored",)),
               Wrong("sum over the rows", lambda lg, t, e: F.cross_entropy(lg, t, label_smoothing=e, reduction="sum"),
                     ("summed over the N rows", "mean")),
               Wrong("sum over the classes",
                     lambda lg, t, e: ((1 - e) * _parts(lg, t)[1] + e * -_parts(lg, t)[0].sum(-1)).mean(),
                     ("mean over the V classes",))),
    ),
    Table(
        "check_adamw_state_prediction", lambda answer: grade_adamw(answer() if callable(answer) else answer),
        right=(per_parameter(4), per_parameter(2 * 2)),
        wrong=(Wrong("float32 moments (the 8 B of section 6.8)", per_parameter(8), ("float32 moments", "zeros_like")),
               Wrong("mixed precision's master copy", per_parameter(12), ("master copy",)),
               Wrong("float32 training's 16 B", per_parameter(16), ("whole state of float32",)),
               Wrong("one moment", per_parameter(2), ("two moments", "SGD with momentum")),
               Wrong("the parameter count", per_parameter(1), ("number of parameters",)),
               Wrong("not a number", "8 bytes per parameter", ("Predict a number",))),
    ),
    Table(
        "check_warmup_schedule", training.check_warmup_schedule,
        right=(paper_lr, lambda s, d, w: d**-0.5 * min(s**-0.5, s / w**1.5)),
        wrong=(Wrong("no d_model factor", lambda s, d, w: min(s**-0.5, s * w**-1.5), ("d_model^-0.5",)),
               Wrong("d_model^+0.5", lambda s, d, w: d**0.5 * min(s**-0.5, s * w**-1.5), ("negative exponent",)),
               Wrong("max for min", lambda s, d, w: d**-0.5 * max(s**-0.5, s * w**-1.5), ("min, not max",)),
               Wrong("warmup^-0.5", lambda s, d, w: d**-0.5 * min(s**-0.5, s * w**-0.5), ("warmup^-1.5",)),
               Wrong("no decay after the warm-up", lambda s, d, w: d**-0.5 * min(w**-0.5, s * w**-1.5),
                     ("decay", "1/sqrt(step)")),
               Wrong("steps from 0 (step + 1)",
                     lambda s, d, w: d**-0.5 * min((s + 1)**-0.5, (s + 1) * w**-1.5), ("off by one",))),
    ),
]
