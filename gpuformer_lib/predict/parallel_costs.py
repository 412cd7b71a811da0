"""Cost models of model parallelism: bytes moved and bytes held, for the choice of TP, PP and DP.

Scope (chapter 12's GPU view and sizing example), each a formula with the paper it comes from:

- tensor parallel (Megatron; Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion Parameter Language
  Models Using Model Parallelism", section 3): each Transformer layer all-reduces its (B, T, C) activations
  twice forward (after attention's row-parallel output projection and after the MLP's) and twice backward
  (Megatron's f before each column-parallel block): :func:`tp_allreduce_bytes_per_layer`;
- its time on a link, with chapter 11's all-reduce model (:mod:`gpuformer_lib.predict.collective_costs`) and the
  registry's NCCL figures (:func:`tp_links`): :func:`tp_layer_comm_seconds`, beside the layer's compute
  (:func:`layer_train_flops`);
- ZeRO's communication per step (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
  Trillion Parameter Models", section 7): DDP, ZeRO-1 and ZeRO-2 move 2 Psi (reduce-scatter + all-gather
  of the gradients or of the updated weights), ZeRO-3 3 Psi (the weights all-gathered for the forward
  and again for the backward, and the gradients reduce-scattered): :func:`zero_communication_elements`;
- ZeRO-3 / FSDP2 memory per rank including what the states calculator leaves out: the layer being
  all-gathered and the prefetched next one (unsharded, in the compute dtype), and the unsharded gradient
  of the layer being reduce-scattered: :func:`zero3_rank_bytes`;
- a sizing rule (the Ultra-Scale Playbook's order: data parallel while the model fits, then tensor
  parallel inside a node, then pipeline stages across nodes): :func:`plan_parallelism`.

Left out: overlap of communication with compute, NCCL's tree and NVLS algorithms, sequence/context
parallelism (their own module), expert parallelism, and the pipeline bubble's effect on throughput.
Activations come from chapter 9's calculator (:func:`gpuformer_lib.memory.layer_activation_bytes`).
"""

from __future__ import annotations

import dataclasses
import math

from gpuformer_lib.predict.collective_costs import Link, hierarchical_allreduce_time
from gpuformer_lib.memory import layer_activation_bytes
from gpuformer_lib.published import figure


PCIE3_X16_BYTES_PER_S = 8e9 * 16 * (128 / 130) / 8
"""PCIe 3.0 x16, the T4's only link to another GPU: 8 GT/s per lane x 16 lanes, 128b/130b encoding =
15.75 GB/s each way (the signalling rate of the standard: an upper bound on what NCCL reaches)."""


def tp_links() -> dict[str, Link]:
    """The links of the GPU view's tensor-parallel predictions, as chapter 11's all-reduce model takes them
    (per-step latency, bus bandwidth), from the published registry: NVLink 4 inside an H100 node (NCCL's
    effective ring rate), one 400 Gb/s InfiniBand NIC per GPU between nodes, and PCIe between two T4s."""
    def value(key: str) -> float:
        return figure(key).value

    return {
        "H100 SXM, NVLink 4": Link("NVLink 4", value("nccl-nvlink-ring-step-latency") * 1e-6,
                                   value("nccl-h100-nvlink-effective-ring") * 1e9,
                                   "nccl-nvlink-ring-step-latency, nccl-h100-nvlink-effective-ring"),
        "H100 SXM, InfiniBand NDR": Link("InfiniBand NDR 400 Gb/s", value("nccl-net-ring-step-latency") * 1e-6,
                                         value("nccl-ndr400-nic-busbw") * 1e9,
                                         "nccl-net-ring-step-latency, nccl-ndr400-nic-busbw"),
        "T4, PCIe 3.0 x16": Link("PCIe 3.0 x16", value("nccl-pcie-ring-step-latency") * 1e-6, PCIE3_X16_BYTES_PER_S,
                                 "nccl-pcie-ring-step-latency; PCIe 3.0 x16 signalling rate"),
    }


