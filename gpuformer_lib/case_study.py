"""The case-study harness: one task trained under a list of cumulative accelerations, and the acceleration
table it produces, with quality kept.

A case study (chapters 13-15) follows the first seed's five steps (its §4.2.1: assess the resources,
optimise the model and the data, choose a parallel strategy, monitor, check that quality held) and ends
with a table of measured speedups (its §4.2.2). This module makes that table honest by construction:

- every row trains the same :class:`Task` from scratch, to the same :class:`Budget` (tokens, or seconds),
  with the same learning-rate schedule (a function of the budget's progress, not of the step count, so a
  row whose batches differ still sees the same schedule over the same data);
- row ``i`` applies accelerations ``1..i`` (:class:`Acceleration`, each a function of the previous
  :class:`Setting`), so the table reads as a ladder; an acceleration the device cannot run is skipped
  with its reason, and the next rows go without it;
- the clock runs only while training (evaluation is outside it) and stops after waiting for the device;
- quality is measured the same way for every row (float32, evaluation mode), at evenly spaced points, so
  *time to quality* (the training seconds until the baseline's final quality, within the tolerance, is
  first reached) is read off the curve;
- speedup is (time before) / (time after): the baseline's time to quality over the row's. A row whose
  final quality fell outside ``Task.tolerance`` of the baseline's gets no speedup; the table says why.
  The seed's own example calls the ratio "time after / time before" (its §4.2.2), which would make an
  acceleration look like a slowdown.

Several seeds per row give the quality's spread. Each row is trained once per seed; its speed is then timed
beside every other row's in interleaved rounds (:func:`interleaved_row_timings`), and its time to quality is
its tokens to quality at that speed: the rows' trainings run minutes apart on a machine whose load drifts,
the rounds run the rows within a second of each other, and their spread says when a gap is real.

The accelerations of :mod:`gpuformer_lib.speed` (precision, TF32, fused attention, compile, the fused
optimizer) come ready-made from :func:`standard_accelerations`, in speed's order; a task adds its own
(token-budget batches, say) with :func:`option_step`.

:func:`row_step` builds a row's model, optimizer and step as :func:`train_run` trains them (to profile the
table's own step); :meth:`AccelerationTable.summary` and :meth:`AccelerationTable.gain` put the verdicts in
words chosen from the values by one rule, :func:`ratio_words`.

Leaves out: several devices (a data-parallel run is a different program: ``distributed`` and its workers),
decoding speed (``seq2seq_decoding``), and the task-specific quality metrics (BLEU, accuracy), which a
task computes after the table from the models the harness can keep.
"""

from __future__ import annotations

import dataclasses
import html
import math
import numbers
import statistics
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from torch import nn

from gpuformer_lib import bench, gpu, speed
from gpuformer_lib.profiles import DeviceProfile, low_precision_dtype


class NonFiniteQualityError(FloatingPointError):
    """A run's loss or quality became NaN or infinite: its row would be a silent wrong answer."""


# --------------------------------------------------------------------------- what a row is built with


