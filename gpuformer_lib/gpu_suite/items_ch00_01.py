"""Items of chapters 0 and 1: what a launch and a synchronisation cost, and what the hardware sustains:
matrix products per number format, copy bandwidth, and the launch floor of small element-wise work."""

from __future__ import annotations

import torch

from gpuformer_lib.bench import float32_matmul_precision
from gpuformer_lib.gpu_suite.core import Context, item


@item(0, "sync_and_launch", cap_s=8, title="host synchronisation and the cost of one small kernel launch")
def sync_and_launch(ctx: Context) -> None:
    from gpuformer_lib import bench

    ctx.time("synchronize_idle", lambda: bench.synchronize(ctx.device), repeats=20, number=100)
    x = torch.zeros(1, device=ctx.device)
    # 200 launches of a one-element add between two events: with nothing else queued, the GPU waits on the
    # host, so this is the launch rate a Python loop of tiny kernels can reach
    entry = ctx.time("tiny_kernel_launch", lambda: x.add_(1.0), repeats=10, number=200)
    ctx.value("launches_per_second", 1.0 / entry["median"], "1/s", "1 / median seconds per launch of x.add_(1) "
              "on a one-element tensor, 200 launches between two CUDA events")


FORMATS = (("float32", torch.float32, False), ("tf32", torch.float32, True),
           ("bfloat16", torch.bfloat16, False), ("float16", torch.float16, False))


@item(1, "matmul_formats", cap_s=25, title="square matrix products per format (fp32, TF32, bf16, fp16) over n")
def matmul_formats(ctx: Context) -> None:
    sizes = ctx.size([64, 128], [1024, 2048, 4096, 8192])
    bf16_native = ctx.device.type != "cuda" or torch.cuda.is_bf16_supported(including_emulation=False)
    for name, dtype, tf32 in FORMATS:
        if dtype == torch.bfloat16 and not bf16_native:
            ctx.note("bfloat16 skipped: no native bf16 on this GPU (it would be emulated)")
            continue
        for n in sizes:
            a = torch.randn(n, n, device=ctx.device, dtype=dtype)
            b = torch.randn(n, n, device=ctx.device, dtype=dtype)
            out = torch.empty(n, n, device=ctx.device, dtype=dtype)
            with float32_matmul_precision("high" if tf32 else "highest"):
                ctx.time(f"{name}_n{n}", lambda: torch.matmul(a, b, out=out), repeats=5, share=0.1,
                         work=2 * n**3, work_unit="FLOP")


@item(1, "copy_bandwidth", cap_s=8, title="device-to-device copy bandwidth over sizes (bytes read + written)")
def copy_bandwidth(ctx: Context) -> None:
    for log2 in ctx.size([12, 16, 20], [16, 20, 24, 26, 28, 30]):
        nbytes = 2**log2
        src = torch.empty(nbytes, dtype=torch.uint8, device=ctx.device).random_()
        dst = torch.empty_like(src)
        ctx.time(f"copy_2^{log2}B", lambda: dst.copy_(src), repeats=7, share=0.15, work=2 * nbytes,
                 work_unit="B")


@item(1, "launch_floor", cap_s=8, title="element-wise add over sizes: the launch floor, then bandwidth")
def launch_floor(ctx: Context) -> None:
    for log2 in ctx.size([8, 12, 16], [8, 12, 16, 20, 22, 24, 26, 28]):
        n = 2**log2
        x = torch.randn(n, device=ctx.device)
        y = torch.randn(n, device=ctx.device)
        out = torch.empty_like(x)
        # 3 x 4 bytes per element: two reads and one write
        ctx.time(f"add_2^{log2}", lambda: torch.add(x, y, out=out), repeats=7, number=10, share=0.15,
                 work=12 * n, work_unit="B")
