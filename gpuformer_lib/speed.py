"""Speed techniques applied to a single-device model from outside, and the one training step they serve.

The model code is written for one device in float32 (``model``). What makes a step fast wraps it from
outside, in one fixed order (torchtitan's habit, at course scale):

1. **precision and TF32**: the autocast dtype (bf16, or fp16 with a gradient scaler) and float32
   matmul precision ("high": TF32 tensor cores) are arguments of :func:`make_train_step`;
2. **fused attention** and 3. **the token-id check**: choices a model is *built* with
   (:func:`model_config` sets ``TransformerConfig.fused_attention`` and ``check_token_ids``), because
   they change what a layer computes, not how it is called; nothing flips them later;
4. **activation checkpointing** (:func:`apply_activation_checkpointing`): each layer is wrapped so that
   only its input is kept and the rest is recomputed in the backward pass;
5. **torch.compile** (:func:`apply_compile`), once the structure is final, so that it traces the
   checkpointed layers; CUDA graphs come through its ``mode="reduce-overhead"``;
6. **the fused optimizer** (:func:`make_adamw`), made last, from the final model's parameters.

:class:`SpeedPlan` names the techniques a run uses; :func:`apply_plan` applies 4 and 5 in order.
:func:`make_train_step` is the one training step (autocast forward, scaled backward, token weighting,
clipping, optimizer step) that ``train.train``, the ladder and chapter 10 share.

Leaves out: several devices (``distributed`` wraps the result), schedules, logging and checkpoints
(``train``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from gpuformer_lib._checks import require_bool_fields
from gpuformer_lib.bench import float32_matmul_precision
from gpuformer_lib.layers import LayerStack
from gpuformer_lib.model import TransformerConfig

_DTYPES = (None, torch.bfloat16, torch.float16)


@dataclasses.dataclass(frozen=True)
class SpeedPlan:
    """Which speed techniques a run uses. Change one with ``dataclasses.replace(plan, ...)``."""

    dtype: torch.dtype | None = None
    """Autocast dtype: ``torch.bfloat16``, ``torch.float16`` (with a gradient scaler), or None for float32."""
    tf32: bool = False
    """float32 matrix products on TF32 tensor cores (compute capability 8.0 or newer); False: strict float32."""
    fused_attention: bool = True
    """PyTorch's fused attention kernel instead of the explicit computation (no (B, H, T, T) scores kept)."""
    check_token_ids: bool = True
    """Check token ids in every forward pass: a host sync per step on a GPU."""
    checkpointing: bool = False
    """Activation checkpointing: keep each layer's input only, recompute the rest in the backward pass."""
    compile: bool = False
    """``torch.compile`` the model (fuses element-wise chains into generated kernels)."""
    cuda_graphs: bool = False
    """Replay the compiled model's forward and backward as CUDA graphs (``mode="reduce-overhead"``); the loss and
    the optimizer step are not captured. Needs ``compile``."""
    fused_optimizer: bool = False
    """AdamW's update as one fused kernel per group of tensors."""

    def __post_init__(self):
        require_bool_fields(self)
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be torch.bfloat16, torch.float16 or None (float32), not {self.dtype}")
        if self.cuda_graphs and not self.compile:
            raise ValueError("cuda_graphs come through torch.compile's mode='reduce-overhead': set compile=True too")


# --------------------------------------------------------------------------- 2, 3: what the model is built with


def model_config(config: TransformerConfig, plan: SpeedPlan) -> TransformerConfig:
    """``config`` with the plan's construction-time choices: fused attention and the token-id check."""
    return dataclasses.replace(config, fused_attention=plan.fused_attention, check_token_ids=plan.check_token_ids)


# --------------------------------------------------------------------------- 4: activation checkpointing


