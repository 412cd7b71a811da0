"""Predict-then-measure checks for the chapter on losses and optimizers (chapter 6).

Each wrapper holds the tolerance and the explanations of the gap for :func:`grade_prediction`: the
learner predicts a number (the loss of an untrained model, the bytes of AdamW's state), the notebook
measures it on the device that runs it, and the check grades the prediction.
"""

from __future__ import annotations

import math

from gpuformer_lib.exercises._core import CheckResult
from gpuformer_lib.exercises.predictions import grade_prediction


def check_initial_loss_prediction(predicted, measured: float, vocab_size: int) -> CheckResult:
    """Predict the cross-entropy of an untrained language model over ``vocab_size`` tokens; ``measured``
    is its loss on a batch before any step. Passes within 10 %."""
    chance = math.log(vocab_size)
    return grade_prediction(
        predicted, measured, quantity="the loss of an untrained model", unit="nats", within=1.1,
        too_high=(f"An untrained model with small logits gives every token about 1/V, so its loss is about "
                  f"ln V = ln {vocab_size} = {chance:.2f}. A prediction far above that assumes confident wrong "
                  "guesses; a measured loss far above it would mean the model's logits start too large."),
        too_low=(f"Below ln V = {chance:.2f} an untrained model cannot be, on average: it knows nothing of the "
                 "data yet. Natural log, not log2 or log10: PyTorch's cross-entropy is in nats."),
        why_close=(f"Small logits at initialisation give every token about 1/V: loss about ln V = {chance:.2f}. "
                   "Check it before training: a loss far above ln V means the initialisation is off."))


def check_adamw_state_prediction(predicted, measured: float) -> CheckResult:
    """Predict the bytes of AdamW's optimizer state for a float32 model after one step; ``measured`` is
    what ``optimizer.state`` holds (its tensors, not the scalar step counters). Passes within 5 %."""
    return grade_prediction(
        predicted, measured, quantity="AdamW's optimizer state", unit="bytes", within=1.05,
        too_high=("The state is two float32 tensors per parameter, the moments m and v: 8 B per parameter. "
                  "The weights (4 B) and gradients (4 B) belong to the model, not to optimizer.state; 16 B per "
                  "parameter is the whole of AdamW training, weights and gradients included."),
        too_low=("AdamW keeps two running averages per parameter, m (the mean of the gradient) and v (the mean "
                 "of its square), each float32: 8 B per parameter. 4 B is SGD with momentum (one buffer); "
                 "2-byte moments would need a 16-bit optimizer."),
        why_close=("Two float32 moments per parameter: 8 B each parameter, twice the weights. The scalar step "
                   "counters are a few bytes per tensor, not per parameter."))
