"""Checks for the exercises on data parallel and model parallel training (chapters 11 and 12).

Each check runs in the notebook's own process: the ranks are simulated, so no process group is needed."""

from __future__ import annotations

from typing import Callable

import torch

from gpuformer_lib.exercises._answers import _indices, _number, _numbers, _tensors
from gpuformer_lib.exercises._core import CheckResult, _close, _report, _safe_check, _try


@_safe_check
def check_allreduce_time(fn: Callable[[float, int, float, float], float]) -> CheckResult:
    """``fn(nbytes, world_size, alpha, bandwidth)``: seconds of a ring all-reduce in the alpha-beta model."""
    from gpuformer_lib.distributed import ring_allreduce_time

    for args in [(4e8, 8, 1e-5, 1e11), (4e8, 2, 1e-5, 1e11), (1e3, 64, 5e-6, 2.5e10), (1e9, 1, 1e-5, 1e11)]:
        got, err = _try(fn, *args, expect=_number)
        if err:
            return _report(False, err)
        want = ring_allreduce_time(*args)
        if not _close(got, want, 1e-6):
            nbytes, n, alpha, bw = args
            hint = ("One process has nothing to exchange: 0 s." if n == 1 else
                    "Each rank sends 2 (N - 1) / N of the bytes (reduce-scatter, then all-gather) in 2 (N - 1) "
                    "messages, each paying alpha.")
            return _report(False, f"{nbytes:.3g} bytes over {n} ranks (alpha {alpha:g} s, {bw:.3g} B/s): expected "
                                  f"{want:.4g} s, got {got!r}. {hint}")
    return _report(True, "The bandwidth term barely grows with N: a ring all-reduce of the gradients costs about the "
                         "same on 8 GPUs as on 64; the latency term is what grows.")


@_safe_check
def check_scaling(fn: Callable[[float, float, int], tuple[float, float]]) -> CheckResult:
    """``fn(time_one, time_n, n)``: ``(speedup, efficiency)`` of running on ``n`` devices."""
    for args in [(10.0, 2.7, 4), (100.0, 60.0, 2), (8.0, 1.0, 8)]:
        got, err = _try(fn, *args, expect=_numbers(2, "a pair (speedup, efficiency)"))
        if err:
            return _report(False, err)
        speed, eff = got
        t1, tn, n = args
        if _close(speed, tn / t1, 1e-6) and not _close(speed, t1 / tn, 1e-6):
            return _report(False, "That speedup is upside down (the first seed's mistake): speedup is time before / "
                                  "time after, so 10 h -> 2.7 h is 3.7x, not 0.27.")
        if not _close(speed, t1 / tn, 1e-6) or not _close(eff, t1 / tn / n, 1e-6):
            return _report(False, f"{t1} -> {tn} on {n} devices: expected ({t1 / tn:.3f}, {t1 / tn / n:.3f}), "
                                  f"got {got!r}. Efficiency is the speedup divided by the number of devices.")
    return _report(True, "10 h -> 2.7 h on 4 GPUs is 3.7x at 93 % efficiency.")


@_safe_check
def check_rank_indices(fn: Callable[[int, int, int], list[int]]) -> CheckResult:
    """``fn(n_samples, world_size, rank)``: the sample indices ``DistributedSampler(shuffle=False)``
    gives ``rank``: every rank the same number, padding by wrapping around to the start."""
    from torch.utils.data import DistributedSampler

    for n, world, rank in [(8, 2, 0), (8, 2, 1), (10, 4, 3), (10, 4, 1), (3, 4, 3)]:
        got, err = _try(fn, n, world, rank, expect=_indices)
        if err:
            return _report(False, err)
        want = list(DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=False))
        if got != want:
            return _report(False, f"{n} samples, {world} ranks, rank {rank}: expected {want}, got {got!r}. Ranks take "
                                  "every world_size-th index starting at their rank, after the list is padded (by "
                                  "repeating its start) to a multiple of world_size.")
    return _report(True, "Equal shares keep the ranks in step: a rank with one batch more would wait in an "
                         "all-reduce nobody else joins.")


