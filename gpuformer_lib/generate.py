"""Using a trained model: greedy translation, sampling from a language model, BLEU and perplexity.

Covers: greedy decoding with the encoder-decoder ``Transformer`` (encode once, then decode one token
at a time, each step seeing all tokens so far); sampling from a ``DecoderLM`` with temperature and
top-k; corpus BLEU with sacrebleu (its ``zh`` tokenizer splits Chinese into characters); perplexity.

Leaves out: beam search and key-value caching (each step recomputes the prefix: simple, and fine for
the short sentences of the course; chapter 10 discusses the cost; ``seq2seq_decoding`` adds both).
"""

from __future__ import annotations

import math
import numbers
from typing import Sequence

import torch
from torch import Tensor

from gpuformer_lib.data import Vocab
from gpuformer_lib.model import DecoderLM, Transformer


@torch.no_grad()
def greedy_translate(model: Transformer, src: Tensor, src_padding_mask: Tensor | None = None,
                     max_len: int = 50) -> list[list[int]]:
    """Greedy decoding of a batch of source ids (B, S): at each step take the most likely token,
    stop at <eos>. Returns each translation's ids, without <bos> and <eos>. ``max_len`` counts the <bos>,
    so it must be at least 2 (one real token)."""
    if not callable(getattr(model, "encode", None)):  # a DecoderLM has no encoder
        raise TypeError(f"greedy_translate needs an encoder-decoder Transformer, got {type(model).__name__}; "
                        "continue a decoder-only model's prompt with sample()")
    if not _is_int(max_len) or max_len < 2:
        raise ValueError(f"max_len must be an int >= 2 (it counts the <bos>), got {max_len!r}")
    was_training = model.training
    model.eval()
    max_len = min(max_len, model.config.max_len)
    memory = model.encode(src, src_padding_mask)
    ys = torch.full((src.shape[0], 1), Vocab.BOS, dtype=torch.long, device=src.device)
    done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
    for _ in range(max_len - 1):
        logits = model.decode(ys, memory, src_padding_mask)[:, -1]  # (B, T, V) -> (B, V): the next token
        next_id = logits.argmax(-1).masked_fill(done, Vocab.PAD)
        ys = torch.cat([ys, next_id[:, None]], dim=1)
        done |= next_id == Vocab.EOS
        if done.all():
            break
    model.train(was_training)
    out = []
    for row in ys[:, 1:].tolist():
        out.append(row[: row.index(Vocab.EOS)] if Vocab.EOS in row else [t for t in row if t != Vocab.PAD])
    return out


@torch.no_grad()
def sample(model: DecoderLM, prompt: Tensor, n_new: int, temperature: float = 1.0, top_k: int | None = None,
           generator: torch.Generator | None = None) -> Tensor:
    """Continue ``prompt`` (B, T) by ``n_new`` sampled tokens; returns (B, T + n_new).

    ``temperature`` divides the logits (finite, > 0; near 0 approaches greedy); ``top_k`` keeps the k most
    likely tokens (None or k >= vocabulary size: all of them). Only the last ``max_len`` tokens are seen."""
    _check_sampling(model, prompt, n_new, temperature, top_k)
    was_training = model.training
    model.eval()
    ids = prompt
    for _ in range(n_new):
        context = ids[:, -model.config.max_len:]  # the model sees at most max_len tokens
        logits = model(context)[:, -1] / temperature  # (B, V)
        if top_k is not None:
            kth = logits.topk(min(top_k, logits.shape[-1])).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        next_id = torch.multinomial(logits.softmax(-1), 1, generator=generator)
        ids = torch.cat([ids, next_id], dim=1)
    model.train(was_training)
    return ids


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_sampling(model, prompt: Tensor, n_new: int, temperature: float, top_k: int | None) -> None:
    """The arguments of :func:`sample`, checked before any token is drawn."""
    if isinstance(model, Transformer):
        raise TypeError("sample continues a decoder-only DecoderLM; translate with greedy_translate(model, src)")
    if not torch.is_tensor(prompt) or prompt.dim() != 2 or prompt.shape[1] == 0:
        shape = tuple(prompt.shape) if torch.is_tensor(prompt) else type(prompt).__name__
        raise ValueError(f"prompt must be token ids of shape (B, T) with T >= 1, got {shape}: "
                         "a single sequence is prompt[None]")
    if not _is_int(n_new) or n_new < 0:
        raise ValueError(f"n_new (tokens to add) must be an int >= 0, got {n_new!r}")
    if not isinstance(temperature, numbers.Real) or not 0 < temperature < math.inf:
        raise ValueError(f"temperature must be positive and finite, got {temperature}")
    if top_k is not None and (not _is_int(top_k) or top_k < 1):
        raise ValueError(f"top_k must be None (no cut) or an int >= 1, got {top_k!r}")


def _check_sentences(name: str, sentences) -> None:
    if isinstance(sentences, str) or not all(isinstance(s, str) for s in sentences):
        raise TypeError(f"{name} must be a list of sentences (strings), one per example, got {sentences!r:.80}: "
                        "decode token ids to text first (Vocab.decode)")


def bleu(hypotheses: Sequence[str], references: Sequence[str], tokenize: str = "zh") -> float:
    """Corpus BLEU (0-100) of one reference per hypothesis, with sacrebleu."""
    import sacrebleu

    _check_sentences("hypotheses", hypotheses)
    _check_sentences("references", references)
    if len(hypotheses) != len(references) or not hypotheses:
        raise ValueError(f"need as many hypotheses as references, and some: got {len(hypotheses)} and {len(references)}")
    if tokenize not in sacrebleu.BLEU.TOKENIZERS:
        raise ValueError(f"tokenize={tokenize!r} is not one of sacrebleu's: {', '.join(sacrebleu.BLEU.TOKENIZERS)}")
    return sacrebleu.corpus_bleu(list(hypotheses), [list(references)], tokenize=tokenize).score


def perplexity(mean_loss: float) -> float:
    """exp(cross-entropy in nats): the number of equally likely tokens the model is as unsure as.

    ``mean_loss``: a number or a one-element tensor, >= 0. A loss past about 709 nats gives ``inf``."""
    if torch.is_tensor(mean_loss):
        if mean_loss.numel() != 1:
            raise ValueError(f"perplexity needs the mean loss, one number, got a tensor of shape "
                             f"{tuple(mean_loss.shape)}: take .mean() first")
        mean_loss = mean_loss.item()
    if isinstance(mean_loss, bool) or not isinstance(mean_loss, numbers.Real) or math.isnan(mean_loss) \
            or mean_loss < 0:
        raise ValueError(f"a cross-entropy loss is a number >= 0, got {mean_loss!r}: a NaN loss means training "
                         "diverged, a negative one that this is not a cross-entropy")
    try:
        return math.exp(mean_loss)
    except OverflowError:  # past float range: as unsure as infinitely many tokens, which is what it says
        return math.inf