@dataclasses.dataclass(frozen=True)
class Setting:
    """Everything a row is built with: the speed plan (how the model trains) and the task's own options
    (how its data is batched, say). Accelerations return a changed copy; nothing is mutated."""

    plan: speed.SpeedPlan = speed.SpeedPlan(dtype=None, tf32=False, fused_attention=False, check_token_ids=True)
    """The default is the plain baseline: float32, strict matrix products, explicit attention, ids checked."""
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Task-specific choices, read by the task with :meth:`option`."""

    def __post_init__(self):
        if not isinstance(self.plan, speed.SpeedPlan):
            raise TypeError(f"plan must be a speed.SpeedPlan, got {type(self.plan).__name__}")
        object.__setattr__(self, "options", dict(self.options))

    def option(self, name: str, default: Any = None) -> Any:
        return self.options.get(name, default)

    def with_plan(self, **fields: Any) -> "Setting":
        return dataclasses.replace(self, plan=dataclasses.replace(self.plan, **fields))

    def with_options(self, **options: Any) -> "Setting":
        return dataclasses.replace(self, options={**self.options, **options})


@dataclasses.dataclass(frozen=True)
class Acceleration:
    """One step of the ladder: a name for the table, what it changes, and when a device cannot run it."""

    name: str
    apply: Callable[[Setting], Setting]
    why: str = ""
    """One line: what it removes (padding, launches, bytes moved, ...)."""
    skip_reason: Callable[[DeviceProfile, torch.device], str | None] = lambda profile, device: None
    """Why ``profile`` cannot run it (None: it can)."""


def plan_step(name: str, why: str = "", *, skip_reason=None, **plan_fields: Any) -> Acceleration:
    """An acceleration that changes fields of the speed plan, e.g. ``plan_step('fused AdamW', fused_optimizer=True)``."""
    speed.SpeedPlan(**{**dataclasses.asdict(speed.SpeedPlan()), **plan_fields})  # unknown or bad fields fail here
    return Acceleration(name, lambda s: s.with_plan(**plan_fields), why,
                        skip_reason or (lambda profile, device: None))


def option_step(name: str, why: str = "", *, skip_reason=None, **options: Any) -> Acceleration:
    """An acceleration that sets task options, e.g. ``option_step('token-budget batches', batching='budget')``."""
    return Acceleration(name, lambda s: s.with_options(**options), why, skip_reason or (lambda profile, device: None))


def _no_tf32(profile: DeviceProfile, device: torch.device) -> str | None:
    return None if profile.tf32 else "TF32 needs an NVIDIA GPU of compute capability 8.0 or newer"


def _no_low_precision(profile: DeviceProfile, device: torch.device) -> str | None:
    if low_precision_dtype(profile) is None:
        return "no native 16-bit arithmetic on this device: autocast would only add casts"
    return None


def _compile_on_gpu_only(profile: DeviceProfile, device: torch.device) -> str | None:
    if device.type != "cuda":
        return ("run on a GPU only: the CPU preset's short budget leaves no room for compiling the forward and "
                "backward passes (chapter 10's ladder times torch.compile on this device)")
    return None


def standard_accelerations(profile: DeviceProfile) -> list[Acceleration]:
    """The speed techniques of :mod:`gpuformer_lib.speed`, in its order: 16-bit autocast (bf16, or fp16 with a
    gradient scaler on a T4), TF32 for what stays in float32, fused attention with the per-step id check
    off, ``torch.compile`` (GPU only here), the fused AdamW step. CUDA graphs are left out: a task whose
    batch shapes vary (token budgets) would record a graph per shape."""
    dtype = low_precision_dtype(profile)
    name = {torch.bfloat16: "bf16 autocast", torch.float16: "fp16 autocast + loss scaling"}.get(dtype, "16-bit autocast")
    return [
        plan_step(name, "matrix products on tensor cores, half the bytes per activation",
                  skip_reason=_no_low_precision, dtype=dtype),
        plan_step("TF32 matmuls", "what stays in float32 multiplies on tensor cores", skip_reason=_no_tf32, tf32=True),
        plan_step("fused attention, no id check", "one attention kernel without the (T, T) scores; no host sync "
                  "for the token-id range check", fused_attention=True, check_token_ids=False),
        plan_step("torch.compile", "element-wise chains fused into generated kernels, fewer launches",
                  skip_reason=_compile_on_gpu_only, compile=True),
        plan_step("fused AdamW", "the optimizer's update as one kernel per group of tensors", fused_optimizer=True),
    ]


# --------------------------------------------------------------------------- the task


@dataclasses.dataclass(frozen=True)
class Budget:
    """How much training a row gets: ``tokens`` (what the task counts: tokens or samples) or ``seconds``
    of training (evaluation not counted). A token budget gives every row the same data, so quality is
    comparable and time differs; a time budget gives every row the same time, so quality differs."""

    tokens: int | None = None
    seconds: float | None = None

    def __post_init__(self):
        if (self.tokens is None) == (self.seconds is None):
            raise ValueError(f"give exactly one of tokens and seconds, got tokens={self.tokens!r}, seconds={self.seconds!r}")
        if self.tokens is not None and (isinstance(self.tokens, bool) or not isinstance(self.tokens, numbers.Integral)
                                        or self.tokens < 1):
            raise ValueError(f"tokens must be an int >= 1, got {self.tokens!r}")
        if self.seconds is not None and not (isinstance(self.seconds, numbers.Real) and 0 < self.seconds < math.inf):
            raise ValueError(f"seconds must be a positive, finite number, got {self.seconds!r}")

    def progress(self, tokens: int, seconds: float) -> float:
        """How far a run is through its budget, 0 to 1 (the learning-rate schedule's clock)."""
        done = tokens / self.tokens if self.tokens is not None else seconds / self.seconds
        return min(1.0, done)


@dataclasses.dataclass(frozen=True)
class Task:
    """One training task, as the harness needs it. Every callable gets the row's :class:`Setting`."""

    name: str
    build_model: Callable[[Setting], nn.Module]
    """A fresh float32 model on the CPU (the harness seeds before the call); built with the plan's
    construction-time choices (``speed.model_config``)."""
    batches: Callable[[Setting, int, int], Iterable[Any]]
    """``batches(setting, seed, epoch)``: one epoch of training batches on the host (each with ``.to``)."""
    loss_fn: Callable[[nn.Module, Any], tuple[torch.Tensor, Any]]
    """``loss_fn(model, batch)`` -> (mean loss, count), as ``speed.make_train_step`` takes it."""
    count: Callable[[Any], int]
    """Real tokens (or samples) in a host batch, counted on the host: no read-back from the device."""
    evaluate: Callable[[nn.Module, torch.device], float]
    """Quality on held-out data (the harness calls it in eval mode, without gradients, in float32)."""
    quality_name: str
    higher_is_better: bool
    tolerance: float
    """How far (in the quality's units) a row may fall from the baseline's quality and still count as kept."""
    budget: Budget
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup: float = 0.1
    """Share of the budget spent warming the learning rate up linearly; then cosine decay to 10 %."""
    grad_clip: float | None = 1.0
    evaluations: int = 4
    """Evaluations spread evenly over the budget (the last at its end): the points of the quality curve."""
    flops: Callable[[Any], float] | None = None
    """Model FLOPs of one training step on a host batch (for MFU); None: no MFU column."""
    unit: str = "tokens"

    def __post_init__(self):
        if not isinstance(self.budget, Budget):
            raise TypeError(f"budget must be a case_study.Budget, got {type(self.budget).__name__}")
        if not (isinstance(self.tolerance, numbers.Real) and 0 <= self.tolerance < math.inf):
            raise ValueError(f"tolerance must be a finite number >= 0, got {self.tolerance!r}")
        if not (isinstance(self.lr, numbers.Real) and self.lr > 0) or not 0 <= self.warmup < 1:
            raise ValueError(f"need lr > 0 and 0 <= warmup < 1, got lr={self.lr!r}, warmup={self.warmup!r}")
        if isinstance(self.evaluations, bool) or not isinstance(self.evaluations, int) or self.evaluations < 1:
            raise ValueError(f"evaluations must be an int >= 1, got {self.evaluations!r}")

    def lr_at(self, progress: float) -> float:
        """Linear warm-up over the first ``warmup`` of the budget, then cosine decay to 10 % of ``lr``."""
        if progress < self.warmup:
            return self.lr * max(progress / self.warmup, 0.01)
        rest = (progress - self.warmup) / (1 - self.warmup)
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(rest, 1.0))))

    def meets(self, quality: float, target: float) -> bool:
        return quality >= target if self.higher_is_better else quality <= target


