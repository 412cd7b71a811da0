"""Mixture of experts and expert parallelism at the course's scale: a top-k routed MoE layer, and the same layer
with its experts split over ranks, tokens sent to their experts' ranks by an all-to-all and back by another.

A mixture-of-experts feed-forward layer (Shazeer et al., 2017; Switch Transformer, Fedus et al., 2022) replaces
one MLP by E of them and a router: each token goes to the k experts whose router logits are highest, and the
layer's output is the experts' outputs weighted by the softmax of those k logits (the gates),

    y_t = Σ_{e in topk(r_t)} g_{t,e} · MLP_e(x_t),   g_t = softmax(r_t restricted to its top k),   r_t = W_r x_t.

Each token pays for k experts' FLOPs while the layer holds E experts' parameters. **Expert parallelism** puts E/P
experts on each of P ranks; every rank routes its own tokens, and an all-to-all sends each token to the rank
holding its expert (each rank first tells every other how many tokens it will send, a small all-to-all of
counts), the rank runs its experts on what it received, and a second all-to-all returns the outputs to the
tokens' ranks. Per layer and direction each rank sends about (P - 1)/P of its k·T·C token values.

Contents: :class:`MoE` (one process: every expert here), :class:`ExpertParallelMoE` (this rank's experts,
the rest reached through :func:`all_to_all`, ``dist.all_to_all_single`` with a backward),
:func:`load_balancing_loss` (Switch Transformer's auxiliary loss, E · Σ_e f_e · p_e, 1.0 when the load is
even, at most E/k), :func:`alltoall_bytes` (what the two all-to-alls move), checked against one process in
``workers.model_parallel experts`` and ``tests/test_expert_parallel.py``.

Leaves out: capacity limits and dropped tokens (every token reaches its experts here), shared experts,
expert-choice routing, and grouped GEMMs (each expert runs as its own matrix products).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _check_sizes(**sizes: int) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")


class Expert(nn.Module):
    """One expert: the course's feed-forward block, W2 gelu(W1 x)."""

    def __init__(self, d_model: int, d_hidden: int):
        super().__init__()
        self.linear1, self.linear2 = nn.Linear(d_model, d_hidden), nn.Linear(d_hidden, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(F.gelu(self.linear1(x)))


def route(router_logits: Tensor, top_k: int) -> tuple[Tensor, Tensor]:
    """(gates, experts) of each token: the ``top_k`` highest router logits' experts (N, k) and their softmax
    over those k (N, k), computed in float32 (float64 for float64 logits)."""
    work = torch.float64 if router_logits.dtype == torch.float64 else torch.float32
    top, experts = router_logits.to(work).topk(top_k, dim=-1)
    return top.softmax(dim=-1), experts


def load_balancing_loss(router_logits: Tensor, experts: Tensor, n_experts: int) -> Tensor:
    """Switch Transformer's auxiliary loss, E · Σ_e f_e · p_e: f_e the share of routing choices that went to
    expert e (no gradient), p_e the mean router probability of e (with gradient). 1.0 for an even load; at
    most E/k with top-k routing (no expert takes more than 1/k of the choices), E for top-1, when every token
    picks the same experts with certainty."""
    probs = router_logits.float().softmax(dim=-1).mean(dim=0)  # (E,)
    share = torch.bincount(experts.flatten(), minlength=n_experts).float() / experts.numel()
    return n_experts * (share * probs).sum()


class MoE(nn.Module):
    """A top-k routed mixture of ``n_experts`` feed-forward experts, all in this process.

    ``forward(x)`` takes (..., C) and returns (y, aux): y of x's shape, aux the load-balancing loss. Tokens are
    grouped by expert (a sort), each expert runs once on its tokens, and the outputs are scattered back
    weighted by the gates. ``last_load`` holds how many token choices each expert received in the last call."""

    def __init__(self, d_model: int, d_hidden: int, n_experts: int, top_k: int = 2):
        super().__init__()
        _check_sizes(d_model=d_model, d_hidden=d_hidden, n_experts=n_experts, top_k=top_k)
        if top_k > n_experts:
            raise ValueError(f"top_k={top_k} cannot exceed n_experts={n_experts}")
        self.n_experts, self.top_k = n_experts, top_k
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(Expert(d_model, d_hidden) for _ in range(n_experts))
        self.last_load: Tensor | None = None

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        tokens = x.reshape(-1, x.shape[-1])  # (N, C)
        logits = self.router(tokens)  # (N, E)
        gates, experts = route(logits, self.top_k)  # (N, k) each
        out = torch.zeros_like(tokens)
        flat = experts.flatten()  # (N k,): token t's j-th choice at t * k + j
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=self.n_experts)
        self.last_load = counts.detach()
        token_of = order // self.top_k
        start = 0
        for e, count in enumerate(counts.tolist()):
            if count:
                rows = token_of[start:start + count]
                y = self.experts[e](tokens[rows])
                out = out.index_add(0, rows, y * gates.flatten()[order[start:start + count], None].to(y.dtype))
            start += count
        return out.reshape(x.shape), load_balancing_loss(logits, experts, self.n_experts)