class CheckpointedLayer(nn.Module):
    """A layer whose activations are recomputed in the backward pass instead of kept (in training, with
    gradients on; otherwise it is the plain layer). Its ``state_dict`` has the wrapped layer's keys, so
    checkpoints load whether or not a model was wrapped."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer
        self.register_state_dict_post_hook(_drop_wrapper_prefix)
        self.register_load_state_dict_pre_hook(_add_wrapper_prefix)

    def forward(self, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        if self.training and torch.is_grad_enabled():
            return checkpoint(self.layer, x, *args, use_reentrant=False, **kwargs)
        return self.layer(x, *args, **kwargs)


def _drop_wrapper_prefix(module, state_dict, prefix, local_metadata) -> None:
    for key in [k for k in state_dict if k.startswith(prefix + "layer.")]:
        state_dict[prefix + key[len(prefix + "layer."):]] = state_dict.pop(key)


def _add_wrapper_prefix(module, state_dict, prefix, *args) -> None:
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(prefix + "layer.")]:
        state_dict[prefix + "layer." + key[len(prefix):]] = state_dict.pop(key)


def _layer_lists(model: nn.Module) -> list[nn.ModuleList]:
    return [m.layers for m in model.modules() if isinstance(m, LayerStack)]


def apply_activation_checkpointing(model: nn.Module) -> int:
    """Wrap every layer of the model's layer stacks in a :class:`CheckpointedLayer` (layers already wrapped
    stay as they are). Returns the number of checkpointed layers; 0 means the model has no layer stack."""
    count = 0
    for layers in _layer_lists(model):
        for i, layer in enumerate(layers):
            if not isinstance(layer, CheckpointedLayer):
                layers[i] = CheckpointedLayer(layer)
            count += 1
    return count


def remove_activation_checkpointing(model: nn.Module) -> int:
    """Undo :func:`apply_activation_checkpointing`; returns the number of layers in the model's stacks."""
    count = 0
    for layers in _layer_lists(model):
        for i, layer in enumerate(layers):
            if isinstance(layer, CheckpointedLayer):
                layers[i] = layer.layer
            count += 1
    return count


# --------------------------------------------------------------------------- 5, 6: compile, fused optimizer


def apply_compile(model: nn.Module, *, cuda_graphs: bool = False) -> nn.Module:
    """``torch.compile(model)``; with ``cuda_graphs``, ``mode="reduce-overhead"`` (CUDA devices only), which
    records the compiled *model's* forward and backward graphs as CUDA graphs and replays each with one launch.
    What runs outside the compiled model is not captured and still launches kernel by kernel: the loss (the
    float32 cross-entropy of :func:`next_token_loss`), the gradient scaler and the optimizer's step; a graph
    break splits the model into several graphs."""
    return torch.compile(model, mode="reduce-overhead" if cuda_graphs else None)


def apply_plan(model: nn.Module, plan: SpeedPlan, device: torch.device | str) -> nn.Module:
    """Techniques 4 and 5 of ``plan`` applied to a model built with :func:`model_config` and moved to
    ``device``: checkpointing, then compile. Returns the model to train (compiled or not)."""
    device = torch.device(device)
    if plan.cuda_graphs and device.type != "cuda":
        raise ValueError(f"CUDA graphs need a CUDA device, not {device}: drop cuda_graphs from the plan")
    if plan.checkpointing:
        apply_activation_checkpointing(model)
    if plan.compile:
        model = apply_compile(model, cuda_graphs=plan.cuda_graphs)
    return model


def make_adamw(params: Iterable, plan: SpeedPlan, **kwargs: Any) -> torch.optim.AdamW:
    """AdamW, with the fused kernel when the plan asks for it (else PyTorch's default implementation)."""
    return torch.optim.AdamW(params, fused=True if plan.fused_optimizer else None, **kwargs)


def grad_scaler(plan: SpeedPlan, device: torch.device | str) -> torch.amp.GradScaler:
    """A gradient scaler, enabled for fp16 only (bf16 has float32's range and needs none)."""
    return torch.amp.GradScaler(torch.device(device).type, enabled=plan.dtype == torch.float16)


