"""The translation task the case study trains: split, batchings, loss and the harness's task."""

import dataclasses

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
    budget = tt.token_budget(lengths, 16, pool_size=128)
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


def test_token_budget_batches_take_about_as_many_steps_as_random_ones():
    # lengths shaped like Tatoeba's (many short, a long tail): the sized budget gives about as many batches per
    # epoch, so as many real tokens per step, as random batches of the same number of pairs
    g = torch.Generator().manual_seed(0)
    lengths = (4 + torch.distributions.Gamma(2.0, 0.35).sample((6000,)).round().clamp(max=20)).int().tolist()
    for batch_size in (32, 64):
        batchings = tt.samplers(lengths, batch_size, seed=0, epoch=0)
        n_random, n_budget = len(list(batchings["random"])), len(list(batchings["token_budget"]))
        assert abs(n_budget / n_random - 1) < 0.1, (batch_size, n_random, n_budget)
    naive = round(64 * sum(lengths) / len(lengths))  # batch_size x mean length: the padding left is not counted
    assert tt.token_budget(lengths, 64) > naive
    with pytest.raises(ValueError, match="batch_size"):
        tt.token_budget(lengths, 0)


def test_step_memory_grows_with_the_batch_and_shrinks_with_autocast():
    config = translation_run(SizePreset("gpu", "test"), 8000, 4000, 24).config
    params, fp32 = tt.step_memory_gib(config, 64, 24, autocast=False)
    _, mixed = tt.step_memory_gib(config, 64, 24, autocast=True)
    _, bigger = tt.step_memory_gib(config, 128, 24, autocast=False)
    assert params > 1e6 and 16 * params / 2**30 < fp32 < bigger and mixed < fp32  # weights, grads, 2 moments + acts


def test_predicted_rows_follow_the_measured_ladder_through_the_courses_predictor():
    """Each row of the ladder predicted by gpuformer_lib.predict (issue "predictions"): same names; the
    baseline is the predictor's own step for that work; rows a roofline cannot see (fused attention,
    compilation, the fused optimizer) change the prediction; the whole ladder is far below the ratio of
    datasheet peaks (the first edition's 24.9x on an H100)."""
    from gpuformer_lib import predict

    accelerations = ([cs.option_step("token-budget batches", batching="token_budget")]
                     + cs.standard_accelerations(PROFILES["h100-80gb"]))
    rows = cs.cumulative_settings(cs.Setting(), accelerations, PROFILES["h100-80gb"], "cuda")
    config = translation_run(SizePreset("gpu", "test"), 8000, 4000, 24).config
    pred = tt.predicted_rows(rows, config, 64, 12.0, 0.45, 0.07, "H100 SXM")
    assert [p.row for p in pred] == [name for name, _, _ in rows]
    by = {p.row: p for p in pred}
    base_plan = rows[0][1].plan
    padded = round(12.0 / 0.55)
    work = predict.training_work(dataclasses.replace(config, fused_attention=base_plan.fused_attention,
                                                     max_len=max(config.max_len, padded + 1)),
                                 tokens=64 * padded, seq_len=padded, src_len=padded, fmt="fp32")
    assert by["baseline"].seconds == pytest.approx(predict.predict_step(work, "H100 SXM").seconds)
    assert by["+ token-budget batches"].seconds <= by["baseline"].seconds  # fewer padded slots (no gain if host-bound)
    assert by["+ bf16 autocast"].fmt == "bf16"
    for before, after in (("+ bf16 autocast", "+ fused attention, no id check"),
                          ("+ fused attention, no id check", "+ torch.compile"), ("+ torch.compile", "+ fused AdamW")):
        assert by[after].seconds < by[before].seconds, (before, after)  # each row is seen by the predictor
    ran = [p for p in pred if p.skipped is None]
    whole = ran[0].seconds / ran[-1].seconds
    datasheet = predict.datasheet_rate("H100 SXM", "bf16") / predict.datasheet_rate("H100 SXM", "fp32")
    assert 1 < whole < datasheet
    t4 = cs.cumulative_settings(cs.Setting(), accelerations[:1] + cs.standard_accelerations(PROFILES["t4"]),
                                PROFILES["t4"], "cuda")
    t4_pred = {p.row: p for p in tt.predicted_rows(t4, config, 64, 12.0, 0.45, 0.07, "T4")}
    assert t4_pred["+ TF32 matmuls"].skipped and t4_pred["+ fp16 autocast + loss scaling"].fmt == "fp16"
    with_memory = tt.predicted_rows(rows, config, 64, 12.0, 0.45, 0.07, "H100 SXM", seq_len=24)
    assert with_memory[0].memory_gib > with_memory[2].memory_gib > 0  # 16-bit activations: less memory
    with pytest.raises(ValueError, match="padding"):
        tt.predicted_rows(rows, config, 64, 12.0, 1.0, 0.07, "H100 SXM")


def test_batching_speedup_times_both_batchings_on_the_tables_step(prepared):
    run = translation_run(SizePreset("cpu", "test"), len(prepared.src_vocab), len(prepared.tgt_vocab), 16)
    task = tt.translation_task(prepared, run, budget=cs.Budget(tokens=1500), evaluations=1, val_pairs=16)
    timing = tt.batching_speedup(task, "cpu", steps=2)
    assert timing.steps == 2 and timing.random_rate > 0 and timing.budget_rate > 0
    assert timing.speedup == pytest.approx(timing.budget_rate / timing.random_rate)
    with pytest.raises(ValueError, match="steps must be"):
        tt.batching_speedup(task, "cpu", steps=0)


def test_case_run_trains_the_papers_base_sizes_on_the_gpu_preset_only():
    from gpuformer_lib.model import paper_base_config

    base = paper_base_config()
    gpu = tt.case_run(SizePreset("gpu", "test"), 4000, 2000)
    c = gpu.config
    assert (c.d_model, c.n_heads, c.d_ff, c.n_encoder_layers, c.n_decoder_layers) == (
        base.d_model, base.n_heads, base.d_ff, base.n_encoder_layers, base.n_decoder_layers)
    assert (c.src_vocab_size, c.vocab_size) == (4000, 2000) and c.norm_first and not c.tie_embeddings
    for name, toy in (("cpu", False), ("gpu-small", False), ("gpu", True)):  # a rehearsal's toy sizes: the CPU's
        preset = SizePreset(name, "test", toy=toy)
        assert tt.case_run(preset, 4000, 2000) == translation_run(preset, 4000, 2000)
