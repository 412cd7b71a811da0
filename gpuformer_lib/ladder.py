"""The training ladder: from strict float32 eager to the fastest path, one measured step at a time,
each rung keeping the ones before it.

    fp32 eager -> TF32 matmuls -> bf16 autocast -> fused SDPA attention -> torch.compile
    -> fused AdamW -> CUDA graphs (of the compiled model's forward and backward only)

Each rung is a :class:`~gpuformer_lib.speed.SpeedPlan`: the one before it with one more technique, applied
by the functions of :mod:`gpuformer_lib.speed` and timed with its training step. Every rung trains the same
``DecoderLM`` on the same batch (random token ids: throughput does not depend on the data) and reports step
time, tokens per second, MFU (against the GPU's dense 16-bit datasheet peak, or on a CPU against its
measured float32 matmul peak) and peak memory (GPU only). A last row runs PyTorch's own
``nn.TransformerEncoder`` at the settings of the fused-SDPA rung; and causal attention alone (forward +
backward, explicit against fused) is timed at the preset's shape, in interleaved rounds (:func:`bench.compare`).
By default the rungs are timed one after the other, each alone in memory; ``run_ladder(interleaved=True)`` builds
them all and times them in interleaved rounds, with a verdict per step of the climb (chapter 10 does so on a CPU).

Run it as ``python -m gpuformer_lib.ladder`` (see :func:`main`); each run writes a new, dated JSON file under
``bench_results/runs/`` (git-ignored), so a learner's run never replaces the results committed in
``bench_results/``. The default preset is chosen by memory
(:func:`preset_for`): GPT-2 small with the largest batch whose strictest rung fits the GPU with a margin,
a tiny model on a CPU. A rung that runs out of memory anyway is recorded as skipped; rungs a device cannot
run (TF32 below compute capability 8.0, CUDA graphs off CUDA) are skipped with the reason. A GPU without
bf16 (a T4) climbs with fp16 and a gradient scaler. The embedding's range check (a host sync per step) is
off in every rung. Leaves out: data loading (chapter 7), several GPUs (chapter 11).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from gpuformer_lib import bench, gpu, memory, speed
from gpuformer_lib.device import hardware_summary
from gpuformer_lib.model import DecoderLM, TransformerConfig, count_parameters, gpt2_config, transformer_flops
from gpuformer_lib.profiles import (DeviceProfile, compute_device, compute_dtype, current_profile, display_only,
                                    low_precision_dtype)


@dataclasses.dataclass(frozen=True)
class LadderPreset:
    """A model and batch to climb the ladder with."""

    config: TransformerConfig
    batch_size: int
    seq_len: int
    name: str = "custom"


PRESETS = {
    "gpt2-small": LadderPreset(gpt2_config(), batch_size=16, seq_len=1024, name="gpt2-small"),
    # small enough for a laptop CPU: a few seconds per rung
    "tiny": LadderPreset(TransformerConfig(vocab_size=512, d_model=128, n_heads=4, n_decoder_layers=2, d_ff=512,
                                           dropout=0.0, max_len=128, activation="gelu", positional="learned"),
                         batch_size=8, seq_len=128, name="tiny"),
}


@dataclasses.dataclass(frozen=True)
class Rung:
    """One setting of the ladder: a speed plan, on the library's model or on PyTorch's."""

    key: str
    name: str
    plan: speed.SpeedPlan
    pytorch_model: bool = False
    """Use PyTorch's nn.TransformerEncoder instead of the library's layers."""


STRICT_FP32 = speed.SpeedPlan(dtype=None, tf32=False, fused_attention=False, check_token_ids=False)
"""The first rung: float32 everywhere, explicit attention, no host sync for the id check."""


def ladder_rungs(low_precision: torch.dtype = torch.bfloat16) -> list[Rung]:
    """The rungs in order; ``low_precision`` is bf16, or fp16 on GPUs without bf16 (a T4)."""
    low = str(low_precision).removeprefix("torch.").replace("bfloat", "bf").replace("float", "fp")
    rungs = [Rung("fp32", "fp32 eager (strict)", STRICT_FP32)]
    for key, name, change in [  # one speed technique per rung, added to everything before it
        ("tf32", "+ TF32 matmuls", dict(tf32=True)),
        ("autocast", f"+ {low} autocast", dict(dtype=low_precision)),
        ("sdpa", "+ fused SDPA attention", dict(fused_attention=True)),
        ("compile", "+ torch.compile", dict(compile=True)),
        ("fused_adamw", "+ fused AdamW", dict(fused_optimizer=True)),
        ("cuda_graphs", "+ CUDA graphs", dict(cuda_graphs=True)),
    ]:
        rungs.append(Rung(key, name, dataclasses.replace(rungs[-1].plan, **change)))
    rungs.append(Rung("pytorch", "PyTorch nn.TransformerEncoder, as '+ fused SDPA'", rungs[3].plan,
                      pytorch_model=True))
    return rungs


RUNG_KEYS = tuple(r.key for r in ladder_rungs())

# --------------------------------------------------------------------------- what fits: chosen by memory

MEMORY_MARGIN = 0.2
"""Share of a GPU's memory left free when choosing sizes: the calculator omits the allocator's rounding,
temporaries inside one operation and the CUDA context."""


def step_memory(config: TransformerConfig, batch_size: int, seq_len: int, plan: speed.SpeedPlan) -> int:
    """Bytes of a training step of a ``DecoderLM`` with AdamW under ``plan``, by the calculator
    (:func:`memory.training_memory`) plus what it omits: the loss's vocabulary-sized temporaries (logits,
    log-softmax and its gradient, B*T*V*4 bytes each)."""
    with torch.device("meta"):  # counts parameters without allocating them
        n_params = count_parameters(DecoderLM(config))
    low = plan.dtype is not None
    calculated = memory.training_memory(
        n_params, n_layers=config.n_decoder_layers, d_model=config.d_model, n_heads=config.n_heads,
        d_ff=config.d_ff, seq_len=seq_len, batch_size=batch_size, vocab_size=config.vocab_size,
        activation_bytes=2 if low else 4, autocast=low, fused_attention=plan.fused_attention,
        dropout=config.dropout > 0, checkpointing=plan.checkpointing).total
    return calculated + 3 * batch_size * seq_len * config.vocab_size * 4


def _fits(nbytes: int, profile: DeviceProfile) -> bool:
    return nbytes <= (1 - MEMORY_MARGIN) * profile.memory_gib * 2**30


def preset_for(profile: DeviceProfile) -> LadderPreset:
    """The default preset for a device, by memory: on a GPU, GPT-2 small at T = 1024 with the largest batch
    of 16, 8, 4, 2, 1 whose strictest rung (fp32, explicit attention: B*H*T^2 scores per layer) fits with
    :data:`MEMORY_MARGIN` to spare; the tiny preset on a CPU, on MPS, and in rehearsal (which computes on
    the CPU)."""
    if not profile.on_gpu or profile.rehearsal:
        return PRESETS["tiny"]
    gpt2 = PRESETS["gpt2-small"]
    for batch_size in (16, 8, 4, 2, 1):
        if _fits(step_memory(gpt2.config, batch_size, gpt2.seq_len, STRICT_FP32), profile):
            return dataclasses.replace(gpt2, batch_size=batch_size)
    return PRESETS["tiny"]


def configs_that_fit(configs: list[TransformerConfig], batch_size: int, seq_len: int, profile: DeviceProfile,
                     plan: speed.SpeedPlan) -> list[TransformerConfig]:
    """The models among ``configs`` whose training step under ``plan`` fits the GPU with
    :data:`MEMORY_MARGIN` to spare (for a sweep of sizes); all of them on a device without a known memory
    (a CPU). Raises ``ValueError`` if none fits."""
    if not profile.on_gpu:
        return list(configs)
    fit = [c for c in configs if _fits(step_memory(c, batch_size, seq_len, plan), profile)]
    if not fit:
        raise ValueError(f"none of the {len(configs)} models fits {profile.memory_gib} GiB at batch {batch_size} x "
                         f"{seq_len}: use a smaller batch or sequence")
    return fit


# --------------------------------------------------------------------------- measuring a rung


@dataclasses.dataclass
class LadderRow:
    key: str
    rung: str
    step_s: float | None = None
    """Median seconds per optimizer step (None: skipped)."""
    first_step_s: float | None = None
    """Seconds of the first step: includes compilation for the compiled rungs."""
    tokens_per_s: float | None = None
    mfu: float | None = None
    peak_memory_gib: float | None = None
    loss: float | None = None
    speedup: float | None = None
    """Step time of the first measured rung / this rung's (time before / time after)."""
    note: str = ""