def current_scale(scaler: torch.amp.GradScaler) -> Tensor:
    """The loss scale of an enabled ``scaler``, as a tensor. torch has no public way to read it without a host
    sync (``get_scale()`` calls ``.item()``): the tensor it keeps on the device (``_scale``, which ``update()``
    changes in place: clone it to keep a value) where it has one, else ``get_scale()``'s number (a read-back)."""
    scale = getattr(scaler, "_scale", None)
    return scale if isinstance(scale, Tensor) else torch.tensor(scaler.get_scale())


def _divide_(tensors: list[Tensor], divisor: Tensor | float) -> None:
    """Divide each tensor in place by ``divisor`` (a number or a 0-d tensor): torch's fused foreach kernel (one
    launch for all; private, though torch's own optimizers call it) where this torch has it, else one division
    per tensor."""
    foreach = getattr(torch, "_foreach_div_", None)
    if foreach is not None:
        foreach(tensors, divisor)
    else:
        for t in tensors:
            t.div_(divisor)


# --------------------------------------------------------------------------- the training step


def next_token_loss(model: nn.Module, ids: Tensor) -> tuple[Tensor, int]:
    """Mean next-token cross-entropy of a language model on ``ids`` (B, T + 1), in float32, and the
    number of predicted tokens B * T: inputs are ``ids[:, :-1]``, targets ``ids[:, 1:]``."""
    logits = model(ids[:, :-1])  # (B, T) -> (B, T, V)
    targets = ids[:, 1:]
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()), targets.numel()  # (B*T, V)


@dataclasses.dataclass(frozen=True)
class StepOutput:
    """What one optimizer step returns. Tensors stay on the device: reading one waits for the GPU."""

    loss: Tensor
    """Mean loss of the step (over micro-batches, or over tokens with ``normalize_by='tokens'``), detached."""
    tokens: Tensor | int
    """Tokens the step trained on, as the loss function counted them."""
    grad_norm: Tensor | None
    """Global gradient norm before clipping (None when ``grad_clip`` is None and ``skip_nonfinite`` is off)."""
    skipped: Tensor | bool = False
    """True when the step made no update: ``skip_nonfinite`` found its loss or gradient norm NaN or infinite
    (a bool), or the fp16 gradient scaler found an overflow (a bool tensor on the device: reading it waits)."""


def _zero_if_empty(loss: Tensor, n_tokens: Tensor | int) -> Tensor:
    """``loss``, or 0 for a micro-batch without tokens, whose mean over nothing is NaN. ``torch.where``
    (unlike a product with 0) also sends the backward pass an exact 0, so no NaN reaches the gradients;
    with a count on the device, nothing is read back."""
    has_tokens = n_tokens > 0
    if not torch.is_tensor(has_tokens):
        if has_tokens:
            return loss
        has_tokens = torch.zeros((), dtype=torch.bool, device=loss.device)
    return torch.where(has_tokens.to(loss.device), loss, torch.zeros_like(loss))


def averages_gradients_over_ranks(model: nn.Module) -> bool:
    """Whether ``model`` is wrapped so that its backward pass averages the gradients over the ranks of an
    initialised process group: PyTorch's ``DistributedDataParallel`` or FSDP2 (``fully_shard``), or a
    wrapper that says so with ``averages_gradients = True`` (``distributed.NaiveDataParallel``)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return False
    if isinstance(model, torch.nn.parallel.DistributedDataParallel) or getattr(model, "averages_gradients", False):
        return True
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # older PyTorch: no FSDP2
        return False
    return isinstance(model, FSDPModule)


def tokens_per_rank(step_tokens: Tensor | int, device: torch.device, group=None) -> Tensor:
    """The global batch's token count (summed over ``group``'s ranks by one all-reduce, at least 1) divided
    by the world size: what a rank divides data-parallel averaged, token-weighted gradients by, so that
    the step equals one process on all ranks' tokens. Float64 for the sum (exact far beyond 2**24 tokens)."""
    import torch.distributed as dist

    total = torch.as_tensor(step_tokens, device=device).detach().to(torch.float64).clone().reshape(())
    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    return (total.clamp(min=1) / dist.get_world_size(group)).float()


