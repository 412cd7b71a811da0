"""Mixed precision, measured: which dtype autocast gives each operation (and how CPU and CUDA differ), how
many updates a 16-bit weight loses to rounding, how large a precision benchmark must be to be
compute-bound on a GPU, and the bytes per parameter of each training recipe.

- **Autocast's op lists** (PyTorch's "Autocast Op Reference", ``docs/source/amp.rst``): on CUDA, matrix
  products run in the 16-bit type and a documented list (softmax, log_softmax, layer_norm, the losses,
  exp, sum, ...) is cast to float32; on the CPU the float32 list is different and does *not* name softmax
  or layer_norm, so with bf16 inputs they stay bf16. :func:`autocast_output_dtypes` measures the dtypes on
  a device, :func:`documented_cuda_dtypes` predicts them for CUDA from the documented lists.
- **Lost updates** (Micikevicius et al. 2018, "Mixed Precision Training", §3.1: weight updates too small
  for fp16 vanish): ``w + u`` rounds back to ``w`` when ``|u|`` is below half the spacing of the format
  at ``w``, ``eps * 2^floor(log2 |w|)``. :func:`predicted_lost_share` applies that rule,
  :func:`measured_lost_share` does the addition in the format; tests hold them together.
- **A compute-bound benchmark** (:func:`precision_benchmark_run`, :func:`launch_check`): the training
  step's GPU work as the course's predictor sees it (``gpuformer_lib.predict``: products at the achievable
  rate, memory traffic), against its kernels times the launch cost measured inside a real step. If
  launches dominate, every format reads about 1x.
- **Bytes per parameter** (:func:`state_bytes_per_param`): float32 AdamW 4 + 4 + 8; autocast adds 2-byte
  weight copies at the peak; bf16 weights with a float32 master copy 2 + 2 + 4 + 8, plus 4 with float32
  gradient accumulation (16-20 bytes, ZeRO's count in Rajbhandari et al. 2020, section 3.1).
- **Where a float16 overflow starts** (:func:`first_nonfinite`): a hook on every module names the first whose
  output held an inf or a NaN, where the loss's NaN only says that something, somewhere, overflowed.

Leaves out: the training loop's precision option (``train``, ``speed.make_train_step``, which does
``scaler.unscale_`` before clipping), FP8 (``fp8``), the memory calculator (``memory``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from gpuformer_lib.device import SizePreset
from gpuformer_lib.model import TransformerConfig
from gpuformer_lib.model_sizes import RunSize

AMP_OP_REFERENCE_URL = "https://docs.pytorch.org/docs/stable/amp.html#autocast-op-reference"
"""PyTorch's Autocast Op Reference (source: ``docs/source/amp.rst`` in pytorch/pytorch)."""

CUDA_LOWER_PRECISION_OPS = frozenset({
    "__matmul__", "addbmm", "addmm", "addmv", "addr", "baddbmm", "bmm", "multi_dot", "conv1d", "conv2d", "conv3d",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "GRUCell", "linear", "LSTMCell", "matmul", "mm",
    "mv", "prelu", "RNNCell"})
"""'CUDA Ops that can autocast to float16' (to the autocast dtype, bf16 too), as the op reference lists them."""

CUDA_FLOAT32_OPS = frozenset({
    "__pow__", "__rdiv__", "__rpow__", "__rtruediv__", "acos", "asin", "binary_cross_entropy_with_logits", "cosh",
    "cosine_embedding_loss", "cdist", "cosine_similarity", "cross_entropy", "cumprod", "cumsum", "dist", "erfinv",
    "exp", "expm1", "group_norm", "hinge_embedding_loss", "kl_div", "l1_loss", "layer_norm", "log", "log_softmax",
    "log10", "log1p", "log2", "margin_ranking_loss", "mse_loss", "multilabel_margin_loss", "multi_margin_loss",
    "nll_loss", "norm", "normalize", "pdist", "poisson_nll_loss", "pow", "prod", "reciprocal", "rsqrt", "sinh",
    "smooth_l1_loss", "soft_margin_loss", "softmax", "softmin", "softplus", "sum", "renorm", "tan",
    "triplet_margin_loss"})
