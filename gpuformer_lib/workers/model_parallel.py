"""Chapter 12's workers: model parallel training with torch.distributed, one process per rank.

    python -m gpuformer_lib.workers.model_parallel gpipe                 # starts 2 processes
    torchrun --standalone --nproc_per_node=2 -m gpuformer_lib.workers.model_parallel gpipe

Subcommands: gpipe (layers split over the ranks, micro-batches by hand: the bubble measured against
(p - 1) / (m + p - 1), and the gradients against one process; then GPipe's and 1F1B's orders with their
saved activations measured), pipelining (PyTorch's GPipe and 1F1B
schedules against one process), tensor (Megatron's column and row splits by hand, and with
parallelize_module), fsdp (FSDP2 fully_shard against one process, and memory per rank against the
chapter 9 calculator), mesh (tensor parallel and FSDP2 on a 2 x 2 device mesh, 4 processes), experts (a
mixture-of-experts layer with its experts split over the ranks, against one process), two_ranks
(gpipe, pipelining, tensor, fsdp and experts in one launch). Gloo on
CPU processes, NCCL on GPUs (GPUFORMER_BACKEND). The commands that train with an optimizer (fsdp, mesh)
step through ``speed.make_train_step``; the pipelines and tensor splits are written out by hand.
"""

import copy
import logging
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from gpuformer_lib import bench, data
from gpuformer_lib.distributed import TensorParallelMLP, gpipe_bubble, rank_print, report, run_gpipe, wait_for_device
from gpuformer_lib.memory import training_memory
from gpuformer_lib.model import DecoderLM, TransformerConfig, count_parameters
from gpuformer_lib.pipeline_orders import gpipe_order, one_f_one_b_order, run_order
from gpuformer_lib.profiles import current_profile, size_preset
from gpuformer_lib.speed import make_train_step
from gpuformer_lib.workers import lm_loss, run_command


class Block(nn.Module):
    """A residual MLP block: x + W2 gelu(W1 LN(x)); the pipeline's unit of work."""

    def __init__(self, width):
        super().__init__()
        self.norm, self.linear1, self.linear2 = nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.linear2(F.gelu(self.linear1(self.norm(x))))


def deep_model(width, n_blocks):
    torch.manual_seed(0)  # the same model on every rank
    return nn.Sequential(*[Block(width) for _ in range(n_blocks)])


def stage_of(model, env):
    per = len(model) // env.world_size
    return copy.deepcopy(model[env.rank * per: (env.rank + 1) * per])  # this rank's consecutive blocks


def batch(width, rows, device):
    g = torch.Generator().manual_seed(1)
    return torch.randn(rows, width, generator=g).to(device), torch.randn(rows, width, generator=g).to(device)


def mse_loss(model, batch):
    """Mean squared error of ``model`` on ``batch = (x, y)`` and its rows: a ``loss_fn`` for
    ``speed.make_train_step``."""
    x, y = batch
    return F.mse_loss(model(x), y), x.shape[0]


