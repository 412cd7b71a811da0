"""Real data sets, offline first: where they live, how they are fetched and checked, and how text
becomes padded batches of token ids.

Covers: the course's data sets (Tatoeba English-Chinese pairs, Tiny Shakespeare) read from a local
data folder, downloaded from their public source when missing (checksum verified, written
atomically); readable tokenizers (English words, Chinese characters, characters); a vocabulary with
special tokens; splits fixed by seed; encoding with a length limit; padding and collation; and
length bucketing, which keeps sentences of similar length together so batches carry little padding.

The data folder is ``$GPUFORMER_DATA`` if set, else ``data/`` in the repository (git-ignored).
Nothing here knows about models. Leaves out: the training loop (``train``).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import io
import os
import random
import re
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import torch

DATA_ENV = "GPUFORMER_DATA"


@dataclasses.dataclass(frozen=True)
class DataSource:
    """A data set file: where it comes from, how to check it, and its license."""

    filename: str
    url: str
    sha256: str
    license: str
    attribution: str
    member: str | None = None
    """The file inside the download, when the download is a zip archive."""


DATASETS = {
    "tatoeba-cmn-eng": DataSource(
        filename="cmn-eng.txt", url="https://www.manythings.org/anki/cmn-eng.zip", member="cmn.txt",
        sha256="aa264a2447b26ab7c9d413f8321f9e2a779fd134b5118306b6e26a3499b3926e",
        license="CC-BY 2.0 (France)",
        attribution="English-Chinese sentence pairs from the Tatoeba Project (tatoeba.org), via manythings.org/anki; "
                    "each pair's contributors are named in its third column"),
    "tinyshakespeare": DataSource(
        filename="tinyshakespeare.txt",
        url="https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
        sha256="86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        license="public domain", attribution="Tiny Shakespeare, from Andrej Karpathy's char-rnn project"),
}


def data_dir() -> Path:
    """The folder data sets are read from and downloaded to."""
    if os.environ.get(DATA_ENV):
        return Path(os.environ[DATA_ENV]).expanduser()
    return Path(__file__).resolve().parents[1] / "data"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def data_path(name: str, download: bool = True, timeout: float = 60.0) -> Path:
    """Path of data set ``name`` in :func:`data_dir`, downloading it first if it is missing.

    A download is checked against the known sha256 and written atomically. Without the file and
    without a network, the error says how to get it.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; known: {', '.join(DATASETS)}")
    source = DATASETS[name]
    folder = data_dir()
    path = folder / source.filename
    if path.exists():
        return path
    how = (f"Download {source.url}{f' and extract {source.member}' if source.member else ''} to {path}, "
           f"or point ${DATA_ENV} at a folder that has {source.filename}.")
    if not download:
        raise FileNotFoundError(f"{path} does not exist. {how}")
    try:
        with urllib.request.urlopen(source.url, timeout=timeout) as response:
            payload = response.read()
    except (urllib.error.URLError, OSError) as err:
        raise FileNotFoundError(f"{path} does not exist and downloading it failed ({err}). {how}") from err
    if source.member:
        with zipfile.ZipFile(io.BytesIO(payload)) as archive:
            payload = archive.read(source.member)
    if _sha256(payload) != source.sha256:
        raise ValueError(f"the download of {source.url} does not match the expected checksum (the source may have "
                         f"changed); nothing was written. {how}")
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{source.filename}.")
    with os.fdopen(fd, "wb") as f:
        f.write(payload)
    os.replace(tmp, path)
    return path


def load_translation_pairs(path: Path | str | None = None, max_pairs: int | None = None) -> list[tuple[str, str]]:
    """(English, Chinese) sentence pairs from the Tatoeba file (the attribution column is dropped here;
    see ``DATASETS['tatoeba-cmn-eng'].attribution``)."""
    path = Path(path) if path is not None else data_path("tatoeba-cmn-eng")
    pairs = []
    for line in path.read_text(encoding="utf-8-sig").splitlines():
        fields = line.split("\t")
        if len(fields) >= 2 and fields[0].strip() and fields[1].strip():
            pairs.append((fields[0].strip(), fields[1].strip()))
            if max_pairs is not None and len(pairs) == max_pairs:
                break
    if not pairs:
        raise ValueError(f"{path} holds no tab-separated sentence pairs")
    return pairs


def load_text(name: str = "tinyshakespeare") -> str:
    return data_path(name).read_text(encoding="utf-8")


