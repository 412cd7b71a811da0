"""Chapter 10: read-backs in a trace, the FLOPs of a wider model, a run's plan."""

from answer_tables import Table, Wrong
from gpuformer_lib import bottlenecks
from gpuformer_lib.exercises import profiling

TRACE = "traces/cpu-tiny-step.json"
"""The shipped trace exercise 10.1 reads (found wherever the test runs)."""


def read_backs(fn):
    return profiling.check_read_backs_per_step(fn, TRACE)


def inside_steps(events, name):
    """Events called ``name`` inside the ProfilerStep#N windows, per window."""
    steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
    hits = [e for e in events for s in steps
            if e["name"] == name and s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"]]
    return len(hits) / len(steps)


def forward_flops_per_token(C, layers=2, T=128, V=512, square=24, attention=4, output=2):
    """The chapter's solution (24 C^2 + 4 T C per layer, 2 C V), with terms to leave out."""
    return layers * (square * C * C + attention * T * C) + output * C * V


FLOPS_MEASURED = 3.3846
"""What FlopCounterMode counted in the notebook, width 96 to 192 (shown, not graded)."""


def width_ratio(answer):
    return profiling.check_width_flops_prediction(answer, FLOPS_MEASURED, width=96)


def ratio(**terms):
    return forward_flops_per_token(192, **terms) / forward_flops_per_token(96, **terms)


def plan(n_tokens, hours, flops_per_token, peak_flops):
    """The chapter's solution."""
    tokens_per_second = n_tokens / (hours * 3600)
    return tokens_per_second, tokens_per_second * flops_per_token / peak_flops


def plan_with(mfu_of):
    """The right rate, and an MFU computed by ``mfu_of(rate, flops_per_token, peak)``."""
    def wrong_plan(n_tokens, hours, flops_per_token, peak_flops):
        rate = n_tokens / (hours * 3600)
        return rate, mfu_of(rate, flops_per_token, peak_flops)
    return wrong_plan


TABLES = [
    Table(
        "check_read_backs_per_step", read_backs,
        right=(bottlenecks.syncs_per_step, lambda ev: inside_steps(ev, "aten::_local_scalar_dense"),
               lambda ev: inside_steps(ev, "aten::item")),
        wrong=(Wrong("both names counted", lambda ev: inside_steps(ev, "aten::item")
                     + inside_steps(ev, "aten::_local_scalar_dense"), ("twice",)),
               Wrong("the whole trace, not per step", lambda ev: len(bottlenecks.host_syncs(ev)), ("whole trace",)),
               Wrong("only the loop's loss.item()", lambda ev: 1, ("fewer", "not the only")),
               Wrong("the GPU's cudaStreamSynchronize on a CPU trace",
                     lambda ev: inside_steps(ev, "cudaStreamSynchronize"), ("look for the names",))),
    ),
    Table(
        "check_width_flops_prediction", width_ratio,
        right=(ratio(), 3.38, 3.4),
        wrong=(Wrong("the C^2 terms alone", 4.0, ("only for the terms in C^2",)),
               Wrong("every term linear", 2.0, ("grow 4x",)),
               Wrong("attention ignored", ratio(attention=0), ("attention", "4TC")),
               Wrong("the output layer ignored", ratio(output=0), ("output layer", "2CV")),
               Wrong("attention halved for the causal mask", ratio(attention=2), ("causal masking does not halve",)),
               Wrong("the feed-forward as one product", ratio(square=16), ("two products",)),
               Wrong("6N from the parameter counts", 3.55, ("6N",)),
               Wrong("upside down", 1 / ratio(), ("upside down",))),
    ),
    Table(
        "check_run_plan", profiling.check_run_plan,
        right=(plan,),
        wrong=(Wrong("hours not turned into seconds", lambda n, h, f, p: (n / h, n / h * f / p), ("3600 seconds",)),
               Wrong("MFU in percent", plan_with(lambda r, f, p: 100 * r * f / p), ("not a percent",)),
               Wrong("MFU upside down", plan_with(lambda r, f, p: p / (r * f)), ("upside down",)),
               Wrong("the training step's x3 counted twice", plan_with(lambda r, f, p: 3 * r * f / p),
                     ("already counts", "3")),
               Wrong("FLOPs per token forgotten", plan_with(lambda r, f, p: r / p),
                     ("multiply by the FLOPs per token",))),
    ),
]