class PyTorchLM(nn.Module):
    """The same decoder-only model built from PyTorch's ``nn.TransformerEncoder`` (pre-LN, GELU)."""

    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.pos = nn.Embedding(c.max_len, c.d_model)
        for table in (self.embed, self.pos):
            nn.init.normal_(table.weight, std=c.d_model ** -0.5)  # as the library's, so the losses compare
        layer = nn.TransformerEncoderLayer(c.d_model, c.n_heads, c.d_ff, dropout=c.dropout, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, c.n_decoder_layers, norm=nn.LayerNorm(c.d_model),
                                            enable_nested_tensor=False)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        T = ids.shape[1]
        x = self.embed(ids) * self.embed.embedding_dim ** 0.5 + self.pos(torch.arange(T, device=ids.device))
        mask = nn.Transformer.generate_square_subsequent_mask(T, device=ids.device, dtype=x.dtype)
        return self.lm_head(self.blocks(x, mask=mask, is_causal=True) * self.embed.embedding_dim ** -0.5)  # tied: as
        # the library's OutputProjection, so the losses compare


def skip_reason(rung: Rung, profile: DeviceProfile, device: torch.device) -> str | None:
    """Why a device cannot run the rung that introduces a feature (later rungs simply go without it)."""
    if rung.key == "tf32" and not profile.tf32:
        return "TF32 needs an NVIDIA GPU of compute capability 8.0 or newer"
    if rung.key == "cuda_graphs" and device.type != "cuda":
        return "CUDA graphs need a CUDA device" + (" (a rehearsal computes on the CPU)" if profile.rehearsal else "")
    return None


