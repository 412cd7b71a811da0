"""Model compression on the CPU: post-training dynamic int8 quantization, and knowledge distillation.

Covers:

- From scratch: :func:`quantize_per_channel` (symmetric int8, one scale per row: q = round(w / s),
  s = max|w_row| / 127, so |w - s q| <= s / 2), :func:`dequantize`, and :class:`Int8Linear`, a linear
  layer with int8 weights that quantizes its input per row at run time ("dynamic" quantization),
  multiplies int8 by int8 with int32 accumulation (``torch._int_mm``) and rescales:
  y = s_x s_w (q_x q_w^T) + b. :func:`int8_linear_error_bound` is the worst case of that against the
  float computation, derived in its docstring.
- PyTorch's own: :func:`torch_quantize_dynamic`, ``torch.ao.quantization.quantize_dynamic`` on every
  ``nn.Linear`` (deprecated: torch 2.13 warns that ``torch.ao.quantization`` "will be removed in 2.10", and it
  still works; its warnings are returned, not hidden).
- :func:`compare_quantization`: the course's model in fp32, with torch's int8 and with :class:`Int8Linear`:
  size of the saved state dict, latency (median after warm-up, same inputs and threads) and held-out loss.
- Knowledge distillation (Hinton, Vinyals and Dean 2015, "Distilling the Knowledge in a Neural Network",
  §2): :func:`distillation_loss` = alpha T^2 KL(softmax(z_t / T) || softmax(z_s / T)) + (1 - alpha) CE, and
  :func:`distill`, a small student trained from a larger teacher against the same student on hard labels;
  :func:`distill_translator`, the same experiment for chapter 13's encoder-decoder translator (the loss over
  real target tokens only), sized for chapter 16 by :func:`translator_distillation_plan` and run in one call
  by :func:`translator_distillation`.
- A small character-level Shakespeare task to measure on (:func:`char_lm_data`, :func:`train_lm`,
  :func:`heldout_loss`): the text chapter 7 trains on, with its 90/10 split.

Which weights int8 covers: the exact ``nn.Linear`` modules (attention output projection, both feed-forward
layers). The fused Q/K/V projection (a bare parameter, ``in_proj_weight``), embeddings and layer norms stay
float32, and so does the output layer (a subclass of ``nn.Linear`` that may share the embedding's weights):
:attr:`QuantizationComparison.quantized_share` says how much of the model that is.

Leaves out: static (calibrated) activation quantization, quantization-aware training, weight-only int4 and
FP8 on GPUs (chapter 16 cites them), and pruning.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import math
import numbers
import time
import warnings
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpuformer_lib import bench, data, model_sizes
from gpuformer_lib.device import SizePreset
from gpuformer_lib.model import DecoderLM, Transformer, TransformerConfig

if TYPE_CHECKING:
    from gpuformer_lib import translation_task

INT8_MAX = 127
"""Symmetric int8 uses [-127, 127]; -128 is left out so that q and -q are both representable."""


# --------------------------------------------------------------------------- int8 from scratch


def _check_float_matrix(w: Tensor, name: str) -> None:
    if not isinstance(w, Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(w).__name__}")
    if w.dim() != 2:
        raise ValueError(f"{name} must be 2-D (rows, columns), got shape {tuple(w.shape)}: flatten leading "
                         "dimensions first, e.g. x.reshape(-1, x.shape[-1])")
    if not w.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor to quantize, got {w.dtype}")
    if not torch.isfinite(w).all():
        raise ValueError(f"{name} holds NaN or infinite values, which have no int8 code")


def quantize_per_channel(w: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric per-row int8: ``w`` (N, K) float -> (q (N, K) int8, scale (N,) float32) with
    w ~ scale[:, None] * q. scale = max|row| / 127, q = round(w / scale) in [-127, 127]; an all-zero row
    gets scale 1 (its codes are 0). Rounding error: |w - scale q| <= scale / 2 per entry."""
    _check_float_matrix(w, "w")
    amax = w.detach().abs().amax(dim=1).float()  # (N,)
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
    q = torch.round(w.detach().float() / scale[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def dequantize(q: Tensor, scale: Tensor) -> Tensor:
    """int8 codes (N, K) and per-row scales (N,) -> float32 (N, K)."""
    if q.dtype != torch.int8:
        raise ValueError(f"q must be int8 codes, got {q.dtype}")
    if scale.dim() != 1 or q.dim() != 2 or scale.shape[0] != q.shape[0]:
        raise ValueError(f"need q (N, K) and scale (N,), got {tuple(q.shape)} and {tuple(scale.shape)}")
    return q.float() * scale.float()[:, None]


def int8_matmul(a: Tensor, b_t: Tensor) -> Tensor:
    """int8 (N, K) x int8 (K, M) -> int32 (N, M), exactly (int32 accumulation; |sum| <= K 127^2 fits for
    K < 133,000). ``torch._int_mm`` where it runs (this torch's CPU build; CUDA for N > 16 and K, M multiples
    of 8), else an int32 matmul on the CPU or a float64 one elsewhere (CUDA has no integer matmul; float64
    holds every such sum exactly)."""
    if a.dtype != torch.int8 or b_t.dtype != torch.int8:
        raise ValueError(f"int8_matmul needs int8 operands, got {a.dtype} and {b_t.dtype}")
    if a.dim() != 2 or b_t.dim() != 2 or a.shape[1] != b_t.shape[0]:
        raise ValueError(f"need (N, K) and (K, M), got {tuple(a.shape)} and {tuple(b_t.shape)}")
    if hasattr(torch, "_int_mm"):
        try:
            return torch._int_mm(a, b_t)  # (N, K) x (K, M) -> (N, M) int32
        except RuntimeError:  # shape or device the kernel does not take (CUDA wants N > 16, K, M % 8 == 0)
            pass
    if a.device.type == "cpu":
        return a.to(torch.int32) @ b_t.to(torch.int32)
    return _int8_matmul_float64(a, b_t)


def _int8_matmul_float64(a: Tensor, b_t: Tensor) -> Tensor:
    """int8 x int8 -> int32 through a float64 matmul: exact while |sum| < 2^53 (any K below 5e11)."""
    return (a.double() @ b_t.double()).to(torch.int32)  # (N, K) x (K, M) -> (N, M)


class Int8Linear(nn.Module):
    """``nn.Linear`` with int8 weights (per output channel) and dynamically quantized input (per row).

    forward: x (..., K) -> rows (N, K) -> (q_x, s_x) per row -> int32 q_x q_w^T (N, M) -> float
    s_x[:, None] s_w[None, :] * that + bias -> (..., M). Weights are stored as int8 codes plus one float32
    scale per output channel: about a quarter of the float32 bytes.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight_t_int8", torch.zeros(in_features, out_features, dtype=torch.int8))  # (K, M)
        self.register_buffer("weight_scale", torch.ones(out_features))  # (M,)
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)

    @classmethod
    def from_float(cls, linear: nn.Linear) -> "Int8Linear":
        """The int8 version of a float ``nn.Linear`` (its weights quantized per output channel)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"from_float needs an nn.Linear, got {type(linear).__name__}")
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None)
        q, scale = quantize_per_channel(linear.weight)  # (M, K) int8, (M,)
        layer.weight_t_int8 = q.t().contiguous()  # stored (K, M), the layout the int8 kernel takes
        layer.weight_scale = scale
        if linear.bias is not None:
            layer.bias = linear.bias.detach().float().clone()
        return layer

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"Int8Linear expects inputs (..., {self.in_features}), got {tuple(x.shape)}")
        rows = x.reshape(-1, self.in_features)  # (..., K) -> (N, K)
        q_x, s_x = quantize_per_channel(rows)
        acc = int8_matmul(q_x, self.weight_t_int8)  # (N, K) x (K, M) -> (N, M) int32
        y = acc.float() * (s_x[:, None] * self.weight_scale[None, :])
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