def tp_allreduce_bytes_per_layer(batch: int, seq_len: int, d_model: int, bytes_per_value: int = 2) -> dict[str, int]:
    """Bytes each Megatron tensor-parallel Transformer layer all-reduces: 2 all-reduces of a (B, T, C)
    tensor forward (g after attention, g after the MLP) and 2 backward (f before each), whatever the
    number of ranks (the message is the whole activation; each rank sends about 2 (N - 1) / N of it)."""
    for name, v in (("batch", batch), ("seq_len", seq_len), ("d_model", d_model), ("bytes_per_value", bytes_per_value)):
        if int(v) != v or v < 1:
            raise ValueError(f"{name}={v} must be a positive integer")
    one = batch * seq_len * d_model * bytes_per_value
    return {"forward": 2 * one, "backward": 2 * one, "messages": 4, "message_bytes": one}


def tp_layer_comm_seconds(batch: int, seq_len: int, d_model: int, tp: int, link: Link, bytes_per_value: int = 2) -> float:
    """Predicted time one Transformer layer spends in tensor-parallel all-reduces (forward + backward),
    none of it overlapped with compute: each of the four calls pays NCCL's base latency per call (the Simple
    protocol a message of megabytes runs in) and the ring's steps and bandwidth on ``link``
    (:func:`collective_costs.hierarchical_allreduce_time`)."""
    b = tp_allreduce_bytes_per_layer(batch, seq_len, d_model, bytes_per_value)
    return b["messages"] * hierarchical_allreduce_time(b["message_bytes"], tp, 1, link).seconds


def layer_train_flops(batch: int, seq_len: int, d_model: int, d_ff: int | None = None) -> int:
    """FLOPs of one Transformer layer's forward and backward (3x the forward): the four C x C projections
    and the two C x F ones, 2 FLOPs per multiply-add, plus attention's two T x T products."""
    f = 4 * d_model if d_ff is None else d_ff
    tokens = batch * seq_len
    forward = 2 * tokens * (4 * d_model * d_model + 2 * d_model * f) + 4 * batch * seq_len * seq_len * d_model
    return 3 * forward


def zero_communication_elements(n_params: int, stage: int) -> int:
    """Elements each rank sends and receives per step in ring collectives, in units of the parameter count
    Psi (ZeRO paper, section 7): stages 0 (DDP), 1 and 2 move 2 Psi, stage 3 moves 3 Psi."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage {stage} does not exist (0 = plain DDP, 1, 2, 3)")
    return (3 if stage == 3 else 2) * n_params


@dataclasses.dataclass(frozen=True)
class Zero3Memory:
    """Bytes per rank under ZeRO-3 / FSDP2 (mixed precision AdamW: 2 + 2 + 12 bytes per parameter)."""

    sharded_states: int  #: weights, gradients and optimizer state, each 1/N of the whole
    gathered_layers: int  #: the layer being computed and the prefetched next one, unsharded weights
    gradient_buffer: int  #: one layer's unsharded gradient, before its reduce-scatter, in reduce_dtype
    plain_ddp_states: int  #: the same states unsharded (16 bytes per parameter), for comparison

    @property
    def total(self) -> int:
        return self.sharded_states + self.gathered_layers + self.gradient_buffer


def zero3_rank_bytes(n_params: int, layer_params: int, world_size: int, *, state_bytes: int = 16,
                     compute_bytes: int = 2, prefetched_layers: int = 1, reduce_bytes: int = 4) -> Zero3Memory:
    """Model-state bytes one rank holds at its peak under ZeRO-3 (activations not included: ZeRO does not
    shard them). ``layer_params``: parameters of the largest FSDP unit (one Transformer layer). The gathered
    layers are in the compute dtype (``compute_bytes``: FSDP2's ``param_dtype``, bf16); the unsharded gradient
    before its reduce-scatter is in ``reduce_dtype`` (``reduce_bytes``): 4 for float32, which chapter 12
    recommends (``MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)``), 2 when the
    gradients are reduced in bf16."""
    if min(n_params, layer_params, world_size) < 1:
        raise ValueError("n_params, layer_params and world_size must be >= 1")
    if reduce_bytes not in (2, 4):
        raise ValueError(f"reduce_bytes is 4 (float32) or 2 (bf16/fp16), got {reduce_bytes!r}")
    return Zero3Memory(sharded_states=math.ceil(state_bytes * n_params / world_size),
                       gathered_layers=(1 + prefetched_layers) * layer_params * compute_bytes,
                       gradient_buffer=layer_params * reduce_bytes,
                       plain_ddp_states=state_bytes * n_params)


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """A decoder-only Transformer's size for the sizing rule (Llama-like: d_ff given, vocab ignored)."""

    name: str
    n_params: int
    n_layers: int
    d_model: int
    n_heads: int
    d_ff: int


