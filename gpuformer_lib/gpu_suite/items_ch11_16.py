"""Items of chapters 11 to 16: what data parallel must hide, NCCL's all-reduce, tensor-parallel shards, the three
case studies' baseline against their fastest step, and the tools of chapter 16 (int8, torch.compile, CUDA graphs).

- ch11: the backward pass of a GPT-2-small step and the gradient bytes it produces, hence the all-reduce bus
  bandwidth that would hide behind it (one GPU); NCCL's all-reduce bus bandwidth over message sizes on every
  visible GPU (two or more: its own processes, started here);
- ch12: a Megatron MLP's column- then row-parallel matrix products per shard, for 1, 2, 4 and 8 shards;
- ch13-ch15: each case study's training step, the chapter's baseline row against its last row (every
  acceleration this GPU runs but torch.compile), on synthetic inputs of the chapter's shapes;
- ch16: int8 matrix products and the chapter's ``Int8Linear`` against float layers; torch.compile (a cold compile
  of layer norm + GELU, then the chapter's character model) and CUDA graphs against eager (heavy).

No data file is read: token ids, proteins, sentence pairs and series are random, with the vocabularies, lengths and
shapes of the chapters' data written below where the chapter prints them.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from gpuformer_lib.gpu_suite.core import Context, SuiteError, item

# --------------------------------------------------------------------------- shared helpers


def _profile(ctx: Context):
    from gpuformer_lib.profiles import current_profile

    return current_profile(ctx.device)


def _preset(ctx: Context):
    from gpuformer_lib.device import choose_preset

    return choose_preset(ctx.device)


def _low_dtype(ctx: Context) -> torch.dtype:
    """The 16-bit format this GPU computes fastest in (bf16 where native, fp16 on a T4), as the library chooses it;
    under rehearsal the rehearsed profile's."""
    from gpuformer_lib.profiles import compute_dtype

    return compute_dtype(_profile(ctx))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# --------------------------------------------------------------------------- chapter 11: data parallel


@item(11, "backward_to_hide", cap_s=9,
      title="GPT-2 small: backward time, gradient bytes, and the all-reduce bus bandwidth that would hide behind it")
def backward_to_hide(ctx: Context) -> None:
    from gpuformer_lib import speed
    from gpuformer_lib.predict import collective_costs
    from gpuformer_lib.model import DecoderLM, gpt2_config, transformer_flops

    preset = _preset(ctx)
    dtype = _low_dtype(ctx)
    config = gpt2_config() if not ctx.toy else dataclasses.replace(gpt2_config(64, 2, 4), vocab_size=512, max_len=64)
    config = dataclasses.replace(config, check_token_ids=False)  # no host sync per forward (tuned training)
    batch = preset.pick(cpu=2, gpu=8, gpu_small=4)
    seq = config.max_len
    torch.manual_seed(0)
    with torch.device(ctx.device):  # built on the device: 124 M parameters initialised there, not on the host
        model = DecoderLM(config)
    ids = torch.randint(0, config.vocab_size, (batch, seq + 1), device=ctx.device)  # (B, T + 1)

    def forward() -> torch.Tensor:
        with torch.autocast(ctx.device.type, dtype=dtype):
            loss, _ = speed.next_token_loss(model, ids)  # float32 cross-entropy of (B*T, V) logits
        return loss

    ctx.note(f"DecoderLM(gpt2_config()){' at toy width' if ctx.toy else ''}: {config.n_decoder_layers} layers of "
             f"width {config.d_model}, batch {batch} x {seq} tokens, {_dtype_name(dtype)} autocast, fused attention, "
             "float32 weights and gradients (what DDP all-reduces)")
    flops_forward = transformer_flops(config, batch, seq, training=False)
    ctx.time("forward", forward, repeats=5, share=0.25, work=flops_forward, work_unit="FLOP")
    loss = forward()
    params = [p for p in model.parameters() if p.requires_grad]

    def backward() -> None:
        for p in params:
            p.grad = None  # as after zero_grad(set_to_none=True): backward writes fresh gradients, adds nothing
        loss.backward(retain_graph=True)  # the same graph each call: backward alone is timed

    bwd = ctx.time("backward", backward, repeats=7, share=0.5, work=2 * flops_forward, work_unit="FLOP")
    grad_bytes = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    ctx.value("gradient_bytes", grad_bytes, "B", "sum over the parameters of .grad's numel x element size after one "
              "backward: what one data-parallel step all-reduces")
    if ctx.device.type == "cuda":
        ctx.value("peak_memory", torch.cuda.max_memory_allocated(ctx.device), "B",
                  "torch.cuda.max_memory_allocated over the item: weights, one forward's saved activations, gradients")
    seconds = bwd["median"]
    for n in (2, 8):
        ctx.value(f"busbw_to_hide_n{n}", collective_costs.busbw(grad_bytes, seconds, n), "B/s",
                  f"gradient bytes x 2({n}-1)/{n} / median backward seconds (collective_costs.busbw): the bus "
                  f"bandwidth at which a ring all-reduce of every gradient over {n} GPUs takes as long as the "
                  "backward pass it overlaps with; slower links leave part of it exposed (DDP starts each bucket when "
                  "its gradients are ready, so the last bucket's all-reduce always runs after backward)")
    ctx.value("algbw_to_hide", grad_bytes / seconds, "B/s",
              "gradient bytes / median backward seconds: the algorithm bandwidth (bytes / time) that hides it")