# --------------------------------------------------------------------------- one run


@dataclasses.dataclass(frozen=True)
class Run:
    """One seed of one row: what it trained and how long it took."""

    seed: int
    steps: int
    tokens: int
    seconds: float
    """Training seconds (the clock stops for evaluation), waiting for the device at each stop."""
    first_step_seconds: float
    """The first step alone: compilation, allocator warm-up and first-call costs land here."""
    curve: tuple[tuple[int, float, float], ...]
    """(tokens, training seconds, quality) at each evaluation."""
    peak_bytes: int | None
    """Peak allocated device memory (CUDA only; None elsewhere)."""
    flops: float | None

    @property
    def quality(self) -> float:
        return self.curve[-1][2]

    @property
    def step_seconds(self) -> float:
        """Steady-state seconds per step: the first step left out when there are others."""
        if self.steps < 2:
            return self.seconds / max(self.steps, 1)
        return (self.seconds - self.first_step_seconds) / (self.steps - 1)

    def time_to(self, target: float, higher_is_better: bool) -> float | None:
        """Training seconds until ``target`` was first met (None: never within the budget). Between the last
        evaluation that missed it and the first that met it, the time is interpolated linearly in quality
        (the first evaluation's time if that one met it already): evaluations are a few points of a curve,
        and reading only them would round every time up to the next evaluation."""
        return _first_reach(self.curve, 1, target, higher_is_better)

    def tokens_to(self, target: float, higher_is_better: bool) -> float | None:
        """Tokens (what the task counts) trained until ``target`` was first met, interpolated as :meth:`time_to`
        interpolates seconds; None: never within the budget."""
        return _first_reach(self.curve, 0, target, higher_is_better)


def _first_reach(curve, index: int, target: float, higher_is_better: bool) -> float | None:
    """Entry ``index`` (0 tokens, 1 seconds) of the curve where quality first met ``target``, interpolated
    linearly in quality from the last evaluation that missed it; None if no evaluation met it."""
    before = None  # (entry, quality) of the last evaluation that missed the target
    for point in curve:
        at, quality = point[index], point[2]
        met = (quality >= target) if higher_is_better else (quality <= target)
        if met:
            if before is None or quality == before[1]:
                return at
            share = (target - before[1]) / (quality - before[1])
            return before[0] + min(max(share, 0.0), 1.0) * (at - before[0])
        before = (at, quality)
    return None


def _lr(optimizer: torch.optim.Optimizer, value: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = value


@dataclasses.dataclass(frozen=True)
class RowStep:
    """What a row trains with: the model (uncompiled: evaluate this one), its optimizer, and the training step
    (``speed.make_train_step``'s, compiled, autocast, scaled as the row's plan says)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    step: Callable[[list], Any]


def row_step(task: Task, setting: Setting, device: torch.device | str, seed: int = 0) -> RowStep:
    """Build a row's model, optimizer and training step exactly as :func:`train_run` trains them (seeded
    with ``seed``; AdamW with the task's parameter groups; the plan applied), so that a profile of this
    step is a profile of the table's. The learning rate is the task's peak; :func:`train_run` schedules it."""
    from gpuformer_lib.device import seed_everything
    from gpuformer_lib.train import parameter_groups

    device = torch.device(device)
    plan = setting.plan
    if plan.cuda_graphs:
        raise ValueError("the case-study harness does not run CUDA graphs: varying batch shapes would record a graph "
                         "per shape; drop cuda_graphs from the plan")
    seed_everything(seed)
    model = task.build_model(setting).to(device)
    optimizer = speed.make_adamw(parameter_groups(model, task.weight_decay), plan, lr=task.lr)
    trained = speed.apply_plan(model, plan, device)
    on_cuda = device.type == "cuda"
    step = speed.make_train_step(trained, optimizer, task.loss_fn, dtype=plan.dtype,
                                 scaler=speed.grad_scaler(plan, device), tf32=plan.tf32 if on_cuda else None,
                                 normalize_by="tokens", grad_clip=task.grad_clip)
    return RowStep(model, optimizer, step)


def interleaved_rates(task: Task, before: Setting, after: Setting, device: torch.device | str, *, steps: int = 6,
                      seed: int = 0, repeats: int = 5) -> tuple[float, float]:
    """Real tokens (``task.count``) per second of the training step under ``before`` and under ``after``: the
    two timed by :func:`interleaved_row_timings` (``steps`` steps a call, ``repeats`` interleaved rounds, at
    least 5, after a warm-up call each), each rate the median round's. The table's rows run a minute apart; this
    measurement runs both within a second of each other."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    timings = interleaved_row_timings(task, {"before": before, "after": after}, device, k=steps, seed=seed,
                                      repeats=repeats, max_repeats=repeats)
    return 1 / timings["before"].median, 1 / timings["after"].median


