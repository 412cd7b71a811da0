"""Each exercise check passes a right answer and gives the specific hint for a typical wrong one."""

import dataclasses

import pytest
import torch

from gpuformer_lib import exercises as ex


def hint_of(capsys, result):
    out = capsys.readouterr().out
    assert out.strip() == result.message
    return out


def test_unfinished_and_crashing_answers(capsys):
    def unfinished(*args):
        raise NotImplementedError

    result = ex.check_matmul_flops(unfinished)
    assert not result and "NotImplementedError" in hint_of(capsys, result)
    result = ex.check_matmul_flops(lambda m, n, k: 1 / 0)
    assert not result and "ZeroDivisionError" in hint_of(capsys, result)


def test_check_result_is_truthy_only_on_pass():
    assert ex.check_speedup(lambda before, after: before / after)
    assert not ex.check_speedup(lambda before, after: after / before)
    assert "✅" in ex.check_speedup(lambda b, a: b / a).message


@pytest.mark.parametrize("answer, hint", [
    (lambda cc: cc >= (8, 0), None),
    (lambda cc: cc >= (7, 5), "T4"),
    (lambda cc: cc[0] == 8, "compare the whole tuple"),
    (lambda cc: cc >= (9, 0), "threshold is 8.0"),
    (lambda cc: 1 if cc >= (8, 0) else 0, "True or False"),
])
def test_supports_bf16(capsys, answer, hint):
    result = ex.check_supports_bf16(answer)
    assert bool(result) == (hint is None)
    if hint:
        assert hint in hint_of(capsys, result)


@pytest.mark.parametrize("answer, hint", [
    (lambda i, p, bw: min(p, i * bw), None),
    (lambda i, p, bw: max(p, i * bw), "min, not max"),
    (lambda i, p, bw: p, "memory limits you"),
    (lambda i, p, bw: i * bw, "compute peak caps you"),
    (lambda i, p, bw: min(p, i / bw), "multiply intensity by bandwidth"),
])
def test_attainable_flops(capsys, answer, hint):
    result = ex.check_attainable_flops(answer)
    assert bool(result) == (hint is None)
    if hint:
        assert hint in hint_of(capsys, result)


def test_bound(capsys):
    right = {op: ("compute" if op.startswith("matmul (4096") else "memory") for op in ex.BOUND_OPERATIONS}
    assert ex.check_bound(right)
    capsys.readouterr()
    wrong = dict(right)
    decode = next(op for op in ex.BOUND_OPERATIONS if "decoding" in op)
    wrong[decode] = "compute"
    result = ex.check_bound(wrong)
    assert not result and "memory-bound" in hint_of(capsys, result)
    result = ex.check_bound({op: "?" for op in ex.BOUND_OPERATIONS})
    assert not result and "'memory' or 'compute'" in hint_of(capsys, result)
    result = ex.check_bound({})
    assert not result and "missing" in hint_of(capsys, result)
    # on a device with a much lower ridge (a CPU), the decoding step becomes compute-bound
    assert ex.check_bound({op: "compute" if "matmul" in op else "memory" for op in ex.BOUND_OPERATIONS},
                          peak_flops=150e9, bandwidth=30e9)


@pytest.mark.parametrize("answer, hint", [
    (lambda before, after: before / after, None),
    (lambda before, after: after / before, "Upside down"),
    (lambda before, after: (before - after) / before, "fraction of time saved"),
])
def test_speedup(capsys, answer, hint):
    result = ex.check_speedup(answer)
    assert bool(result) == (hint is None)
    if hint:
        assert hint in hint_of(capsys, result)


def test_weights_memory_accepts_tensor_results(capsys):
    assert ex.check_weights_memory(lambda n, dtype: torch.tensor(n * dtype.itemsize / 2**30, dtype=torch.float64))


# ---- attention, multi-head attention and layers (chapters 3-5)
# (the causal mask, split heads and the residual block: tests/answer_tables/transformer.py)

def run(capsys, check, answer, hint):
    result = check(answer)
    assert bool(result) == (hint is None), result.message
    if hint:
        assert hint in hint_of(capsys, result)