def int8_linear_error_bound(x: Tensor, linear: nn.Linear) -> Tensor:
    """Worst-case |Int8Linear(x) - linear(x)| per output element (N, M), computed in float64.

    With x = x' + e_x, w = w' + e_w (x', w' the dequantized values, |e_x| <= s_x / 2, |e_w| <= s_w / 2):
    x . w - x' . w' = sum_k (e_x w' + x' e_w + e_x e_w), so
    |error_nm| <= sum_k (s_x,n / 2 |w'_mk| + |x'_nk| s_w,m / 2 + s_x,n s_w,m / 4).
    The float32 rescaling adds a relative error of a few ulps, below this bound's slack in practice."""
    rows = x.reshape(-1, linear.in_features)
    q_x, s_x = quantize_per_channel(rows)
    q_w, s_w = quantize_per_channel(linear.weight)
    x_hat, w_hat = dequantize(q_x, s_x).double(), dequantize(q_w, s_w).double()  # (N, K), (M, K)
    s_x, s_w = s_x.double(), s_w.double()
    K = linear.in_features
    return (s_x[:, None] / 2 * w_hat.abs().sum(1)[None, :]  # (N, 1) x (1, M)
            + x_hat.abs().sum(1)[:, None] * s_w[None, :] / 2
            + K * s_x[:, None] * s_w[None, :] / 4)


