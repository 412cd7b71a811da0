"""Chapter 0 and 1.1: memory, precision, the training state, the read interval, the matmul's FLOPs."""

from answer_tables import Table, Wrong
from gpuformer_lib.exercises import hardware
from gpuformer_lib.profiles import training_precision


def fits(bytes_per_param: float, unit: float = 2**30, fixed_gib: float | None = None):
    """A ``fits_training`` that counts ``bytes_per_param`` and compares with GiB (or ``unit``) of memory."""
    return lambda n, gib: n * bytes_per_param <= (gib if fixed_gib is None else fixed_gib) * unit


DEVICES = hardware.precision_devices()
PRECISIONS = {description: training_precision(profile) for description, profile in DEVICES.items()}


def precisions(rule):
    """The precision answers given by ``rule(profile)`` for every device of exercise 0.2."""
    return {description: rule(profile) for description, profile in DEVICES.items()}


def course_precision(description: str) -> str:
    """The notebook's solution: from the compute capability in the description."""
    import re

    found = re.search(r"compute capability (\d+)\.(\d+)", description)
    if found is None:
        return "fp32"
    return "bf16" if (int(found[1]), int(found[2])) >= (8, 0) else "fp16"


# exercise 0.4's block: Linear(64, 256), GELU, Linear(256, 64), float32, with biases
LAYERS = ((64, 256), (256, 64))
N_PARAMS = sum(i * o + o for i, o in LAYERS)
STATE_BYTES = 16 * N_PARAMS  # what memory.model_state_bytes counts after one AdamW step (step counters skipped)


def training_state(predicted):
    return hardware.check_training_state_prediction(predicted, STATE_BYTES, layers=LAYERS)


# exercise 0.5 on a GPU-like device, where a read waits for the queue: costs in seconds
N, K, QUEUED, READ_EACH = 2000, 50, 2e-6, 50e-6
READ_INTERVAL = N * QUEUED + N // K * (READ_EACH - QUEUED)


def read_interval(predicted):
    # the loop's own time (shown, not graded) sits 10 % above the model, as a busy machine's would
    return hardware.check_read_interval_prediction(predicted, 1.1 * READ_INTERVAL, n=N, read_every=K,
                                                   queued=QUEUED, read_each=READ_EACH)


