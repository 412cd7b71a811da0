"""KV-cached decoding and beam search for the encoder-decoder Transformer, against references: the
recomputing ``generate.greedy_translate`` (token for token), ``model.decode``'s last-position logits, a brute-force
search over every output sequence, the same sentences decoded one by one, and ``FlopCounterMode``."""

import dataclasses
import itertools
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from gpuformer_lib import speed
from gpuformer_lib.data import Vocab
from gpuformer_lib.generate import greedy_translate
from gpuformer_lib.model import DecoderLM, Transformer, TransformerConfig
from gpuformer_lib.seq2seq_decoding import (beam_translate, cached_decode_step, decode_timing, decode_work,
                                            gnmt_length_penalty, greedy_translate_cached, prefill_cache)

# A small vocabulary makes <eos> likely from a random model, so sentences finish at different steps.
SMALL = TransformerConfig(vocab_size=7, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=2, d_ff=32,
                          dropout=0.0, max_len=16)


def _batch(seed: int, batch: int = 5, src_len: int = 6, vocab: int = 7):
    """Source ids with different real lengths per sentence (padding at the end, masked)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (batch, src_len), generator=g)
    lengths = torch.randint(1, src_len + 1, (batch,), generator=g)
    lengths[0] = src_len
    mask = torch.arange(src_len)[None, :] >= lengths[:, None]  # (B, S), True at padding
    return src.masked_fill(mask, Vocab.PAD), mask


def _model(seed: int, **changes) -> Transformer:
    """A random model made less degenerate: freshly initialised ones repeat one token forever. Large learned
    positions and noise on the decoder's weights make outputs vary with the step and the source, and end
    with <eos> at different steps."""
    torch.manual_seed(seed)
    model = Transformer(dataclasses.replace(SMALL, **{"positional": "learned", **changes}))
    with torch.no_grad():
        if model.config.positional == "learned":
            model.tgt_pos.pe.normal_(0, 2.0)
        for p in model.decoder.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


@pytest.mark.parametrize("norm_first,tie,fused", list(itertools.product([True, False], repeat=3)))
def test_cached_greedy_equals_recomputing_greedy(norm_first, tie, fused):
    positional = "learned" if tie == fused else "sinusoidal"
    finished_early = 0
    for seed in range(4):
        model = _model(seed, norm_first=norm_first, tie_embeddings=tie, fused_attention=fused, positional=positional)
        src, mask = _batch(seed)
        expected = greedy_translate(model, src, mask, max_len=12)
        assert greedy_translate_cached(model, src, mask, max_len=12) == expected
        finished_early += sum(len(t) < 11 for t in expected)
    assert finished_early > 0  # some sentences ended with <eos> before max_len: that path was exercised


def test_cached_greedy_with_checkpointed_layers_dropout_and_training_mode():
    model = _model(3, dropout=0.3)
    src, mask = _batch(3)
    expected = greedy_translate(model, src, mask, max_len=10)  # sets eval itself
    assert speed.apply_activation_checkpointing(model) == 3
    model.train()
    assert greedy_translate_cached(model, src, mask, max_len=10) == expected
    assert beam_translate(model, src, mask, max_len=10, beam_size=1) == expected
    assert model.training  # restored


@pytest.mark.parametrize("norm_first,fused", [(True, True), (False, False), (True, False)])
def test_cached_step_logits_equal_decode_last_position(norm_first, fused):
    model = _model(4, norm_first=norm_first, fused_attention=fused, vocab_size=30).eval()
    src, mask = _batch(4, vocab=30)
    tgt = torch.randint(4, 30, (src.shape[0], 9))
    tgt[:, 0] = Vocab.BOS
    with torch.no_grad():
        memory = model.encode(src, mask)
        cache = prefill_cache(model, memory, mask, max_len=9)
        for t in range(9):
            step = cached_decode_step(model, tgt[:, t], cache)  # (B, V)
            full = model.decode(tgt[:, : t + 1], memory, mask)[:, -1]  # (B, V)
            torch.testing.assert_close(step, full)
    assert cache.length == 9
    with pytest.raises(ValueError, match="full"):
        cached_decode_step(model, tgt[:, 0], cache)


def test_reordered_cache_equals_the_reordered_prefixes_fed_afresh():
    """Beam search's reorder: rows that take another row's cache continue exactly as if that row's prefix had
    been fed to them (the cross-attention part is shared within a sentence, so both rows are one sentence's)."""
    model = _model(11, vocab_size=12).eval()
    src, mask = _batch(11, batch=1, vocab=12)
    K = 4
    prefixes = torch.randint(4, 12, (K, 4))
    prefixes[:, 0] = Vocab.BOS
    index = torch.tensor([2, 2, 0, 3])
    nxt = torch.randint(4, 12, (K,))
    with torch.no_grad():
        memory = model.encode(src, mask)
        cache = prefill_cache(model, memory, mask, 6, repeat=K)
        fresh = prefill_cache(model, memory, mask, 6, repeat=K)
        for t in range(4):
            cached_decode_step(model, prefixes[:, t], cache)
            cached_decode_step(model, prefixes[index, t], fresh)
        cache.reorder(index)
        torch.testing.assert_close(cached_decode_step(model, nxt, cache), cached_decode_step(model, nxt, fresh))


@pytest.mark.parametrize("seed", range(4))
def test_beam_size_one_is_greedy(seed):
    model = _model(seed, norm_first=bool(seed % 2))
    src, mask = _batch(seed + 10)
    assert beam_translate(model, src, mask, max_len=12, beam_size=1, length_penalty=0.6) == \
        greedy_translate(model, src, mask, max_len=12)


def _penalised_scores(model, src, mask, hyps, alpha):
    """log P(hyp + <eos> | src) / lp for each finished hypothesis, teacher-forced through the whole model (no
    cache), one batched forward pass per length."""
    scores = {}
    for n in sorted({len(h) for h in hyps}):
        group = [h for h in hyps if len(h) == n]
        out = torch.tensor([h + [Vocab.EOS] for h in group])  # (N, n + 1)
        tgt_in = torch.cat([torch.full((len(group), 1), Vocab.BOS), out[:, :-1]], dim=1)
        with torch.no_grad():
            logp = model(src.expand(len(group), -1), tgt_in, mask.expand(len(group), -1)).log_softmax(-1)
        total = logp.gather(-1, out[:, :, None])[:, :, 0].sum(-1)  # (N,)
        for h, value in zip(group, (total / gnmt_length_penalty(n + 1, alpha)).tolist()):
            scores[tuple(h)] = value
    return scores


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5])
def test_wide_beam_finds_the_brute_force_optimum(alpha):
    """V = 6, max_len 5 (<bos> + 4): every finished output is up to 3 of the 5 tokens other than <eos>, then
    <eos> (156 in all). A beam of 6^4 prunes nothing, so beam search must return the best of them."""
    model = _model(6, vocab_size=6, n_decoder_layers=1, tie_embeddings=False).eval()
    with torch.no_grad():
        model.generator.weight.mul_(3)  # sharper distributions: long outputs can win under the penalty
    src, mask = _batch(6, batch=3, vocab=6)
    out = beam_translate(model, src, mask, max_len=5, beam_size=6 ** 4, length_penalty=alpha)
    others = [t for t in range(6) if t != Vocab.EOS]
    candidates = [list(c) for n in range(4) for c in itertools.product(others, repeat=n)]
    for b in range(3):
        scores = _penalised_scores(model, src[b:b + 1], mask[b:b + 1], candidates, alpha)
        assert out[b] == list(max(scores, key=scores.get))
    if alpha == 1.5:  # the long optimum: the beams' caches had to follow their parents to find it
        assert max(len(o) for o in out) == 3


