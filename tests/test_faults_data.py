"""Fault injection for data and attention: damaged data files, a download that trickles, masks that
mean "may attend" but would be added to the scores, and float16 scores that overflow.

Each test is quick and deterministic on a CPU; nothing here touches the network (a fake ``urlopen``, or a
server on 127.0.0.1, stands in for it) or the shared data folder (copies are damaged in a temporary folder)."""

import hashlib
import http.server
import os
import re
import shutil
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gpuformer_lib import data
from gpuformer_lib.attention import MultiHeadAttention, scaled_dot_product_attention
from gpuformer_lib.tools.notebooks import REPO_ROOT

SHARED = Path(os.environ.get(data.DATA_ENV) or REPO_ROOT.parent / "shared" / "data")
needs_shared = pytest.mark.skipif(not (SHARED / "cmn-eng.txt").exists(),
                                  reason=f"no data folder at {SHARED}; set {data.DATA_ENV}")


REAL_URLOPEN = urllib.request.urlopen  # before the fixture below swaps it: the local server's test needs it


@pytest.fixture(autouse=True)
def no_network_and_fresh_hash_cache(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a test tried to download")
    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    monkeypatch.setattr(data, "_known_hashes", {})


def copy_to(tmp_path: Path, monkeypatch, filename: str) -> Path:
    """A copy of a shared data file in a temporary data folder that GPUFORMER_DATA points at."""
    monkeypatch.setenv(data.DATA_ENV, str(tmp_path))
    copy = tmp_path / filename
    shutil.copyfile(SHARED / filename, copy)
    return copy


def damage(path: Path, how: str) -> None:
    payload = path.read_bytes()
    if how == "empty":
        payload = b""
    elif how == "truncated":
        payload = payload[: len(payload) * 3 // 8]
    else:  # one byte changed, same size
        middle = len(payload) // 2
        payload = payload[:middle] + bytes([payload[middle] ^ 0x01]) + payload[middle + 1:]
    path.write_bytes(payload)


LOADERS = {"tatoeba-cmn-eng": data.load_translation_pairs, "tinyshakespeare": data.load_text}


@needs_shared
@pytest.mark.parametrize("name", list(LOADERS))
@pytest.mark.parametrize("how", ["empty", "truncated", "one byte changed"])
def test_a_damaged_data_file_is_refused_and_left_as_it_is(tmp_path, monkeypatch, name, how):
    source = data.DATASETS[name]
    path = copy_to(tmp_path, monkeypatch, source.filename)
    damage(path, how)
    damaged = path.read_bytes()
    with pytest.raises(data.DataFileError) as err:
        LOADERS[name]()
    message = str(err.value)
    assert str(path) in message and f"{len(damaged):,} bytes" in message and f"{source.size:,}" in message
    assert source.sha256[:16] in message and hashlib.sha256(damaged).hexdigest()[:16] in message
    assert "Delete it" in message and source.url in message and "verify=False" in message
    assert path.read_bytes() == damaged  # never modified, never deleted
    assert [p.name for p in tmp_path.iterdir()] == [source.filename]  # no stray files either
    assert data.data_path(name, verify=False) == path  # a changed copy used on purpose


@pytest.mark.parametrize("how", ["empty", "truncated", "one byte changed"])
def test_a_damaged_local_file_is_refused_without_the_shared_folder(tmp_path, monkeypatch, how):
    """The same check on a data set of the test's own, so that it runs where the shared folder is missing."""
    payload = "".join(f"line {i}: some text\n" for i in range(2000)).encode()
    source = data.DataSource("own.txt", "https://example.org/own.txt", hashlib.sha256(payload).hexdigest(), "PD",
                             "the test", size=len(payload))
    monkeypatch.setitem(data.DATASETS, "own", source)
    monkeypatch.setenv(data.DATA_ENV, str(tmp_path))
    path = tmp_path / "own.txt"
    path.write_bytes(payload)
    assert data.data_path("own") == path  # intact: used as it is
    damage(path, how)
    damaged = path.read_bytes()
    monkeypatch.setattr(data, "_known_hashes", {})
    with pytest.raises(data.DataFileError) as err:
        data.data_path("own")
    assert str(path) in str(err.value) and f"{len(damaged):,} bytes" in str(err.value) and "Delete it" in str(err.value)
    assert path.read_bytes() == damaged and [p.name for p in tmp_path.iterdir()] == ["own.txt"]


@needs_shared
def test_intact_copies_load(tmp_path, monkeypatch):
    copy_to(tmp_path, monkeypatch, "cmn-eng.txt")
    copy_to(tmp_path, monkeypatch, "tinyshakespeare.txt")
    assert len(data.load_translation_pairs()) == 29_155
    assert data.load_text().startswith("First Citizen:")


@needs_shared
def test_a_file_damaged_after_it_was_verified_is_caught(tmp_path, monkeypatch):
    path = copy_to(tmp_path, monkeypatch, "tinyshakespeare.txt")
    data.data_path("tinyshakespeare")
    stat = path.stat()
    damage(path, "one byte changed")
    # set the modification time forward explicitly: on a file system with coarse timestamps an edit
    # within the same tick would otherwise keep it (the cache is keyed on size and mtime)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(data.DataFileError, match="truncated, damaged"):
        data.data_path("tinyshakespeare")


@needs_shared
def test_a_file_is_hashed_once_per_process_until_it_changes(tmp_path, monkeypatch):
    path = copy_to(tmp_path, monkeypatch, "tinyshakespeare.txt")
    hashed = []
    real = data._file_sha256
    monkeypatch.setattr(data, "_file_sha256", lambda p: hashed.append(p) or real(p))
    for _ in range(3):
        data.data_path("tinyshakespeare")
    assert hashed == [path]
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched: hash again
    data.data_path("tinyshakespeare")
    assert len(hashed) == 2


@needs_shared
def test_an_explicit_path_is_the_learners_choice_and_read_unverified(tmp_path):
    variant = tmp_path / "my-pairs.txt"
    variant.write_bytes((SHARED / "cmn-eng.txt").read_bytes()[:2000])  # a deliberate excerpt
    pairs = data.load_translation_pairs(variant)
    assert pairs[0] == ("Hi.", "嗨。") and 0 < len(pairs) < 100


class TricklingResponse:
    """An HTTP response that sends one byte per read, slowly: a stalled-but-alive server. It ends
    after ``n_bytes`` so that, without a deadline, the download finishes (wrongly) instead of hanging;
    with ``released`` (see :func:`released`) it also ends, at once, when the test sets that event."""

    def __init__(self, n_bytes: int = 40, seconds_per_byte: float = 0.05, released: threading.Event | None = None):
        self.left, self.delay, self.released = n_bytes, seconds_per_byte, released or threading.Event()
        self.headers = {"Content-Length": str(n_bytes)}

    def _one(self) -> bytes:
        if not self.left or self.released.wait(self.delay):
            return b""
        self.left -= 1
        return b"x"

    def read1(self, n: int = -1) -> bytes:
        return self._one()

    def read(self, n: int = -1) -> bytes:
        if n is not None and n >= 0:
            return self._one()
        chunks = []
        while chunk := self._one():
            chunks.append(chunk)
        return b"".join(chunks)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def released():
    """Set once the test has its answer (and at its end): until then the fake servers below do not finish, so
    only the deadline can end a download before it, however slowly a busy machine runs the test; no time is
    measured. Without a deadline the download ends after the server's 60 s with a failure, not a hang."""
    event = threading.Event()
    yield event
    event.set()


def test_a_trickling_download_is_cut_off_at_the_deadline_and_writes_nothing(tmp_path, monkeypatch, released):
    monkeypatch.setitem(data.DATASETS, "t", data.DataSource("t.txt", "https://example.org/t", "0" * 64, "PD", "x"))
    monkeypatch.setenv(data.DATA_ENV, str(tmp_path / "d"))
    response = TricklingResponse(n_bytes=1200, seconds_per_byte=0.05, released=released)  # 60 s unless released
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: response)
    with pytest.raises(data.DownloadTimeoutError, match="deadline of 0.3 s") as err:
        data.data_path("t", deadline=0.3)
    released.set()  # the server had not finished: the deadline ended the download
    assert "nothing was written" in str(err.value) and "deadline=" in str(err.value)
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").iterdir())


def test_a_server_that_trickles_its_headers_is_cut_off_at_the_deadline(tmp_path, monkeypatch, released):
    """urlopen returns only once the headers are in: a deadline checked between body chunks never runs."""
    monkeypatch.setitem(data.DATASETS, "t", data.DataSource("t.txt", "https://example.org/t", "0" * 64, "PD", "x"))
    monkeypatch.setenv(data.DATA_ENV, str(tmp_path / "d"))

    def slow_headers(*args, **kwargs):
        released.wait(60)  # each header byte in time for the per-read timeout, the whole far past the deadline
        return TricklingResponse(n_bytes=5, seconds_per_byte=0.0)

    monkeypatch.setattr(urllib.request, "urlopen", slow_headers)
    with pytest.raises(data.DownloadTimeoutError, match="deadline of 0.3 s") as err:
        data.data_path("t", deadline=0.3)
    released.set()  # the headers had not come: the deadline ended the download
    assert "0 bytes arrived" in str(err.value) and "nothing was written" in str(err.value)
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").iterdir())


@pytest.fixture
def endless_trickle():
    """The address of a real HTTP server on 127.0.0.1 that sends its headers at once, then one byte every
    0.5 s: each read gets a byte well within any per-read timeout, so only an overall deadline ends a
    download from it. It gives up after 30 s, so that a download without a deadline ends the test with a
    failure (a short, wrong file) instead of hanging it."""
    done = threading.Event()

    class Trickle(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(10**9))  # a large file, never finished
            self.end_headers()
            give_up = time.monotonic() + 30
            try:
                while not done.is_set() and time.monotonic() < give_up:
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    done.wait(0.5)
            except OSError:  # the client hung up, as a download past its deadline does at its next chunk
                pass

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/t.txt"
    finally:
        done.set()
        server.shutdown()
        server.server_close()
        serving.join(10)


def test_a_real_server_that_trickles_is_cut_off_by_the_overall_deadline(tmp_path, monkeypatch, endless_trickle):
    """A real socket, not a fake response: the per-read timeout (60 s) never fires, since a byte comes every
    0.5 s; the overall deadline (2 s) must end the download anyway, and nothing may be written."""
    monkeypatch.setattr(urllib.request, "urlopen", REAL_URLOPEN)
    for proxy in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):  # a proxy would not reach our 127.0.0.1
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setitem(data.DATASETS, "t", data.DataSource("t.txt", endless_trickle, "0" * 64, "PD", "x"))
    monkeypatch.setenv(data.DATA_ENV, str(tmp_path / "d"))
    # without the deadline, the server gives up after 30 s and the download ends short, with another error
    with pytest.raises(data.DownloadTimeoutError, match="deadline of 2 s") as err:
        data.data_path("t", timeout=60, deadline=2.0)
    # cut off while the body trickled, or (a machine too busy to connect within 2 s) before the headers
    assert re.search(r"of 1,000,000,000 bytes arrived|\b0 bytes arrived", str(err.value)), str(err.value)
    assert "nothing was written" in str(err.value)
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").iterdir())


