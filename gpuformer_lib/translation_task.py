"""English-to-Chinese translation on Tatoeba as one task: the data, split and encoded once, the loss, the
validation loss, and the :class:`~gpuformer_lib.case_study.Task` the case-study harness trains.

Used by chapter 13 (the translation case study) and its data-parallel worker, so that every process and
every row of the acceleration table sees the same split, vocabularies and batches. Chapter 7 builds the
same pieces step by step; this module is them put together.

- :func:`prepare`: the pairs split **by unique English sentence** (``data.split_by_source``: no test
  sentence's English occurs in training), word-level English and character-level Chinese vocabularies from
  the training part, pairs of at most ``max_len`` tokens encoded.
- :func:`translation_loss`: label-smoothed cross-entropy over the real target tokens, and their count.
- :func:`validation_loss`: plain cross-entropy per real target token (nats), the quality the table keeps.
- :func:`translation_task`: the harness's task; its batching option ``"random"`` (a fixed number of
  pairs per step, drawn at random: the baseline) or ``"token_budget"`` (pairs of similar length, as many
  as fit in a budget of padded tokens chosen to hold as many real tokens per step as the baseline's).

Leaves out: the model (``model``), decoding and scoring (``generate``, ``seq2seq_decoding``, ``retrieval``).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpuformer_lib import case_study, data, packing, speed
from gpuformer_lib.model import Transformer, transformer_flops
from gpuformer_lib.model_sizes import RunSize


@dataclasses.dataclass(frozen=True)
class TranslationData:
    """The split, the vocabularies and the encoded pairs."""

    train_pairs: list[tuple[str, str]]
    val_pairs: list[tuple[str, str]]
    test_pairs: list[tuple[str, str]]
    src_vocab: data.Vocab
    tgt_vocab: data.Vocab
    max_len: int
    train_set: list[tuple[Tensor, Tensor]]
    val_set: list[tuple[Tensor, Tensor]]
    test_set: list[tuple[Tensor, Tensor]]
    test_kept: list[tuple[str, str]]
    """The test pairs within ``max_len``, as text, in ``test_set``'s order (references without <unk>)."""

    @property
    def lengths(self) -> list[int]:
        """Per training pair, the longer side in tokens (what a batch is padded to)."""
        return [max(len(s), len(t)) for s, t in self.train_set]


def _fits(pair: tuple[str, str], max_len: int) -> bool:
    en, zh = pair
    return max(len(data.english_words(en)) + 1, len(data.characters(zh)) + 2) <= max_len


def prepare(pairs: Sequence[tuple[str, str]] | None = None, *, max_len: int = 24, seed: int = 0,
            min_freq: int = 2) -> TranslationData:
    """Split ``pairs`` (default: the Tatoeba file, ``data.load_translation_pairs()``) by unique English
    sentence 90/5/5 with ``seed``, build the vocabularies from training and encode every part."""
    pairs = data.load_translation_pairs() if pairs is None else list(pairs)
    train_pairs, val_pairs, test_pairs = data.split_by_source(pairs, seed=seed)
    src_vocab = data.Vocab.build([p[0] for p in train_pairs], data.english_words, min_freq=min_freq)
    tgt_vocab = data.Vocab.build([p[1] for p in train_pairs], data.characters, min_freq=min_freq)

    def encode(part):
        return data.encode_pairs(part, src_vocab, tgt_vocab, data.english_words, data.characters, max_len=max_len,
                                 too_long="skip")

    test_set = encode(test_pairs)
    kept = [p for p in test_pairs if _fits(p, max_len)]
    if len(kept) != len(test_set):  # the filter above must be encode_pairs' own
        raise AssertionError(f"{len(kept)} test pairs fit by length, but {len(test_set)} were encoded")
    return TranslationData(train_pairs, val_pairs, test_pairs, src_vocab, tgt_vocab, max_len, encode(train_pairs),
                           encode(val_pairs), test_set, kept)


def translation_loss(model: nn.Module, batch: data.TranslationBatch, label_smoothing: float = 0.1
                     ) -> tuple[Tensor, Tensor]:
    """Mean label-smoothed cross-entropy over the batch's real target tokens, and their count (on the device)."""
    logits = model(batch.src, batch.tgt_in, batch.src_padding_mask, batch.tgt_padding_mask)  # (B, T, V)
    loss = F.cross_entropy(logits.float().flatten(0, 1), batch.tgt_out.flatten(), ignore_index=data.Vocab.PAD,
                           label_smoothing=label_smoothing)
    return loss, (~batch.tgt_padding_mask).sum()


