"""Items of chapters 2 to 6: the course's own kernels against PyTorch's (Triton, CUDA C), explicit attention
against the fused kernel over T, a loop over heads against one batched call and the KV cache over batch sizes,
a Transformer's training step against its FLOP count, and fused against foreach AdamW.

Every item checks what it times against torch (or the uncached computation) first. Sizes are the chapters'
GPU shapes (``ctx.size``: toy ones under rehearsal, where the Triton kernels run in Triton's interpreter)."""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import tempfile
import time

import torch
import torch.nn.functional as F

from gpuformer_lib.gpu_suite.core import Context, item
from gpuformer_lib.profiles import rehearsing_gpu

if rehearsing_gpu():
    # Under rehearsal (no GPU) the Triton kernels run in Triton's interpreter, which works only if Triton is first
    # imported after gpuformer_lib.kernels sets TRITON_INTERPRET=1: once imported without it, triton.language's
    # own @jit functions (tl.max, tl.sum) stay compiled-mode functions that the interpreter cannot call. The worker
    # imports the items before anything else imports Triton, so import the kernels module now. (On a GPU the
    # kernels compile and the order does not matter: nothing is imported here.)
    importlib.import_module("gpuformer_lib.kernels")

# --------------------------------------------------------------------------- helpers


def _fast16(ctx: Context) -> torch.dtype:
    """The GPU's fast 16-bit format: bf16 where it is native (not emulated), else fp16 (a T4). Under
    rehearsal, the rehearsed GPU's format (``profiles.compute_dtype``), computed on the CPU."""
    if ctx.device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    from gpuformer_lib.profiles import compute_dtype, current_profile

    return compute_dtype(current_profile())


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tolerance(dtype: torch.dtype, low: float = 2e-2, high: float = 1e-4) -> float:
    """A tolerance for a comparison with torch: ``low`` for 16-bit formats, ``high`` for float32."""
    return low if dtype in (torch.float16, torch.bfloat16) else high


def _peak_bytes(ctx: Context, fn) -> int | None:
    """Bytes the CUDA allocator held at the peak while ``fn()`` ran, beyond what was allocated before
    (workspaces included); None off CUDA (a rehearsal): then ``fn`` is not run."""
    if ctx.device.type != "cuda":
        return None
    torch.cuda.synchronize(ctx.device)
    torch.cuda.reset_peak_memory_stats(ctx.device)
    before = torch.cuda.memory_allocated(ctx.device)
    fn()
    torch.cuda.synchronize(ctx.device)
    return torch.cuda.max_memory_allocated(ctx.device) - before


def _fits(ctx: Context, nbytes: float, what: str) -> bool:
    """Whether ``nbytes`` (an item's estimate of what a size needs) is at most half of the GPU's free memory;
    notes the size left out when not. Always True off CUDA (toy sizes)."""
    if ctx.device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(ctx.device)
    # what PyTorch's allocator holds cached but unused is free to this process too
    free += torch.cuda.memory_reserved(ctx.device) - torch.cuda.memory_allocated(ctx.device)
    if nbytes <= free / 2:
        return True
    ctx.note(f"{what} left out: it needs about {nbytes / 2**30:.1f} GiB, more than half of the "
             f"{free / 2**30:.1f} GiB free")
    return False


def _first_call_seconds(ctx: Context, fn) -> tuple[object, float]:
    """``fn()``'s result and the wall-clock seconds of this first call, synchronized (compiles included)."""
    from gpuformer_lib import bench

    start = time.perf_counter()
    out = fn()
    bench.synchronize(ctx.device)
    return out, time.perf_counter() - start


def _rates(ctx: Context, name: str, entry: dict, work: float, unit: str, what: str) -> None:
    """Record ``work / median`` for both sides of a :meth:`Context.compare` entry."""
    for side in ("before", "after"):
        label = entry[side]["label"]
        key = f"{name}_{re.sub(r'[^a-z0-9]+', '_', label.lower()).strip('_')}_rate"
        ctx.value(key, work / entry[side]["median"], f"{unit}/s",
                  f"{what} / median seconds of '{label}' in the comparison {name}")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def _bytes(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.3g} MiB"


# --------------------------------------------------------------------------- chapter 2: GPU programming


def _time_for(ctx: Context, what: str, need_s: float = 6.0) -> bool:
    """Whether ``need_s`` seconds of the cap are left (a Triton compile and a timing on a GPU; a tenth of it
    under rehearsal); notes ``what`` was left out when not."""
    need = need_s / 10 if ctx.toy else need_s
    if ctx.seconds_left() >= need:
        return True
    ctx.note(f"{what} and what follows left out: {ctx.seconds_left():.1f} s of the cap left")
    return False