def gpipe(env, device, width=None, n_blocks=8, rows=None, repeats=5):
    # on GPUs, stages large enough that each computes for milliseconds, not the launch latency of its kernels
    preset = size_preset(current_profile(device))
    width = width or preset.pick(cpu=256, gpu=2048)
    rows = rows or preset.pick(cpu=512, gpu=4096)
    full = deep_model(width, n_blocks).to(device)
    x, y = batch(width, rows, device)
    F.mse_loss(full(x), y).backward()  # the reference: one process, the whole model and batch
    stage = stage_of(full, env)
    first, last = env.rank == 0, env.rank == env.world_size - 1
    rows_out, counts = [], (1, 2, 4, 8)
    busy, gaps = {m: [] for m in counts}, {}
    own = full[env.rank * (n_blocks // env.world_size):]

    def gpipe_step(m):
        def step():
            stage.zero_grad(set_to_none=True)
            _, b = run_gpipe(stage, x if first else None, y if last else None, F.mse_loss, m, (rows // m, width))
            busy[m].append(b)
            if len(busy[m]) == 1:  # the warm-up call (untimed): its gradients against one process's
                gaps[m] = max((a.grad - r.grad).abs().max().item() for a, r in zip(stage.parameters(),
                                                                                    own.parameters()))
            wait_for_device(device)  # a GPU's queued work must not leak into (or out of) the timed step
            dist.barrier()  # the step ends when every stage is done: each rank then times the same step
        return step

    # every m in each round, interleaved (bench.time_interleaved), a fixed number of rounds so that the ranks
    # run the same sends and receives; warm-up 1
    dist.barrier()
    timings = bench.time_interleaved({m: gpipe_step(m) for m in counts}, device=device, warmup=1, repeats=repeats,
                                     max_repeats=repeats)
    # every rank's rounds end together; rank 0's step times are the ones reported
    rounds = torch.tensor([timings[m].times for m in counts], dtype=torch.float64, device=device)
    dist.broadcast(rounds, src=0)
    for m, step_rounds in zip(counts, rounds.tolist()):
        gap = gaps[m]
        step, mine = min(step_rounds), min(busy[m][1:])  # busy: the warm-up's call left out
        idle = torch.tensor([1 - mine / step], device=device)
        dist.all_reduce(idle)
        idle = idle.item() / env.world_size
        rank_print(f"m={m:2}: step {step * 1e3:6.1f} ms, this stage busy {mine * 1e3:6.1f} ms; "
                   f"largest gradient difference from one process {gap:.1e}")
        rows_out.append({"micro_batches": m, "step_s": step, "step_rounds_s": step_rounds, "idle_measured": idle,
                         "bubble_predicted": gpipe_bubble(env.world_size, m), "gradient_gap": gap})
    report("gpipe", rows_out)
    report("pipeline_memory", pipeline_memory(env, stage, full, x if first else None, y if last else None,
                                              rows, width, n_blocks))


def pipeline_memory(env, stage, full, x, y, rows, width, n_blocks, micro_batches=8):
    """GPipe's and 1F1B's orders at m micro-batches (same launch as ``gpipe``): peak micro-batches in
    flight and peak bytes saved for backward on each rank (``LiveSavedBytes``), gradients against one process."""
    p, rank = env.world_size, env.rank
    offset = rank * (n_blocks // p)
    out = {}
    for name, order_of in (("GPipe", gpipe_order), ("1F1B", one_f_one_b_order)):
        stage.zero_grad(set_to_none=True)
        dist.barrier()
        r = run_order(stage, x, y, F.mse_loss, order_of(rank, p, micro_batches), micro_batches,
                      (rows // micro_batches, width))
        gap = max((a.grad - b.grad).abs().max().item() for a, b in zip(stage.parameters(), full[offset:].parameters()))
        every = [None] * p
        dist.all_gather_object(every, {"peak_in_flight": r["peak_in_flight"], "peak_saved_bytes": r["peak_saved_bytes"],
                                       "gradient_gap": gap})
        out[name] = every
        rank_print(f"{name}: {r['peak_in_flight']} micro-batches in flight at most, "
                   f"{r['peak_saved_bytes'] / 2**20:.2f} MiB saved for backward at the peak; gradient gap {gap:.1e}")
    out["micro_batches"], out["stages"] = micro_batches, p
    return out


def pipelining(env, device, width=64, n_blocks=4, rows=32, micro_batches=4):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    full = deep_model(width, n_blocks).to(device)
    x, y = batch(width, rows, device)
    ref_loss = F.mse_loss(full(x), y)
    ref_loss.backward()
    results = {}
    for name, schedule_class in (("GPipe", ScheduleGPipe), ("1F1B", Schedule1F1B)):
        stage_module = stage_of(full, env)
        stage = PipelineStage(stage_module, env.rank, env.world_size, device)
        schedule = schedule_class(stage, micro_batches, loss_fn=F.mse_loss)
        losses = []
        if env.rank == 0:
            schedule.step(x)
        elif env.rank == env.world_size - 1:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        offset = env.rank * (n_blocks // env.world_size)
        gap = max((a.grad - b.grad).abs().max().item() for a, b in
                  zip(stage_module.parameters(), full[offset:].parameters()))
        loss_gap = abs(torch.stack(losses).mean().item() - ref_loss.item()) if losses else 0.0
        rank_print(f"{name}: largest gradient difference from one process {gap:.1e}"
                   + (f", loss difference {loss_gap:.1e}" if losses else ""))
        gaps = torch.tensor([gap, loss_gap], device=device)
        dist.all_reduce(gaps, op=dist.ReduceOp.MAX)
        results[name] = {"gradient_gap": gaps[0].item(), "loss_gap": gaps[1].item()}
    report("pipelining", results)


def tensor(env, device, width=64, rows=8):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.ReLU(), nn.Linear(4 * width, width)).to(device)
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(2)).to(device)
    ref = mlp(x)
    ref.square().sum().backward()
    n, r = env.world_size, env.rank

    scratch = TensorParallelMLP(mlp[0], mlp[2])
    with CountAllReduces() as forward_count:  # x stands for a layer's input inside a model: it needs a gradient
        out = scratch(x.clone().requires_grad_())
    with CountAllReduces() as backward_count:
        out.square().sum().backward()
    gaps = {"output": (out - ref).abs().max().item(),
            # each rank holds a slice of the gradients: rows of W1, columns of W2
            "grad_w1": (scratch.linear1.weight.grad - mlp[0].weight.grad.chunk(n, 0)[r]).abs().max().item(),
            "grad_w2": (scratch.linear2.weight.grad - mlp[2].weight.grad.chunk(n, 1)[r]).abs().max().item()}
    mesh = init_device_mesh(device.type, (n,))
    dtensor_mlp = copy.deepcopy(mlp)
    dtensor_mlp.zero_grad(set_to_none=True)
    parallelize_module(dtensor_mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    out2 = dtensor_mlp(x)
    out2.square().sum().backward()
    gaps["parallelize_module output"] = (out2 - ref).abs().max().item()
    gaps["parallelize_module grad_w1"] = (dtensor_mlp[0].weight.grad.full_tensor() - mlp[0].weight.grad).abs().max().item()
    local = dtensor_mlp[0].weight.to_local().shape
    rank_print(f"scratch: output {gaps['output']:.1e}, W1 grad {gaps['grad_w1']:.1e}, W2 grad {gaps['grad_w2']:.1e}; "
               f"parallelize_module: output {gaps['parallelize_module output']:.1e}, this rank holds W1 {tuple(local)} "
               f"of {tuple(mlp[0].weight.shape)}")
    worst = torch.tensor(list(gaps.values()), device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    report("tensor", dict(zip(gaps, worst.tolist())))
    report("tensor_bytes", {"forward": forward_count.calls, "backward": backward_count.calls, "rows": rows,
                            "width": width, "element_bytes": x.element_size(), "world_size": n})


class CountShardedCollectives:
    """Bytes FSDP2 moves inside the block: the unsharded size of every all-gather (the tensor gathered into) and of
    every reduce-scatter input (the unsharded gradient).

    Which function FSDP2 calls changes between torch versions (``all_gather_into_tensor`` and
    ``reduce_scatter_tensor`` up to 2.12, ``all_gather_single`` and ``reduce_scatter_single`` from 2.13), so no
    name is written here: every public function of the two families that this torch exports
    (``torch.distributed.distributed_c10d.__all__``: names starting ``all_gather`` or ``reduce_scatter``, the
    ``_object`` ones aside) is wrapped, on ``torch.distributed`` and on ``distributed_c10d`` alike, for the block.
    What is counted follows the convention every one of them keeps, output first: an all-gather's first argument
    (the gathered tensor, or list of tensors), a reduce-scatter's second (the tensor or list scattered). A call
    made inside another counted call (an old name calling a new one) is not counted again. The chapter and
    tests/test_distributed.py check the count against the parameters' sizes (blocks gathered twice, the root
    once, every gradient reduce-scattered once), so a torch whose FSDP2 moved its traffic elsewhere fails there,
    and a count of zero fails at once (the fsdp worker)."""

    FAMILIES = {"gather": "all_gather", "scatter": "reduce_scatter"}

    @staticmethod
    def collective_names() -> dict[str, list[str]]:
        """This torch's public all-gather and reduce-scatter functions, by family."""
        from torch.distributed import distributed_c10d

        public = getattr(distributed_c10d, "__all__", ())
        return {family: sorted(n for n in public if n.startswith(prefix) and not n.endswith("_object"))
                for family, prefix in CountShardedCollectives.FAMILIES.items()}

    def __enter__(self):
        from torch.distributed import distributed_c10d

        self.gathered = self.scattered = 0
        self._inside = 0
        self._patched = []
        names = self.collective_names()
        for family, found in names.items():
            if not found:
                raise RuntimeError(f"torch {torch.__version__} exports no {self.FAMILIES[family]}* function from "
                                   "torch.distributed: find the collective its FSDP2 calls and count that one")
        try:
            for family, found in names.items():
                for name in found:
                    for module in (dist, distributed_c10d):
                        real = getattr(module, name, None)
                        if callable(real):
                            self._patched.append((module, name, real))
                            setattr(module, name, self._counting(real, family))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _counting(self, real, family: str):
        import functools
        import inspect

        position = 0 if family == "gather" else 1  # the gathered output; the scattered input
        try:
            parameter = list(inspect.signature(real).parameters)[position]
        except (TypeError, ValueError, IndexError):
            parameter = None

        @functools.wraps(real)
        def counted(*args, **kwargs):
            if not self._inside:
                measured = args[position] if len(args) > position else kwargs.get(parameter)
                nbytes = _tensor_bytes(measured)
                if family == "gather":
                    self.gathered += nbytes
                else:
                    self.scattered += nbytes
            self._inside += 1
            try:
                return real(*args, **kwargs)
            finally:
                self._inside -= 1

        return counted

    def __exit__(self, *exc):
        for module, name, real in reversed(self._patched):
            setattr(module, name, real)
        self._patched = []


def _tensor_bytes(value) -> int:
    """Bytes of a tensor, or of every tensor in a (nested) list or tuple of them."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


class CountAllReduces:
    """Counts the all-reduces that ``torch.distributed.all_reduce`` runs inside the block: a list of the
    bytes of each message (the tensor all-reduced). The library's tensor-parallel layers call it through
    the module attribute, so replacing the attribute for the block sees every call."""

    def __enter__(self):
        self.calls, self._real = [], dist.all_reduce

        def counting(tensor, *args, **kwargs):
            self.calls.append(tensor.numel() * tensor.element_size())
            return self._real(tensor, *args, **kwargs)

        dist.all_reduce = counting
        return self

    def __exit__(self, *exc):
        dist.all_reduce = self._real


def fsdp(env, device, steps=4, global_batch=8):
    from torch.distributed.fsdp import fully_shard

    config = TransformerConfig(vocab_size=64, d_model=64, n_heads=4, n_decoder_layers=2, d_ff=256, dropout=0.0,
                               max_len=32)
    n, r = env.world_size, env.rank
    batches = [data.repeating_patterns(s, 64, batch_size=global_batch, seq_len=16) for s in range(steps)]
    mine = slice(r * global_batch // n, (r + 1) * global_batch // n)
    torch.manual_seed(0)
    reference = DecoderLM(config).to(device)
    torch.manual_seed(0)
    sharded = DecoderLM(config).to(device)
    n_params = count_parameters(sharded)
    for block in sharded.blocks.layers:
        fully_shard(block)  # each layer: its own unit, gathered just before it runs
    fully_shard(sharded)  # the rest (embedding, final norm, tied output layer)
    ref_step = make_train_step(reference, torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9), lm_loss)
    # the same step as one process: in backward, gradients are reduce-scattered (each rank keeps its shard, averaged)
    step = make_train_step(sharded, torch.optim.SGD(sharded.parameters(), lr=0.1, momentum=0.9), lm_loss)
    loss_gap = 0.0
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        ref_loss = ref_step([(x, y)]).loss
        global_loss = step([(x[mine], y[mine])]).loss.clone()
        dist.all_reduce(global_loss)
        loss_gap = max(loss_gap, abs(global_loss.item() / n - ref_loss.item()))
    weight_gap = max((p.full_tensor() - q).abs().max().item() for p, q in zip(sharded.parameters(), reference.parameters()))
    # memory per rank with AdamW: what this rank holds of weights, gradients and optimizer state (written
    # out, not through make_train_step, because the step must keep its gradients to be counted)
    adam = torch.optim.AdamW(sharded.parameters(), lr=1e-3)
    with CountShardedCollectives() as moved:  # ZeRO-3's traffic of one forward and backward, counted
        lm_loss(sharded, (batches[0][0][mine].to(device), batches[0][1][mine].to(device)))[0].backward()
    if not (moved.gathered and moved.scattered):
        raise RuntimeError(f"FSDP2 moved {moved.gathered} bytes through the all-gathers and {moved.scattered} through "
                           f"the reduce-scatters counted: torch {torch.__version__}'s FSDP2 calls another collective")
    adam.step()
    root_params = n_params - sum(p.numel() for block in sharded.blocks.layers for p in block.parameters())
    held = {"weights": sum(p.to_local().numel() * p.to_local().element_size() for p in sharded.parameters()),
            "gradients": sum(p.grad.to_local().numel() * p.grad.to_local().element_size() for p in sharded.parameters()),
            "optimizer": sum(t.to_local().numel() * t.to_local().element_size() for s in adam.state.values()
                             for t in s.values() if hasattr(t, "to_local") and t.dim() > 0)}
    calc = training_memory(n_params, optimizer="adamw", shard_weights=n, shard_gradients=n, shard_optimizer=n)
    rank_print(f"after {steps} steps: loss difference {loss_gap:.1e}, weight difference {weight_gap:.1e}; holds "
               + ", ".join(f"{k} {v / 1024:.1f} KiB" for k, v in held.items())
               + f" (calculator: {calc.weights / 1024:.1f}, {calc.gradients / 1024:.1f}, {calc.optimizer / 1024:.1f})")
    per_rank = [None] * n
    dist.all_gather_object(per_rank, held)
    report("fsdp", {"loss_gap": loss_gap, "weight_gap": weight_gap, "held_per_rank": per_rank, "n_params": n_params,
                    "calculator": {"weights": calc.weights, "gradients": calc.gradients, "optimizer": calc.optimizer},
                    "unsharded_bytes": n_params * 16, "root_params": root_params, "element_bytes": 4,
                    "all_gathered_bytes": moved.gathered, "reduce_scattered_bytes": moved.scattered})


def mesh(env, device, width=64, rows=16, steps=3):
    """Two strategies on a 2-D device mesh: tensor parallel inside pairs of ranks, sharded data
    parallel (FSDP2) across the pairs; 4 processes."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    # comparing needs whole weights: gathering a weight sharded both ways logs a warning about being slow
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    # the loss below is computed out of place, the case FSDP2's warning about returned views says is safe
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    if env.world_size != 4:
        raise ValueError(f"the 2-D mesh example needs 4 processes (2 data parallel x 2 tensor parallel), "
                         f"not {env.world_size}")
    mesh2d = init_device_mesh(device.type, (2, 2), mesh_dim_names=("dp", "tp"))  # rows: dp groups, columns: tp
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(width, 4 * width), nn.ReLU(), nn.Linear(4 * width, width)).to(device)
    model = copy.deepcopy(reference)
    parallelize_module(model, mesh2d["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh2d["dp"])
    x, y = batch(width, rows, device)
    dp_rank = mesh2d["dp"].get_local_rank()
    mine = slice(dp_rank * rows // 2, (dp_rank + 1) * rows // 2)  # both ranks of a tp pair see the same data
    ref_step = make_train_step(reference, torch.optim.SGD(reference.parameters(), lr=0.1), mse_loss)
    step = make_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), mse_loss)
    for _ in range(steps):
        ref_step([(x, y)])
        step([(x[mine], y[mine])])
    gap = max((p.full_tensor() - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters()))
    local = model[0].weight.to_local().shape
    rank_print(f"mesh coordinate (dp {dp_rank}, tp {mesh2d['tp'].get_local_rank()}): holds W1 {tuple(local)} of "
               f"{tuple(reference[0].weight.shape)}; weights after {steps} steps differ from one process by {gap:.1e}")
    worst = torch.tensor([gap], device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    report("mesh", {"weight_gap": worst.item(), "local_w1": list(local)})


def experts(env, device, *, width=32, hidden=64, n_experts=4, top_k=2, rows=24):
    """Expert parallelism: a top-k MoE layer with its experts split over the ranks (tokens sent to their
    experts' ranks by an all-to-all and back), against the whole layer in one process: outputs, and the
    gradients of the router and of this rank's experts. Also the rows each rank sent, and the bytes the
    formula (``expert_parallel.alltoall_bytes``) gives for an even load."""
    from gpuformer_lib.expert_parallel import MoE, ExpertParallelMoE, alltoall_bytes

    torch.manual_seed(0)  # the same layer and tokens on every rank
    full = MoE(width, hidden, n_experts, top_k).to(device)
    x = torch.randn(rows, width, device=device)
    ref, ref_aux = full(x)
    ref.square().sum().backward()
    ref_grads = {name: p.grad.clone() for name, p in full.named_parameters()}
    full.zero_grad()
    layer = ExpertParallelMoE(full)
    per = rows // env.world_size
    mine = slice(env.rank * per, (env.rank + 1) * per)
    out, aux = layer(x[mine])
    out.square().sum().backward()
    router_grad = layer.router.weight.grad.clone()
    dist.all_reduce(router_grad)  # the router is replicated: its gradient sums over the ranks' tokens
    first = env.rank * layer.per_rank
    gaps = {"output": (out - ref[mine]).abs().max().item(),
            "router grad": (router_grad - ref_grads["router.weight"]).abs().max().item(),
            "expert grads": max((p.grad - ref_grads[f"experts.{first + i}.{name}"]).abs().max().item()
                                for i, expert in enumerate(layer.experts) for name, p in expert.named_parameters())}
    worst = torch.tensor(list(gaps.values()), device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    sent = torch.tensor([layer.last_sent_rows], device=device)
    dist.all_reduce(sent)
    rank_print(f"experts {first}..{first + layer.per_rank - 1} here; sent {layer.last_sent_rows} of "
               f"{per * top_k} (token, expert) rows to the other rank(s); output gap {gaps['output']:.1e}")
    report("experts", {**dict(zip(gaps, worst.tolist())), "sent_rows_total": int(sent.item()),
                       "rows_per_rank": per, "top_k": top_k, "width": width, "world_size": env.world_size,
                       "even_load_bytes_per_rank": alltoall_bytes(per, width, top_k, env.world_size,
                                                                  x.element_size()),
                       "load_balancing_loss": aux.item()})


def two_ranks(env, device):
    """Every two-rank experiment of the chapter in one launch (gpipe with pipeline_memory, pipelining,
    tensor, fsdp, experts): the notebook pays for starting the processes once instead of five times."""
    for command in (gpipe, pipelining, tensor, fsdp, experts):
        command(env, device)
        dist.barrier()


COMMANDS = {f.__name__: f for f in (gpipe, pipelining, tensor, fsdp, mesh, experts, two_ranks)}

if __name__ == "__main__":
    run_command(COMMANDS, "gpuformer_lib.workers.model_parallel")
