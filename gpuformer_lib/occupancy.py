"""Occupancy from scratch: how many warps of a kernel an SM holds, how many waves a launch takes, and
how many ways a shared-memory access conflicts.

An SM keeps a block resident until all its threads finish, and a block needs its registers and shared
memory for that whole time. So the number of blocks resident on one SM at once is the smallest of four
limits (the model of NVIDIA's CUDA Occupancy Calculator and of ``cudaOccupancyMaxActiveBlocksPerMultiprocessor``):

- the block slots: at most ``max_blocks`` blocks per SM;
- the warp slots: ``max_warps // warps_per_block``;
- the register file: registers are allocated per warp, ``regs_per_thread * 32`` rounded up to the
  allocation unit (256); ``registers // regs_per_warp`` warps fit, so that many // warps_per_block blocks;
- shared memory: ``smem_per_sm // (smem_per_block + reserved)``, each block's request rounded up to the
  allocation unit.

**Occupancy** = resident warps / the SM's maximum warps. It is what lets an SM hide memory latency: while
one warp waits ~hundreds of cycles for a load, the scheduler issues from another. Higher is not always
faster (a tiled matmul trades occupancy for registers and shared memory that hold reused data; Volkov,
2010, "Better performance at lower occupancy", GTC), but a kernel at 1 or 2 warps per SM cannot hide latency.

A launch of G blocks on S SMs with b resident blocks per SM runs in ``ceil(G / (b * S))`` **waves**; the
last one may be partly empty (the **tail effect**): the fraction of slots used is G / (waves * b * S).

Per-SM limits: NVIDIA's Turing Tuning Guide (compute capability 7.5, the T4) and Hopper Tuning Guide
(9.0, the H100), section "Occupancy", quoted in the registry (``sm75-*`` and ``sm90-*`` keys; a test checks
the two agree), and the CUDA C++ Programming Guide's table of technical specifications per compute
capability for the rest (1,024 threads per block, the allocation units, 1 KB reserved per block from
sm_80 on). SM counts: 40 on a T4, 132 on an H100 SXM5 (NVIDIA's Turing and Hopper whitepapers). :func:`bank_conflict_ways` models shared memory as 32 banks of 4-byte words.

Leaves out: the register file's split over the SM's four sub-partitions and the warp-allocation
granularity (the official calculator rounds a little more), the shared-memory carve-out the driver picks
(we assume the largest), cluster launches (sm_90), and what the compiler actually allocates (on a GPU,
a compiled Triton kernel reports it: ``kernel.n_regs``, ``kernel.metadata.shared``).
"""

from __future__ import annotations

import dataclasses
import math

WARP = 32


@dataclasses.dataclass(frozen=True)
class SmLimits:
    """Per-SM resource limits of one compute capability."""

    arch: str
    """``'sm_75'``, ``'sm_90'``: the compute capability."""
    max_threads_per_block: int
    max_blocks: int
    """Resident blocks per SM."""
    max_warps: int
    """Resident warps per SM (max resident threads / 32)."""
    registers: int
    """32-bit registers per SM."""
    max_regs_per_thread: int
    reg_alloc_unit: int
    """Registers are allocated per warp in units of this many."""
    smem_per_sm: int
    """Shared memory per SM usable by blocks, in bytes (the largest carve-out)."""
    smem_per_block: int
    """The most one block may request, in bytes (above 48 KB it must opt in)."""
    smem_alloc_unit: int
    smem_reserved_per_block: int
    """Shared memory the system reserves for each resident block (1 KB from sm_80 on)."""

    @property
    def max_threads(self) -> int:
        return self.max_warps * WARP


KB = 1024
LIMITS = {
    "sm_75": SmLimits("sm_75", 1024, 16, 32, 64 * KB, 255, 256, 64 * KB, 64 * KB, 256, 0),
    "sm_90": SmLimits("sm_90", 1024, 32, 64, 64 * KB, 255, 256, 228 * KB, 227 * KB, 128, 1 * KB),
}
"""Per-SM limits by compute capability (CUDA C++ Programming Guide, technical specifications table)."""

GPUS = {"T4": ("sm_75", 40), "H100 SXM": ("sm_90", 132)}
"""The course's two prediction GPUs: (compute capability, number of SMs)."""


def limits(gpu_or_arch: str) -> SmLimits:
    """The per-SM limits of ``'T4'``, ``'H100 SXM'``, ``'sm_75'`` or ``'sm_90'``."""
    if gpu_or_arch in GPUS:
        return LIMITS[GPUS[gpu_or_arch][0]]
    if gpu_or_arch in LIMITS:
        return LIMITS[gpu_or_arch]
    raise ValueError(f"unknown GPU or architecture {gpu_or_arch!r}; choose one of {sorted(GPUS) + sorted(LIMITS)}")