"""'CUDA Ops that can autocast to float32', as the op reference lists them."""

PROBES: dict[str, Callable] = {
    "matmul": lambda x, w, t: x @ w,
    "linear": lambda x, w, t: F.linear(x, w),
    "softmax": lambda x, w, t: torch.softmax(x, -1),
    "log_softmax": lambda x, w, t: torch.log_softmax(x, -1),
    "layer_norm": lambda x, w, t: F.layer_norm(x, (x.shape[-1],)),
    "exp": lambda x, w, t: torch.exp(x),
    "sum": lambda x, w, t: torch.sum(x),
    "cross_entropy": lambda x, w, t: F.cross_entropy(x, t),
    "add": lambda x, w, t: x + w,
}
"""The operations a Transformer step uses, each called as autocast sees it (name = the op reference's name)."""


def autocast_default_dtype(device_type: str) -> torch.dtype:
    """The dtype ``torch.autocast(device_type)`` uses when none is given (``torch.get_autocast_dtype``):
    float16 on CUDA, bfloat16 on the CPU. bf16 on a GPU must be asked for with ``dtype=torch.bfloat16``."""
    return torch.get_autocast_dtype(device_type)


def autocast_output_dtypes(device_type: str = "cpu", dtype: torch.dtype = torch.bfloat16,
                           input_dtype: torch.dtype = torch.bfloat16, device: torch.device | str | None = None
                           ) -> dict[str, torch.dtype]:
    """Measured: the dtype each of :data:`PROBES` returns under ``torch.autocast(device_type, dtype)`` with
    inputs in ``input_dtype`` (use 16-bit inputs: with float32 inputs an op that autocast leaves alone
    returns float32 too, and an upcast cannot be told from a pass-through)."""
    device = torch.device(device if device is not None else device_type)
    if device.type != device_type:
        raise ValueError(f"device {device} is not a {device_type!r} device")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 8, generator=g).to(device=device, dtype=input_dtype)
    w = torch.randn(8, 8, generator=g).to(device=device, dtype=input_dtype)
    target = torch.zeros(8, dtype=torch.long, device=device)
    with torch.autocast(device_type, dtype=dtype):
        return {name: fn(x, w, target).dtype for name, fn in PROBES.items()}


def documented_cuda_dtypes(dtype: torch.dtype = torch.bfloat16, input_dtype: torch.dtype = torch.bfloat16
                           ) -> dict[str, torch.dtype]:
    """Predicted from the op reference: the dtype each probe returns under CUDA autocast in ``dtype``.
    Listed lower-precision ops give ``dtype``, listed float32 ops give float32, unlisted ops (an add)
    run in their inputs' type."""
    out = {}
    for name in PROBES:
        if name in CUDA_LOWER_PRECISION_OPS:
            out[name] = dtype
        elif name in CUDA_FLOAT32_OPS:
            out[name] = torch.float32
        else:
            out[name] = input_dtype
    return out


