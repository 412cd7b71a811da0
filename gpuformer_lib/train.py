"""The training loop every later chapter uses, and what it needs: schedules, parameter groups,
checkpoints that resume exactly, and a history of metrics for plots.

The loop knows nothing about any particular model (minGPT's habit): it gets a ``loss_fn(model,
batch) -> (mean loss, tokens)`` and a ``get_batch(step) -> batch``. Because a batch is a function of
the step (the loop seeds whatever ``get_batch`` draws from the step, apart from the model's random
stream), a run resumed from a checkpoint sees exactly the batches the uninterrupted run would have,
and (with the random-number state restored) produces the same losses.

What the loop guards against, without reading a value back from the device every step: a NaN or
infinite loss or gradient norm stops the run (:class:`NonFiniteLossError`) before it can overwrite
the last good checkpoint, or with ``on_nonfinite='skip'`` the step is skipped; a step without tokens
(:class:`EmptyStepError`); a resumed run whose config differs from its checkpoint's
(:class:`ConfigChangedError`); a device the model cannot train on, refused before the model is
touched. Checkpoint files (atomic writes, damaged files, stale temporaries) are ``checkpoint``'s.

Options where later chapters plug in: ``precision`` (fp32, or bf16/fp16 autocast, fp16 with a
gradient scaler; chapter 8), ``grad_accum_steps`` (chapter 9), and the model itself may be wrapped
(``DistributedDataParallel``, chapter 11) before it is passed in. The step itself (autocast,
backward, accumulation, clipping, update) is ``speed.make_train_step``, shared with the ladder.

Leaves out: data (``data``), models (``model``), decoding and BLEU (``generate``).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import random
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from tqdm.auto import tqdm

from gpuformer_lib._checks import require_bool_fields
from gpuformer_lib.checkpoint import check_finite, checkpoint_error, read_checkpoint, write_checkpoint
from gpuformer_lib.device import pick_device
from gpuformer_lib.rng import derived_seed, isolated_rng
from gpuformer_lib.speed import StepOutput, current_scale, make_train_step

SCHEDULES = ("constant", "inverse_sqrt", "cosine")
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
ON_NONFINITE = ("stop", "skip")


class NonFiniteLossError(FloatingPointError):
    """A training step's loss or gradient norm was NaN or infinite (outside the fp16 scaler's own skips)."""


class EmptyStepError(ValueError):
    """A training step whose micro-batches held no token at all: the data is wrong."""


class ConfigChangedError(ValueError):
    """A resumed run's config differs from its checkpoint's in fields that change what training computes."""


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_finite(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


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
    large batch's however the padding falls; with a data-parallel model (DDP) the token count is
    all-reduced over the ranks first (``speed.tokens_per_rank``), so the same holds across ranks."""
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
    """Seeds the model's random stream (dropout) at the start, and what ``get_batch(i)`` draws, with ``i``."""
    progress: bool = True
    """Show a progress bar."""
    on_nonfinite: str = "stop"
    """What a NaN or infinite loss or gradient norm does. 'stop': raise :class:`NonFiniteLossError` when
    it is read back (every ``log_every`` steps, and always before an evaluation or a checkpoint, so no
    checkpoint after it is written). 'skip': skip that step (no update, gradients zeroed) and list it in
    ``History.skipped_steps``; this reads the loss back every step, one host sync per step. Either way,
    30 skipped steps in a row (counting the fp16 scaler's) raise: the run is not training any more."""

    def __post_init__(self):
        for name, least in (("max_steps", 1), ("grad_accum_steps", 1), ("log_every", 1), ("warmup_steps", 0),
                            ("eval_every", 0), ("checkpoint_every", 0)):
            value = getattr(self, name)
            if not _is_int(value) or value < least:
                raise ValueError(f"need {name} >= {least} (an int), got {name}={value!r}")
        if not _is_int(self.seed):
            raise ValueError(f"seed must be an int, got {self.seed!r}")
        for name in ("lr", "weight_decay", "eps", "min_lr_ratio"):  # NaN passes every comparison: test it first
            if not _is_finite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {name}={getattr(self, name)!r}")
        if self.lr <= 0 or self.eps <= 0 or self.weight_decay < 0:
            raise ValueError(f"need lr > 0, eps > 0 and weight_decay >= 0, got lr={self.lr}, eps={self.eps}, "
                             f"weight_decay={self.weight_decay}")
        if not (isinstance(self.betas, (tuple, list)) and len(self.betas) == 2
                and all(_is_finite(b) and 0 <= b < 1 for b in self.betas)):
            raise ValueError(f"betas must be two numbers in [0, 1) (AdamW's averaging factors), got {self.betas!r}")
        if self.grad_clip is not None and not (_is_finite(self.grad_clip) and self.grad_clip > 0):
            raise ValueError(f"grad_clip must be a positive finite number, or None to not clip, got {self.grad_clip!r}")
        if self.on_nonfinite not in ON_NONFINITE:
            raise ValueError(f"on_nonfinite must be one of {ON_NONFINITE}, not {self.on_nonfinite!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, not {self.schedule!r}")
        if self.normalize_by not in ("micro_batches", "tokens"):
            raise ValueError(f"normalize_by must be 'micro_batches' or 'tokens', not {self.normalize_by!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {tuple(PRECISIONS)}, not {self.precision!r}")
        if self.schedule == "inverse_sqrt" and self.warmup_steps == 0:
            raise ValueError("the inverse square-root schedule needs warmup_steps > 0")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"need 0 <= min_lr_ratio <= 1, got {self.min_lr_ratio}")
        if self.checkpoint_every and not self.checkpoint_path:
            raise ValueError("checkpoint_every needs a checkpoint_path")
        require_bool_fields(self)
        if self.warmup_steps > self.max_steps:
            warnings.warn(f"warmup_steps={self.warmup_steps} > max_steps={self.max_steps}: the learning rate never "
                          f"reaches lr={self.lr} (it ends at {self.max_steps / self.warmup_steps:.0%} of it) and the "
                          f"{self.schedule} schedule never starts", stacklevel=3)


