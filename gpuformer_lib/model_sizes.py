"""The sizes of the training runs the course makes, per size preset: model configuration, batch, steps.

Covers: the English-to-Chinese translation Transformer (:func:`translation_run`), the character-level
Shakespeare language model (:func:`char_lm_run`), and a toy-width variant of any configuration for
quick demonstrations such as a resume check (:func:`toy_variant`). Each takes a
:class:`~gpuformer_lib.device.SizePreset`, so a test can build every run for every preset (``cpu``,
``gpu-small``, ``gpu``): an invalid combination (a width that the heads do not divide) fails there, not
on a GPU.

Time budgets (a notebook within 15 minutes on a T4, 5 on an H100) are checked by the FLOPs formula
(:func:`~gpuformer_lib.model.transformer_flops`) at an assumed model FLOPs utilisation,
:data:`ASSUMED_MFU` of the datasheet peak in the format the run trains in: small models on one GPU
rarely do better, because their matrix products are small and the element-wise work between them is
memory-bound. ``tests/test_model_sizes.py`` holds each run to its budget that way.

Leaves out: the model code (``model``), the training loop (``train``), the data (``data``).
"""

from __future__ import annotations

import dataclasses
import numbers

from gpuformer_lib.device import SizePreset
from gpuformer_lib.model import TransformerConfig


ASSUMED_MFU = 0.15
"""Share of the datasheet peak a small Transformer's training step reaches on one GPU (an assumption,
for budgets; chapter 10 measures the real figure)."""


@dataclasses.dataclass(frozen=True)
class RunSize:
    """A model configuration and the length of its training run."""

    config: TransformerConfig
    batch_size: int
    """Sequences (or sentence pairs) per optimizer step."""
    seq_len: int
    """Tokens per sequence: the block of a language model, the longest sentence of a translation pair."""
    steps: int
    """Optimizer steps."""
    lr: float
    """Peak learning rate."""

    def __post_init__(self):
        if not isinstance(self.config, TransformerConfig):
            raise TypeError(f"config must be a TransformerConfig, got {type(self.config).__name__}")
        for name in ("batch_size", "seq_len", "steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.seq_len > self.config.max_len:
            raise ValueError(f"seq_len={self.seq_len} is longer than the model's max_len={self.config.max_len}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")


REHEARSAL_STEPS = 60
"""Steps a run takes under a rehearsal (a GPU profile rehearsed on the CPU in CI at toy sizes): enough to
run every code path (warm-up, evaluation, the end of the schedule), not to learn. The page a rehearsal
validates is never stored, so no number from it is shown."""


def _steps(preset: SizePreset, **by_preset: int) -> int:
    steps = preset.pick(**by_preset)
    return min(steps, REHEARSAL_STEPS) if preset.toy else steps


def _check_preset(preset) -> None:
    if not isinstance(preset, SizePreset):
        raise TypeError(f"preset must be a SizePreset, got {preset!r}: take profiles.size_preset(profile), or "
                        "SizePreset('cpu', 'why')")


def translation_run(preset: SizePreset, src_vocab_size: int, tgt_vocab_size: int, max_len: int = 24) -> RunSize:
    """The encoder-decoder translation model, trained on sentence pairs of at most ``max_len`` tokens.
    With the Tatoeba vocabularies (4,321 English words, 2,365 Chinese characters) one step of 128 pairs
    at ``gpu`` sizes is 0.43 TFLOP (``transformer_flops``, sequences padded to ``max_len``): 4000 steps
    are 1.7 PFLOP, about 12 s on an H100 in bf16 at 15 % of its peak; ``gpu-small``'s 3000 steps
    (0.34 PFLOP) about 35 s on a T4 in fp16."""
    _check_preset(preset)
    config = TransformerConfig(
        vocab_size=tgt_vocab_size, src_vocab_size=src_vocab_size,
        d_model=preset.pick(cpu=128, gpu=512, gpu_small=256), n_heads=preset.pick(cpu=4, gpu=8),
        n_encoder_layers=preset.pick(cpu=2, gpu=3), n_decoder_layers=preset.pick(cpu=2, gpu=3),
        d_ff=preset.pick(cpu=256, gpu=2048, gpu_small=1024), dropout=0.1, max_len=max_len,
        # An untied output projection: the tied one (chapter 5) scales its vectors by d_model^-1/2, so its
        # logits grow only as fast as the shared embeddings do, too slowly for the CPU run's 400 steps
        # (validation loss 4.6 tied against 2.9 untied when this was set; BLEU 0.5 against 11).
        tie_embeddings=False)
    return RunSize(config=config, batch_size=preset.pick(cpu=64, gpu=128), seq_len=max_len,
                   steps=_steps(preset, cpu=400, gpu=4000, gpu_small=3000), lr=preset.pick(cpu=2e-3, gpu=1e-3))


def char_lm_run(preset: SizePreset, vocab_size: int) -> RunSize:
    """The character-level decoder-only language model (Karpathy's Shakespeare model, 6 layers of width
    384, at ``gpu`` sizes). One training step of 64 blocks of 256 characters is 1.16 TFLOP
    (``transformer_flops``): 3000 steps are 3.5 PFLOP, about 24 s on an H100 in bf16 at 15 % of its
    989 TFLOP/s. A T4 (``gpu-small``) trains in fp16, 65 TFLOP/s peak: at 15 % that is 9.8 TFLOP/s, so
    1500 steps (1.7 PFLOP) take about 3 minutes, within its notebook's 15."""
    _check_preset(preset)
    config = TransformerConfig(
        vocab_size=vocab_size, d_model=preset.pick(cpu=128, gpu=384), n_heads=preset.pick(cpu=4, gpu=6),
        n_decoder_layers=preset.pick(cpu=2, gpu=6), d_ff=preset.pick(cpu=512, gpu=1536),
        dropout=preset.pick(cpu=0.0, gpu=0.2), max_len=preset.pick(cpu=64, gpu=256), positional="learned",
        activation="gelu")
    return RunSize(config=config, batch_size=preset.pick(cpu=32, gpu=64), seq_len=config.max_len,
                   steps=_steps(preset, cpu=300, gpu=3000, gpu_small=1500), lr=preset.pick(cpu=3e-3, gpu=1e-3))


def toy_variant(config: TransformerConfig) -> TransformerConfig:
    """``config`` at toy width (64 wide, 4 heads, one decoder layer), same vocabulary and context: a
    model that trains a few steps in a second on any device. The heads are set too, because a preset's
    own head count need not divide 64 (6 heads at ``gpu`` sizes)."""
    return dataclasses.replace(config, d_model=64, n_heads=4, n_decoder_layers=1, d_ff=128, dropout=0.1)