def _triton_device(ctx: Context):
    """The kernels module and the device its Triton kernels take tensors on, or None (noted) where they cannot
    run on the device this item measures."""
    from gpuformer_lib import kernels

    support = kernels.kernel_support()
    if support.triton_mode == "unavailable":
        ctx.note(f"Triton kernels not available: {support.triton_reason}")
        return None
    want = "cuda" if support.triton_mode == "compiled" else "cpu"
    if ctx.device.type != want:
        ctx.note(f"Triton kernels are {support.triton_mode} here ({support.triton_reason}), so they take "
                 f"{want.upper()} tensors; this run measures {ctx.device}: nothing timed")
        return None
    ctx.note(f"Triton kernels: {support.triton_mode} ({support.triton_reason})")
    return kernels


@item(2, "triton_kernels", cap_s=25, heavy=True, expect_s=12,  # seven JIT compiles when Triton's cache is cold
      title="the course's Triton kernels (add, softmax, tiled matmul, strided copy) against torch")
def triton_kernels(ctx: Context) -> None:
    kernels = _triton_device(ctx)
    if kernels is None:
        return
    dev = ctx.device
    warmup, repeats = ctx.size(1, 2), ctx.size(3, 7)
    share = 0.1
    # calls per repeat: a Triton launch costs the host tens of microseconds in Python; with one call per repeat
    # that gap would sit inside the events' window, so queue several and count the GPU's time per call
    number = ctx.size(1, 10)

    # vector add of 2^26 + 3 floats (+ 3: the last block's masked tail runs too): 3 x 4 bytes per element
    n = ctx.size(2**12 + 3, 2**26 + 3)
    x, y = torch.randn(n, device=dev), torch.randn(n, device=dev)
    out, first = _first_call_seconds(ctx, lambda: kernels.vector_add(x, y))
    ctx.value("vector_add_first_call_s", first, "s", "wall clock of the first call, Triton's JIT compile (or its "
              "cache's load) included")
    ctx.check_close("vector_add", out, x + y, atol=0.0, rtol=0.0)
    entry = ctx.compare(f"vector_add_n{n}", ("torch x + y", lambda: x + y),
                        ("triton vector_add", lambda: kernels.vector_add(x, y)),
                        warmup=warmup, repeats=repeats, number=number, share=share, work=12 * n, work_unit="B")
    _rates(ctx, "vector_add", entry, 12 * n, "B", "12 bytes per element (read x and y, write out)")

    # row-wise softmax, float32, 1024 columns (one program per row): read once, write once
    rows, cols = ctx.size((16, 1000), (32768, 1024))
    s = 5 * torch.randn(rows, cols, device=dev)
    out, first = _first_call_seconds(ctx, lambda: kernels.softmax(s))
    ctx.value("softmax_first_call_s", first, "s", "wall clock of the first call, JIT compile included")
    ctx.check_close("softmax", out, torch.softmax(s, dim=1), atol=1e-6, rtol=1e-4)
    entry = ctx.compare(f"softmax_{rows}x{cols}", ("torch.softmax", lambda: torch.softmax(s, dim=1)),
                        ("triton softmax", lambda: kernels.softmax(s)),
                        warmup=warmup, repeats=repeats, number=number, share=share, work=8 * s.numel(), work_unit="B")
    _rates(ctx, "softmax", entry, 8 * s.numel(), "B", "8 bytes per element (read once, write once, float32)")

    # tiled matrix product, fp16 on a GPU (the chapter's 4096^3), float32 in the interpreter (NumPy)
    size = ctx.size(64, 4096)
    mdtype = torch.float16 if dev.type == "cuda" else torch.float32
    a, b = (torch.randn(size, size, device=dev, dtype=mdtype) for _ in range(2))
    flops = 2 * size**3
    tol = 1.0 if mdtype == torch.float16 else 1e-3  # fp16 sums of 4096 products of ~N(0,1): values ~64
    for cfg in ((64, 64, 32, 4, 3), (128, 128, 32, 4, 4)):  # the library's default, and bigger tiles
        label = "x".join(map(str, cfg[:3])) + f"_w{cfg[3]}_s{cfg[4]}"
        if not _time_for(ctx, f"matmul tiles {label}"):
            break
        try:
            out, first = _first_call_seconds(ctx, lambda cfg=cfg: kernels.matmul(a, b, *cfg))
        except Exception as error:  # noqa: BLE001  (e.g. Triton's OutOfResources: too much shared memory here)
            ctx.note(f"matmul tiles {label} do not run here: {type(error).__name__}: {str(error).splitlines()[0]}")
            continue
        ctx.value(f"matmul_{label}_first_call_s", first, "s", "wall clock of the first call, JIT compile included")
        ctx.check_close(f"matmul {label}", out, a @ b, atol=tol, rtol=2e-2)
        entry = ctx.compare(f"matmul_{size}_{label}", ("torch.matmul", lambda: a @ b),
                            ("triton matmul", lambda cfg=cfg: kernels.matmul(a, b, *cfg)),
                            warmup=warmup, repeats=repeats, number=number, share=share, work=flops, work_unit="FLOP")
        _rates(ctx, f"matmul_{label}", entry, flops, "FLOP", f"2 x {size}^3 FLOPs ({_dtype_name(mdtype)})")
        del out
        if cfg[:3] == (64, 64, 32) and _time_for(ctx, "grouped matmul"):  # Triton's tutorial: tiles in L2 order
            out = kernels.grouped_matmul(a, b, *cfg[:3], 8, *cfg[3:])
            ctx.check_close(f"grouped matmul {label}", out, a @ b, atol=tol, rtol=2e-2)
            del out
            ctx.compare(f"matmul_{size}_{label}_grouped", ("triton matmul", lambda cfg=cfg: kernels.matmul(a, b, *cfg)),
                        ("triton grouped matmul (group_m 8)",
                         lambda cfg=cfg: kernels.grouped_matmul(a, b, *cfg[:3], 8, *cfg[3:])),
                        warmup=warmup, repeats=repeats, number=number, share=share, work=flops, work_unit="FLOP")

    # strided copy: out[i] = x[(i * stride) % n]; stride 1 is coalesced, each stride >= 8 a 32-byte sector per
    # 4-byte float (strides 1, 2, 8 and 32 are three compilations: Triton specializes ints equal to 1 or
    # divisible by 16)
    n = ctx.size(2**12, 2**26)
    x = torch.randn(n, device=dev)
    index = torch.arange(n, device=dev)
    for stride in (1, 2, 8, 32):
        if not _time_for(ctx, f"strided copy, stride {stride}"):
            break
        out, first = _first_call_seconds(ctx, lambda: kernels.strided_copy(x, stride))
        ctx.value(f"strided_copy_s{stride}_first_call_s", first, "s", "wall clock of the first call, JIT compile "
                  "(or a kernel already compiled for this specialization) included")
        ctx.check_close(f"strided_copy stride {stride}", out, x[(index * stride) % n], atol=0.0, rtol=0.0)
        del out
        if stride == 1:
            entry = ctx.compare(f"copy_n{n}", ("torch clone", lambda: x.clone()),
                                ("triton strided_copy stride 1", lambda: kernels.strided_copy(x, 1)),
                                warmup=warmup, repeats=repeats, number=number, share=share, work=8 * n, work_unit="B")
            _rates(ctx, "copy", entry, 8 * n, "B", "8 useful bytes per element (read once, write once)")
        else:
            ctx.time(f"strided_copy_stride{stride}_n{n}", lambda st=stride: kernels.strided_copy(x, st),
                     warmup=warmup, repeats=repeats, number=number, share=share, work=8 * n, work_unit="B")


