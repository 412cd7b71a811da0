"""The training runs' sizes, built for every size preset (finding B2), and each GPU preset's runs held to
its time budget by the FLOPs formula at the assumed MFU, in the format the profile trains in (B6, B7)."""

import pytest
import torch

from gpuformer_lib import bench, model_sizes
from gpuformer_lib.device import PRESET_NAMES, SizePreset
from gpuformer_lib.model import DecoderLM, Transformer, count_parameters, transformer_flops
from gpuformer_lib.profiles import PROFILES, low_precision_dtype, preset_name, training_precision

# Tatoeba's vocabularies (English words, Chinese characters) and Shakespeare's characters, as chapter 7 finds them
SRC_VOCAB, TGT_VOCAB, CHAR_VOCAB = 4321, 2365, 69
# the notebook's budget: 15 minutes on a T4, 5 on an H100; one training run may take a third of it
NOTEBOOK_BUDGET_S = {"t4": 15 * 60, "h100-80gb": 5 * 60}


def runs(preset: SizePreset):
    return {"translation": model_sizes.translation_run(preset, SRC_VOCAB, TGT_VOCAB),
            "char_lm": model_sizes.char_lm_run(preset, CHAR_VOCAB)}


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_every_run_and_its_toy_variant_builds_for_every_preset(name):
    preset = SizePreset(name, "test")
    built = runs(preset)
    with torch.device("meta"):  # builds the modules (every check of the config) without allocating
        assert count_parameters(Transformer(built["translation"].config)) > 0
        assert count_parameters(DecoderLM(built["char_lm"].config)) > 0
        for run in built.values():  # chapter 7's resume check trains the toy variant (6 heads at gpu sizes)
            toy = model_sizes.toy_variant(run.config)
            assert (toy.d_model, toy.n_heads, toy.vocab_size, toy.max_len) == (64, 4, run.config.vocab_size,
                                                                               run.config.max_len)
            DecoderLM(toy)
    assert built["char_lm"].seq_len == built["char_lm"].config.max_len


def test_a_rehearsed_preset_builds_the_cpu_sizes_for_fewer_steps():
    toy, cpu = runs(SizePreset("gpu", "rehearsing", toy=True)), runs(SizePreset("cpu", "test"))
    for name in ("char_lm", "translation"):
        assert toy[name].config == cpu[name].config and toy[name].batch_size == cpu[name].batch_size
        assert toy[name].steps == model_sizes.REHEARSAL_STEPS < cpu[name].steps


def test_run_size_is_validated():
    config = model_sizes.char_lm_run(SizePreset("cpu", "test"), CHAR_VOCAB).config
    with pytest.raises(ValueError, match="max_len"):
        model_sizes.RunSize(config, batch_size=2, seq_len=config.max_len + 1, steps=1, lr=1e-3)
    with pytest.raises(ValueError, match="steps"):
        model_sizes.RunSize(config, batch_size=2, seq_len=8, steps=0, lr=1e-3)


@pytest.mark.parametrize("profile_name", list(NOTEBOOK_BUDGET_S))
def test_each_gpu_run_fits_its_time_budget_by_the_flops_formula(profile_name):
    profile = PROFILES[profile_name]
    preset = SizePreset(preset_name(profile), "test")
    dtype = low_precision_dtype(profile)
    assert training_precision(profile) == {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    # the datasheet peak of the format it trains in; a T4 in emulated bf16 would have none (it raises)
    rate = bench.peak_flops(dtype, gpu_name=profile.gpu_name) * model_sizes.ASSUMED_MFU
    for name, run in runs(preset).items():
        src_len = run.seq_len if name == "translation" else 0
        seconds = run.steps * transformer_flops(run.config, run.batch_size, run.seq_len, src_len=src_len) / rate
        assert seconds <= NOTEBOOK_BUDGET_S[profile_name] / 3, f"{name} on {profile_name}: {seconds:.0f} s"


@pytest.mark.parametrize("profile_name", ["t4", "a100-40gb", "h100-80gb"])
def test_each_gpu_run_fits_its_profile_with_a_fifth_to_spare(profile_name):
    """By the memory calculator, counting the loss's vocabulary-sized temporaries and autocast's 16-bit weight
    copies; an encoder-decoder is counted as a stack of its encoder and decoder layers at the longer length (a
    decoder layer keeps more than an encoder layer: cross-attention; the margin covers it)."""
    from gpuformer_lib.memory import training_memory

    profile = PROFILES[profile_name]
    preset = SizePreset(preset_name(profile), "test")
    low = low_precision_dtype(profile)
    for name, run in runs(preset).items():
        c = run.config
        with torch.device("meta"):
            model = Transformer(c) if name == "translation" else DecoderLM(c)
        estimate = training_memory(
            count_parameters(model), n_layers=c.n_encoder_layers + c.n_decoder_layers, d_model=c.d_model,
            n_heads=c.n_heads, d_ff=c.d_ff, seq_len=run.seq_len, batch_size=run.batch_size,
            vocab_size=c.vocab_size, activation_bytes=2 if low else 4, autocast=low is not None,
            fused_attention=c.fused_attention, dropout=c.dropout > 0, count_loss_temporaries=True)
        if name == "translation":  # cross-attention keeps K and V of the source once more per decoder layer
            estimate_bytes = estimate.total + c.n_decoder_layers * 4 * run.seq_len * run.batch_size * c.d_model
        else:
            estimate_bytes = estimate.total
        assert estimate.loss_temporaries > 0
        assert estimate_bytes <= 0.8 * profile.memory_gib * 2**30, \
            f"{name} at the '{preset.name}' preset needs {estimate_bytes / 2**30:.1f} GiB of {profile.memory_gib} GiB"
