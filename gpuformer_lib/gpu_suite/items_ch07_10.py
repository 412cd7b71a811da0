"""Items of chapters 7 to 10: feeding the GPU (host-to-device copies, prefetching, length bucketing), mixed
precision, the memory of a training step (measured peak against the calculator, accumulation, activation
checkpointing), and profiling (a trace of eager steps; the training ladder on GPT-2 small and its MFU).

Every model, batch and step comes from the library (``model``, ``data``, ``packing``, ``prefetch``, ``speed``,
``memory``, ``mixed_precision``, ``ladder``, ``bench``), at the sizes the chapters' notebooks use on a GPU;
under rehearsal at toy sizes, on the CPU.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import re
import signal
import threading
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F

from gpuformer_lib.gpu_suite.core import Context, SuiteError, item

# --------------------------------------------------------------------------- shared helpers


def _profile(ctx: Context):
    """The device profile every choice is made from (the rehearsed GPU's under rehearsal)."""
    from gpuformer_lib.profiles import current_profile

    return current_profile(ctx.device)


def _preset(ctx: Context):
    """The chapters' size preset for this device: ``gpu`` (24 GiB or more), ``gpu-small`` (a T4), toy sizes
    under rehearsal."""
    from gpuformer_lib.profiles import size_preset

    return size_preset(_profile(ctx))


def _on_gpu(ctx: Context) -> bool:
    return ctx.device.type == "cuda"


def _free(ctx: Context) -> None:
    gc.collect()
    if _on_gpu(ctx):
        torch.cuda.synchronize(ctx.device)
        torch.cuda.empty_cache()


def _reset_peak(ctx: Context) -> None:
    if _on_gpu(ctx):
        torch.cuda.synchronize(ctx.device)
        torch.cuda.reset_peak_memory_stats(ctx.device)


def _peak_bytes(ctx: Context) -> int | None:
    """Bytes allocated at the peak since :func:`_reset_peak` (None without the CUDA allocator)."""
    if not _on_gpu(ctx):
        return None
    torch.cuda.synchronize(ctx.device)
    return torch.cuda.max_memory_allocated(ctx.device)


def _slug(text: str) -> str:
    """A record name from a label: ``loss (log-softmax, NLL)`` -> ``loss_log_softmax_nll``."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def _dtype_name(dtype: torch.dtype | None) -> str:
    return "float32" if dtype is None else str(dtype).removeprefix("torch.")


class OutOfTime(Exception):
    """Raised inside a long phase (a compile) when the item's cap is about to end, so that what the item measured
    before is kept instead of lost with a killed worker."""


class StopBeforeCap:
    """``with StopBeforeCap(seconds_left, margin_s) as guard:`` raises :class:`OutOfTime` in this (the main)
    thread once ``seconds_left - margin_s`` seconds have passed (SIGALRM), and sets ``guard.fired``: a compiler
    may wrap the exception in one of its own, so the caller asks the flag. Where no alarm can be set (another
    thread, no ``setitimer``) the block runs unguarded; with no time left at all it raises at once."""

    def __init__(self, seconds_left: float, margin_s: float):
        self.budget, self.margin_s, self.fired = seconds_left - margin_s, margin_s, False
        self._armed, self._previous = False, None

    def _ring(self, signum, frame):
        self.fired = True
        raise OutOfTime(f"stopped {self.margin_s:.0f} s before the item's cap")

    def __enter__(self) -> "StopBeforeCap":
        if self.budget <= 0:
            self.fired = True
            raise OutOfTime(f"less than the {self.margin_s:.0f} s margin was left of the item's cap")
        if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
            self._previous = signal.signal(signal.SIGALRM, self._ring)
            signal.setitimer(signal.ITIMER_REAL, self.budget)
            self._armed = True
        return self

    def __exit__(self, *exc) -> None:
        if self._armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous)
            self._armed = False


def _lm_training_step(ctx: Context, config, batch_size: int, seq_len: int, plan, *, tf32: bool | None = None):
    """A ``DecoderLM`` built for ``plan`` (fused attention, no id check) on the device, its AdamW
    (``speed.make_adamw``), the library's training step (``speed.make_train_step``) and a batch of random ids
    (B, T + 1). Throughput does not depend on the data."""
    from gpuformer_lib import speed
    from gpuformer_lib.model import DecoderLM

    torch.manual_seed(0)
    with ctx.device:  # initialised where it runs: no copy of the weights from the host
        model = DecoderLM(speed.model_config(config, plan))
    optimizer = speed.make_adamw(model.parameters(), plan, lr=1e-4)
    step = speed.make_train_step(model, optimizer, speed.next_token_loss, dtype=plan.dtype,
                                 scaler=speed.grad_scaler(plan, ctx.device), tf32=tf32, cuda_graphs=plan.cuda_graphs)
    ids = torch.randint(0, config.vocab_size, (batch_size, seq_len + 1),
                        generator=torch.Generator().manual_seed(1)).to(ctx.device)
    return model, optimizer, step, ids


def _is_device_event(event) -> bool:
    from torch.autograd import DeviceType

    return (getattr(event, "device_type", None) == DeviceType.CUDA and not getattr(event, "is_user_annotation", False)
            and not event.name.startswith("ProfilerStep"))


def _profile_summary(ctx: Context, step: Callable[[], object], active: int = 2) -> dict[str, Any]:
    """Profile ``active`` steps (after one skipped and one warm-up step) with ``bench.profile_steps`` (no trace
    file) and sum them up per step: the time by category (``bench.time_by_category``: the GPU's kernels by
    ``bench.kernel_category``, or on a CPU the ``aten::`` operators' self time) and how many kernels (CPU:
    ``aten::`` operators) a step launches."""
    from gpuformer_lib import bench

    prof = bench.profile_steps(step, wait=1, warmup=1, active=active, device=ctx.device)
    per_step = {k: v / active for k, v in bench.time_by_category(prof.key_averages(), ctx.device).items()}
    events = list(prof.events())
    if _on_gpu(ctx):
        device_events = [e for e in events if _is_device_event(e)]
        copies = sum(1 for e in device_events if bench.kernel_category(e.name) == "copies")
        count, what = (len(device_events) - copies) / active, "kernels"
    else:
        copies = 0
        count, what = sum(1 for e in events if e.name.startswith("aten::")) / active, "aten operators"
    return {"per_step_us": per_step, "total_us": sum(per_step.values()), "count": count, "what": what,
            "copies": copies / active}


def _record_profile(ctx: Context, prefix: str, summary: dict[str, Any], step_s: float, label: str) -> None:
    """Record a profile summary: launches per step, seconds and share per category, and the share of the
    measured step time the device's work fills."""
    on_gpu = _on_gpu(ctx)
    source = ("the GPU's kernels and copies (Kineto/CUPTI), by kernel name (bench.kernel_category)" if on_gpu else
              "the aten:: operators' self CPU time (bench.operator_category)")
    ctx.value(f"{prefix}{'kernels' if on_gpu else 'aten_operators'}_per_step", summary["count"],
              summary["what"], f"{label}: {summary['what']} in the profile's active steps / their number "
              "(torch.profiler through bench.profile_steps; on a GPU memcpy/memset are left out, nested aten "
              "operators counted on a CPU)")
    total = summary["total_us"]
    for category, us in sorted(summary["per_step_us"].items(), key=lambda kv: -kv[1]):
        ctx.value(f"{prefix}time_{_slug(category)}", us * 1e-6, "s per step",
                  f"{label}: {category}, from {source} (bench.time_by_category), per profiled step")
        if total > 0:
            ctx.value(f"{prefix}share_{_slug(category)}", us / total, "share",
                      f"{label}: {category} / all categorised time")
    if step_s > 0:
        ctx.value(f"{prefix}busy_share", total * 1e-6 / step_s, "share",
                  f"{label}: categorised time per profiled step / the step's median time measured without the "
                  "profiler" + ("" if on_gpu else " (a CPU: operator time, the rest is Python and dispatch)"))


def _category_words(summary: dict[str, Any]) -> str:
    total = summary["total_us"] or 1.0
    return ", ".join(f"{cat} {us / total:.0%}" for cat, us in sorted(summary["per_step_us"].items(),
                                                                     key=lambda kv: -kv[1]))


# --------------------------------------------------------------------------- chapter 7: the training loop


@item(7, "host_to_device", cap_s=7,
      title="host-to-GPU copies of a batch (pageable vs pinned) and a loop whose next batch is prefetched")
def host_to_device(ctx: Context) -> None:
    from torch import nn

    from gpuformer_lib import prefetch

    on_gpu = _on_gpu(ctx)
    # a batch of feature vectors, float32: 32 MiB on a GPU, so that its copy costs about what the step computes
    rows, width, hidden = ctx.size((256, 64, 128), (65536, 128, 512))
    n_host, steps = ctx.size((2, 3), (4, 8))
    nbytes = rows * width * 4
    if not on_gpu:
        ctx.note("rehearsal: no pinned allocator and no copy engine on a CPU: the 'pinned' buffers are pageable, the "
                 "copies go host to host and the prefetcher passes batches through; the code runs, the effect "
                 "needs a GPU")
    pageable = [torch.randn(rows, width, generator=torch.Generator().manual_seed(i)) for i in range(n_host)]
    pinned = [b.pin_memory() for b in pageable] if on_gpu else pageable
    target = torch.empty(rows, width, device=ctx.device)

    # 1. one copy of a batch: from pageable memory the driver stages it through a pinned buffer of its own
    copy = ctx.compare(f"copy_{nbytes >> 20 or nbytes}{'MiB' if nbytes >> 20 else 'B'}",
                       ("pageable", lambda: target.copy_(pageable[0])),
                       ("pinned, non_blocking", lambda: target.copy_(pinned[0], non_blocking=True)),
                       warmup=2, repeats=7, number=4, share=0.15, work=nbytes, work_unit="B")
    for side in ("before", "after"):
        ctx.value(f"bandwidth_{_slug(copy[side]['label'])}", nbytes / copy[side]["median"], "B/s",
                  f"{nbytes} bytes / median seconds per copy ({copy[side]['label']})")

    # 2. a loop of training steps, each on the next batch: copies and compute in turn, or overlapped
    torch.manual_seed(0)
    with ctx.device:
        model = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    resident = [b.to(ctx.device) for b in pageable]

    def train_step(x: torch.Tensor) -> None:
        loss = F.mse_loss(model(x), x)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def loop_pageable() -> None:
        for i in range(steps):
            train_step(pageable[i % n_host].to(ctx.device))

    def loop_pinned() -> None:  # queued on the compute stream: the host goes on, the GPU copies between steps
        for i in range(steps):
            train_step(pinned[i % n_host].to(ctx.device, non_blocking=True))

    def loop_prefetched() -> None:  # batch i + 1 copied on a side stream while step i computes
        for x in prefetch.Prefetcher([pinned[i % n_host] for i in range(steps)], ctx.device):
            train_step(x)

    def loop_compute_only() -> None:
        for i in range(steps):
            train_step(resident[i % n_host])

    def loop_copies_only() -> None:
        for i in range(steps):
            target.copy_(pinned[i % n_host], non_blocking=True)

    work = dict(work=steps * nbytes, work_unit="B copied")
    repeats = ctx.size(3, 5)
    compute = ctx.time("loop_compute_only", loop_compute_only, warmup=1, repeats=repeats, share=0.15)
    copies = ctx.time("loop_copies_only", loop_copies_only, warmup=1, repeats=repeats, share=0.15, **work)
    prefetched = ("pinned, prefetched on a side stream", loop_prefetched)
    ctx.compare("loop_pageable_vs_prefetched", ("pageable, blocking copies", loop_pageable), prefetched, warmup=1,
                repeats=repeats, share=0.3, **work)
    overlap = ctx.compare("loop_pinned_vs_prefetched", ("pinned, non_blocking on the compute stream", loop_pinned),
                          prefetched, warmup=1, repeats=repeats, share=0.5, **work)
    ctx.value("copy_share_hidden_by_prefetch",
              (overlap["before"]["median"] - overlap["after"]["median"]) / copies["median"], "share",
              f"(loop with copies on the compute stream - loop prefetched) / loop of the {steps} copies alone, "
              "medians: 1 = every copy hidden behind compute, 0 = none")
    ctx.value("loop_serial_sum_over_compute", (compute["median"] + copies["median"]) / compute["median"], "x",
              f"(compute alone + copies alone) / compute alone, medians of {steps} steps: the most a perfect "
              "overlap can save")


def synthetic_pairs(n: int, max_len: int, src_vocab: int, tgt_vocab: int, seed: int = 0):
    """``n`` (source ids, target ids) pairs shaped as ``data.encode_pairs`` makes them (source: words +
    <eos>, at most ``max_len - 1``; target: <bos> + words + <eos>, at most ``max_len``), random ids, with a
    skewed distribution of lengths like a corpus's: log-normal around a third of the limit, the target
    0.8-1.4 times the source."""
    from gpuformer_lib.data import Vocab

    g = torch.Generator().manual_seed(seed)
    words = torch.exp(torch.randn(n, generator=g) * 0.5 + math.log(max_len / 3)).round().clamp(1, max_len - 2).long()
    tgt_words = (words * (0.8 + 0.6 * torch.rand(n, generator=g))).round().clamp(1, max_len - 2).long()
    first = len(Vocab.SPECIALS)
    eos, bos = torch.tensor([Vocab.EOS]), torch.tensor([Vocab.BOS])
    pairs = []
    for s, t in zip(words.tolist(), tgt_words.tolist()):
        src = torch.cat([torch.randint(first, src_vocab, (s,), generator=g), eos])
        tgt = torch.cat([bos, torch.randint(first, tgt_vocab, (t,), generator=g), eos])
        pairs.append((src, tgt))
    return pairs


@item(7, "length_bucketing", cap_s=30, expect_s=12,  # an H200 (2026-11-28) stopped it at a cap of 8 s
     
      title="real tokens/s of a translation step: random batches vs length-bucketed vs token-budget")
def length_bucketing(ctx: Context) -> None:
    from gpuformer_lib import data, device_measurements, model_sizes, packing, speed
    from gpuformer_lib.model import Transformer

    profile, preset = _profile(ctx), _preset(ctx)
    precision = device_measurements.training_precision_on(profile, ctx.device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    ctx.note(f"the translation model of chapter 7 (model_sizes.translation_run), {precision} as chapter 7 trains it, "
             "synthetic sentence pairs with a skewed length distribution; the embedding's id check (a host sync per "
             "step) is off")
    # the Tatoeba vocabularies' sizes (model_sizes.translation_run's docstring); a rehearsal's are smaller
    src_vocab, tgt_vocab = ctx.size((512, 512), (4321, 2365))
    for max_len in ctx.size([16], [24, 96]):
        if ctx.seconds_left() < 2.5:
            ctx.note(f"sentences of up to {max_len} tokens left out: the item's cap was nearly spent")
            break
        run = model_sizes.translation_run(preset, src_vocab, tgt_vocab, max_len)
        config = dataclasses.replace(run.config, check_token_ids=False)
        batch_size = ctx.size(8, run.batch_size)
        steps = ctx.size(2, 6)
        pairs = synthetic_pairs(batch_size * ctx.size(8, 24), max_len, src_vocab, tgt_vocab, seed=max_len)
        lengths = [max(len(s), len(t)) for s, t in pairs]
        samplers = {
            "random": torch.utils.data.BatchSampler(
                torch.utils.data.RandomSampler(range(len(pairs)), generator=torch.Generator().manual_seed(0)),
                batch_size, drop_last=False),
            "bucketed": data.BucketBatchSampler(lengths, batch_size, seed=0),
            "token_budget": packing.TokenBudgetBatchSampler(lengths, max_tokens=batch_size * max(lengths), seed=0),
        }
        torch.manual_seed(0)
        with ctx.device:
            model = Transformer(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler(ctx.device.type) if dtype == torch.float16 else None

        def translation_loss(m, b):
            logits = m(b.src, b.tgt_in, b.src_padding_mask, b.tgt_padding_mask)  # (B, T, V)
            return F.cross_entropy(logits.float().flatten(0, 1), b.tgt_out.flatten(), ignore_index=data.Vocab.PAD,
                                   label_smoothing=0.1), 1

        step = speed.make_train_step(model, optimizer, translation_loss, dtype=dtype, scaler=scaler)
        rates = {}
        for name, sampler in samplers.items():
            indices = list(sampler)
            ctx.value(f"T{max_len}_{name}_padding_share", data.padding_fraction(indices, lengths), "share",
                      f"data.padding_fraction over all {len(indices)} batches of the sampler, {len(pairs)} pairs")
            batches = [data.collate_translation([pairs[i] for i in b]) for b in indices[:steps]]
            real = sum(int((~b.src_padding_mask).sum() + (~b.tgt_padding_mask).sum()) for b in batches)
            batches = [b.to(ctx.device) for b in batches]

            def train_steps(batches=batches) -> None:
                for b in batches:
                    step([b])

            entry = ctx.time(f"T{max_len}_{name}_steps", train_steps, warmup=1, repeats=ctx.size(3, 5), share=0.12,
                             work=real, work_unit="real tokens")
            rates[name] = entry["rate"]
        for name in ("bucketed", "token_budget"):
            ctx.value(f"T{max_len}_{name}_speedup", rates[name] / rates["random"], "x",
                      f"real tokens/s with {name} batches / with random batches, {steps} steps each, medians")
        model = optimizer = step = batches = None  # before the next length's model
        _free(ctx)


# --------------------------------------------------------------------------- chapter 8: mixed precision


@item(8, "precision_step", cap_s=15,
      title="chapter 8's compute-bound training step in fp32, TF32, bf16 and fp16 autocast (GradScaler)")
def precision_step(ctx: Context) -> None:
    from gpuformer_lib import data, device_measurements, speed
    from gpuformer_lib import mixed_precision as mp
    from gpuformer_lib.model import DecoderLM, count_parameters, transformer_flops

    profile, preset = _profile(ctx), _preset(ctx)
    # tf32 only with TF32 tensor cores (compute capability 8.0+), bf16 only where native, as the chapter does
    modes = device_measurements.precision_modes(profile)
    run = mp.precision_benchmark_run(preset, vocab_size=16)
    c, batch_size, seq_len = run.config, run.batch_size, run.seq_len
    torch.manual_seed(0)
    with ctx.device:
        model = DecoderLM(c)
    # a small, constant rate: one model trains through all four modes without warm-up, and the timings do not
    # depend on it (the chapter's run.lr, meant for a fresh model with warm-up, grows fp16's activations to overflow)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    batch = tuple(t.to(ctx.device) for t in data.repeating_patterns(0, c.vocab_size, batch_size=batch_size,
                                                                     seq_len=seq_len))
    flops = transformer_flops(c, batch_size, seq_len)
    ctx.note(f"mixed_precision.precision_benchmark_run('{preset.name}'{', toy' if preset.toy else ''}): "
             f"{count_parameters(model):,} parameters, {batch_size} x {seq_len} tokens, {flops / 1e12:.3g} TFLOP a "
             f"step; modes {', '.join(modes)}; one model and AdamW shared by the modes")
    if not _on_gpu(ctx):
        ctx.note("rehearsal: the 16-bit modes run CPU autocast (emulated arithmetic), not tensor cores")

    def loss_fn(m, b):  # the chapter's: positions 4 on are predictable
        x, y = b
        return F.cross_entropy(m(x)[:, 4:].flatten(0, 1).float(), y[:, 4:].flatten()), y.numel()

    medians, losses = {}, {}
    for mode in modes:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode)
        scaler = torch.amp.GradScaler(ctx.device.type) if dtype == torch.float16 else None
        step = speed.make_train_step(model, optimizer, loss_fn, dtype=dtype, scaler=scaler, tf32=mode == "tf32")
        out = {}

        def one_step(step=step, out=out) -> None:
            out["loss"] = step([batch]).loss

        _reset_peak(ctx)
        entry = ctx.time(f"step_{mode}", one_step, warmup=ctx.size(1, 2), repeats=ctx.size(3, 5), share=0.2,
                         work=flops, work_unit="FLOP")
        medians[mode] = entry["median"]
        losses[mode] = float(out["loss"])
        peak = _peak_bytes(ctx)
        if peak is not None:
            ctx.value(f"peak_memory_{mode}", peak / 2**20, "MiB", "torch.cuda.max_memory_allocated over the mode's "
                      "steps (weights, AdamW state and gradients in float32 included)")
        if not math.isfinite(losses[mode]):
            raise SuiteError(f"{mode}: the loss is {losses[mode]} after the timed steps")
        ctx.value(f"loss_{mode}", losses[mode], "nats", "the loss of the last timed step (the model keeps training "
                  "across the modes)")
    for mode in modes[1:]:
        ctx.value(f"speedup_{mode}", medians["fp32"] / medians[mode], "x",
                  f"median step time fp32 / median step time {mode}")


