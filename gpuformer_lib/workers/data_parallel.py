"""Chapter 11's workers: data parallel training with torch.distributed, one process per rank.

    python -m gpuformer_lib.workers.data_parallel equivalence            # starts 2 processes
    torchrun --standalone --nproc_per_node=2 -m gpuformer_lib.workers.data_parallel equivalence

Subcommands: hello (ranks and an all-reduce), equivalence (naive, hooked and PyTorch DDP against one
process on the whole batch, with no_sync accumulation for both the hooked version and DDP and a rank-0
checkpoint; token-weighted DDP with uneven padding across ranks, the token count all-reduced or not; DDP's
16-bit compression hook; then zero1 in the same launch), zero1 (ZeRO stage 1: AdamW's moments sharded over
the ranks, against one process with torch.optim.AdamW, and the optimizer-state bytes per rank), accumulation
(DDP accumulating micro-batches with and without no_sync: the same weights, all-reduces counted), sampler
(DistributedSampler and set_epoch), allreduce (time against message size; the ring and the two-phase
hierarchical all-reduce written by hand), scaling (a step without communication, with an all-reduce after
backward, and DDP's, timed interleaved in one launch), fail (a rank
that raises). Gloo
on CPU processes, NCCL on GPUs (GPUFORMER_BACKEND, set by distributed.launch). The DDP runs train
through ``speed.make_train_step``, the step every chapter uses; the naive versions are written out.
"""

import copy
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from gpuformer_lib import bench, data
from gpuformer_lib.distributed import (NaiveDataParallel, ShardedAdamW, average_gradients, hierarchical_all_reduce,
                                      rank_print, report, ring_all_reduce, wait_for_device, zero1_bytes_per_rank)
from gpuformer_lib.model import DecoderLM, TransformerConfig
from gpuformer_lib.speed import StepOutput, make_train_step
from gpuformer_lib.workers import lm_loss, run_command

GLOBAL_BATCH = 16
"""Samples per step of the equivalence check; the number of ranks must divide it
(``profiles.data_parallel_world`` chooses one that does), leaving each rank at least 2 samples for
the accumulation variant's 2 micro-batches (up to 8 ranks)."""
CONFIG = TransformerConfig(vocab_size=16, d_model=32, n_heads=4, n_decoder_layers=2, d_ff=64, dropout=0.0, max_len=32)


def make_model(device):
    torch.manual_seed(0)  # every rank builds the same initial weights (DDP would broadcast rank 0's anyway)
    return DecoderLM(CONFIG).to(device)


def hello(env, device):
    rank_print(f"world size {env.world_size}, local rank {env.local_rank}, device {device}, "
               f"backend {dist.get_backend()}")
    value = torch.tensor([float(env.rank)], device=device)
    dist.all_reduce(value)  # every rank contributes its rank; every rank receives the sum
    rank_print(f"all_reduce of the ranks: {value.item():g}")
    report("rank_sum", value.item())


def record_first_gradients(optimizer, model, into, key):
    """Keep ``model``'s gradients (flattened, on the CPU) in ``into[key]`` just before ``optimizer``'s first
    update: a step built by ``make_train_step`` sets them to None right after."""

    def hook(opt, args, kwargs):
        if key not in into:
            into[key] = torch.cat([p.grad.flatten().cpu() for p in model.parameters()])

    optimizer.register_step_pre_hook(hook)


def hand_written_step(model, optimizer, finish_gradients):
    """A step written out, for the naive versions: backward, ``finish_gradients()`` (their all-reduce),
    update. Returns ``step(micro_batches) -> StepOutput`` like ``make_train_step``, for one micro-batch."""

    def step(micro_batches):
        (batch,) = micro_batches
        loss, tokens = lm_loss(model, batch)
        loss.backward()
        finish_gradients()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return StepOutput(loss=loss.detach(), tokens=tokens, grad_norm=None)

    return step


