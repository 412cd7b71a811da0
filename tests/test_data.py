"""Data sets read offline (never downloaded in tests), verified downloads, tokenizers, vocabularies,
splits, encoding limits, padding, collation and bucketing."""

import hashlib
import io
import os
import shutil
import subprocess
import urllib.request
import zipfile
from pathlib import Path

import pytest
import torch

from gpuformer_lib import data
from gpuformer_lib.tools.notebooks import REPO_ROOT

SHARED = Path(os.environ.get(data.DATA_ENV) or REPO_ROOT.parent / "shared" / "data")
needs_shared = pytest.mark.skipif(not (SHARED / "cmn-eng.txt").exists(),
                                  reason=f"no data folder at {SHARED}; set {data.DATA_ENV}")


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a test tried to download")
    monkeypatch.setattr(urllib.request, "urlopen", refuse)


@pytest.fixture
def shared_data(monkeypatch):
    monkeypatch.setenv(data.DATA_ENV, str(SHARED))
    return SHARED


@needs_shared
def test_shared_files_match_the_known_checksums(shared_data):
    for name, source in data.DATASETS.items():
        path = data.data_path(name, download=False)
        assert hashlib.sha256(path.read_bytes()).hexdigest() == source.sha256, name


@needs_shared
def test_the_known_files_are_those_of_the_data_folders_readme(shared_data):
    readme = (SHARED / "README.md").read_text()
    listed = dict(reversed(line.split()) for line in readme.split("sha256:")[1].split("```")[1].strip().splitlines())
    assert {s.filename: s.sha256 for s in data.DATASETS.values()} == listed
    for source in data.DATASETS.values():
        assert (SHARED / source.filename).stat().st_size == source.size, source.filename


@needs_shared
def test_translation_pairs_and_text(shared_data):
    pairs = data.load_translation_pairs()
    assert pairs[0] == ("Hi.", "嗨。")  # the byte-order mark is gone
    assert len(pairs) > 29_000
    assert data.load_translation_pairs(max_pairs=10) == pairs[:10]
    assert data.load_text().startswith("First Citizen:")


def test_missing_file_without_network_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setenv(data.DATA_ENV, str(tmp_path))
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: (_ for _ in ()).throw(OSError("no network")))
    with pytest.raises(FileNotFoundError) as err:
        data.data_path("tinyshakespeare")
    assert data.DATASETS["tinyshakespeare"].url in str(err.value) and data.DATA_ENV in str(err.value)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        data.data_path("tinyshakespeare", download=False)
    with pytest.raises(ValueError, match="unknown data set"):
        data.data_path("imagenet")


class FakeResponse(io.BytesIO):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("zipped", [False, True])
def test_download_is_verified_and_atomic(monkeypatch, tmp_path, zipped):
    text = "To be, or not to be\n".encode()
    payload = text
    if zipped:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as z:
            z.writestr("inner.txt", text)
        payload = buffer.getvalue()
    source = data.DataSource("t.txt", "https://example.org/t", hashlib.sha256(text).hexdigest(), "PD", "test",
                             member="inner.txt" if zipped else None)
    monkeypatch.setitem(data.DATASETS, "t", source)
    monkeypatch.setenv(data.DATA_ENV, str(tmp_path / "d"))
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: FakeResponse(payload))
    path = data.data_path("t")
    assert path.read_bytes() == text and [p.name for p in path.parent.iterdir()] == ["t.txt"]


def test_download_with_a_wrong_checksum_writes_nothing(monkeypatch, tmp_path):
    monkeypatch.setitem(data.DATASETS, "t", data.DataSource("t.txt", "https://example.org/t", "0" * 64, "PD", "x"))
    monkeypatch.setenv(data.DATA_ENV, str(tmp_path))
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: FakeResponse(b"tampered"))
    with pytest.raises(ValueError, match="checksum"):
        data.data_path("t")
    assert not any(tmp_path.iterdir())


def test_a_download_that_is_not_the_expected_zip_writes_nothing(monkeypatch, tmp_path):
    source = data.DataSource("t.txt", "https://example.org/t.zip", "0" * 64, "PD", "x", member="t.txt")
    monkeypatch.setitem(data.DATASETS, "t", source)
    monkeypatch.setenv(data.DATA_ENV, str(tmp_path))
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: FakeResponse(b"<html>moved</html>"))
    with pytest.raises(data.DataFileError, match="not a zip archive holding t.txt"):
        data.data_path("t")
    assert not any(tmp_path.iterdir())


