"""Greedy translation, sampling, BLEU and perplexity."""

import math

import pytest
import torch

from gpuformer_lib.data import Vocab
from gpuformer_lib.generate import bleu, greedy_translate, perplexity, sample
from gpuformer_lib.model import DecoderLM, Transformer, TransformerConfig

CONFIG = TransformerConfig(vocab_size=20, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1,
                           d_ff=32, dropout=0.0, max_len=12)


def test_greedy_translate_matches_step_by_step_argmax():
    torch.manual_seed(0)
    model = Transformer(CONFIG)
    src = torch.randint(4, 20, (3, 5))
    out = greedy_translate(model, src, max_len=8)
    assert len(out) == 3 and all(len(o) <= 7 for o in out) and all(Vocab.EOS not in o for o in out)
    ys = torch.tensor([[Vocab.BOS]])  # first sequence, by hand
    for _ in range(7):
        nxt = model(src[:1], ys)[:, -1].argmax(-1)
        if nxt.item() == Vocab.EOS:
            break
        ys = torch.cat([ys, nxt[:, None]], dim=1)
    assert out[0] == ys[0, 1:].tolist()


def test_sampling_is_reproducible_and_respects_top_k():
    torch.manual_seed(0)
    lm = DecoderLM(CONFIG)
    prompt = torch.randint(0, 20, (2, 3))
    a = sample(lm, prompt, 15, generator=torch.Generator().manual_seed(1))
    b = sample(lm, prompt, 15, generator=torch.Generator().manual_seed(1))
    assert a.shape == (2, 18) and torch.equal(a, b) and torch.equal(a[:, :3], prompt)
    greedy_like = sample(lm, prompt, 5, top_k=1)
    assert torch.equal(greedy_like[:, 3], lm(prompt)[:, -1].argmax(-1))
    with pytest.raises(ValueError, match="temperature"):
        sample(lm, prompt, 1, temperature=0)


def test_bleu_and_perplexity():
    assert bleu(["我喜欢茶。"], ["我喜欢茶。"]) == pytest.approx(100.0)
    assert bleu(["你好"], ["我喜欢茶。"]) < 10
    with pytest.raises(ValueError):
        bleu([], [])
    assert perplexity(math.log(50)) == pytest.approx(50)
