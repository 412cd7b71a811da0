"""Chapter 13's worker: the translator trained data parallel over the devices present, checked against one
process and timed against it, one process per rank.

    python -m gpuformer_lib.workers.translation all                     # starts 2 processes
    torchrun --standalone --nproc_per_node=2 -m gpuformer_lib.workers.translation all
    distributed.launch(distributed.worker_path("translation"), world, ["all"], backend=backend)  # a notebook

Every rank prepares the same Tatoeba split and vocabularies (``translation_task.prepare``: deterministic, so no
data is sent between ranks; a checksum of the split and of the batches is compared across ranks), builds the
translator of its size preset (``model_sizes.translation_run``; the CPU preset on CPU processes) from the same
seed, and takes the same global token-budget batches (``translation_task.samplers(...)["token_budget"]``,
epoch 0). Rank r trains on every world-th pair of each
global batch (DistributedSampler's split without shuffling), so the ranks hold different numbers of real target
tokens and pad to different lengths: the step is ``speed.make_train_step(normalize_by="tokens")``, which
all-reduces the token count so that the data-parallel step weights every real token as one process does.

Subcommands:

- ``equivalence``: K = 4 steps of PyTorch DDP against one process training the same model on the whole global
  batches (computed on every rank): the first step's gradients, the losses and the weights after K steps, with
  SGD (momentum 0.9) and no clipping (see :func:`equivalence` for why not the task's AdamW and clipping), and a
  control that fails (each rank dividing by its own token count). Dropout is off (``dropout=0.0``): each rank
  would draw its own masks, and one process others, so with dropout the two runs differ by design, not by
  error. Reports ``equivalence``.
- ``timing``: seconds per step of the task's AdamW step (clipping at 1.0), interleaved repeats, of (a) one
  process on the whole global batch (rank 0 alone, the other ranks waiting at a barrier so that it has the
  machine to itself), (b) every rank on its share without any communication (plain model: the data-parallel
  step's compute) and (c) DDP on the shares (the data-parallel step); per repeat, (b) and (c) take the slowest
  rank. Speedup (a) / (c) and efficiency (``distributed.scaling``), from the medians; the median share of (c)
  not in (b) is what communication (and waiting for the slowest rank) costs. Reports ``timing``.
- ``all``: both, in one launch (torchrun and ``prepare`` cost seconds each time).

Leaves out: training to quality (the case-study harness, ``case_study``), gradient accumulation and
communication hooks (chapter 11's ``data_parallel`` worker checks those on a small model).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import zlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gpuformer_lib import data, model_sizes, translation_task
from gpuformer_lib.device import choose_preset
from gpuformer_lib.distributed import DistEnv, rank_print, report, scaling, wait_for_device
from gpuformer_lib.model import Transformer, count_parameters
from gpuformer_lib.speed import make_train_step
from gpuformer_lib.workers import run_command

STEPS = 4
"""Optimizer steps of the equivalence check (and global batches the timing cycles through)."""
SEED = 0
"""Seed of the model's initial weights and of the token-budget batches (epoch 0)."""
REPEATS = 5
"""Timed repeats of each step variant (after one untimed warm-up round), interleaved."""
WEIGHT_DECAY, GRAD_CLIP = 0.01, 1.0  # as translation_task.translation_task trains
SGD_LR = 0.1
"""The equivalence check's learning rate (SGD with momentum 0.9): large enough that 4 steps move the weights."""


@dataclasses.dataclass
class Setup:
    """What every rank prepares alike: the data, the run size and the global batches."""

    prepared: translation_task.TranslationData
    run: model_sizes.RunSize
    preset: str
    batches: list[list[int]]
    """The global batches: indices into ``prepared.train_set``, the same on every rank."""


def setup(env: DistEnv, device: torch.device, steps: int = STEPS) -> Setup:
    """The data, the run size (dropout off) and the first ``steps`` global token-budget batches of epoch 0
    that give every rank at least one pair; raises if the ranks did not get the same split and batches."""
    prepared = translation_task.prepare()
    preset = choose_preset(device)
    run = model_sizes.translation_run(preset, len(prepared.src_vocab), len(prepared.tgt_vocab), prepared.max_len)
    run = dataclasses.replace(run, config=dataclasses.replace(run.config, dropout=0.0))
    sampler = translation_task.samplers(prepared.lengths, run.batch_size, SEED, 0)["token_budget"]
    batches = []
    for indices in sampler:
        if len(indices) >= env.world_size:  # a rank without a pair would have nothing to collate
            batches.append(list(indices))
        if len(batches) == steps:
            break
    if len(batches) < steps:
        raise ValueError(f"only {len(batches)} token-budget batches hold at least {env.world_size} pairs (one per "
                         f"rank); run fewer processes")
    same_everywhere(repr((prepared.train_pairs, prepared.val_pairs, prepared.test_pairs, batches)), device)
    return Setup(prepared, run, preset.name + (" (rehearsed: the CPU's sizes)" if preset.toy else ""), batches)