def test_a_download_in_time_returns_its_bytes_and_its_errors(monkeypatch):
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: TricklingResponse(n_bytes=3, seconds_per_byte=0))
    assert data._download("https://example.org/t", timeout=1, deadline=5, label="t") == b"xxx"

    def refused(*args, **kwargs):
        raise urllib.error.URLError("connection refused")

    monkeypatch.setattr(urllib.request, "urlopen", refused)
    with pytest.raises(urllib.error.URLError, match="connection refused"):
        data._download("https://example.org/t", timeout=1, deadline=5, label="t")


# --------------------------------------------------------------------------- attention


def qkv(tq=5, tk=5, hs=4, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, 3, t, hs, generator=g).to(dtype) for t in (tq, tk, tk))


CAUSAL_01 = {"int64 0/1": torch.ones(5, 5, dtype=torch.long).tril(),
             "uint8 0/1": torch.ones(5, 5, dtype=torch.uint8).tril(),
             "float 0/1": torch.ones(5, 5).tril()}


@pytest.mark.parametrize("kind", list(CAUSAL_01))
def test_a_0_1_causal_mask_is_refused_not_added_to_the_scores(kind):
    # added to the scores, such a mask leaves every future token visible
    mask = CAUSAL_01[kind]
    error = ValueError if mask.is_floating_point() else TypeError
    with pytest.raises(error, match=r"attn_mask\.bool\(\)"):
        scaled_dot_product_attention(*qkv(), attn_mask=mask)
    x = torch.randn(2, 5, 8)
    for fused in (True, False):
        with pytest.raises(error, match=r"attn_mask\.bool\(\)"):
            MultiHeadAttention(8, 2, fused=fused)(x, x, x, attn_mask=mask)
    out, _ = scaled_dot_product_attention(*qkv(), attn_mask=mask.bool())  # the advice works
    torch.testing.assert_close(out, scaled_dot_product_attention(*qkv(), is_causal=True)[0])


