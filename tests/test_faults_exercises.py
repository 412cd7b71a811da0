"""Fault injection for the exercise checks (gpuformer issue 14): an answer that never returns, and
answers that return the right value but change their inputs in place, which the checks used to pass
because they computed the expected value from the same, changed, tensors.

The endless loops run under a 1 s time limit, with a 20 s alarm of the test's own as a safety net, so
a broken limit fails the test instead of hanging the suite. Every check that takes code of the learner's (a
function, a class, a kernel) is found by introspection and fed an answer that never returns, in each of the
places the check runs it (its first call, a forward through the learner's module, a library helper calling the
learner's function again).
"""

import contextlib
import importlib
import inspect
import json
import pkgutil
import re
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gpuformer_lib import exercises as ex
from gpuformer_lib.exercises._core import GRADE_LOG_ENV

needs_alarm = pytest.mark.skipif(not hasattr(signal, "SIGALRM") or threading.current_thread() is not
                                 threading.main_thread(), reason="the time limit needs SIGALRM in the main thread")


class SafetyNetFired(Exception):
    pass


@contextlib.contextmanager
def safety_net(seconds=20.0):
    """An outer alarm, as pytest-timeout would set: the check must leave it armed and restore its handler."""

    def fire(signum, frame):
        raise SafetyNetFired(f"the check did not stop the learner's code within {seconds} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield fire
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def loops_forever(*args):
    while True:
        pass


def loops_and_swallows_errors(*args):
    while True:
        try:
            sum(range(1000))
        except Exception:  # a learner's catch-all must not swallow the time limit
            pass


def loops_and_swallows_everything(*args):
    while True:
        try:
            sum(range(1000))
        except:  # noqa: E722 - a bare except, as beginners write it, swallows even a BaseException
            pass


def _swallowing_helper():
    try:
        return sum(range(1000))
    except BaseException:
        return 0


def loops_over_a_helper_that_swallows_everything(*args):
    while True:
        try:
            _swallowing_helper()
        except BaseException:
            continue


def loops_inside_a_handler(*args):
    try:
        raise ValueError("the learner's own error")
    except ValueError:
        while True:
            try:
                sum(range(1000))
            except:  # noqa: E722
                pass


def sleeps(*args):
    time.sleep(60)


@needs_alarm
@pytest.mark.parametrize("answer", [loops_forever, loops_and_swallows_errors, loops_and_swallows_everything,
                                    loops_over_a_helper_that_swallows_everything, loops_inside_a_handler, sleeps])
@pytest.mark.parametrize("check", [ex.check_attention, ex.check_speedup, ex.check_micro_batch_plan])
def test_an_endless_answer_gets_a_hint_within_the_time_limit(capsys, monkeypatch, check, answer):
    monkeypatch.setenv("GPUFORMER_CHECK_TIME_LIMIT", "1")
    trace = sys.gettrace()
    with safety_net() as fire:
        result = check(answer)
        assert signal.getsignal(signal.SIGALRM) is fire  # the outer handler is back...
        assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] < 20  # ...and its timer still runs, not restarted
    assert sys.gettrace() is trace  # the tracing that re-raises the limit is gone again
    # the 1 s limit stopped the answer (the safety net would have raised SafetyNetFired): no clock is read here,
    # since how long past 1 s the check returns depends on the machine's load
    assert not result and "did not return within 1 s: an endless loop?" in result.message
    assert capsys.readouterr().out.strip() == result.message


@needs_alarm
def test_the_time_limit_leaves_no_alarm_behind(monkeypatch):
    monkeypatch.setenv("GPUFORMER_CHECK_TIME_LIMIT", "1")
    before = signal.getsignal(signal.SIGALRM)
    assert not ex.check_bubble(loops_forever)
    assert ex.check_bubble(lambda p, m: (p - 1) / (m + p - 1))
    assert signal.getsignal(signal.SIGALRM) is before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@needs_alarm
