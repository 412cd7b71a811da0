"""Pipeline-parallel schedules, simulated: which device computes what, when, and how much it holds.

A pipeline splits the layers into ``p`` stages on ``p`` devices and the batch into ``m`` micro-batches.
A forward ``F`` of micro-batch ``i`` on stage ``s`` needs the forward of ``i`` on stage ``s - 1``; a
backward ``B`` of ``i`` on ``s`` needs the backward of ``i`` on ``s + 1`` (and its own forward). Each device
runs its operations in the order its schedule prescribes, each as soon as its inputs exist; the time it
waits is the *bubble*. This module plays four schedules out with costs ``f`` (forward of one micro-batch
through one device's layers) and ``b`` (its backward), and reports per-device timelines, the step time,
the bubble fraction and the peak number of micro-batches whose activations a device holds at once:

- **GPipe** (Huang et al. 2019, "GPipe: Efficient Training of Giant Neural Networks using Pipeline
  Parallelism"): all forwards, then all backwards. Step ``(m + p - 1)(f + b)``, so the bubble fraction is
  ``(p - 1) / (m + p - 1)`` (the formula of :func:`gpuformer_lib.distributed.gpipe_bubble`), and every
  device holds all ``m`` micro-batches' activations at the turn.
- **1F1B** (PipeDream-Flush; Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM", Sec. 2.2.1): device ``d`` runs ``p - d - 1`` warm-up forwards, then
  alternates one forward and one backward. The same step time as GPipe (the paper notes that the
  bubble is unchanged), bubble time ``(p - 1)(f + b)`` per device, i.e.
  ``(p - 1) / m`` of the ideal time ``m (f + b)``; but at most ``p - d`` micro-batches in flight on device
  ``d`` instead of ``m``.
- **Interleaved 1F1B** (same paper, Sec. 2.2.2): each device holds ``v`` non-adjacent chunks of layers
  (virtual stages ``d, d + p, ..., d + (v - 1) p``), each costing ``f / v`` and ``b / v``. The bubble
  shrinks by ``v``: ``t_pb = (p - 1)(t_f + t_b) / v``, so the bubble time fraction is
  ``(1/v) · (p − 1)/m`` relative to the ideal time, at the price of ``v`` times more point-to-point messages.
  Megatron's order (micro-batches in groups of ``p``, ``(p - d - 1)·2 + (v - 1)·p`` warm-up chunk forwards)
  needs ``m`` divisible by ``p``.
- **ZB-H1** (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", Sec. 2.1): the backward splits into ``B``,
  the gradient with respect to the stage's input (which the previous stage is waiting for), and ``W``, the
  gradient with respect to the weights (which nobody waits for). Device ``d`` keeps 1F1B's order of
  ``F`` and ``B`` but runs each ``W`` ``d`` backwards late, so that the ``B``s travel back faster and the
  delayed ``W``s fill the tail; every device then holds up to ``p`` micro-batches, the peak of 1F1B's
  first device. The paper's bubble sizes: 1F1B ``(p − 1)(T_F + T_B + T_W)``, ZB-H1
  ``(p − 1)(T_F + T_B − T_W)``: a third of 1F1B's when the three costs are equal ("(p-1)/3m" against
  "(p-1)/m" in the authors' comparison table, https://huggingface.co/spaces/sail/pipeline-parallelism-with-controllable-memory). The simulation reproduces it (checked in the tests).

Leaves out: communication time between stages (sends are free and instant), ZB-H2 / ZB-V / DualPipe
(more memory or two chunks per device), the optimizer step and its synchronisation, and memory other
than activations. Activations are counted from the start of a micro-batch's forward until the end of the
operation that frees them: the backward, or ``W`` when the backward is split (the paper frees part at
``B``; counting all until ``W`` is the cautious choice). With ``v`` chunks, one chunk's activations count
``1 / v`` of a micro-batch's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")
_KIND_COLOURS = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868"}


@dataclasses.dataclass(frozen=True)
class Op:
    """One operation on one device: ``kind`` is ``"F"`` (forward), ``"B"`` (backward; only the input
    gradient when the schedule splits it) or ``"W"`` (weight gradient); ``chunk`` is the virtual stage's
    index on the device (0 unless interleaved)."""

    kind: str
    micro_batch: int
    chunk: int
    start: float
    end: float


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A simulated pipeline step."""

    name: str
    stages: int
    """p, the number of devices."""
    micro_batches: int
    """m."""
    virtual: int
    """v, chunks per device (1 unless interleaved)."""
    timelines: tuple[tuple[Op, ...], ...]
    """One tuple of operations per device, in the order it ran them."""
    step_time: float
    """When the last operation ends."""
    busy: tuple[float, ...]
    """Seconds each device computed."""
    peak_in_flight: tuple[float, ...]
    """Per device, the most micro-batches whose activations it held at once (chunks count 1/v)."""

    @property
    def bubble_fraction(self) -> float:
        """Share of the devices' time spent waiting: 1 - sum(busy) / (p * step time)."""
        return 1.0 - sum(self.busy) / (self.stages * self.step_time)

    @property
    def bubble_over_ideal(self) -> float:
        """The bubble relative to the ideal (bubble-free) time, Narayanan et al.'s form: (step - ideal) / ideal."""
        ideal = max(self.busy)
        return (self.step_time - ideal) / ideal