def test_the_data_folder_falls_back_to_a_shared_folder_beside_the_repository(tmp_path, monkeypatch):
    """The rule is data_dir()'s, not only the Makefile's: a notebook run without make (nbconvert, a Lab started by
    hand) finds ../shared/data too. $GPUFORMER_DATA, else ../shared/data if it exists, else the repository's data/."""
    repo = tmp_path / "course"
    repo.mkdir()
    monkeypatch.setattr(data, "REPO_ROOT", repo)
    monkeypatch.delenv(data.DATA_ENV, raising=False)
    assert data.data_dir() == repo / "data"  # no shared folder beside the repository
    shared = tmp_path / "shared" / "data"
    shared.mkdir(parents=True)
    assert data.data_dir() == shared
    (shared / "tinyshakespeare.txt").write_text("First Citizen:\n")
    assert data.data_path("tinyshakespeare", download=False, verify=False) == shared / "tinyshakespeare.txt"
    monkeypatch.setenv(data.DATA_ENV, "")  # empty counts as unset: what the Makefile exports without a shared folder
    assert data.data_dir() == shared
    monkeypatch.setenv(data.DATA_ENV, str(tmp_path / "mine"))
    assert data.data_dir() == tmp_path / "mine"


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("with_shared", [True, False])
def test_the_makefile_exports_the_folder_data_dir_chooses(tmp_path, monkeypatch, with_shared):
    repo = tmp_path / "course"
    repo.mkdir()
    shutil.copyfile(REPO_ROOT / "Makefile", repo / "Makefile")
    if with_shared:
        (tmp_path / "shared" / "data").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in (data.DATA_ENV, "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    shown = subprocess.run(["make", "-s", "--no-print-directory", "--eval", "show-data: ; @echo \"[$$GPUFORMER_DATA]\"",
                            "show-data"], cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    exported = shown.stdout.strip()[1:-1]
    monkeypatch.setattr(data, "REPO_ROOT", repo)
    monkeypatch.setenv(data.DATA_ENV, exported)  # what a notebook started by make sees
    by_make = data.data_dir()
    monkeypatch.delenv(data.DATA_ENV)  # what a notebook started without make sees
    assert by_make.resolve() == data.data_dir().resolve()
    assert by_make.resolve() == (tmp_path / "shared" / "data" if with_shared else repo / "data").resolve()


def test_data_path_arguments_are_checked():
    with pytest.raises(ValueError, match="deadline must be positive"):
        data.data_path("tinyshakespeare", deadline=0)


def test_tokenizers():
    assert data.english_words("Don't go, Tom!") == ["don't", "go", ",", "tom", "!"]
    assert data.characters("我 爱 你。") == ["我", "爱", "你", "。"]
    assert data.all_characters("a b\n") == ["a", " ", "b", "\n"]


def test_vocab():
    vocab = data.Vocab.build(["a b b", "c b a"], str.split)
    assert vocab.itos[:4] == list(data.Vocab.SPECIALS) and vocab.itos[4] == "b"
    ids = vocab.encode(["a", "zzz", "b"])
    assert ids[1] == data.Vocab.UNK and vocab.decode(ids) == ["a", "<unk>", "b"]
    assert vocab.decode([data.Vocab.BOS, ids[0], data.Vocab.EOS, ids[2]]) == ["a"]
    assert len(data.Vocab.build(["a b b c"], str.split, min_freq=2)) == 5
    with pytest.raises(KeyError, match="zzz"):
        vocab.encode(["zzz"], unknown="error")
    with pytest.raises(ValueError, match="unknown must be"):
        vocab.encode(["a"], unknown="ignore")
    with pytest.raises(ValueError, match="no text"):
        data.Vocab.build([], str.split)


def test_split_is_fixed_by_seed():
    items = list(range(100))
    train, val, test = data.split(items, seed=3)
    assert (len(train), len(val), len(test)) == (90, 5, 5) and sorted(train + val + test) == items
    assert data.split(items, seed=3) == (train, val, test) and data.split(items, seed=4)[0] != train
    with pytest.raises(ValueError, match="empty"):
        data.split([])
    with pytest.raises(ValueError, match="summing to 1"):
        data.split(items, (0.5, 0.2, 0.2))


PAIRS = [("I like tea.", "我喜欢茶。"), ("Go!", "走！"), ("Tom is here now.", "汤姆现在在这里。")]


