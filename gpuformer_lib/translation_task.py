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
  as fit in a budget of padded tokens sized so that an epoch takes as many steps as the baseline's:
  :func:`token_budget`).

- chapter 13's sizes and predictions: :func:`case_plan` (budget, seeds, tolerance per device),
  :func:`step_memory_gib` (the memory calculator for an encoder-decoder), :func:`predicted_rows` (the measured
  ladder's rows through the course's predictor, same names and order), :func:`bottleneck` and :func:`fix_for` (the
  profile's top category and the table row that addresses it).

Leaves out: the model (``model``), decoding and scoring (``generate``, ``seq2seq_decoding``, ``retrieval``).
"""

from __future__ import annotations

import dataclasses
import functools
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


POOL_SIZE = 512
"""Pairs shuffled together and sorted by length before token-budget batches are cut (the task's default)."""


def _budget_batches(lengths: Sequence[int], max_tokens: int, seed: int, pool_size: int) -> int:
    sampler = packing.TokenBudgetBatchSampler(lengths, max_tokens=max_tokens, seed=seed, pool_size=pool_size)
    sampler.set_epoch(0)
    return sum(1 for _ in sampler)


@functools.lru_cache(maxsize=8)
def _calibrated_budget(lengths: tuple[int, ...], batch_size: int, pool_size: int, seed: int) -> int:
    random_batches = -(-len(lengths) // batch_size)
    budget = max(round(batch_size * statistics.fmean(lengths)), max(lengths))  # no padding at all: a first guess
    best = (abs(_budget_batches(lengths, budget, seed, pool_size) - random_batches), budget)
    for _ in range(6):  # the batch count falls in steps as the budget grows: a few corrections find the closest
        n = _budget_batches(lengths, budget, seed, pool_size)
        best = min(best, (abs(n - random_batches), budget))
        if n == random_batches:
            break
        budget = max(max(lengths), round(budget * n / random_batches))
    return best[1]


def token_budget(lengths: Sequence[int], batch_size: int, *, pool_size: int = POOL_SIZE, seed: int = 0) -> int:
    """Padded tokens per token-budget batch such that token-budget batches hold about as many **real** tokens
    as random batches of ``batch_size`` pairs: as many batches per epoch as the random batching has
    (``ceil(len(lengths) / batch_size)``), so both take about the same number of optimizer steps for the same
    data and the comparison of their qualities is not confounded by a different number of updates.

    Calibrated on epoch 0 of the sampler (``pool_size``, ``seed``): the first guess, ``batch_size`` times the
    mean length, leaves out the padding that remains inside sorted pools, so it gives ~10 % more, smaller,
    batches; the budget is scaled by (batches / random batches) until the counts match (cached per data set)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if not lengths or min(lengths) < 1:
        raise ValueError("lengths must be a non-empty sequence of lengths >= 1")
    return _calibrated_budget(tuple(int(n) for n in lengths), batch_size, pool_size, seed)


def samplers(lengths: Sequence[int], batch_size: int, seed: int, epoch: int, pool_size: int = POOL_SIZE
             ) -> dict[str, torch.utils.data.Sampler]:
    """The two batchings for one epoch, by name: ``random`` and ``token_budget`` (pairs sorted by length within
    pools of ``pool_size`` shuffled pairs: a smaller pool leaves more padding, a larger one makes the batches
    less random), sized by :func:`token_budget` to take about as many steps per epoch."""
    random_batches = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(
        range(len(lengths)), generator=torch.Generator().manual_seed(1000 * seed + epoch)), batch_size, drop_last=False)
    budget = packing.TokenBudgetBatchSampler(lengths, max_tokens=token_budget(lengths, batch_size, pool_size=pool_size),
                                            seed=seed, pool_size=pool_size)
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
        options = samplers(lengths, run.batch_size, seed, epoch, setting.option("pool_size", POOL_SIZE))
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


# --------------------------------------------------------------------------- chapter 13's sizes and predictions


@dataclasses.dataclass(frozen=True)
class CasePlan:
    """How much chapter 13 trains and evaluates on a device: the token budget of every row, the seeds per
    row, the quality tolerance (nats of validation loss), the evaluations per run, the validation pairs
    the quality is measured on (None: all) and the test sentences decoded for BLEU and chrF."""

    budget_tokens: int
    seeds: tuple[int, ...]
    tolerance: float
    evaluations: int
    val_pairs: int | None
    test_sentences: int


def case_plan(profile, preset) -> CasePlan:
    """Chapter 13's plan for ``profile`` (``profiles.DeviceProfile``) and ``preset`` (``device.SizePreset``).

    - rehearsal (a GPU profile at toy sizes on the CPU): only the code paths matter; 3,000 target tokens,
      one seed, 2 evaluations, so the whole notebook stays within CI's time (a rehearsed T4's fp16 autocast
      runs on the CPU, several times slower than float32 there);
    - ``cpu``: 32,000 target tokens a row (about 8 s for the fp32 baseline at ~4,000 tokens/s on a 2-core
      CPU, so that the whole chapter runs in about a minute), one seed; tolerance 0.1 nats, above the
      0.056-nat spread of three baseline seeds measured at 60,000 tokens when this was set (the chapter
      measures its own spread again, at its budget);
    - ``gpu`` (A100/H100): 2,000,000 target tokens, seeds 0-2, tolerance 0.05 nats;
    - ``gpu-small`` (T4): 1,000,000 target tokens, seeds 0-1, tolerance 0.05 nats.
    """
    from gpuformer_lib.device import PRESET_NAMES

    if getattr(preset, "name", None) not in PRESET_NAMES:
        raise ValueError(f"preset must be a device.SizePreset named one of {PRESET_NAMES}, got {preset!r}")
    if getattr(profile, "rehearsal", False) or getattr(preset, "toy", False):
        return CasePlan(budget_tokens=3_000, seeds=(0,), tolerance=0.1, evaluations=2, val_pairs=200,
                        test_sentences=60)
    if preset.name == "cpu":
        return CasePlan(budget_tokens=32_000, seeds=(0,), tolerance=0.1, evaluations=4, val_pairs=300,
                        test_sentences=200)
    if preset.name == "gpu-small":
        return CasePlan(budget_tokens=1_000_000, seeds=(0, 1), tolerance=0.05, evaluations=8, val_pairs=None,
                        test_sentences=1_000)
    return CasePlan(budget_tokens=2_000_000, seeds=(0, 1, 2), tolerance=0.05, evaluations=8, val_pairs=None,
                    test_sentences=2_000)


def case_run(preset, src_vocab_size: int, tgt_vocab_size: int, max_len: int = 24) -> RunSize:
    """The model and batch chapter 13 trains on ``preset``: on the ``gpu`` preset (A100, H100) the sizes of
    Vaswani et al.'s base model (6 + 6 layers, width 512, 8 heads, feed-forward 2,048, dropout 0.1, from
    ``model.paper_base_config``) with this task's two vocabularies, pre-LN (the course's default: it trains
    without the paper's long warm-up) and an untied output layer as ``model_sizes.translation_run`` has it;
    elsewhere (``cpu``, ``gpu-small``, a rehearsal's toy sizes) ``model_sizes.translation_run``'s model."""
    from gpuformer_lib.model import paper_base_config
    from gpuformer_lib.model_sizes import translation_run

    run = translation_run(preset, src_vocab_size, tgt_vocab_size, max_len)
    if not preset.pick(cpu=False, gpu=True, gpu_small=False):
        return run
    base = paper_base_config()
    config = dataclasses.replace(run.config, d_model=base.d_model, n_heads=base.n_heads, d_ff=base.d_ff,
                                 n_encoder_layers=base.n_encoder_layers, n_decoder_layers=base.n_decoder_layers,
                                 dropout=base.dropout)
    return dataclasses.replace(run, config=config)


def step_memory_gib(config, batch_size: int, seq_len: int, *, autocast: bool, fused_attention: bool = True
                    ) -> tuple[int, float]:
    """Parameters and predicted GiB of one training step of the encoder-decoder ``config`` (chapter 9's
    calculator, ``memory.training_memory``: weights, gradients, AdamW's moments and kept activations) on
    batches of ``batch_size`` pairs of ``seq_len`` tokens, in float32 or with 16-bit autocast.

    The calculator models a decoder-only stack: the encoder-decoder is counted as its encoder and decoder
    layers stacked, which leaves out the decoder's cross-attention activations (a little low). Build
    ``config``'s model on the meta device (no memory) when it is large."""
    from gpuformer_lib import memory
    from gpuformer_lib.model import count_parameters

    with torch.device("meta"):
        params = count_parameters(Transformer(config))
    m = memory.training_memory(params, n_layers=config.n_encoder_layers + config.n_decoder_layers,
                               d_model=config.d_model, n_heads=config.n_heads, d_ff=config.d_ff, seq_len=seq_len,
                               batch_size=batch_size, vocab_size=config.vocab_size, autocast=autocast,
                               activation_bytes=2 if autocast else 4, fused_attention=fused_attention)
    return params, m.total / 2**30


@dataclasses.dataclass(frozen=True)
class RowPrediction:
    """One row of the measured ladder predicted for a GPU by the course's predictor (``gpuformer_lib.predict``):
    the step's time with its matrix products, memory traffic and launches, and the calculator's memory."""

    row: str
    """The measured table's row name (``case_study.cumulative_settings``)."""
    seconds: float | None
    """Predicted seconds per step (None: the row is skipped on this GPU)."""
    fmt: str
    """The matrix products' format ("fp32", "tf32", "bf16", "fp16")."""
    memory_gib: float | None
    skipped: str | None = None
    """Why the GPU's profile skips the row (None: it runs)."""
    bound: str = ""
    """What sets the predicted step: 'compute', 'memory', 'host' (launches) or 'communication'."""
    kernels: int = 0
    """Kernels the step issues (eager: counted; compiled: after fusion)."""
    flops: float | None = None
    """The step's matrix-product FLOPs, padded slots included."""


def _row_format(plan, gpu: str) -> str:
    from gpuformer_lib import gpu_view, predict

    if plan.dtype is not None:
        return predict.format_of(plan.dtype)
    return "tf32" if plan.tf32 and gpu_view.datasheet(gpu).tf32 is not None else "fp32"


def predicted_rows(rows: Sequence[tuple[str, case_study.Setting, str | None]], config, batch_size: int,
                   mean_len: float, padding_random: float, padding_budget: float, gpu: str, *,
                   seq_len: int | None = None) -> list[RowPrediction]:
    """The measured ladder's rows (``case_study.cumulative_settings(...)`` for a GPU's profile: same names,
    same order) predicted for ``gpu`` (a datasheet name) by ``gpuformer_lib.predict``: each row's step is the
    encoder-decoder ``config`` on ``batch_size`` sentence pairs whose padded length is ``mean_len`` real
    tokens / (1 - the row's padding share: ``padding_random`` for random batches, ``padding_budget`` for
    token-budget ones), in the row's format (autocast, TF32 or float32), attention path, execution (eager,
    or compiled) and AdamW (foreach, or fused). Unlike a roofline, every row changes the prediction: fusion,
    compilation and the fused optimizer remove memory traffic and launches, which the predictor counts.
    The per-step token-id check's host sync is not modelled. With ``seq_len``: each row's predicted memory
    (:func:`step_memory_gib`) at that padded length."""
    from gpuformer_lib import predict

    for name, value in (("padding_random", padding_random), ("padding_budget", padding_budget)):
        if not (isinstance(value, (int, float)) and 0 <= value < 1):
            raise ValueError(f"{name} is a share of padded slots, 0 <= share < 1; got {value!r}")
    if not (isinstance(mean_len, (int, float)) and mean_len > 0):
        raise ValueError(f"mean_len must be a positive number of tokens, got {mean_len!r}")
    out: list[RowPrediction] = []
    for name, setting, reason in rows:
        if reason is not None:
            out.append(RowPrediction(name, None, "—", None, skipped=reason))
            continue
        plan = setting.plan
        fmt = _row_format(plan, gpu)
        padding = padding_budget if setting.option("batching", "random") == "token_budget" else padding_random
        padded = max(1, round(mean_len / (1 - padding)))
        cfg = dataclasses.replace(config, fused_attention=plan.fused_attention,
                                  max_len=max(config.max_len, padded + 1))
        execution = "cuda-graphs" if plan.cuda_graphs else ("compiled" if plan.compile else "eager")
        work = predict.training_work(cfg, tokens=batch_size * padded, seq_len=padded, src_len=padded, fmt=fmt,
                                     execution=execution, optimizer="fused" if plan.fused_optimizer else "foreach")
        step = predict.predict_step(work, gpu)
        mem = None
        if seq_len:
            mem = step_memory_gib(config, batch_size, seq_len, autocast=plan.dtype is not None,
                                  fused_attention=plan.fused_attention)[1]
        out.append(RowPrediction(name, step.seconds, fmt, mem, bound=step.bound, kernels=work.kernels,
                                 flops=work.matrix_flops))
    return out


def largest_step(predictions: Sequence[RowPrediction]) -> tuple[str, float]:
    """The row whose predicted step time falls the most against the row run before it, and that ratio
    (time before / time after)."""
    ran = [p for p in predictions if p.skipped is None]
    if len(ran) < 2:
        raise ValueError("need at least two rows that run to compare steps")
    ratios = [(before.seconds / after.seconds, after.row) for before, after in zip(ran, ran[1:])]
    ratio, row = max(ratios)
    return row, ratio


def step_ratios(predictions: Sequence[RowPrediction]) -> dict[str, float]:
    """Per row that runs (after the first), its predicted time before / after against the row run before it."""
    ran = [p for p in predictions if p.skipped is None]
    return {after.row: before.seconds / after.seconds for before, after in zip(ran, ran[1:])}


_FIXES = (  # profile category (bench.time_by_category) -> the words of the table rows that address it, in order
    ("matrix products", ("autocast", "TF32")),
    ("attention", ("fused attention",)),
    ("loss (log-softmax, NLL)", ("autocast",)),
    ("optimizer", ("fused AdamW",)),
    ("element-wise, norms, copies", ("torch.compile",)),
    ("copies", ("token-budget",)),  # a GPU's host-to-device copies: fewer padded slots to copy
)


def bottleneck(times: dict[str, float]) -> tuple[str, float]:
    """The category that took the most time in a profile (``bench.time_by_category``'s dict) and its share
    of the total (0-1)."""
    if not times or any(not v >= 0 for v in times.values()) or sum(times.values()) <= 0:
        raise ValueError(f"times must map categories to times >= 0 with a positive total, got {times!r}")
    top = max(times, key=times.get)
    return top, times[top] / sum(times.values())


def fix_for(category: str, row_names: Sequence[str]) -> str | None:
    """The first row of the acceleration table (by name) whose acceleration addresses ``category``; None
    when no row does."""
    return case_study.fixing_row(category, row_names, _FIXES)


@dataclasses.dataclass(frozen=True)
class BatchingTiming:
    """Real target tokens per second of one training step on random and on token-budget batches, timed
    interleaved (so a machine whose load drifts slows both alike)."""

    random_rate: float
    budget_rate: float
    steps: int
    """Timed steps per batching."""

    @property
    def speedup(self) -> float:
        """Token-budget batches' real tokens per second over random batches': time per real token before / after."""
        return self.budget_rate / self.random_rate


def batching_speedup(task: case_study.Task, device: torch.device | str, *, steps: int = 6, seed: int = 0
                     ) -> BatchingTiming:
    """The baseline's training step (the table's own) timed on random and on token-budget batches of one
    epoch, interleaved (``case_study.interleaved_rates``): the table's rows run a minute apart, this
    measurement runs both batchings within a second of each other."""
    baseline = case_study.Setting()
    random_rate, budget_rate = case_study.interleaved_rates(
        task, baseline, baseline.with_options(batching="token_budget"), device, steps=steps, seed=seed)
    return BatchingTiming(random_rate=random_rate, budget_rate=budget_rate, steps=steps)