# --------------------------------------------------------------------------- chapter 9: memory and accumulation


def _chapter9_model(ctx: Context):
    """Chapter 9's model and batch (notebook cell 'size'): GPT-2 small at T = 1024, batch 8 on the ``gpu``
    preset, float32, fused attention, AdamW; the id check off."""
    from gpuformer_lib.model import DecoderLM, TransformerConfig, count_parameters

    size = dict(_preset(ctx).pick(
        cpu=dict(d_model=128, n_heads=4, n_decoder_layers=4, vocab_size=1024, seq_len=128, batch_size=8),
        gpu_small=dict(d_model=512, n_heads=8, n_decoder_layers=8, vocab_size=32768, seq_len=512, batch_size=8),
        gpu=dict(d_model=768, n_heads=12, n_decoder_layers=12, vocab_size=50304, seq_len=1024, batch_size=8)))
    if ctx.toy:
        size["seq_len"] = 32  # a rehearsal's steps in milliseconds
    seq_len, batch_size = size.pop("seq_len"), size.pop("batch_size")
    config = TransformerConfig(**size, d_ff=4 * size["d_model"], dropout=0.0, max_len=seq_len, activation="gelu",
                               positional="learned", check_token_ids=False)
    torch.manual_seed(0)
    with ctx.device:
        model = DecoderLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (batch_size, seq_len + 1),
                        generator=torch.Generator().manual_seed(0)).to(ctx.device)
    sizes = dict(n_layers=config.n_decoder_layers, d_model=config.d_model, n_heads=config.n_heads, d_ff=config.d_ff,
                 seq_len=seq_len, vocab_size=config.vocab_size)
    return model, optimizer, ids, count_parameters(model), sizes