@_safe_check
def check_bubble(fn: Callable[[int, int], float]) -> CheckResult:
    """``fn(stages, micro_batches)``: the share of time a GPipe stage idles."""
    for p, m in [(2, 1), (4, 1), (4, 4), (8, 32), (1, 7)]:
        got, err = _try(fn, p, m, expect=_number)
        if err:
            return _report(False, err)
        want = (p - 1) / (m + p - 1)
        if not _close(got, want, 1e-9):
            return _report(False, f"{p} stages, {m} micro-batches: expected {want:.4f}, got {got!r}. "
                                  "The pipeline takes m + p - 1 slots to fill and drain; each stage works in m of "
                                  "them.")
    return _report(True, "Bubble (p - 1) / (m + p - 1): with m = 4p micro-batches it is under 20 %.")


@_safe_check
def check_zero_memory(fn: Callable[[int, int, int], int]) -> CheckResult:
    """``fn(n_params, world_size, stage)``: bytes per rank for float32 AdamW training (4 weight, 4
    gradient, 8 optimizer bytes per parameter) under ZeRO ``stage`` 0-3 over ``world_size`` ranks."""
    from gpuformer_lib.memory import training_memory

    for n, world, stage in [(10**9, 8, 0), (10**9, 8, 1), (10**9, 8, 2), (10**9, 8, 3), (7 * 10**8, 4, 2)]:
        got, err = _try(fn, n, world, stage, expect=_number)
        if err:
            return _report(False, err)
        shard = dict(shard_optimizer=world if stage >= 1 else 1, shard_gradients=world if stage >= 2 else 1,
                     shard_weights=world if stage >= 3 else 1)
        want = training_memory(n, optimizer="adamw", **shard).total
        if not _close(got, want, 1e-9):
            return _report(False, f"{n:.3g} parameters, {world} ranks, stage {stage}: expected {want / 2**30:.2f} GiB, "
                                  f"got {float(got) / 2**30:.2f} GiB. Stage 1 shards the optimizer state, stage 2 also "
                                  "the gradients, stage 3 also the weights.")
    return _report(True, "ZeRO-2 over 8 ranks cuts 16 bytes per parameter to 4 + (4 + 8) / 8 = 5.5.")


@_safe_check
def check_megatron_shards(
        fn: Callable[[torch.Tensor, torch.Tensor, int, int], tuple[torch.Tensor, torch.Tensor]]) -> CheckResult:
    """``fn(w1, w2, rank, world_size)``: rank's shards of an MLP ``relu(x @ w1.T) @ w2.T`` (w1: (F, C),
    w2: (C, F)) such that summing the ranks' ``relu(x @ w1_r.T) @ w2_r.T`` gives the full output."""
    g = torch.Generator().manual_seed(0)
    C, F, world = 6, 12, 3
    w1, w2 = torch.randn(F, C, generator=g, dtype=torch.float64), torch.randn(C, F, generator=g, dtype=torch.float64)
    x = torch.randn(5, C, generator=g, dtype=torch.float64)
    full = torch.relu(x @ w1.T) @ w2.T
    total = torch.zeros_like(full)
    for rank in range(world):
        got, err = _try(fn, w1, w2, rank, world, expect=_tensors(2, "two tensors (w1's shard, w2's shard)"))
        if err:
            return _report(False, err)
        if any(not t.is_floating_point() for t in got):
            return _report(False, f"the shards are slices of w1 and w2, float64 like them, not {got[0].dtype} and "
                                  f"{got[1].dtype}")
        try:
            a, b = got
            total += torch.relu(x @ a.T) @ b.T
        except Exception as error:  # noqa: BLE001 - shapes that do not fit
            return _report(False, f"the shards for rank {rank} do not fit the MLP ({error}); w1's shard should be "
                                  f"({F // world}, {C}) and w2's ({C}, {F // world})")
    if not torch.allclose(total, full):
        return _report(False, "the summed outputs differ from the full MLP. Split w1 by rows (output features: each "
                              "rank computes some hidden units, and relu acts on each unit alone) and w2 by the "
                              "matching columns.")
    return _report(True, "Column split, then row split: the non-linearity needs no communication, and one all-reduce "
                         "sums the partial outputs.")