def quantize_model(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every exact ``nn.Linear`` replaced by :class:`Int8Linear` (subclasses,
    such as a tied output layer, stay float); the original is left unchanged."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    quantized = copy.deepcopy(model).eval()
    for module in list(quantized.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, Int8Linear.from_float(child))
    return quantized


def torch_quantize_dynamic(model: nn.Module) -> tuple[nn.Module, tuple[str, ...]]:
    """``torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)`` on a copy (int8
    weights per tensor, activations quantized per batch at run time), and the texts of the warnings it
    raised (torch 2.13: a DeprecationWarning that ``torch.ao.quantization`` "will be removed", pointing
    to torchao). Raises a clear error if a later torch has removed it."""
    try:
        from torch.ao.quantization import quantize_dynamic
    except ImportError as error:  # pragma: no cover - depends on the torch version
        raise ImportError("this torch has no torch.ao.quantization.quantize_dynamic (removed in favour of "
                          "torchao: pip install torchao, then torchao.quantization.quantize_); "
                          "compression.quantize_model still works") from error
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quantized = quantize_dynamic(copy.deepcopy(model).eval(), {nn.Linear}, dtype=torch.qint8)
    texts = tuple(dict.fromkeys(f"{w.category.__name__}: {str(w.message).strip()}" for w in caught))
    return quantized, texts


def state_dict_bytes(model: nn.Module) -> int:
    """Bytes of ``torch.save(model.state_dict())``: what a checkpoint of the weights costs on disk (shared
    tensors once, int8 and packed quantized weights at their real size)."""
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.getbuffer().nbytes


def linear_share(model: nn.Module) -> float:
    """Share of the model's parameters (shared ones once) that sit in exact ``nn.Linear`` weights and
    biases: what int8 dynamic quantization of the linear layers covers."""
    total = sum(p.numel() for p in model.parameters())
    linear = sum(p.numel() for m in model.modules() if type(m) is nn.Linear for p in m.parameters(recurse=False))
    return linear / total


# --------------------------------------------------------------------------- a small task to measure on


@dataclasses.dataclass(frozen=True)
class CharLMData:
    """Character ids of a text, split 90/10 into training and held-out streams (chapter 7's split)."""

    train: Tensor
    """(N_train,) int64 character ids."""
    heldout: Tensor
    """(N_heldout,) int64 character ids, the last 10 % of the text."""
    vocab_size: int
    """Distinct characters plus the four special tokens of ``data.Vocab``."""


def char_lm_data(text: str | None = None) -> CharLMData:
    """Tiny Shakespeare (``data.load_text``) or ``text`` as character ids, split 90/10."""
    text = data.load_text("tinyshakespeare") if text is None else text
    if not isinstance(text, str) or len(text) < 200:
        raise ValueError("text must be a string of at least 200 characters")
    vocab = data.Vocab(sorted(set(text)))
    stream = torch.tensor(vocab.encode(data.all_characters(text)))
    split_at = int(0.9 * len(stream))
    return CharLMData(train=stream[:split_at], heldout=stream[split_at:], vocab_size=len(vocab))


def lm_blocks(stream: Tensor, batch: int, block: int, seed: int) -> Tensor:
    """``batch`` random windows of ``block + 1`` ids (B, block + 1) from ``stream``, a function of ``seed``:
    inputs are ``[:, :-1]``, next-token targets ``[:, 1:]``."""
    bench._check_count("batch", batch, 1)
    bench._check_count("block", block, 1)
    if len(stream) <= block + 1:
        raise ValueError(f"the stream of {len(stream)} ids is too short for blocks of {block}")
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(stream) - block - 1, (batch,), generator=g)
    return torch.stack([stream[s: s + block + 1] for s in starts.tolist()])  # (B, block + 1)


def train_lm(model: nn.Module, stream: Tensor, *, steps: int, batch: int = 32, block: int = 64, lr: float = 3e-3,
             seed: int = 0, loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None) -> nn.Module:
    """AdamW on next-token prediction for ``steps`` steps (batches from :func:`lm_blocks`, seeded by
    ``seed`` and the step), learning rate ``lr`` with a linear decay to 0. ``loss_fn(logits (B, T, V), ids
    (B, T + 1)) -> loss`` replaces plain cross-entropy (distillation uses it). Returns the model, in eval
    mode."""
    bench._check_count("steps", steps, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 - s / steps)
    model.train()
    for step in range(steps):
        ids = lm_blocks(stream, batch, block, seed * 100_003 + step)
        logits = model(ids[:, :-1])  # (B, T) -> (B, T, V)
        loss = (F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()) if loss_fn is None
                else loss_fn(logits, ids))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
    return model.eval()


def unigram_loss(train: Tensor, heldout: Tensor) -> float:
    """Cross-entropy (nats per character) of the training stream's character frequencies on ``heldout``: the loss
    of a model that ignores context. A language model must beat it by a wide margin before its logits carry
    anything (a nearly flat model scores close to it, whatever is done to its weights). Characters absent from
    training get probability 0 and raise ValueError."""
    if train.dim() != 1 or heldout.dim() != 1 or train.dtype != torch.long or heldout.dtype != torch.long:
        raise ValueError("train and heldout must be 1-D int64 id streams (CharLMData.train / .heldout)")
    size = int(max(train.max(), heldout.max())) + 1
    counts = torch.bincount(train, minlength=size).double()  # (V,)
    if (counts[heldout] == 0).any():
        raise ValueError("heldout has characters that never occur in train: their unigram probability is 0")
    return float(-(counts / counts.sum()).log()[heldout].mean())


def heldout_loss(model: nn.Module, stream: Tensor, *, batches: int = 4, batch: int = 32, block: int = 64) -> float:
    """Mean next-token cross-entropy (nats per character) on ``batches`` fixed windows of ``stream`` (the
    same windows for every model, seeds 10^6 + i)."""
    model.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(batches):
            ids = lm_blocks(stream, batch, block, 10**6 + i)
            total += F.cross_entropy(model(ids[:, :-1]).flatten(0, 1).float(), ids[:, 1:].flatten()).item()
    return total / batches


def demo_config(vocab_size: int, *, d_model: int = 128, n_layers: int = 2) -> TransformerConfig:
    """The course's CPU character model (``model_sizes.char_lm_run`` at ``cpu`` sizes: 128 wide, 2 layers,
    4 heads, d_ff 4 x width, GELU, learned positions over 64 characters, no dropout), with width and depth
    adjustable for teachers and students (d_ff stays 4 x d_model)."""
    config = model_sizes.char_lm_run(SizePreset("cpu", "compression demonstration"), vocab_size).config
    return dataclasses.replace(config, d_model=d_model, d_ff=4 * d_model, n_decoder_layers=n_layers, dropout=0.0)


# --------------------------------------------------------------------------- int8 measured