def runnable_plan(plan: speed.SpeedPlan, profile: DeviceProfile, device: torch.device) -> speed.SpeedPlan:
    """``plan`` without what the device cannot run (TF32, CUDA graphs)."""
    return dataclasses.replace(plan, tf32=plan.tf32 and profile.tf32,
                               cuda_graphs=plan.cuda_graphs and device.type == "cuda")


def peak_flops_for(profile: DeviceProfile, device: torch.device | str,
                   dtype: torch.dtype) -> tuple[float, str]:
    """The peak MFU divides by, and where it comes from: on a GPU the datasheet's dense peak for ``dtype``
    (looked up by the profile's GPU name, so a rehearsal reports the rehearsed GPU's); for a GPU the table
    does not know, and on a CPU or MPS, a measured matrix-product peak (:func:`bench.measured_peak_flops`: the
    fastest of >= 10 repeats, measured once per process, so a chapter and the ladder divide by the same number).
    On a CPU the peak is the faster of float32 and ``dtype`` (a CPU with native bf16 multiplies faster in bf16
    than in float32): every rung of a run is divided by a peak none of them can exceed."""
    device = torch.device(device)
    if profile.on_gpu:
        try:
            return bench.peak_flops(dtype, gpu_name=profile.gpu_name), f"datasheet dense {_name(dtype)} peak"
        except ValueError:
            pass  # not in the table: measure it
        return bench.measured_peak_flops(device, dtype), f"measured {_name(dtype)} matmul peak (fastest of 10)"
    formats = [torch.float32] + ([dtype] if dtype != torch.float32 else [])
    peaks = {d: bench.measured_peak_flops(device, d) for d in formats}
    fastest = max(peaks, key=peaks.get)
    return peaks[fastest], f"measured {_name(fastest)} matmul peak (fastest of 10)"


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _prepare_rung(rung: Rung, preset: LadderPreset, device: torch.device, profile: DeviceProfile):
    """A fresh model, optimizer and batch for ``rung``, built with :mod:`speed`: returns the plan, a function
    that runs one training step and the dict where it leaves the step's loss."""
    plan = runnable_plan(rung.plan, profile, device)
    c, B, T = preset.config, preset.batch_size, preset.seq_len
    torch.manual_seed(0)
    model = (PyTorchLM(c) if rung.pytorch_model else DecoderLM(speed.model_config(c, plan))).to(device)
    model = speed.apply_plan(model, plan, device)  # checkpointing, then compile
    optimizer = speed.make_adamw(model.parameters(), plan, lr=1e-4)
    step = speed.make_train_step(model, optimizer, speed.next_token_loss, dtype=plan.dtype,
                                 scaler=speed.grad_scaler(plan, device), tf32=plan.tf32, cuda_graphs=plan.cuda_graphs)
    ids = torch.randint(0, c.vocab_size, (B, T + 1), generator=torch.Generator().manual_seed(1)).to(device)
    last: dict = {}

    def run() -> None:
        last["loss"] = step([ids]).loss

    return plan, run, last


