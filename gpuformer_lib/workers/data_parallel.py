"""Chapter 11's workers: data parallel training with torch.distributed, one process per rank.

    python -m gpuformer_lib.workers.data_parallel equivalence            # starts 2 processes
    torchrun --standalone --nproc_per_node=2 -m gpuformer_lib.workers.data_parallel equivalence

Subcommands: hello (ranks and an all-reduce), equivalence (naive, hooked and PyTorch DDP against one
process on the whole batch, with no_sync accumulation and a rank-0 checkpoint), sampler
(DistributedSampler and set_epoch), allreduce (time against message size, and the ring written by
hand), scaling (training throughput at this world size), fail (a rank that raises). Gloo on CPU
processes, NCCL on GPUs (GPUFORMER_BACKEND, set by distributed.launch).
"""

import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from gpuformer_lib import bench, data
from gpuformer_lib.distributed import NaiveDataParallel, average_gradients, rank_print, report, ring_all_reduce
from gpuformer_lib.model import DecoderLM, TransformerConfig
from gpuformer_lib.workers import run_command

GLOBAL_BATCH = 8
"""Samples per step of the equivalence check; the number of ranks must divide it
(``profiles.data_parallel_world`` chooses one that does)."""
CONFIG = TransformerConfig(vocab_size=16, d_model=32, n_heads=4, n_decoder_layers=2, d_ff=64, dropout=0.0, max_len=32)


def make_model(device):
    torch.manual_seed(0)  # every rank builds the same initial weights (DDP would broadcast rank 0's anyway)
    return DecoderLM(CONFIG).to(device)


def lm_loss(model, x, y):
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())  # (B*T, V) against (B*T,)


def hello(env, device):
    rank_print(f"world size {env.world_size}, local rank {env.local_rank}, device {device}, "
               f"backend {dist.get_backend()}")
    value = torch.tensor([float(env.rank)], device=device)
    dist.all_reduce(value)  # every rank contributes its rank; every rank receives the sum
    rank_print(f"all_reduce of the ranks: {value.item():g}")
    report("rank_sum", value.item())


def equivalence(env, device, steps=5, global_batch=GLOBAL_BATCH):
    n, r = env.world_size, env.rank
    if global_batch % n:
        raise ValueError(f"the global batch of {global_batch} does not split over {n} ranks")
    batches = [data.repeating_patterns(s, CONFIG.vocab_size, batch_size=global_batch, seq_len=16) for s in range(steps)]
    indices = list(DistributedSampler(range(global_batch), num_replicas=n, rank=r, shuffle=False))  # r, r + n, ...
    weights, first_grads, losses = {}, {}, {}
    for name in ("one process, whole batch", "average_gradients", "NaiveDataParallel", "DDP", "DDP + no_sync"):
        model = make_model(device)
        wrapped = (NaiveDataParallel(model) if name == "NaiveDataParallel"
                   else DDP(model, device_ids=[device.index] if device.type == "cuda" else None) if "DDP" in name
                   else model)
        # SGD with momentum: Adam would blow rounding noise in gradients that are zero in exact
        # arithmetic (the key projection's bias) up to full-size updates, hiding the comparison
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        losses[name] = []
        for step, (x, y) in enumerate(batches):
            x, y = x.to(device), y.to(device)
            if name == "one process, whole batch":  # the reference, computed alike on every rank
                loss = lm_loss(model, x, y)
                loss.backward()
            elif name == "DDP + no_sync":  # two micro-batches per rank; all-reduce only after the second
                mine_x, mine_y = x[indices], y[indices]
                half = max(len(indices) // 2, 1)
                with wrapped.no_sync():  # gradients accumulate locally, no communication
                    first = lm_loss(wrapped, mine_x[:half], mine_y[:half]) * half / len(indices)
                    first.backward()
                second = lm_loss(wrapped, mine_x[half:], mine_y[half:]) * (len(indices) - half) / len(indices)
                second.backward()  # this backward all-reduces the accumulated gradients
                loss = (first + second).detach()
            else:
                loss = lm_loss(wrapped, x[indices], y[indices])
                loss.backward()
                if name == "average_gradients":
                    average_gradients(model)
                elif name == "NaiveDataParallel":
                    wrapped.finish_gradients()
            if step == 0:
                first_grads[name] = torch.cat([p.grad.flatten().cpu() for p in model.parameters()])
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss = loss.detach().clone()
            if name != "one process, whole batch":
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
    ring = torch.ones(2**22 // 4, device=device)
    ring_time = bench.time_fn(lambda: ring_all_reduce(ring), device=device, warmup=1, repeats=repeats).median
    report("allreduce", {"bytes": sizes, "seconds": times, "ring_4MiB_s": ring_time,
                         "ring_correct": bool(torch.allclose(mine, expected))})


def scaling(env, device, steps=6, per_rank_batch=16):
    config = TransformerConfig(vocab_size=256, d_model=128, n_heads=4, n_decoder_layers=2, d_ff=512, dropout=0.0,
                               max_len=64)
    torch.manual_seed(0)
    model = DecoderLM(config).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = data.repeating_patterns(env.rank, 256, batch_size=per_rank_batch, seq_len=64)
    x, y = x.to(device), y.to(device)

    def step():
        lm_loss(ddp, x, y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    t = bench.time_fn(step, device=device, warmup=2, repeats=steps).median
    tokens = env.world_size * per_rank_batch * 64
    rank_print(f"step {bench.format_seconds(t)}: {tokens / t:,.0f} tokens/s over {env.world_size} process(es)")
    report("scaling", {"world_size": env.world_size, "step_s": t, "tokens_per_s": tokens / t,
                       "gradient_bytes": sum(p.numel() * 4 for p in model.parameters())})


def fail(env, device):
    dist.barrier()
    if env.rank == env.world_size - 1:
        raise ValueError(f"rank {env.rank} failed on purpose: the others must stop, not hang")
    dist.barrier()  # the other ranks wait here until the timeout or until torchrun stops them


COMMANDS = {f.__name__: f for f in (hello, equivalence, sampler, allreduce, scaling, fail)}

if __name__ == "__main__":
    run_command(COMMANDS, "gpuformer_lib.workers.data_parallel")