@dataclasses.dataclass(frozen=True)
class QuantizationComparison:
    """fp32 against torch's dynamic int8 and the from-scratch :class:`Int8Linear` model."""

    fp32_bytes: int
    """Saved state dict, float32 model."""
    int8_bytes: int
    """Saved state dict after ``torch_quantize_dynamic``."""
    own_int8_bytes: int
    """Saved state dict after :func:`quantize_model`."""
    fp32_ms: float
    """Median forward time (eval, no_grad), milliseconds."""
    int8_ms: float
    own_int8_ms: float
    fp32_loss: float
    """Held-out loss (nats per character) of the float model."""
    int8_loss: float
    own_int8_loss: float
    quantized_share: float
    """Share of parameters in the linear layers that int8 covers (the rest stays float32)."""
    threads: int
    """CPU threads for every timing."""
    input_shape: tuple[int, int]
    """(B, T) of the timed batch."""
    torch_warnings: tuple[str, ...]
    """What ``quantize_dynamic`` warned (deprecation) in this torch."""
    comparisons: dict[str, bench.Comparison]
    """The three forwards timed in interleaved rounds (:func:`gpuformer_lib.bench.time_interleaved`): "int8"
    (torch's) and "own" (:class:`Int8Linear`) against float32, and "own vs int8" (ours against torch's int8, the
    baseline). A page's words about which is faster come from their ``verdict`` and ``phrase()``."""

    @property
    def size_ratio(self) -> float:
        """fp32 bytes / torch int8 bytes: how many times smaller."""
        return self.fp32_bytes / self.int8_bytes

    @property
    def own_size_ratio(self) -> float:
        return self.fp32_bytes / self.own_int8_bytes

    @property
    def speedup(self) -> float:
        """fp32 time / torch int8 time: above 1 means int8 is faster."""
        return bench.speedup(self.fp32_ms, self.int8_ms)

    @property
    def own_speedup(self) -> float:
        return bench.speedup(self.fp32_ms, self.own_int8_ms)

    @property
    def loss_change(self) -> float:
        """int8 held-out loss - fp32 held-out loss (nats per character; positive = worse)."""
        return self.int8_loss - self.fp32_loss

    @property
    def own_loss_change(self) -> float:
        return self.own_int8_loss - self.fp32_loss


FLOAT32, TORCH_INT8, OWN_INT8 = "float32", "torch's dynamic int8", "our Int8Linear"
"""The names :func:`compare_quantization` times the three forwards under (what a comparison's phrase says)."""


