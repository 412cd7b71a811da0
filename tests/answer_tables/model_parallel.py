"""Chapter 12: a hand-written 1F1B order, the tensor-parallel MLP's all-reduced bytes, the GPipe bubble."""

from answer_tables import Table, Wrong
from gpuformer_lib import pipeline_orders
from gpuformer_lib.exercises import model_parallel


def one_f_one_b(stage, stages, micro_batches):
    """The chapter's solution: p - s - 1 forwards, then one forward and the oldest backward, then drain."""
    warmup = min(stages - stage - 1, micro_batches)
    steps = [("F", i) for i in range(warmup)]
    for i in range(warmup, micro_batches):
        steps += [("F", i), ("B", i - warmup)]
    return steps + [("B", i) for i in range(micro_batches - warmup, micro_batches)]


def serial(stage, stages, micro_batches):
    """Backward of i right after forward of i on every stage: no overlap."""
    return [step for i in range(micro_batches) for step in (("F", i), ("B", i))]


def crossed(stage, stages, micro_batches):
    """The stages take the micro-batches in opposite orders: a deadlock."""
    ids = range(micro_batches) if stage == 0 else reversed(range(micro_batches))
    return [step for i in ids for step in (("F", i), ("B", i))]


def warmup_upside_down(stage, stages, micro_batches):
    """s warm-up forwards on stage s instead of p - s - 1: the last stage waits for gradients nobody sends."""
    warmup = min(stage, micro_batches)
    steps = [("F", i) for i in range(warmup)]
    for i in range(warmup, micro_batches):
        steps += [("F", i), ("B", i - warmup)]
    return steps + [("B", i) for i in range(micro_batches - warmup, micro_batches)]


def warmup_p_everywhere(stage, stages, micro_batches):
    """p warm-up forwards on every stage, the last one included."""
    warmup = min(stages, micro_batches)
    steps = [("F", i) for i in range(warmup)]
    for i in range(warmup, micro_batches):
        steps += [("F", i), ("B", i - warmup)]
    return steps + [("B", i) for i in range(micro_batches - warmup, micro_batches)]


def tp_bytes(predicted):
    """The worker's MLP: (B T, C) = (8, 64) float32 over 2 ranks; the hook counted 2048 B each way."""
    return model_parallel.check_tp_bytes_prediction(predicted, 4096, 8, 64, 4)


def bubble(predicted):
    """p = 2 stages, m = 4 micro-batches: the formula's idle share is 1 / 5 = 20 %. The run's measurement
    (45 %, a run that idled near the naive model's 50 %) is shown, never graded."""
    return model_parallel.check_bubble_prediction(predicted, 0.45, 2, 4)


TABLES = [
    Table(
        "check_one_f_one_b", model_parallel.check_one_f_one_b,
        right=(one_f_one_b, pipeline_orders.one_f_one_b_order),
        wrong=(Wrong("GPipe's order", pipeline_orders.gpipe_order, ("GPipe's order", "at most p")),
               Wrong("no warm-up: F i, B i on every stage", serial, ("time slots", "naive placement")),
               Wrong("the stages cross their micro-batches", crossed, ("deadlock",)),
               Wrong("warm-up of s forwards, upside down", warmup_upside_down, ("deadlock", "stage s + 1")),
               Wrong("p warm-up forwards on every stage", warmup_p_everywhere, ("time slots", "p - s - 1")),
               Wrong("forwards only", lambda s, p, m: [("F", i) for i in range(m)], ("never run their backward",))),
    ),
    Table(
        "check_tp_bytes_prediction", tp_bytes,
        right=(2 * 8 * 64 * 4, 4096.0),
        wrong=(Wrong("one direction only", 2048, ("Forward and backward each",)),
               Wrong("the hidden layer (4C) communicated", 4 * 4096, ("hidden layer",)),
               Wrong("elements, not bytes", 2 * 8 * 64, ("counts elements", "element_bytes")),
               Wrong("bits, not bytes", 8 * 4096, ("counts bits",)),
               Wrong("times the 2 ranks", 2 * 4096, ("too high", "number of ranks does not change"))),
    ),
    Table(
        "check_bubble_prediction", bubble,
        right=(20, 20.4, 100 * (2 - 1) / (4 + 2 - 1)),
        wrong=(Wrong("naive placement, (p - 1) / p", 50, ("naive placement", "45 %")),
               Wrong("idle over busy, (p - 1) / m", 25, ("divides the idle slots by the busy ones",)),
               Wrong("the busy share, m / (m + p - 1)", 80, ("the share each stage works",)),
               Wrong("a fraction, not percent", 0.2, ("not 0.3",)),
               Wrong("far too high, no known mistake", 90, ("too high",)),
               Wrong("far too low, no known mistake", 5, ("too low",))),
    ),
]