def vocabs():
    return (data.Vocab.build([p[0] for p in PAIRS], data.english_words),
            data.Vocab.build([p[1] for p in PAIRS], data.characters))


def test_encode_pairs_adds_specials_and_enforces_max_len():
    src_v, tgt_v = vocabs()
    enc = data.encode_pairs(PAIRS, src_v, tgt_v, data.english_words, data.characters, max_len=10)
    src, tgt = enc[0]
    assert src[-1] == data.Vocab.EOS and tgt[0] == data.Vocab.BOS and tgt[-1] == data.Vocab.EOS
    assert src_v.decode(src) == ["i", "like", "tea", "."] and "".join(tgt_v.decode(tgt)) == "我喜欢茶。"
    with pytest.raises(ValueError, match="max_len=5"):
        data.encode_pairs(PAIRS, src_v, tgt_v, data.english_words, data.characters, max_len=5)
    assert len(data.encode_pairs(PAIRS, src_v, tgt_v, data.english_words, data.characters, 5, "skip")) == 1
    with pytest.raises(ValueError, match="empty"):
        data.encode_pairs([], src_v, tgt_v, data.english_words, data.characters, 10)
    with pytest.raises(ValueError, match="too_long must be"):
        data.encode_pairs(PAIRS, src_v, tgt_v, data.english_words, data.characters, 10, "truncate")


def test_collation_pads_and_shifts():
    src_v, tgt_v = vocabs()
    enc = data.encode_pairs(PAIRS, src_v, tgt_v, data.english_words, data.characters, max_len=12)
    b = data.collate_translation(enc)
    lengths = [len(s) for s, _ in enc]
    assert b.src.shape == (3, max(lengths))
    assert b.src_padding_mask.sum(1).tolist() == [max(lengths) - n for n in lengths]
    assert torch.all(b.src[b.src_padding_mask] == data.Vocab.PAD)
    assert torch.equal(b.tgt_in[:, 1:][~b.tgt_padding_mask[:, :-1]], b.tgt_out[:, :-1][~b.tgt_padding_mask[:, :-1]])
    assert torch.all(b.tgt_out[b.tgt_padding_mask] == data.Vocab.PAD)
    assert torch.all((b.tgt_out == data.Vocab.EOS).sum(1) == 1)  # every target ends exactly once
    with pytest.raises(ValueError, match="empty batch"):
        data.pad([])


def test_bucketing_covers_everything_once_and_wastes_less_padding():
    rng = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 60, (2000,), generator=rng).tolist()
    sampler = data.BucketBatchSampler(lengths, batch_size=32, seed=1)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(2000)) and max(map(len, batches)) == 32
    random_batches = [list(range(i, min(i + 32, 2000))) for i in range(0, 2000, 32)]
    assert data.padding_fraction(batches, lengths) < 0.5 * data.padding_fraction(random_batches, lengths)
    assert list(sampler) == batches
    sampler.set_epoch(1)
    assert list(sampler) != batches and len(sampler) == len(batches)
    with pytest.raises(ValueError):
        data.BucketBatchSampler([], 4)


def test_step_batches_are_a_function_of_the_step():
    lengths = list(range(1, 41))
    dataset = [torch.arange(n) for n in lengths]

    def loader():
        sampler = data.BucketBatchSampler(lengths, batch_size=4, pool_batches=2, seed=5)
        return torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=lambda b: data.pad(b)[0])

    sequential = data.StepBatches(loader())
    first = [sequential(s) for s in range(25)]  # 10 batches an epoch: crosses two epoch boundaries
    jumped = data.StepBatches(loader())
    for s in (17, 18, 3, 24):
        assert torch.equal(jumped(s), first[s])
    assert not torch.equal(first[0], first[10])  # each epoch has its own order
    with pytest.raises(ValueError, match="no batches"):
        data.StepBatches(torch.utils.data.DataLoader([], batch_size=2))


def _tiny_pairs_file(tmp_path):
    path = tmp_path / "pairs.txt"
    path.write_text("Hi.\t嗨。\tCC-BY\nGo.\t走。\tCC-BY\n", encoding="utf-8")
    return path


