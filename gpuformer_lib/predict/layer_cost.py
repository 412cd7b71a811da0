"""The cost of a Transformer step: matrix-product FLOPs at the rate products achieve plus element-wise bytes
at the bandwidth a copy achieves, against the host's launches (the course's predictor), and the measurements
a page sets beside that prediction.

A layer's work falls into two kinds (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", §2.1
count the first; Korthikanti et al. 2022 and the Ultra-Scale Playbook discuss the second):

- **matrix products** (the Q, K, V and output projections, the feed-forward block, the scores and the
  weighted sum): per token and layer, forward, 8 C^2 + 4 C d_ff + 4 T C FLOPs, i.e. 24 C^2 + 4 T C when
  d_ff = 4 C (``model.transformer_flops``); training is 3x the forward, about 6 N per token for a model
  of N parameters plus the attention term. They are compute-bound: their time is FLOPs / the achievable tensor-core rate.
- **element-wise and row-wise kernels** (LayerNorm, the residual adds, the activation, softmax inside
  fused attention's reads of q, k, v): few FLOPs per byte, so memory-bound: their time is bytes / bandwidth.

:func:`step_time_prediction` asks the course's predictor (``gpuformer_lib.predict``) for a decoder-only
``DecoderLM``'s forward, loss and backward: the two kinds at the rates they achieve, against the host's
launches (:func:`count_step_operators`, the course's one kernel count), the optimizer step left out.

Leaves out: the encoder-decoder's cross-attention bytes, dropout masks, the optimizer's memory traffic,
communication; measuring FLOPs (``torch.utils.flop_counter``; ``model.transformer_flops`` counts them).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from gpuformer_lib import bench, gpu_view
from gpuformer_lib.model import DecoderLM, TransformerConfig


def elementwise_elements_per_token(config: TransformerConfig) -> int:
    """Elements read plus written by the memory-bound kernels of one forward pass, per token, whole model.

    Per layer: two LayerNorms (read C, write C: 4C), two residual adds (read 2C, write C: 6C), the
    activation (read and write d_ff: 2 d_ff), fused attention's reads of q, k, v and write of its output
    (4C); then the final LayerNorm (2C) and the softmax of the logits in the loss (read and write V: 2V).
    """
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
    C, d_ff, V = config.d_model, config.d_ff, config.vocab_size
    per_layer = 4 * C + 6 * C + 2 * d_ff + 4 * C
    return config.n_decoder_layers * per_layer + 2 * C + 2 * V


@dataclasses.dataclass(frozen=True)
class StepPrediction:
    """Predicted time of one training step (forward, loss, backward; no optimizer) of a decoder-only model on
    one GPU, eager, by the course's predictor (``gpuformer_lib.predict``), split by stream."""

    gpu: str
    matmul_flops: int
    elementwise_bytes: int
    """Bytes of every kernel other than the matrix products (norms, adds, activation, softmax, loss, casts)."""
    matmul_seconds: float
    """Matrix products at the achievable rate (``predict.achievable_rate``)."""
    elementwise_seconds: float
    """Those bytes at the achievable bandwidth (``predict.achievable_bandwidth``)."""
    kernels: int = 0
    """Kernels the step launches (``predict.count_kernels``)."""
    host_seconds: float = 0.0
    """The host's launches: kernels x the launch cost measured inside a real step."""

    @property
    def seconds(self) -> float:
        """The step: the GPU's work or the host's launches, whichever is longer (they overlap)."""
        return max(self.matmul_seconds + self.elementwise_seconds, self.host_seconds)

    @property
    def elementwise_fraction(self) -> float:
        """The share of the GPU's predicted work spent in memory-bound kernels (0 to 1)."""
        return bench.check_fraction("element-wise share of the step",
                                    self.elementwise_seconds / (self.matmul_seconds + self.elementwise_seconds))


def step_time_prediction(config: TransformerConfig, batch_size: int, seq_len: int, dtype: torch.dtype, gpu: str,
                         training: bool = True) -> StepPrediction:
    """Forward, loss and backward of a ``DecoderLM`` of ``config`` (fused attention, as configured) on
    ``batch_size`` x ``seq_len`` tokens, eager, with 16-bit ``dtype`` under autocast, on ``gpu`` (a datasheet
    name): the course's predictor (``predict.training_work`` without an optimizer, ``predict.predict_step``)."""
    from gpuformer_lib import predict

    if not training:
        raise ValueError("step_time_prediction predicts a training step; decode_work predicts inference")
    work = predict.training_work(dataclasses.replace(config, check_token_ids=False), tokens=batch_size * seq_len,
                                 seq_len=seq_len, fmt=predict.format_of(dtype), optimizer=None)
    step = predict.predict_step(work, gpu_view.datasheet(gpu).name)
    return StepPrediction(gpu_view.datasheet(gpu).name, int(work.matrix_flops), int(work.other_bytes),
                          step.matrix_s, step.memory_s, work.kernels, step.host_s)