def lr_multiplier(config: TrainConfig) -> Callable[[int], float]:
    """The factor of ``config.lr`` at each step (0-based), for ``torch.optim.lr_scheduler.LambdaLR``.

    'inverse_sqrt' is the paper's schedule, d^-0.5 * min(s^-0.5, s * warmup^-1.5), scaled so that its
    peak, at the end of warm-up, is 1.
    """
    warmup, total = config.warmup_steps, config.max_steps

    def multiplier(step: int) -> float:
        if step < 0:
            raise ValueError(f"the schedule starts at step 0, got step {step}")
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
    if not isinstance(model, nn.Module):
        raise TypeError(f"parameter_groups needs an nn.Module (a model), got {type(model).__name__}")
    if not (_is_finite(weight_decay) and weight_decay >= 0):  # AdamW checks its default, not the groups' values
        raise ValueError(f"weight_decay must be a finite number >= 0, got {weight_decay!r}")
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over :func:`parameter_groups`. Under fp16 it is the fused kernel: ``GradScaler.step`` then
    hands the overflow flag to the optimizer on the device, where with the default (foreach) AdamW it
    reads ``found_inf.item()`` every step, a host sync (``torch/amp/grad_scaler.py``, ``_maybe_opt_step``)."""
    return torch.optim.AdamW(parameter_groups(model, config.weight_decay), lr=config.lr, betas=config.betas,
                             eps=config.eps, fused=True if config.precision == "fp16" else None)


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
    skipped_steps: list[int] = dataclasses.field(default_factory=list)
    """Steps skipped for a NaN or infinite loss or gradient norm (``on_nonfinite='skip'``)."""
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


CHECKPOINT_KEYS = ("model", "optimizer", "scheduler", "scaler", "step", "history", "config", "torch_rng",
                   "cuda_rng", "python_rng")


def _named_state_tensors(model: nn.Module, optimizer: torch.optim.Optimizer):
    yield from model.named_parameters()
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            yield f"optimizer {key} of parameter {index}", value


def save_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler, scaler,
                    step: int, history: History, config: TrainConfig) -> None:
    """Write everything needed to continue exactly, atomically: a crash mid-write leaves the old file
    (``checkpoint.write_checkpoint``). Writes nothing, keeping the old file, if a weight or an optimizer
    state holds NaN or infinity (``checkpoint.NonFiniteWeightsError``): a run that diverged must not
    replace its last good checkpoint."""
    check_finite(_named_state_tensors(model, optimizer), f"the weights and optimizer state after {step} steps")
    state = {
        "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(), "step": step, "history": history.as_dict(),
        "config": dataclasses.asdict(config), "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python_rng": random.getstate(),
    }
    write_checkpoint(path, state)


def _restore_cuda_rng(saved: list[torch.Tensor]) -> None:
    """Set each visible GPU's generator from a checkpoint's per-GPU states (CPU ByteTensors, as CUDA wants)."""
    present = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if saved and len(saved) != present:
        warnings.warn(f"the checkpoint holds the random-number states of {len(saved)} GPU(s) and this machine has "
                      f"{present}: restoring {min(len(saved), present)}; dropout masks on the other GPUs will "
                      "differ from the uninterrupted run's", stacklevel=4)
    for index, rng in enumerate(saved[:present]):
        torch.cuda.set_rng_state(rng.cpu(), index)


def _check_fits(path: str | Path, model: nn.Module, saved: Any) -> None:
    """Raise ``CheckpointError`` if the checkpoint's weights are not this model's, before any is copied
    (``load_state_dict`` copies the tensors that match before it reports the others)."""
    if not isinstance(saved, dict):
        raise checkpoint_error(path, f"holds a {type(saved).__name__} where the model's state_dict belongs")
    own = model.state_dict()
    found = {
        "missing": [k for k in own if k not in saved],
        "unexpected": [k for k in saved if k not in own],
        "shaped otherwise (checkpoint vs model)": [
            f"{k} {tuple(saved[k].shape)} vs {tuple(v.shape)}" for k, v in own.items()
            if k in saved and torch.is_tensor(saved[k]) and saved[k].shape != v.shape],
    }
    if any(found.values()):
        problems = "; ".join(f"{what}: {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}"
                             for what, keys in found.items() if keys)
        raise checkpoint_error(path, f"holds the weights of another model ({problems})",
                               "Build the model with the configuration it was trained with, or start a fresh run "
                               "(without resume_from).")


def _restore(state: dict[str, Any], path: str | Path, model: nn.Module, optimizer, scheduler,
             scaler) -> tuple[int, History]:
    _check_fits(path, model, state["model"])
    model.load_state_dict(state["model"])
    for obj, key in ((optimizer, "optimizer"), (scheduler, "scheduler"), (scaler, "scaler")):
        if obj is None or (key == "scaler" and not state[key]):  # written without fp16: a fresh scaler
            continue
        try:
            obj.load_state_dict(state[key])
        except (ValueError, KeyError, TypeError, RuntimeError) as err:
            raise checkpoint_error(path, f"holds a {key} state that does not fit this run ({err})") from err
    torch.set_rng_state(state["torch_rng"].cpu())  # map_location=cuda puts it on the GPU
    _restore_cuda_rng(state["cuda_rng"])
    version, internal, gauss = state["python_rng"]
    random.setstate((version, tuple(internal), gauss))
    return state["step"], History(**state["history"])


def load_checkpoint(path: str | Path, model: nn.Module, optimizer=None, scheduler=None, scaler=None,
                    map_location: str | torch.device = "cpu") -> tuple[int, History]:
    """Restore a checkpoint (loaded with ``weights_only=True``: no code in the file is run).
    Returns the step to continue from and the history so far.

    ``map_location`` places the model and optimizer tensors (e.g. straight onto the GPU); the
    random-number states are always restored from CPU copies, the only form ``torch.set_rng_state``
    accepts. A checkpoint written with more GPUs than this machine has restores the generators of the
    GPUs present and warns that the resumed run is then not an exact continuation.

    A missing file raises ``FileNotFoundError``; a file that is empty, truncated, not a torch file, not
    a training checkpoint, or written for another model raises ``checkpoint.CheckpointError`` saying
    which, before the model is changed."""
    state = read_checkpoint(path, map_location=map_location, required_keys=CHECKPOINT_KEYS)
    return _restore(state, path, model, optimizer, scheduler, scaler)


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


def _training_device(model: nn.Module, device: torch.device | str | None) -> torch.device:
    """The device to train on (None: the one the model is on), checked before anything touches the model.
    'meta' is refused, and so is a device this machine lacks (``device.pick_device`` says what to check)."""
    first = next(iter(model.parameters()), None)
    if first is None:
        raise ValueError(f"the model ({type(model).__name__}) has no parameters: there is nothing to train")
    requested = first.device if device is None else device
    try:
        parsed = torch.device(requested)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device={requested!r} is not a device name: use 'cpu', 'cuda', 'cuda:N' or 'mps'") from err
    if parsed.type == "meta" and device is None:
        raise ValueError("the model is on the 'meta' device: its parameters have shapes but no values, so there is "
                         "nothing to train. Give it weights first (model.to_empty(device='cpu') and initialise them, "
                         "or load a checkpoint), or pass device='cpu' or 'cuda' to a model built there")
    if parsed.type == "meta":
        raise ValueError("device='meta' holds shapes but no values: moving the model there would throw its weights "
                         "away. Pass device='cpu', 'cuda' or 'cuda:N', or None to train where the model is")
    return pick_device(parsed)


# Fields a resumed run may change without changing what its steps compute: how far it runs (max_steps, except
# under the cosine schedule, whose shape depends on it), how often it logs, evaluates and writes checkpoints and
# where, the progress bar, and what a non-finite step does (resuming with 'skip' gets a run past one bad batch).
# Every other field changes the update (lr, schedule, optimizer, clipping, precision) or the batches (seed,
# grad_accum_steps).
_SAFE_TO_CHANGE = frozenset({"max_steps", "log_every", "eval_every", "checkpoint_every", "checkpoint_path",
                             "progress", "on_nonfinite"})


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, (tuple, list)) else value


def config_changes(saved: dict[str, Any], config: TrainConfig) -> list[str]:
    """``'field: checkpoint value -> new value'`` for each field of ``config`` that differs from a
    checkpoint's config ``saved`` in a way that changes what training computes (see ``_SAFE_TO_CHANGE``).
    A field the checkpoint lacks (written before the field existed) counts as its default."""
    changes = []
    for field in dataclasses.fields(config):
        if field.name in _SAFE_TO_CHANGE and not (field.name == "max_steps" and config.schedule == "cosine"):
            continue
        old, new = _plain(saved.get(field.name, field.default)), _plain(getattr(config, field.name))
        if old != new:
            changes.append(f"{field.name}: {old!r} -> {new!r}")
    return changes


def _apply_config(optimizer: torch.optim.Optimizer, scheduler, config: TrainConfig) -> None:
    """Make a resumed run follow ``config`` rather than its checkpoint's: the lr (the schedule's base and
    each group's initial_lr, and the current lr from the new schedule), weight decay, betas and eps."""
    multiplier = lr_multiplier(config)
    for group, decay in zip(optimizer.param_groups, (config.weight_decay, 0.0)):  # as make_optimizer groups them
        group.update(initial_lr=config.lr, lr=config.lr * multiplier(scheduler.last_epoch), weight_decay=decay,
                     betas=tuple(config.betas), eps=config.eps)
    scheduler.base_lrs = [config.lr] * len(optimizer.param_groups)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