def compare_quantization(model: nn.Module, heldout: Tensor, *, batch: int = 32, block: int = 64, threads: int = 1,
                         warmup: int = 3, repeats: int = 10, loss_batches: int = 4) -> QuantizationComparison:
    """Quantize ``model`` (a trained ``DecoderLM``; left unchanged) both ways and measure size
    (:func:`state_dict_bytes`), latency of a forward pass on one batch (B, T) = (``batch``, ``block``) of
    held-out text (the three timed in interleaved rounds by :func:`gpuformer_lib.bench.time_interleaved`, at
    least ``repeats`` of them after ``warmup``, all on the same ids and ``threads`` threads; medians) and
    held-out loss (:func:`heldout_loss`)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    model.eval()
    torch_int8, texts = torch_quantize_dynamic(model)
    own_int8 = quantize_model(model)
    ids = lm_blocks(heldout, batch, block, seed=2 * 10**6)[:, :-1]  # (B, T)
    with torch.no_grad(), bench.torch_threads(threads):
        timings = bench.time_interleaved({name: (lambda m=m: m(ids)) for name, m in
                                          ((FLOAT32, model), (TORCH_INT8, torch_int8), (OWN_INT8, own_int8))},
                                         warmup=warmup, repeats=repeats)
    times = {name: timings[label].median * 1e3 for name, label in
             (("fp32", FLOAT32), ("int8", TORCH_INT8), ("own", OWN_INT8))}
    comparisons = {"int8": bench.Comparison(FLOAT32, TORCH_INT8, timings),
                   "own": bench.Comparison(FLOAT32, OWN_INT8, timings),
                   "own vs int8": bench.Comparison(TORCH_INT8, OWN_INT8, timings)}
    losses = {name: heldout_loss(m, heldout, batches=loss_batches, batch=batch, block=block)
              for name, m in (("fp32", model), ("int8", torch_int8), ("own", own_int8))}
    return QuantizationComparison(
        fp32_bytes=state_dict_bytes(model), int8_bytes=state_dict_bytes(torch_int8),
        own_int8_bytes=state_dict_bytes(own_int8), fp32_ms=times["fp32"], int8_ms=times["int8"],
        own_int8_ms=times["own"], fp32_loss=losses["fp32"], int8_loss=losses["int8"], own_int8_loss=losses["own"],
        quantized_share=linear_share(model), threads=threads, input_shape=(batch, block), torch_warnings=texts,
        comparisons=comparisons)


# --------------------------------------------------------------------------- distillation


def distillation_loss(student_logits: Tensor, teacher_logits: Tensor, targets: Tensor, temperature: float = 2.0,
                      alpha: float = 0.5, ignore_index: int = -100) -> Tensor:
    """Hinton et al. (2015): alpha T^2 KL(p_t || p_s) + (1 - alpha) CE(student, targets), averaged over the
    positions whose target is not ``ignore_index``; p = softmax(logits / T). The T^2 keeps the soft term's
    gradients the same size as T changes (their §2). The teacher is not differentiated (detached).

    Shapes: logits (..., V) both, targets (...) integer ids. alpha = 0 is plain cross-entropy."""
    if not isinstance(temperature, numbers.Real) or isinstance(temperature, bool) or not 0 < temperature < math.inf:
        raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")
    if not isinstance(alpha, numbers.Real) or isinstance(alpha, bool) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1] (the weight of the soft-target term), got {alpha!r}")
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student and teacher logits must have one shape (..., V), got "
                         f"{tuple(student_logits.shape)} and {tuple(teacher_logits.shape)}")
    if not (student_logits.is_floating_point() and teacher_logits.is_floating_point()):
        raise ValueError(f"logits must be floating point, got {student_logits.dtype} and {teacher_logits.dtype}")
    if targets.shape != student_logits.shape[:-1]:
        raise ValueError(f"targets must have the logits' shape without V, {tuple(student_logits.shape[:-1])}, "
                         f"got {tuple(targets.shape)}")
    if targets.is_floating_point() or targets.dtype == torch.bool:
        raise ValueError(f"targets must be integer class ids, got {targets.dtype}")
    V = student_logits.shape[-1]
    dtype = torch.promote_types(student_logits.dtype, torch.float32)  # fp16/bf16 logits: softmax in float32
    s = student_logits.reshape(-1, V).to(dtype)  # (..., V) -> (N, V)
    t = teacher_logits.detach().reshape(-1, V).to(dtype)
    y = targets.reshape(-1)
    keep = y != ignore_index  # (N,)
    if not keep.any():
        raise ValueError(f"every target is ignore_index={ignore_index}: no position to learn from")
    s, t, y = s[keep], t[keep], y[keep]
    log_p_s = F.log_softmax(s / temperature, dim=-1)
    log_p_t = F.log_softmax(t / temperature, dim=-1)
    kl = (log_p_t.exp() * (log_p_t - log_p_s)).sum(-1).mean()  # KL(p_t || p_s) per position, averaged
    ce = F.cross_entropy(s, y)
    return alpha * temperature ** 2 * kl + (1 - alpha) * ce


@dataclasses.dataclass(frozen=True)
class DistillationResult:
    """Held-out losses of students trained with and without the teacher: nats per character for the
    language model (:func:`distill`), per real target token (Chinese characters and <eos>) for the
    translator (:func:`distill_translator`)."""

    seeds: tuple[int, ...]
    distilled_losses: tuple[float, ...]
    """Per seed: the student trained on :func:`distillation_loss`."""
    hard_label_losses: tuple[float, ...]
    """Per seed: the same student (same initialisation, batches and steps) on hard labels only."""
    teacher_loss: float
    teacher_parameters: int
    student_parameters: int
    temperature: float
    alpha: float
    steps: int
    """Training steps of each student."""
    seconds: float | None = None
    """Wall time of all the student runs (both arms, every seed), seconds."""
    teacher_steps: int | None = None
    """Training steps of the teacher, where the same call trained it (:func:`translator_distillation`)."""
    teacher_seconds: float | None = None
    """Wall time of the teacher's training, where the same call trained it."""
    other_temperatures: tuple[tuple[float, tuple[float, ...]], ...] = ()
    """(T, distilled loss per seed) for further temperatures, each against the same hard-label controls
    (:attr:`TranslatorDistillationPlan.other_temperatures`)."""

    def helped_every_seed_at(self, temperature: float) -> bool:
        """Whether the students distilled at ``temperature`` beat their controls on every seed."""
        if temperature == self.temperature:
            return self.helped_every_seed
        for t, losses in self.other_temperatures:
            if t == temperature:
                return all(d < h for d, h in zip(losses, self.hard_label_losses))
        raise ValueError(f"no run at T = {temperature}: ran {self.temperature} and "
                         f"{[t for t, _ in self.other_temperatures]}")

    @property
    def mean_distilled(self) -> float:
        return sum(self.distilled_losses) / len(self.distilled_losses)

    @property
    def mean_hard_label(self) -> float:
        return sum(self.hard_label_losses) / len(self.hard_label_losses)

    @property
    def differences(self) -> tuple[float, ...]:
        """Per seed: hard-label loss - distilled loss (positive = distillation helped)."""
        return tuple(h - d for h, d in zip(self.hard_label_losses, self.distilled_losses))

    @property
    def helped_every_seed(self) -> bool:
        return all(d > 0 for d in self.differences)

    @property
    def hurt_every_seed(self) -> bool:
        return all(d < 0 for d in self.differences)


def distillation_words(differences: Sequence[float], threshold: float = 0.02) -> str:
    """Words for distilled students against their hard-label controls, one difference per seed
    (control loss - distilled loss, nats; positive = distillation helped), with one ``threshold`` for every
    temperature: all above it -> lower on every seed; all below -threshold -> higher on every seed; all within
    it -> no clear effect; otherwise the seeds disagree, which is no effect beyond seed-to-seed noise."""
    diffs = [float(d) for d in differences]
    if not diffs or not all(math.isfinite(d) for d in diffs):
        raise ValueError(f"differences must be one finite number per seed, got {differences!r}")
    if not (isinstance(threshold, numbers.Real) and 0 <= threshold < math.inf):
        raise ValueError(f"threshold must be a finite number >= 0 (nats), got {threshold!r}")
    if all(d > threshold for d in diffs):
        return "lower than the control on every seed"
    if all(d < -threshold for d in diffs):
        return "higher than the control on every seed"
    if all(abs(d) <= threshold for d in diffs):
        return f"within {threshold:g} nats of the control on every seed: no clear effect"
    return "lower on some seeds and higher on others: no effect beyond seed-to-seed noise"