def _training_step(config: TransformerConfig, batch_size: int, seq_len: int, device: torch.device | str,
                   dtype: torch.dtype):
    """A closure running forward, loss and backward of a fresh ``DecoderLM`` (no optimizer step)."""
    torch.manual_seed(0)
    model = DecoderLM(config).to(device)
    ids = torch.randint(0, config.vocab_size, (batch_size, seq_len), device=device)
    device_type = torch.device(device).type
    autocast = dtype != torch.float32

    def step():
        with torch.autocast(device_type, dtype=dtype, enabled=autocast):
            logits = model(ids[:, :-1])  # (B, T-1, V)
            loss = F.cross_entropy(logits.reshape(-1, config.vocab_size).float(), ids[:, 1:].reshape(-1))
        loss.backward()
        model.zero_grad(set_to_none=True)

    return step


def measure_training_step(config: TransformerConfig, batch_size: int, seq_len: int, device: torch.device | str,
                          dtype: torch.dtype = torch.float32, *, repeats: int = 5, max_seconds: float = 5.0) -> bench.Timing:
    """Time forward, loss and backward of a ``DecoderLM`` (no optimizer step) on ``device``; ``dtype`` other
    than float32 runs under autocast (the weights stay float32, as in mixed-precision training)."""
    step = _training_step(config, batch_size, seq_len, device, dtype)
    return bench.time_fn(step, device=device, warmup=2, repeats=repeats, max_seconds=max_seconds)


def measure_time_split(config: TransformerConfig, batch_size: int, seq_len: int, device: torch.device | str,
                       dtype: torch.dtype = torch.float32, *, active: int = 2) -> dict[str, float]:
    """The same step under ``torch.profiler``: the fraction of operator time per category of
    ``bench.operator_category`` ('matrix products', 'attention', 'element-wise, norms, copies', ...),
    summing to 1. On a GPU the kernels' device time; on a CPU the operators' own CPU time."""
    step = _training_step(config, batch_size, seq_len, device, dtype)
    prof = bench.profile_steps(step, wait=1, warmup=1, active=active, device=device)
    micros = bench.time_by_category(prof.key_averages(), device)
    total = sum(micros.values())
    if total <= 0:
        raise RuntimeError("the profiler recorded no operator time for the step")
    return {category: bench.check_fraction(f"share of {category}", t / total) for category, t in micros.items()}


def compare_vocab_projection(rows: int, d_model: int, vocab_sizes: tuple[int, ...], device: torch.device | str,
                             dtype: torch.dtype = torch.float32, *, repeats: int = 7,
                             max_seconds: float | None = None) -> dict[int, bench.Comparison]:
    """Time the output projection (rows, C) x (C, V) for each vocabulary size: does padding V to a
    multiple of 64 (e.g. 50257 -> 50304) make the larger product faster on this device?

    Through ``bench.compare``: the sizes are timed in **interleaved** rounds (each size once a round, the order
    reversed every other round), so a machine that slows down or speeds up during the measurement affects
    every size alike; each later size is judged against the first, by the rounds' speedups (its
    ``Comparison.verdict``, ``phrase()``). Returns the comparisons by vocabulary size."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 5:
        raise ValueError(f"repeats must be an int >= 5 (interleaved rounds), got {repeats!r}")
    if len(set(vocab_sizes)) < 2:
        raise ValueError(f"compare at least two vocabulary sizes, got {vocab_sizes!r}")
    calls = {}
    for V in vocab_sizes:
        x = torch.randn(rows, d_model, device=device, dtype=dtype)
        w = torch.randn(V, d_model, device=device, dtype=dtype)
        calls[f"V = {V}"] = (lambda x=x, w=w: x @ w.T)  # (rows, C) x (C, V)
    result = bench.compare(calls, device=device, warmup=2, repeats=repeats, max_repeats=max(21, repeats),
                           max_seconds=max_seconds)
    return {V: result[f"V = {V}"] for V in vocab_sizes[1:]}


def count_step_operators(config: TransformerConfig, batch_size: int, seq_len: int) -> int:
    """The kernels one training step (forward, loss, backward; no optimizer) of a ``DecoderLM`` launches on a
    GPU, in float32: the course's one kernel count (``predict.count_kernels``; views, detaches and host reads
    launch none). ``batch_size`` and ``seq_len`` do not change it (checked for positive ints)."""
    from gpuformer_lib import predict

    for name, value in (("batch_size", batch_size), ("seq_len", seq_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return predict.count_kernels(config, optimizer=None).total
