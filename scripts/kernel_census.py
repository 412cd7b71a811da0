"""Which ATen operators of a training step launch how many GPU kernels: the ground truth for counting a step's
kernels on a CPU (issue "predictions": one kernel count, checked against the profiler's).

For the GPU suite's profiled step (``ch10.profile_step``: GPT-2 small, bf16 autocast, fused attention, eager,
batch 4 x 1024) and the same step with fused AdamW, one step runs under a ``TorchDispatchMode`` that counts every
operator dispatched below autograd, and one under ``torch.profiler``, whose CPU events list the kernels each
``aten::`` operator launched itself. Written: for each operator name, how often it was dispatched, how often the
profiler saw it, and the kernels launched directly under it; the step's total of kernels (memcpy and memset
left out, as the suite counts them). On a CPU it runs the tiny preset (no kernels: a rehearsal of the code).

Then the launch floor of the same eager step, measured: at sizes so small that the GPU's work is a few
microseconds per kernel (batch 1 x 16 to 1 x 256 tokens), the step's time is set by the host issuing its
kernels, so time per step / kernels per step is the cost of one launch inside a real training step (Python,
autograd and the dispatcher included), the constant a launch floor multiplies.

    python scripts/kernel_census.py OUT.json
"""

from __future__ import annotations

import collections
import json
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gpuformer_lib import ladder, speed
from gpuformer_lib.model import DecoderLM


class Dispatched(TorchDispatchMode):
    """Counts the operators dispatched below autograd, by name (``aten.mm.default`` -> ``aten::mm``)."""

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[f"aten::{func.__name__.split('.')[0]}"] += 1
        return func(*args, **(kwargs or {}))


def training_step(device: torch.device, fused_optimizer: bool):
    """The suite's profiled step: GPT-2 small (the tiny preset on a CPU), bf16 autocast on a GPU, fused attention,
    no id check, AdamW (foreach, or fused); returns ``(preset, plan, model, step)``."""
    preset = ladder.PRESETS["gpt2-small" if device.type == "cuda" else "tiny"]
    plan = speed.SpeedPlan(dtype=torch.bfloat16 if device.type == "cuda" else None, check_token_ids=False,
                           fused_optimizer=fused_optimizer)
    torch.manual_seed(0)
    with device:
        model = DecoderLM(speed.model_config(preset.config, plan))
    optimizer = speed.make_adamw(model.parameters(), plan, lr=1e-4)
    step = speed.make_train_step(model, optimizer, speed.next_token_loss, dtype=plan.dtype,
                                 scaler=speed.grad_scaler(plan, device))
    return preset, plan, model, step


def profile_one(step, ids, device: torch.device):
    """One step under torch.profiler (with CUDA activity on a GPU), synchronised before it stops."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda"
                                                      else [])) as prof:
        step([ids])
        if device.type == "cuda":
            torch.cuda.synchronize()
    return prof


def is_device_event(event) -> bool:
    return getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA


def is_copy(name: str) -> bool:
    """memcpy and memset: left out of kernel counts, as the suite leaves them out."""
    return "memcpy" in name.lower() or "memset" in name.lower()


def census(device: torch.device, fused_optimizer: bool) -> dict:
    on_gpu = device.type == "cuda"
    preset, plan, model, step = training_step(device, fused_optimizer)
    batch, seq_len = (4, preset.seq_len) if on_gpu else (1, 64)
    ids = torch.randint(0, preset.config.vocab_size, (batch, seq_len + 1)).to(device)
    for _ in range(3):  # warm-up: the optimizer's state exists, lazy initialisations are done
        step([ids])
    if on_gpu:
        torch.cuda.synchronize()
    with Dispatched() as mode:
        step([ids])
    if on_gpu:
        torch.cuda.synchronize()
    prof = profile_one(step, ids, device)
    calls: collections.Counter = collections.Counter()
    kernels: collections.Counter = collections.Counter()
    kernel_names: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    total = copies = 0
    for event in prof.events():
        if is_device_event(event):
            if is_copy(event.name):
                copies += 1
            else:
                total += 1
            continue
        if event.name.startswith("aten::"):
            calls[event.name] += 1
            own = [k for k in getattr(event, "kernels", []) if not is_copy(k.name)]
            kernels[event.name] += len(own)
            for k in own:
                kernel_names[event.name][k.name[:80]] += 1
    names = sorted(set(mode.counts) | set(calls))
    return {
        "preset": preset.name, "batch": batch, "seq_len": seq_len, "dtype": str(plan.dtype),
        "fused_optimizer": fused_optimizer, "parameters": len(list(model.parameters())),
        "kernels_per_step": total, "copies_per_step": copies,
        "dispatched_per_step": sum(mode.counts.values()),
        "operators": {n: {"dispatched": mode.counts.get(n, 0), "profiled": calls.get(n, 0),
                          "kernels": kernels.get(n, 0),
                          "kernel_names": dict(kernel_names[n].most_common(4))} for n in names},
    }


def launch_floor(device: torch.device, fused_optimizer: bool, seq_lens=(16, 64, 256)) -> list[dict]:
    """Median step time of the eager step at batch 1 and small ``seq_lens``, with its kernels per step (the
    profiler's count, memcpy and memset left out): their ratio is the time per launch when the host is the
    bottleneck. CUDA events around 20 steps, 5 repeats after 5 warm-up steps."""
    preset, _, _, step = training_step(device, fused_optimizer)
    rows = []
    for seq_len in [t for t in seq_lens if t < preset.config.max_len]:
        ids = torch.randint(0, preset.config.vocab_size, (1, seq_len + 1)).to(device)
        for _ in range(5):
            step([ids])
        times = []
        for _ in range(5):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(20):
                    step([ids])
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3 / 20)
            else:
                t0 = time.perf_counter()
                for _ in range(20):
                    step([ids])
                times.append((time.perf_counter() - t0) / 20)
        events = [e for e in profile_one(step, ids, device).events() if is_device_event(e)]
        kernels = sum(1 for e in events if not is_copy(e.name))
        gpu_busy = sum(e.device_time for e in events) / 1e6
        times.sort()
        median = times[len(times) // 2]
        rows.append({"batch": 1, "seq_len": seq_len, "step_s_median": median, "step_s_repeats": times,
                     "kernels_per_step": kernels, "gpu_busy_s": gpu_busy,
                     "seconds_per_kernel": median / kernels if kernels else None})
    return rows


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    started = time.time()
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
              "runs": [census(device, fused) for fused in (False, True)],
              "launch_floor": {str(fused): launch_floor(device, fused) for fused in (False, True)}}
    result["seconds"] = round(time.time() - started, 1)
    with open(argv[0], "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    for run in result["runs"]:
        print(f"fused_optimizer={run['fused_optimizer']}: {run['kernels_per_step']} kernels, "
              f"{run['dispatched_per_step']} operators dispatched, {run['copies_per_step']} copies")
    for fused, rows in result["launch_floor"].items():
        for r in rows:
            print(f"fused={fused} T={r['seq_len']}: step {r['step_s_median'] * 1e3:.2f} ms, {r['kernels_per_step']} "
                  f"kernels, GPU busy {r['gpu_busy_s'] * 1e3:.2f} ms, "
                  + (f"{r['seconds_per_kernel'] * 1e6:.2f} us per kernel" if r["seconds_per_kernel"] else "no kernels"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