def _paired_runs(seeds: Sequence[int], run: Callable[[int, object], float], soft_loss: object
                 ) -> tuple[list[float], list[float], float]:
    """The experiment both distillations share: per seed, ``run(seed, soft_loss)`` (the distilled student)
    and ``run(seed, None)`` (the hard-label control), each after ``torch.manual_seed(seed)``, so both arms
    start from the same weights and draw the same dropout masks and batches. Returns the held-out losses
    of each arm per seed and the wall time of all the runs (seconds)."""
    distilled, hard = [], []
    start = time.perf_counter()
    for seed in seeds:
        for losses, loss_fn in ((distilled, soft_loss), (hard, None)):
            torch.manual_seed(seed)
            losses.append(run(seed, loss_fn))
    return distilled, hard, time.perf_counter() - start


def distill(teacher: nn.Module, student_config: TransformerConfig, data: CharLMData, steps: int, *,
            temperature: float = 2.0, alpha: float = 0.5, seeds: Sequence[int] = (0, 1), batch: int = 32,
            block: int = 64, lr: float = 3e-3, loss_batches: int = 4) -> DistillationResult:
    """Train a ``DecoderLM(student_config)`` from ``teacher`` (a trained LM on the same characters) with
    :func:`distillation_loss`, and, as the control, the same student (same seed, so the same initial
    weights and batches) for the same ``steps`` with alpha = 0 (hard labels only); both held-out losses
    per seed.

    Sizes for chapter 16: teacher :func:`demo_config` (128 wide, 2 layers, 414k parameters) or 64 wide,
    student ``demo_config(vocab, d_model=32, n_layers=1)`` (17k), 150 steps of 32 x 64 characters. On the
    shared 2-core CPU that wrote this, two seeds took 14-19 s (each distilled step also runs the teacher).
    Whether distillation helps depends on how good the teacher is: the returned per-seed
    :attr:`~DistillationResult.differences` say it, not this docstring."""
    if not isinstance(student_config, TransformerConfig):
        raise TypeError(f"student_config must be a TransformerConfig, got {type(student_config).__name__}")
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    distillation_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, dtype=torch.long), temperature, alpha)
    teacher.eval()

    def soft_loss(logits: Tensor, ids: Tensor) -> Tensor:
        with torch.no_grad():
            teacher_logits = teacher(ids[:, :-1])  # (B, T, V)
        return distillation_loss(logits, teacher_logits, ids[:, 1:], temperature, alpha)

    def run(seed: int, loss_fn: Callable[[Tensor, Tensor], Tensor] | None) -> float:
        student = train_lm(DecoderLM(student_config), data.train, steps=steps, batch=batch, block=block,
                           lr=lr, seed=seed, loss_fn=loss_fn)
        return heldout_loss(student, data.heldout, batches=loss_batches, batch=batch, block=block)

    distilled, hard, seconds = _paired_runs(seeds, run, soft_loss)
    return DistillationResult(
        seeds=tuple(seeds), distilled_losses=tuple(distilled), hard_label_losses=tuple(hard),
        teacher_loss=heldout_loss(teacher, data.heldout, batches=loss_batches, batch=batch, block=block),
        teacher_parameters=sum(p.numel() for p in teacher.parameters()),
        student_parameters=sum(p.numel() for p in DecoderLM(student_config).parameters()),
        temperature=float(temperature), alpha=float(alpha), steps=steps, seconds=seconds)


# --------------------------------------------------------------------------- distillation of a translator


def hard_label_translation_loss(student: nn.Module, batch: "data.TranslationBatch") -> Tensor:
    """Plain cross-entropy of ``student`` (an encoder-decoder ``model.Transformer``) over the batch's real
    target tokens (padding, ``data.Vocab.PAD``, left out), computed the way :func:`distillation_loss`
    computes its hard term, so that alpha = 0 there is this loss to the last bit. The control of
    :func:`distill_translator` (no label smoothing: that is itself a soft target)."""
    logits = student(batch.src, batch.tgt_in, batch.src_padding_mask, batch.tgt_padding_mask)  # (B, T, V)
    dtype = torch.promote_types(logits.dtype, torch.float32)
    s = logits.reshape(-1, logits.shape[-1]).to(dtype)  # (B, T, V) -> (B T, V)
    y = batch.tgt_out.reshape(-1)  # (B T,)
    keep = y != data.Vocab.PAD
    return F.cross_entropy(s[keep], y[keep])


def translation_distillation_loss(student: nn.Module, teacher: nn.Module, batch: "data.TranslationBatch",
                                  temperature: float = 2.0, alpha: float = 0.5) -> Tensor:
    """:func:`distillation_loss` of ``student`` against ``teacher`` (both encoder-decoder translators on the
    same vocabularies) on one batch: the teacher runs without gradients on the same source and target
    prefix, and only real target tokens count (``ignore_index = data.Vocab.PAD``)."""
    with torch.no_grad():
        teacher_logits = teacher(batch.src, batch.tgt_in, batch.src_padding_mask, batch.tgt_padding_mask)
    logits = student(batch.src, batch.tgt_in, batch.src_padding_mask, batch.tgt_padding_mask)  # (B, T, V)
    if logits.shape != teacher_logits.shape:
        raise ValueError(f"student and teacher must share the target vocabulary: logits {tuple(logits.shape)} "
                         f"and {tuple(teacher_logits.shape)}")
    return distillation_loss(logits, teacher_logits, batch.tgt_out, temperature, alpha, ignore_index=data.Vocab.PAD)