def same_everywhere(text: str, device: torch.device) -> None:
    """Raise on every rank unless ``text`` (its CRC-32) is the same on all ranks."""
    mine = torch.tensor([zlib.crc32(text.encode())], dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    if any(int(g) != int(mine) for g in gathered):
        sums = [int(g) for g in gathered]
        raise RuntimeError(f"the ranks prepared different data splits or batches (checksums {sums}"
                           "): translation_task.prepare and samplers must be deterministic; is $GPUFORMER_DATA the "
                           "same file for every rank?")


def build(s: Setup, device: torch.device) -> Transformer:
    torch.manual_seed(SEED)  # every rank builds the same initial weights (DDP would broadcast rank 0's anyway)
    return Transformer(s.run.config).to(device)


def adamw(model: torch.nn.Module, s: Setup) -> torch.optim.Optimizer:
    """The task's optimizer (``translation_task.translation_task``), for the timed steps."""
    return torch.optim.AdamW(model.parameters(), lr=s.run.lr, weight_decay=WEIGHT_DECAY)


def share(indices: list[int], rank: int, world: int) -> list[int]:
    """Rank ``rank``'s pairs of a global batch: every ``world``-th, from the ``rank``-th."""
    return indices[rank::world]


def collate(s: Setup, indices: list[int], device: torch.device) -> data.TranslationBatch:
    return data.collate_translation([s.prepared.train_set[i] for i in indices]).to(device)


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def record_first_gradients(optimizer, model, into: dict, key: str) -> None:
    """Keep ``model``'s gradients (flattened) in ``into[key]`` just before ``optimizer``'s first update: after
    the step's all-reduce and token weighting (a step built by ``make_train_step`` drops them after)."""

    def hook(opt, args, kwargs):
        if key not in into:
            into[key] = torch.cat([p.grad.flatten() for p in model.parameters()])

    optimizer.register_step_pre_hook(hook)


def equivalence(env: DistEnv, device: torch.device, s: Setup | None = None) -> None:
    """DDP on the shares against one process on the whole global batches: the first step's gradients (as the
    optimizer receives them), the losses, and the weights after ``len(s.batches)`` steps. The optimizer is SGD
    with momentum, not the task's AdamW: Adam divides each gradient by its own running size, which blows the
    rounding noise of gradients that are zero in exact arithmetic (the key projections' biases: softmax ignores
    a shift shared by every key) up to updates of the learning rate's size, hiding the comparison (measured:
    2e-5 with AdamW at lr 2e-3, 4 steps, all of it in those biases and in rare embeddings). No clipping either:
    clipping to norm 1 rescales the whole gradient, which hides an error that only rescales it (measured: the
    control's gradient gap fell from 4e-3 to 3e-7 with clipping at 1.0). The control, the step dividing by each
    rank's own token count (``data_parallel=False``, the old step), shows that the check can fail."""
    s = s or setup(env, device)
    n, r = env.world_size, env.rank
    first_grads, weights, losses = {}, {}, {}
    tokens, padded = [], []
    for name in ("one process", "data parallel", "each rank's own count"):
        model = build(s, device)
        opt = torch.optim.SGD(model.parameters(), lr=SGD_LR, momentum=0.9)
        record_first_gradients(opt, model, first_grads, name)
        if name == "one process":  # the reference, computed alike on every rank
            step = make_train_step(model, opt, translation_task.translation_loss, normalize_by="tokens")
        else:
            ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
            step = make_train_step(ddp, opt, translation_task.translation_loss, normalize_by="tokens",
                                   data_parallel=name == "data parallel")
        losses[name] = []
        for b in s.batches:
            if name == "one process":
                losses[name].append(step([collate(s, b, device)]).loss.item())
                continue
            batch = collate(s, share(b, r, n), device)
            real = (~batch.tgt_padding_mask).sum()
            loss = step([batch]).loss  # this rank's own mean over its real tokens
            both = torch.stack([loss.double() * real, real.double()])  # the global mean: weighted by tokens
            dist.all_reduce(both)
            losses[name].append((both[0] / both[1]).item())
            if name == "data parallel":
                counts = torch.tensor([int(real), batch.tgt_out.numel()], device=device)
                gathered = [torch.empty_like(counts) for _ in range(n)]
                dist.all_gather(gathered, counts)
                tokens.append([int(g[0]) for g in gathered])
                padded.append([int(g[1]) for g in gathered])
        weights[name] = flat(model)
    ref = "one process"
    result = {"world_size": n, "preset": s.preset, "parameters": count_parameters(model), "steps": len(s.batches),
              "optimizer": f"SGD(lr={SGD_LR:g}, momentum=0.9), no clipping",
              "dropout": s.run.config.dropout, "pairs_per_step": [len(b) for b in s.batches],
              "tokens_per_rank": tokens, "padded_tokens_per_rank": padded,
              "losses": losses, "max_abs_weight": weights[ref].abs().max().item(),
              "max_abs_gradient": first_grads[ref].abs().max().item()}
    for name in ("data parallel", "each rank's own count"):
        gaps = torch.tensor([(first_grads[name] - first_grads[ref]).abs().max().item(),
                             (weights[name] - weights[ref]).abs().max().item()], dtype=torch.float64, device=device)
        dist.all_reduce(gaps, op=dist.ReduceOp.MAX)  # the worst rank
        replicas = [torch.empty_like(weights[name]) for _ in range(n)]
        dist.all_gather(replicas, weights[name])
        result[name] = {"gradient_gap": gaps[0].item(), "weight_gap": gaps[1].item(),
                        "loss_gap": max(abs(a - b) for a, b in zip(losses[name], losses[ref])),
                        "replica_spread": max((g - weights[name]).abs().max().item() for g in replicas)}
        g = result[name]
        rank_print(f"{name:22} against one process: first gradients {g['gradient_gap']:.1e} (largest "
                   f"{result['max_abs_gradient']:.1e}), losses {g['loss_gap']:.1e}, weights after {len(s.batches)} "
                   f"steps {g['weight_gap']:.1e}, replicas from each other {g['replica_spread']:.1e}")
    report("equivalence", result)


def timing(env: DistEnv, device: torch.device, s: Setup | None = None, repeats: int = REPEATS) -> None:
    """Time (a) one process on the global batch, (b) the shares without communication and (c) the
    data-parallel step, interleaved, the task's AdamW step each; reports ``timing`` (see the module)."""
    s = s or setup(env, device)
    n, r = env.world_size, env.rank
    loss_fn = translation_task.translation_loss
    steps = {}
    if env.is_main:  # (a) one process on the whole global batch
        model = build(s, device)
        steps["one process"] = make_train_step(model, adamw(model, s), loss_fn, normalize_by="tokens",
                                               grad_clip=GRAD_CLIP)
    model = build(s, device)  # (b) this rank's share, no communication (not DDP: the token count stays local)
    steps["no communication"] = make_train_step(model, adamw(model, s), loss_fn, normalize_by="tokens",
                                                grad_clip=GRAD_CLIP)
    model = build(s, device)  # (c) the data-parallel step
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    steps["data parallel"] = make_train_step(ddp, adamw(model, s), loss_fn, normalize_by="tokens",
                                             grad_clip=GRAD_CLIP)
    whole = [collate(s, b, device) for b in s.batches]
    mine = [collate(s, share(b, r, n), device) for b in s.batches]
    names = ("one process", "no communication", "data parallel")
    times = {name: [] for name in names}
    for i in range(1 + repeats):  # round 0 warms up; each round runs the three on the same global batch
        k = i % len(s.batches)
        for name in names:
            dist.barrier()  # everyone starts together; for (a), the other ranks wait here, idle
            if name in steps:
                wait_for_device(device)
                started = time.perf_counter()
                out = steps[name]([whole[k] if name == "one process" else mine[k]])
                out.loss.item()
                wait_for_device(device)
                if i:
                    times[name].append(time.perf_counter() - started)
    # a data-parallel step is as slow as its slowest rank: per repeat, the maximum over ranks
    local = torch.tensor([times["no communication"], times["data parallel"]], dtype=torch.float64, device=device)
    dist.all_reduce(local, op=dist.ReduceOp.MAX)
    per_repeat = {"one process": times["one process"], "no communication": local[0].tolist(),
                  "data parallel": local[1].tolist()}
    if not env.is_main:
        return
    median = {name: statistics.median(t) for name, t in per_repeat.items()}
    speedup, efficiency = scaling(median["one process"], median["data parallel"], n)
    communication = statistics.median(1 - b / c for b, c in zip(per_repeat["no communication"],
                                                                per_repeat["data parallel"]))
    result = {"world_size": n, "preset": s.preset, "repeats": repeats, "step_s": median, "per_repeat_s": per_repeat,
              "speedup": speedup, "efficiency": efficiency, "communication_share": communication,
              "tokens_per_step": [int((~b.tgt_padding_mask).sum()) for b in whole]}
    rank_print("  ".join(f"{name}: {t * 1e3:.1f} ms" for name, t in median.items())
               + f" per step (median of {repeats}); speedup {speedup:.2f}x on {n}, efficiency {efficiency:.0%}, "
                 f"share of the step outside its compute {communication:.0%}")
    report("timing", result)


def run_all(env: DistEnv, device: torch.device) -> None:
    """``equivalence`` then ``timing``, on one setup."""
    s = setup(env, device)
    equivalence(env, device, s)
    timing(env, device, s)


COMMANDS = {"equivalence": equivalence, "timing": timing, "all": run_all}

if __name__ == "__main__":
    run_command(COMMANDS, "gpuformer_lib.workers.translation")