def repeating_patterns(step: int, vocab_size: int, batch_size: int = 32, seq_len: int = 24, period: int = 4,
                       seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A toy task for quick experiments: each sequence repeats a random pattern of ``period`` tokens, so
    every token after the first period is predictable. Returns inputs and next-token targets, (B, T)
    each; the batch is a function of ``seed + step``, so runs can be compared and resumed exactly."""
    g = torch.Generator().manual_seed(seed + step)
    pattern = torch.randint(0, vocab_size, (batch_size, period), generator=g)
    seq = pattern.repeat(1, seq_len // period + 1)[:, : seq_len + 1]
    return seq[:, :-1], seq[:, 1:]


def split(items: Sequence, fractions: tuple[float, float, float] = (0.9, 0.05, 0.05), seed: int = 0) -> tuple[list, list, list]:
    """Shuffle with ``seed`` and split into train, validation and test: the same seed, the same split."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(f"fractions must be three non-negative numbers summing to 1, got {fractions}")
    if not items:
        raise ValueError("cannot split an empty data set")
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    n_train, n_val = int(fractions[0] * len(items)), int(fractions[1] * len(items))
    chosen = [items[i] for i in order]
    return chosen[:n_train], chosen[n_train:n_train + n_val], chosen[n_train + n_val:]


# --------------------------------------------------------------------------- tokenizers and vocabularies

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?|[^\sa-z0-9]")


def english_words(text: str) -> list[str]:
    """Lower-cased words and single punctuation marks: "Don't go!" -> ["don't", "go", "!"]."""
    return _WORD.findall(text.lower())


def characters(text: str) -> list[str]:
    """Every character except spaces: the usual unit for Chinese, which has no spaces between words."""
    return [c for c in text if not c.isspace()]


def all_characters(text: str) -> list[str]:
    """Every character, spaces and newlines included (character-level language models)."""
    return list(text)


class Vocab:
    """Token <-> id. Ids 0-3 are the special tokens <pad>, <unk>, <bos> (begin) and <eos> (end)."""

    PAD, UNK, BOS, EOS = 0, 1, 2, 3
    SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>")

    def __init__(self, tokens: Iterable[str]):
        self.itos = list(self.SPECIALS) + [t for t in dict.fromkeys(tokens) if t not in self.SPECIALS]
        self.stoi = {t: i for i, t in enumerate(self.itos)}

    @classmethod
    def build(cls, texts: Iterable[str], tokenize: Callable[[str], list[str]], min_freq: int = 1,
              max_size: int | None = None) -> "Vocab":
        """The tokens seen at least ``min_freq`` times, most frequent first (ties in order of appearance)."""
        counts = collections.Counter(tok for text in texts for tok in tokenize(text))
        if not counts:
            raise ValueError("cannot build a vocabulary from no text")
        ranked = [t for t, c in sorted(counts.items(), key=lambda kv: -kv[1]) if c >= min_freq]
        return cls(ranked[:max_size] if max_size is not None else ranked)

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, tokens: Sequence[str], unknown: str = "unk") -> list[int]:
        """Ids for ``tokens``; an unknown token becomes <unk> (``unknown="unk"``) or raises (``"error"``)."""
        if unknown not in ("unk", "error"):
            raise ValueError(f"unknown must be 'unk' or 'error', not {unknown!r}")
        if unknown == "error":
            missing = [t for t in tokens if t not in self.stoi]
            if missing:
                raise KeyError(f"tokens not in the vocabulary: {missing[:5]}")
        return [self.stoi.get(t, self.UNK) for t in tokens]

    def decode(self, ids: Iterable[int], strip_specials: bool = True) -> list[str]:
        out = []
        for i in ids:
            i = int(i)
            if i == self.EOS and strip_specials:
                break
            if strip_specials and i in (self.PAD, self.BOS):
                continue
            out.append(self.itos[i] if 0 <= i < len(self.itos) else "<unk>")
        return out


# --------------------------------------------------------------------------- encoding, padding and batching


def encode_pairs(pairs: Sequence[tuple[str, str]], src_vocab: Vocab, tgt_vocab: Vocab,
                 src_tokenize: Callable[[str], list[str]], tgt_tokenize: Callable[[str], list[str]],
                 max_len: int, too_long: str = "error") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Pairs of id tensors: source tokens + <eos>, and <bos> + target tokens + <eos>.

    A sequence longer than ``max_len`` (specials included) raises (``too_long="error"``) or is left
    out (``"skip"``).
    """
    if too_long not in ("error", "skip"):
        raise ValueError(f"too_long must be 'error' or 'skip', not {too_long!r}")
    if not pairs:
        raise ValueError("no sentence pairs to encode: the data set is empty")
    encoded = []
    for i, (src, tgt) in enumerate(pairs):
        s = src_vocab.encode(src_tokenize(src)) + [Vocab.EOS]
        t = [Vocab.BOS] + tgt_vocab.encode(tgt_tokenize(tgt)) + [Vocab.EOS]
        if max(len(s), len(t)) > max_len:
            if too_long == "error":
                raise ValueError(f"pair {i} ({src[:40]!r}) has {len(s)} source and {len(t)} target tokens, more than "
                                 f"max_len={max_len}; raise max_len or pass too_long='skip'")
            continue
        encoded.append((torch.tensor(s), torch.tensor(t)))
    if not encoded:
        raise ValueError(f"every pair is longer than max_len={max_len}")
    return encoded


def pad(sequences: Sequence[torch.Tensor], pad_id: int = Vocab.PAD) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D id tensors into (B, T_max), padding on the right; also return the mask, True at padding."""
    if not sequences:
        raise ValueError("cannot pad an empty batch")
    lengths = torch.tensor([len(s) for s in sequences])
    out = torch.full((len(sequences), int(lengths.max())), pad_id, dtype=torch.long)
    for row, s in enumerate(sequences):
        out[row, : len(s)] = s
    return out, torch.arange(out.shape[1])[None, :] >= lengths[:, None]