def sm_count(gpu: str) -> int:
    """Number of SMs of ``'T4'`` (40) or ``'H100 SXM'`` (132)."""
    if gpu not in GPUS:
        raise ValueError(f"unknown GPU {gpu!r}; choose one of {sorted(GPUS)}")
    return GPUS[gpu][1]


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def _count(name: str, value, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class Occupancy:
    """Resident blocks and warps of one kernel on one SM, and which resource limits them."""

    arch: str
    threads_per_block: int
    regs_per_thread: int
    smem_per_block: int
    warps_per_block: int
    blocks_per_sm: int
    limits_by: dict
    """Blocks per SM each resource alone would allow: ``'blocks'``, ``'warps'``, ``'registers'``, ``'shared memory'``."""
    max_warps: int

    @property
    def warps_per_sm(self) -> int:
        return self.blocks_per_sm * self.warps_per_block

    @property
    def occupancy(self) -> float:
        """Resident warps / the SM's maximum, in [0, 1]."""
        return self.warps_per_sm / self.max_warps

    @property
    def limiter(self) -> str:
        """The resource that sets ``blocks_per_sm`` (the first of equals, in the order blocks, warps,
        registers, shared memory)."""
        return min(self.limits_by, key=lambda k: self.limits_by[k])


def occupancy(gpu_or_arch: str, threads_per_block: int, regs_per_thread: int = 32, smem_per_block: int = 0
              ) -> Occupancy:
    """Resident blocks and warps per SM for blocks of ``threads_per_block`` threads, each thread using
    ``regs_per_thread`` registers and each block ``smem_per_block`` bytes of shared memory.

    Raises ``ValueError`` for a block that cannot launch at all (too many threads, registers or bytes)."""
    lim = limits(gpu_or_arch)
    _count("threads_per_block", threads_per_block, 1)
    _count("regs_per_thread", regs_per_thread, 1)
    _count("smem_per_block", smem_per_block, 0)
    if threads_per_block > lim.max_threads_per_block:
        raise ValueError(f"{threads_per_block} threads per block: {lim.arch} allows at most {lim.max_threads_per_block}")
    if regs_per_thread > lim.max_regs_per_thread:
        raise ValueError(f"{regs_per_thread} registers per thread: {lim.arch} allows at most {lim.max_regs_per_thread} "
                         "(the compiler spills the rest to local memory)")
    if smem_per_block > lim.smem_per_block:
        raise ValueError(f"{smem_per_block:,} bytes of shared memory per block: {lim.arch} allows at most "
                         f"{lim.smem_per_block:,}; the launch fails ('out of resource: shared memory' in Triton)")
    warps = math.ceil(threads_per_block / WARP)
    regs_per_warp = _round_up(regs_per_thread * WARP, lim.reg_alloc_unit)
    by_regs = (lim.registers // regs_per_warp) // warps
    if by_regs == 0:
        raise ValueError(f"{warps} warps x {regs_per_warp} registers need more than the SM's {lim.registers:,}")
    smem = _round_up(smem_per_block, lim.smem_alloc_unit) + lim.smem_reserved_per_block
    by_smem = lim.smem_per_sm // smem if smem else lim.max_blocks
    found = {"blocks": lim.max_blocks, "warps": lim.max_warps // warps, "registers": by_regs,
             "shared memory": by_smem}
    return Occupancy(lim.arch, threads_per_block, regs_per_thread, smem_per_block, warps, min(found.values()),
                     found, lim.max_warps)


@dataclasses.dataclass(frozen=True)
class Waves:
    """How a grid of blocks fills the GPU's SMs."""

    blocks: int
    slots: int
    """Blocks resident at once on the whole GPU: blocks per SM x SMs."""

    @property
    def waves(self) -> int:
        return math.ceil(self.blocks / self.slots)

    @property
    def tail_efficiency(self) -> float:
        """Fraction of the block slots used over all waves: 1 when the grid is a whole number of waves."""
        return self.blocks / (self.waves * self.slots)


def waves(gpu: str, blocks: int, occ: Occupancy) -> Waves:
    """Waves of a launch of ``blocks`` blocks on ``gpu`` whose kernel has occupancy ``occ``."""
    _count("blocks", blocks, 1)
    if limits(gpu).arch != occ.arch:
        raise ValueError(f"the occupancy is for {occ.arch}, the GPU {gpu!r} is {limits(gpu).arch}")
    return Waves(blocks, occ.blocks_per_sm * sm_count(gpu))


def bank_conflict_ways(stride_words: int, banks: int = 32, warp: int = WARP) -> int:
    """How many ways a warp's shared-memory access conflicts when thread i reads 4-byte word
    ``i * stride_words``: the largest number of distinct words that fall in one bank (word w lives in bank
    w % banks), so the access is replayed that many times. Stride 1: 1 (no conflict); stride 2: 2; stride
    32: 32 (a column of a 32-wide float tile); stride 33: 1 (the padding trick)."""
    _count("stride_words", stride_words, 0)
    per_bank: dict[int, set[int]] = {}
    for i in range(warp):
        word = i * stride_words
        per_bank.setdefault(word % banks, set()).add(word)
    return max(len(words) for words in per_bank.values())