@pytest.mark.parametrize("dtype", [torch.long, torch.float32])
def test_a_0_1_key_padding_mask_is_refused(dtype):
    x = torch.randn(2, 5, 8)
    pad = torch.zeros(2, 5, dtype=dtype)
    pad[0, -2:] = 1
    with pytest.raises(TypeError, match="key_padding_mask must be a bool tensor"):
        MultiHeadAttention(8, 2)(x, x, x, key_padding_mask=pad)


def test_integer_q_k_v_are_refused_not_answered_with_zeros():
    q, k, v = (t.mul(3).long() for t in qkv())
    with pytest.raises(TypeError, match="floating-point"):
        scaled_dot_product_attention(q, k, v)


def test_float16_scores_that_overflow_before_scaling_stay_finite():
    # query i matches key i % 4 on 16 of the 64 dimensions: q . k = 16 * 70 * 70 = 78,400, past float16's
    # 65504, while the scaled score (/ sqrt(64)) is 9,800; other pairs score about 0, so each query picks
    # one key, far from any near tie that float16's rounding (steps of 8 at 9,800) could flip
    g = torch.Generator().manual_seed(0)
    q, k = torch.zeros(2, 6, 64), torch.zeros(2, 4, 64)
    for i in range(6):
        q[:, i, 16 * (i % 4): 16 * (i % 4 + 1)] = 70
    for j in range(4):
        k[:, j, 16 * j: 16 * (j + 1)] = 70
    q, k = q + 0.1 * torch.randn(q.shape, generator=g), k + 0.1 * torch.randn(k.shape, generator=g)
    q, k, v = q.half(), k.half(), torch.randn(2, 4, 8, generator=g).half()
    assert torch.isinf(q @ k.transpose(-2, -1)).any()  # the unscaled product overflows
    out, weights = scaled_dot_product_attention(q, k, v)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), rtol=5e-3, atol=5e-3)
    torch.testing.assert_close(out, v[:, [0, 1, 2, 3, 0, 1]])


def test_float16_multi_head_explicit_path_matches_the_fused_one_with_large_activations():
    torch.manual_seed(0)
    explicit, fused = MultiHeadAttention(64, 2, fused=False).half(), MultiHeadAttention(64, 2).half()
    x = (3 + 0.3 * torch.randn(2, 6, 64)).half()
    with torch.no_grad():  # q and k of about 70 per entry: q . k about 150,000 in each 32-wide head
        weight = torch.cat([0.35 + 0.02 * torch.randn(128, 64), 0.1 * torch.randn(64, 64)])
        explicit.in_proj_weight.copy_(weight.half())
    fused.load_state_dict(explicit.state_dict())
    out, _ = explicit(x, x, x)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, fused(x, x, x)[0], rtol=5e-3, atol=5e-3)