def _first_step(row: LadderRow, run: Callable[[], None], device: torch.device) -> None:
    started = time.perf_counter()
    run()
    bench.synchronize(device)
    row.first_step_s = time.perf_counter() - started


def _fill_row(row: LadderRow, step_s: float, loss: torch.Tensor, preset: LadderPreset, peak: float | None) -> None:
    c, B, T = preset.config, preset.batch_size, preset.seq_len
    row.step_s = step_s
    row.tokens_per_s = B * T / row.step_s
    row.loss = float(loss)
    if peak:
        row.mfu = bench.mfu(transformer_flops(c, B, T), row.step_s, peak)


def measure_rung(rung: Rung, preset: LadderPreset, device: torch.device | str, *, profile: DeviceProfile | None = None,
                 steps: int = 10, warmup: int = 3, peak: float | None = None) -> LadderRow:
    """Build a fresh model, optimizer and batch for ``rung`` with :mod:`speed` and time its training step."""
    device = torch.device(device)
    profile = profile or current_profile(device)
    row = LadderRow(rung.key, rung.name)
    reason = skip_reason(rung, profile, device)
    if reason:
        row.note = f"skipped: {reason}"
        return row
    plan, run, last = _prepare_rung(rung, preset, device, profile)
    try:
        if profile.on_gpu:
            gpu.reset_peak_memory_stats(device)
        _first_step(row, run, device)
        timing = bench.time_fn(run, device=device, warmup=max(warmup - 1, 0), repeats=steps)
        _fill_row(row, timing.median, last["loss"], preset, peak)
        if profile.on_gpu:
            row.peak_memory_gib = gpu.max_memory_allocated(device) / 2**30
    finally:
        if plan.compile:
            torch.compiler.reset()
    return row  # the model and optimizer go with this frame; run_ladder then empties the CUDA cache


def _measure_interleaved(rungs: list[Rung], preset: LadderPreset, device: torch.device, profile: DeviceProfile, *,
                         steps: int, warmup: int, peak: float | None, max_seconds: float | None,
                         verbose: bool) -> tuple[list[LadderRow], dict[str, bench.Timing]]:
    """Every runnable rung built at once (all their models in memory), each run once untimed (compilation),
    then timed in interleaved rounds by :func:`bench.time_interleaved`: a change in the machine's load meets
    every rung alike. Returns the rows and the timings by rung key."""
    rows, runs, lasts, compiled = [], {}, {}, False
    try:
        for rung in rungs:
            row = LadderRow(rung.key, rung.name)
            rows.append(row)
            reason = skip_reason(rung, profile, device)
            if reason:
                row.note = f"skipped: {reason}"
                continue
            if verbose:
                print(f"building {rung.name} ...", file=sys.stderr, flush=True)
            plan, run, last = _prepare_rung(rung, preset, device, profile)
            compiled = compiled or plan.compile
            _first_step(row, run, device)
            runs[rung.key], lasts[rung.key] = run, last
        timings = bench.time_interleaved(runs, device=device, warmup=max(warmup - 1, 0), repeats=max(steps, 5),
                                         max_repeats=max(steps, 5) * 3, max_seconds=max_seconds)
        for row in rows:
            if row.key in timings:
                _fill_row(row, timings[row.key].median, lasts[row.key]["loss"], preset, peak)
    finally:
        if compiled:
            torch.compiler.reset()
    return rows, timings


