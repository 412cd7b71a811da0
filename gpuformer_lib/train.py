"""The training loop every later chapter uses, and what it needs: schedules, parameter groups,
checkpoints that resume exactly, and a history of metrics for plots.

The loop knows nothing about any particular model (minGPT's habit): it gets a ``loss_fn(model,
batch) -> (mean loss, tokens)`` and a ``get_batch(step) -> batch``. Because a batch is a function of
the step, a run resumed from a checkpoint sees exactly the batches the uninterrupted run would have,
and (with the random-number state restored) produces the same losses.

Options where later chapters plug in: ``precision`` (fp32, or bf16/fp16 autocast, fp16 with a
gradient scaler; chapter 8), ``grad_accum_steps`` (chapter 9), and the model itself may be wrapped
(``DistributedDataParallel``, chapter 11) before it is passed in. The step itself (autocast,
backward, accumulation, clipping, update) is ``speed.make_train_step``, shared with the ladder.

Leaves out: data (``data``), models (``model``), decoding and BLEU (``generate``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from tqdm.auto import tqdm

from gpuformer_lib.speed import make_train_step

SCHEDULES = ("constant", "inverse_sqrt", "cosine")
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How to train. Change one with ``dataclasses.replace(config, ...)``."""

    max_steps: int = 1000
    """Optimizer steps to run."""
    lr: float = 3e-4
    """Peak learning rate, reached at the end of warm-up."""
    weight_decay: float = 0.1
    """AdamW's decoupled weight decay, applied to matrices only (not to biases and norms)."""
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9
    warmup_steps: int = 100
    """Steps of linear warm-up from 0 to ``lr``."""
    schedule: str = "cosine"
    """After warm-up: 'constant', 'inverse_sqrt' (the paper's) or 'cosine' (down to min_lr_ratio * lr)."""
    min_lr_ratio: float = 0.1
    grad_clip: float | None = 1.0
    """Clip the global gradient norm to this; None to not clip (the norm is still recorded)."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step, whose gradients add up before the step (chapter 9)."""
    normalize_by: str = "micro_batches"
    """How accumulated gradients are averaged. 'micro_batches': each micro-batch's mean loss is divided
    by grad_accum_steps, exact when every micro-batch has as many tokens. 'tokens': each loss is
    weighted by its token count and the sum divided by the step's total, so the gradient equals one
    large batch's however the padding falls."""
    precision: str = "fp32"
    """'fp32', or autocast in 'bf16' or 'fp16' (fp16 with dynamic loss scaling)."""
    log_every: int = 10
    """Read the loss back from the device every this many steps (each read waits for the GPU)."""
    eval_every: int = 0
    """Evaluate every this many steps (0: only at the end)."""
    checkpoint_every: int = 0
    """Write a checkpoint every this many steps (0: never); needs ``checkpoint_path``."""
    checkpoint_path: str | None = None
    seed: int = 0
    progress: bool = True
    """Show a progress bar."""

    def __post_init__(self):
        if self.max_steps < 1 or self.lr <= 0 or self.warmup_steps < 0 or self.grad_accum_steps < 1:
            raise ValueError("need max_steps >= 1, lr > 0, warmup_steps >= 0 and grad_accum_steps >= 1")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, not {self.schedule!r}")
        if self.normalize_by not in ("micro_batches", "tokens"):
            raise ValueError(f"normalize_by must be 'micro_batches' or 'tokens', not {self.normalize_by!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {tuple(PRECISIONS)}, not {self.precision!r}")
        if self.schedule == "inverse_sqrt" and self.warmup_steps == 0:
            raise ValueError("the inverse square-root schedule needs warmup_steps > 0")
        if not 0 <= self.min_lr_ratio <= 1 or self.log_every < 1:
            raise ValueError("need 0 <= min_lr_ratio <= 1 and log_every >= 1")
        if self.checkpoint_every and not self.checkpoint_path:
            raise ValueError("checkpoint_every needs a checkpoint_path")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ValueError(f"grad_clip must be positive or None, got {self.grad_clip}")