def _check(stages: int, micro_batches: int, f: float, b: float) -> None:
    for name, value in (("stages", stages), ("micro_batches", micro_batches)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    for name, value in (("f", f), ("b", b)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive time, got {value!r}")


def _zb_h1_order(p: int, m: int, d: int) -> list[tuple[str, int, int]]:
    """ZB-H1 on device d: 1F1B's order of F and B, each W delayed by d micro-batches (run d backwards
    after its B), so that every device holds at most p micro-batches, as 1F1B's first device does."""
    delay = d
    warm = min(p - d - 1, m)
    order = [("F", i, 0) for i in range(warm)]
    for k in range(m):
        if warm + k < m:
            order.append(("F", warm + k, 0))
        order.append(("B", k, 0))
        if k - delay >= 0:
            order.append(("W", k - delay, 0))
    order += [("W", i, 0) for i in range(max(m - delay, 0), m)]
    return order


def _fixed_orders(name: str, p: int, m: int, v: int) -> list[list[tuple[str, int, int]]]:
    """Each device's operations (kind, micro-batch, chunk) in the order the schedule runs them."""
    orders = []
    for d in range(p):
        if name == "gpipe":
            orders.append([("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)])
        elif name == "zb-h1":
            orders.append(_zb_h1_order(p, m, d))
        elif name == "1f1b":
            warm = min(p - d - 1, m)
            order = [("F", i, 0) for i in range(warm)]
            for i in range(m - warm):
                order += [("F", warm + i, 0), ("B", i, 0)]
            order += [("B", i, 0) for i in range(m - warm, m)]
            orders.append(order)
        else:  # interleaved, Megatron's order
            total = m * v

            def unit(k: int, forward: bool) -> tuple[str, int, int]:
                group, within = divmod(k, p * v)
                chunk = within // p
                return ("F" if forward else "B", group * p + within % p, chunk if forward else v - 1 - chunk)

            warm = total if m == p else min((p - d - 1) * 2 + (v - 1) * p, total)
            order = [unit(k, True) for k in range(warm)]
            for k in range(total - warm):
                order += [unit(warm + k, True), unit(k, False)]
            order += [unit(k, False) for k in range(total - warm, total)]
            orders.append(order)
    return orders


def simulate(name: str, stages: int, micro_batches: int, f: float = 1.0, b: float = 2.0, *,
             virtual: int = 1, w_share: float = 0.5) -> Schedule:
    """Play one pipeline step of schedule ``name`` (one of :data:`SCHEDULES`) on ``stages`` devices with
    ``micro_batches`` micro-batches; ``f`` and ``b`` are one micro-batch's forward and backward time
    through one device's layers. ``virtual`` is v for ``"interleaved"`` (each chunk costs f/v and b/v;
    needs ``micro_batches`` divisible by ``stages``); ``w_share`` is the part of ``b`` that is the weight
    gradient W for ``"zb-h1"`` (B takes the rest)."""
    _check(stages, micro_batches, f, b)
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; choose one of {SCHEDULES}")
    p, m = stages, micro_batches
    if name == "interleaved":
        if not isinstance(virtual, int) or virtual < 1:
            raise ValueError(f"virtual must be a positive integer, got {virtual!r}")
        if m % p:
            raise ValueError(f"the interleaved schedule needs micro_batches divisible by stages "
                             f"(Megatron's order runs them in groups of p); got m={m}, p={p}")
    elif virtual != 1:
        raise ValueError(f"virtual={virtual} applies only to the 'interleaved' schedule, not {name!r}")
    if name == "zb-h1" and not 0.0 < w_share < 1.0:
        raise ValueError(f"w_share must lie strictly between 0 and 1, got {w_share!r}")
    v = virtual
    cost = {"F": f / v, "B": b / v}
    if name == "zb-h1":
        cost = {"F": f, "B": b * (1.0 - w_share), "W": b * w_share}
    last = p * v - 1  # the last virtual stage

    def stage(d: int, chunk: int) -> int:
        return chunk * p + d

    done: dict[tuple[str, int, int], float] = {}  # (kind, micro-batch, virtual stage) -> end time

    def ready_at(kind: str, i: int, s: int) -> float | None:
        """When the inputs of (kind, i, s) exist, or None if they are not yet scheduled."""
        if kind == "F":
            return 0.0 if s == 0 else done.get(("F", i, s - 1))
        if kind == "B":
            dep = ("F", i, s) if s == last else ("B", i, s + 1)
            return done.get(dep)
        return done.get(("B", i, s))  # W

    orders = _fixed_orders(name, p, m, v)
    position = [0] * p
    free = [0.0] * p
    timelines: list[list[Op]] = [[] for _ in range(p)]
    left = sum(len(order) for order in orders)
    while left:
        progressed = False
        for d in range(p):  # each device runs its next operation as soon as its inputs exist
            while position[d] < len(orders[d]):
                kind, i, chunk = orders[d][position[d]]
                at = ready_at(kind, i, stage(d, chunk))
                if at is None:
                    break
                start = max(free[d], at)
                free[d] = start + cost[kind]
                done[(kind, i, stage(d, chunk))] = free[d]
                timelines[d].append(Op(kind, i, chunk, start, free[d]))
                position[d] += 1
                left -= 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"schedule {name!r} deadlocked: every device waits for another")

    frees = "W" if name == "zb-h1" else "B"
    peaks = []
    for ops in timelines:
        events = sorted([(op.start, 1, 1.0 / v) for op in ops if op.kind == "F"]
                        + [(op.end, 0, -1.0 / v) for op in ops if op.kind == frees])  # frees first at ties
        level = peak = 0.0
        for _, _, delta in events:
            level += delta
            peak = max(peak, level)
        peaks.append(round(peak, 9))
    busy = tuple(sum(op.end - op.start for op in ops) for ops in timelines)
    return Schedule(name=name, stages=p, micro_batches=m, virtual=v,
                    timelines=tuple(tuple(ops) for ops in timelines),
                    step_time=max(free), busy=busy, peak_in_flight=tuple(peaks))


def dependency_violations(schedule: Schedule) -> list[str]:
    """Every broken dependency or overlap in ``schedule`` (empty if it is valid): a forward before the
    previous stage's forward of the same micro-batch, a backward before the next stage's backward (or,
    on the last stage, before its own forward), a W before its B, two operations overlapping on a device,
    or an operation missing or repeated."""
    p, v, m = schedule.stages, schedule.virtual, schedule.micro_batches
    last = p * v - 1
    end: dict[tuple[str, int, int], float] = {}
    start: dict[tuple[str, int, int], float] = {}
    problems = []
    for d, ops in enumerate(schedule.timelines):
        for a, b in zip(ops, ops[1:]):
            if b.start < a.end - 1e-12:
                problems.append(f"device {d}: {b} starts before {a} ends")
        for op in ops:
            key = (op.kind, op.micro_batch, op.chunk * p + d)
            if key in end:
                problems.append(f"{key} runs twice")
            end[key], start[key] = op.end, op.start
    kinds = ("F", "B", "W") if schedule.name == "zb-h1" else ("F", "B")
    for kind in kinds:
        for i in range(m):
            for s in range(p * v):
                if (kind, i, s) not in end:
                    problems.append(f"{(kind, i, s)} never runs")
    for (kind, i, s), t in start.items():
        dep = None
        if kind == "F" and s > 0:
            dep = ("F", i, s - 1)
        elif kind == "B":
            dep = ("F", i, s) if s == last else ("B", i, s + 1)
        elif kind == "W":
            dep = ("B", i, s)
        if dep is not None and (dep not in end or end[dep] > t + 1e-12):
            problems.append(f"{(kind, i, s)} starts at {t} before {dep} ends")
    return problems


def bubble_formula(name: str, stages: int, micro_batches: int, f: float = 1.0, b: float = 2.0, *,
                   virtual: int = 1, w_share: float = 0.5) -> float:
    """The papers' bubble time per device (the step time minus the ideal m·(f + b)):
    GPipe and 1F1B ``(p - 1)(f + b)``; interleaved ``(p - 1)(f + b) / v``; ZB-H1 ``(p - 1)(f + B - W)``
    with ``B = (1 - w_share) b`` and ``W = w_share b`` (Qi et al. 2023, whose T_B and T_W are our B and W)."""
    _check(stages, micro_batches, f, b)
    p = stages
    if name in ("gpipe", "1f1b"):
        return (p - 1) * (f + b)
    if name == "interleaved":
        return (p - 1) * (f + b) / virtual
    if name == "zb-h1":
        return (p - 1) * (f + b * (1 - w_share) - b * w_share)
    raise ValueError(f"unknown schedule {name!r}; choose one of {SCHEDULES}")


def plot_timelines(schedules: Sequence[Schedule], axes=None):
    """One panel per schedule, one row per device: forwards, backwards (B) and weight gradients (W) as
    coloured bars labelled with their micro-batch, the gaps are the bubble. Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.transforms import offset_copy

    schedules = list(schedules)
    if not schedules:
        raise ValueError("plot_timelines needs at least one schedule")
    if axes is None:
        fig, axes = plt.subplots(len(schedules), 1, figsize=(6, 1.6 + 1.3 * sum(s.stages for s in schedules) / 2),
                                 squeeze=False)
        axes = axes[:, 0]
    fig = axes[0].figure
    horizon = max(s.step_time for s in schedules)
    for ax, s in zip(axes, schedules):
        for d, ops in enumerate(s.timelines):
            groups: dict[tuple[str, int], list[tuple[float, float]]] = {}
            for op in ops:  # one bar collection per kind and chunk: fewer artists, a faster figure
                groups.setdefault((op.kind, op.chunk), []).append((op.start, op.end - op.start))
            for (kind, chunk), spans in groups.items():
                shade = 1.0 - 0.45 * chunk / max(s.virtual - 1, 1)
                ax.broken_barh(spans, (d - 0.4, 0.8), facecolors=_KIND_COLOURS[kind], alpha=shade,
                               edgecolor="white", linewidth=0.5)
            for op in ops:
                if op.end - op.start >= 0.05 * horizon:  # a number only where a phone can read it
                    ax.text((op.start + op.end) / 2, d, str(op.micro_batch), ha="center", va="center",
                            fontsize=6, color="white")
        ax.set_yticks(range(s.stages), [f"device {d}" for d in range(s.stages)])
        ax.invert_yaxis()
        ax.set_xlim(0, horizon)
        label = f"{s.name}" + (f", v={s.virtual}" if s.virtual > 1 else "")
        ax.set_title(f"{label}: step {s.step_time:g}, bubble {s.bubble_fraction:.0%}, "
                     f"peak in flight {max(s.peak_in_flight):g} micro-batches", fontsize=9)
    axes[-1].set_xlabel("time (units of one forward through one device's layers)")
    # the key under the last panel's axis label (an offset of 4 lines of text), where it covers no title
    under = offset_copy(axes[-1].transAxes, fig=fig, y=-4 * plt.rcParams["font.size"], units="points")
    axes[-1].legend(handles=[Patch(color=c, label=k) for k, c in _KIND_COLOURS.items()], loc="upper center",
                    bbox_to_anchor=(0.5, 0), bbox_transform=under, ncol=3, frameon=False)
    fig.tight_layout()
    return fig