def equivalence(env, device, steps=5, global_batch=GLOBAL_BATCH):
    n, r = env.world_size, env.rank
    if global_batch % n or global_batch < 2 * n:
        raise ValueError(f"the global batch of {global_batch} does not split over {n} ranks into 2 micro-batches "
                         f"each: use a multiple of {n} that is at least {2 * n}")
    batches = [data.repeating_patterns(s, CONFIG.vocab_size, batch_size=global_batch, seq_len=16) for s in range(steps)]
    indices = list(DistributedSampler(range(global_batch), num_replicas=n, rank=r, shuffle=False))  # r, r + n, ...

    def whole(x, y):  # the reference, computed alike on every rank
        return [(x, y)]

    def my_share(x, y):
        return [(x[indices], y[indices])]

    def my_share_in_two(x, y):  # two micro-batches of accumulation
        return list(zip(x[indices].tensor_split(2), y[indices].tensor_split(2)))

    weights, first_grads, losses = {}, {}, {}
    for name in ("one process, whole batch", "average_gradients", "NaiveDataParallel", "NaiveDataParallel + no_sync",
                 "NaiveDataParallel, 2 micro-batches", "DDP", "DDP + no_sync"):
        model = make_model(device)
        # SGD with momentum: Adam would blow rounding noise in gradients that are zero in exact
        # arithmetic (the key projection's bias) up to full-size updates, hiding the comparison
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        record_first_gradients(opt, model, first_grads, name)
        if name == "one process, whole batch":
            step, split = make_train_step(model, opt, lm_loss), whole
        elif name == "average_gradients":  # naive: one all-reduce of all gradients after backward
            step, split = hand_written_step(model, opt, lambda: average_gradients(model)), my_share
        elif name == "NaiveDataParallel":  # naive: all-reduces started by gradient hooks during backward
            naive = NaiveDataParallel(model)
            step, split = hand_written_step(naive, opt, naive.finish_gradients), my_share
        elif name == "NaiveDataParallel + no_sync":  # two micro-batches, a pause between them, one all-reduce
            naive = NaiveDataParallel(model)
            step = paused(make_train_step(naive, opt, lm_loss, grad_accum_steps=2, normalize_by="tokens",
                                          no_sync=naive.no_sync))
            split = my_share_in_two
        elif name == "NaiveDataParallel, 2 micro-batches":  # the review's case: no no_sync, a pause, 2 all-reduces
            naive = NaiveDataParallel(model)
            step = paused(make_train_step(naive, opt, lm_loss, grad_accum_steps=2, normalize_by="tokens"))
            split = my_share_in_two
        else:  # the real thing, through the training step every chapter uses
            ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
            if name == "DDP":
                step, split = make_train_step(ddp, opt, lm_loss), my_share
            else:  # micro-batches but the last run inside ddp.no_sync(): one all-reduce per step
                step = make_train_step(ddp, opt, lm_loss, grad_accum_steps=2, normalize_by="tokens",
                                       no_sync=ddp.no_sync)
                split = my_share_in_two
        losses[name] = []
        for x, y in batches:
            loss = step(split(x.to(device), y.to(device))).loss.clone()
            if split is not whole:
                dist.all_reduce(loss)  # the global batch's loss: the mean of the ranks' equal-sized means
                loss /= n
            losses[name].append(loss.item())
        weights[name] = torch.cat([p.detach().flatten().cpu() for p in model.parameters()])
    ref = "one process, whole batch"
    gaps = {}
    for name in weights:
        if name == ref:
            continue
        gaps[name] = {"gradient": (first_grads[name] - first_grads[ref]).abs().max().item(),
                      "loss": max(abs(a - b) for a, b in zip(losses[name], losses[ref])),
                      "weights": (weights[name] - weights[ref]).abs().max().item()}
        rank_print(f"{name:18} vs one process: gradient {gaps[name]['gradient']:.1e}, losses over {steps} steps "
                   f"{gaps[name]['loss']:.1e}, weights after {steps} steps {gaps[name]['weights']:.1e}")
    # every rank holds the same weights: check it, then checkpoint from rank 0 only
    mine = weights["DDP"].to(device)
    gathered = [torch.empty_like(mine) for _ in range(n)]
    dist.all_gather(gathered, mine)
    same = all(torch.equal(g, mine) for g in gathered)
    path = os.path.join(tempfile.gettempdir(), f"gpuformer_ddp_{os.environ['MASTER_PORT']}.pt")
    if env.is_main:
        tmp = path + ".tmp"
        torch.save({"weights": weights["DDP"]}, tmp)
        os.replace(tmp, path)  # atomic: a reader never sees half a file
    dist.barrier()  # nobody reads before rank 0 has written
    loaded = torch.load(path, weights_only=True)["weights"]
    dist.barrier()  # nobody deletes before everyone has read
    if env.is_main:
        os.remove(path)
    rank_print(f"replicas identical on every rank: {same}; checkpoint written by rank 0 and loaded on every rank: "
               f"{torch.equal(loaded, weights['DDP'])}")
    report("gaps", gaps)
    report("replicas_identical", bool(same))
    report("losses", losses)
    report("uneven_padding", uneven_padding(env, device, batches))
    report("bf16_hook", compressed_gradients(env, device, batches[0], indices))
    zero1(env, device)  # in the same launch: no extra process start


