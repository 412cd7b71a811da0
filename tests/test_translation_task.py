"""The translation task the case study trains: split, batchings, loss and the harness's task."""

import pytest
import torch
import torch.nn.functional as F

from gpuformer_lib import case_study as cs, data, translation_task as tt
from gpuformer_lib.device import SizePreset
from gpuformer_lib.model import Transformer
from gpuformer_lib.model_sizes import translation_run
from gpuformer_lib.profiles import PROFILES

PAIRS = [(f"sentence {i % 90} here {'very ' * (i % 7)}long", f"句子{i % 90}" + "长" * (i % 11)) for i in range(400)]


@pytest.fixture(scope="module")
def prepared():
    return tt.prepare(PAIRS, max_len=16, min_freq=1)


def test_prepare_splits_by_source_and_keeps_text_in_test_order(prepared):
    assert data.shared_sources(prepared.train_pairs, prepared.test_pairs) == 0
    assert len(prepared.test_kept) == len(prepared.test_set)
    for (en, zh), (src, tgt) in zip(prepared.test_kept, prepared.test_set):
        assert torch.equal(src, torch.tensor(prepared.src_vocab.encode(data.english_words(en)) + [data.Vocab.EOS]))
    assert max(prepared.lengths) <= 16


def test_token_budget_batches_hold_about_as_many_tokens_with_less_padding(prepared):
    lengths = prepared.lengths
    batchings = tt.samplers(lengths, 16, seed=0, epoch=0, pool_size=128)
    random_batches, budget_batches = list(batchings["random"]), list(batchings["token_budget"])
    for batches in (random_batches, budget_batches):
        assert sorted(i for b in batches for i in b) == list(range(len(lengths)))  # each pair once per epoch
    assert data.padding_fraction(budget_batches, lengths) < data.padding_fraction(random_batches, lengths)
    budget = tt.token_budget(lengths, 16)
    assert all(len(b) * max(lengths[i] for i in b) <= budget for b in budget_batches)
    assert list(tt.samplers(lengths, 16, 0, 1)["random"]) != random_batches  # a new order every epoch


def test_losses_count_real_tokens_only(prepared):
    config = translation_run(SizePreset("cpu", "test"), len(prepared.src_vocab), len(prepared.tgt_vocab), 16).config
    torch.manual_seed(0)
    model = Transformer(config).eval()
    batch = data.collate_translation(prepared.val_set[:8])
    loss, tokens = tt.translation_loss(model, batch, label_smoothing=0.0)
    assert int(tokens) == int((batch.tgt_out != data.Vocab.PAD).sum())
    assert tt.validation_loss(model, [batch], "cpu") == pytest.approx(loss.item(), rel=1e-5)
    logits = model(batch.src, batch.tgt_in, batch.src_padding_mask, batch.tgt_padding_mask)
    first = F.cross_entropy(logits[0][~batch.tgt_padding_mask[0]], batch.tgt_out[0][~batch.tgt_padding_mask[0]])
    alone = tt.validation_loss(model, [data.collate_translation(prepared.val_set[:1])], "cpu")
    assert alone == pytest.approx(first.item(), rel=1e-5)  # padding of the others changes nothing


def test_task_trains_both_batchings_to_the_budget(prepared):
    run = translation_run(SizePreset("cpu", "test"), len(prepared.src_vocab), len(prepared.tgt_vocab), 16)
    task = tt.translation_task(prepared, run, budget=cs.Budget(tokens=1500), evaluations=1, val_pairs=16)
    for batching in ("random", "token_budget"):
        r, _ = cs.train_run(task, cs.Setting().with_options(batching=batching), "cpu", PROFILES["cpu"])
        assert r.tokens >= 1500 and r.flops > 0
    with pytest.raises(ValueError, match="batching must be one of"):
        next(iter(task.batches(cs.Setting().with_options(batching="sorted"), 0, 0)))