DATA_PROBES = {  # each computed something wrong quietly, or failed deep inside with a raw error
    "pad float ids": (lambda tmp: data.pad([torch.tensor([1.5, 2.7])]), TypeError, "integer token ids"),
    "pad a (T, k) sequence": (lambda tmp: data.pad([torch.ones(2, 2, dtype=torch.long)]), TypeError, "1-D"),
    "pad a 0-d tensor": (lambda tmp: data.pad([torch.tensor(3)]), TypeError, "1-D"),
    "pad a list": (lambda tmp: data.pad([[1, 2]]), TypeError, "got list"),
    "collate a target without <eos>": (
        lambda tmp: data.collate_translation([(torch.tensor([4, 3]), torch.tensor([2]))]), ValueError, "fewer than 2"),
    "collate single tensors": (lambda tmp: data.collate_translation([torch.tensor([4, 3])]), ValueError,
                               r"\(source ids, target ids\) pair"),
    "decode float ids": (lambda tmp: data.Vocab(["a"]).decode(torch.tensor([4.0, 4.7])), TypeError, "integers"),
    "decode a batch": (lambda tmp: data.Vocab(["a"]).decode(torch.tensor([[4, 4]])), TypeError, "row by row"),
    "decode a float in a list": (lambda tmp: data.Vocab(["a"]).decode([4.0]), TypeError, "integers, got 4.0"),
    "decode a negative id": (lambda tmp: data.Vocab(["a"]).decode([4, -1]), ValueError, "negative"),
    "bucket float lengths": (lambda tmp: data.BucketBatchSampler([3.5, 4.0], 2), TypeError, "lengths must be integers"),
    "bucket pool_batches 0": (lambda tmp: data.BucketBatchSampler([3, 4], 2, pool_batches=0), ValueError,
                              "pool_batches >= 1"),
    "padding_fraction of an empty batch": (lambda tmp: data.padding_fraction([[0], []], [3]), ValueError,
                                           "batch 1 is empty"),
    "repeating_patterns, vocab_size 0": (lambda tmp: data.repeating_patterns(0, 0), ValueError, "vocab_size"),
    "repeating_patterns, period 0": (lambda tmp: data.repeating_patterns(0, 5, period=0), ValueError, "period"),
    "max_pairs 0 (read as 'all')": (lambda tmp: data.load_translation_pairs(_tiny_pairs_file(tmp), max_pairs=0),
                                    ValueError, "max_pairs must be a positive int"),
}


@pytest.mark.parametrize("probe", list(DATA_PROBES))
def test_data_functions_refuse_inputs_they_would_get_wrong(probe, tmp_path):
    call, error, message = DATA_PROBES[probe]
    with pytest.raises(error, match=message):
        call(tmp_path)


def test_data_functions_accept_tensors_where_they_are_unambiguous(tmp_path):
    assert len(list(data.BucketBatchSampler(torch.tensor([3, 4, 5]), 2))) == 2  # a tensor of lengths
    assert sum(map(len, data.split(torch.arange(20)))) == 20  # a tensor of items
    assert data.Vocab(["a"]).decode(torch.tensor([4, 99], dtype=torch.int32)) == ["a", "<unk>"]  # past the vocab
    assert data.load_translation_pairs(_tiny_pairs_file(tmp_path), max_pairs=1) == [("Hi.", "嗨。")]


def test_token_shards_hold_two_bytes_a_token_and_give_the_in_memory_batches(tmp_path):
    import numpy as np

    assert data.token_dtype(69) == data.token_dtype(50_257) == data.token_dtype(2 ** 16) == np.uint16
    assert data.token_dtype(2 ** 16 + 1) == np.uint32
    ids = torch.randint(0, 50_257, (5_000,), generator=torch.Generator().manual_seed(0))
    path = data.write_token_shard(ids, tmp_path / "train.bin", 50_257)
    assert path.stat().st_size == 2 * len(ids)  # 2 bytes a token, no header
    starts = torch.tensor([0, 17, 4_000, len(ids) - 9])
    x, y = data.memmap_batches(path, 50_257, starts, 8)
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (4, 8)
    assert torch.equal(x, torch.stack([ids[s:s + 8] for s in starts]))
    assert torch.equal(y, torch.stack([ids[s + 1:s + 9] for s in starts]))
    with pytest.raises(ValueError, match=r"starts must lie in \[0, 4991\]"):
        data.memmap_batches(path, 50_257, [len(ids) - 8], 8)  # its target would run past the end
    with pytest.raises(ValueError, match=r"in \[0, 69\)"):
        data.write_token_shard([3, 69], tmp_path / "bad.bin", 69)  # 69 would be read back as another token
    with pytest.raises(TypeError, match="integer token ids"):
        data.write_token_shard(torch.tensor([1.0, 2.0]), tmp_path / "bad.bin", 69)
    assert not (tmp_path / "bad.bin").exists()
