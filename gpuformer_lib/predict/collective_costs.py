"""What a gradient all-reduce costs on a GPU cluster: bus bandwidth, links of two speeds, and fitting alpha-beta.

Scope (chapter 11's GPU view and its exercises):

- **algbw and busbw** as NCCL-tests defines them (``doc/PERFORMANCE.md`` in NVIDIA/nccl-tests): algorithm
  bandwidth ``S / t`` and, for an all-reduce, bus bandwidth ``algbw * 2 (n - 1) / n``, the rate each rank's
  link actually carried, comparable with the hardware's peak whatever n is (:func:`busbw`, :func:`algbw`);
- a **hierarchical** all-reduce model (:func:`hierarchical_allreduce_time`) for ``nodes`` machines of
  ``gpus_per_node`` GPUs: the ring's latency counted after NCCL's own tuning model (``src/graph/tuning.cc``:
  ``2 (N - 1)`` steps, some of them across nodes at the network's latency; the course counts ``2 (M - 1)``
  of them, where tuning.cc at the cited commit counts ``2 M``, so that one GPU per node is the flat ring on
  the network; the two differ by two network steps), and its bandwidth term ``2 (N - 1) / N * S / B`` with ``B`` the bus bandwidth of the slowest
  level: NVLink inside a node, the node's network (all its NICs together) between nodes. A pipelined ring
  runs at the speed of its slowest link, which is why 8 GPUs on NVLink and 64 GPUs on 8 nodes can differ
  by an order of magnitude (one NIC per node) or hardly at all (one 400 Gb/s NIC per GPU). The
  ``'two-phase'`` schedule (reduce-scatter in the node, all-reduce across nodes, all-gather in the node,
  one after the other) adds the levels' times instead: an upper bound when the phases do not overlap;
- :func:`fit_alpha_beta`: latency alpha and bandwidth B of the flat ring model
  ``t = 2 (N - 1) alpha + 2 (N - 1) / N * S / B`` fitted to measured times by least squares on the
  relative error (so the smallest and the largest messages count alike);
- :func:`overlap_efficiency`: the step-time efficiency of data parallel with and without overlap of the
  all-reduce with the backward pass.

Leaves out: NCCL's tree and NVLS (NVLink SHARP) algorithms (their busbw does not count bytes on a wire: an
NVLS all-reduce on 8 H100s reports a busbw above NVLink's line rate), protocol choice (LL, LL128, Simple),
contention with other jobs, and the compute the reduction itself costs. Every number a prediction uses
comes from the published registry (``published_figures.DATA_PARALLEL``) or is measured on the page.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Sequence

import numpy as np


def _positive(name: str, value, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return float(value)


def _count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def busbw(nbytes: float, seconds: float, world_size: int) -> float:
    """NCCL-tests' bus bandwidth of an all-reduce of ``nbytes`` that took ``seconds`` on ``world_size``
    ranks: ``S / t * 2 (n - 1) / n`` bytes/s (0 for one rank, which sends nothing)."""
    n = _count("world_size", world_size)
    return _positive("nbytes", nbytes, allow_zero=True) / _positive("seconds", seconds) * 2 * (n - 1) / n


def algbw(bus_bandwidth: float, world_size: int) -> float:
    """The algorithm bandwidth ``S / t`` an all-reduce reaches when its bus bandwidth is ``bus_bandwidth``:
    ``busbw * n / (2 (n - 1))``. Dividing a message's size by it gives the time."""
    n = _count("world_size", world_size)
    if n == 1:
        raise ValueError("one rank moves no bytes: its algorithm bandwidth is not defined")
    return _positive("bus_bandwidth", bus_bandwidth) * n / (2 * (n - 1))


@dataclasses.dataclass(frozen=True)
class Link:
    """One level of a cluster's network, as an all-reduce sees it."""

    name: str
    alpha: float
    """Seconds each ring step pays before a byte moves (NCCL's per-step latency for this kind of link)."""
    bus_bandwidth: float
    """All-reduce bus bandwidth (bytes/s) this level sustains, as NCCL-tests reports it: per GPU inside a
    node; for the level between nodes, what the node's NICs sustain together."""
    basis: str = ""
    """Where the two numbers come from (registry keys, or 'measured here')."""

    def __post_init__(self):
        _positive("alpha", self.alpha, allow_zero=True)
        _positive("bus_bandwidth", self.bus_bandwidth)


@dataclasses.dataclass(frozen=True)
class AllReduceTime:
    """A predicted all-reduce time and its parts, in seconds."""

    latency: float
    bandwidth: float
    bottleneck: str
    """The level whose bandwidth sets the bandwidth term ('intra-node' or 'inter-node'; 'both' for
    the two-phase schedule, which pays each)."""

    @property
    def seconds(self) -> float:
        return self.latency + self.bandwidth