def interleaved_row_timings(task: Task, settings: Mapping[str, Setting], device: torch.device | str, *, k: int = 4,
                            seed: int = 0, repeats: int = 7, max_repeats: int = 15,
                            max_seconds: float | None = None) -> dict[str, bench.Timing]:
    """Seconds per real token (``task.count``) of each setting's training step, by name, all timed in the same
    interleaved rounds (:func:`bench.time_interleaved`: one untimed call of each, then rounds in which each is
    timed once, the order reversed every other round; more rounds, up to ``max_repeats``, while one is noisy).

    A call trains ``k`` steps on ``k`` batches spread evenly over the setting's own first epoch, copied to the
    device inside the call as :func:`train_run` copies them, with the model, optimizer and step built as the
    row builds them (:func:`row_step`). Its time over the real tokens of those batches is one entry of the
    :class:`bench.Timing`: rows whose batches differ (token budgets, packing) compare per real token, and a
    :class:`bench.Comparison` of two rows' timings is their throughput ratio, round by round."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    if len(settings) < 2:
        raise ValueError(f"need at least two settings to interleave, got {list(settings)}")
    device = torch.device(device)
    on_cuda = device.type == "cuda"
    calls, tokens = {}, {}
    for name, setting in settings.items():
        row = row_step(task, setting, device, seed)
        epoch = list(task.batches(setting, seed, 0))
        if not epoch:
            raise ValueError(f"task {task.name!r}: batches(setting, seed={seed}, epoch=0) yielded nothing for {name!r}")
        picks = sorted({round(i * (len(epoch) - 1) / max(k - 1, 1)) for i in range(k)})
        batches = [epoch[i] for i in picks] * (k // len(picks)) + [epoch[i] for i in picks][:k % len(picks)]
        tokens[name] = sum(task.count(b) for b in batches)
        if tokens[name] < 1:
            raise ValueError(f"{name!r}: the timed batches hold no real {task.unit}")

        def call(row=row, batches=batches):
            for b in batches:
                row.step([b.to(device, non_blocking=on_cuda) if hasattr(b, "to") else b])

        calls[name] = call
    timings = bench.time_interleaved(calls, device=device, warmup=1, repeats=repeats,
                                     max_repeats=max(max_repeats, repeats), max_seconds=max_seconds)
    return {name: bench.Timing(tuple(t / tokens[name] for t in timing.times), timing.warmup, timing.number)
            for name, timing in timings.items()}


def fixing_row(category: str, row_names: Sequence[str], fixes: Sequence[tuple[str, Sequence[str]]], *,
               strict: bool = True) -> str | None:
    """The first table row (by name) whose acceleration addresses a profile ``category``: ``fixes`` maps each
    category (``bench.time_by_category``'s names) to words of the row names that address it, in order of
    preference. None when no row does; an unknown category raises (``strict``) or gives None."""
    for name, words in fixes:
        if name == category:
            for word in words:
                for row in row_names:
                    if word.lower() in row.lower():
                        return row
            return None
    if strict:
        raise ValueError(f"unknown profile category {category!r}; known: {[n for n, _ in fixes]}")
    return None


def ratio_words(ratio: float, *, margin: float = 1.1, above: str = "faster", below: str = "slower",
                about: str = "about as fast") -> str:
    """The word a ratio (before / after, or any "how many times") earns: ``above`` when it is at least
    ``margin``, ``below`` when at most 1 / ``margin``, ``about`` in between (the noise of one timing on a
    shared machine). One rule for every verdict of a case study, so the page's words and its tests agree."""
    if not (isinstance(margin, numbers.Real) and margin >= 1):
        raise ValueError(f"margin is a ratio of at least 1, got {margin!r}")
    if not (isinstance(ratio, numbers.Real) and ratio > 0 and math.isfinite(ratio)):
        raise ValueError(f"ratio must be a positive, finite number, got {ratio!r}")
    if ratio >= margin:
        return above
    if ratio <= 1 / margin:
        return below
    return about


def train_run(task: Task, setting: Setting, device: torch.device | str, profile: DeviceProfile, seed: int = 0, *,
              keep_model: bool = False, progress: bool = False) -> tuple[Run, nn.Module | None]:
    """Train ``task`` once under ``setting`` on ``device``, to the task's budget. Returns the run and, with
    ``keep_model``, the trained (uncompiled) model."""
    device = torch.device(device)
    built = row_step(task, setting, device, seed)
    eager, optimizer, step = built.model, built.optimizer, built.step
    on_cuda = device.type == "cuda"
    budget = task.budget
    marks = [(i + 1) / task.evaluations for i in range(task.evaluations)]  # where to evaluate, as progress
    if on_cuda:
        gpu.reset_peak_memory_stats(device)
    tokens = steps = 0
    seconds = first = 0.0
    flops: float | None = 0.0 if task.flops is not None else None
    curve: list[tuple[int, float, float]] = []
    last_loss = None
    from tqdm.auto import tqdm

    bar = tqdm(total=budget.tokens or budget.seconds, disable=not progress, desc=task.name, leave=False,
               unit=task.unit if budget.tokens else "s")
    epoch = 0
    done = False
    while not done:
        n_in_epoch = 0
        bench.synchronize(device)
        started = time.perf_counter()
        for batch in task.batches(setting, seed, epoch):
            n_in_epoch += 1
            _lr(optimizer, task.lr_at(budget.progress(tokens, seconds + time.perf_counter() - started)))
            out = step([batch.to(device, non_blocking=on_cuda) if hasattr(batch, "to") else batch])
            last_loss = out.loss
            tokens += task.count(batch)
            steps += 1
            if flops is not None:
                flops += task.flops(batch)
            if steps == 1:
                bench.synchronize(device)
                first = time.perf_counter() - started
            now = budget.progress(tokens, seconds + time.perf_counter() - started)
            bar.n = min(tokens, budget.tokens) if budget.tokens else round(seconds + time.perf_counter() - started, 1)
            bar.refresh()
            if now >= marks[len(curve)] or now >= 1.0:
                bench.synchronize(device)
                seconds += time.perf_counter() - started
                curve.append((tokens, seconds, _evaluate(task, eager, device, last_loss)))
                done = now >= 1.0 or len(curve) == len(marks)
                if done:
                    break
                bench.synchronize(device)
                started = time.perf_counter()
        else:
            bench.synchronize(device)
            seconds += time.perf_counter() - started
            if n_in_epoch == 0:
                raise ValueError(f"task {task.name!r}: batches(setting, seed={seed}, epoch={epoch}) yielded nothing")
        epoch += 1
    bar.close()
    peak = gpu.max_memory_allocated(device) if on_cuda else None
    run = Run(seed=seed, steps=steps, tokens=tokens, seconds=seconds, first_step_seconds=first, curve=tuple(curve),
              peak_bytes=peak, flops=flops)
    return run, (eager if keep_model else None)


def _evaluate(task: Task, model: nn.Module, device: torch.device, last_loss) -> float:
    if last_loss is not None and not bool(torch.isfinite(last_loss)):
        raise NonFiniteQualityError(f"task {task.name!r}: the training loss became {float(last_loss)}; lower the "
                                    "learning rate, or check the acceleration this row added (fp16 without a scaler?)")
    was_training = model.training
    model.eval()
    with torch.no_grad():
        quality = float(task.evaluate(model, device))
    model.train(was_training)
    if not math.isfinite(quality):
        raise NonFiniteQualityError(f"task {task.name!r}: {task.quality_name} = {quality}")
    return quality


# --------------------------------------------------------------------------- the table


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of the acceleration table: the accelerations up to here, and its runs (one per seed)."""

    name: str
    setting: Setting
    runs: tuple[Run, ...] = ()
    skipped: str | None = None
    """Why the acceleration this row adds could not run here (the row then repeats nothing and is not timed)."""
    mfu: float | None = None
    timing: bench.Timing | None = None
    """Seconds per real token of the row's step, timed in the same interleaved rounds as every other row
    (:func:`interleaved_row_timings`); None: the rates come from the training runs' own clocks."""

    @property
    def quality(self) -> float:
        return statistics.fmean(r.quality for r in self.runs)

    @property
    def quality_spread(self) -> float:
        """Largest minus smallest quality over the seeds (0 with one seed)."""
        values = [r.quality for r in self.runs]
        return max(values) - min(values)

    @property
    def step_seconds(self) -> float:
        """Seconds per step: the interleaved seconds per token times the runs' tokens per step, or (untimed)
        the runs' own median."""
        if self.timing is not None:
            return self.timing.median * statistics.median(r.tokens / max(r.steps, 1) for r in self.runs)
        return statistics.median(r.step_seconds for r in self.runs)

    @property
    def seconds(self) -> float:
        return statistics.median(r.seconds for r in self.runs)

    @property
    def steps(self) -> int:
        """Optimizer steps, median over seeds (rows whose batches differ take different numbers of steps)."""
        return round(statistics.median(r.steps for r in self.runs))

    @property
    def rate(self) -> float:
        """Tokens (or samples) per second: from the interleaved timing (its median), or, untimed, per training
        second, median over seeds."""
        if self.timing is not None:
            return 1 / self.timing.median
        return statistics.median(r.tokens / r.seconds for r in self.runs)

    @property
    def peak_bytes(self) -> int | None:
        peaks = [r.peak_bytes for r in self.runs if r.peak_bytes is not None]
        return max(peaks) if peaks else None

    def time_to(self, target: float, higher_is_better: bool) -> float | None:
        """Seconds to ``target``; None if any seed missed it. With an interleaved timing: the median over seeds of
        the tokens trained until the target was met, times the timing's seconds per token (each row trained once
        per seed, its speed measured beside every other row's); untimed: the median of the runs' own clocks."""
        if self.timing is not None:
            tokens = [r.tokens_to(target, higher_is_better) for r in self.runs]
            return None if any(t is None for t in tokens) else statistics.median(tokens) * self.timing.median
        times = [r.time_to(target, higher_is_better) for r in self.runs]
        return None if any(t is None for t in times) else statistics.median(times)

    def tokens_to(self, target: float, higher_is_better: bool) -> float | None:
        """Median over seeds of the tokens trained until ``target`` was met; None if any seed missed it."""
        tokens = [r.tokens_to(target, higher_is_better) for r in self.runs]
        return None if any(t is None for t in tokens) else statistics.median(tokens)


@dataclasses.dataclass(frozen=True)
class AccelerationTable:
    """The rows, the baseline's quality and the verdicts. Shows as HTML in a notebook, as text elsewhere."""

    task: str
    unit: str
    quality_name: str
    higher_is_better: bool
    tolerance: float
    device: str
    rows: tuple[Row, ...]

    @property
    def baseline(self) -> Row:
        return self.rows[0]

    @property
    def measured(self) -> list[Row]:
        return [r for r in self.rows if r.skipped is None]

    @property
    def target(self) -> float:
        """The quality a row must reach: the baseline's, less the tolerance."""
        sign = -1 if self.higher_is_better else 1
        return self.baseline.quality + sign * self.tolerance

    def kept_quality(self, row: Row) -> bool:
        return (row.quality >= self.target) if self.higher_is_better else (row.quality <= self.target)

    def time_to_quality(self, row: Row) -> float | None:
        return row.time_to(self.target, self.higher_is_better)

    def speedup(self, row: Row) -> float | None:
        """The baseline's time to quality over the row's; None when the row lost quality or never reached it."""
        if row.skipped is not None or not self.kept_quality(row):
            return None
        before, after = self.time_to_quality(self.baseline), self.time_to_quality(row)
        if before is None or after is None:
            return None
        return bench.speedup(before, after)

    def comparison(self, row: Row, before: Row | None = None) -> bench.Comparison | None:
        """``row``'s throughput against ``before`` (default: the baseline), round by round of the interleaved
        timing (:class:`bench.Comparison` of seconds per token: its speedup is the rate ratio, its verdict says
        whether the gap exceeds the rounds' spread); None when either row was not timed interleaved."""
        before = self.baseline if before is None else before
        if row.timing is None or before.timing is None or row is before:
            return None
        if len(row.timing.times) != len(before.timing.times):
            raise ValueError(f"{row.name!r} and {before.name!r} were not timed in the same rounds")
        return bench.Comparison(before.name, row.name, {before.name: before.timing, row.name: row.timing})

    def speedup_range(self, row: Row) -> tuple[float, float] | None:
        """The middle half of the speedup to quality over the interleaved rounds: the tokens-to-quality ratio
        (fixed by the training runs) times each round's rate ratio; None without a speedup or a timing."""
        value, comparison = self.speedup(row), self.comparison(row)
        if value is None or comparison is None:
            return None
        low, high = comparison.ratio_range
        tokens_ratio = value / comparison.speedup
        return tokens_ratio * low, tokens_ratio * high

    def verdict(self, row: Row) -> str:
        """The speedup in words, or why there is none."""
        if row.skipped is not None:
            return f"skipped: {row.skipped}"
        if not self.kept_quality(row):
            gap = abs(row.quality - self.baseline.quality)
            return (f"no speedup reported: {self.quality_name} {row.quality:.3f} is {gap:.3f} "
                    f"{'below' if self.higher_is_better else 'above'} the baseline's {self.baseline.quality:.3f}, "
                    f"outside the tolerance of {self.tolerance:g}")
        value = self.speedup(row)
        if value is None:
            if self.time_to_quality(self.baseline) is None:
                return ("no speedup reported: the baseline itself did not reach the target on every seed (a tolerance "
                        "below the seeds' spread)")
            return "no speedup reported: the baseline's quality was not reached within the budget on every seed"
        spread = self.speedup_range(row)
        if spread is None or row is self.baseline:
            return f"{value:.2f}x"
        return f"{value:.2f}x ({spread[0]:.2f}-{spread[1]:.2f})"

    @property
    def final(self) -> Row:
        """The last row that ran: every acceleration this device could run."""
        return self.measured[-1]

    def records(self) -> list[dict[str, Any]]:
        """One plain dict per row (for JSON, a DataFrame or a test)."""
        out = []
        for row in self.rows:
            measured = row.skipped is None
            ttq = self.time_to_quality(row) if measured else None
            out.append({
                "step": row.name, "skipped": row.skipped,
                "speedup_range": self.speedup_range(row) if measured else None,
                "timed_rounds": len(row.timing.times) if measured and row.timing is not None else None,
                "steps": row.steps if measured else None,
                "step_ms": 1e3 * row.step_seconds if measured else None,
                "rate": row.rate if measured else None,
                "peak_mib": row.peak_bytes / 2**20 if measured and row.peak_bytes is not None else None,
                "mfu": row.mfu, "quality": row.quality if measured else None,
                "quality_spread": row.quality_spread if measured else None,
                "seconds": row.seconds if measured else None, "time_to_quality": ttq,
                "speedup": self.speedup(row), "verdict": self.verdict(row), "seeds": len(row.runs),
                "refused_for_quality": measured and not self.kept_quality(row),
            })
        return out

    def previous_measured(self, row: Row) -> Row | None:
        """The row measured before ``row`` (skipped rows passed over); None for the baseline."""
        index = self.rows.index(row)
        return next((r for r in reversed(self.rows[:index]) if r.skipped is None), None)

    def summary(self, margin: float = 1.1) -> dict[str, Any]:
        """The table's verdicts as values and words chosen from them (:func:`ratio_words`, ``margin``):
        the last row's speedup to quality, the throughput ratio first row to last, whether the speedup to
        quality is more or less than the throughput ratio, and the rows refused for quality.

        Keys: ``final`` (row name), ``speedup`` (None if refused), ``verdict``, ``rate_ratio``, ``speed_words``,
        ``ttq_words`` (the speedup against the throughput ratio), ``baseline_ttq`` and ``final_ttq`` (seconds
        to quality, interpolated between evaluations), ``refused``, ``kept`` (row names)."""
        final, base = self.final, self.baseline
        value = self.speedup(final)
        rate_ratio = final.rate / base.rate
        if value is None:
            speed_words = f"gets no speedup ({self.verdict(final)})"
            ttq_words = "not reported, so there is nothing to compare it with"
        else:
            spread = self.speedup_range(final)
            if spread is None:
                word = ratio_words(value, margin=margin, above="sooner", below="slower", about="about as long")
            else:  # the interleaved rounds' rule (bench.Comparison): a verdict only when the gap exceeds the spread
                word = ("sooner" if spread[0] > 1 and value > 1.02 else
                        "slower" if spread[1] < 1 and value < 1 / 1.02 else "about as long")
            rounds = "" if spread is None else \
                f"middle half of the interleaved rounds: {spread[0]:.2f}x-{spread[1]:.2f}x"
            speed_words = {"sooner": f"reaches the baseline's quality {value:.2f}x sooner"
                                     + (f" ({rounds})" if rounds else ""),
                           "slower": f"is slower to the baseline's quality ({value:.2f}x" + (f"; {rounds})" if rounds
                                                                                            else ")"),
                           "about as long": f"takes about as long to the baseline's quality ({value:.2f}x"
                                            + (f"; {rounds}, a gap within their spread)" if rounds else ")")}[word]
            ttq_words = f"{ratio_words(value / rate_ratio, margin=margin, above='more than', below='less than', about='about the same as')} that ({value:.2f}x)"
        records = self.records()
        return {"final": final.name, "speedup": value, "verdict": self.verdict(final), "rate_ratio": rate_ratio,
                "speed_words": speed_words, "ttq_words": ttq_words,
                "baseline_ttq": self.time_to_quality(base), "final_ttq": self.time_to_quality(final),
                "refused": [r["step"] for r in records if r["refused_for_quality"]],
                "kept": [r["step"] for r in records if r["skipped"] is None and r["speedup"] is not None]}

    def gain(self, name: str, margin: float = 1.15) -> tuple[float, str, str]:
        """Throughput of row ``name`` over the row measured before it, that row's name, and the words: with
        interleaved timings, the rounds' verdict (:class:`bench.Comparison`: "a clear gain", "a loss", or
        "within the spread of the interleaved rounds"); untimed, :func:`ratio_words` with ``margin``."""
        row = next((r for r in self.rows if r.name == name), None)
        if row is None or row.skipped is not None:
            raise ValueError(f"{name!r} is not a measured row of this table; rows: {[r.name for r in self.measured]}")
        before = self.previous_measured(row)
        if before is None:
            raise ValueError("the baseline has no row before it to compare with")
        comparison = self.comparison(row, before)
        if comparison is not None:
            words = {"faster": "a clear gain", "slower": "a loss"}.get(comparison.verdict,
                                                                        "within the spread of the interleaved rounds")
            return comparison.speedup, before.name, words
        ratio = row.rate / before.rate
        return ratio, before.name, ratio_words(ratio, margin=margin, above="a clear gain", below="a loss",
                                               about="within the noise of one timing on a shared machine")

    _HEAD = ("step", "steps", "step time", "{unit}/s", "peak memory", "MFU", "{quality}", "time to quality",
             "speedup")

    def _cells(self) -> list[list[str]]:
        lines = []
        for r in self.records():
            if r["skipped"]:
                lines.append([r["step"], "—", "—", "—", "—", "—", "—", "—", self.verdict(self.rows[len(lines)])])
                continue
            lines.append([
                r["step"], str(r["steps"]), f"{r['step_ms']:.1f} ms", f"{r['rate']:,.0f}",
                "—" if r["peak_mib"] is None else f"{r['peak_mib']:,.0f} MiB",
                "—" if r["mfu"] is None else f"{100 * r['mfu']:.1f} %",
                f"{r['quality']:.4f}" + ("" if r["seeds"] == 1 else f" (range {r['quality_spread']:.4f})"),
                "not reached" if r["time_to_quality"] is None else f"{r['time_to_quality']:.1f} s",
                r["verdict"]])
        return lines

    def header(self) -> list[str]:
        several = any(len(r.runs) > 1 for r in self.rows)
        quality = self.quality_name if not several else f"{self.quality_name} (range over seeds)"
        return [h.format(unit=self.unit, quality=quality) for h in self._HEAD]

    def caption(self) -> str:
        seeds = len(self.baseline.runs)
        better = "higher" if self.higher_is_better else "lower"
        timed = self.baseline.timing
        clock = (f"trained once per seed; step times from {len(timed.times)} interleaved rounds of every row's step "
                 "(medians), so time to quality = tokens to quality x seconds per token, and the speedup's middle "
                 "half over the rounds follows it" if timed is not None else "times are medians of the runs' clocks")
        return (f"{self.task} on {self.device}: each row adds one acceleration to the rows above; {seeds} seed"
                f"{'' if seeds == 1 else 's'} per row, {clock}. Quality: {self.quality_name} ({better} is "
                f"better), kept if within {self.tolerance:g} of the baseline's {self.baseline.quality:.3f}. Speedup = "
                "the baseline's training time to that quality / the row's.")

    def __str__(self) -> str:
        rows = [self.header()] + self._cells()
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        text = [self.caption()]
        for r in rows:
            text.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        return "\n".join(text)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.header())
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>" for cells in self._cells())
        return (f"<table><caption>{html.escape(self.caption())}</caption><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table>")