@dataclasses.dataclass
class TranslationBatch:
    """src (B, S); tgt_in = <bos> y1 .. yn and tgt_out = y1 .. yn <eos> (B, T); masks True at padding."""

    src: torch.Tensor
    src_padding_mask: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    tgt_padding_mask: torch.Tensor

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "TranslationBatch":
        return TranslationBatch(*(t.to(device, non_blocking=non_blocking) for t in dataclasses.astuple(self)))

    def pin_memory(self) -> "TranslationBatch":  # called by DataLoader(pin_memory=True)
        return TranslationBatch(*(t.pin_memory() for t in dataclasses.astuple(self)))


def collate_translation(batch: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> TranslationBatch:
    """Collate (source ids, target ids) pairs into a padded :class:`TranslationBatch`."""
    src, src_mask = pad([s for s, _ in batch])
    tgt, tgt_mask = pad([t for _, t in batch])
    return TranslationBatch(src, src_mask, tgt[:, :-1], tgt[:, 1:], tgt_mask[:, 1:])


class BucketBatchSampler(torch.utils.data.Sampler):
    """Batches of indices whose lengths are similar: shuffle, cut into pools of ``pool_batches``
    batches, sort each pool by length, cut it into batches, shuffle the batches. Call
    :meth:`set_epoch` each epoch for a new, reproducible order."""

    def __init__(self, lengths: Sequence[int], batch_size: int, pool_batches: int = 50, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False):
        if batch_size < 1 or not lengths:
            raise ValueError(f"need a non-empty data set and batch_size >= 1, got {len(lengths)} items, {batch_size}")
        self.lengths, self.batch_size, self.pool = list(lengths), batch_size, pool_batches * batch_size
        self.shuffle, self.seed, self.drop_last, self.epoch = shuffle, seed, drop_last, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _batches(self) -> list[list[int]]:
        rng = random.Random(self.seed + self.epoch)
        order = list(range(len(self.lengths)))
        if self.shuffle:
            rng.shuffle(order)
        batches = []
        for start in range(0, len(order), self.pool):
            pool = sorted(order[start:start + self.pool], key=lambda i: self.lengths[i])
            batches += [pool[i:i + self.batch_size] for i in range(0, len(pool), self.batch_size)]
        if self.drop_last:
            batches = [b for b in batches if len(b) == self.batch_size]
        if self.shuffle:
            rng.shuffle(batches)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._batches())

    def __len__(self) -> int:
        return len(self._batches())


def padding_fraction(batches: Iterable[Sequence[int]], lengths: Sequence[int]) -> float:
    """Share of the token slots in these batches that are padding."""
    total = real = 0
    for batch in batches:
        longest = max(lengths[i] for i in batch)
        total += longest * len(batch)
        real += sum(lengths[i] for i in batch)
    return 1 - real / total if total else 0.0


class StepBatches:
    """``get_batch(step)`` for the training loop, over a ``DataLoader``: epoch after epoch in the order
    its sampler gives for that epoch (``set_epoch``), so step ``s`` is always the same batch, and a run
    resumed at step ``s`` skips straight to it."""

    def __init__(self, loader: torch.utils.data.DataLoader):
        self.loader = loader
        self.per_epoch = len(loader)
        if self.per_epoch == 0:
            raise ValueError("the DataLoader yields no batches: is the data set empty?")
        self._iterator: Iterator | None = None
        self._next_step: int | None = None

    def _start_epoch(self, epoch: int) -> None:
        for sampler in (getattr(self.loader, "batch_sampler", None), getattr(self.loader, "sampler", None)):
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
        self._iterator = iter(self.loader)

    def __call__(self, step: int):
        epoch, index = divmod(step, self.per_epoch)
        if step != self._next_step or index == 0:  # a new epoch, the first call, or a jump (resume)
            self._start_epoch(epoch)
            for _ in range(index if step != self._next_step else 0):
                next(self._iterator)
        self._next_step = step + 1
        return next(self._iterator)