@torch.no_grad()
def validation_loss(model: nn.Module, batches: Sequence[data.TranslationBatch], device: torch.device | str) -> float:
    """Cross-entropy per real target token (nats, no label smoothing) over ``batches``, in float32."""
    total = torch.zeros((), dtype=torch.float64, device=device)
    tokens = 0
    for b in batches:
        b = b.to(device)
        logits = model(b.src, b.tgt_in, b.src_padding_mask, b.tgt_padding_mask).float()  # (B, T, V)
        real = ~b.tgt_padding_mask
        total += F.cross_entropy(logits[real], b.tgt_out[real], reduction="sum").double()
        tokens += int(real.sum())
    return float(total) / tokens


def batches_of(items: Sequence[tuple[Tensor, Tensor]], size: int = 256) -> list[data.TranslationBatch]:
    """``items`` collated in order, ``size`` pairs at a time (evaluation batches)."""
    return [data.collate_translation(items[i:i + size]) for i in range(0, len(items), size)]


def token_budget(lengths: Sequence[int], batch_size: int) -> int:
    """Padded tokens per token-budget batch that hold about as many real tokens as ``batch_size`` random
    pairs do: ``batch_size`` times the mean length (bucketing leaves little padding)."""
    return max(round(batch_size * statistics.fmean(lengths)), max(lengths))


def samplers(lengths: Sequence[int], batch_size: int, seed: int, epoch: int, pool_size: int = 512
             ) -> dict[str, torch.utils.data.Sampler]:
    """The two batchings for one epoch, by name: ``random`` and ``token_budget`` (pairs sorted by length within
    pools of ``pool_size`` shuffled pairs: a smaller pool leaves more padding, a larger one makes the batches
    less random)."""
    random_batches = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(
        range(len(lengths)), generator=torch.Generator().manual_seed(1000 * seed + epoch)), batch_size, drop_last=False)
    budget = packing.TokenBudgetBatchSampler(lengths, max_tokens=token_budget(lengths, batch_size), seed=seed,
                                            pool_size=pool_size)
    budget.set_epoch(epoch)
    return {"random": random_batches, "token_budget": budget}


def translation_task(prepared: TranslationData, run: RunSize, *, budget: case_study.Budget, tolerance: float = 0.05,
                     evaluations: int = 4, val_pairs: int | None = None, name: str = "English→Chinese translation"
                     ) -> case_study.Task:
    """The harness's task: ``run``'s model (built with each row's speed plan), AdamW at ``run.lr``, the
    validation loss on the first ``val_pairs`` validation pairs (all by default) as the quality, kept
    within ``tolerance`` nats. Batching option ``batching``: ``"random"`` (default) or ``"token_budget"``."""
    lengths = prepared.lengths
    val = batches_of(prepared.val_set[:val_pairs] if val_pairs else prepared.val_set)
    config = run.config

    def build(setting: case_study.Setting) -> nn.Module:
        return Transformer(speed.model_config(config, setting.plan))

    def batches(setting: case_study.Setting, seed: int, epoch: int):
        kind = setting.option("batching", "random")
        options = samplers(lengths, run.batch_size, seed, epoch, setting.option("pool_size", 512))
        if kind not in options:
            raise ValueError(f"batching must be one of {sorted(options)}, not {kind!r}")
        for indices in options[kind]:
            yield data.collate_translation([prepared.train_set[i] for i in indices])

    def count(batch: data.TranslationBatch) -> int:
        return int((~batch.tgt_padding_mask).sum())

    def flops(batch: data.TranslationBatch) -> float:
        """FLOPs of the real tokens: the padded shape's FLOPs times the share of target slots that are real
        (the padding's arithmetic is not useful work)."""
        B, T = batch.tgt_in.shape
        real = count(batch) / (B * T)
        return transformer_flops(config, B, T, src_len=batch.src.shape[1]) * real

    return case_study.Task(
        name=name, build_model=build, batches=batches, loss_fn=translation_loss, count=count,
        evaluate=lambda model, device: validation_loss(model, val, device), quality_name="validation loss (nats)",
        higher_is_better=False, tolerance=tolerance, budget=budget, lr=run.lr, weight_decay=0.01, warmup=0.1,
        grad_clip=1.0, evaluations=evaluations, flops=flops, unit="target tokens")