def test_an_interrupted_check_restores_the_alarm_handler(monkeypatch):
    monkeypatch.setenv("GPUFORMER_CHECK_TIME_LIMIT", "5")
    before = signal.getsignal(signal.SIGALRM)

    def interrupted(*args):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ex.check_speedup(interrupted)
    assert signal.getsignal(signal.SIGALRM) is before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_outside_the_main_thread_a_check_runs_without_the_limit(capsys):
    results = []
    worker = threading.Thread(target=lambda: results.append(ex.check_speedup(lambda b, a: b / a)))
    worker.start()
    worker.join(timeout=30)
    assert results and results[0]


# --------------------------------------------------------------------------- every check that runs the learner's code


def _all_checks() -> dict[str, object]:
    """Every public ``check_*`` of :mod:`gpuformer_lib.exercises`, as ``module.name`` (two topics have a
    ``check_padding_prediction``)."""
    found = {}
    for info in pkgutil.iter_modules(ex.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"gpuformer_lib.exercises.{info.name}")
        for name, check in vars(module).items():
            if name.startswith("check_") and callable(check) and check.__module__ == module.__name__:
                found[f"{info.name}.{name}"] = check
    return found


def _takes_code(check) -> bool:
    """Whether a check's answer, its first parameter, is code of the learner's: annotated as a Callable, named as
    a class or kernel, or handed to ``_try`` or ``_run_limited`` (which call it)."""
    first = next(iter(inspect.signature(check).parameters.values()))
    if "Callable" in str(first.annotation) or first.name in ("cls", "kernel"):
        return True
    source = inspect.getsource(inspect.unwrap(check))
    return re.search(rf"_(try|run_limited)\(\s*{first.name}\b", source) is not None


CHECKS = _all_checks()
TAKES_CODE = sorted(key for key, check in CHECKS.items() if _takes_code(check))
TRACE = str(Path(__file__).resolve().parent.parent / "notebooks" / "traces" / "cpu-tiny-step.json")
EXTRA_ARGUMENTS = {  # what a check takes after the learner's answer
    "case_studies.check_refusal_diagnosis": ([], 0.06),
    "profiling.check_read_backs_per_step": (TRACE,),
    "training.check_padding_prediction": ([5, 7, 9, 30, 12, 3], 2, 0.3),
}


def endless(*args):
    while True:
        pass


class EndlessForward(torch.nn.Module):
    """A data-parallel wrapper whose construction is fine and whose forward never returns."""

    def __init__(self, module, bucket_bytes):
        super().__init__()
        self.module = module

    def forward(self, x):
        while True:
            pass


class EndlessFinish(EndlessForward):
    """A data-parallel wrapper whose ``finish_gradients`` (after backward) never returns."""

    def forward(self, x):
        return self.module(x)

    def finish_gradients(self):
        while True:
            pass


class _EndlessBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        while True:
            pass


def loss_whose_backward_never_ends(hidden, head, targets):
    return _EndlessBackward.apply(F.cross_entropy(head(hidden).float(), targets))


def trailing_mean_endless_on_a_changed_series(series, t, k):
    """Right on the check's own series; endless on the one the look-ahead test changes from t on (to ~1e3)."""
    if np.max(series[t:]) > 500:
        while True:
            pass
    return float(np.mean(series[t - k:t]))


def tied_head_endless_in_a_model(h, weight):
    """Right on the check's (2, 5, C) input; endless inside the model the check builds around it."""
    if tuple(h.shape[:2]) != (2, 5):
        while True:
            pass
    return h @ weight.T * h.shape[-1] ** -0.5  # (B, T, C) x (C, V) -> (B, T, V)


def clip_endless_when_traced(x):
    """Right when called; endless when Dynamo traces it (the check's graph_breaks)."""
    if torch.compiler.is_compiling():
        while True:
            pass
    peak = x.abs().max()
    return torch.where(peak > 1, x / peak, x)