def rung_comparisons(rows: list[LadderRow], timings: dict[str, bench.Timing]) -> dict[str, bench.Comparison]:
    """Each timed rung against the timed rung before it (the climb's step), PyTorch's model against the
    fused-SDPA rung it copies, by the candidate's key: :class:`bench.Comparison` of interleaved rounds, whose
    verdict says whether the step is beyond the rounds' spread."""
    timed = [r.key for r in rows if r.key in timings and r.key != "pytorch"]
    out = {key: bench.Comparison(before, key, timings) for before, key in zip(timed, timed[1:])}
    if "pytorch" in timings and "sdpa" in timings:
        out["pytorch"] = bench.Comparison("sdpa", "pytorch", timings)
    return out


def attention_benchmark(device: torch.device, *, batch_size: int, n_heads: int, seq_len: int, head_size: int = 64,
                        dtype: torch.dtype = torch.bfloat16, repeats: int = 10) -> dict:
    """Causal attention forward + backward: the course's explicit attention against PyTorch's fused
    ``F.scaled_dot_product_attention``, same inputs, timed in interleaved rounds (:func:`bench.compare`);
    returns both median times, the speedup, the middle half of the rounds' speedups, the verdict and its
    phrase."""
    from gpuformer_lib.attention import scaled_dot_product_attention

    shape = (batch_size, n_heads, seq_len, head_size)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape, device=device, dtype=dtype)

    def explicit() -> None:
        out, _ = scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(grad)

    def fused() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)

    result = bench.compare({"explicit": explicit, "fused": fused}, device=device, warmup=2,
                           repeats=max(repeats, 5), max_repeats=max(repeats, 5) * 3)["fused"]
    return {"shape": list(shape), "dtype": str(dtype).removeprefix("torch."),
            "explicit_s": result.timings["explicit"].median, "fused_s": result.timings["fused"].median,
            "speedup": result.speedup, "ratio_range": list(result.ratio_range), "verdict": result.verdict,
            "phrase": result.phrase()}


# --------------------------------------------------------------------------- the whole ladder


