"""The training ladder of chapter 10: from strict float32 eager to the fastest path, one measured step
at a time, each rung keeping the ones before it.

    fp32 eager -> TF32 matmuls -> bf16 autocast -> fused SDPA attention -> torch.compile
    -> fused AdamW -> CUDA graphs

Every rung trains the same ``DecoderLM`` on the same batch (random token ids: throughput does not
depend on the data) and reports step time, tokens per second, MFU (against the GPU's dense 16-bit
datasheet peak, or on a CPU against its measured float32 matmul peak) and peak memory (CUDA only).
A last row runs PyTorch's own ``nn.TransformerEncoder`` at the settings of the fused-SDPA rung, so
the library's step can be compared with PyTorch's; and causal attention alone (forward + backward,
explicit against fused) is timed at the preset's shape (bf16 on a GPU, float32 on a CPU).

Run it as ``python -m gpuformer_lib.bench`` (see :func:`main`). Rungs a device cannot run (TF32 and
CUDA graphs on a CPU) are reported as skipped, with the reason; a GPU without bf16 (a T4) climbs
with fp16 and a gradient scaler instead. The embedding's range check (a host sync per step) is
off in every rung: chapter 10 measures it separately. Leaves out: data loading (chapter 7), several GPUs (chapter 11).
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

import torch
import torch.nn.functional as F
from torch import nn

from gpuformer_lib import bench
from gpuformer_lib.attention import MultiHeadAttention
from gpuformer_lib.device import hardware_summary, pick_device
from gpuformer_lib.model import DecoderLM, TokenEmbedding, TransformerConfig, count_parameters, gpt2_config


@dataclasses.dataclass(frozen=True)
class LadderPreset:
    """A model and batch to climb the ladder with."""

    config: TransformerConfig
    batch_size: int
    seq_len: int


PRESETS = {
    "gpt2-small": LadderPreset(gpt2_config(), batch_size=16, seq_len=1024),
    # small enough for a laptop CPU: a few seconds per rung
    "tiny": LadderPreset(TransformerConfig(vocab_size=512, d_model=128, n_heads=4, n_decoder_layers=2, d_ff=512,
                                           dropout=0.0, max_len=128, activation="gelu", positional="learned"),
                         batch_size=8, seq_len=128),
}


@dataclasses.dataclass(frozen=True)
class Rung:
    """One setting of the ladder. Each rung of :func:`ladder_rungs` keeps everything before it."""

    key: str
    name: str
    tf32: bool = False
    dtype: torch.dtype | None = None
    """Autocast dtype (None: float32)."""
    fused_attention: bool = False
    compile: bool = False
    fused_adamw: bool = False
    cuda_graphs: bool = False
    pytorch_model: bool = False
    """Use PyTorch's nn.TransformerEncoder instead of the library's layers."""


def ladder_rungs(low_precision: torch.dtype = torch.bfloat16) -> list[Rung]:
    """The rungs in order; ``low_precision`` is bf16, or fp16 on GPUs without bf16 (a T4)."""
    low = str(low_precision).removeprefix("torch.").replace("bfloat", "bf").replace("float", "fp")
    rungs = [Rung("fp32", "fp32 eager (strict)")]
    for key, name, change in [
        ("tf32", "+ TF32 matmuls", dict(tf32=True)),
        ("autocast", f"+ {low} autocast", dict(dtype=low_precision)),
        ("sdpa", "+ fused SDPA attention", dict(fused_attention=True)),
        ("compile", "+ torch.compile", dict(compile=True)),
        ("fused_adamw", "+ fused AdamW", dict(fused_adamw=True)),
        ("cuda_graphs", "+ CUDA graphs", dict(cuda_graphs=True)),
    ]:
        rungs.append(dataclasses.replace(rungs[-1], key=key, name=name, **change))
    rungs.append(dataclasses.replace(rungs[3], key="pytorch", name="PyTorch nn.TransformerEncoder, as '+ fused SDPA'",
                                     pytorch_model=True))
    return rungs


RUNG_KEYS = tuple(r.key for r in ladder_rungs())


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
    """Step time of the first rung / this rung's (time before / time after)."""
    note: str = ""


class PyTorchLM(nn.Module):
    """The same decoder-only model built from PyTorch's ``nn.TransformerEncoder`` (pre-LN, GELU)."""

    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.pos = nn.Embedding(c.max_len, c.d_model)
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
        return self.lm_head(self.blocks(x, mask=mask, is_causal=True))


def _skip_reason(rung: Rung, device: torch.device) -> str | None:
    """Why a device cannot run the rung that introduces a feature (later rungs simply go without it)."""
    if rung.key in ("tf32", "cuda_graphs") and device.type != "cuda":
        return "TF32 and CUDA graphs are NVIDIA GPU features"
    if rung.key == "tf32" and torch.cuda.get_device_capability(device) < (8, 0):
        return "TF32 needs compute capability 8.0 or newer"
    return None


