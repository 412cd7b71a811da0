"""Using a trained model: greedy translation, sampling from a language model, BLEU and perplexity.

Covers: greedy decoding with the encoder-decoder ``Transformer`` (encode once, then decode one token
at a time, each step seeing all tokens so far); sampling from a ``DecoderLM`` with temperature and
top-k; corpus BLEU with sacrebleu (its ``zh`` tokenizer splits Chinese into characters); perplexity.

Leaves out: beam search and key-value caching (each step recomputes the prefix: simple, and fine for
the short sentences of the course; chapter 10 discusses the cost).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from gpuformer_lib.data import Vocab
from gpuformer_lib.model import DecoderLM, Transformer


@torch.no_grad()
def greedy_translate(model: Transformer, src: Tensor, src_padding_mask: Tensor | None = None,
                     max_len: int = 50) -> list[list[int]]:
    """Greedy decoding of a batch of source ids (B, S): at each step take the most likely token,
    stop at <eos>. Returns each translation's ids, without <bos> and <eos>."""
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
    """Continue ``prompt`` (B, T) by ``n_new`` sampled tokens; returns (B, T + n_new)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
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


def bleu(hypotheses: Sequence[str], references: Sequence[str], tokenize: str = "zh") -> float:
    """Corpus BLEU (0-100) of one reference per hypothesis, with sacrebleu."""
    import sacrebleu

    if len(hypotheses) != len(references) or not hypotheses:
        raise ValueError(f"need as many hypotheses as references, and some: got {len(hypotheses)} and {len(references)}")
    return sacrebleu.corpus_bleu(list(hypotheses), [list(references)], tokenize=tokenize).score


def perplexity(mean_loss: float) -> float:
    """exp(cross-entropy in nats): the number of equally likely tokens the model is as unsure as."""
    return math.exp(mean_loss)