def zero1(env, device, steps=4, rows=16, width=32, lr=1e-3):
    """ZeRO stage 1 (``distributed.ShardedAdamW``: AdamW's moments split over the ranks) against one process
    with ``torch.optim.AdamW`` on the whole batch, and against replicated AdamW on the same averaged gradients
    (the sharding alone): the weights after ``steps`` steps, and the optimizer-state bytes each rank holds
    against the replicated AdamW's. A small regression MLP: no parameter whose gradient is zero in exact
    arithmetic (AdamW would turn rounding noise there into full steps)."""
    n, r = env.world_size, env.rank
    torch.manual_seed(0)  # the same model and data on every rank
    reference = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.GELU(),
                              nn.Linear(width, 1)).to(device)
    replicated, sharded = copy.deepcopy(reference), copy.deepcopy(reference)
    x, y = torch.randn(rows, width, device=device), torch.randn(rows, 1, device=device)
    mine = slice(r * rows // n, (r + 1) * rows // n)
    optimizers = {"one process": (reference, torch.optim.AdamW(reference.parameters(), lr=lr), slice(None)),
                  "replicated": (replicated, torch.optim.AdamW(replicated.parameters(), lr=lr), mine),
                  "zero1": (sharded, ShardedAdamW(sharded.parameters(), lr=lr), mine)}
    for _ in range(steps):
        for name, (model, opt, rows_here) in optimizers.items():
            opt.zero_grad()
            F.mse_loss(model(x[rows_here]), y[rows_here]).backward()
            if name != "one process":
                average_gradients(model)  # what DDP does; ZeRO-1 then updates only this rank's shard
            opt.step()

    def gap(a, b):
        return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))

    gaps = torch.tensor([gap(sharded, reference), gap(sharded, replicated)], device=device)
    dist.all_reduce(gaps, op=dist.ReduceOp.MAX)
    opt = optimizers["zero1"][1]
    adamw_bytes = sum(t.numel() * t.element_size() for s in optimizers["replicated"][1].state.values()
                      for t in s.values() if t.dim() > 0)
    held = torch.tensor([opt.state_bytes()], device=device)
    per_rank = [torch.zeros_like(held) for _ in range(n)]
    dist.all_gather(per_rank, held)
    rank_print(f"ZeRO-1: owns {opt.shard_size} of {opt.numel} values, {opt.state_bytes()} bytes of AdamW state "
               f"(replicated: {adamw_bytes}); weights after {steps} steps differ from one process by "
               f"{gaps[0].item():.1e}, from replicated AdamW by {gaps[1].item():.1e}")
    report("zero1", {"weight_gap": gaps[0].item(), "gap_to_replicated": gaps[1].item(), "n_params": opt.numel,
                     "world_size": n, "steps": steps, "shard_size": opt.shard_size,
                     "state_bytes_per_rank": [int(t.item()) for t in per_rank], "replicated_state_bytes": adamw_bytes,
                     "formula_bytes_per_rank": zero1_bytes_per_rank(opt.numel, n)})