@dataclasses.dataclass
class LadderResult:
    preset: str
    device: str
    profile: str
    """The device profile the choices were made from (a GPU's name under rehearsal)."""
    hardware: dict
    batch_size: int
    seq_len: int
    n_params: int
    flops_per_step: int
    peak_flops: float | None
    peak_source: str
    rows: list[LadderRow]
    attention: dict
    """Causal attention forward + backward at the preset's shape: explicit against fused (SDPA)."""
    versions: dict
    date: str
    comparisons: dict[str, bench.Comparison] = dataclasses.field(default_factory=dict)
    """With ``interleaved=True``: each timed rung against the one before it, PyTorch's model against the
    fused-SDPA rung (:func:`rung_comparisons`), by the candidate's key; empty when the rungs were timed one
    after the other (each alone in memory), which gives no rung-to-rung verdict."""

    def row(self, key: str) -> LadderRow:
        return next(r for r in self.rows if r.key == key)

    def table(self) -> str:
        head = f"{'rung':52} {'step':>10} {'tokens/s':>10} {'MFU':>6} {'memory':>9} {'speedup':>8} {'loss':>7}"
        lines = [head, "-" * len(head)]
        for r in self.rows:
            if r.step_s is None:
                lines.append(f"{r.rung:52} {r.note}")
                continue
            mem = f"{r.peak_memory_gib:.2f} GiB" if r.peak_memory_gib is not None else "-"
            mfu = f"{r.mfu:.1%}" if r.mfu is not None else "-"
            lines.append(f"{r.rung:52} {bench.format_seconds(r.step_s):>10} {r.tokens_per_s:10.4g} {mfu:>6} "
                         f"{mem:>9} {r.speedup:7.2f}x {r.loss:7.3f}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        out = {f.name: dataclasses.asdict(self)[f.name] for f in dataclasses.fields(self) if f.name != "comparisons"}
        out["comparisons"] = {key: {"baseline": c.baseline, "candidate": c.candidate, "speedup": c.speedup,
                                    "ratio_range": list(c.ratio_range), "verdict": c.verdict, "rounds": len(c.ratios)}
                              for key, c in self.comparisons.items()}
        return out


def _versions() -> dict[str, str]:
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    return {"python": platform.python_version(), "torch": torch.__version__, "cuda": str(torch.version.cuda),
            "triton": triton_version}


def run_ladder(preset: str | LadderPreset | None = None, device: str | torch.device | None = None, *,
               steps: int = 10, warmup: int = 3, skip: tuple[str, ...] = (), verbose: bool = True,
               interleaved: bool = False, max_seconds: float | None = None) -> LadderResult:
    """Measure every rung for ``preset`` (default: :func:`preset_for` this device) on ``device`` (default: the
    best available; the CPU in a rehearsal).

    By default each rung is built, timed and freed in turn (``steps`` timed steps), so that only one rung's model
    is in memory at a time: the GPU suite's way, and the command's. Timings taken one after the other do not
    say whether one rung beat the next on a machine whose load changes. With ``interleaved=True`` every rung is
    built at once and the rungs are timed in interleaved rounds (:func:`bench.time_interleaved`, at least 5,
    more while the spread is wide, ``max_seconds`` capping the extra rounds), and
    :attr:`LadderResult.comparisons` holds a verdict per step of the climb (:func:`rung_comparisons`): for a
    small model on a CPU or a GPU with room for every rung's model. Out of memory is then not caught."""
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}: choose one of {sorted(PRESETS)}")
        preset = PRESETS[preset]
    unknown = set(skip) - set(RUNG_KEYS)
    if unknown:
        raise ValueError(f"unknown rungs to skip {sorted(unknown)}: the rungs are {', '.join(RUNG_KEYS)}")
    if steps < 1 or warmup < 1:
        raise ValueError("need steps >= 1 and warmup >= 1 (the first step, with compilation, is never timed)")
    profile = current_profile(device)
    device = compute_device(profile, device)
    preset = preset if preset is not None else preset_for(profile)
    low = low_precision_dtype(profile) or torch.bfloat16  # a CPU without native bf16 shows what emulation costs
    peak, source = peak_flops_for(profile, device, low)
    rows, comparisons = [], {}
    if interleaved:
        wanted = [r for r in ladder_rungs(low) if r.key not in skip]
        timed_rows, timings = _measure_interleaved(wanted, preset, device, profile, steps=steps, warmup=warmup,
                                                   peak=peak, max_seconds=max_seconds, verbose=verbose)
        by_key = {r.key: r for r in timed_rows}
        rows = [by_key.get(r.key) or LadderRow(r.key, r.name, note="skipped: asked to") for r in ladder_rungs(low)]
        comparisons = rung_comparisons(rows, timings)
        memory.free_cached_memory()
    for rung in ([] if interleaved else ladder_rungs(low)):
        if rung.key in skip:
            rows.append(LadderRow(rung.key, rung.name, note="skipped: asked to"))
            continue
        if verbose:
            print(f"measuring {rung.name} ...", file=sys.stderr, flush=True)
        try:
            rows.append(measure_rung(rung, preset, device, profile=profile, steps=steps, warmup=warmup, peak=peak))
        except Exception as error:  # noqa: BLE001 - only out-of-memory is recorded; the rest is re-raised
            if not memory.is_out_of_memory(error):
                raise
            rows.append(LadderRow(rung.key, rung.name, note="skipped: out of memory"))
        memory.free_cached_memory()  # the rung's model is gone: start the next one with a clean pool
    first = next((r.step_s for r in rows if r.step_s is not None), None)
    for r in rows:
        if r.step_s is not None:
            r.speedup = bench.speedup(first, r.step_s)
    c = preset.config
    attention = attention_benchmark(device, batch_size=preset.batch_size, n_heads=c.n_heads, seq_len=preset.seq_len,
                                    head_size=c.head_size, dtype=compute_dtype(profile), repeats=steps)
    with display_only():  # the profile's name labels the result: no choice is made from it
        profile_name = profile.name
    return LadderResult(
        preset=preset.name, device=str(device), profile=profile_name,
        hardware=dataclasses.asdict(hardware_summary(device)), batch_size=preset.batch_size, seq_len=preset.seq_len,
        n_params=count_parameters(DecoderLM(c)), flops_per_step=transformer_flops(c, preset.batch_size, preset.seq_len),
        peak_flops=peak, peak_source=source, rows=rows, attention=attention, versions=_versions(),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), comparisons=comparisons)


def _slug(text: str) -> str:
    return "".join(ch.lower() if ch.isalnum() else "-" for ch in text).strip("-")