def hierarchical_allreduce_time(nbytes: float, gpus_per_node: int, nodes: int, intra: Link, inter: Link | None = None,
                                *, schedule: str = "ring", base_latency: float | None = None) -> AllReduceTime:
    """Time to all-reduce ``nbytes`` over ``nodes`` x ``gpus_per_node`` GPUs.

    Latency, after NCCL's tuning model: ``2 (N - 1)`` steps, of which ``2 (M - 1)`` cross between nodes and
    pay ``inter.alpha``; the others pay ``intra.alpha``. (NCCL's ``tuning.cc`` at commit b6475625 counts
    ``2 M`` network steps for ``M > 1`` and adds a base latency per call; the course's count keeps one GPU
    per node equal to the flat ring, and differs from NCCL's by two network steps.) Bandwidth: ``'ring'`` (NCCL's
    pipelined ring) moves ``2 (N - 1) / N`` of the bytes at the bus bandwidth of the slowest level;
    ``'two-phase'`` reduce-scatters in the node (``(G - 1) / G`` at ``intra``), all-reduces the shards
    across nodes (``2 (M - 1) / M`` at ``inter``, the node's NICs working in parallel on G shards) and
    all-gathers in the node (``(G - 1) / G`` at ``intra``), one after the other. One node reduces to the
    flat ring on ``intra``; one GPU per node to the flat ring on ``inter``. Every call also pays NCCL's base
    latency (``base_latency`` seconds; default its tuning model's for a ring in the Simple protocol,
    ``nccl-ring-simple-base-latency``), as the course's predictor does (``predict.allreduce_seconds``)."""
    nbytes = _positive("nbytes", nbytes, allow_zero=True)
    g, m = _count("gpus_per_node", gpus_per_node), _count("nodes", nodes)
    if not isinstance(intra, Link) or (inter is not None and not isinstance(inter, Link)):
        raise TypeError("intra and inter must be Links (inter may be None for one node)")
    if m > 1 and inter is None:
        raise ValueError(f"{m} nodes need the link between them: pass inter=Link(...)")
    if schedule not in ("ring", "two-phase"):
        raise ValueError(f"schedule must be 'ring' or 'two-phase', got {schedule!r}")
    n = g * m
    if n == 1:
        return AllReduceTime(0.0, 0.0, "none")
    base = _figure("nccl-ring-simple-base-latency") * 1e-6 if base_latency is None else _positive(
        "base_latency", base_latency, allow_zero=True)
    inter_steps = 2 * (m - 1)
    latency = base + (2 * (n - 1) - inter_steps) * intra.alpha + (inter_steps * inter.alpha if m > 1 else 0.0)
    if schedule == "ring":
        if m == 1:
            return AllReduceTime(latency, 2 * (n - 1) / n * nbytes / intra.bus_bandwidth, "intra-node")
        slow = inter if inter.bus_bandwidth < intra.bus_bandwidth or g == 1 else intra
        where = "inter-node" if slow is inter else "intra-node"
        return AllReduceTime(latency, 2 * (n - 1) / n * nbytes / slow.bus_bandwidth, where)
    in_node = 2 * (g - 1) / g * nbytes / intra.bus_bandwidth
    across = 2 * (m - 1) / m * nbytes / inter.bus_bandwidth if m > 1 else 0.0
    return AllReduceTime(latency, in_node + across, "both" if m > 1 and g > 1 else ("inter-node" if g == 1 else
                                                                                    "intra-node"))


