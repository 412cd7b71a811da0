"""Where training memory goes, by formula and by measurement.

Covers: :func:`training_memory`, a calculator of the bytes for weights, gradients, optimizer state
and activations of a training step (mixed precision, optimizer, activation checkpointing and ZeRO-style
sharding as options), exact for the first three given a model; and :func:`measure_peak_memory`, the
peak the CUDA allocator saw while a function ran.

The activation count is built the way Korthikanti et al. (2022), "Reducing Activation Recomputation in
Large Transformer Models", build theirs (tensor by tensor), but for the course's layers, not the paper's
(no dropout, float32 residual under autocast, the masked attention weights kept):
:class:`SavedActivations` measures what autograd really keeps, on any device, and the tests hold the two
within 2 % (CPU autocast; CUDA autocast's float32 softmax is predicted from PyTorch's op lists and tested
on a GPU). The paper's own count is ``activation_accounting.korthikanti_layer_bytes``. That count is the
**saved tensors**; :func:`predicted_peak` adds the transients that set a step's **peak** (the loss's
vocabulary-sized tensors, a layer's backward temporaries), checked on a CPU with
``activation_accounting.LiveBytes`` and on a GPU with ``torch.cuda.max_memory_allocated`` (``gpu`` tests).
The allocator's rounding and fragmentation, workspaces and the CUDA context are in neither.
Also here: activation checkpointing; :func:`fit_micro_batch`, which recovers from out-of-memory by
trading micro-batch size for accumulation steps; and a memory cap to try it under (:class:`MemoryCap`,
:func:`choose_memory_cap`, :func:`memory_limit`, :func:`activation_limit`): real on a GPU, simulated
elsewhere, both under a rehearsed GPU profile. Leaves out: communication buffers of distributed
training.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
from typing import Callable, ContextManager, Iterator

import torch
from torch import nn

from gpuformer_lib._checks import require_bools
from gpuformer_lib import gpu
from gpuformer_lib.profiles import DeviceProfile, rehearsed_profile

# bytes of optimizer state per parameter, for states kept in float32
_OPTIMIZER_STATE_BYTES = {"sgd": 0, "sgd_momentum": 4, "adam": 8, "adamw": 8}


def _check_int(name: str, value, least: int) -> None:
    """Counts and byte sizes are ints: 2.5 bytes or a negative layer count would give a wrong total, silently."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        hint = f" (write {int(value):_})" if isinstance(value, float) and value.is_integer() and value >= least else ""
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}{hint}")


@dataclasses.dataclass(frozen=True)
class TrainingMemory:
    """Bytes per GPU for one training step."""

    weights: int
    gradients: int
    optimizer: int
    master_weights: int
    """float32 copies of 16-bit weights, when training keeps them (``model.half()`` with a master copy)."""
    activations: int
    """What the forward pass keeps for the backward pass (the peak sits at the start of backward)."""
    recomputed: int = 0
    """With activation checkpointing: one layer's activations, recomputed during the backward pass."""
    loss_temporaries: int = 0
    """Vocabulary-sized tensors alive only around the loss (``count_loss_temporaries=True``): the logits, and
    in the backward pass the float32 gradients of the log-probabilities and of the logits' float32 copy and
    the gradient of the logits, B T V (2 + 4 + 4 + 2) bytes at 16 bits. Not saved for backward, so not in
    ``activations``; they set the peak of a small model with a large vocabulary. A rough sum of all of them;
    :func:`predicted_peak` instead takes the largest of the moments at which they are alive together."""

    @property
    def total(self) -> int:
        return (self.weights + self.gradients + self.optimizer + self.master_weights + self.activations
                + self.recomputed + self.loss_temporaries)

    def rows(self) -> list[tuple[str, int]]:
        names = ("weights", "gradients", "optimizer", "master_weights", "activations", "recomputed",
                 "loss_temporaries")
        return [(name, getattr(self, name)) for name in names] + [("total", self.total)]

    def __str__(self) -> str:
        unit, scale = ("GiB", 2**30) if self.total >= 2**30 else ("MiB", 2**20)
        return "\n".join(f"{name:15} {value / scale:9.3f} {unit}" for name, value in self.rows())