@item(9, "peak_memory", cap_s=8,
      title="measured peak memory of a training step against memory.predicted_peak, over batch sizes")
def peak_memory(ctx: Context) -> None:
    from gpuformer_lib.memory import predicted_peak

    model, optimizer, ids, n_params, sizes = _chapter9_model(ctx)
    batch = ids.shape[0]
    on_gpu = _on_gpu(ctx)
    if not on_gpu:
        ctx.note("rehearsal: a CPU has no CUDA allocator to ask for a peak; the steps run, only the predictions "
                 "are recorded")

    def full_step(b: int) -> None:  # one training step that starts and ends without gradients (chapter 9)
        optimizer.zero_grad(set_to_none=True)
        x = ids[:b]
        F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    full_step(max(1, batch // 4))  # the optimizer's state exists from here on, as in every step after the first
    for b in sorted({max(1, batch // 4), max(1, batch // 2), batch}):
        if ctx.seconds_left() < 2:
            ctx.note(f"batch {b} and larger left out: the item's cap was nearly spent")
            break
        predicted = predicted_peak(n_params, batch_size=b, **sizes)
        ctx.value(f"predicted_peak_b{b}", predicted.peak / 2**20, "MiB",
                  f"memory.predicted_peak: float32 AdamW states + the largest moment ({predicted.moment})")
        _reset_peak(ctx)
        held = torch.cuda.memory_allocated(ctx.device) if on_gpu else 0
        full_step(b)
        peak = _peak_bytes(ctx)
        if peak is None:
            continue
        ctx.value(f"measured_peak_b{b}", peak / 2**20, "MiB",
                  "torch.cuda.max_memory_allocated over one step, after reset_peak_memory_stats")
        ctx.value(f"ratio_b{b}", peak / predicted.peak, "x", "measured peak / predicted peak")
        states = predicted.saved.weights + predicted.saved.optimizer
        ctx.value(f"ratio_beyond_states_b{b}", (peak - held) / (predicted.peak - states), "x",
                  "(measured peak - memory allocated before the step: weights and AdamW state) / (predicted peak - "
                  "predicted weights and optimizer state), as memory.measure_step_peak compares them")
        ctx.value(f"weights_and_state_ratio_b{b}", held / states, "x",
                  "memory allocated before the step / the calculator's weights + AdamW state")


def _fragmentation_child(spec_json: str) -> None:
    """Run in a fresh process (its allocator settings come from PYTORCH_CUDA_ALLOC_CONF, read once at CUDA's
    start): training steps of chapter 9's model at varying sequence lengths, then print one JSON line with the
    CUDA allocator's peaks (allocated: what tensors held; reserved: what the caching allocator took from the
    driver) and the reserved memory at the end. On a CPU the steps run and the peaks are null."""
    import json
    import os
    import random

    from gpuformer_lib.model import DecoderLM, TransformerConfig

    spec = json.loads(spec_json)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    config = TransformerConfig(**spec["config"])
    with device:
        model = DecoderLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(0)
    lengths = [rng.randint(config.max_len // 8, config.max_len) for _ in range(spec["steps"])]
    for length in lengths:
        ids = torch.randint(0, config.vocab_size, (spec["batch"], length + 1), device=device)
        loss = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.synchronize()
    print(json.dumps({"alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "lengths": lengths,
                      "peak_allocated": torch.cuda.max_memory_allocated() if on_gpu else None,
                      "peak_reserved": torch.cuda.max_memory_reserved() if on_gpu else None,
                      "reserved_end": torch.cuda.memory_reserved() if on_gpu else None}))


@item(9, "fragmentation", cap_s=20, expect_s=12,
      title="reserved against allocated memory over steps of varying length, with and without expandable_segments")
def fragmentation(ctx: Context) -> None:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from gpuformer_lib.memory import predicted_peak

    _, _, ids, n_params, sizes = _chapter9_model(ctx)
    config = dict(d_model=sizes["d_model"], n_heads=sizes["n_heads"], n_decoder_layers=sizes["n_layers"],
                  d_ff=sizes["d_ff"], vocab_size=sizes["vocab_size"], max_len=sizes["seq_len"], dropout=0.0,
                  activation="gelu", positional="learned", check_token_ids=False)
    batch = max(1, ids.shape[0] // 2)
    spec = json.dumps({"config": config, "batch": batch, "steps": ctx.size(4, 12)})
    predicted = predicted_peak(n_params, batch_size=batch, **sizes)
    ctx.value("predicted_peak_longest", predicted.peak / 2**20, "MiB",
              f"memory.predicted_peak at the longest length, batch {batch} (the allocated peak it predicts)")
    package_parent = str(Path(__file__).resolve().parents[2])
    code = ("import sys; from gpuformer_lib.gpu_suite.items_ch07_10 import _fragmentation_child; "
            "_fragmentation_child(sys.argv[1])")
    for label, conf in (("default", ""), ("expandable", "expandable_segments:True")):
        if ctx.seconds_left() < 6:
            ctx.note(f"{label} allocator left out: the item's cap was nearly spent")
            break
        env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": conf, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH", "")) if p)}
        if not _on_gpu(ctx):
            env["CUDA_VISIBLE_DEVICES"] = ""  # a rehearsal runs the child on the CPU
        try:
            done = subprocess.run([sys.executable, "-c", code, spec], env=env, capture_output=True, text=True,
                                  timeout=max(1.0, ctx.seconds_left() - 1), stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            ctx.note(f"{label} allocator: the child process ran past the item's cap")
            break
        if done.returncode != 0:
            raise SuiteError(f"the {label} allocator's child failed ({done.returncode}):\n{done.stderr[-1500:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        if result["peak_allocated"] is None:
            ctx.note(f"{label} allocator: rehearsal on the CPU, {len(result['lengths'])} steps of varying length "
                     "ran; no CUDA allocator to ask")
            continue
        ctx.value(f"{label}_peak_allocated", result["peak_allocated"] / 2**20, "MiB",
                  "torch.cuda.max_memory_allocated over the steps of varying length")
        ctx.value(f"{label}_peak_reserved", result["peak_reserved"] / 2**20, "MiB",
                  "torch.cuda.max_memory_reserved: what the caching allocator held from the driver at its peak")
        ctx.value(f"{label}_reserved_over_allocated", result["peak_reserved"] / result["peak_allocated"], "x",
                  "peak reserved / peak allocated: the allocator's overhead (fragmentation, cached blocks)")
        ctx.value(f"{label}_allocated_over_predicted", result["peak_allocated"] / predicted.peak, "x",
                  "measured peak allocated / memory.predicted_peak at the longest length")


@item(9, "accumulation_checkpointing", cap_s=12,
      title="time of gradient accumulation (4 micro-batches vs one batch) and of activation checkpointing; "
            "its peak memory")
def accumulation_checkpointing(ctx: Context) -> None:
    from gpuformer_lib import speed
    from gpuformer_lib.memory import predicted_peak, set_activation_checkpointing

    model, optimizer, ids, n_params, sizes = _chapter9_model(ctx)
    batch, k = ids.shape[0], 4
    one_batch = speed.make_train_step(model, optimizer, speed.next_token_loss)
    accumulated = speed.make_train_step(model, optimizer, speed.next_token_loss, grad_accum_steps=k)
    micro = list(ids.split(batch // k))
    acc = ctx.compare("accumulation", (f"one batch of {batch}", lambda: one_batch([ids])),
                      (f"{k} micro-batches of {batch // k}", lambda: accumulated(micro)), warmup=1,
                      repeats=ctx.size(3, 5), share=0.35)
    for side, what in (("before", "one_batch"), ("after", "accumulated")):
        ctx.value(f"seconds_per_sample_{what}", acc[side]["median"] / batch, "s",
                  f"median optimizer step ({acc[side]['label']}) / {batch} sequences of {sizes['seq_len']} tokens")

    def step_with(checkpointing: bool) -> Callable[[], None]:
        def run() -> None:
            set_activation_checkpointing(model, checkpointing)  # speed.apply_activation_checkpointing, from outside
            try:
                one_batch([ids])
            finally:
                set_activation_checkpointing(model, False)
        return run

    ckpt = ctx.compare("checkpointing", ("off", step_with(False)), ("on", step_with(True)), warmup=1,
                       repeats=ctx.size(3, 5), share=0.6)
    ctx.value("checkpointing_time_ratio", ckpt["after"]["median"] / ckpt["before"]["median"], "x",
              "median step with checkpointing / without (one more forward pass of the layers: about 4/3 expected)")
    for on in (False, True):
        predicted = predicted_peak(n_params, batch_size=batch, checkpointing=on, **sizes)
        label = "on" if on else "off"
        ctx.value(f"predicted_peak_checkpointing_{label}", predicted.peak / 2**20, "MiB",
                  f"memory.predicted_peak(checkpointing={on}), at the {predicted.moment}")
        _reset_peak(ctx)
        step_with(on)()
        peak = _peak_bytes(ctx)
        if peak is not None:
            ctx.value(f"measured_peak_checkpointing_{label}", peak / 2**20, "MiB",
                      "torch.cuda.max_memory_allocated over one step, after reset_peak_memory_stats")
            ctx.value(f"ratio_checkpointing_{label}", peak / predicted.peak, "x", "measured / predicted peak")
    if not _on_gpu(ctx):
        ctx.note("rehearsal: no CUDA allocator on a CPU, so no measured peak; the predictions are recorded")


# --------------------------------------------------------------------------- chapter 10: monitoring and profiling


@item(10, "profile_step", cap_s=15,
      title="torch.profiler over eager GPT-2-small training steps: kernels per step and time by category")
def profile_step(ctx: Context) -> None:
    from gpuformer_lib import ladder, speed
    from gpuformer_lib.profiles import compute_dtype

    profile = _profile(ctx)
    dtype = compute_dtype(profile)  # the book's rule: bf16, fp16 (+ loss scaler) without bf16, float32 on a CPU
    plan = speed.SpeedPlan(dtype=None if dtype == torch.float32 else dtype, check_token_ids=False)
    lp = ctx.size(ladder.PRESETS["tiny"], ladder.PRESETS["gpt2-small"])
    batch, seq_len = ctx.size((1, 64), (4, lp.seq_len))
    model, optimizer, step, ids = _lm_training_step(ctx, lp.config, batch, seq_len, plan)
    label = f"{lp.name}, batch {batch} x {seq_len}, {_dtype_name(plan.dtype)} autocast, fused attention, eager"
    ctx.note(label)
    entry = ctx.time("eager_step", lambda: step([ids]), warmup=2, repeats=7, share=0.3, work=batch * seq_len,
                     work_unit="token")
    summary = _profile_summary(ctx, lambda: step([ids]), active=2)
    _record_profile(ctx, "", summary, entry["median"], label)


def _ladder_preset(ctx: Context, profile, plan):
    """GPT-2 small at T = 1024 with the largest batch of 16, 8, 4, 2, 1 whose step under ``plan`` fits the GPU
    with ``ladder.MEMORY_MARGIN`` to spare (``ladder.step_memory``); the tiny preset, smaller, in rehearsal."""
    from gpuformer_lib import ladder

    if ctx.toy:
        return dataclasses.replace(ladder.PRESETS["tiny"], batch_size=1, seq_len=64)
    gpt2 = ladder.PRESETS["gpt2-small"]
    budget = (1 - ladder.MEMORY_MARGIN) * profile.memory_gib * 2**30
    for batch in (16, 8, 4, 2, 1):
        if ladder.step_memory(gpt2.config, batch, gpt2.seq_len, plan) <= budget:
            return dataclasses.replace(gpt2, batch_size=batch)
    raise SuiteError(f"GPT-2 small does not fit {profile.memory_gib} GiB at batch 1")


@item(10, "ladder", cap_s=120, heavy=True, expect_s=50,
      title="training ladder on GPT-2 small: eager 16-bit + fused SDPA, torch.compile, + fused AdamW (+ CUDA graphs "
            "if time allows): step time, tokens/s, MFU")
def training_ladder(ctx: Context) -> None:
    from gpuformer_lib import bench, ladder, speed
    from gpuformer_lib.model import transformer_flops
    from gpuformer_lib.profiles import low_precision_dtype

    profile = _profile(ctx)
    low = low_precision_dtype(profile) or torch.bfloat16  # fp16 on a GPU without bf16 (a T4), as run_ladder
    rungs = {r.key: r for r in ladder.ladder_rungs(low)}
    plans = {key: ladder.runnable_plan(rungs[key].plan, profile, ctx.device)
             for key in ("sdpa", "compile", "fused_adamw", "cuda_graphs")}
    lp = _ladder_preset(ctx, profile, plans["fused_adamw"])
    c, batch, seq_len = lp.config, lp.batch_size, lp.seq_len
    tokens, flops = batch * seq_len, transformer_flops(c, batch, seq_len)
    attention_flops = 3 * c.n_decoder_layers * batch * 4 * seq_len * seq_len * c.d_model  # in transformer_flops
    peak, peak_source = ladder.peak_flops_for(profile, ctx.device, low)
    ctx.value("batch_size", batch, "sequences", f"{lp.name} at T = {seq_len}: the largest of 16, 8, 4, 2, 1 whose "
              f"{_dtype_name(low)} fused-attention step fits (ladder.step_memory)" if not ctx.toy else
              "rehearsal: the tiny preset at a smaller batch")
    ctx.value("flops_per_step", flops, "FLOP", "model.transformer_flops (matrix products, 3x the forward)")
    ctx.value("peak_flops", peak, "FLOP/s", f"ladder.peak_flops_for: {peak_source}")
    if ctx.toy:
        ctx.note("rehearsal: torch.compile runs with backend='eager' (Dynamo's tracing only: Inductor would take "
                 "many seconds on this CPU), so the compiled rungs' numbers are not a compile's; MFU is divided by "
                 "the rehearsed GPU's datasheet peak")
    medians: dict[str, float] = {}
    mfus: dict[str, float] = {}

    def time_rung(key: str, step, share: float) -> None:
        entry = ctx.time(f"{key}_step", lambda: step([ids]), warmup=ctx.size(1, 2), repeats=ctx.size(3, 10),
                         share=share, work=tokens, work_unit="token")
        medians[key] = entry["median"]
        mfus[key] = ctx.value(f"{key}_mfu", bench.mfu(flops, entry["median"], peak), "share of peak",
                              f"{rungs[key].name}: transformer_flops / median step / {peak_source} (bench.mfu)")

    def compile_layers(**options) -> float | None:
        """Compile every layer and run one step (which compiles forward and backward); its seconds, or None
        when the cap stopped it. A compile that fails for another reason is the item's failure."""
        guard = StopBeforeCap(ctx.seconds_left(), margin_s=ctx.size(3, 25))  # on a GPU a cold backward
        # compile runs inside backward(), on autograd's device thread, where the alarm cannot stop it
        try:
            with guard:
                started = time.perf_counter()
                for layer in model.blocks.layers:
                    layer.compile(**options)
                step([ids])
                bench.synchronize(ctx.device)
                return time.perf_counter() - started
        except Exception as error:  # noqa: BLE001  (the compiler may wrap OutOfTime in an error of its own)
            if not guard.fired:
                raise
            how = ", ".join(f"{k}={v!r}" for k, v in options.items())
            ctx.note(f"torch.compile({how}) did not finish within the cap ({type(error).__name__}: "
                     f"{str(error)[:200]}): the rungs that need it are left out")
            return None

    model, optimizer, step, ids = _lm_training_step(ctx, c, batch, seq_len, plans["sdpa"], tf32=plans["sdpa"].tf32)
    summary, profiled = None, None
    try:
        time_rung("sdpa", step, 0.08)
        # torch.compile of each Transformer layer (regional compilation): the identical layers share one compiled
        # forward and backward, so a cold compile takes seconds where the whole model's (speed.apply_compile, as
        # ladder.measure_rung does it) takes a minute or more; the embedding, the output projection and the loss
        # stay eager. A rehearsal traces with Dynamo only (backend='eager').
        compile_s = compile_layers(**({"backend": "eager"} if ctx.toy else {}))
        if compile_s is not None:
            ctx.value("compile_and_first_step_s", compile_s, "s", "wall time of compiling every layer and the first "
                      "step (Dynamo, AOTAutograd, Inductor and Triton for forward and backward; cold caches unless "
                      "an earlier run on this machine filled them)")
            time_rung("compile", step, 0.1)  # PyTorch's default (foreach) AdamW, as the rung has it
            step = optimizer = None  # the foreach AdamW's state goes before the fused one's
            plan = plans["fused_adamw"]
            optimizer = speed.make_adamw(model.parameters(), plan, lr=1e-4)
            step = speed.make_train_step(model, optimizer, speed.next_token_loss, dtype=plan.dtype,
                                         scaler=speed.grad_scaler(plan, ctx.device), tf32=plan.tf32)
            time_rung("fused_adamw", step, 0.1)
            if ctx.seconds_left() > 6:
                summary, profiled = _profile_summary(ctx, lambda: step([ids]), active=2), "fused_adamw"
        else:  # the compile was stopped: profile the eager rung, on a fresh model
            step = optimizer = model = None
            torch.compiler.reset()
            _free(ctx)
            model, optimizer, step, ids = _lm_training_step(ctx, c, batch, seq_len, plans["sdpa"],
                                                            tf32=plans["sdpa"].tf32)
            if ctx.seconds_left() > 4:
                summary, profiled = _profile_summary(ctx, lambda: step([ids]), active=2), "sdpa"
        if summary is not None:
            _record_profile(ctx, f"{profiled}_profile_", summary, medians[profiled], rungs[profiled].name)
        # CUDA graphs of the compiled layers: a second compile (mode='reduce-overhead'), only where the first one
        # leaves time for it
        if not plans["cuda_graphs"].cuda_graphs:
            ctx.note("CUDA graphs rung left out: " + (ladder.skip_reason(rungs["cuda_graphs"], profile, ctx.device)
                                                      or "not runnable here"))
        elif "fused_adamw" in medians:
            needed = 1.5 * compile_s + 10
            if ctx.seconds_left() < needed:
                ctx.note(f"CUDA graphs rung left out: {ctx.seconds_left():.0f} s of the cap left, {needed:.0f} s "
                         "needed (1.5 x the first compile + 10 s)")
            else:
                try:  # the rungs measured so far stand whatever happens to this one
                    torch.compiler.reset()
                    plan = plans["cuda_graphs"]
                    step = speed.make_train_step(model, optimizer, speed.next_token_loss, dtype=plan.dtype,
                                                 scaler=speed.grad_scaler(plan, ctx.device), tf32=plan.tf32,
                                                 cuda_graphs=True)
                    if compile_layers(mode="reduce-overhead") is not None:
                        for _ in range(2):  # warm-up, then the graphs are recorded
                            step([ids])
                        time_rung("cuda_graphs", step, 0.3)
                except Exception as error:  # noqa: BLE001  (recorded as a note)
                    ctx.note(f"CUDA graphs rung failed: {type(error).__name__}: {str(error)[:300]}")
        best = min(medians, key=medians.get)
        ctx.note(f"fastest rung: {rungs[best].name} ({medians[best] * 1e3:.2f} ms a step, "
                 f"{tokens / medians[best]:,.0f} tokens/s); rungs measured: {', '.join(medians)}")
        for key in medians:
            if key != "sdpa":
                ctx.value(f"{key}_speedup", medians["sdpa"] / medians[key], "x",
                          f"median step of '{rungs['sdpa'].name}' (eager) / of '{rungs[key].name}'")
        ctx.target("ladder_top_rung_mfu", mfus[best], 0.40,
                   why_short=_ladder_words(ctx, rungs, best, mfus[best], medians, summary, profiled, flops,
                                           attention_flops, peak))
    finally:
        model = optimizer = step = None  # noqa: F841  (the rung's model and optimizer go before the cache is freed)
        torch.compiler.reset()
        _free(ctx)


def _ladder_words(ctx: Context, rungs, best: str, mfu: float, medians: dict[str, float], summary, profiled,
                  flops: float, attention_flops: float, peak: float) -> str:
    """What the fastest rung reached, and what the profile shows: time by category, the share of the step the
    device's work fills, and the rate of the matrix products and of attention alone against the peak."""
    words = f"'{rungs[best].name}' reached MFU {mfu:.1%} ({medians[best] * 1e3:.2f} ms a step)"
    if summary is None:
        return words + "; no time was left in the cap to profile a step"
    unit = "kernel time" if _on_gpu(ctx) else "operator time (a CPU)"
    step_s = medians[profiled]
    words += (f"; profile of '{rungs[profiled].name}': {unit} by category {_category_words(summary)}; "
              f"{summary['count']:.0f} {summary['what']} per step, busy {summary['total_us'] * 1e-6 / step_s:.0%} of "
              f"its {step_s * 1e3:.2f} ms")
    rates = []
    for category, work in (("matrix products", flops - attention_flops), ("attention", attention_flops)):
        us = summary["per_step_us"].get(category, 0.0)
        if us > 0:
            rates.append(f"{category} {work / (us * 1e-6) / peak:.0%}")
    if rates:
        words += "; share of the peak reached inside each category's own time: " + ", ".join(rates)
    return words
