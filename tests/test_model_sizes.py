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


def test_a_rehearsed_preset_builds_the_cpu_sizes():
    toy = SizePreset("gpu", "rehearsing", toy=True)
    assert runs(toy)["char_lm"] == runs(SizePreset("cpu", "test"))["char_lm"]


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