def _allreduce_rank(rank: int, spec_json: str) -> None:
    """One rank of ``ch11.allreduce_busbw``, started by that item in a process of its own (``python -c``): joins the
    group through a file store, checks one all-reduce's sum, then times ``dist.all_reduce`` of float32 zeros per
    message size (``number`` calls between two CUDA events per repeat, the slowest rank's time kept) until the sizes
    or ``budget_s`` run out. Rank 0 writes the times to ``<folder>/result.json``."""
    import torch.distributed as dist

    spec = json.loads(spec_json)
    world, backend, folder = int(spec["world"]), spec["backend"], Path(spec["folder"])
    if backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, init_method=f"file://{folder / 'store'}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=float(spec["timeout_s"])),
                            device_id=device if backend == "nccl" else None)
    started = time.monotonic()
    try:
        x = torch.full((1000,), float(rank + 1), device=device)
        dist.all_reduce(x)
        ok = torch.tensor([float(bool((x == world * (world + 1) / 2).all()))], device=device)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        results = []
        for nbytes in spec["sizes"]:
            buf = torch.zeros(int(nbytes) // 4, device=device)  # zeros: the sum stays finite however often it runs
            number = 20 if nbytes <= 2**22 else 5 if nbytes <= 2**26 else 2
            for _ in range(int(spec["warmup"])):
                dist.all_reduce(buf)
            repeats, elapsed = [], 0.0
            for _ in range(int(spec["repeats"])):
                dist.barrier()
                if device.type == "cuda":
                    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    begin.record()
                    for _ in range(number):
                        dist.all_reduce(buf)
                    end.record()
                    end.synchronize()
                    seconds = begin.elapsed_time(end) / 1e3 / number
                else:
                    t0 = time.perf_counter()
                    for _ in range(number):
                        dist.all_reduce(buf)
                    seconds = (time.perf_counter() - t0) / number
                # the slowest rank's time, and the elapsed time every rank agrees on (so all stop together)
                both = torch.tensor([seconds, time.monotonic() - started], dtype=torch.float64, device=device)
                dist.all_reduce(both, op=dist.ReduceOp.MAX)
                repeats.append(float(both[0]))
                elapsed = float(both[1])
            results.append({"bytes": int(nbytes), "number": number, "seconds": repeats})
            del buf
            if elapsed > float(spec["budget_s"]):
                break
        if rank == 0:
            tmp = folder / "result.json.tmp"
            tmp.write_text(json.dumps({"correct": bool(ok.item() == 1.0), "world": world, "backend": backend,
                                       "sizes": results}), encoding="utf-8")
            os.replace(tmp, folder / "result.json")
    finally:
        dist.destroy_process_group()


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-chars:]
    except OSError:
        return ""