def translator_batches(prepared: "translation_task.TranslationData", batch_size: int, seed: int,
                       device: torch.device | str = "cpu") -> Iterator["data.TranslationBatch"]:
    """Random batches of ``batch_size`` training pairs, epoch after epoch (chapter 13's ``"random"``
    batching, ``translation_task.samplers``), a function of ``seed`` only: every arm of a comparison
    with the same seed sees the same batches."""
    from gpuformer_lib import translation_task

    bench._check_count("batch_size", batch_size, 1)
    epoch = 0
    while True:
        sampler = translation_task.samplers(prepared.lengths, batch_size, seed, epoch)["random"]
        for indices in sampler:
            yield data.collate_translation([prepared.train_set[i] for i in indices]).to(device)
        epoch += 1


def train_translator(model: nn.Module, prepared: "translation_task.TranslationData", *, steps: int,
                     batch_size: int = 64, lr: float = 2e-3, seed: int = 0,
                     loss_fn: Callable[[nn.Module, "data.TranslationBatch"], Tensor] | None = None,
                     device: torch.device | str = "cpu") -> nn.Module:
    """AdamW (weight decay 0.01, gradients clipped at norm 1) for ``steps`` steps on
    :func:`translator_batches`, the learning rate as chapter 13's harness schedules it (linear warm-up over
    the first 10 % of the steps, then cosine decay to 10 % of ``lr``). ``loss_fn(model, batch) -> loss``
    replaces :func:`hard_label_translation_loss` (distillation uses it). Returns the model, in eval mode."""
    bench._check_count("steps", steps, 1)
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warmup = max(1, round(0.1 * steps))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        rest = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(rest, 1.0)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    loss_fn = hard_label_translation_loss if loss_fn is None else loss_fn
    model.train()
    batches = translator_batches(prepared, batch_size, seed, device)
    for _ in range(steps):
        loss = loss_fn(model, next(batches))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    return model.eval()


def distill_translator(teacher: nn.Module, student_config: TransformerConfig,
                       prepared: "translation_task.TranslationData", steps: int, *, temperature: float = 2.0,
                       alpha: float = 0.5, seeds: Sequence[int] = (0, 1), batch_size: int = 64, lr: float = 2e-3,
                       val_pairs: int | None = 300, device: torch.device | str = "cpu") -> DistillationResult:
    """:func:`distill` for the encoder-decoder translator: a ``model.Transformer(student_config)`` trained
    from ``teacher`` (a trained translator on ``prepared``'s vocabularies) with
    :func:`translation_distillation_loss`, and the control: the same student (same seed, so the same
    initial weights, dropout masks and batches) for the same ``steps`` on hard labels only
    (:func:`hard_label_translation_loss`). Both are scored by ``translation_task.validation_loss`` (nats per
    real target token) on the first ``val_pairs`` validation pairs (all with None); so is the teacher.
    The teacher is left unchanged (eval mode, no gradients)."""
    from gpuformer_lib import translation_task

    if not isinstance(student_config, TransformerConfig):
        raise TypeError(f"student_config must be a TransformerConfig, got {type(student_config).__name__}")
    if (student_config.vocab_size, student_config.source_vocab_size) != (len(prepared.tgt_vocab),
                                                                        len(prepared.src_vocab)):
        raise ValueError(f"student_config's vocabularies ({student_config.source_vocab_size} source, "
                         f"{student_config.vocab_size} target) must be prepared's ({len(prepared.src_vocab)}, "
                         f"{len(prepared.tgt_vocab)})")
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    distillation_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, dtype=torch.long), temperature, alpha)
    teacher.eval()
    val = translation_task.batches_of(prepared.val_set[:val_pairs] if val_pairs else prepared.val_set)

    def soft_loss(student: nn.Module, batch: data.TranslationBatch) -> Tensor:
        return translation_distillation_loss(student, teacher, batch, temperature, alpha)

    def run(seed: int, loss_fn) -> float:
        student = train_translator(Transformer(student_config), prepared, steps=steps, batch_size=batch_size, lr=lr,
                                   seed=seed, loss_fn=loss_fn, device=device)
        return translation_task.validation_loss(student, val, device)

    distilled, hard, seconds = _paired_runs(seeds, run, soft_loss)
    return DistillationResult(
        seeds=tuple(seeds), distilled_losses=tuple(distilled), hard_label_losses=tuple(hard),
        teacher_loss=translation_task.validation_loss(teacher, val, device),
        teacher_parameters=sum(p.numel() for p in teacher.parameters()),
        student_parameters=sum(p.numel() for p in Transformer(student_config).parameters()),
        temperature=float(temperature), alpha=float(alpha), steps=steps, seconds=seconds)


