"""Where training memory goes, by formula and by measurement.

Covers: :func:`training_memory`, a calculator of the bytes for weights, gradients, optimizer state
and activations of a training step (mixed precision, optimizer, activation checkpointing and ZeRO-style
sharding as options), exact for the first three given a model; and :func:`measure_peak_memory`, the
peak the CUDA allocator saw while a function ran.

The activation estimate follows Korthikanti et al. (2022), "Reducing Activation Recomputation in Large
Transformer Models": per layer about T B C (34 + 5 H T / C) bytes with 16-bit activations and no
recomputation; with full activation checkpointing only each layer's input is kept, 2 T B C bytes. It
is an estimate (kernels and allocator add their own temporaries); chapter 9 checks it against
measurement. Leaves out: communication buffers of distributed training.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import nn

# bytes of optimizer state per parameter, for states kept in float32
_OPTIMIZER_STATE_BYTES = {"sgd": 0, "sgd_momentum": 4, "adam": 8, "adamw": 8}


@dataclasses.dataclass(frozen=True)
class TrainingMemory:
    """Bytes per GPU for one training step."""

    weights: int
    gradients: int
    optimizer: int
    master_weights: int
    """float32 copies of 16-bit weights, when training keeps them (``model.half()`` with a master copy)."""
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.master_weights + self.activations

    def __str__(self) -> str:
        rows = [(name, getattr(self, name)) for name in ("weights", "gradients", "optimizer", "master_weights",
                                                          "activations")] + [("total", self.total)]
        unit, scale = ("GiB", 2**30) if self.total >= 2**30 else ("MiB", 2**20)
        return "\n".join(f"{name:15} {value / scale:9.3f} {unit}" for name, value in rows)


def training_memory(
    n_params: int,
    *,
    param_bytes: int = 4,
    grad_bytes: int | None = None,
    optimizer: str = "adamw",
    master_weights: bool = False,
    n_layers: int = 0,
    d_model: int = 0,
    n_heads: int = 1,
    seq_len: int = 0,
    batch_size: int = 0,
    activation_bytes: int = 2,
    checkpointing: bool = False,
    shard_optimizer: int = 1,
    shard_gradients: int = 1,
    shard_weights: int = 1,
) -> TrainingMemory:
    """Estimate the memory of a training step.

    ``param_bytes``: 4 for float32 weights, 2 for bf16/fp16 weights. ``grad_bytes`` defaults to
    ``param_bytes``. Mixed precision with autocast keeps float32 weights (``param_bytes=4``) and only
    activations in 16 bits (``activation_bytes=2``). ``shard_*``: the number of ranks each state is
    split over (ZeRO stage 1 shards the optimizer, stage 2 also gradients, stage 3 also weights).
    """
    if optimizer not in _OPTIMIZER_STATE_BYTES:
        raise ValueError(f"optimizer must be one of {sorted(_OPTIMIZER_STATE_BYTES)}, not {optimizer!r}")
    if n_params < 0 or min(shard_optimizer, shard_gradients, shard_weights) < 1:
        raise ValueError("n_params must be >= 0 and every shard count >= 1")
    grad_bytes = param_bytes if grad_bytes is None else grad_bytes
    per_layer = 0
    if n_layers:
        if checkpointing:
            per_layer = 2 * seq_len * batch_size * d_model  # the layer's input, in 16 bits
        else:
            per_layer = seq_len * batch_size * d_model * (34 + 5 * n_heads * seq_len / d_model)
        per_layer = per_layer * activation_bytes / 2
    return TrainingMemory(
        weights=n_params * param_bytes // shard_weights,
        gradients=n_params * grad_bytes // shard_gradients,
        optimizer=n_params * _OPTIMIZER_STATE_BYTES[optimizer] // shard_optimizer,
        master_weights=(n_params * 4 // shard_optimizer) if master_weights else 0,
        activations=int(n_layers * per_layer),
    )


def model_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """The bytes actually held by a model's weights, gradients and optimizer state tensors."""
    params = list(model.parameters())
    state = 0
    if optimizer is not None:
        for per_param in optimizer.state.values():
            state += sum(t.numel() * t.element_size() for t in per_param.values()
                         if torch.is_tensor(t) and t.dim() > 0)  # Adam's step counter is a scalar: skip
    return {
        "weights": sum(p.numel() * p.element_size() for p in params),
        "gradients": sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None),
        "optimizer": state,
    }


def measure_peak_memory(fn: Callable[[], object], device: torch.device | str = "cuda") -> int:
    """Bytes allocated at the peak while ``fn`` ran, beyond what was allocated before (CUDA only)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        raise ValueError("peak memory is measured with the CUDA allocator; on a CPU use the calculator "
                         "(training_memory) or model_state_bytes")
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before