class _AllToAll(torch.autograd.Function):
    """``dist.all_to_all_single`` with a gradient: the backward of an all-to-all is the all-to-all back, with the
    send and receive splits swapped (each row's gradient returns to the rank the row came from)."""

    @staticmethod
    def forward(ctx, rows: Tensor, recv_split: list[int], send_split: list[int], group) -> Tensor:
        import torch.distributed as dist

        ctx.splits, ctx.group = (recv_split, send_split), group
        out = rows.new_empty(sum(recv_split), *rows.shape[1:])
        dist.all_to_all_single(out, rows.contiguous(), recv_split, send_split, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        import torch.distributed as dist

        recv_split, send_split = ctx.splits
        out = grad.new_empty(sum(send_split), *grad.shape[1:])
        dist.all_to_all_single(out, grad.contiguous(), send_split, recv_split, group=ctx.group)
        return out, None, None, None


def all_to_all(rows: Tensor, recv_split: list[int], send_split: list[int], group=None) -> Tensor:
    """Send ``rows`` (R, ...) to the ranks, ``send_split[r]`` consecutive rows to rank r, and receive
    ``recv_split[r]`` rows from each rank r, in rank order; differentiable (:class:`_AllToAll`)."""
    return _AllToAll.apply(rows, list(recv_split), list(send_split), group)


class ExpertParallelMoE(nn.Module):
    """:class:`MoE` with its experts split over the ranks of ``group``: rank r holds experts
    [r·E/P, (r+1)·E/P). Built from a full :class:`MoE` (the same on every rank), it keeps the router and its own
    experts. ``forward(x)`` routes this rank's tokens, sends each (token, choice) to the rank of its expert with
    ``all_to_all_single`` (counts first), runs its experts on what it received, sends the outputs back and
    combines them with the gates: the same numbers as the full MoE on this rank's tokens, gradients included
    (:func:`all_to_all`'s backward carries them back). ``last_sent_rows`` counts the
    (token, choice) rows this rank sent to other ranks in the last call."""

    def __init__(self, full: MoE, group=None):
        super().__init__()
        import torch.distributed as dist

        self.group = group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        if full.n_experts % self.world:
            raise ValueError(f"{full.n_experts} experts do not split evenly over {self.world} ranks")
        self.n_experts, self.top_k = full.n_experts, full.top_k
        self.per_rank = full.n_experts // self.world
        first = self.rank * self.per_rank
        self.router = full.router
        self.experts = nn.ModuleList(full.experts[first:first + self.per_rank])
        self.last_sent_rows = 0

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        import torch.distributed as dist

        tokens = x.reshape(-1, x.shape[-1])  # (N, C)
        logits = self.router(tokens)
        gates, experts = route(logits, self.top_k)
        flat = experts.flatten()
        order = flat.argsort(stable=True)  # by expert, hence by destination rank
        token_of = order // self.top_k
        send_counts = torch.bincount(flat // self.per_rank, minlength=self.world)  # rows for each rank
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)  # how many rows each rank sends here
        send_split, recv_split = send_counts.tolist(), recv_counts.tolist()
        self.last_sent_rows = sum(n for r, n in enumerate(send_split) if r != self.rank)
        # the rows' values, and their local expert ids, to the experts' ranks
        rows = all_to_all(tokens[token_of], recv_split, send_split, self.group)
        local_ids = torch.empty(sum(recv_split), dtype=flat.dtype, device=flat.device)
        dist.all_to_all_single(local_ids, flat[order], recv_split, send_split, group=self.group)
        local_ids = local_ids - self.rank * self.per_rank
        outputs = rows.new_zeros(rows.shape)
        for e in range(self.per_rank):
            mine = (local_ids == e).nonzero().squeeze(1)
            if mine.numel():
                outputs = outputs.index_add(0, mine, self.experts[e](rows[mine]))
        back = all_to_all(outputs, send_split, recv_split, self.group)  # in the order they were sent
        out = torch.zeros_like(tokens).index_add(0, token_of, back * gates.flatten()[order, None].to(back.dtype))
        return out.reshape(x.shape), load_balancing_loss(logits, experts, self.n_experts)


def alltoall_bytes(tokens: int, d_model: int, top_k: int, world: int, itemsize: int) -> float:
    """Bytes one rank sends in one MoE layer's forward (dispatch and return) when its ``tokens`` choose experts
    uniformly over ``world`` ranks: 2 · k · tokens · C · itemsize · (P - 1)/P (the rows for its own rank stay)."""
    _check_sizes(tokens=tokens, d_model=d_model, top_k=top_k, world=world, itemsize=itemsize)
    return 2 * top_k * tokens * d_model * itemsize * (world - 1) / world