RUNS_DIR = Path("bench_results") / "runs"
"""Where a run writes by default, relative to the current folder: git-ignored (``**/bench_results/runs/``), so
that running the command from the repository never changes the committed ``bench_results/ladder-*.json``, which
chapter 10 lists as the results measured on other devices."""


def default_json_path(result: LadderResult) -> Path:
    """``bench_results/runs/ladder-<preset>-<device>-<UTC time>.json``: a new name per run, so runs never replace
    one another. To add a result to the committed ones, pass ``--json bench_results/ladder-<preset>-<device>.json``
    (and ``--overwrite`` to replace one)."""
    stamp = datetime.datetime.fromisoformat(result.date).astimezone(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return RUNS_DIR / f"ladder-{result.preset}-{_slug(result.hardware.get('gpu_name') or result.device)}-{stamp}.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuformer_lib.ladder",
                                     description="Climb the training ladder: fp32 -> TF32 -> bf16 -> fused SDPA -> "
                                                 "torch.compile -> fused AdamW -> CUDA graphs; print a table, "
                                                 "write JSON.")
    parser.add_argument("--preset", choices=sorted(PRESETS),
                        help="model and batch (default: chosen by the GPU's memory, gpt2-small with the largest batch "
                             "whose fp32 rung fits; tiny on a CPU)")
    parser.add_argument("--device", help="cuda, cuda:1, mps or cpu (default: the best available)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per rung (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per rung, compilation included")
    parser.add_argument("--skip", default="", help=f"comma-separated rungs to leave out, of: {','.join(RUNG_KEYS)}")
    parser.add_argument("--json", dest="json_path",
                        help="where to write the results (default: a new file per run, "
                             "bench_results/runs/ladder-<preset>-<device>-<UTC time>.json, git-ignored)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the --json file if it exists (without it, an existing file is refused: "
                             "bench_results/ holds the committed results)")
    parser.add_argument("--allow-cpu-gpt2", action="store_true", help="run gpt2-small on a CPU anyway (very slow)")
    args = parser.parse_args(argv)
    if args.json_path and (not args.json_path.endswith(".json") or Path(args.json_path).is_dir()):
        parser.error(f"--json {args.json_path}: give a file name ending in .json, e.g. --json my-ladder.json")
    if args.json_path and Path(args.json_path).exists() and not args.overwrite:  # refused before minutes of work
        parser.error(f"--json {args.json_path} exists and may be a committed result: pass --overwrite to replace it, "
                     "or leave out --json to write a new file under bench_results/runs/")
    profile = current_profile(args.device)
    device = compute_device(profile, args.device)
    preset = PRESETS[args.preset] if args.preset else preset_for(profile)
    if preset.name == "gpt2-small" and device.type == "cpu" and not args.allow_cpu_gpt2:
        parser.error("gpt2-small takes minutes per step on a CPU: use --preset tiny (or --allow-cpu-gpt2)")
    skip = tuple(s.strip() for s in args.skip.split(",") if s.strip())
    try:
        result = run_ladder(preset, args.device, steps=args.steps, warmup=args.warmup, skip=skip)
    except ValueError as error:
        parser.error(str(error))
    print(f"{preset.name}: {result.n_params / 1e6:.1f} M parameters, batch {result.batch_size} x {result.seq_len} "
          f"tokens, {result.flops_per_step / 1e12:.3g} TFLOP per step")
    gpu_name = result.hardware.get("gpu_name")
    print(f"device: {gpu_name or result.device} (profile {result.profile}); MFU against the {result.peak_source}"
          + (f" = {bench.format_rate(result.peak_flops, 'FLOP/s')}" if result.peak_flops else ""))
    print(result.table())
    a = result.attention
    print(f"causal attention forward + backward, {a['dtype']}, (B, H, T, hs) = {tuple(a['shape'])}: explicit "
          f"{bench.format_seconds(a['explicit_s'])}, fused SDPA {bench.format_seconds(a['fused_s'])}: "
          f"{a['speedup']:.1f}x")
    path = Path(args.json_path) if args.json_path else default_json_path(result)
    if path.exists() and not args.overwrite:  # appeared during the run (checked before it too)
        parser.error(f"{path} exists: pass --json with another name, or --overwrite to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:  # through a temporary file: an interruption leaves the old results or the new ones
        tmp.write_text(json.dumps(result.to_json(), indent=2, default=str) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