def autocast_table(cpu: dict[str, torch.dtype], cuda: dict[str, torch.dtype]) -> str:
    """The two columns side by side, with the rows where CPU and CUDA differ marked."""
    def short(d):
        return str(d).removeprefix("torch.")

    lines = [f"{'op':14} {'CPU (measured)':>15} {'CUDA (documented)':>18}"]
    for name in cpu:
        mark = "   <- differs" if cpu[name] != cuda[name] else ""
        lines.append(f"{name:14} {short(cpu[name]):>15} {short(cuda[name]):>18}{mark}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- lost updates


def spacing(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The gap between ``|x|`` (rounded to ``dtype``) and the next larger number of ``dtype``, in float64:
    ``eps * 2^floor(log2 |x|)`` for normal numbers, ``tiny * eps`` below ``tiny`` (subnormals)."""
    fi = torch.finfo(dtype)
    a = x.detach().to(dtype).double().abs()
    normal = fi.eps * torch.exp2(torch.floor(torch.log2(a.clamp(min=fi.tiny))))
    return torch.where(a >= fi.tiny, normal, torch.full_like(a, fi.tiny * fi.eps))


def predicted_lost_share(weights: torch.Tensor, updates: torch.Tensor, dtype: torch.dtype) -> float:
    """Share of the non-zero ``updates`` that the rounding rule says vanish when added to ``weights`` in
    ``dtype``: those smaller than half the spacing at the weight."""
    w, u = weights.detach().double().flatten(), updates.detach().double().flatten()
    nonzero = u != 0
    if not bool(nonzero.any()):
        raise ValueError("every update is zero: there is no share of lost updates to predict")
    lost = u.abs() < spacing(w, dtype) / 2
    return float((lost & nonzero).sum() / nonzero.sum())


def measured_lost_share(weights: torch.Tensor, updates: torch.Tensor, dtype: torch.dtype) -> float:
    """Share of the non-zero ``updates`` for which ``w + u``, computed and stored in ``dtype``, equals ``w``."""
    w, u = weights.detach().flatten(), updates.detach().flatten()
    nonzero = u != 0
    if not bool(nonzero.any()):
        raise ValueError("every update is zero: there is no share of lost updates to measure")
    w16 = w.to(dtype)
    unchanged = (w16 + u.to(dtype)) == w16
    return float((unchanged & nonzero).sum() / nonzero.sum())


@dataclasses.dataclass(frozen=True)
class LostUpdates:
    """Lost-update shares at one learning rate: the rule's prediction and the measured addition."""

    lr: float
    predicted: float
    measured: float


def lr_sweep(weights: torch.Tensor, grads: torch.Tensor, lrs: Sequence[float], dtype: torch.dtype
             ) -> list[LostUpdates]:
    """For each learning rate, the share of SGD updates ``-lr * grad`` lost in ``dtype`` (predicted and measured)."""
    if not lrs or any(not (isinstance(lr, (int, float)) and lr > 0) for lr in lrs):
        raise ValueError(f"lrs must be positive learning rates, got {lrs!r}")
    return [LostUpdates(float(lr), predicted_lost_share(weights, -lr * grads, dtype),
                        measured_lost_share(weights, -lr * grads, dtype)) for lr in lrs]


def trend_words(sweep: Sequence[LostUpdates]) -> str:
    """How the measured share moves as the learning rate falls, chosen from the values."""
    by_lr = sorted(sweep, key=lambda s: s.lr, reverse=True)
    shares = [s.measured for s in by_lr]
    if all(b >= a for a, b in zip(shares, shares[1:])) and shares[-1] > shares[0]:
        return "rises as the learning rate falls"
    if all(b <= a for a, b in zip(shares, shares[1:])) and shares[-1] < shares[0]:
        return "falls as the learning rate falls"
    return "does not move in one direction with the learning rate"


def half_loss_lr(weights: torch.Tensor, grads: torch.Tensor, dtype: torch.dtype, *, low: float = 1e-6,
                 high: float = 1e3, iterations: int = 40) -> float:
    """Measured: the learning rate at which half the SGD updates ``-lr * grad`` vanish when added to
    ``weights`` in ``dtype`` (bisection on log lr; the share lost falls as lr rises)."""
    if not 0 < low < high:
        raise ValueError(f"need 0 < low < high, got {low!r}, {high!r}")
    share = lambda lr: measured_lost_share(weights, -lr * grads, dtype)  # noqa: E731
    if not share(low) > 0.5 > share(high):
        raise ValueError(f"the share lost does not cross one half between lr {low:g} and {high:g}")
    for _ in range(iterations):
        mid = math.sqrt(low * high)
        low, high = (mid, high) if share(mid) > 0.5 else (low, mid)
    return math.sqrt(low * high)


# --------------------------------------------------------------------------- a compute-bound benchmark


COMPUTE_BOUND_RATIO = 2.5
"""A benchmark is compute-bound enough when the GPU's predicted work takes this many times the host's
launches: the formats' speeds show even if the launches cost two and a half times what was measured. The
evidence that this suffices: at the ``gpu`` preset (a ratio of 2.9 by the predictor) the course's committed
H100 run measured bf16 8.9x faster than float32 (``ch08.precision_step``)."""


def precision_benchmark_run(preset: SizePreset, vocab_size: int = 16) -> RunSize:
    """The model, batch and length of chapter 8's benchmark of the precisions, per preset. On a GPU a step
    must be compute-bound for the formats to differ (:func:`launch_check` holds each preset to it): on
    ``gpu-small`` (a T4) 32 x 512 tokens through 8 layers of width 512, 2.9 TFLOP a step; on ``gpu`` (24 GiB
    or more, an H100) 16 x 1024 tokens through 4 layers of width 2048, 21 TFLOP a step, whose float32 peak
    memory (``memory.training_memory``) stays well inside 24 GiB. On a CPU, toy sizes."""
    if not isinstance(preset, SizePreset):
        raise TypeError(f"preset must be a SizePreset, got {preset!r}")
    seq_len = preset.pick(cpu=24, gpu=1024, gpu_small=512)
    config = TransformerConfig(
        vocab_size=vocab_size, d_model=preset.pick(cpu=64, gpu=2048, gpu_small=512),
        n_heads=preset.pick(cpu=4, gpu=16, gpu_small=8), n_decoder_layers=preset.pick(cpu=2, gpu=4, gpu_small=8),
        d_ff=preset.pick(cpu=128, gpu=8192, gpu_small=2048), dropout=0.0, max_len=seq_len, check_token_ids=False)
    return RunSize(config=config, batch_size=preset.pick(cpu=32, gpu=16, gpu_small=32), seq_len=seq_len,
                   steps=preset.pick(cpu=60, gpu=60), lr=1e-2)


def count_training_operators(config: TransformerConfig, dtype: torch.dtype | None = None) -> int:
    """The kernels one training step (forward, loss, backward, a foreach AdamW step) of a ``DecoderLM`` of
    ``config`` launches on a GPU, under autocast in ``dtype`` (None: float32): the course's one kernel count,
    ``predict.count_kernels`` (views and detaches launch nothing; it matches the profiler's count on an H100
    within 2 %)."""
    from gpuformer_lib import predict

    return predict.count_kernels(config, dtype=dtype).total


@dataclasses.dataclass(frozen=True)
class LaunchCheck:
    """A training step's predicted GPU work against its host's launches (the course's predictor,
    ``gpuformer_lib.predict``)."""

    gpu: str
    dtype: torch.dtype
    flops: int
    operators: int
    """Kernels the step launches (``predict.count_kernels``)."""
    compute_seconds: float
    """The GPU's predicted work: matrix products at the achievable rate plus every other kernel's memory
    traffic at the achievable bandwidth."""
    launch_seconds: float
    """The host's: kernels x the launch cost measured inside a real eager step (``predict.launch_seconds``)."""

    @property
    def ratio(self) -> float:
        return self.compute_seconds / self.launch_seconds

    @property
    def compute_bound(self) -> bool:
        return self.ratio >= COMPUTE_BOUND_RATIO


def launch_check(run: RunSize, gpu: str, dtype: torch.dtype, operators: int | None = None) -> LaunchCheck:
    """Whether ``run``'s eager step on ``gpu`` in ``dtype`` is set by the GPU's work rather than by the host's
    launches, as the course's predictor sees it (``operators``: override the kernel count)."""
    from gpuformer_lib import predict

    work = predict.training_work(run.config, tokens=run.batch_size * run.seq_len, seq_len=run.seq_len,
                                 fmt=predict.format_of(dtype))
    if operators is not None:
        work = dataclasses.replace(work, kernels=operators)
    step = predict.predict_step(work, gpu)
    return LaunchCheck(gpu, dtype, work.matrix_flops, work.kernels, step.gpu_s, step.host_s)


MODE_DTYPES = {"fp32": None, "tf32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
"""The autocast dtype of each training precision (None: no autocast; ``tf32`` is float32 with TF32 matmuls)."""


def compare_precisions(config: TransformerConfig, loss_fn: Callable, batch, modes: Sequence[str], *,
                       device: torch.device | str, lr: float = 1e-4, **timing) -> dict:
    """One training step of a ``DecoderLM`` of ``config`` on ``batch`` in each of ``modes`` (``fp32`` first, the
    baseline; then any of ``tf32``, ``bf16``, ``fp16``), timed in interleaved rounds after a warm-up
    (``bench.compare``, which ``timing`` goes to): each mode's :class:`~gpuformer_lib.bench.Comparison` against
    ``fp32``, by mode. The modes share one model and one AdamW at a small constant rate (a step's time does not
    depend on the weights' values, and a rate meant for a fresh model with warm-up could grow fp16's
    activations to overflow); fp16 steps go through a ``GradScaler``; the steps are ``speed.make_train_step``'s
    (``loss_fn(model, batch)`` returns the mean loss and the token count). The batch must already be on
    ``device``."""
    from gpuformer_lib import bench, speed
    from gpuformer_lib.model import DecoderLM

    modes = list(modes)
    if not modes or modes[0] != "fp32" or len(set(modes)) != len(modes) or len(modes) < 2:
        raise ValueError(f"modes must start with 'fp32' (the baseline) and name at least one other, once each; "
                         f"got {modes}")
    unknown = [m for m in modes if m not in MODE_DTYPES]
    if unknown:
        raise ValueError(f"unknown precision modes {unknown}: use {list(MODE_DTYPES)}")
    device = torch.device(device)
    model = DecoderLM(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)

    def timed_step(mode: str) -> Callable[[], object]:
        dtype = MODE_DTYPES[mode]
        scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
        step = speed.make_train_step(model, optimizer, loss_fn, dtype=dtype, scaler=scaler, tf32=mode == "tf32")
        return lambda: step([batch])

    return bench.compare({mode: timed_step(mode) for mode in modes}, baseline="fp32", device=device, **timing)


# --------------------------------------------------------------------------- bytes per parameter


RECIPES = ("fp32", "autocast", "fp16 + fp32 master", "bf16 + fp32 master", "bf16 + fp32 master + fp32 grads")
"""Training recipes with AdamW, by what they store per parameter."""


def state_bytes_per_param(recipe: str) -> dict[str, int]:
    """Bytes per parameter at the peak of a step, by part, for a recipe of :data:`RECIPES` with AdamW:

    - ``fp32``: weights 4, gradients 4, two moments 8 (16);
    - ``autocast``: the same float32 states plus the 16-bit weight copies autocast makes in the forward
      and keeps for the backward, 2 (18 at the peak; ``memory.layer_activation_bytes`` counts them);
    - ``fp16 + fp32 master`` / ``bf16 + fp32 master``: 16-bit weights 2 and gradients 2, a float32
      master copy 4 and the moments 8 (16: ZeRO's "2 + 2 + K" with K = 12);
    - ``bf16 + fp32 master + fp32 grads``: float32 gradient accumulation adds 4 (20).
    """
    parts = {
        "fp32": {"weights": 4, "gradients": 4, "adam moments": 8},
        "autocast": {"weights": 4, "gradients": 4, "adam moments": 8, "16-bit weight copies": 2},
        "fp16 + fp32 master": {"weights": 2, "gradients": 2, "master weights": 4, "adam moments": 8},
        "bf16 + fp32 master": {"weights": 2, "gradients": 2, "master weights": 4, "adam moments": 8},
        "bf16 + fp32 master + fp32 grads": {"weights": 2, "gradients": 2, "master weights": 4, "adam moments": 8,
                                            "fp32 gradient accumulator": 4},
    }
    if recipe not in parts:
        raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
    return dict(parts[recipe])


# --------------------------------------------------------------------------- shapes


def padded_size(n: int, multiple: int = 64) -> int:
    """``n`` rounded up to a multiple of ``multiple`` (GPT-2's vocabulary 50257 -> 50304 for 64), so a
    matrix dimension leaves fewer partly filled tensor-core tiles."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
        raise ValueError(f"multiple must be an int >= 1, got {multiple!r}")
    return math.ceil(n / multiple) * multiple


def misaligned_dims(config: TransformerConfig, multiple: int = 8) -> dict[str, int]:
    """The matrix dimensions of ``config`` that are not multiples of ``multiple`` (8 for fp16/bf16 tensor
    cores to be used without padding, 64 to fill their tiles): d_model, d_ff, head size, vocabulary."""
    dims = {"d_model": config.d_model, "d_ff": config.d_ff, "head size": config.d_model // config.n_heads,
            "vocab_size": config.vocab_size}
    return {name: v for name, v in dims.items() if v % multiple}


# --------------------------------------------------------------------------- the scaler with clipping and accumulation


def _grad_vector(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.detach().flatten().double() for p in model.parameters() if p.grad is not None])


@dataclasses.dataclass(frozen=True)
class ClipWithScaler:
    """Gradient norms and the size of one SGD update under fp16 autocast and a loss scale."""

    scale: float
    scaled_norm: float
    """The norm ``clip_grad_norm_`` sees before ``unscale_``: the scale times the true norm."""
    true_norm: float
    update_unscaled_first: float
    """Norm of the weight change with ``unscale_`` before clipping (the right order)."""
    update_clipped_scaled: float
    """Norm of the weight change when the scaled gradients are clipped (``unscale_`` forgotten)."""


def clip_with_scaler(make_model: Callable[[], torch.nn.Module], loss_fn: Callable, batch, *, scale: float = 2.0**16,
                     max_norm: float = 1.0, lr: float = 0.1) -> ClipWithScaler:
    """One SGD step of a fresh ``make_model()`` on ``batch`` under CPU fp16 autocast with a GradScaler of
    ``scale``, clipping the gradient norm to ``max_norm`` either after ``scaler.unscale_`` or before it
    (clipping the scaled gradients). Returns the norms and the size of each update."""
    results = {}
    for unscale_first in (True, False):
        model = make_model()
        before = torch.cat([p.detach().flatten().double() for p in model.parameters()])
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        scaler = torch.amp.GradScaler("cpu", init_scale=scale)
        with torch.autocast("cpu", dtype=torch.float16):
            loss, _ = loss_fn(model, batch)
        scaler.scale(loss).backward()
        scaled_norm = float(_grad_vector(model).norm())
        if unscale_first:
            scaler.unscale_(opt)  # divides the gradients by the scale, in place; step() will not do it again
            true_norm = float(_grad_vector(model).norm())
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(opt)
        scaler.update()
        after = torch.cat([p.detach().flatten().double() for p in model.parameters()])
        results[unscale_first] = (scaled_norm, float((after - before).norm()))
    return ClipWithScaler(scale, results[True][0], true_norm, results[True][1], results[False][1])


@dataclasses.dataclass(frozen=True)
class AccumulationWithScaler:
    """Accumulated fp16-autocast gradients against one large float32 batch, and the misuses PyTorch refuses."""

    relative_error: float
    """``||accumulated - reference|| / ||reference||``: scale every micro-batch, unscale once."""
    update_between: str
    """The error PyTorch raises for ``scaler.update()`` between micro-batches (the scale would change while
    gradients are being summed)."""
    unscale_twice: str
    """The error PyTorch raises for a second ``unscale_`` before ``update()`` (gradients divided twice)."""


def _refusal(fn: Callable[[], object]) -> str:
    try:
        fn()
    except (RuntimeError, AssertionError) as err:
        return str(err)
    return ""


def accumulation_with_scaler(make_model: Callable[[], torch.nn.Module], loss_fn: Callable, micro_batches: Sequence,
                             *, scale: float = 2.0**10) -> AccumulationWithScaler:
    """Accumulate the gradients of ``micro_batches`` (equal sizes: each loss divided by their number) under
    CPU fp16 autocast, ``scaler.scale(loss).backward()`` for each, then one ``unscale_``, as
    ``speed.make_train_step`` does; compare with the float32 gradient of all the micro-batches at once.
    Also records what PyTorch says to the two misuses that would mix scales or divide twice."""
    reference_model = make_model()
    n = len(micro_batches)
    for batch in micro_batches:
        loss, _ = loss_fn(reference_model, batch)
        (loss / n).backward()
    reference = _grad_vector(reference_model)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=scale)
    for k, batch in enumerate(micro_batches):
        with torch.autocast("cpu", dtype=torch.float16):
            loss, _ = loss_fn(model, batch)
        scaler.scale(loss / n).backward()  # every micro-batch by the same scale
        if k == 0:
            between = _refusal(scaler.update)  # before any unscale_/step: nothing checked for inf yet
    scaler.unscale_(opt)  # once, on the sum
    error = float((_grad_vector(model) - reference).norm() / reference.norm())
    twice = _refusal(lambda: scaler.unscale_(opt))
    return AccumulationWithScaler(error, between, twice)


# --------------------------------------------------------------------------- pure bf16: sums that stall


def stochastic_round_bf16(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Round float32 ``x`` to bf16 **stochastically**: up with probability equal to the distance from the
    lower neighbour over the gap, so the rounding is unbiased on average (``E[round(x)] = x``). bf16 is the
    top 16 bits of float32: add a uniform random 16-bit integer to the low half, then drop it."""
    bits = x.detach().to(torch.float32).contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, bits.shape, generator=generator, dtype=torch.int32)
    rounded = (bits + noise) & -65536  # -65536 is 0xFFFF0000 as an int32: keep the top 16 bits
    return rounded.view(torch.float32).to(torch.bfloat16)


def running_sum(values: torch.Tensor, dtype: torch.dtype, method: str = "nearest", seed: int = 0) -> float:
    """Add ``values`` one at a time into an accumulator kept in ``dtype``, as a weight in pure 16-bit
    training takes its updates: ``nearest`` (PyTorch's round to nearest even after each add),
    ``kahan`` (compensated summation: a second 16-bit number keeps what each add rounded away;
    Kahan 1965) or ``stochastic`` (bf16 only: each sum rounded stochastically). Returns the float64 total."""
    if method not in ("nearest", "kahan", "stochastic"):
        raise ValueError(f"method must be 'nearest', 'kahan' or 'stochastic', got {method!r}")
    if method == "stochastic" and dtype != torch.bfloat16:
        raise ValueError("stochastic rounding is written here for bf16 only")
    g = torch.Generator().manual_seed(seed)
    total = torch.zeros((), dtype=dtype)
    carry = torch.zeros((), dtype=dtype)
    for v in values.to(torch.float32):
        if method == "nearest":
            total = total + v.to(dtype)
        elif method == "kahan":
            y = v.to(dtype) - carry
            t = total + y
            carry = (t - total) - y  # what the add rounded away, with its sign flipped
            total = t
        else:
            total = stochastic_round_bf16(total.float() + v, g)
    return float(total.double())


# --------------------------------------------------------------------------- where a 16-bit overflow starts


@dataclasses.dataclass(frozen=True)
class NonFinite:
    """The first module of a forward pass whose output held an inf or a NaN."""

    module: str
    """Its name in ``model.named_modules()``."""
    largest_input: float
    """The largest finite |value| among its inputs: what the module amplified past the format's range."""
    first_output_inf: bool
    """True when the output held an inf (an overflow); False when only NaNs (an inf met an operation first)."""


def first_nonfinite(model: torch.nn.Module, run: Callable[[], object]) -> NonFinite | None:
    """Run ``run()`` (a forward pass through ``model``) with a hook on every module that has no children, and
    return the first one, in the order they ran, whose output held a value that is not finite; None if every
    output was finite. Where a float16 forward turns into NaN, this names where the overflow began: a large
    product in float16 (largest finite value 65,504) becomes inf, and inf - inf or 0 * inf turns into NaN two
    modules later, where the NaN is usually noticed. The hooks are removed on the way out, whatever happens."""
    found: list[NonFinite] = []

    def largest_finite(values) -> float:
        best = 0.0
        for value in values:
            if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
                finite = value.detach()[torch.isfinite(value.detach())]
                if finite.numel():
                    best = max(best, finite.abs().max().item())
        return best

    def hook(name: str):
        def check(module, inputs, output):
            if found:
                return
            outputs = output if isinstance(output, (tuple, list)) else (output,)
            tensors = [o for o in outputs if isinstance(o, torch.Tensor) and o.is_floating_point()]
            if any(not torch.isfinite(o).all() for o in tensors):
                found.append(NonFinite(name, largest_finite(inputs), any(torch.isinf(o).any() for o in tensors)))
        return check

    handles = [module.register_forward_hook(hook(name)) for name, module in model.named_modules()
               if name and not any(True for _ in module.children())]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return found[0] if found else None