def _draw_batch(get_batch: Callable[[int], Any], seed: int, index: int) -> Any:
    """``get_batch(index)`` with the global CPU generators seeded from (seed, index) and put back afterwards:
    the batch depends on the index alone, and drawing it leaves the model's dropout stream where it was."""
    with isolated_rng(derived_seed(seed, index)):
        return get_batch(index)


_MAX_SKIPPED_IN_A_ROW = 30  # the fp16 scale halves on each: 2**16 / 2**30, far below any run that still learns


class _Readback:
    """What a run leaves on the device until it reads it back (every log_every steps, and before an evaluation
    or a checkpoint): the values go into the history and are checked there, so the checks cost no host sync
    of their own."""

    def __init__(self, history: History, config: TrainConfig, last_good: tuple[Path, int] | None):
        self.history, self.config = history, config
        self.last_good = last_good  # (path, steps) of the last checkpoint known to be good, for error messages
        self.pending: list[tuple] = []
        self.tokens_read = history.tokens[-1] if history.tokens else 0
        self.skipped_in_a_row = 0

    def add(self, step: int, out: StepOutput, lr: float, tokens: torch.Tensor, scale: torch.Tensor | None) -> None:
        self.pending.append((step, out, lr, tokens, scale))

    def flush(self) -> None:
        history = self.history
        for step, out, lr, tokens, scale in self.pending:
            loss = out.loss.item()  # waits for the device: done once per log_every steps
            norm = out.grad_norm.item()
            total = int(tokens.item())
            if total == self.tokens_read:
                raise self._error(EmptyStepError, f"step {step} trained on 0 tokens: every micro-batch of it "
                                  f"({self._indices(step)}) was empty or all padding, which means the data is wrong. "
                                  "Check get_batch for those indices, and the token count loss_fn returns")
            self.tokens_read = total
            skipped = bool(out.skipped)  # a flag on the device under fp16: read with the loss
            if not skipped and not (math.isfinite(loss) and math.isfinite(norm)):
                raise self._error(NonFiniteLossError, f"step {step} has loss {loss} and gradient norm {norm}")
            self.skipped_in_a_row = self.skipped_in_a_row + 1 if skipped else 0
            if self.skipped_in_a_row >= _MAX_SKIPPED_IN_A_ROW:
                raise self._error(NonFiniteLossError, f"the last {self.skipped_in_a_row} steps, up to step {step}, "
                                  f"were all skipped (loss {loss}, gradient norm {norm}): the run no longer trains")
            if skipped and self.config.on_nonfinite == "skip":
                history.skipped_steps.append(step)
            history.step.append(step)
            history.loss.append(loss)
            history.grad_norm.append(norm)
            history.lr.append(lr)
            history.tokens.append(total)
            if scale is not None:
                history.loss_scale.append(float(scale))
        self.pending.clear()

    def _indices(self, step: int) -> str:
        first = step * self.config.grad_accum_steps
        last = first + self.config.grad_accum_steps - 1
        return f"get_batch({first})" if first == last else f"get_batch({first}) to get_batch({last})"

    def _error(self, kind: type[Exception], problem: str) -> Exception:
        """``kind`` with ``problem``, what was (not) saved, and what to try (steps count from 0, as History.step)."""
        if self.last_good is not None:
            path, steps = self.last_good
            saved = (f"The last good checkpoint is {path}, written after {steps} steps: resume with "
                     f"resume_from={str(path)!r}.")
        else:
            saved = ("No checkpoint was written before it" + ("" if self.config.checkpoint_every
                                                              else " (checkpoint_every=0)") + ".")
        config = self.config
        if kind is EmptyStepError:
            return EmptyStepError(f"{problem}. Training stopped; nothing after it was saved. {saved}")
        fp16 = "bf16 instead of fp16 (its range is float32's), " if config.precision == "fp16" else ""
        return kind(f"{problem} (steps count from 0): training stopped, and nothing after it was saved. {saved} "
                    f"To get past it, try a lower learning rate (lr={config.lr}), gradient clipping (grad_clip="
                    f"{config.grad_clip}), {fp16}a look at the data of that step; or on_nonfinite='skip' to skip "
                    "such steps")