def test_batch_equals_one_by_one():
    model = _model(7, vocab_size=9)
    src, mask = _batch(7, batch=6, vocab=9)
    beams = beam_translate(model, src, mask, max_len=12, beam_size=3)
    greedy = greedy_translate_cached(model, src, mask, max_len=12)
    for b in range(6):
        n = int((~mask[b]).sum())
        alone = src[b:b + 1, :n]  # the sentence without its padding, and without a mask
        assert beam_translate(model, alone, None, max_len=12, beam_size=3) == [beams[b]]
        assert greedy_translate_cached(model, alone, None, max_len=12) == [greedy[b]]


def test_clear_errors():
    model = _model(8)
    src, mask = _batch(8)
    with pytest.raises(ValueError, match="beam_size"):
        beam_translate(model, src, mask, beam_size=0)
    with pytest.raises(ValueError, match="length_penalty"):
        beam_translate(model, src, mask, length_penalty=-0.5)
    for fn in (greedy_translate_cached, beam_translate):
        with pytest.raises(ValueError, match="max_len"):
            fn(model, src, mask, max_len=1)
        with pytest.raises(TypeError, match="encoder-decoder"):
            fn(DecoderLM(SMALL), src, mask)
    with pytest.raises(ValueError, match="steps"):
        decode_work(SMALL, 2, 5, 0)


def test_gnmt_length_penalty():
    assert gnmt_length_penalty(1, 0.6) == 1.0  # (5 + 1) / 6
    assert gnmt_length_penalty(7, 1.0) == pytest.approx(2.0)
    assert gnmt_length_penalty(30, 0.0) == 1.0


def test_decode_work_matches_flop_counter():
    """Both loops run by hand for a fixed number of steps (greedy stops at <eos>, which a random model
    cannot be made to avoid), on explicit attention, which FlopCounterMode sees."""
    config = dataclasses.replace(SMALL, vocab_size=11, d_model=24, n_heads=3, d_ff=40, n_encoder_layers=2,
                                 fused_attention=False)
    model = Transformer(config).eval()
    B, S, steps = 3, 5, 6
    src = torch.randint(4, 11, (B, S))
    tgt = torch.randint(4, 11, (B, steps))
    tgt[:, 0] = Vocab.BOS
    work = decode_work(config, B, S, steps)
    with torch.no_grad():
        with FlopCounterMode(display=False) as enc:
            memory = model.encode(src)
        with FlopCounterMode(display=False) as plain:
            for t in range(1, steps + 1):
                model.decode(tgt[:, :t], memory)
        with FlopCounterMode(display=False) as cached:
            cache = prefill_cache(model, memory, None, steps)
            for t in range(steps):
                cached_decode_step(model, tgt[:, t], cache)
    assert enc.get_total_flops() == work.encoder
    assert plain.get_total_flops() == work.without_cache
    assert cached.get_total_flops() == work.with_cache
    assert work.tokens == B * steps and work.ratio > 1
    assert work.per_token_without_cache > work.per_token_with_cache


def test_decode_timing_reports_both_and_agrees():
    model = _model(9, vocab_size=20)
    src, mask = _batch(9, batch=4, vocab=20)
    timing = decode_timing(model, src, mask, 8, repeats=1)
    assert timing.same_output and timing.batch == 4
    assert timing.with_cache_s > 0 and timing.without_cache_s > 0
    assert timing.speedup == pytest.approx(timing.without_cache_s / timing.with_cache_s)
    translations = greedy_translate(model, src, mask, 8)
    assert timing.tokens == sum(len(t) for t in translations)
    assert 1 <= timing.steps <= 7
    with pytest.raises(dataclasses.FrozenInstanceError):
        timing.steps = 3