def _peak(device: torch.device, dtype: torch.dtype) -> tuple[float | None, str]:
    if device.type == "cuda":
        try:
            return bench.peak_flops(dtype, device), f"datasheet dense {dtype} peak"
        except ValueError as error:
            return None, str(error)
    n = 1024 if device.type == "cpu" else 2048
    measured = bench.measure_matmul(n, torch.float32, device, repeats=5, max_seconds=1.0).flops_per_s
    return measured, f"measured float32 matmul peak (n={n})"


def measure_rung(rung: Rung, preset: LadderPreset, device: torch.device, *, steps: int = 10, warmup: int = 3,
                 peak: float | None = None) -> LadderRow:
    """Build a fresh model, optimizer and batch for ``rung`` and time its training step."""
    row = LadderRow(rung.key, rung.name)
    reason = _skip_reason(rung, device)
    if reason:
        row.note = f"skipped: {reason}"
        return row
    c, B, T = preset.config, preset.batch_size, preset.seq_len
    torch.manual_seed(0)
    model: nn.Module = (PyTorchLM(c) if rung.pytorch_model else DecoderLM(c)).to(device)
    for m in model.modules():
        if isinstance(m, MultiHeadAttention):
            m.use_sdpa = rung.fused_attention
        if isinstance(m, TokenEmbedding):
            m.check_ids = False  # a host sync per step; the batch is known to be in range
        if isinstance(m, nn.Embedding) and not isinstance(m, TokenEmbedding):
            nn.init.normal_(m.weight, std=c.d_model ** -0.5)  # as the library's, so the losses compare
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=rung.fused_adamw or None)
    scaler = torch.amp.GradScaler(device.type, enabled=rung.dtype == torch.float16)
    on_gpu = device.type == "cuda"
    if rung.compile:
        model = torch.compile(model, mode="reduce-overhead" if rung.cuda_graphs and on_gpu else None)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, c.vocab_size, (B, T + 1), generator=g).to(device)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    last = {}

    def step() -> None:
        with torch.autocast(device.type, dtype=rung.dtype, enabled=rung.dtype is not None):
            logits = model(inputs)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())  # (B*T, V) in float32
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        last["loss"] = loss.detach()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with bench.float32_matmul_precision("high" if rung.tf32 and on_gpu else "highest"):
        started = time.perf_counter()
        step()
        bench.synchronize(device)
        row.first_step_s = time.perf_counter() - started
        timing = bench.time_fn(step, device=device, warmup=max(warmup - 1, 0), repeats=steps)
    row.step_s = timing.median
    row.tokens_per_s = B * T / row.step_s
    row.loss = float(last["loss"])
    if peak:
        row.mfu = bench.mfu(bench.transformer_flops(c, B, T), row.step_s, peak)
    if device.type == "cuda":
        row.peak_memory_gib = torch.cuda.max_memory_allocated(device) / 2**30
    if rung.compile:
        torch._dynamo.reset()
    return row  # the model and optimizer go with this frame; run_ladder then empties the CUDA cache


def attention_benchmark(device: torch.device, *, batch_size: int, n_heads: int, seq_len: int, head_size: int = 64,
                        dtype: torch.dtype = torch.bfloat16, repeats: int = 10) -> dict:
    """Causal attention forward + backward: the course's explicit attention against PyTorch's fused
    ``F.scaled_dot_product_attention``, same inputs; returns both times and the speedup."""
    from gpuformer_lib.attention import scaled_dot_product_attention

    shape = (batch_size, n_heads, seq_len, head_size)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape, device=device, dtype=dtype)

    def explicit() -> None:
        out, _ = scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(grad)

    def fused() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)

    times = {name: bench.time_fn(fn, device=device, warmup=2, repeats=repeats).median
             for name, fn in (("explicit_s", explicit), ("fused_s", fused))}
    return {"shape": list(shape), "dtype": str(dtype).removeprefix("torch."), **times,
            "speedup": bench.speedup(times["explicit_s"], times["fused_s"])}


@dataclasses.dataclass
class LadderResult:
    preset: str
    device: str
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
        return dataclasses.asdict(self)


def _versions() -> dict[str, str]:
    return {"python": platform.python_version(), "torch": torch.__version__,
            "cuda": str(torch.version.cuda), "triton": _triton_version()}


def _triton_version() -> str:
    try:
        import triton
        return triton.__version__
    except ImportError:
        return "none"