def train(
    model: nn.Module,
    loss_fn: Callable[[nn.Module, Any], tuple[torch.Tensor, int]],
    get_batch: Callable[[int], Any],
    config: TrainConfig,
    *,
    eval_fn: Callable[[nn.Module], float] | None = None,
    device: torch.device | str | None = None,
    resume_from: str | Path | None = None,
    allow_config_change: bool = False,
) -> History:
    """Train ``model`` for ``config.max_steps`` optimizer steps and return the :class:`History`.

    ``loss_fn(model, batch)`` returns the mean loss over the batch's tokens and the token count (an
    int, or a tensor on the device: it is read back only when logging, so it costs no sync);
    ``get_batch(i)`` returns micro-batch ``i`` (``step * grad_accum_steps + micro``), drawing random
    numbers (if it does) from the global CPU generators seeded from ``(config.seed, i)``, which are put
    back afterwards: a batch is a function of its index, and drawing it never moves the model's dropout
    masks, so a resumed run sees the batches and masks of the uninterrupted one;
    ``eval_fn(model)`` returns a validation loss (it runs under ``torch.no_grad`` in eval mode).
    ``device`` (None: where the model is) is checked before the model is touched.

    When the losses are read back (every ``log_every`` steps, and before every evaluation and
    checkpoint), a NaN or infinite loss or gradient norm raises :class:`NonFiniteLossError` naming the
    step and the last good checkpoint (``config.on_nonfinite``), and a step without tokens raises
    :class:`EmptyStepError`; no checkpoint is written after either. ``resume_from`` continues from a
    checkpoint; if its config differs from ``config`` in a field that changes the training, it raises
    :class:`ConfigChangedError` listing every difference, unless ``allow_config_change`` (then the new
    values apply, with a warning).
    """
    device = _training_device(model, device)
    saved, changes = None, []
    if resume_from is not None:
        saved = read_checkpoint(resume_from, map_location=device, required_keys=CHECKPOINT_KEYS)
        if not isinstance(saved["config"], dict):
            raise checkpoint_error(resume_from, f"holds a {type(saved['config']).__name__} where a TrainConfig "
                                                "belongs")
        changes = config_changes(saved["config"], config)
        if changes and not allow_config_change:
            raise ConfigChangedError(
                f"config differs from the one checkpoint {resume_from} was trained with: {'; '.join(changes)}. "
                "Resume with the checkpoint's values (a resumed run then continues the uninterrupted one exactly), "
                "or pass allow_config_change=True to continue with the new ones")
        _check_fits(resume_from, model, saved["model"])  # before the model is moved or changed
    model.to(device)
    optimizer = make_optimizer(model, config)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(config))
    scaler = torch.amp.GradScaler(device.type, enabled=config.precision == "fp16")
    dtype = PRECISIONS[config.precision]
    start, history, last_good = 0, History(), None
    if saved is not None:
        start, history = _restore(saved, resume_from, model, optimizer, scheduler, scaler)
        last_good = (Path(resume_from), start)
        if changes:
            _apply_config(optimizer, scheduler, config)
            warnings.warn(f"resuming {resume_from} with a changed config, which applies from step {start}: "
                          f"{'; '.join(changes)}", stacklevel=2)
    else:
        torch.manual_seed(config.seed)
    if start >= config.max_steps:
        return history
    train_step = make_train_step(model, optimizer, loss_fn, dtype=dtype, scaler=scaler,
                                 grad_accum_steps=config.grad_accum_steps, normalize_by=config.normalize_by,
                                 grad_clip=config.grad_clip if config.grad_clip else float("inf"),
                                 # a DDP-wrapped model all-reduces once per step, not once per micro-batch
                                 no_sync=getattr(model, "no_sync", None) if config.grad_accum_steps > 1 else None,
                                 skip_nonfinite=config.on_nonfinite == "skip")
    readback = _Readback(history, config, last_good)
    tokens = torch.tensor(history.tokens[-1] if history.tokens else 0, device=device)  # stays on the device
    accum = config.grad_accum_steps
    bar = tqdm(range(start, config.max_steps), initial=start, total=config.max_steps, disable=not config.progress,
               desc="training", unit="step")
    started = time.perf_counter()
    try:
        for step in bar:
            model.train()
            lr = optimizer.param_groups[0]["lr"]
            micro_batches = (_move(_draw_batch(get_batch, config.seed, step * accum + micro), device)
                             for micro in range(accum))
            out = train_step(micro_batches)  # forward, backward, clip and update; nothing read back
            tokens += out.tokens.to(tokens.dtype) if torch.is_tensor(out.tokens) else out.tokens
            scheduler.step()
            scale = current_scale(scaler).clone() if scaler.is_enabled() else None  # on the device until logged
            readback.add(step, out, lr, tokens.clone(), scale)
            done = step + 1
            if done % config.log_every == 0 or done == config.max_steps:
                readback.flush()
                bar.set_postfix(loss=f"{history.loss[-1]:.3f}", lr=f"{lr:.2e}")
            is_eval = eval_fn is not None and ((config.eval_every and done % config.eval_every == 0)
                                               or done == config.max_steps)
            is_checkpoint = bool(config.checkpoint_every) and done % config.checkpoint_every == 0
            if is_eval or is_checkpoint:
                readback.flush()  # checks every step since the last checkpoint before writing the next
                history.seconds += time.perf_counter() - started
                if is_eval:
                    model.eval()
                    with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                        history.eval_loss.append(float(eval_fn(model)))
                    history.eval_step.append(step)
                if is_checkpoint:
                    save_checkpoint(config.checkpoint_path, model, optimizer, scheduler, scaler, done, history, config)
                    readback.last_good = (Path(config.checkpoint_path), done)
                started = time.perf_counter()
        readback.flush()
    finally:
        bar.close()
    history.seconds += time.perf_counter() - started
    return history