def fit_alpha_beta(nbytes: Sequence[float], seconds: Sequence[float], world_size: int) -> tuple[float, float]:
    """``(alpha, bandwidth)`` of ``t = 2 (N - 1) alpha + 2 (N - 1) / N * S / B`` fitted to measured all-reduce
    times by least squares on the relative error (each point weighted by 1 / t, so a 1 KiB and a 16 MiB
    message count alike). alpha is kept >= 0; at least two distinct sizes are needed."""
    n = _count("world_size", world_size)
    if n == 1:
        raise ValueError("one rank sends nothing: there is no alpha or bandwidth to fit")
    s = np.asarray(nbytes, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    if s.shape != t.shape or s.ndim != 1 or len(np.unique(s)) < 2:
        raise ValueError("need matching 1-D sequences of sizes and times with at least two distinct sizes")
    if not (np.all(np.isfinite(t)) and np.all(t > 0) and np.all(s >= 0)):
        raise ValueError("times must be positive and sizes non-negative")
    a_coef, b_coef = 2 * (n - 1), 2 * (n - 1) / n  # t = a_coef * alpha + b_coef * S * (1 / B)
    design = np.stack([np.full_like(s, a_coef), b_coef * s], axis=1) / t[:, None]
    (alpha, inv_bw), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    if alpha < 0:  # latency cannot be negative: refit the bandwidth alone
        alpha = 0.0
        inv_bw = float(np.sum(b_coef * s / t) / np.sum((b_coef * s / t) ** 2))
    if inv_bw <= 0:
        raise ValueError("the times do not grow with the size: no bandwidth can be fitted")
    return float(alpha), float(1.0 / inv_bw)


def overlap_efficiency(compute_s: float, allreduce_s: float, *, overlap: float = 0.0) -> float:
    """Data-parallel efficiency (per-rank batch fixed) when a step computes for ``compute_s`` and all-reduces
    for ``allreduce_s``: ``compute / (compute + exposed)``, where the exposed communication is the part not
    hidden behind the backward pass (``overlap`` = share of the all-reduce hidden, 0 to 1; the hidden part
    can be at most the backward pass, taken as 2/3 of the step: backward costs about twice the forward's FLOPs)."""
    compute_s = _positive("compute_s", compute_s)
    allreduce_s = _positive("allreduce_s", allreduce_s, allow_zero=True)
    if isinstance(overlap, bool) or not isinstance(overlap, numbers.Real) or not 0 <= overlap <= 1:
        raise ValueError(f"overlap must be between 0 and 1, got {overlap!r}")
    hidden = min(overlap * allreduce_s, 2 / 3 * compute_s)
    return compute_s / (compute_s + allreduce_s - hidden)


# --------------------------------------------------------------------------- the GPU view's clusters

PCIE3_X16_LINE_RATE = 8e9 * 16 * 128 / 130 / 8
"""PCIe 3.0 x16 (the T4's only link) per direction, bytes/s: 8 GT/s per lane x 16 lanes, 128b/130b
encoding. A line rate, so a T4 prediction built on it is a lower bound on the time (NCCL reaches about 80 %
of NVLink's line rate, ``nccl-h100-nvlink-effective-ring``)."""


def _figure(key: str) -> float:
    from gpuformer_lib.published import figure

    return float(figure(key).value)


def registry_links() -> dict[str, Link]:
    """The links of the GPU view's predictions, each number from the published registry (keys in ``basis``)
    except the PCIe line rate (:data:`PCIE3_X16_LINE_RATE`)."""
    us, gbs = 1e-6, 1e9
    nvlink_alpha, pcie_alpha, net_alpha = (_figure(k) * us for k in (
        "nccl-nvlink-ring-step-latency", "nccl-pcie-ring-step-latency", "nccl-net-ring-step-latency"))
    nic400, nic100 = _figure("nccl-ndr400-nic-busbw") * gbs, _figure("nccl-100g-nic-busbw") * gbs
    return {
        "H100 NVLink": Link("H100 NVLink (ring)", nvlink_alpha, _figure("nccl-h100-nvlink-effective-ring") * gbs,
                            "nccl-h100-nvlink-effective-ring, nccl-nvlink-ring-step-latency"),
        "T4 PCIe": Link("T4 PCIe 3.0 x16", pcie_alpha, PCIE3_X16_LINE_RATE,
                        "PCIe 3.0 x16 line rate, nccl-pcie-ring-step-latency"),
        "8 x 400G NICs": Link("8 x 400 Gb/s NICs per node", net_alpha, _figure("nccl-2node-8nic-ring-busbw") * gbs,
                              "nccl-2node-8nic-ring-busbw, nccl-net-ring-step-latency"),
        "1 x 400G NIC": Link("1 x 400 Gb/s NIC per node", net_alpha, nic400,
                             "nccl-ndr400-nic-busbw, nccl-net-ring-step-latency"),
        "1 x 100G NIC": Link("1 x 100 Gb/s NIC per node", net_alpha, nic100,
                             "nccl-100g-nic-busbw, nccl-net-ring-step-latency"),
    }


@dataclasses.dataclass(frozen=True)
class ClusterPrediction:
    label: str
    gpu: str
    """The GPU as ``gpu_view.PREDICTION_GPUS`` names it."""
    gpus_per_node: int
    nodes: int
    time: AllReduceTime
    basis: str


def cluster_predictions(nbytes: float) -> list[ClusterPrediction]:
    """An all-reduce of ``nbytes`` on the GPU view's clusters: 4 T4s on PCIe in one machine; 8 H100s on NVLink;
    2 and 8 such nodes with one 400 Gb/s NIC per GPU (rail-optimised, 8 per node); 8 nodes with one 400 Gb/s
    NIC per node; 8 nodes with one 100 Gb/s NIC per node."""
    links = registry_links()
    nv = links["H100 NVLink"]
    rows = [("4 x T4, PCIe, one machine", "T4", 4, 1, links["T4 PCIe"], None),
            ("8 x H100, NVLink, one node", "H100 SXM", 8, 1, nv, None),
            ("2 x 8 H100, 8 x 400 Gb/s NICs per node", "H100 SXM", 8, 2, nv, links["8 x 400G NICs"]),
            ("8 x 8 H100, 8 x 400 Gb/s NICs per node", "H100 SXM", 8, 8, nv, links["8 x 400G NICs"]),
            ("8 x 8 H100, 1 x 400 Gb/s NIC per node", "H100 SXM", 8, 8, nv, links["1 x 400G NIC"]),
            ("8 x 8 H100, 1 x 100 Gb/s NIC per node", "H100 SXM", 8, 8, nv, links["1 x 100G NIC"])]
    out = []
    for label, gpu, g, m, intra, inter in rows:
        basis = intra.basis + (f"; between nodes {inter.basis}" if inter is not None else "")
        out.append(ClusterPrediction(label, gpu, g, m, hierarchical_allreduce_time(nbytes, g, m, intra, inter), basis))
    return out