@pytest.mark.parametrize("answer, hint", [
    (lambda q, k, v: ((q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5).softmax(-1) @ v, None),
    (lambda q, k, v: (q @ k.transpose(-2, -1)).softmax(-1) @ v, "forgot to scale"),
    (lambda q, k, v: ((q @ k.transpose(-2, -1)) / q.shape[-1]).softmax(-1) @ v, "not d_k"),
    (lambda q, k, v: ((q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5).softmax(-2) @ v, "last dimension"),
])
def test_attention(capsys, answer, hint):
    run(capsys, ex.check_attention, answer, hint)


@pytest.mark.parametrize("answer, hint", [
    (lambda y: y.transpose(1, 2).reshape(y.shape[0], y.shape[2], -1), None),
    (lambda y: y.reshape(y.shape[0], y.shape[2], -1), "wrong elements"),
])
def test_merge_heads(capsys, answer, hint):
    run(capsys, ex.check_merge_heads, answer, hint)


def test_encoder_layer_parameter_check_agrees_with_the_library():
    from gpuformer_lib.layers import EncoderLayer
    from gpuformer_lib.model import count_parameters
    assert count_parameters(EncoderLayer(64, 4, 100)) == 4 * 64 * 64 + 4 * 64 + 2 * 64 * 100 + 100 + 64 + 4 * 64


# ---- kernels (chapter 2); the Triton kernels' right and wrong answers are in tests/answer_tables/kernels.py

def test_kernel_roofline(capsys):
    right = {name: (f / b, "compute" if f / b > 295 else "memory") for name, (f, b) in ex.KERNEL_COSTS.items()}
    assert ex.check_kernel_roofline(right)
    capsys.readouterr()
    add = "vector add, float32"
    run(capsys, lambda a: ex.check_kernel_roofline(a), {**right, add: (12.0, "memory")}, "upside down")
    run(capsys, lambda a: ex.check_kernel_roofline(a), {**right, add: (1 / 12, "compute")}, "memory-bound")


# ---- losses, schedules and batching (chapters 6-7)

def _masked_ce(logits, targets, pad):
    per = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    return per.view(targets.shape)[~pad].mean()


@pytest.mark.parametrize("answer, hint", [
    (_masked_ce, None),
    (lambda lg, t, p: torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), t.masked_fill(p, -100).reshape(-1)), None),
    (lambda lg, t, p: torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), t.reshape(-1)), "padding included"),
])
def test_masked_cross_entropy(capsys, answer, hint):
    run(capsys, ex.check_masked_cross_entropy, answer, hint)


def _plan(batch, fits):
    micro = batch
    while not fits(micro):
        if micro == 1:
            raise torch.OutOfMemoryError("even one sequence does not fit: shorten it or turn on checkpointing")
        micro //= 2
    return micro, batch // micro


def _plan_no_error(batch, fits):
    micro = batch
    while micro > 1 and not fits(micro):
        micro //= 2
    return micro, batch // micro


@pytest.mark.parametrize("check, answer, hint", [
    (ex.check_accumulated_loss, lambda ls, ns: sum(l * n for l, n in zip(ls, ns)) / sum(ns), None),
    (ex.check_accumulated_loss, lambda ls, ns: sum(ls) / len(ls), "mean of the means"),
    (ex.check_micro_batch_plan, _plan, None),
    (ex.check_micro_batch_plan, lambda b, fits: (1, b), "expected"),
    (ex.check_micro_batch_plan, _plan_no_error, "raise torch.OutOfMemoryError"),
])
def test_memory_checks(capsys, check, answer, hint):
    run(capsys, check, answer, hint)


def _indices(n, world, rank):
    padded = list(range(n)) + list(range(n))[: (-n) % world]
    while len(padded) % world:
        padded += padded[: world - len(padded) % world]
    return padded[rank::world]


@pytest.mark.parametrize("check, answer, hint", [
    (ex.check_allreduce_time, lambda b, n, a, bw: 0.0 if n == 1 else 2 * (n - 1) * a + 2 * (n - 1) / n * b / bw, None),
    (ex.check_allreduce_time, lambda b, n, a, bw: 2 * (n - 1) * a + b / bw, "2 (N - 1) / N"),
    (ex.check_scaling, lambda t1, tn, n: (t1 / tn, t1 / tn / n), None),
    (ex.check_scaling, lambda t1, tn, n: (tn / t1, tn / t1 / n), "upside down"),
    (ex.check_rank_indices, _indices, None),
    (ex.check_rank_indices, lambda n, w, r: list(range(n))[r::w], "padded"),
    (ex.check_bubble, lambda p, m: (p - 1) / (m + p - 1), None),
    (ex.check_bubble, lambda p, m: (p - 1) / m, "fill and drain"),
])
def test_distributed_checks(capsys, check, answer, hint):
    run(capsys, check, answer, hint)


# ---- every check survives any answer: a hint, never a traceback (enumerated, so a new check is covered)

CHECKS = [name for name in ex.__all__ if name.startswith("check_")]


def _raises_value_error(*args):
    raise ValueError("a bug in the learner's function")


WRONG_ANSWERS = {
    "None instead of a function": None,
    "a number instead of a function": 3,
    "a tensor instead of a function": torch.zeros(2, 3),
    "returns None": lambda *args: None,
    "returns a string": lambda *args: "42",
    "raises ValueError": _raises_value_error,
    "returns a complex tensor of a wrong shape": lambda *args: torch.zeros(2, 3, dtype=torch.complex64),
    "returns a bool tensor": lambda *args: torch.ones(3, 1, dtype=torch.bool),
    "returns an int tensor": lambda *args: torch.arange(5),
    "returns a list": lambda *args: [1.0, "a", None],
    "returns a tuple of the wrong things": lambda *args: (torch.zeros(2), "x", None),
    "takes no arguments": lambda: 1.0,
}