def paused(step, seconds=0.02):
    """``step`` with a pause after each micro-batch: a hand-written data parallel that does not wait for its
    all-reduces at the end of each backward pass gives wrong gradients exactly when the reduction has finished
    before the next micro-batch adds to the same tensor (the review reproduced 0.218 off this way)."""

    def with_pauses(micro_batches):
        def slowly():
            for batch in micro_batches:
                yield batch
                time.sleep(seconds)

        return step(slowly())

    return with_pauses


def padded_lm_loss(model, batch):
    """Mean cross-entropy over the targets that are not padding (-100), and their count: a ``loss_fn`` for
    ``make_train_step`` whose token count differs between batches."""
    x, y = batch
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-100), (y != -100).sum()


def uneven_padding(env, device, batches, steps=3):
    """Token-weighted DDP when ranks hold different numbers of real tokens: rank 0's share is mostly padding.
    One process on the concatenated batch is the reference; ``normalize_by='tokens'`` with the token count
    all-reduced (the library's step) must equal it, and dividing by each rank's own count (the old
    behaviour, ``data_parallel=False``) must not, its replicas drifting apart."""
    n, r = env.world_size, env.rank
    padded = []
    for x, y in batches[:steps]:
        y = y.clone()
        for i in range(len(y)):
            if i % n == 0:  # the samples DistributedSampler gives rank 0: 3 real targets, the rest padding
                y[i, 3:] = -100
        padded.append((x, y))
    indices = list(range(r, len(padded[0][0]), n))  # DistributedSampler(shuffle=False)'s share of rank r
    reference = make_model(device)
    ref_step = make_train_step(reference, torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9),
                               padded_lm_loss, normalize_by="tokens")
    for x, y in padded:
        ref_step([(x.to(device), y.to(device))])
    ref = torch.cat([p.detach().flatten().cpu() for p in reference.parameters()])
    result = {"tokens_per_rank": [int((padded[0][1][r::n] != -100).sum()) for r in range(n)]}
    for name, all_reduced in (("token count all-reduced", True), ("each rank's own count (the old step)", False)):
        model = make_model(device)
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        step = make_train_step(ddp, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), padded_lm_loss,
                               grad_accum_steps=2, normalize_by="tokens", no_sync=ddp.no_sync,
                               data_parallel=all_reduced)
        for x, y in padded:
            x, y = x[indices].to(device), y[indices].to(device)
            step(zip(x.tensor_split(2), y.tensor_split(2)))
        mine = torch.cat([p.detach().flatten() for p in model.parameters()])
        gathered = [torch.empty_like(mine) for _ in range(n)]
        dist.all_gather(gathered, mine)
        spread = max((g - mine).abs().max().item() for g in gathered)
        result[name] = {"weight_gap": (mine.cpu() - ref).abs().max().item(), "replica_spread": spread}
        rank_print(f"uneven padding, {name}: weights differ from one process by "
                   f"{result[name]['weight_gap']:.1e}, replicas from each other by {spread:.1e}")
    return result


def compressed_gradients(env, device, batch, indices):
    """DDP's compression hook (gradients cast to 16 bits for the all-reduce: half the bytes) against the
    exact all-reduce: the gradients differ by the 16-bit format's rounding, not by float32's. bf16 with NCCL;
    PyTorch's bf16 hook needs NCCL, so gloo runs the fp16 hook (same idea, fp16's rounding)."""
    x, y = batch
    hook = default_hooks.bf16_compress_hook if dist.get_backend() == "nccl" else default_hooks.fp16_compress_hook
    grads = {}
    for name in ("exact", hook.__name__):
        model = make_model(device)
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        if name != "exact":
            ddp.register_comm_hook(None, hook)
        loss, _ = lm_loss(ddp, (x[indices].to(device), y[indices].to(device)))
        loss.backward()
        grads[name] = torch.cat([p.grad.flatten().cpu() for p in model.parameters()])
    diff = (grads[hook.__name__] - grads["exact"]).abs()
    scale = grads["exact"].abs().max().item()
    return {"hook": hook.__name__, "max_abs_gap": diff.max().item(), "max_gradient": scale,
            "relative_gap": diff.max().item() / scale}