def run_ladder(preset: str | LadderPreset = "tiny", device: str | torch.device | None = None, *, steps: int = 10,
               warmup: int = 3, skip: tuple[str, ...] = (), verbose: bool = True) -> LadderResult:
    """Measure every rung for ``preset`` on ``device`` (default: the best available)."""
    name = preset if isinstance(preset, str) else "custom"
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}: choose one of {sorted(PRESETS)}")
        preset = PRESETS[preset]
    unknown = set(skip) - set(RUNG_KEYS)
    if unknown:
        raise ValueError(f"unknown rungs to skip {sorted(unknown)}: the rungs are {', '.join(RUNG_KEYS)}")
    if steps < 1 or warmup < 1:
        raise ValueError("need steps >= 1 and warmup >= 1 (the first step, with compilation, is never timed)")
    device = pick_device(device)
    low = torch.bfloat16
    if device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        low = torch.float16  # a T4 or V100: fp16 with a gradient scaler
    peak, source = _peak(device, low)
    rows = []
    for rung in ladder_rungs(low):
        if rung.key in skip:
            rows.append(LadderRow(rung.key, rung.name, note="skipped: asked to"))
            continue
        if verbose:
            print(f"measuring {rung.name} ...", file=sys.stderr, flush=True)
        rows.append(measure_rung(rung, preset, device, steps=steps, warmup=warmup, peak=peak))
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the rung's model is gone: start the next one with a clean pool
    first = next((r.step_s for r in rows if r.step_s is not None), None)
    for r in rows:
        if r.step_s is not None and first is not None:
            r.speedup = bench.speedup(first, r.step_s)
    c = preset.config
    attention = attention_benchmark(device, batch_size=preset.batch_size, n_heads=c.n_heads, seq_len=preset.seq_len,
                                    head_size=c.head_size, dtype=low if device.type == "cuda" else torch.float32,
                                    repeats=steps)
    return LadderResult(
        preset=name, device=str(device), hardware=dataclasses.asdict(hardware_summary(device)),
        batch_size=preset.batch_size, seq_len=preset.seq_len, n_params=count_parameters(DecoderLM(c)),
        flops_per_step=bench.transformer_flops(c, preset.batch_size, preset.seq_len), peak_flops=peak,
        peak_source=source, rows=rows, attention=attention, versions=_versions(),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


def _slug(text: str) -> str:
    return "".join(ch.lower() if ch.isalnum() else "-" for ch in text).strip("-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuformer_lib.bench",
                                     description="Climb the training ladder: fp32 -> TF32 -> bf16 -> fused SDPA -> "
                                                 "torch.compile -> fused AdamW -> CUDA graphs; print a table, "
                                                 "write JSON.")
    parser.add_argument("--preset", choices=sorted(PRESETS),
                        help="model and batch (default: gpt2-small on a CUDA GPU, tiny elsewhere)")
    parser.add_argument("--device", help="cuda, cuda:1, mps or cpu (default: the best available)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per rung (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per rung, compilation included")
    parser.add_argument("--skip", default="", help=f"comma-separated rungs to leave out, of: {','.join(RUNG_KEYS)}")
    parser.add_argument("--json", dest="json_path",
                        help="where to write the results (default: bench_results/ladder-<preset>-<device>.json)")
    parser.add_argument("--allow-cpu-gpt2", action="store_true", help="run gpt2-small on a CPU anyway (very slow)")
    args = parser.parse_args(argv)
    device = pick_device(args.device)
    preset = args.preset or ("gpt2-small" if device.type == "cuda" else "tiny")
    if preset == "gpt2-small" and device.type == "cpu" and not args.allow_cpu_gpt2:
        parser.error("gpt2-small takes minutes per step on a CPU: use --preset tiny (or --allow-cpu-gpt2)")
    skip = tuple(s.strip() for s in args.skip.split(",") if s.strip())
    try:
        result = run_ladder(preset, device, steps=args.steps, warmup=args.warmup, skip=skip)
    except ValueError as error:
        parser.error(str(error))
    print(f"{preset}: {result.n_params / 1e6:.1f} M parameters, batch {result.batch_size} x {result.seq_len} tokens, "
          f"{result.flops_per_step / 1e12:.3g} TFLOP per step")
    gpu = result.hardware.get("gpu_name")
    print(f"device: {gpu or result.device}; MFU against the {result.peak_source}"
          + (f" = {bench.format_rate(result.peak_flops, 'FLOP/s')}" if result.peak_flops else ""))
    print(result.table())
    a = result.attention
    print(f"causal attention forward + backward, {a['dtype']}, (B, H, T, hs) = {tuple(a['shape'])}: explicit "
          f"{bench.format_seconds(a['explicit_s'])}, fused SDPA {bench.format_seconds(a['fused_s'])}: "
          f"{a['speedup']:.1f}x")
    path = Path(args.json_path or Path("bench_results") / f"ladder-{preset}-{_slug(gpu or result.device)}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(result.to_json(), indent=2, default=str) + "\n")
    os.replace(tmp, path)
    print(f"wrote {path}")
    return 0