def lr_multiplier(config: TrainConfig) -> Callable[[int], float]:
    """The factor of ``config.lr`` at each step (0-based), for ``torch.optim.lr_scheduler.LambdaLR``.

    'inverse_sqrt' is the paper's schedule, d^-0.5 * min(s^-0.5, s * warmup^-1.5), scaled so that its
    peak, at the end of warm-up, is 1.
    """
    warmup, total = config.warmup_steps, config.max_steps

    def multiplier(step: int) -> float:
        s = step + 1
        if s <= warmup:
            return s / warmup
        if config.schedule == "constant":
            return 1.0
        if config.schedule == "inverse_sqrt":
            return math.sqrt(warmup / s)
        progress = min(1.0, (s - warmup) / max(1, total - warmup))
        return config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return multiplier


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two groups: matrices (linear and embedding weights) decay; vectors (biases, norm scales) do not.

    Decaying a LayerNorm's scale or a bias pulls it towards 0, which changes what the layer computes
    rather than regularising how much it relies on any input.
    """
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(parameter_groups(model, config.weight_decay), lr=config.lr, betas=config.betas,
                             eps=config.eps)


@dataclasses.dataclass
class History:
    """Metrics of a run, for plots: one entry per logged step, and one per evaluation."""

    step: list[int] = dataclasses.field(default_factory=list)
    loss: list[float] = dataclasses.field(default_factory=list)
    lr: list[float] = dataclasses.field(default_factory=list)
    grad_norm: list[float] = dataclasses.field(default_factory=list)
    tokens: list[int] = dataclasses.field(default_factory=list)
    """Tokens processed up to and including the step."""
    loss_scale: list[float] = dataclasses.field(default_factory=list)
    """fp16 only: the gradient scaler's scale after each logged step (it halves on an overflow)."""
    eval_step: list[int] = dataclasses.field(default_factory=list)
    eval_loss: list[float] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    """Training time so far, evaluation excluded."""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens[-1] / self.seconds if self.tokens and self.seconds else 0.0