@dataclasses.dataclass(frozen=True)
class TranslatorDistillationPlan:
    """Sizes of chapter 16's translator distillation (:func:`translator_distillation_plan`)."""

    teacher_config: TransformerConfig
    """Chapter 13's CPU translator (``model_sizes.translation_run`` at ``cpu`` sizes)."""
    student_config: TransformerConfig
    """Half as wide, one encoder and one decoder layer, the same vocabularies."""
    teacher_steps: int
    student_steps: int
    """Steps of each student, distilled and hard-label alike."""
    batch_size: int
    """Pairs per step, teacher and students."""
    lr: float
    temperature: float
    alpha: float
    seeds: tuple[int, ...]
    """Student seeds; each gives one distilled and one hard-label run."""
    val_pairs: int
    """Validation pairs the losses are measured on (chapter 13's CPU plan's 300)."""
    teacher_seed: int = 1000
    """Seed of the teacher's initial weights and batches, apart from the students' seeds."""
    other_temperatures: tuple[float, ...] = ()
    """Further temperatures: one more distilled student per seed at each, compared with the same controls."""


def translator_distillation_plan(prepared: "translation_task.TranslationData", *, quick: bool = False
                                 ) -> TranslatorDistillationPlan:
    """A toy-scale distillation of chapter 13's translator that runs in about 15 s on one CPU thread.

    Teacher: chapter 13's CPU model (128 wide, 2 + 2 layers, 1.83 M parameters with the Tatoeba
    vocabularies), 80 steps of 32 pairs; student: 64 wide, 1 + 1 layers (0.67 M), 40 steps of 32 pairs,
    T = 1, alpha = 0.5, seeds 0 and 1. When this was set (shared 2-core CPU, OMP_NUM_THREADS=1) the teacher
    took 7.7 s and reached 4.42 nats of validation loss, a nat below the hard-label students' 5.47-5.54; the
    four student runs took another 7.7 s (the whole call 15 s with the machine at load 1, 19-33 s while
    others ran). At T = 1 the distilled students were 0.10-0.12 nats better than their controls on seeds
    0-3; at T = 2 the difference was within 0.02 nats either way; a teacher trained for 120 steps (4.04
    nats) helped no more than this one. See :func:`translator_distillation`'s result for the numbers of the
    run at hand, not this docstring.

    The full plan also distills at T = 2 (``other_temperatures``), so that the page shows both.

    ``quick``: a few steps and one seed, for rehearsals that only check the code paths."""
    from gpuformer_lib.model_sizes import translation_run

    run = translation_run(SizePreset("cpu", "translator distillation"), len(prepared.src_vocab),
                          len(prepared.tgt_vocab), prepared.max_len)
    teacher = run.config
    student = dataclasses.replace(teacher, d_model=teacher.d_model // 2, d_ff=teacher.d_ff // 2,
                                  n_encoder_layers=1, n_decoder_layers=1)
    if quick:
        return TranslatorDistillationPlan(teacher, student, teacher_steps=4, student_steps=2, batch_size=16,
                                          lr=run.lr, temperature=1.0, alpha=0.5, seeds=(0,), val_pairs=64,
                                          other_temperatures=(2.0,))
    return TranslatorDistillationPlan(teacher, student, teacher_steps=80, student_steps=40, batch_size=32, lr=run.lr,
                                      temperature=1.0, alpha=0.5, seeds=(0, 1), val_pairs=300,
                                      other_temperatures=(2.0,))


def translator_distillation(prepared: "translation_task.TranslationData",
                            plan: TranslatorDistillationPlan | None = None, *,
                            device: torch.device | str = "cpu") -> DistillationResult:
    """The whole demonstration in one call: train the teacher of ``plan`` (default
    :func:`translator_distillation_plan`) on hard labels, then :func:`distill_translator` its student
    against the hard-label control, per seed. The result carries the teacher's steps and training time."""
    plan = translator_distillation_plan(prepared) if plan is None else plan
    if not isinstance(plan, TranslatorDistillationPlan):
        raise TypeError(f"plan must be a TranslatorDistillationPlan, got {type(plan).__name__}")
    torch.manual_seed(plan.teacher_seed)
    start = time.perf_counter()
    teacher = train_translator(Transformer(plan.teacher_config), prepared, steps=plan.teacher_steps,
                               batch_size=plan.batch_size, lr=plan.lr, seed=plan.teacher_seed, device=device)
    teacher_seconds = time.perf_counter() - start
    result = distill_translator(teacher, plan.student_config, prepared, plan.student_steps,
                                temperature=plan.temperature, alpha=plan.alpha, seeds=plan.seeds,
                                batch_size=plan.batch_size, lr=plan.lr, val_pairs=plan.val_pairs, device=device)
    from gpuformer_lib import translation_task

    val = translation_task.batches_of(prepared.val_set[:plan.val_pairs] if plan.val_pairs else prepared.val_set)
    others = []
    for temperature in plan.other_temperatures:
        distillation_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, dtype=torch.long), temperature,
                          plan.alpha)
        losses = []
        for seed in plan.seeds:  # as _paired_runs' distilled arm: same seed, so the same weights and batches
            torch.manual_seed(seed)
            student = train_translator(
                Transformer(plan.student_config), prepared, steps=plan.student_steps, batch_size=plan.batch_size,
                lr=plan.lr, seed=seed, device=device,
                loss_fn=lambda s, b, t=temperature: translation_distillation_loss(s, teacher, b, t, plan.alpha))
            losses.append(translation_task.validation_loss(student, val, device))
        others.append((float(temperature), tuple(losses)))
    return dataclasses.replace(result, teacher_steps=plan.teacher_steps, teacher_seconds=teacher_seconds,
                               other_temperatures=tuple(others))