def accumulation(env, device, micro_batches=2, steps=3, global_batch=GLOBAL_BATCH):
    """DDP with gradient accumulation through ``make_train_step``, with and without ``no_sync``, against
    one process on the whole batch; a communication hook counts the all-reduces of each step."""
    n, r = env.world_size, env.rank
    if global_batch % n or global_batch < micro_batches * n:
        raise ValueError(f"the global batch of {global_batch} does not split over {n} ranks into {micro_batches} "
                         f"micro-batches each: use a multiple of {n} that is at least {micro_batches * n}")
    batches = [data.repeating_patterns(s, CONFIG.vocab_size, batch_size=global_batch, seq_len=16) for s in range(steps)]
    mine = slice(r * global_batch // n, (r + 1) * global_batch // n)
    reference = make_model(device)
    ref_step = make_train_step(reference, torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9), lm_loss)
    for x, y in batches:
        ref_step([(x.to(device), y.to(device))])
    result = {}
    for name, hold_back in (("no_sync", True), ("all-reduce every micro-batch", False)):
        model = make_model(device)
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        buckets_reduced = []

        def counting_all_reduce(state, bucket):  # DDP's default all-reduce, counted
            buckets_reduced.append(bucket.index())
            return default_hooks.allreduce_hook(state, bucket)

        ddp.register_comm_hook(None, counting_all_reduce)
        step = make_train_step(ddp, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), lm_loss,
                               grad_accum_steps=micro_batches, normalize_by="tokens",
                               no_sync=ddp.no_sync if hold_back else None)
        per_step = []
        for x, y in batches:
            before = len(buckets_reduced)
            x, y = x[mine].to(device), y[mine].to(device)
            step(zip(x.tensor_split(micro_batches), y.tensor_split(micro_batches)))
            per_step.append(len(buckets_reduced) - before)
        gap = max((p - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters()))
        rank_print(f"{name:28}: all-reduced buckets per step {per_step}; weights after {steps} steps differ from "
                   f"one process by {gap:.1e}")
        result[name] = {"weight_gap": gap, "all_reduces_per_step": per_step}
    report("accumulation", result)


def sampler(env, device, n_samples=10):
    for set_epoch in (False, True):
        s = DistributedSampler(range(n_samples), num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=0)
        seen = []
        for epoch in range(2):
            if set_epoch:
                s.set_epoch(epoch)
            seen.append(list(s))
        rank_print(f"{'with' if set_epoch else 'without'} set_epoch: epoch 0 {seen[0]}, epoch 1 {seen[1]}")


