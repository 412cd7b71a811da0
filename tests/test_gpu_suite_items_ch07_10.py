"""Pure helpers of the GPU suite's items for chapters 7-10: the synthetic sentence pairs chapter 7's bucketing
item batches, and the guard that stops a compile before an item's cap."""

import time

import pytest

from gpuformer_lib.data import Vocab, collate_translation
from gpuformer_lib.gpu_suite.items_ch07_10 import OutOfTime, StopBeforeCap, synthetic_pairs


def test_synthetic_pairs_are_shaped_as_encode_pairs_makes_them():
    pairs = synthetic_pairs(400, 24, src_vocab=50, tgt_vocab=40, seed=3)
    assert len(pairs) == 400
    for src, tgt in pairs:
        assert 2 <= len(src) <= 23 and src[-1] == Vocab.EOS and int(src[:-1].min()) >= len(Vocab.SPECIALS)
        assert 3 <= len(tgt) <= 24 and tgt[0] == Vocab.BOS and tgt[-1] == Vocab.EOS and int(tgt.max()) < 40
    lengths = sorted(max(len(s), len(t)) for s, t in pairs)
    assert lengths[len(lengths) // 2] < lengths[-1] / 1.5, "skewed: the median well below the longest"
    again = synthetic_pairs(400, 24, src_vocab=50, tgt_vocab=40, seed=3)
    assert all(a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist() for a, b in zip(again, pairs))
    collate_translation(pairs[:8])  # collates as chapter 7's batches do


def test_stop_before_cap_interrupts_a_long_phase_and_says_so():
    guard = StopBeforeCap(seconds_left=0.4, margin_s=0.2)
    started = time.perf_counter()
    with pytest.raises(OutOfTime), guard:
        while time.perf_counter() - started < 5:
            sum(range(1000))
    assert guard.fired and time.perf_counter() - started < 2
    quick = StopBeforeCap(seconds_left=0.5, margin_s=0.2)
    with quick:
        pass
    assert not quick.fired
    time.sleep(0.6)  # the alarm was cancelled on the way out: nothing rings later
    with pytest.raises(OutOfTime):
        with StopBeforeCap(seconds_left=1, margin_s=2):
            pass
