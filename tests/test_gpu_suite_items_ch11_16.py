"""The synthetic inputs of the GPU suite's case-study items (chapters 13-15): the chapters' shapes, vocabularies and
length statistics, without their data files."""

import numpy as np
import torch

from gpuformer_lib import case_study, data, proteins
from gpuformer_lib.gpu_suite import items_ch11_16 as items


def test_synthetic_translation_pairs_fit_the_chapter_shapes():
    prepared = items._synthetic_translation(500)
    assert len(prepared.train_set) == 500 and len(prepared.val_set) == 8
    assert len(prepared.src_vocab) == items.SRC_VOCAB and len(prepared.tgt_vocab) == items.TGT_VOCAB
    for src, tgt in prepared.train_set:
        assert len(src) <= items.TRANSLATION_MAX_LEN and len(tgt) <= items.TRANSLATION_MAX_LEN
        assert src[-1] == data.Vocab.EOS and tgt[0] == data.Vocab.BOS and tgt[-1] == data.Vocab.EOS
        assert int(src[:-1].min()) >= 4 and int(src.max()) < items.SRC_VOCAB
        assert int(tgt[1:-1].min()) >= 4 and int(tgt.max()) < items.TGT_VOCAB
    predicted = np.mean([len(t) - 1 for _, t in prepared.train_set])  # chars + <eos>, as the chapter counts
    assert abs(predicted - (items.TARGET_CHARS_MEAN + 1)) < 0.5
    batch = data.collate_translation(prepared.train_set[:16])
    assert batch.tgt_in.shape == batch.tgt_out.shape


def test_synthetic_proteins_have_the_data_sets_median_and_range():
    split = items._synthetic_proteins(4000)
    assert len(split.train) == 4000 and len(split.val) == 4
    lengths = np.array([len(s) for s in split.train])
    assert lengths.min() >= items.PROTEIN_MIN and lengths.max() <= items.PROTEIN_MAX
    assert abs(np.median(lengths) - items.PROTEIN_MEDIAN) < 0.1 * items.PROTEIN_MEDIAN
    assert abs(lengths.mean() - items.PROTEIN_MEAN) < 0.1 * items.PROTEIN_MEAN
    residues = np.concatenate(split.train)
    assert residues.min() >= 2 and residues.max() < 2 + len(proteins.AMINO_ACIDS)


def test_synthetic_series_prepare_like_the_data():
    from gpuformer_lib import forecasting

    raw = items._synthetic_elec()
    assert set(raw) == {"demand", "temperature"} and len(raw["demand"]) == items.ELEC_HALF_HOURS
    elec = forecasting.prepare_elec(raw)
    assert elec.series.shape == (2, items.ELEC_HALF_HOURS) and np.isfinite(elec.series).all()
    assert len(elec.times["train"]) > 10_000  # the chapter's data has 11,881 training windows


def test_settings_are_described_in_words():
    assert items._describe_setting(case_study.Setting()) == "float32, explicit attention"
    fast = case_study.Setting().with_plan(dtype=torch.bfloat16, fused_attention=True, check_token_ids=False,
                                          fused_optimizer=True).with_options(batching="packed")
    assert items._describe_setting(fast) == ("bfloat16 autocast, fused attention, no id check, fused AdamW, "
                                             "batching=packed")