def _move(batch: Any, device: torch.device) -> Any:
    non_blocking = device.type == "cuda"
    if hasattr(batch, "to"):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, (tuple, list)):
        return type(batch)(_move(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _move(v, device) for k, v in batch.items()}
    return batch


def save_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler, scaler,
                    step: int, history: History, config: TrainConfig) -> None:
    """Write everything needed to continue exactly, atomically: a crash mid-write leaves the old file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(), "step": step, "history": history.as_dict(),
        "config": dataclasses.asdict(config), "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python_rng": random.getstate(),
    }
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _restore_cuda_rng(saved: list[torch.Tensor]) -> None:
    """Set each visible GPU's generator from a checkpoint's per-GPU states (CPU ByteTensors, as CUDA wants)."""
    present = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if saved and len(saved) != present:
        warnings.warn(f"the checkpoint holds the random-number states of {len(saved)} GPU(s) and this machine has "
                      f"{present}: restoring {min(len(saved), present)}; dropout masks on the other GPUs will "
                      "differ from the uninterrupted run's", stacklevel=3)
    for index, rng in enumerate(saved[:present]):
        torch.cuda.set_rng_state(rng.cpu(), index)


def load_checkpoint(path: str | Path, model: nn.Module, optimizer=None, scheduler=None, scaler=None,
                    map_location: str | torch.device = "cpu") -> tuple[int, History]:
    """Restore a checkpoint (loaded with ``weights_only=True``: no code in the file is run).
    Returns the step to continue from and the history so far.

    ``map_location`` places the model and optimizer tensors (e.g. straight onto the GPU); the
    random-number states are always restored from CPU copies, the only form ``torch.set_rng_state``
    accepts. A checkpoint written with more GPUs than this machine has restores the generators of the
    GPUs present and warns that the resumed run is then not an exact continuation."""
    state = torch.load(path, map_location=map_location, weights_only=True)
    model.load_state_dict(state["model"])
    for obj, key in ((optimizer, "optimizer"), (scheduler, "scheduler"), (scaler, "scaler")):
        if obj is not None:
            obj.load_state_dict(state[key])
    torch.set_rng_state(state["torch_rng"].cpu())  # map_location=cuda puts it on the GPU
    _restore_cuda_rng(state["cuda_rng"])
    version, internal, gauss = state["python_rng"]
    random.setstate((version, tuple(internal), gauss))
    return state["step"], History(**state["history"])


# Relative tolerance for a resumed run's losses on a GPU, by precision. Measured as a stand-in on a CPU
# (small decoder LMs, 4-8 steps after the resume): 1% noise on every gradient element, every step, moved
# the losses by at most 2e-6 (fp32) and 1e-4 (bf16) relatively; a resume that forgets the random-number
# state moved them by 2.5e-3 or more, one that forgets the schedule by 7e-2. The tolerances sit between.
# (tests/test_train.py checks both sides.)
_GPU_RESUME_RTOL = {"fp32": 1e-5, "bf16": 5e-4, "fp16": 5e-4}


def resume_tolerance(device: torch.device | str, precision: str) -> dict[str, float]:
    """``rtol``/``atol`` for ``torch.testing.assert_close`` between a resumed run's losses and the
    uninterrupted run's, over a few steps after the resume.

    On a CPU the kernels add in a fixed order, so a correct resume is exact: (0, 0). On a GPU it is
    exact only up to the order of floating-point sums: fused attention's backward (flash,
    memory-efficient) accumulates with atomic adds, whose order varies from run to run, so the two runs
    drift apart by rounding. The tolerance still catches what a broken resume does (wrong dropout masks,
    batches, optimizer state or schedule)."""
    if precision not in _GPU_RESUME_RTOL:
        raise ValueError(f"precision must be one of {tuple(_GPU_RESUME_RTOL)}, not {precision!r}")
    if torch.device(device).type == "cpu":
        return {"rtol": 0.0, "atol": 0.0}
    return {"rtol": _GPU_RESUME_RTOL[precision], "atol": 0.0}


def compare_resumed(resumed: list[float], full: list[float], device: torch.device | str, precision: str) -> str:
    """Check that a resumed run's losses match the uninterrupted run's within :func:`resume_tolerance`
    (``AssertionError`` if not) and return a sentence saying how closely they match."""
    if len(resumed) != len(full) or not full:
        raise ValueError(f"need as many resumed losses as uninterrupted ones (and some), got {len(resumed)} "
                         f"and {len(full)}")
    tolerance = resume_tolerance(device, precision)
    torch.testing.assert_close(resumed, full, **tolerance)
    gap = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(resumed, full))
    if gap == 0:
        return f"all {len(full)} losses identical, bit for bit"
    return (f"largest relative difference {gap:.1e}, within the {tolerance['rtol']:.0e} that the order of "
            f"the GPU's floating-point sums allows ({precision})")


def train(
    model: nn.Module,
    loss_fn: Callable[[nn.Module, Any], tuple[torch.Tensor, int]],
    get_batch: Callable[[int], Any],
    config: TrainConfig,
    *,
    eval_fn: Callable[[nn.Module], float] | None = None,
    device: torch.device | str | None = None,
    resume_from: str | Path | None = None,
) -> History:
    """Train ``model`` for ``config.max_steps`` optimizer steps and return the :class:`History`.

    ``loss_fn(model, batch)`` returns the mean loss over the batch's tokens and the token count (an
    int, or a tensor on the device: it is read back only when logging, so it costs no sync);
    ``get_batch(i)`` returns micro-batch ``i`` (``step * grad_accum_steps + micro``);
    ``eval_fn(model)`` returns a validation loss (it runs under ``torch.no_grad`` in eval mode).
    """
    device = torch.device(device) if device is not None else next(model.parameters()).device
    model.to(device)
    optimizer = make_optimizer(model, config)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(config))
    scaler = torch.amp.GradScaler(device.type, enabled=config.precision == "fp16")
    dtype = PRECISIONS[config.precision]
    start, history = 0, History()
    if resume_from is not None:
        start, history = load_checkpoint(resume_from, model, optimizer, scheduler, scaler, map_location=device)
    else:
        torch.manual_seed(config.seed)
    if start >= config.max_steps:
        return history
    train_step = make_train_step(model, optimizer, loss_fn, dtype=dtype, scaler=scaler,
                                 grad_accum_steps=config.grad_accum_steps, normalize_by=config.normalize_by,
                                 grad_clip=config.grad_clip if config.grad_clip else float("inf"),
                                 # a DDP-wrapped model all-reduces once per step, not once per micro-batch
                                 no_sync=getattr(model, "no_sync", None) if config.grad_accum_steps > 1 else None)
    pending: list[tuple] = []  # read back every log_every steps
    tokens = torch.tensor(history.tokens[-1] if history.tokens else 0, device=device)  # stays on the device

    def flush() -> None:
        for step, loss, norm, lr, tok, scale in pending:
            history.step.append(step)
            history.loss.append(loss.item())  # waits for the device: done once per log_every steps
            history.grad_norm.append(norm.item())
            history.lr.append(lr)
            history.tokens.append(int(tok.item()))
            if scale is not None:
                history.loss_scale.append(float(scale))
        pending.clear()

    bar = tqdm(range(start, config.max_steps), initial=start, total=config.max_steps, disable=not config.progress,
               desc="training", unit="step")
    started = time.perf_counter()
    for step in bar:
        model.train()
        lr = optimizer.param_groups[0]["lr"]
        micro_batches = (_move(get_batch(step * config.grad_accum_steps + micro), device)
                         for micro in range(config.grad_accum_steps))
        out = train_step(micro_batches)  # forward, backward, clip and update; nothing read back
        tokens += out.tokens.to(tokens.dtype) if torch.is_tensor(out.tokens) else out.tokens
        scheduler.step()
        scale = scaler._scale.detach().clone() if scaler.is_enabled() else None  # stays on the device until logged
        pending.append((step, out.loss, out.grad_norm, lr, tokens.clone(), scale))
        done = step + 1
        if done % config.log_every == 0 or done == config.max_steps:
            flush()
            bar.set_postfix(loss=f"{history.loss[-1]:.3f}", lr=f"{lr:.2e}")
        is_eval = eval_fn is not None and ((config.eval_every and done % config.eval_every == 0)
                                           or done == config.max_steps)
        if is_eval or (config.checkpoint_every and done % config.checkpoint_every == 0):
            flush()
            history.seconds += time.perf_counter() - started
            if is_eval:
                model.eval()
                with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                    history.eval_loss.append(float(eval_fn(model)))
                history.eval_step.append(step)
            if config.checkpoint_every and done % config.checkpoint_every == 0:
                save_checkpoint(config.checkpoint_path, model, optimizer, scheduler, scaler, done, history, config)
            started = time.perf_counter()
    flush()
    history.seconds += time.perf_counter() - started
    bar.close()
    return history