def test_the_survival_test_covers_every_check():
    assert len(CHECKS) >= 30
    for name in CHECKS:  # each public check is wrapped by _safe_check, so no exception escapes it
        assert hasattr(getattr(ex, name), "__wrapped__"), f"{name} is not decorated with @_safe_check"


@pytest.mark.parametrize("label", list(WRONG_ANSWERS))
@pytest.mark.parametrize("name", CHECKS)
def test_every_check_turns_a_wrong_answer_into_a_hint(capsys, name, label):
    result = getattr(ex, name)(WRONG_ANSWERS[label])
    assert isinstance(result, ex.CheckResult) and not result, result
    out = hint_of(capsys, result)
    assert out.startswith("❌ Not yet.") and "Traceback" not in out


@pytest.mark.parametrize("check", [ex.check_attention, ex.check_speedup, ex.check_bucket_batches])
def test_common_wrong_answers_get_specific_hints(capsys, check):
    assert "did you forget `return`" in hint_of(capsys, check(lambda *args: None))
    assert f"{check.__name__}(my_function)" in hint_of(capsys, check(None))
    assert "ValueError: a bug in the learner's function" in hint_of(capsys, check(_raises_value_error))


@pytest.mark.parametrize("check, answer, hint", [
    (ex.check_speedup, lambda b, a: torch.tensor([b / a, 1.0]), "one number, not a float32 tensor of shape (2,)"),
    (ex.check_scaling, lambda t1, tn, n: t1 / tn, "a pair (speedup, efficiency), not the number"),
    (ex.check_lm_batch, lambda ids, b, n, g: ids[:b], "two tensors (x, y), not an int64 tensor of shape (16,)"),
    (ex.check_rank_indices, lambda n, w, r: torch.zeros(2), "indices (ints), not a float32 tensor"),
    (ex.check_update_survives, lambda w, u, d: "yes", "True or False, not the string 'yes'"),
    (ex.check_bound, ["memory"], "Pass a dict"),
    (ex.check_kernel_roofline, None, "Pass a dict"),
])
def test_wrong_kinds_of_answers_say_what_came_back(capsys, check, answer, hint):
    run(capsys, check, answer, hint)


def test_a_check_that_fails_on_an_unforeseen_answer_reports_it(capsys):
    from gpuformer_lib.exercises._core import _safe_check, _try

    @_safe_check
    def check_something(fn):
        """``fn(x)`` returns x doubled."""
        got, err = _try(fn, 2)
        return got.shape  # an oversight: the check assumes a tensor

    result = check_something(lambda x: 2 * x)
    out = hint_of(capsys, result)
    assert not result and "the number 4" in out and "AttributeError" in out and "fn(x) returns x doubled" in out


def test_keyboard_interrupt_still_interrupts_a_check():
    def interrupted(*args):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ex.check_attention(interrupted)


def test_a_wrong_time_limit_setting_is_a_hint_not_a_crash(capsys, monkeypatch):
    monkeypatch.setenv("GPUFORMER_CHECK_TIME_LIMIT", "ten")
    result = ex.check_speedup(lambda b, a: b / a)
    assert not result and "GPUFORMER_CHECK_TIME_LIMIT='ten' is not a number of seconds" in hint_of(capsys, result)
    monkeypatch.setenv("GPUFORMER_CHECK_TIME_LIMIT", "0")  # 0: no limit
    assert ex.check_speedup(lambda b, a: b / a)


def test_kernel_checks_ask_for_a_triton_kernel_or_say_triton_is_missing(capsys, monkeypatch):
    from gpuformer_lib import kernels

    if kernels.kernel_support().triton_mode != "unavailable":
        run(capsys, ex.check_masked_add, lambda x, y, out, n, BLOCK: None, "decorated with @triton.jit")
        capsys.readouterr()
    missing = dataclasses.replace(kernels.kernel_support(), triton_mode="unavailable",
                                  triton_reason="Triton is not installed (test)")
    monkeypatch.setattr(kernels, "kernel_support", lambda: missing)
    run(capsys, ex.check_gelu_kernel, kernels.add_kernel, "Triton cannot run here: Triton is not installed (test)")


def test_numpy_forms_of_a_right_answer_pass(capsys):
    """Comparisons of numpy values give numpy's bool and argsort gives an ndarray: right answers in those
    forms pass (the audit found them refused as "not a bool")."""
    import numpy as np
    from torch.utils.data import DistributedSampler

    assert ex.check_supports_bf16(lambda cc: np.array(cc[0]) >= 8)
    assert ex.check_fits_training(lambda n, gib: np.float64(16 * n) <= gib * 2**30)
    assert ex.check_update_survives(
        lambda w, u, dtype: np.bool_((torch.tensor(w, dtype=dtype) + u).to(dtype) != torch.tensor(w, dtype=dtype)))
    assert ex.check_rank_indices(
        lambda n, w, r: np.array(list(DistributedSampler(range(n), num_replicas=w, rank=r, shuffle=False))))
    capsys.readouterr()
    assert not ex.check_supports_bf16(lambda cc: 1)  # a number is not True or False here
    assert "True or False" in capsys.readouterr().out