@item(2, "cuda_c_add", cap_s=180, heavy=True, expect_s=60,  # load_inline's nvcc build: about a minute, cold
      title="the CUDA C grid-stride add (load_inline: nvcc compile) against torch, where nvcc and ninja exist")
def cuda_c_add(ctx: Context) -> None:
    from gpuformer_lib import kernels

    support = kernels.kernel_support()
    if not support.cuda_c or ctx.device.type != "cuda":
        why = support.cuda_c_reason if not support.cuda_c else "this run computes on the CPU"
        ctx.note(f"not available: the CUDA C kernel cannot be built here ({why}); nothing measured")
        return
    ctx.note(f"CUDA C: {support.cuda_c_reason}")
    # a build folder of this run's own: a build killed at the cap leaves torch's lock file in its folder, and the
    # next build there would wait on it for ever (FileBaton has no deadline); the first call times a cold build
    os.environ["TORCH_EXTENSIONS_DIR"] = tempfile.mkdtemp(prefix="gpuformer-suite-extensions-")
    n = 2**26 + 3
    x, y = torch.randn(n, device=ctx.device), torch.randn(n, device=ctx.device)
    out, first = _first_call_seconds(ctx, lambda: kernels.cuda_add(x, y, 4096, 256))
    ctx.value("first_call_s", first, "s", "wall clock of the first call: torch.utils.cpp_extension.load_inline's "
              "nvcc + ninja build (or the load of a build cached under ~/.cache/torch_extensions) included")
    ctx.check_close("cuda_add 4096 blocks x 256 threads", out, x + y, atol=0.0, rtol=0.0)
    small_x, small_y = x[:1_000_003], y[:1_000_003]
    ctx.check_close("cuda_add 1 block x 32 threads (the grid-stride loop covers any n)",
                    kernels.cuda_add(small_x, small_y, 1, 32), small_x + small_y, atol=0.0, rtol=0.0)
    del out
    sms = torch.cuda.get_device_properties(ctx.device).multi_processor_count
    # cuda_add clones y, then adds x into the clone: 20 bytes per element moved, 12 of them the add's own
    ctx.note("cuda_add's wrapper clones y before the kernel adds x into the clone: it moves 20 bytes per "
             "element (clone 8, kernel 12) where torch's x + y moves 12; the rates below count 12")
    for blocks, threads in ((4096, 256), (sms * 8, 256)):
        entry = ctx.compare(f"add_n{n}_{blocks}x{threads}", ("torch x + y", lambda: x + y),
                            ("cuda_add", lambda b=blocks, t=threads: kernels.cuda_add(x, y, b, t)),
                            repeats=7, share=0.2, work=12 * n, work_unit="B")
        _rates(ctx, f"add_{blocks}x{threads}", entry, 12 * n, "B", "12 bytes per element (read x and y, write "
               "the sum)")