def allreduce(env, device, repeats=10):
    sizes = [2**k for k in range(10, 25, 2)]  # 1 KiB .. 16 MiB of float32
    times = []
    for nbytes in sizes:
        x = torch.ones(nbytes // 4, device=device)
        t = bench.time_fn(lambda: dist.all_reduce(x), device=device, warmup=3, repeats=repeats).min  # the best: least disturbed
        times.append(t)
    mine = torch.arange(1000, dtype=torch.float32, device=device) * (env.rank + 1)
    expected = mine.clone()
    dist.all_reduce(expected)
    ring_all_reduce(mine)
    rank_print(f"ring_all_reduce written by hand equals dist.all_reduce: {torch.allclose(mine, expected)}")
    # the two-phase (node, then across nodes) all-reduce, for every way of cutting the ranks into nodes
    hierarchical = {}
    for g in (d for d in range(1, env.world_size + 1) if env.world_size % d == 0):
        x = torch.arange(1001, dtype=torch.float32, device=device) * (env.rank + 1)  # 1001: not a multiple of g
        want = x.clone()
        dist.all_reduce(want)
        hierarchical_all_reduce(x, g)
        hierarchical[f"{env.world_size // g} nodes x {g}"] = bool(torch.allclose(x, want))
    rank_print(f"hierarchical_all_reduce written by hand equals the sum: {hierarchical}")
    ring = torch.ones(2**22 // 4, device=device)
    ring_time = bench.time_fn(lambda: ring_all_reduce(ring), device=device, warmup=1, repeats=repeats).median
    report("allreduce", {"bytes": sizes, "seconds": times, "ring_4MiB_s": ring_time,
                         "ring_correct": bool(torch.allclose(mine, expected)), "hierarchical_correct": hierarchical})


def scaling(env, device, repeats=7, per_rank_batch=4, warmup=1):
    """The cost of data parallel's all-reduce, measured in one launch: (a) a step without communication (the
    same model, batch and optimizer: what one process alone does, t1), (b) the same step followed by an
    all-reduce of every gradient (``average_gradients``: nothing hidden), whose all-reduce is also timed inside
    the step, and (c) DDP's step (buckets all-reduced during backward), timed in interleaved rounds by
    ``bench.time_interleaved`` (a fixed number of rounds, so that every rank runs the same collectives). Each
    timed step ends in a barrier, so every rank's time is the slowest rank's step: a step is as slow as its
    slowest rank. Weak scaling's efficiency is t1 / tN, (a)'s time over (b)'s or (c)'s, round by round."""
    config = TransformerConfig(vocab_size=256, d_model=128, n_heads=4, n_decoder_layers=2, d_ff=512, dropout=0.0,
                               max_len=64)
    x, y = data.repeating_patterns(env.rank, 256, batch_size=per_rank_batch, seq_len=64)
    batch = (x.to(device), y.to(device))
    steps, comm_times = {}, []

    def timed_average(model):
        wait_for_device(device)
        started = time.perf_counter()
        average_gradients(model)
        wait_for_device(device)
        comm_times.append(time.perf_counter() - started)

    for name in ("no communication", "all-reduce after backward", "DDP"):
        torch.manual_seed(0)
        model = DecoderLM(config).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        if name == "no communication":
            steps[name] = make_train_step(model, opt, lm_loss)
        elif name == "all-reduce after backward":
            steps[name] = hand_written_step(model, opt, lambda model=model: timed_average(model))
        else:
            steps[name] = make_train_step(DDP(model, device_ids=[device.index] if device.type == "cuda" else None),
                                          opt, lm_loss)
        gradient_bytes = sum(p.numel() * 4 for p in model.parameters())

    def until_every_rank_is_done(step):
        def timed():
            step([batch])
            wait_for_device(device)
            dist.barrier()  # the slowest rank's step: the next one starts on every rank together
        return timed

    dist.barrier()
    timings = bench.time_interleaved({name: until_every_rank_is_done(step) for name, step in steps.items()},
                                     device=device, warmup=warmup, repeats=repeats, max_repeats=repeats)
    comm = comm_times[warmup:]  # (b)'s all-reduce in each timed round
    # (b)'s compute in each round (its step less its all-reduce), on the rank that computed slowest: the
    # others' all-reduce includes waiting for it
    compute = [t - c for t, c in zip(timings["all-reduce after backward"].times, comm)]
    compute = torch.tensor(compute, dtype=torch.float64, device=device)
    dist.all_reduce(compute, op=dist.ReduceOp.MAX)
    # every rank's rounds end together (the barrier); rank 0's times, the same within the barrier's latency,
    # are the ones reported
    rounds = torch.tensor([timings[name].times for name in steps], dtype=torch.float64, device=device)
    dist.broadcast(rounds, src=0)
    step_rounds = dict(zip(steps, rounds.tolist()))
    rank_print("  ".join(f"{name}: {bench.format_seconds(timings[name].median)}" for name in steps))
    report("scaling", {"world_size": env.world_size, "step_rounds_s": step_rounds,
                       "compute_rounds_s": compute.tolist(), "warmup": warmup, "tokens_per_rank": per_rank_batch * 64,
                       "gradient_bytes": gradient_bytes, "repeats": repeats})


def fail(env, device):
    dist.barrier()
    if env.rank == env.world_size - 1:
        raise ValueError(f"rank {env.rank} failed on purpose: the others must stop, not hang")
    dist.barrier()  # the other ranks wait here until the timeout or until torchrun stops them


COMMANDS = {f.__name__: f for f in (hello, equivalence, zero1, accumulation, sampler, allreduce, scaling, fail)}

if __name__ == "__main__":
    run_command(COMMANDS, "gpuformer_lib.workers.data_parallel")