_ACTIVATION_KEPT = {"gelu": 2, "relu": 1}
"""F-wide tensors the feed-forward block keeps without dropout: GELU's input and output, ReLU's output alone."""


def layer_activation_bytes(*, d_model: int, n_heads: int, seq_len: int, batch_size: int, d_ff: int | None = None,
                           activation_bytes: int = 4, autocast: bool = False, fused_attention: bool = True,
                           dropout: bool = False, autocast_device: str = "cuda", activation: str = "gelu") -> int:
    """Bytes one pre-LN Transformer layer keeps for its backward pass (the course's ``EncoderLayer``).

    Counted tensor by tensor, as autograd saves them (per token and sequence, C = d_model, F = d_ff):
    the inputs of the two LayerNorms (the residual stream: float32 under autocast), the inputs of the
    QKV, output and two feed-forward projections, Q, K and V, and what the activation function keeps.
    ``activation``: GELU (the default, GPT-2's) keeps its input beside its output (the next projection's
    input): C (6 + 2) + 2 F values in all. ReLU's backward needs only its output, the same tensor as that
    projection's input: C (6 + 2) + F (the course's ``EncoderLayer`` and ``TransformerConfig`` default to
    ReLU: pass ``activation="relu"`` for them). With ``dropout`` the two are alike again: the dropped copy,
    not the activation's output, is the next projection's input. Attention adds, explicit: the softmax
    output and the masked weights, 2 H T values per token; fused (flash) kernels keep only a float32
    log-sum-exp, H per token.
    ``dropout``: one-byte masks, as CUDA keeps them (a CPU keeps full-width masks). ``autocast`` adds
    the 16-bit copies of the layer's weights that autocast makes and keeps for the backward pass.
    ``autocast_device``: explicit attention under autocast differs by device. CUDA autocast runs softmax
    in float32 (its float32 list), so the layer keeps the float32 softmax output and the 16-bit copy that
    ``weights.to(v.dtype) @ v`` makes: 4 + 2 = 6 bytes per score; CPU autocast runs softmax in 16 bits and
    keeps 2 + 2 = 4. ``"cpu"`` is what the tests measure (``SavedActivations`` on this machine);
    ``"cuda"`` (the default, for a GPU's calculator) is predicted from PyTorch's autocast op lists.

    This is *not* Korthikanti et al. (2022)'s count, though it is built the same way: the course's layer
    has no dropout (the paper's one-byte masks and dropped copies), keeps the inputs of Q, K and V
    separately from their projection's input, and keeps the masked weights beside the softmax output;
    :func:`gpuformer_lib.activation_accounting.korthikanti_layer_bytes` is the paper's count under its own
    assumptions, and chapter 9 measures where the two differ.
    """
    if autocast_device not in ("cuda", "cpu"):
        raise ValueError(f"autocast_device must be 'cuda' or 'cpu', got {autocast_device!r}")
    if activation not in _ACTIVATION_KEPT:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATION_KEPT)}, got {activation!r}")
    for name, value in (("d_model", d_model), ("n_heads", n_heads), ("seq_len", seq_len), ("batch_size", batch_size),
                        ("activation_bytes", activation_bytes), ("d_ff", 1 if d_ff is None else d_ff)):
        _check_int(name, value, 1)
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}: no such model can be built")
    C, H, T, B = int(d_model), int(n_heads), int(seq_len), int(batch_size)  # NumPy's int32 would wrap around
    F = 4 * C if d_ff is None else int(d_ff)
    activation_bytes = int(activation_bytes)
    residual = 4 if autocast else activation_bytes
    tokens = T * B
    # the feed-forward's F-wide tensors: the activation's own and the second projection's input
    ff = 2 if dropout else _ACTIVATION_KEPT[activation]
    total = tokens * (2 * C * residual + (6 * C + ff * F) * activation_bytes)
    if fused_attention:
        total += 4 * H * tokens
    elif autocast and autocast_device == "cuda" and activation_bytes < 4:
        total += H * T * tokens * (4 + activation_bytes)  # float32 softmax output + its 16-bit copy
    else:
        total += 2 * H * T * tokens * activation_bytes
    if dropout:
        total += 2 * C * tokens  # masks after attention and feed-forward
        if not fused_attention:
            total += H * T * tokens * (1 + activation_bytes)  # mask and dropped weights
    if autocast:
        total += 2 * (4 * C * C + 2 * C * F)  # bf16/fp16 copies of the matrices
    return total


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
    d_ff: int | None = None,
    seq_len: int = 0,
    batch_size: int = 0,
    vocab_size: int = 0,
    activation_bytes: int = 4,
    autocast: bool = False,
    fused_attention: bool = True,
    dropout: bool = False,
    checkpointing: bool = False,
    shard_optimizer: int = 1,
    shard_gradients: int = 1,
    shard_weights: int = 1,
    count_loss_temporaries: bool = False,
    autocast_device: str = "cuda",
    activation: str = "gelu",
) -> TrainingMemory:
    """Estimate the memory of a training step of a decoder-only model (``DecoderLM``).

    ``param_bytes``: 4 for float32 weights, 2 for bf16/fp16 weights; ``grad_bytes`` defaults to it.
    Mixed precision with autocast keeps float32 weights (``param_bytes=4``) and computes in 16 bits:
    pass ``autocast=True, activation_bytes=2``. ``shard_*``: the number of ranks each state is split
    over (ZeRO stage 1 shards the optimizer, stage 2 also gradients, stage 3 also weights).

    Activations (when ``n_layers`` is given) are :func:`layer_activation_bytes` per layer, plus the
    final LayerNorm's and output projection's inputs and the float32 log-probabilities the loss keeps,
    4 V bytes per token (often the largest single tensor). With ``checkpointing`` only each layer's
    input is kept, and one layer is recomputed at a time during the backward pass (``recomputed``).
    ``count_loss_temporaries`` adds the vocabulary-sized tensors alive around the loss
    (:attr:`TrainingMemory.loss_temporaries`): use it to check that a run fits, not to compare with
    what autograd saves. ``autocast_device`` and ``activation`` (the model's ``config.activation``): see
    :func:`layer_activation_bytes`.

    ``total`` is the **saved tensors**: what is held at the start of the backward pass, all gradients
    included. The **predicted peak** of a step, with the transients around the loss and inside a layer's
    backward pass, is :func:`predicted_peak`.
    """
    if optimizer not in _OPTIMIZER_STATE_BYTES:
        raise ValueError(f"optimizer must be one of {sorted(_OPTIMIZER_STATE_BYTES)}, not {optimizer!r}")
    _check_int("n_params", n_params, 0)
    _check_int("n_layers", n_layers, 0)
    require_bools(master_weights=master_weights, autocast=autocast, fused_attention=fused_attention, dropout=dropout,
                  checkpointing=checkpointing, count_loss_temporaries=count_loss_temporaries)
    if not n_layers and (checkpointing or d_model or seq_len or batch_size) and not count_loss_temporaries:
        raise ValueError("activations are counted only with n_layers (and d_model, n_heads, seq_len, batch_size, "
                         "vocab_size): without it the batch sizes given would be ignored and the activations "
                         "counted as 0. Pass n_layers, or leave the batch sizes out to count weights and states only")
    if master_weights and param_bytes == 4:
        raise ValueError("master_weights=True counts a float32 copy of 16-bit weights, but param_bytes=4 says the "
                         "weights are float32 already: pass param_bytes=2 for bf16/fp16 weights, or "
                         "master_weights=False")
    for name, value in (("param_bytes", param_bytes), ("grad_bytes", 1 if grad_bytes is None else grad_bytes),
                        ("activation_bytes", activation_bytes), ("shard_optimizer", shard_optimizer),
                        ("shard_gradients", shard_gradients), ("shard_weights", shard_weights)):
        _check_int(name, value, 1)
    if n_layers or count_loss_temporaries:  # both need the batch's sizes (n_layers also d_model and n_heads, below)
        for name, value in (("seq_len", seq_len), ("batch_size", batch_size), ("vocab_size", vocab_size)):
            _check_int(f"{name} (needed with n_layers or count_loss_temporaries)", value, 1)
    # Python ints from here on: NumPy's int32 sizes would wrap around in the products below
    n_params, n_layers, param_bytes, activation_bytes = int(n_params), int(n_layers), int(param_bytes), \
        int(activation_bytes)
    shard_optimizer, shard_gradients, shard_weights = int(shard_optimizer), int(shard_gradients), int(shard_weights)
    if n_layers or count_loss_temporaries:
        seq_len, batch_size, vocab_size = int(seq_len), int(batch_size), int(vocab_size)
    grad_bytes = param_bytes if grad_bytes is None else int(grad_bytes)
    activations = recomputed = 0
    if n_layers:
        layer = layer_activation_bytes(d_model=d_model, n_heads=n_heads, seq_len=seq_len, batch_size=batch_size,
                                       d_ff=d_ff, activation_bytes=activation_bytes, autocast=autocast,
                                       fused_attention=fused_attention, dropout=dropout,
                                       autocast_device=autocast_device, activation=activation)
        tokens = seq_len * batch_size
        residual = 4 if autocast else activation_bytes
        head = tokens * (d_model * (residual + activation_bytes) + 4 * vocab_size)
        if autocast:
            head += 2 * vocab_size * d_model  # 16-bit copy of the output projection
        if checkpointing:
            activations, recomputed = n_layers * tokens * d_model * residual + head, layer
        else:
            activations = n_layers * layer + head
    return TrainingMemory(
        weights=n_params * param_bytes // shard_weights,
        gradients=n_params * grad_bytes // shard_gradients,
        optimizer=n_params * _OPTIMIZER_STATE_BYTES[optimizer] // shard_optimizer,
        master_weights=(n_params * 4 // shard_optimizer) if master_weights else 0,
        activations=int(activations),
        recomputed=int(recomputed),
        loss_temporaries=(seq_len * batch_size * vocab_size * (2 * activation_bytes + 8)
                          if count_loss_temporaries else 0),
    )


def model_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """The bytes actually held by a model's weights, gradients and optimizer state tensors."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model_state_bytes needs an nn.Module (a model), got {type(model).__name__}")
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
    """Bytes allocated at the peak while ``fn`` ran, beyond what was allocated before (CUDA only).

    Through :mod:`gpuformer_lib.gpu`, so under a rehearsed GPU profile it runs ``fn`` on the CPU and
    returns the stand-ins' 0 bytes."""
    device = torch.device(device)
    if (device.type != "cuda" or not torch.cuda.is_available()) and rehearsed_profile() is None:
        raise ValueError("peak memory is measured with the CUDA allocator; on a CPU use the calculator "
                         "(training_memory) or model_state_bytes")
    gpu.synchronize(device)
    gpu.reset_peak_memory_stats(device)
    before = gpu.memory_allocated(device)
    fn()
    gpu.synchronize(device)
    return gpu.max_memory_allocated(device) - before


# --------------------------------------------------------------------------- measuring activations on any device


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    storage = t.untyped_storage()
    return str(t.device), storage.data_ptr()


class SavedActivations:
    """Counts the bytes autograd keeps for the backward pass (``torch.autograd.graph.saved_tensors_hooks``).

    Works on every device, the CPU included: each tensor saved for backward is counted once per
    storage (a view and its base are one allocation), the model's own parameters are not counted.
    With ``cap`` (bytes), saving past it raises ``torch.OutOfMemoryError``: a simulated memory limit,
    for trying out-of-memory handling where no GPU is present.

        with SavedActivations(model) as saved:
            loss = model(ids).sum()
        saved.bytes   # what the backward pass will need
    """

    def __init__(self, model: nn.Module | None = None, cap: int | None = None):
        if cap is not None:
            _check_int("cap (bytes)", cap, 1)
        self.cap = cap
        self.bytes = 0
        self._seen: set[tuple[str, int]] = set()
        self._params = {_storage_key(p) for p in model.parameters()} if model is not None else set()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in self._seen and key not in self._params:
            self._seen.add(key)
            self.bytes += t.untyped_storage().nbytes()
            if self.cap is not None and self.bytes > self.cap:
                raise torch.OutOfMemoryError(
                    f"simulated out of memory: activations need more than the cap of {self.cap / 2**20:.1f} MiB")
        return t

    def __enter__(self) -> "SavedActivations":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


def set_activation_checkpointing(model: nn.Module, enabled: bool = True) -> int:
    """Turn activation checkpointing on or off for every layer of a course model's layer stacks, by
    wrapping the layers from outside (:func:`gpuformer_lib.speed.apply_activation_checkpointing`).
    Returns the number of layers (0 means the model has no layer stack, and nothing happened)."""
    from gpuformer_lib import speed  # speed builds on the model; the calculator above does not need it

    if enabled:
        return speed.apply_activation_checkpointing(model)
    return speed.remove_activation_checkpointing(model)


# --------------------------------------------------------------------------- out of memory: recover with accumulation


def is_out_of_memory(error: BaseException) -> bool:
    """True for an allocator out-of-memory error (CUDA, MPS, or the simulated one of SavedActivations)."""
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def free_cached_memory() -> None:
    """Give cached blocks back after an out-of-memory error, so the next try starts clean."""
    import gc

    gc.collect()
    gpu.empty_cache()


def fit_micro_batch(try_step: Callable[[int], object], batch_size: int, *, min_micro_batch: int = 1,
                    verbose: bool = True) -> tuple[int, int]:
    """Find the largest micro-batch that fits, keeping the effective batch ``batch_size``.

    ``try_step(micro_batch)`` runs one training step with that micro-batch (and ``batch_size //
    micro_batch`` accumulation steps). On an out-of-memory error the micro-batch is halved and the
    accumulation doubled, so the optimizer still sees the same batch. Returns ``(micro_batch,
    accumulation_steps)``. Other errors pass through unchanged.
    """
    _check_int("batch_size", batch_size, 1)
    _check_int("min_micro_batch", min_micro_batch, 1)
    micro = batch_size
    while True:
        failed = None
        try:
            try_step(micro)
        except Exception as error:  # noqa: BLE001 - only out-of-memory is handled; the rest is re-raised
            if not is_out_of_memory(error):
                raise
            failed = str(error).splitlines()[0]
        # outside the except block: the traceback (and the tensors its frames hold) is gone now
        if failed is None:
            return micro, batch_size // micro
        free_cached_memory()
        if micro // 2 < min_micro_batch or micro % 2:
            raise torch.OutOfMemoryError(
                f"a micro-batch of {micro} does not fit ({failed}) and it cannot be halved further: shorten "
                "the sequences, turn on activation checkpointing (set_activation_checkpointing), train in bf16, "
                "or shard the model over more GPUs")
        if verbose:
            print(f"micro-batch {micro}: out of memory; trying {micro // 2} x {batch_size // (micro // 2)} "
                  "accumulation steps")
        micro //= 2


# --------------------------------------------------------------------------- a memory cap to try it under


@dataclasses.dataclass(frozen=True)
class MemoryCap:
    """A memory limit for trying out-of-memory recovery: real on a GPU, simulated elsewhere, both in a
    rehearsal. Made by :func:`choose_memory_cap`; enforced by :func:`memory_limit` (the allocator's part,
    around the whole run) and :func:`activation_limit` (the simulated part, around each forward pass)."""

    allocator_bytes: int | None = None
    """Most bytes the CUDA allocator may hold while :func:`memory_limit` is active (``gpu.memory_cap``);
    None without a GPU."""
    activation_bytes: int | None = None
    """Most bytes autograd may keep in one forward pass (``SavedActivations(cap=)``, which raises the
    same ``torch.OutOfMemoryError``); None on a GPU, where the allocator enforces the real cap."""

    def __post_init__(self):
        if self.allocator_bytes is None and self.activation_bytes is None:
            raise ValueError("a MemoryCap needs allocator_bytes, activation_bytes or both")
        for name in ("allocator_bytes", "activation_bytes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be a positive int (bytes) or None, got {value!r}")


def choose_memory_cap(profile: DeviceProfile, device: torch.device | str, small_step: Callable[[], object],
                      small_step_activations: int, *, margin: float = 1.2) -> MemoryCap:
    """A cap under which ``small_step`` (one training step at a small micro-batch) fits with ``margin`` to
    spare, so that larger micro-batches run out of memory.

    On a GPU: the bytes allocated now (weights, optimizer state) plus ``margin`` times the measured peak
    of ``small_step`` beyond them, read after emptying the allocator's cache (the allocator compares the
    cap with what it reserves, cache included). Elsewhere: ``margin`` times ``small_step_activations``,
    what one forward pass of the small step keeps for backward (from the calculator, or measured with
    :class:`SavedActivations`). Rehearsing a GPU profile, both: ``small_step`` runs through the stand-ins,
    which measure 0 bytes, so the allocator cap that ``gpu.memory_cap`` checks takes the simulated figure.
    """
    if not isinstance(margin, numbers.Real) or not 1 <= margin < math.inf:
        raise ValueError(f"margin must be a finite number >= 1 (the small step must fit), got {margin!r}")
    if small_step_activations < 1:
        raise ValueError(f"small_step_activations must be a positive number of bytes, got {small_step_activations}")
    activation_bytes = int(margin * small_step_activations)
    if not profile.on_gpu:
        return MemoryCap(activation_bytes=activation_bytes)
    peak = measure_peak_memory(small_step, device)
    gpu.empty_cache()
    allocator_bytes = gpu.memory_allocated(device) + int(margin * peak)
    if profile.rehearsal:  # the stand-ins measured nothing: check the GPU calls with the simulated figure
        return MemoryCap(allocator_bytes=max(allocator_bytes, activation_bytes), activation_bytes=activation_bytes)
    return MemoryCap(allocator_bytes=allocator_bytes)


@contextlib.contextmanager
def memory_limit(device: torch.device | str, cap: MemoryCap) -> Iterator[MemoryCap]:
    """Hold the GPU to ``cap.allocator_bytes`` while the block runs (``gpu.memory_cap``: lifted afterwards,
    even on an error; checked by its stand-in in a rehearsal). Without an allocator cap it does nothing:
    the simulated part of the cap is per forward pass, :func:`activation_limit`."""
    if cap.allocator_bytes is None:
        yield cap
        return
    with gpu.memory_cap(device, cap.allocator_bytes):
        yield cap


def activation_limit(model: nn.Module, cap: MemoryCap | None) -> ContextManager:
    """The simulated part of ``cap`` for one forward pass: ``SavedActivations(model, cap=...)``, which
    raises ``torch.OutOfMemoryError`` once autograd keeps more than ``cap.activation_bytes``. A null
    context without a cap or where the cap is the allocator's alone (a GPU)."""
    if cap is None or cap.activation_bytes is None:
        return contextlib.nullcontext()
    return SavedActivations(model, cap=cap.activation_bytes)


@dataclasses.dataclass(frozen=True)
class StepPeak:
    """The measured peak of a training step beside the calculator's prediction for it."""

    measured: int
    """Bytes allocated at the step's peak beyond what was allocated before (0 from a rehearsal's stand-ins)."""
    predicted: int
    """The calculator's activations + gradients: what a step allocates beyond weights and optimizer state."""

    def __str__(self) -> str:
        ratio = f"{self.predicted / self.measured:.2f}x" if self.measured else "nothing measured: a rehearsal"
        return (f"peak of a step beyond weights and optimizer state: {self.measured / 2**30:.2f} GiB; "
                f"calculator (activations + gradients): {self.predicted / 2**30:.2f} GiB ({ratio})")


def measure_step_peak(step: Callable[[], object], device: torch.device | str, predicted: TrainingMemory,
                      snapshot: str | None = None) -> StepPeak:
    """Measure the peak of ``step()`` (one training step that starts and ends without gradients) with the
    CUDA allocator, beside ``predicted.activations + predicted.gradients``; with ``snapshot`` (a path) also
    run it once more recording every allocation, and write the snapshot there (``gpu.memory_history``)."""
    measured = measure_peak_memory(step, device)
    if snapshot is not None:
        with gpu.memory_history(snapshot, device):
            step()
    return StepPeak(measured=measured, predicted=predicted.activations + predicted.gradients)


# --------------------------------------------------------------------------- the predicted peak of a step


@dataclasses.dataclass(frozen=True)
class PeakMemory:
    """The predicted peak of a training step: the states held throughout, plus the largest of the moments."""

    saved: TrainingMemory
    """The saved-tensor count (:func:`training_memory`), from which the moments are built."""
    moments: dict
    """Bytes beyond the states at each candidate moment of the step: ``'loss forward'`` (activations, the
    logits in the compute dtype and their float32 copy), ``'loss backward'`` (activations and the float32
    gradients of the log-probabilities and of the logits) and ``'layer backward'`` (activations without the
    log-probabilities, the recomputed layer with checkpointing, and a layer's backward temporaries)."""

    @property
    def states(self) -> int:
        """Weights, gradients (all of them, as from the second micro-batch of an accumulated step), optimizer
        state and master weights."""
        s = self.saved
        return s.weights + s.gradients + s.optimizer + s.master_weights

    @property
    def moment(self) -> str:
        """The moment that sets the peak."""
        return max(self.moments, key=self.moments.get)

    @property
    def peak(self) -> int:
        return self.states + self.moments[self.moment]

    def __str__(self) -> str:
        scale = 2**30 if self.peak >= 2**30 else 2**20
        unit = "GiB" if scale == 2**30 else "MiB"
        rows = [f"{'states':22} {self.states / scale:9.3f} {unit}"]
        rows += [f"{'+ at ' + name:22} {value / scale:9.3f} {unit}" for name, value in self.moments.items()]
        rows += [f"{'saved tensors (total)':22} {self.saved.total / scale:9.3f} {unit}",
                 f"{'predicted peak':22} {self.peak / scale:9.3f} {unit}  (at the {self.moment})"]
        return "\n".join(rows)


def loss_transient_bytes(*, seq_len: int, batch_size: int, vocab_size: int, activation_bytes: int = 4,
                         autocast_device: str = "cuda") -> dict:
    """Vocabulary-sized bytes alive around ``F.cross_entropy(logits, targets)`` beyond the float32 log-probs
    (which the loss saves, and :func:`training_memory` counts as activations).

    In float32 (``activation_bytes=4``), on any device: ``forward``, the logits, B T V 4 bytes;
    ``backward``, the float32 gradient of the log-probabilities (NLL's backward writes a dense B T V tensor)
    and the float32 gradient of the logits (log-softmax's backward), both alive while log-softmax's backward
    runs: B T V 8 bytes.

    In 16 bits under autocast the devices differ, because their autocast op lists do:

    - ``autocast_device="cpu"``: cross-entropy is on the CPU's float32 list, so the logits are copied to
      float32 first and log-softmax runs in float32. ``forward``: the logits and their float32 copy,
      B T V (2 + 4); ``backward``: as in float32, B T V 8 (measured with ``LiveBytes``).
    - ``autocast_device="cuda"`` (the default, for a GPU's calculator): cross-entropy is on neither CUDA
      list and calls log-softmax in the logits' own dtype, so log-softmax runs in 16 bits; NLL is on the
      float32 list and copies the 16-bit log-probs to float32. Both are saved: the 16-bit log-probs (by
      log-softmax) beside the float32 ones counted as activations. ``forward``: the logits and the 16-bit
      log-probs, B T V (2 + 2); ``backward``: the 16-bit log-probs still saved and NLL's float32 gradient,
      B T V (2 + 4), alive while NLL's backward runs; the float32 log-probs are freed after it, and what
      follows (the gradient cast to 16 bits, log-softmax's 16-bit backward) is smaller. Read off the
      operations on an H200 (torch 2.11, a ``TorchDispatchMode`` logging every output of 4 MiB or more and
      ``torch.cuda.memory_allocated`` after it, 2026-11-28); ``max_memory_allocated`` agreed with the
      prediction within 2 % at six settings (``tests/test_activation_accounting.py``)."""
    for name, value in (("seq_len", seq_len), ("batch_size", batch_size), ("vocab_size", vocab_size),
                        ("activation_bytes", activation_bytes)):
        _check_int(name, value, 1)
    if autocast_device not in ("cuda", "cpu"):
        raise ValueError(f"autocast_device must be 'cuda' or 'cpu', got {autocast_device!r}")
    logits = int(seq_len) * int(batch_size) * int(vocab_size)
    ab = int(activation_bytes)
    if ab >= 4:
        return {"forward": logits * ab, "backward": logits * 8}
    if autocast_device == "cpu":
        return {"forward": logits * (ab + 4), "backward": logits * 8}
    return {"forward": logits * 2 * ab, "backward": logits * (ab + 4)}


def layer_backward_bytes(*, d_model: int, n_heads: int, seq_len: int, batch_size: int, d_ff: int | None = None,
                         activation_bytes: int = 4, fused_attention: bool = True) -> int:
    """Temporaries alive inside one layer's backward pass beyond its saved activations: the gradients of its
    widest intermediates, two F-wide ones (the feed-forward's hidden before and after the activation
    function), the residual stream's float32 gradient and its copy, and with explicit attention the
    gradients of the attention weights and scores (2 H T per token). Checked on the CPU with
    :class:`gpuformer_lib.activation_accounting.LiveBytes` (a test holds the step's peak within 10 %)."""
    C, H, T, B = int(d_model), int(n_heads), int(seq_len), int(batch_size)
    F_ = 4 * C if d_ff is None else int(d_ff)
    tokens = T * B
    total = tokens * (2 * F_ * activation_bytes + 2 * C * 4)
    if not fused_attention:
        total += 2 * H * T * tokens * activation_bytes
    return total


def predicted_peak(n_params: int, **settings) -> PeakMemory:
    """The predicted peak of one training step (``training_memory``'s arguments; ``n_layers`` and the batch's
    sizes needed): the largest of three moments, each beyond the states (weights, gradients, optimizer state).

    - at the loss, forward: the activations, the logits and, in 16 bits, a copy in the other precision
      (:func:`loss_transient_bytes`, which says how CUDA and CPU autocast differ);
    - at the loss, backward: the activations and the loss's gradients (float32, and on CUDA in 16 bits the
      16-bit log-probs that are still saved);
    - in a layer's backward pass: the activations less the log-probs (freed once the loss's backward ran),
      the recomputed layer with checkpointing, and the layer's backward temporaries
      (:func:`layer_backward_bytes`).

    Gradients are counted at every moment (they all exist from the second micro-batch of an accumulated step
    on; in a single micro-batch they appear during the backward pass, so the prediction is high by at most
    the gradients). Not counted: allocator rounding and fragmentation, cuBLAS/cuDNN workspaces, the CUDA
    context (several hundred MiB outside PyTorch's allocator), communication buffers.
    """
    if settings.get("count_loss_temporaries"):
        raise ValueError("predicted_peak counts the loss's transients itself: leave count_loss_temporaries out")
    if not settings.get("n_layers"):
        raise ValueError("predicted_peak needs n_layers and the batch's sizes (d_model, n_heads, seq_len, "
                         "batch_size, vocab_size)")
    saved = training_memory(n_params, **settings)
    ab = settings.get("activation_bytes", 4)
    sizes = dict(seq_len=settings["seq_len"], batch_size=settings["batch_size"])
    loss = loss_transient_bytes(vocab_size=settings["vocab_size"], activation_bytes=ab,
                                autocast_device=settings.get("autocast_device", "cuda"), **sizes)
    log_probs = 4 * settings["seq_len"] * settings["batch_size"] * settings["vocab_size"]
    layer = layer_backward_bytes(d_model=settings["d_model"], n_heads=settings.get("n_heads", 1),
                                 d_ff=settings.get("d_ff"), activation_bytes=ab,
                                 fused_attention=settings.get("fused_attention", True), **sizes)
    moments = {"loss forward": saved.activations + loss["forward"],
               "loss backward": saved.activations + loss["backward"],
               "layer backward": saved.activations - log_probs + saved.recomputed + layer}
    return PeakMemory(saved=saved, moments=moments)