# --------------------------------------------------------------------------- chapter 3: attention

ATTENTION_TARGET = 5.0
"""Fused attention's speedup over the explicit computation the chapter's lesson rests on (forward + backward,
causal, 16-bit, T = 4096)."""


@item(3, "explicit_vs_fused", cap_s=15,
      title="causal attention forward + backward: explicit (T x T scores) against fused SDPA, time and memory over T")
def explicit_vs_fused(ctx: Context) -> None:
    from gpuformer_lib import tiled_attention as ta
    from gpuformer_lib.attention import scaled_dot_product_attention as explicit_attention

    dtype = _fast16(ctx)
    itemsize = torch.empty((), dtype=dtype).element_size()
    B, H, hs = 1, ctx.size(2, 16), 64  # the chapter's shapes: one sequence, 16 heads of 64
    lengths = ctx.size([32, 64, 128], [512, 1024, 2048, 4096, 8192])
    repeats = ctx.size(3, 7)
    t_target = lengths[-1] if ctx.toy else 4096
    ctx.note(f"forward + backward of causal attention (as the ladder's attention_benchmark): the library's "
             f"attention.scaled_dot_product_attention against F.scaled_dot_product_attention, "
             f"B={B}, H={H}, hs={hs}, {_dtype_name(dtype)}")
    at_target = None  # (comparison entry, SDPA kernel, explicit peak bytes) at t_target
    for T in lengths:
        if T > lengths[0] and ctx.seconds_left() < ctx.size(0.5, 4.0):
            ctx.note(f"T >= {T} left out: {ctx.seconds_left():.1f} s of the cap left")
            break
        matrix = B * H * T * T * itemsize
        # the library's explicit path holds up to about 8 (B, H, T, T) 16-bit matrices at once in forward +
        # backward (scores, masked scores, probabilities kept for backward, their gradients, a bool guard)
        if not _fits(ctx, 8 * matrix, f"T={T} (one B*H*T*T score matrix is {_bytes(matrix)})"):
            break
        shape = (B, H, T, hs)
        q, k, v = (torch.randn(shape, device=ctx.device, dtype=dtype, requires_grad=True) for _ in range(3))
        grad = torch.randn(shape, device=ctx.device, dtype=dtype)

        def explicit() -> None:
            out, _ = explicit_attention(q, k, v, is_causal=True)
            out.backward(grad)

        def fused() -> None:
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)

        # same answer first: outputs at every T, the gradients too at the first
        tol = _tolerance(dtype)
        with torch.no_grad():
            ctx.check_close(f"explicit vs fused output, T={T}", explicit_attention(q, k, v, is_causal=True)[0],
                            F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=tol, rtol=tol)
        if T == lengths[0]:
            explicit()
            grads = [t.grad for t in (q, k, v)]
            for t in (q, k, v):
                t.grad = None
            fused()
            for name, want, t in zip("qkv", grads, (q, k, v)):
                ctx.check_close(f"explicit vs fused gradient of {name}, T={T}", t.grad, want, atol=2.5 * tol,
                                rtol=2.5 * tol)
        entry = ctx.compare(f"fwd_bwd_T{T}", ("explicit", explicit), ("fused", fused), repeats=repeats, share=0.15,
                            work=3 * ta.attention_flops(B, H, T, T, hs), work_unit="FLOP")
        peaks = {}
        for name, fn in (("explicit", explicit), ("fused", fused)):
            peaks[name] = _peak_bytes(ctx, fn)
            if peaks[name] is not None:
                ctx.value(f"{name}_peak_T{T}", peaks[name], "B", "torch.cuda.max_memory_allocated during one "
                          "forward + backward, minus what was allocated before it (q, k, v, their gradients, the "
                          "output gradient)")
        if T == t_target:
            with torch.no_grad():
                backend = ta.sdpa_backend_used(q, k, v, is_causal=True)
                ctx.compare(f"fwd_only_T{T}", ("explicit", lambda: explicit_attention(q, k, v, is_causal=True)),
                            ("fused", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
                            repeats=repeats, share=0.15, work=ta.attention_flops(B, H, T, T, hs), work_unit="FLOP")
            ctx.note(f"F.scaled_dot_product_attention ran its '{backend}' kernel at T={T}")
            at_target = (entry, backend, peaks["explicit"])
    if ctx.device.type != "cuda":
        ctx.note("peak memory is measured with the CUDA allocator only: not in a rehearsal")
    if at_target is None:
        ctx.note(f"target fused_over_explicit_T{t_target} not measured: T={t_target} did not run (see above)")
        return
    entry, backend, explicit_peak = at_target
    fused_rate = entry["work"] / entry["after"]["median"]
    of_peak = ""
    if ctx.device.type == "cuda":
        from gpuformer_lib import bench

        try:
            peak = bench.peak_flops(dtype, gpu_name=torch.cuda.get_device_name(ctx.device))
            of_peak = f", {fused_rate / peak:.0%} of the datasheet {_dtype_name(dtype)} peak"
        except ValueError:
            pass
    held = f", holding {_bytes(explicit_peak)} at its peak" if explicit_peak is not None else ""
    ctx.target(f"fused_over_explicit_T{t_target}", entry["speedup"], ATTENTION_TARGET, why_short=(
        f"forward + backward at B={B}, H={H}, T={t_target}, hs={hs}, {_dtype_name(dtype)}: explicit "
        f"{_ms(entry['before']['median'])}{held}, fused {_ms(entry['after']['median'])} ('{backend}' kernel, "
        f"{fused_rate / 1e12:.3g} TFLOP/s counting the full T x T products{of_peak}); the explicit path streams B*H*T^2 "
        f"matrices of {_bytes(B * H * t_target**2 * itemsize)} each through memory several times (bandwidth-bound), "
        f"so the gap is that traffic's time against the fused kernel's, whose rate above says how far below the "
        f"tensor-core peak it ran"))


# --------------------------------------------------------------------------- chapter 4: multi-head attention


@item(4, "heads_loop_vs_batch", cap_s=8,
      title="attention over heads: a Python loop of per-head calls against one batched call, over T")
def heads_loop_vs_batch(ctx: Context) -> None:
    from gpuformer_lib import attention, kv_cache

    dtype = _fast16(ctx)
    itemsize = torch.empty((), dtype=dtype).element_size()
    batch, n_heads, hs = ctx.size((2, 8, 32), (16, 16, 64))  # the chapter's (16, T, 1024) with 16 heads
    ctx.note(f"kv_cache.minimal_attention, causal (mask built once), B={batch}, H={n_heads}, hs={hs}, "
             f"{_dtype_name(dtype)}; loop: one call per head, then torch.stack")
    for T in ctx.size((64, 128), (256, 512, 1024, 2048)):
        if ctx.seconds_left() < ctx.size(0.3, 1.5):
            ctx.note(f"T >= {T} left out: {ctx.seconds_left():.1f} s of the cap left")
            break
        if not _fits(ctx, 3 * batch * n_heads * T * T * itemsize, f"T={T}"):
            break
        q, k, v = (torch.randn(batch, n_heads, T, hs, device=ctx.device, dtype=dtype) for _ in range(3))
        allowed = attention.causal_mask(T, device=ctx.device)

        def looped():
            return torch.stack([kv_cache.minimal_attention(q[:, h], k[:, h], v[:, h], allowed)
                                for h in range(n_heads)], dim=1)

        def batched():
            return kv_cache.minimal_attention(q, k, v, allowed)

        tol = _tolerance(dtype, high=1e-5)
        ctx.check_close(f"loop vs batch, T={T}", looped(), batched(), atol=tol, rtol=tol)
        ctx.compare(f"T{T}", ("loop over heads", looped), ("batched heads", batched), repeats=9, share=0.2,
                    work=4 * batch * n_heads * T * T * hs, work_unit="FLOP")


@item(4, "kv_cache_decode", cap_s=15,
      title="greedy decoding of a GPT-2-wide decoder: one step with and without the KV cache, tokens/s over batch")
def kv_cache_decode(ctx: Context) -> None:
    from gpuformer_lib import bench
    from gpuformer_lib.kv_cache import CachedDecoder, DecoderShape, greedy_decode
    from gpuformer_lib.model import count_parameters

    shape = ctx.size(DecoderShape(vocab_size=256, d_model=64, n_heads=4, n_kv_heads=4, n_layers=2, max_len=64),
                     DecoderShape(vocab_size=4096, d_model=768, n_heads=12, n_kv_heads=12, n_layers=12,
                                  max_len=1024))
    context = ctx.size(32, 512)
    torch.manual_seed(0)
    with torch.device(ctx.device):
        model = CachedDecoder(shape).eval()
    ctx.note(f"CachedDecoder: C={shape.d_model}, {shape.n_layers} layers, {shape.n_heads} heads, V={shape.vocab_size}"
             f", {count_parameters(model) / 1e6:.1f} M parameters, float32 (TF32 off, as the chapter measures it); "
             f"one greedy step at {context} tokens: with the cache one new token against {context - 1} cached, "
             f"without it a forward pass over all {context}")
    with bench.float32_matmul_precision("highest"), torch.no_grad():
        # the cache computes what the full pass computes: logits, then greedy tokens
        ids = torch.randint(0, shape.vocab_size, (3, 20), device=ctx.device)
        full = model(ids)
        check_cache = model.new_cache(3, 20)
        pieces = [model(ids[:, :8], check_cache)] + [model(ids[:, t:t + 1], check_cache) for t in range(8, 20)]
        ctx.check_close("cached logits vs full recomputation", torch.cat(pieces, dim=1), full, atol=1e-3, rtol=1e-3)
        prompt = ids[:, :5]
        ctx.check_close("greedy tokens with vs without the cache", greedy_decode(model, prompt, 12, use_cache=True),
                        greedy_decode(model, prompt, 12, use_cache=False), atol=0.0, rtol=0.0)
        del full, check_cache, pieces

        previous = None  # (batch, seconds without the cache) of the last batch size measured
        for b in ctx.size((1, 4), (1, 8, 32, 64)):
            if previous is not None:  # will it fit? the uncached step grows with the batch
                guess = 6 * previous[1] * b / previous[0]
                if guess > 0.6 * ctx.seconds_left():
                    ctx.note(f"batch >= {b} left out: about {guess:.1f} s needed, {ctx.seconds_left():.1f} s left")
                    break
            idx = torch.randint(0, shape.vocab_size, (b, context), device=ctx.device)
            cache = model.new_cache(b, context)
            model(idx[:, :-1], cache)  # prefill: the first context - 1 tokens

            def with_cache():
                cache.truncate(context - 1)
                return model(idx[:, -1:], cache)  # (B, 1, V)

            def without_cache():
                return model(idx)  # (B, context, V)

            ctx.check_close(f"batch {b}: next-token logits with vs without the cache", with_cache()[:, -1],
                            without_cache()[:, -1], atol=1e-3, rtol=1e-3)
            entry = ctx.compare(f"decode_step_B{b}", ("without cache", without_cache), ("with cache", with_cache),
                                warmup=1, repeats=7, share=0.2)
            for side, label in (("after", "with_cache"), ("before", "without_cache")):
                ctx.value(f"tokens_per_s_B{b}_{label}", b / entry[side]["median"], "token/s",
                          f"batch {b} / median seconds of one decoding step ({entry[side]['label']}), one new token "
                          f"per sequence at {context} tokens of context")
            previous = (b, entry["before"]["median"])


# --------------------------------------------------------------------------- chapter 5: encoder-decoder


def _train_step(model, config, ids_src, ids_tgt, device: torch.device, dtype: torch.dtype):
    """Forward, loss and backward of ``model`` (no optimizer step), in ``dtype`` autocast, as
    ``layer_cost.measure_training_step`` times it; for the encoder-decoder ``Transformer`` when ``ids_src`` is
    given, else a ``DecoderLM``."""
    V = config.vocab_size

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            inputs, targets = ids_tgt[:, :-1], ids_tgt[:, 1:]
            logits = model(ids_src, inputs) if ids_src is not None else model(inputs)  # (B, T, V)
            loss = F.cross_entropy(logits.reshape(-1, V).float(), targets.reshape(-1))
        loss.backward()
        model.zero_grad(set_to_none=True)

    return step


@item(5, "training_step", cap_s=15,
      title="one training step (forward + backward, 16-bit autocast) of GPT-2 small and the base Transformer: "
            "FLOP/s, MFU")
def training_step(ctx: Context) -> None:
    from gpuformer_lib import bench
    from gpuformer_lib.predict import layer_cost
    from gpuformer_lib.model import (DecoderLM, Transformer, TransformerConfig, count_parameters, gpt2_config,
                                     paper_base_config, transformer_flops)
    from gpuformer_lib.profiles import current_profile

    dtype = _fast16(ctx)
    if ctx.device.type == "cuda":
        gpu_name = torch.cuda.get_device_name(ctx.device)
        big = torch.cuda.get_device_properties(ctx.device).total_memory >= 24 * 2**30
    else:
        gpu_name, big = current_profile().gpu_name, True  # the rehearsed GPU's name, for the prediction
    try:
        peak = bench.peak_flops(dtype, gpu_name=gpu_name)
    except ValueError as error:
        peak = None
        ctx.note(f"no MFU: {error}")
    # the embedding's range check reads the ids back (a host sync per step): off, as in the ladder
    decoder_cfg = dataclasses.replace(ctx.size(
        TransformerConfig(vocab_size=512, d_model=128, n_heads=4, n_decoder_layers=2, d_ff=512, dropout=0.0,
                          max_len=128, activation="gelu", positional="learned"),
        gpt2_config()), check_token_ids=False)
    base_cfg = dataclasses.replace(ctx.size(
        TransformerConfig(vocab_size=512, d_model=64, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=256,
                          max_len=64, norm_first=False, share_src_tgt_embeddings=True),
        paper_base_config()), check_token_ids=False)
    runs = [  # (name, config, batch, target length, source length)
        ("decoder_lm", decoder_cfg, ctx.size(2, 8 if big else 4), ctx.size(32, 1024), 0),
        ("encoder_decoder", base_cfg, ctx.size(2, 16 if big else 8), ctx.size(32, 512), ctx.size(32, 512)),
    ]
    ctx.note(f"forward, loss and backward (no optimizer step) under {_dtype_name(dtype)} autocast, float32 weights "
             "(layer_cost.measure_training_step's step, the model built on the device); FLOPs from "
             "model.transformer_flops; decoder_lm: DecoderLM(" + ctx.size("a tiny config", "gpt2_config()")
             + "), encoder_decoder: Transformer(" + ctx.size("a tiny config", "paper_base_config()") + ")")
    for name, cfg, B, T, S in runs:
        if ctx.seconds_left() < ctx.size(0.3, 4.0):
            ctx.note(f"{name} left out: {ctx.seconds_left():.1f} s of the cap left")
            break
        torch.manual_seed(0)
        with torch.device(ctx.device):
            model = Transformer(cfg) if S else DecoderLM(cfg)
        ids_tgt = torch.randint(0, cfg.vocab_size, (B, T + 1), device=ctx.device)
        ids_src = torch.randint(0, cfg.source_vocab_size, (B, S), device=ctx.device) if S else None
        step = _train_step(model, cfg, ids_src, ids_tgt, ctx.device, dtype)
        flops = transformer_flops(cfg, B, T, src_len=S)
        what = (f"{name}: {count_parameters(model) / 1e6:.1f} M parameters, B={B}, T={T}"
                + (f", S={S}" if S else "") + f", {flops / 1e12:.3g} TFLOP per step")
        ctx.note(what)
        entry = ctx.time(f"{name}_step", step, warmup=2, repeats=7, share=0.4, work=flops, work_unit="FLOP")
        if peak is not None:
            ctx.value(f"{name}_mfu", entry["rate"] / peak, "fraction",
                      f"transformer_flops / median step seconds / the datasheet dense {_dtype_name(dtype)} peak of "
                      f"{gpu_name} ({peak / 1e12:.0f} TFLOP/s)")
        mem = _peak_bytes(ctx, step)
        if mem is not None:
            ctx.value(f"{name}_peak_memory", mem, "B", "torch.cuda.max_memory_allocated during one step, minus "
                      "the weights and inputs allocated before it")
        if not S:  # the predictor's layer_cost covers a decoder-only model
            try:
                pred = layer_cost.step_time_prediction(cfg, B, T, dtype, gpu_name)
            except ValueError as error:
                ctx.note(f"no prediction for {gpu_name}: {error}")
            else:
                ctx.value(f"{name}_predicted_s", pred.seconds, "s",
                          f"layer_cost.step_time_prediction for {pred.gpu}: the course's predictor (matrix FLOPs "
                          "at the achievable rate, element-wise bytes at the achievable bandwidth, against the "
                          "host's launches)")
                ctx.value(f"{name}_measured_over_predicted", entry["median"] / pred.seconds, "x",
                          "median step seconds / the prediction above")
        del model, ids_tgt, ids_src, step


# --------------------------------------------------------------------------- chapter 6: losses and optimizers

ADAMW_TARGET = 1.5
"""Fused AdamW's speedup over the foreach implementation on GPT-2 small's parameters."""


@item(6, "adamw_fused_vs_foreach", cap_s=10,
      title="AdamW step on GPT-2 small's 124 M parameters: foreach against fused (optimizer.step only)")
def adamw_fused_vs_foreach(ctx: Context) -> None:
    from gpuformer_lib.predict import optimizer_cost
    from gpuformer_lib.model import DecoderLM, TransformerConfig, gpt2_config

    config = ctx.size(TransformerConfig(vocab_size=512, d_model=64, n_heads=4, n_decoder_layers=2, d_ff=256,
                                        dropout=0.0, max_len=64, activation="gelu", positional="learned"),
                      gpt2_config())
    torch.manual_seed(0)
    with torch.device(ctx.device):
        base = [p.detach() for p in DecoderLM(config).parameters()]  # tied weights counted once
    n = sum(t.numel() for t in base)
    ctx.note(f"the {len(base)} parameter tensors of DecoderLM({'gpt2_config()' if not ctx.toy else 'a tiny config'}): "
             f"{n / 1e6:.1f} M float32 parameters, random gradients; lr 1e-3, weight decay 0.1")
    fast = ("fused", dict(fused=True))
    try:  # fused AdamW exists for CUDA (and the CPU in recent torch): check it runs here
        probe = torch.nn.Parameter(torch.zeros(2, device=ctx.device))
        probe.grad = torch.ones_like(probe)
        torch.optim.AdamW([probe], **fast[1]).step()
    except (RuntimeError, ValueError) as error:
        if ctx.device.type == "cuda":
            raise
        ctx.note(f"fused AdamW does not run on {ctx.device} here ({error}); timing foreach against the for-loop")
        fast = ("for-loop", dict(foreach=False))
    optimizers = {}
    for label, flags in (("foreach", dict(foreach=True)), fast):
        params = [torch.nn.Parameter(t.clone()) for t in base]
        gen = torch.Generator(device=ctx.device).manual_seed(1)  # the same gradients for both
        for p in params:
            p.grad = torch.randn(p.shape, device=ctx.device, generator=gen)
        optimizers[label] = (torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, **flags), params)
    del base
    (slow_opt, slow_params), (fast_opt, fast_params) = optimizers["foreach"], optimizers[fast[0]]
    slow_opt.step()
    fast_opt.step()
    for i, (a, b) in enumerate(zip(fast_params, slow_params)):
        ctx.check_close(f"{fast[0]} vs foreach AdamW after one step, parameter {i} {tuple(a.shape)}", a.detach(),
                        b.detach(), atol=1e-6, rtol=1e-5)
    entry = ctx.compare("adamw_step", ("foreach", slow_opt.step), (fast[0], fast_opt.step), repeats=10, share=0.5)
    rates = {}
    for side, impl in (("before", "foreach"), ("after", fast[0])):
        if impl == "for-loop":
            continue
        moved = optimizer_cost.adamw_step_bytes(n, implementation=impl)
        rates[impl] = ctx.value(f"{impl}_counted_bandwidth", moved / entry[side]["median"], "B/s",
                                f"optimizer_cost.adamw_step_bytes ({moved / n:.0f} B per float32 parameter for {impl}) "
                                "/ median step seconds")
    if fast[0] != "fused":
        ctx.note("target fused_adamw_over_foreach not measured: no fused AdamW here")
        return
    predicted = optimizer_cost.adamw_step_bytes(n, implementation="foreach") / optimizer_cost.adamw_step_bytes(
        n, implementation="fused")
    ctx.target("fused_adamw_over_foreach", entry["speedup"], ADAMW_TARGET, why_short=(
        f"{n / 1e6:.1f} M parameters in {len(fast_params)} tensors: foreach {_ms(entry['before']['median'])} "
        f"({rates['foreach'] / 1e9:.0f} GB/s of the bytes optimizer_cost counts for it), fused "
        f"{_ms(entry['after']['median'])} ({rates['fused'] / 1e9:.0f} GB/s of its counted bytes); for a memory-bound "
        f"step the counted bytes predict {predicted:.1f}x, and the fused kernel moved its bytes "
        f"{rates['fused'] / rates['foreach']:.2f}x as fast as foreach did"))
