"""The chapter-3 checks of exercises.attention: a right answer passes, each typical wrong one gets its hint."""

import torch

from gpuformer_lib import tiled_attention as ta
from gpuformer_lib.exercises.attention import check_attention_memory_prediction, check_online_softmax_update


def test_memory_prediction_passes_the_right_count_and_explains_misses():
    B, H, T = 1, 2, 128
    q, k, v = (torch.randn(B, H, T, 16) for _ in range(3))
    measured = ta.peak_bytes(lambda: ta.minimal_attention(q, k, v))
    S = B * H * T * T * 4
    assert check_attention_memory_prediction(2 * S, measured)
    low = check_attention_memory_prediction(S / 2, measured)
    assert not low and "alive at the same moment" in low.message
    high = check_attention_memory_prediction(32 * 2 * S, measured)
    assert not high and "Bits or bytes" in high.message
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    both = ta.peak_bytes(lambda: ta.minimal_attention(qg, kg, vg).sum().backward())
    assert check_attention_memory_prediction(3 * S, both, backward=True)
    assert not check_attention_memory_prediction("a lot", both, backward=True)


def _right(m, l, x):
    m_new = torch.maximum(m, x.amax(-1))
    base = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
    return m_new, l * torch.exp(m - base) + torch.exp(x - base[..., None]).sum(-1)


def test_online_softmax_update_check():
    assert check_online_softmax_update(_right)

    def no_rescale(m, l, x):
        m_new = torch.maximum(m, x.amax(-1))
        return m_new, l + torch.exp(x - m_new[..., None]).sum(-1)

    r = check_online_softmax_update(no_rescale)
    assert not r and "not rescaled" in r.message

    def wrong_way(m, l, x):
        m_new = torch.maximum(m, x.amax(-1))
        return m_new, l * torch.exp(torch.nan_to_num(m_new - m, posinf=0.0)) + torch.exp(x - m_new[..., None]).sum(-1)

    r = check_online_softmax_update(wrong_way)
    assert not r and "wrong way" in r.message

    def nan_on_masked(m, l, x):
        m_new = torch.maximum(m, x.amax(-1))
        return m_new, l * torch.exp(m - m_new) + torch.exp(x - m_new[..., None]).sum(-1)

    r = check_online_softmax_update(nan_on_masked)
    assert not r and "NaN" in r.message

    def unfinished(m, l, x):
        raise NotImplementedError

    assert not check_online_softmax_update(unfinished)
    assert not check_online_softmax_update(lambda m, l, x: m)
