"""Fault injection for the exercise checks (gpuformer issue 14): an answer that never returns, and
answers that return the right value but change their inputs in place, which the checks used to pass
because they computed the expected value from the same, changed, tensors.

The endless loops run under a 1 s time limit, with a 20 s alarm of the test's own as a safety net, so
a broken limit fails the test instead of hanging the suite.
"""

import contextlib
import signal
import sys
import threading
import time

import pytest
import torch
import torch.nn.functional as F

from gpuformer_lib import exercises as ex

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
        start = time.monotonic()
        result = check(answer)
        elapsed = time.monotonic() - start
        assert signal.getsignal(signal.SIGALRM) is fire  # the outer handler is back...
        assert 10 < signal.getitimer(signal.ITIMER_REAL)[0] < 20  # ...and its timer still runs
    assert sys.gettrace() is trace  # the tracing that re-raises the limit is gone again
    assert not result and "did not return within 1 s: an endless loop?" in result.message
    assert elapsed < 5
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