def _run_ranks(world: int, spec: dict, folder: Path, wait_s: float) -> dict:
    """Start ``world`` processes running :func:`_allreduce_rank` and wait for them (at most ``wait_s``): the
    result rank 0 wrote, or SuiteError with the first failing rank's output. Every process is killed on the way
    out, whatever happened."""
    package_parent = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH", "")) if p)}
    code = "import sys; from gpuformer_lib.gpu_suite.items_ch11_16 import _allreduce_rank; " \
           "_allreduce_rank(int(sys.argv[1]), sys.argv[2])"
    spec_json = json.dumps(spec)
    procs: list[subprocess.Popen] = []
    logs = [folder / f"rank{r}.log" for r in range(world)]
    try:
        for r in range(world):
            with open(logs[r], "wb") as log:
                procs.append(subprocess.Popen([sys.executable, "-c", code, str(r), spec_json], stdin=subprocess.DEVNULL,
                                              stdout=log, stderr=subprocess.STDOUT, env=env))
        deadline = time.monotonic() + wait_s
        while None in [p.poll() for p in procs]:  # every process polled each time: any() would stop at the first
            failed = [r for r, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed:
                r = failed[0]
                raise SuiteError(f"all-reduce rank {r} failed (exit status {procs[r].returncode}):\n{_tail(logs[r])}")
            if time.monotonic() > deadline:
                running = [r for r, p in enumerate(procs) if p.poll() is None]
                raise SuiteError(f"the all-reduce ranks {running} had not finished after {wait_s:.0f} s; rank "
                                 f"{running[0]} printed:\n{_tail(logs[running[0]])}")
            time.sleep(0.05)
        failed = [r for r, p in enumerate(procs) if p.returncode != 0]
        if failed:
            r = failed[0]
            raise SuiteError(f"all-reduce rank {r} failed (exit status {procs[r].returncode}):\n{_tail(logs[r])}")
        try:
            return json.loads((folder / "result.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise SuiteError(f"rank 0 wrote no result ({exc}):\n{_tail(logs[0])}") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


@item(11, "allreduce_busbw", cap_s=75, min_gpus=2,
      title="NCCL all-reduce bus bandwidth over message sizes (64 KiB-1 GiB), one process per visible GPU")
def allreduce_busbw(ctx: Context) -> None:
    from gpuformer_lib.predict import collective_costs

    if ctx.toy:  # a rehearsal: CPU processes with gloo, small messages (the code path, not a GPU's numbers)
        world, backend, sizes = 2, "gloo", [2**10, 2**14, 2**18]
    else:
        world, backend = torch.cuda.device_count(), "nccl"
        smallest_gib = min(torch.cuda.get_device_properties(i).total_memory for i in range(world)) / 2**30
        top = 30 if smallest_gib >= 16 else 28  # the largest message at most a sixteenth of a GPU's memory
        sizes = [2**k for k in range(16, top + 1, 2)]
    with tempfile.TemporaryDirectory(prefix="gpu_suite_allreduce_") as tmp:
        folder = Path(tmp)
        left = ctx.seconds_left()
        # the ranks import torch and join the group first (several seconds with 8 processes), so they measure
        # within what is left after that; the parent waits until 3 s before the cap and then kills them
        spec = {"world": world, "backend": backend, "folder": str(folder), "sizes": sizes, "warmup": 3, "repeats": 5,
                "timeout_s": max(10.0, left - 5), "budget_s": max(2.0, left - 40)}
        result = _run_ranks(world, spec, folder, wait_s=max(5.0, left - 3))
    if not result["correct"]:
        raise SuiteError(f"all_reduce over {world} ranks did not sum the ranks' values correctly")
    ctx.note(f"{world} processes, {backend}, one per {'GPU' if backend == 'nccl' else 'CPU process (rehearsal)'}; "
             "all_reduce of float32 checked to sum before timing")
    measured = result["sizes"]
    if len(measured) < len(sizes):
        ctx.note(f"sizes above {measured[-1]['bytes']} B left out: the item's time ran out")
    nbytes, medians = [], []
    for row in measured:
        times = row["seconds"]
        med = statistics.median(times)
        k = int(math.log2(row["bytes"]))
        clock = "two CUDA events" if backend == "nccl" else "two reads of the wall clock"
        how = (f"{backend} all_reduce of {row['bytes']} B (float32) on {world} ranks; per repeat {row['number']} calls "
               f"between {clock}, the slowest rank's time; median of {len(times)} repeats (min "
               f"{min(times):.3g} s, max {max(times):.3g} s per call) after 3 warm-up calls")
        ctx.value(f"seconds_2^{k}B", med, "s", how)
        ctx.value(f"busbw_2^{k}B", collective_costs.busbw(row["bytes"], med, world), "B/s",
                  "NCCL-tests' bus bandwidth, bytes x 2(n-1)/n / median seconds (collective_costs.busbw), of: " + how)
        nbytes.append(row["bytes"])
        medians.append(med)
    if len(nbytes) >= 2:
        try:
            alpha, bandwidth = collective_costs.fit_alpha_beta(nbytes, medians, world)
        except ValueError as exc:
            ctx.note(f"alpha-beta fit refused: {exc}")
        else:
            how = ("collective_costs.fit_alpha_beta on the median times of every size (least squares on the relative "
                   "error): t = 2(n-1) alpha + 2(n-1)/n S / B")
            ctx.value("fitted_alpha", alpha, "s", how)
            ctx.value("fitted_bus_bandwidth", bandwidth, "B/s", how)


# --------------------------------------------------------------------------- chapter 12: tensor parallel


@item(12, "tensor_parallel_shards", cap_s=7,
      title="Megatron MLP shards: column- then row-parallel matmuls per shard for 1, 2, 4, 8 shards and 4 widths")
def tensor_parallel_shards(ctx: Context) -> None:
    import torch.nn.functional as F

    from gpuformer_lib.bench import float32_matmul_precision

    dtype = _low_dtype(ctx)
    tokens = ctx.size(64, 8 * 1024)  # chapter 12's GPU example: 8 sequences of 1024 tokens
    # GPT-2 small, medium and XL widths, and a 7B model's (d_ff = 4 d_model, as in chapter 12's examples)
    widths = ctx.size([64], [768, 1024, 1600, 4096])
    shards = (1, 2, 4, 8)
    # Megatron's identity, checked in float32 on a few rows: the row-parallel outputs of the shards sum to the MLP
    c = widths[0]
    torch.manual_seed(0)
    x = torch.randn(32, c, device=ctx.device)
    w1, w2 = torch.randn(4 * c, c, device=ctx.device) / c**0.5, torch.randn(c, 4 * c, device=ctx.device) / c**0.5
    with float32_matmul_precision("highest"):
        full = F.linear(F.linear(x, w1), w2)
        parts = sum(F.linear(F.linear(x, w1_s), w2_s) for w1_s, w2_s in zip(w1.chunk(4, 0), w2.chunk(4, 1)))
    ctx.check_close("4 shards' row-parallel outputs summed against the whole MLP's product", parts, full, 1e-4, 1e-4)
    ctx.note(f"per shard: (M, C) x (C, F/s) column-parallel, then (M, F/s) x (F/s, C) row-parallel, M = {tokens} "
             f"tokens, F = 4 C, {_dtype_name(dtype)}; each shard's own contiguous weights; no communication timed "
             "(the all-reduce after the row-parallel product is chapter 11's)")
    for i, c in enumerate(widths):
        if i and ctx.seconds_left() < 2.0:
            ctx.note(f"widths {widths[i:]} left out: the item's time ran out")
            break
        f = 4 * c
        x = torch.randn(tokens, c, device=ctx.device, dtype=dtype)
        w1 = torch.randn(f, c, device=ctx.device, dtype=dtype) / c**0.5
        w2 = torch.randn(c, f, device=ctx.device, dtype=dtype) / f**0.5
        one = None
        for s in shards:
            w1_s = w1[: f // s].contiguous()  # (F/s, C): the first shard's rows of the column-parallel layer
            w2_s = w2[:, : f // s].contiguous()  # (C, F/s): its columns of the row-parallel layer
            flops = 2 * 2 * tokens * c * (f // s)
            number = 1 if flops >= 2e11 else 10  # several calls between the events for the short products

            def shard_mlp(x=x, w1_s=w1_s, w2_s=w2_s):
                return F.linear(F.linear(x, w1_s), w2_s)  # (M, C) -> (M, F/s) -> (M, C) partial sum

            entry = ctx.time(f"C{c}_shards{s}", shard_mlp, repeats=5, number=number, share=0.06, work=flops,
                             work_unit="FLOP")
            if s == 1:
                one = entry["median"]
            else:
                ctx.value(f"C{c}_shards{s}_efficiency", one / (s * entry["median"]), "ratio",
                          f"(time of the whole MLP) / ({s} x time of one shard's): 1 when a shard takes 1/{s} of the "
                          f"time; below 1, the smaller matrix products use the GPU less well (medians of C{c}_shards1 "
                          f"and C{c}_shards{s})")
            del w1_s, w2_s
        del x, w1, w2


# --------------------------------------------------------------------------- chapters 13-15: the case studies


def _ladder_ends(ctx: Context, task, baseline, accelerations, *, unit: str, k: int,
                 slots: Callable[[Any], int] | None = None) -> None:
    """The case study's baseline row against its last row (every acceleration this device runs, torch.compile left
    out), each built as the table builds it (``case_study.row_step``: model, AdamW, plan), trained on ``k`` of its
    own first-epoch batches in turn (host batches copied in the step, as ``case_study.train_run`` does), interleaved;
    rates in ``unit`` (real tokens, residues, windows) per second, from ``task.count``."""
    from gpuformer_lib import case_study

    profile = _profile(ctx)
    rows = case_study.cumulative_settings(baseline, accelerations, profile, ctx.device)
    final = rows[-1][1]
    applied = [name.removeprefix("+ ") for name, _, reason in rows[1:] if reason is None]
    for name, _, reason in rows[1:]:
        if reason is not None:
            ctx.note(f"row '{name}' skipped on this device: {reason}")
    if final.plan.compile or final.plan.cuda_graphs:
        applied = [a for a in applied if "compile" not in a]
        ctx.note("the chapter's '+ torch.compile' row is left out of 'fastest': compiling a forward and backward pass "
                 "takes tens of seconds, beyond this light item's cap (ch16's heavy item measures torch.compile)")
    fastest = final.with_plan(compile=False, cuda_graphs=False)
    ctx.note(f"baseline: the chapter's first row ({_describe_setting(baseline)}); fastest: the baseline + "
             f"{', '.join(applied) or 'nothing'} ({_describe_setting(fastest)})")
    on_cuda = ctx.device.type == "cuda"
    steps: dict[str, tuple[Callable[[], object], int]] = {}
    for label, setting in (("baseline", baseline), ("fastest", fastest)):
        row = case_study.row_step(task, setting, ctx.device, seed=0)
        batches = list(itertools.islice(task.batches(setting, 0, 0), k))
        if len(batches) < k:
            raise SuiteError(f"{label}: the synthetic data gave {len(batches)} batches, fewer than {k}")
        counted = sum(task.count(b) for b in batches)
        if slots is not None:
            ctx.value(f"{label}_padding_share", 1 - counted / sum(slots(b) for b in batches), "ratio",
                      f"1 - real {unit} / slots computed, over the {k} timed batches")
        cycle = itertools.cycle(batches)

        def one_step(row=row, cycle=cycle):
            return row.step([next(cycle).to(ctx.device, non_blocking=on_cuda)])

        steps[label] = (one_step, counted)
    entry = ctx.compare("train_step", ("baseline", steps["baseline"][0]), ("fastest", steps["fastest"][0]), warmup=k,
                        repeats=5, number=k, share=0.85)
    rates = {}
    for label, side in (("baseline", "before"), ("fastest", "after")):
        rates[label] = steps[label][1] / (k * entry[side]["median"])
        ctx.value(f"{label}_{unit}_per_s", rates[label], f"{unit}/s",
                  f"{steps[label][1]} real {unit} in the {k} batches each repeat of 'train_step' trains on, over {k} x "
                  f"the median seconds per step ({label})")
    ctx.value(f"speedup_per_{unit}", rates["fastest"] / rates["baseline"], "x",
              f"fastest's {unit} per second / baseline's: time per real {unit} before / after (the batches differ "
              "between the two rows, so this, not the per-step speedup, is the chapter's throughput ratio)")


def _describe_setting(setting) -> str:
    plan = setting.plan
    parts = [_dtype_name(plan.dtype) + " autocast" if plan.dtype is not None else "float32",
             "TF32" if plan.tf32 else None, "fused attention" if plan.fused_attention else "explicit attention",
             None if plan.check_token_ids else "no id check", "fused AdamW" if plan.fused_optimizer else None,
             "torch.compile" if plan.compile else None]
    parts += [f"{k}={v}" for k, v in setting.options.items()]
    return ", ".join(p for p in parts if p)


# chapter 13's data (printed by the chapter; model_sizes.translation_run names the vocabularies): Tatoeba's
# English words and Chinese characters, pairs of at most 24 tokens, 277,493 target tokens over 26,091 pairs
SRC_VOCAB, TGT_VOCAB, TRANSLATION_MAX_LEN = 4_321, 2_365, 24
TARGET_CHARS_MEAN = 277_493 / 26_091 - 1  # characters per target sentence (tokens predicted less the <eos>)
SOURCE_WORDS_MEAN = 6.0
"""Assumed, not measured: English words per source sentence (the chapter does not print it)."""


def _synthetic_translation(n: int, seed: int = 0):
    """``translation_task.TranslationData`` of ``n`` random pairs: source 1 + Poisson(SOURCE_WORDS_MEAN - 1) words +
    <eos>, target <bos> + 1 + Poisson(TARGET_CHARS_MEAN - 1) characters + <eos>, capped at the chapter's 24 tokens;
    random ids outside the special tokens."""
    from gpuformer_lib import data
    from gpuformer_lib.translation_task import TranslationData

    rng = np.random.default_rng(seed)
    g = torch.Generator().manual_seed(seed)
    src_len = np.minimum(1 + rng.poisson(SOURCE_WORDS_MEAN - 1, n), TRANSLATION_MAX_LEN - 1)
    tgt_len = np.minimum(1 + rng.poisson(TARGET_CHARS_MEAN - 1, n), TRANSLATION_MAX_LEN - 2)
    eos, bos = torch.tensor([data.Vocab.EOS]), torch.tensor([data.Vocab.BOS])
    pairs = [(torch.cat([torch.randint(4, SRC_VOCAB, (int(s),), generator=g), eos]),
              torch.cat([bos, torch.randint(4, TGT_VOCAB, (int(t),), generator=g), eos]))
             for s, t in zip(src_len, tgt_len)]
    src_vocab = data.Vocab(f"w{i}" for i in range(SRC_VOCAB - 4))
    tgt_vocab = data.Vocab(f"c{i}" for i in range(TGT_VOCAB - 4))
    return TranslationData(train_pairs=[], val_pairs=[], test_pairs=[], src_vocab=src_vocab, tgt_vocab=tgt_vocab,
                           max_len=TRANSLATION_MAX_LEN, train_set=pairs, val_set=pairs[:8], test_set=[], test_kept=[])


@item(13, "translation_step", cap_s=10,
      title="translation case study: training step, fp32 random batches against token budgets + 16-bit + fused kernels")
def translation_step(ctx: Context) -> None:
    from gpuformer_lib import case_study, translation_task

    profile, preset = _profile(ctx), _preset(ctx)
    run = translation_task.case_run(preset, SRC_VOCAB, TGT_VOCAB, TRANSLATION_MAX_LEN)
    if ctx.toy:  # one layer each side at width 64: a rehearsal's step in a few milliseconds
        run = dataclasses.replace(run, batch_size=16, config=dataclasses.replace(
            run.config, d_model=64, n_heads=4, d_ff=128, n_encoder_layers=1, n_decoder_layers=1))
    plan = translation_task.case_plan(profile, preset)
    prepared = _synthetic_translation(ctx.size(256, 32 * run.batch_size))
    task = translation_task.translation_task(prepared, run, budget=case_study.Budget(tokens=plan.budget_tokens),
                                             tolerance=plan.tolerance, evaluations=plan.evaluations, val_pairs=8)
    c = run.config
    ctx.note(f"Transformer {c.n_encoder_layers}+{c.n_decoder_layers} layers, width {c.d_model}, vocabularies "
             f"{SRC_VOCAB:,} / {TGT_VOCAB:,} (chapter 13's), batches of {run.batch_size} random pairs; synthetic "
             f"lengths: target 1 + Poisson characters, mean {TARGET_CHARS_MEAN:.1f} (chapter 13's data), source "
             f"1 + Poisson words, mean {SOURCE_WORDS_MEAN:g} (assumed); padding shares follow these lengths, not "
             "Tatoeba's")
    accelerations = [case_study.option_step("token-budget batches", "pairs of similar length: less padding computed",
                                            batching="token_budget")] + case_study.standard_accelerations(profile)
    _ladder_ends(ctx, task, case_study.Setting(), accelerations, unit="target_tokens", k=ctx.size(1, 3),
                 slots=lambda b: b.tgt_padding_mask.numel())


# chapter 14's data, as the chapter prints it: 18,801 proteins of 7 to 8,081 residues, median 347, 8.61 M in all
PROTEIN_MEDIAN, PROTEIN_MEAN, PROTEIN_MIN, PROTEIN_MAX = 347, 8.61e6 / 18_801, 7, 8_081


def _synthetic_proteins(n: int, seed: int = 0):
    """``proteins.ProteinSplit`` of ``n`` random training proteins (and 4 validation ones): log-normal lengths with
    the data set's median and mean (sigma from mean / median = exp(sigma^2 / 2)), clipped to its range; residues
    drawn uniformly from the 20 amino acids."""
    from gpuformer_lib import proteins

    rng = np.random.default_rng(seed)
    sigma = math.sqrt(2 * math.log(PROTEIN_MEAN / PROTEIN_MEDIAN))
    lengths = np.clip(np.exp(rng.normal(math.log(PROTEIN_MEDIAN), sigma, n + 4)).round(), PROTEIN_MIN,
                      PROTEIN_MAX).astype(int)
    seqs = [rng.integers(2, 2 + len(proteins.AMINO_ACIDS), int(L)).astype(np.int64) for L in lengths]
    return proteins.ProteinSplit(train=seqs[:n], val=seqs[n:], test=[], moved=0, held_out_before=0, k=8,
                                 max_shared=0.5)


@item(14, "protein_lm_step", cap_s=12,
      title="protein LM case study: training step, fp32 padded batches against packed rows + 16-bit + fused kernels")
def protein_lm_step(ctx: Context) -> None:
    from gpuformer_lib import case_study, proteins

    profile, preset = _profile(ctx), _preset(ctx)
    plan = proteins.case_plan(profile, preset)
    k = ctx.size(1, 2)
    # enough proteins for k packed batches (each about batch_size x crop residues) and k padded ones
    split = _synthetic_proteins(k * plan.batch_size * max(2, plan.crop // 64))
    task = proteins.protein_lm_task(split, plan)
    ctx.note(f"DecoderLM over amino acids, width {plan.d_model}, {plan.n_layers} layers, windows of {plan.crop} "
             f"residues, batches of {plan.batch_size} (chapter 14's plan for this GPU); synthetic proteins: log-normal "
             f"lengths with the data's median {PROTEIN_MEDIAN} and mean {PROTEIN_MEAN:.0f}, random residues")
    accelerations = [
        case_study.option_step("bucketed batches", "similar lengths together: less padding", batching="bucketed"),
        case_study.option_step("packed rows", "proteins end to end with a document mask: no padding",
                               batching="packed"),
    ] + case_study.standard_accelerations(profile)
    _ladder_ends(ctx, task, case_study.Setting(), accelerations, unit="residues", k=k, slots=lambda b: b.ids.numel())


ELEC_HALF_HOURS = 17_520
"""One year of half-hourly demand, as chapter 15's data (2014): 11,881 training windows of a week."""


def _synthetic_elec(n: int = ELEC_HALF_HOURS, seed: int = 0) -> dict[str, np.ndarray]:
    """Demand and temperature with daily and weekly cycles and noise (the shapes ``forecasting.prepare_elec``
    takes; the values mean nothing)."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    day, week = 2 * np.pi * t / 48, 2 * np.pi * t / (7 * 48)
    temperature = 20 + 5 * np.sin(day - 1.0) + 3 * np.sin(2 * np.pi * t / n) + rng.normal(0, 1, n)
    demand = 4 + np.sin(day) + 0.4 * np.sin(week) + 0.05 * temperature + rng.normal(0, 0.2, n)
    return {"demand": demand, "temperature": temperature}


@item(15, "forecasting_step", cap_s=7,
      title="forecasting case study (PatchTST): training step, fp32 host batches against resident data + 16-bit, fused")
def forecasting_step(ctx: Context) -> None:
    from gpuformer_lib import case_study, forecasting

    profile, preset = _profile(ctx), _preset(ctx)
    plan = forecasting.case_plan(profile, preset)
    c = plan.config
    elec = forecasting.prepare_elec(_synthetic_elec(), context=c.context, horizon=c.horizon)
    task = forecasting.forecasting_task(elec, c, batch_size=plan.batch_size,
                                        budget=case_study.Budget(tokens=plan.budget_windows), lr=plan.lr,
                                        tolerance=plan.tolerance, evaluations=plan.evaluations, val_windows=64)
    ctx.note(f"PatchTST, width {c.d_model}, {c.n_layers} layers, {c.n_patches} patches per channel of a "
             f"{c.context}-step context, batches of {plan.batch_size} windows (chapter 15's plan for this GPU); "
             "synthetic demand and temperature series of a year of half-hours")
    accelerations = [case_study.option_step("data resident on the device", "the series copied once; a step gathers "
                                            "its windows on the device from B integers", resident=True)]
    accelerations += case_study.standard_accelerations(profile)
    _ladder_ends(ctx, task, case_study.Setting(), accelerations, unit="windows", k=ctx.size(1, 4))
    ctx.note("the chapter's CUDA-graph timing (forecasting.graph_step_timing) compiles the model: left to ch16's heavy "
             "item, which measures CUDA graphs")


# --------------------------------------------------------------------------- chapter 16: tools


@item(16, "int8_linear", cap_s=6,
      title="int8 matmul (torch._int_mm) and the chapter's Int8Linear against float32 and 16-bit linear layers")
def int8_linear(ctx: Context) -> None:
    from gpuformer_lib import compression, toolchain
    from gpuformer_lib.bench import float32_matmul_precision

    sizes = toolchain.tool_sizes(_profile(ctx).on_gpu, _preset(ctx).toy)
    rows, width = sizes.rows, sizes.width  # the chapter's compiler input: 4096 x 4096 on a GPU
    dtype = _low_dtype(ctx)
    torch.manual_seed(0)
    a8 = torch.randint(-127, 128, (rows, width), dtype=torch.int8, device=ctx.device)
    b8 = torch.randint(-127, 128, (width, width), dtype=torch.int8, device=ctx.device)
    try:
        got = torch._int_mm(a8, b8)  # (N, K) x (K, M) -> (N, M) int32
        native = True
    except (RuntimeError, AttributeError) as exc:
        native = False
        ctx.note(f"torch._int_mm does not run here ({str(exc).splitlines()[0]}): compression.int8_matmul falls back "
                 "to a float64 product, which is not an int8 path; Int8Linear is checked but not timed")
    if native:
        want = (a8[:64].double() @ b8.double()).to(torch.int32)  # exact: |sums| < 2^53
        if not torch.equal(got[:64], want):
            raise SuiteError("torch._int_mm differs from the exact float64 product of the same int8 codes")
        a16, b16 = a8.to(dtype), b8.to(dtype)
        out16 = torch.empty(rows, width, device=ctx.device, dtype=dtype)
        ctx.compare(f"matmul_{_dtype_name(dtype)}_vs_int8", (_dtype_name(dtype), lambda: torch.mm(a16, b16, out=out16)),
                    ("int8 (torch._int_mm)", lambda: torch._int_mm(a8, b8)), repeats=7, number=5, share=0.3,
                    work=2 * rows * width * width, work_unit="OP")
    linear = torch.nn.Linear(width, width).to(ctx.device)
    x = torch.randn(rows, width, device=ctx.device)
    with torch.no_grad():
        q = compression.Int8Linear.from_float(linear).to(ctx.device)
        with float32_matmul_precision("highest"):
            want = linear(x)
        bound = compression.int8_linear_error_bound(x, linear)  # worst case per output, float64
        ctx.check_close("Int8Linear against nn.Linear, within int8's rounding bound", q(x), want,
                        atol=float(bound.max()) * 1.01 + 1e-4, rtol=1e-5)
        del bound, want
        ctx.note(f"nn.Linear({width}, {width}) on {rows} rows; Int8Linear quantizes the input per row at each call "
                 "(compression.quantize_per_channel, which first checks it is finite: one host sync per call), "
                 "multiplies in int8 with int32 sums, rescales in float32")
        if native:
            with float32_matmul_precision("highest"):
                ctx.compare("linear_fp32_vs_Int8Linear", ("nn.Linear float32", lambda: linear(x)),
                            ("Int8Linear", lambda: q(x)), repeats=7, number=5, share=0.4,
                            work=2 * rows * width * width, work_unit="FLOP")
            linear16, x16 = linear.to(dtype), x.to(dtype)
            ctx.time(f"linear_{_dtype_name(dtype)}", lambda: linear16(x16), repeats=7, number=5, share=0.3,
                     work=2 * rows * width * width, work_unit="FLOP")
    int8_bytes = sum(t.numel() * t.element_size() for t in (q.weight_t_int8, q.weight_scale))
    ctx.value("weight_bytes_fp32_over_int8", width * width * 4 / int8_bytes, "x",
              "float32 weight bytes / Int8Linear's (int8 codes + one float32 scale per output channel)")


@item(16, "compile_and_graphs", cap_s=40, heavy=True,
      title="torch.compile (cold, layer norm + GELU; the character model) and CUDA graphs against eager inference")
def compile_and_graphs(ctx: Context) -> None:
    from gpuformer_lib import bench, compression, toolchain
    from gpuformer_lib.model import DecoderLM

    sizes = toolchain.tool_sizes(_profile(ctx).on_gpu, _preset(ctx).toy)
    on_cuda = ctx.device.type == "cuda"
    # 1. CUDA graphs: the chapter's character model (compression.demo_config(64), as its CUDA-graph cell), inference
    #    on a batch of sizes.batch x 64 characters; the id check (a host sync) is off, as a graph cannot hold one
    config = dataclasses.replace(compression.demo_config(64), check_token_ids=False)
    torch.manual_seed(0)
    model = DecoderLM(config).to(ctx.device).eval()
    ids = torch.randint(0, config.vocab_size, (sizes.batch, config.max_len), device=ctx.device)  # (B, T)
    ctx.note(f"model: DecoderLM(compression.demo_config(64)), width {config.d_model}, {config.n_decoder_layers} "
             f"layers, float32, inference on {sizes.batch} x {config.max_len} ids, token-id check off")
    with torch.no_grad():
        eager_out = model(ids)
        if on_cuda:
            side = torch.cuda.Stream(ctx.device)  # warm-up on a side stream, as torch.cuda.graph asks
            side.wait_stream(torch.cuda.current_stream(ctx.device))
            with torch.cuda.stream(side):
                for _ in range(3):
                    model(ids)
            torch.cuda.current_stream(ctx.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = model(ids)  # recorded, not run: replay() runs every kernel with one launch
            graph.replay()
            ctx.check_close("CUDA graph replay against eager", static_out, eager_out, 1e-4, 1e-4)
            ctx.compare("inference_eager_vs_cuda_graph", ("eager", lambda: model(ids)), ("CUDA graph", graph.replay),
                        repeats=7, number=20, share=0.2)
            del graph, static_out
        else:
            ctx.note("rehearsal: no CUDA graph on a CPU; the eager forward alone is timed")
            ctx.time("inference_eager", lambda: model(ids), warmup=1, repeats=3, share=0.2)
    # 2. torch.compile of layer norm + GELU at the chapter's size (a cold compile, as toolchain.compile_cost has it)
    x = torch.randn(sizes.rows, sizes.width, device=ctx.device)  # (B*T, C)
    weight, bias = torch.randn(sizes.width, device=ctx.device), torch.randn(sizes.width, device=ctx.device)
    if ctx.toy:
        backend = "eager"  # Dynamo's capture only: a rehearsal checks the code path, not Inductor's C++ compile
        ctx.note("rehearsal: torch.compile with backend='eager' (Dynamo's capture, no generated kernel)")
    else:
        backend = "inductor"
    with toolchain.cold_compile_caches():
        compiled = torch.compile(toolchain.layer_norm_gelu, backend=backend)
        bench.synchronize(ctx.device)
        t0 = time.perf_counter()
        compiled(x, weight, bias)
        bench.synchronize(ctx.device)
        first = time.perf_counter() - t0
        ctx.check_close("compiled layer norm + GELU against eager", compiled(x, weight, bias),
                        toolchain.layer_norm_gelu(x, weight, bias), 1e-4, 1e-4)
        entry = ctx.compare("layer_norm_gelu_eager_vs_compiled",
                            ("eager", lambda: toolchain.layer_norm_gelu(x, weight, bias)),
                            ("compiled", lambda: compiled(x, weight, bias)), repeats=sizes.compile_repeats,
                            number=sizes.compile_number, share=0.2)
    compile_s = max(first - entry["after"]["median"], 0.0)
    ctx.value("layer_norm_gelu_cold_compile_s", compile_s, "s",
              "wall-clock seconds of the first compiled call in fresh Inductor/Triton caches (toolchain."
              "cold_compile_caches) less one compiled call's median: what compiling cost")
    calls, why = toolchain.break_even_calls(compile_s, entry["before"]["median"], entry["after"]["median"])
    ctx.note(f"layer norm + GELU on {sizes.rows} x {sizes.width} float32: break-even "
             f"{f'after {calls:,} calls' if calls else 'never'} ({why})")
    for label, side, fused in (("eager", "before", False), ("compiled", "after", True)):
        moved = toolchain.layer_norm_gelu_bytes(sizes.rows, sizes.width, fused=fused)
        ctx.value(f"layer_norm_gelu_{label}_bandwidth", moved / entry[side]["median"], "B/s",
                  f"toolchain.layer_norm_gelu_bytes(fused={fused}) ({moved} B: {'2' if fused else '4'} passes over "
                  f"the tensor) / median seconds per call ({label})")
    ctx.value("layer_norm_gelu_predicted_speedup", toolchain.layer_norm_gelu_bytes(sizes.rows, sizes.width, fused=False)
              / toolchain.layer_norm_gelu_bytes(sizes.rows, sizes.width, fused=True), "x",
              "bytes eager moves / bytes the fused kernel moves (toolchain.layer_norm_gelu_bytes): the speedup of two "
              "memory-bound kernels fused into one, at equal bandwidth")
    # 3. torch.compile of the character model's inference, if the cap leaves room for a compile
    if ctx.seconds_left() < (3 if ctx.toy else 22):  # a forward's compile: about 5-15 s on a GPU node
        ctx.note(f"torch.compile of the model left out: {ctx.seconds_left():.0f} s of the cap left")
    else:
        with torch.no_grad():
            compiled_model = torch.compile(model, backend=backend)
            bench.synchronize(ctx.device)
            t0 = time.perf_counter()
            compiled_model(ids)
            bench.synchronize(ctx.device)
            first = time.perf_counter() - t0
            ctx.check_close("compiled model against eager", compiled_model(ids), eager_out, 1e-3, 1e-3)
            entry = ctx.compare("inference_eager_vs_compiled", ("eager", lambda: model(ids)),
                                ("torch.compile", lambda: compiled_model(ids)), warmup=ctx.size(1, 2),
                                repeats=ctx.size(3, 7), number=ctx.size(1, 20), share=0.5)
        ctx.value("model_compile_s", max(first - entry["after"]["median"], 0.0), "s",
                  "wall-clock seconds of the first compiled forward (Inductor's usual caches, which a fresh machine "
                  "has empty) less one compiled call's median")
    torch.compiler.reset()