class EndlessKernel:
    """A ``@triton.jit`` kernel that never returns, made when the test runs (after ``kernel_support`` has chosen
    Triton's interpreter on a CPU, which a kernel must be decorated under)."""

    def __init__(self, inputs: int):
        self.inputs, self.__name__ = inputs, f"endless_kernel_of_{inputs}_inputs"

    def make(self):
        from gpuformer_lib.kernels import kernel_support

        if kernel_support().triton_mode == "unavailable":
            pytest.skip("Triton cannot run here")
        import triton
        import triton.language as tl

        if self.inputs == 2:
            @triton.jit
            def endless_add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
                while True:
                    pass

            return endless_add

        @triton.jit
        def endless_gelu(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            while True:
                pass

        return endless_gelu


# each check's answers that never return: by default a function that loops at once; more where the check runs the
# learner's code again elsewhere (in a model, traced, after backward)
ENDLESS_ANSWERS = {
    "distributed.check_bucketed_data_parallel": [endless, EndlessForward, EndlessFinish],
    "forecasting.check_trailing_mean": [endless, trailing_mean_endless_on_a_changed_series],
    "memory.check_low_memory_loss": [endless, loss_whose_backward_never_ends],
    "tools.check_graph_break_fixed": [endless, clip_endless_when_traced],
    "transformer.check_tied_head": [endless, tied_head_endless_in_a_model],
    "kernels.check_masked_add": [EndlessKernel(2)], "kernels.check_gelu_kernel": [EndlessKernel(1)],
}
ENDLESS_CASES = [pytest.param(key, answer, id=f"{key}-{answer.__name__}")
                 for key in TAKES_CODE for answer in ENDLESS_ANSWERS.get(key, [endless])]


def test_the_checks_that_take_code_are_found():
    """The discovery above finds the checks it must (a function, a class, a kernel), and no check's answer is a
    function without being in it: a new check taking a function is tested below without anyone listing it."""
    assert {"hardware.check_matmul_flops", "distributed.check_bucketed_data_parallel", "kernels.check_masked_add",
            "memory.check_low_memory_loss", "training.check_padding_prediction", "tools.check_graph_break_fixed",
            "case_studies.check_refusal_diagnosis"} <= set(TAKES_CODE)
    assert not {"hardware.check_training_state_prediction", "kernels.check_kernel_roofs"} & set(TAKES_CODE)
    assert len(TAKES_CODE) >= 43, TAKES_CODE  # the course has 43 today
    assert set(EXTRA_ARGUMENTS) <= set(TAKES_CODE) and set(ENDLESS_ANSWERS) <= set(TAKES_CODE)


@needs_alarm
@pytest.mark.parametrize("key, answer", ENDLESS_CASES)
def test_every_check_that_runs_the_learners_code_stops_an_endless_answer(tmp_path, monkeypatch, capsys, key,
                                                                          answer):
    answer = answer.make() if isinstance(answer, EndlessKernel) else answer
    monkeypatch.setenv("GPUFORMER_CHECK_TIME_LIMIT", "0.5")  # 43 checks: each waits for its limit (x 6 for some)
    log = tmp_path / "checks.jsonl"
    monkeypatch.setenv(GRADE_LOG_ENV, str(log))
    trace = sys.gettrace()
    with safety_net(120):  # far above the limit (x 6 for a kernel or a trace), so that a busy machine passes
        result = CHECKS[key](answer, *EXTRA_ARGUMENTS.get(key, ()))
    assert not result and "did not return within" in result.message, result.message
    assert json.loads(log.read_text().splitlines()[-1])["timed_out"] is True  # the grader says "timed out"
    # what the learner's loop interrupted is put back: tracing, autograd, torch's dispatch modes
    assert sys.gettrace() is trace and torch.is_grad_enabled() and torch._C._len_torch_dispatch_stack() == 0


@needs_alarm
def test_a_loop_inside_no_grad_leaves_autograd_on(monkeypatch):
    """The limit used to skip every clean-up on its way out: torch.no_grad's __exit__ too, leaving autograd off
    for the rest of the notebook. Library clean-up now runs; the learner's own handlers still cannot swallow it."""
    monkeypatch.setenv("GPUFORMER_CHECK_TIME_LIMIT", "1")

    def endless_without_grad(m, n, k):
        with torch.no_grad():
            while True:
                pass

    with safety_net():
        assert "did not return within" in ex.check_matmul_flops(endless_without_grad).message
    assert torch.is_grad_enabled()


# --------------------------------------------------------------------------- inputs changed in place
# Each answer returns what the check then expected, because the check computed its expectation from
# the inputs after the answer had changed them; all of these passed before the checks copied inputs.


def attention_zeroing_q(q, k, v):
    q.mul_(0)
    return F.scaled_dot_product_attention(q, k, v)


def split_heads_zeroing_x(x, n_heads):
    x.zero_()
    return x.view(x.shape[0], x.shape[1], n_heads, -1).transpose(1, 2)


def merge_heads_zeroing_y(y):
    y.zero_()
    return y.transpose(1, 2).reshape(y.shape[0], y.shape[2], -1)


def cross_entropy_unmasking(logits, targets, padding_mask):
    padding_mask.fill_(False)  # now "every position is real", and the plain mean looks right
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def buckets_rewriting_lengths(lengths, batch_size):
    lengths[:] = [1 + 99 * (i % 2) for i in range(len(lengths))]  # now even and odd indices make tidy batches
    order = list(range(0, len(lengths), 2)) + list(range(1, len(lengths), 2))
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def buckets_sorting_lengths(lengths, batch_size):
    lengths.sort()
    return [list(range(i, min(i + batch_size, len(lengths)))) for i in range(0, len(lengths), batch_size)]


@pytest.mark.parametrize("check, answer, argument", [
    (ex.check_attention, attention_zeroing_q, "q"),
    (ex.check_split_heads, split_heads_zeroing_x, "x"),
    (ex.check_merge_heads, merge_heads_zeroing_y, "y"),
    (ex.check_masked_cross_entropy, cross_entropy_unmasking, "padding_mask"),
    (ex.check_bucket_batches, buckets_rewriting_lengths, "lengths"),
])
def test_an_answer_that_changes_its_inputs_in_place_is_not_passed(capsys, check, answer, argument):
    result = check(answer)
    assert not result
    assert f"Your function changed {argument} in place" in result.message
    assert capsys.readouterr().out.strip() == result.message


def test_the_in_place_hint_says_what_to_do_instead():
    message = ex.check_attention(attention_zeroing_q).message
    assert "compute a new tensor instead of `q.mul_(...)`" in message
    assert "sorted(lengths) instead of lengths.sort()" in ex.check_bucket_batches(buckets_sorting_lengths).message


def test_a_right_answer_that_also_changes_a_module_is_not_passed():
    def residual_block(x, sublayer, norm, norm_first):
        out = x + sublayer(norm(x)) if norm_first else norm(x + sublayer(x))
        sublayer.bias.zero_()  # a side effect on the caller's layer
        return out

    result = ex.check_residual_block(residual_block)
    assert not result and "changed sublayer in place" in result.message


def test_an_answer_that_changes_a_list_argument_is_not_passed():
    def combine(micro_losses, micro_tokens):
        total = sum(loss * n for loss, n in zip(micro_losses, micro_tokens)) / sum(micro_tokens)
        micro_tokens.clear()
        return total

    result = ex.check_accumulated_loss(combine)
    assert not result and "changed micro_tokens in place" in result.message


def test_inputs_used_as_they_are_still_pass():
    # views of the inputs, and reading them, are not changes
    assert ex.check_split_heads(lambda x, h: x.view(x.shape[0], x.shape[1], h, -1).transpose(1, 2))
    assert ex.check_attention(lambda q, k, v: F.scaled_dot_product_attention(q, k, v))
    assert ex.check_lm_batch(lambda ids, b, n, g: (lambda s: (torch.stack([ids[i:i + b] for i in s]),
                                                              torch.stack([ids[i + 1:i + b + 1] for i in s])))(
        torch.randint(0, len(ids) - b - 1, (n,), generator=g)))  # the generator is meant to be used


@pytest.mark.skipif(__import__("gpuformer_lib.kernels", fromlist=["x"]).kernel_support().triton_mode == "unavailable",
                    reason="Triton is not installed")
def test_a_kernel_that_writes_into_its_inputs_is_not_passed():
    import triton
    import triton.language as tl

    @triton.jit
    def add_into_inputs(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        total = tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, total, mask=mask)
        tl.store(x_ptr + offsets, total * 0.0, mask=mask)  # x + y, read after the launch, is now out
        tl.store(y_ptr + offsets, total, mask=mask)

    result = ex.check_masked_add(add_into_inputs)
    assert not result and "Your kernel wrote into x_ptr, an input" in result.message