def make_train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[nn.Module, Any], tuple[Tensor, Tensor | int]],
    *,
    dtype: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
    tf32: bool | None = None,
    grad_accum_steps: int = 1,
    normalize_by: str = "micro_batches",
    grad_clip: float | None = None,
    cuda_graphs: bool = False,
    no_sync: Callable[[], contextlib.AbstractContextManager] | None = None,
    skip_nonfinite: bool = False,
    data_parallel: bool | None = None,
) -> Callable[[Iterable[Any]], StepOutput]:
    """Build ``step(micro_batches) -> StepOutput``: one optimizer step over ``grad_accum_steps`` micro-batches.

    ``loss_fn(model, batch)`` returns the mean loss over the batch's tokens and their count (an int, or
    a tensor on the device); it runs under autocast in ``dtype`` (None: float32). ``scaler``: a
    ``GradScaler`` (needed for fp16). ``tf32``: True/False sets float32 matmul precision for the step
    (TF32 or strict float32); None leaves it as it is. ``normalize_by``: 'micro_batches' divides each
    micro-batch's loss by ``grad_accum_steps``; 'tokens' weights it by its token count and divides the
    summed gradients by the step's tokens, so that the step equals one large batch however padding
    falls. ``grad_clip``: clip the global gradient norm to it (``float('inf')`` measures without
    clipping). ``cuda_graphs``: mark each step's start for a model compiled with
    ``mode="reduce-overhead"``. ``no_sync``: for a data-parallel model, a callable returning a context
    manager that holds back the gradient all-reduce (``ddp.no_sync``); every micro-batch but the last
    runs inside it, so gradients are reduced once per step, not once per micro-batch. ``data_parallel``:
    whether backward averages the gradients over the ranks of a process group (DDP, FSDP2,
    ``distributed.NaiveDataParallel``); None detects it (:func:`averages_gradients_over_ranks`). With
    'tokens' the step then all-reduces (sums) its token count and divides the averaged gradients by the
    global tokens / world size, so every rank takes the step one process would take on all ranks' tokens
    however unevenly padding falls across ranks (dividing by each rank's own count would make the
    replicas diverge); the loss it returns stays this rank's own mean. Nothing in the
    step reads a value back from the device, except with ``skip_nonfinite``.

    A micro-batch whose token count is 0 contributes nothing (its loss, NaN as a mean over no token,
    becomes 0, and so do its gradients); a step without any token leaves the gradients 0 (the caller
    sees ``tokens == 0``). ``skip_nonfinite``: a step whose loss or gradient norm is NaN or infinite
    makes no update (gradients zeroed, ``StepOutput.skipped`` True); this reads both back every step,
    one host sync per step. Without it, non-finite values are the caller's to check when it reads the
    loss back; under fp16 the scaler skips steps with overflowing gradients either way (``skipped``).
    """
    if grad_accum_steps < 1:
        raise ValueError(f"grad_accum_steps must be >= 1, got {grad_accum_steps}")
    if normalize_by not in ("micro_batches", "tokens"):
        raise ValueError(f"normalize_by must be 'micro_batches' or 'tokens', not {normalize_by!r}")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be torch.bfloat16, torch.float16 or None (float32), not {dtype}")
    if dtype == torch.float16 and (scaler is None or not scaler.is_enabled()):
        raise ValueError("fp16 training needs an enabled GradScaler (gradients underflow without one): "
                         "pass scaler=speed.grad_scaler(plan, device)")
    if grad_clip is not None and (isinstance(grad_clip, bool) or not isinstance(grad_clip, (int, float))
                                  or math.isnan(grad_clip) or grad_clip <= 0):
        raise ValueError(f"grad_clip must be a positive number (float('inf') to only measure the norm) or None, "
                         f"got {grad_clip!r}")
    device_type = next(model.parameters()).device.type
    params = [p for p in model.parameters() if p.requires_grad]
    by_tokens = normalize_by == "tokens"
    if data_parallel is None:
        data_parallel = averages_gradients_over_ranks(model)
    reduce_tokens = by_tokens and data_parallel
    token_group = getattr(model, "process_group", None) if reduce_tokens else None
    scaling = scaler is not None and scaler.is_enabled()
    measure_norm = grad_clip is not None or skip_nonfinite

    def scale(loss: Tensor) -> Tensor:
        return scaler.scale(loss) if scaler is not None else loss

    def step(micro_batches: Iterable[Any]) -> StepOutput:
        if cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()  # outputs of the last replay may be overwritten now
        with float32_matmul_precision("high" if tf32 else "highest") if tf32 is not None else contextlib.nullcontext():
            step_loss: Tensor | int = 0
            step_tokens: Tensor | int = 0
            count = 0
            for batch in micro_batches:
                if count == grad_accum_steps:  # refused before it runs: its gradients would miss the all-reduce
                    raise ValueError(f"the step got more than {grad_accum_steps} micro-batches, but was built for "
                                     f"grad_accum_steps={grad_accum_steps}")
                held_back = no_sync is not None and count < grad_accum_steps - 1
                with no_sync() if held_back else contextlib.nullcontext():  # the last one all-reduces
                    with torch.autocast(device_type, dtype=dtype, enabled=dtype is not None):
                        loss, n_tokens = loss_fn(model, batch)
                    loss = _zero_if_empty(loss, n_tokens)
                    if by_tokens:
                        loss = loss * n_tokens
                    elif grad_accum_steps > 1:
                        loss = loss * (1 / grad_accum_steps)
                    scale(loss).backward()
                step_loss = step_loss + loss.detach()
                step_tokens = step_tokens + n_tokens
                count += 1
            if count != grad_accum_steps:  # too few: with no_sync, the gradients were never all-reduced
                raise ValueError(f"the step got {count} micro-batches, but was built for grad_accum_steps="
                                 f"{grad_accum_steps}")
            if by_tokens:  # sum of (tokens x mean loss) over the step's tokens: one large batch's mean
                grads = [p.grad for p in params if p.grad is not None]
                # at least 1: a step without tokens has zero gradients, which 0 / 0 would make NaN
                if torch.is_tensor(step_tokens):
                    divisor = step_tokens.clamp(min=1).float()
                else:
                    divisor = float(max(step_tokens, 1))
                # data parallel: backward averaged the ranks' token-weighted sums, so divide by the
                # global token count / world size (one all-reduce of a number), not by this rank's count
                grad_divisor = tokens_per_rank(step_tokens, params[0].device, token_group) if reduce_tokens else divisor
                _divide_(grads, grad_divisor)
                step_loss = step_loss / divisor
            norm = None
            if measure_norm:
                if scaler is not None:
                    scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
                norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip is not None else math.inf).detach()
            if skip_nonfinite and not bool(torch.isfinite(step_loss) & torch.isfinite(norm)):  # the host sync
                optimizer.zero_grad(set_to_none=True)
                if scaling:
                    scaler.update()  # backs the scale off if unscale_ found an overflow, as a skipped step() would
                return StepOutput(loss=step_loss, tokens=step_tokens, grad_norm=norm, skipped=True)
            skipped: Tensor | bool = False
            if scaler is not None:
                scale_before = current_scale(scaler).clone() if scaling else None  # set by scaler.scale() above
                scaler.step(optimizer)  # skips the update if an fp16 gradient overflowed
                scaler.update()
                if scaling:  # update() backs the scale off exactly when step() skipped: no read-back needed
                    skipped = current_scale(scaler) < scale_before
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return StepOutput(loss=step_loss, tokens=step_tokens, grad_norm=norm, skipped=skipped)

    return step