TABLES = [
    Table(
        "check_weights_memory", hardware.check_weights_memory,
        right=(lambda n, dtype: n * dtype.itemsize / 2**30,),
        wrong=(Wrong("bytes", lambda n, dtype: n * dtype.itemsize, ("returned bytes",)),
               Wrong("GB not GiB", lambda n, dtype: n * dtype.itemsize / 1e9, ("GiB (2**30 bytes)",)),
               Wrong("always 4 bytes", lambda n, dtype: n * 4 / 2**30, ("dtype.itemsize",))),
    ),
    Table(
        "check_fits_training", hardware.check_fits_training,
        right=(fits(16), fits(4 + 4 + 8), lambda n, gib: n * 16 < gib * 2**30,
               lambda n, gib: n * 16 / 2**30 <= gib),
        wrong=(Wrong("weights only", fits(4), ("weights only",)),
               Wrong("16-bit weights only", fits(2), ("weights only",)),
               Wrong("weights and gradients", fits(8), ("two states per parameter",)),
               Wrong("one AdamW moment", fits(12), ("4 bytes short", "two fp32 states")),
               Wrong("mixed precision's 18 bytes", fits(18), ("18 bytes", "16 bytes per parameter")),
               Wrong("20 bytes", fits(20), ("more than needed",)),
               Wrong("GB not GiB", fits(16, unit=1e9), ("GB (10**9 bytes)", "2**30")),
               Wrong("bytes compared with GiB", fits(16, unit=1), ("compared bytes with GiB",)),
               Wrong("a T4's 16 GiB written in", fits(16, fixed_gib=16.0), ("gpu_memory_gib argument",))),
    ),
    Table(
        "check_precision_choice", hardware.check_precision_choice,
        right=(PRECISIONS, {description: course_precision(description) for description in DEVICES},
               {description: f" {answer.upper()} " for description, answer in PRECISIONS.items()}),
        wrong=(Wrong("bf16 on the T4 (is_bf16_supported says True)",
                     precisions(lambda p: "fp32" if not p.on_gpu else "bf16"), ("emulation", "fp16")),
               Wrong("major == 8 instead of cc >= (8, 0)",
                     precisions(lambda p: "fp32" if not p.on_gpu else
                                "bf16" if p.compute_capability[0] == 8 else "fp16"), ("cc >= (8, 0)",)),
               Wrong("bf16 on the CPU with AVX512-BF16", {**PRECISIONS, next(d for d in DEVICES if "CPU" in d): "bf16"},
                     ("on a cpu", "fp32")),
               Wrong("fp32 everywhere", precisions(lambda p: "fp32"), ("fp32 would leave", "fp16 tensor cores")),
               Wrong("fp16 on every GPU", precisions(lambda p: "fp16" if p.on_gpu else "fp32"),
                     ("bf16", "no loss scaler"))),
    ),
    Table(
        "check_training_state_prediction", training_state,
        right=(16 * N_PARAMS, (4 + 4 + 8) * ((64 * 256 + 256) + (256 * 64 + 64)), 530_000, float(STATE_BYTES)),
        wrong=(Wrong("biases left out", 16 * (64 * 256 + 256 * 64), ("left out the biases",)),
               Wrong("weights only", 4 * N_PARAMS, ("weights only",)),
               Wrong("weights and gradients", 8 * N_PARAMS, ("two float32 tensors", "exp_avg_sq")),
               Wrong("one AdamW moment", 12 * N_PARAMS, ("two float32 tensors", "not one")),
               Wrong("the parameter count", N_PARAMS, ("parameter count",)),
               Wrong("KiB", STATE_BYTES / 2**10, ("not KiB",)),
               Wrong("fp64 or counted twice", 32 * N_PARAMS, ("not 32",)),
               Wrong("activations added", STATE_BYTES + 4 * 8 * 256, ("too high", "activations"))),
    ),
    Table(
        "check_read_interval_prediction", read_interval,
        right=(READ_INTERVAL, N * QUEUED + N // K * READ_EACH, round(READ_INTERVAL, 4)),
        wrong=(Wrong("a read on every step", N * READ_EACH, ("Only 40 of the 2000 steps read",)),
               Wrong("the adds forgotten", N // K * READ_EACH, ("Every one of the 2000 steps",)),
               Wrong("the reads forgotten", N * QUEUED, ("read_each - queued", "wait")),
               Wrong("microseconds", READ_INTERVAL * 1e6, ("in seconds", "1 us = 1e-6 s")),
               Wrong("milliseconds", READ_INTERVAL * 1e3, ("in seconds",)),
               Wrong("reads every 50 steps counted as 50 reads", N * QUEUED + K * (READ_EACH - QUEUED),
                     ("too high", "Only 40 of the 2000 steps read"))),
    ),
    Table(
        "check_matmul_flops", hardware.check_matmul_flops,
        right=(lambda m, n, k: 2 * m * n * k, lambda m, n, k: float(2 * m * n * k)),
        wrong=(Wrong("a multiply-add as one FLOP", lambda m, n, k: m * n * k, ("2 FLOPs",)),
               Wrong("the exact count 2k - 1", lambda m, n, k: m * n * (2 * k - 1), ("exact count",)),
               Wrong("off by one, 2(k - 1)", lambda m, n, k: 2 * m * n * (k - 1), ("exact count",)),
               Wrong("the wrong inner dimension", lambda m, n, k: 2 * m * n * n, ("dot product of length k",))),
    ),
]