LLAMA2_7B = ModelShape("7B (Llama-2-7B's shape)", 6_738_415_616, 32, 4096, 32, 11008)
LLAMA2_70B = ModelShape("70B (Llama-2-70B's shape)", 68_976_648_192, 80, 8192, 64, 28672)


@dataclasses.dataclass(frozen=True)
class Plan:
    """One choice of tensor (tp), pipeline (pp) and data (dp) parallel degrees and its memory per GPU."""

    tp: int
    pp: int
    dp: int
    states_bytes: int  #: bf16 weights + gradients, fp32 master + Adam moments sharded ZeRO-1 over dp
    activation_bytes: int  #: the most micro-batches stage 0 holds under 1F1B (pp), its layers, /tp
    fits: bool

    @property
    def total(self) -> int:
        return self.states_bytes + self.activation_bytes


def plan_bytes(model: ModelShape, tp: int, pp: int, dp: int, *, seq_len: int, micro_batch: int,
               checkpointing: bool = True) -> tuple[int, int]:
    """Per-GPU bytes of a (tp, pp, dp) layout: bf16 weights and gradients split over tp x pp (4 B per
    parameter), fp32 master weights and Adam moments also sharded over dp (ZeRO-1: 12 B); activations
    of the stage's layers / tp, times the pp micro-batches 1F1B keeps on stage 0; with checkpointing only
    each layer's input (B T C x 2 bytes) is kept, plus one layer's full activations for the recompute."""
    share = model.n_params / (tp * pp)
    states = int(4 * share + 12 * share / dp)
    layers = math.ceil(model.n_layers / pp)
    full_layer = layer_activation_bytes(d_model=model.d_model, n_heads=model.n_heads, seq_len=seq_len,
                                        batch_size=micro_batch, d_ff=model.d_ff, activation_bytes=2,
                                        fused_attention=True) // tp
    if checkpointing:
        per_micro_batch = layers * micro_batch * seq_len * model.d_model * 2
        activations = pp * per_micro_batch + full_layer
    else:
        activations = pp * layers * full_layer
    return states, int(activations)


def plan_parallelism(model: ModelShape, gpus: int, *, gpu_memory_bytes: float = 80e9, gpus_per_node: int = 8,
                     seq_len: int = 4096, micro_batch: int = 1, headroom: float = 0.8) -> Plan:
    """The Playbook's order: the smallest model-parallel degree tp x pp that fits in ``headroom`` of a GPU's
    memory, tensor parallel first (at most one node's GPUs, where NVLink joins them), then pipeline stages;
    the rest of the GPUs are data parallel. Activation checkpointing on (what such runs do)."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus={gpus!r} must be a positive integer")
    budget = headroom * gpu_memory_bytes
    candidates = []
    tp = 1
    while tp <= min(gpus_per_node, gpus):
        pp = 1
        while tp * pp <= gpus:
            if gpus % (tp * pp) == 0 and model.n_layers % pp == 0 and model.n_heads % tp == 0:
                candidates.append((tp * pp, pp, tp))
            pp *= 2
        tp *= 2
    for _, pp, tp in sorted(candidates):
        dp = gpus // (tp * pp)
        states, acts = plan_bytes(model, tp, pp, dp, seq_len=seq_len, micro_batch=micro_batch)
        if states + acts <= budget:
            return Plan(tp, pp, dp, states, acts, True)
    _, pp, tp = max(candidates, key=lambda c: (c[0], c[2]))  # the most splitting, tensor parallel first
    dp = gpus // (tp * pp)
    states, acts = plan_bytes(model, tp, pp, dp, seq_len=seq_len, micro_batch=micro_batch)
    return Plan(tp, pp, dp, states, acts, False)