def cumulative_settings(baseline: Setting, accelerations: Sequence[Acceleration], profile: DeviceProfile,
                        device: torch.device | str) -> list[tuple[str, Setting, str | None]]:
    """(name, setting, skip reason) per row: the baseline, then each acceleration applied on top of the
    rows before it; one the device cannot run leaves the setting as it was."""
    device = torch.device(device)
    rows = [("baseline", baseline, None)]
    setting = baseline
    for acc in accelerations:
        if not isinstance(acc, Acceleration):
            raise TypeError(f"accelerations must be case_study.Acceleration, got {type(acc).__name__}")
        reason = acc.skip_reason(profile, device)
        if reason is None:
            setting = acc.apply(setting)
        rows.append(("+ " + acc.name, setting, reason))
    return rows


def run_case_study(task: Task, accelerations: Sequence[Acceleration], *, device: torch.device | str,
                   profile: DeviceProfile, baseline: Setting | None = None, seeds: Sequence[int] = (0,),
                   peak_flops: Callable[[Setting], float] | None = None, keep_models: bool = False,
                   progress: bool = True, device_name: str | None = None, timing_steps: int | None = 4,
                   timing_seconds: float | None = None) -> tuple[AccelerationTable, dict[str, nn.Module]]:
    """Train ``task`` under the baseline and each cumulative acceleration, ``seeds`` times each, and return the
    table and (with ``keep_models``) the first seed's trained model of each row that ran, by row name.

    Then every row that ran is timed beside the others (:func:`interleaved_row_timings`, ``timing_steps`` steps a
    call, rounds capped by ``timing_seconds``): the table's rates and step times come from those rounds and its
    times to quality from the runs' tokens to quality at those rates, so a machine whose load drifts between
    rows (a minute apart) does not put the drift into the verdicts. ``timing_steps=None``: the runs' own clocks.

    ``peak_flops(setting)``: the device's peak for the row's format, for MFU (which :func:`bench.mfu` refuses
    above 100 %); None leaves MFU out. ``device_name``: how the table names the device. ``progress``: one bar
    over the table's training runs (rows x seeds), naming the row and seed it trains, then the timing."""
    if not seeds:
        raise ValueError("need at least one seed")
    from tqdm.auto import tqdm

    rows: list[Row] = []
    models: dict[str, nn.Module] = {}
    planned = cumulative_settings(baseline or Setting(), accelerations, profile, device)
    bar = tqdm(total=sum(reason is None for _, _, reason in planned) * len(seeds), disable=not progress,
               desc=f"{task.name}: training runs", unit="run")
    for name, setting, reason in planned:
        if reason is not None:
            rows.append(Row(name, setting, skipped=reason))
            continue
        runs = []
        for seed in seeds:
            bar.set_postfix_str(f"{name}, seed {seed}")
            run, model = train_run(task, setting, device, profile, seed, keep_model=keep_models and not runs)
            bar.update()
            runs.append(run)
            if model is not None:
                models[name] = model
        rows.append(Row(name, setting, tuple(runs)))
    measured = [r for r in rows if r.skipped is None]
    if timing_steps is not None and len(measured) > 1:
        bar.set_postfix_str(f"timing the {len(measured)} rows interleaved")
        timings = interleaved_row_timings(task, {r.name: r.setting for r in measured}, device, k=timing_steps,
                                          seed=seeds[0], max_seconds=timing_seconds)
        rows = [r if r.skipped is not None else dataclasses.replace(r, timing=timings[r.name]) for r in rows]
    bar.set_postfix_str("done")
    bar.close()
    if peak_flops is not None and task.flops is not None:
        rows = [r if r.skipped is not None else dataclasses.replace(r, mfu=statistics.median(
            bench.mfu(run.flops / run.steps, r.step_seconds, peak_flops(r.setting)) for run in r.runs)) for r in rows]
    table = AccelerationTable(task=task.name, unit=task.unit, quality_name=task.quality_name,
                              higher_is_better=task.higher_is_better, tolerance=task.tolerance,
                              device=device_name or str(torch.device(device)), rows=tuple(rows))
    return table, models
