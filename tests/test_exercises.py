"""Each exercise check passes a right answer and gives the specific hint for a typical wrong one."""

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
    (lambda n, dtype: n * dtype.itemsize / 2**30, None),
    (lambda n, dtype: n * dtype.itemsize, "returned bytes"),
    (lambda n, dtype: n * dtype.itemsize / 1e9, "GiB (2**30 bytes)"),
    (lambda n, dtype: n * 4 / 2**30, "dtype.itemsize"),
])
def test_weights_memory(capsys, answer, hint):
    result = ex.check_weights_memory(answer)
    assert bool(result) == (hint is None)
    if hint:
        assert hint in hint_of(capsys, result)


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


def fits(bytes_per_param):
    return lambda n, gib: n * bytes_per_param <= gib * 2**30


@pytest.mark.parametrize("answer, hint", [
    (fits(16), None),
    (fits(4), "weights only"),
    (fits(8), "two states per parameter"),
    (fits(12), "4 bytes short"),
    (fits(20), "more than needed"),
])
def test_fits_training(capsys, answer, hint):
    result = ex.check_fits_training(answer)
    assert bool(result) == (hint is None)
    if hint:
        assert hint in hint_of(capsys, result)


@pytest.mark.parametrize("answer, hint", [
    (lambda m, n, k: 2 * m * n * k, None),
    (lambda m, n, k: m * n * k, "2 FLOPs"),
    (lambda m, n, k: m * n * (2 * k - 1), "exact count"),
    (lambda m, n, k: 2 * m * n * n, "dot product of length k"),
])
def test_matmul_flops(capsys, answer, hint):
    result = ex.check_matmul_flops(answer)
    assert bool(result) == (hint is None)
    if hint:
        assert hint in hint_of(capsys, result)


@pytest.mark.parametrize("answer, hint", [
    (lambda m, n, k, b: 2 * m * n * k / ((m * k + k * n + m * n) * b), None),
    (lambda m, n, k, b: 2 * m * n * k / ((m * k + k * n) * b), "not writing C"),
    (lambda m, n, k, b: m * n * k / ((m * k + k * n + m * n) * b), "half"),
    (lambda m, n, k, b: 2 * m * n * k / (m * k + k * n + m * n), "elements, not bytes"),
])
def test_matmul_intensity(capsys, answer, hint):
    result = ex.check_matmul_intensity(answer)
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
