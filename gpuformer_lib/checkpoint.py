"""Checkpoint files: written atomically, read back with errors that say what is wrong, no temporaries left.

Covers the file side of a training checkpoint, whatever it holds: :func:`write_checkpoint` writes to a
temporary file beside the target, named after the writing process (``.ckpt.pt.<host>.<pid>.tmp``),
flushes it to disk and renames it over the target, so a crash at any moment leaves either the old file
or the new one, never half of one. A writer killed mid-write (SIGKILL, a lost node) cannot remove its
temporary file; the next write or read of the same checkpoint removes the temporaries whose writer is
no longer alive (:func:`remove_stale_temporaries`), never those of a live one.
:func:`read_checkpoint` loads with ``weights_only=True`` (no code in the file runs) and turns what can
go wrong with a file into one :class:`CheckpointError` naming the file, its size, what looks wrong and
what to do. :func:`check_finite` refuses to let weights with NaN or infinity into a checkpoint.

Leaves out: what a training checkpoint holds and how it is restored (``train.save_checkpoint`` and
``train.load_checkpoint``).
"""

from __future__ import annotations

import os
import re
import socket
import zipfile
from pathlib import Path
from typing import Any, Iterable

import torch

_ZIP_SIGNATURE = b"PK\x03\x04"  # torch.save writes a zip archive
_ADVICE = "Resume from an earlier checkpoint, or start a fresh run (without resume_from)."


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used: empty, truncated, not a torch file, not a training
    checkpoint, or written for another model."""


class NonFiniteWeightsError(FloatingPointError):
    """Weights or optimizer state hold NaN or infinity: saving them would replace a good checkpoint
    with a useless one."""


def _size(path: Path) -> str:
    try:
        return f"{path.stat().st_size:,} bytes"
    except OSError:
        return "size unknown"


def checkpoint_error(path: str | Path, problem: str, advice: str = _ADVICE) -> CheckpointError:
    """A :class:`CheckpointError` whose message names the file and its size, the problem and what to do."""
    path = Path(path)
    return CheckpointError(f"checkpoint {path} ({_size(path)}) {problem}. {advice}")


# --------------------------------------------------------------------------- temporary files


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"


def temporary_path(path: str | Path) -> Path:
    """Where this process writes ``path`` before renaming it: beside it (a rename is atomic only within
    one file system), hidden, and named after the writer's host and process id."""
    path = Path(path)
    return path.with_name(f".{path.name}.{_host()}.{os.getpid()}.tmp")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: checks that the process exists, sends nothing
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def remove_stale_temporaries(path: str | Path) -> list[Path]:
    """Remove the temporary files of ``path`` left by writers on this host that are no longer running
    (killed mid-write); returns what was removed. A live writer's file stays, and so does one from another
    host (on a shared file system its pid means nothing here). Does nothing on Windows, where
    ``os.kill(pid, 0)`` is not a harmless check."""
    path = Path(path)
    if os.name != "posix" or not path.parent.is_dir():
        return []
    pattern = re.compile(rf"\.{re.escape(path.name)}\.{re.escape(_host())}\.(\d+)\.tmp")
    removed = []
    for candidate in path.parent.iterdir():
        match = pattern.fullmatch(candidate.name)
        if match and int(match.group(1)) != os.getpid() and not _pid_alive(int(match.group(1))):
            candidate.unlink(missing_ok=True)
            removed.append(candidate)
    return removed


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` survive a power cut (POSIX; elsewhere the rename is all there is)."""
    if os.name != "posix":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """``torch.save(state)`` to ``path`` atomically: to a temporary file, flushed to disk, renamed over
    ``path``. If anything fails (or the process dies) on the way, ``path`` still holds the old file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    tmp = temporary_path(path)
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())  # the bytes reach the disk before the rename makes them the checkpoint
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)


# --------------------------------------------------------------------------- reading back


def _load_problem(path: Path, err: Exception) -> str | None:
    """What a failed ``torch.load`` says about the file, in words; None if the file is intact and holds
    nothing unsafe (the failure is elsewhere, e.g. a ``map_location`` naming a GPU this machine lacks)."""
    with open(path, "rb") as f:
        head = f.read(len(_ZIP_SIGNATURE))
    if head != _ZIP_SIGNATURE:
        return (f"is not a file torch.save writes: it does not start with the zip signature {_ZIP_SIGNATURE!r} "
                f"(it starts with {head!r}); it was overwritten or is another kind of file")
    if not _archive_intact(path):
        failure = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else '(no message)'}"
        return f"is truncated or corrupted (a copy or a write that was cut off): torch.load failed with {failure}"
    if "Unsupported global" in str(err) or "weights_only" in str(err).lower():
        refused = re.search(r"Unsupported global: GLOBAL \S+", str(err))
        return ("holds objects that torch.load(weights_only=True) refuses to build (code, or classes other than "
                f"tensors and plain containers{': ' + refused.group(0) if refused else ''}), so it was not loaded: "
                "save_checkpoint never writes those. Load it with weights_only=False only if you trust where the "
                "file came from")
    return None


def _archive_intact(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None  # every member's checksum matches
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return False


def read_checkpoint(path: str | Path, map_location: str | torch.device = "cpu",
                    required_keys: Iterable[str] = ()) -> dict[str, Any]:
    """The dict in checkpoint ``path``, loaded with ``weights_only=True`` and checked to hold
    ``required_keys``. Also removes temporaries that dead writers left beside it.

    Raises ``FileNotFoundError`` if there is no file, and :class:`CheckpointError` if it is empty, not a
    torch file, truncated or corrupted, holds objects ``weights_only`` refuses, or lacks a key."""
    path = Path(path)
    remove_stale_temporaries(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}{' (it is a folder)' if path.is_dir() else ''}: check "
                                "the path, or start a fresh run (without resume_from)")
    if path.stat().st_size == 0:
        raise checkpoint_error(path, "is empty: the write that made it stopped before any byte reached the disk "
                                     "(it was not written by save_checkpoint, which renames only complete files)")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # a damaged file raises almost anything: OSError, EOFError, RuntimeError, KeyError...
        problem = _load_problem(path, err)
        if problem is None:  # an intact file: torch's own error says what is wrong
            raise
        raise checkpoint_error(path, problem) from err
    if not isinstance(state, dict):
        raise checkpoint_error(path, f"holds a {type(state).__name__}, not the dict of a training checkpoint")
    missing = [key for key in required_keys if key not in state]
    if missing:
        raise checkpoint_error(path, f"is not a training checkpoint: it lacks the keys {missing} (it has "
                                     f"{sorted(map(str, state))[:10]})")
    return state


def check_finite(named_tensors: Iterable[tuple[str, torch.Tensor]], what: str) -> None:
    """Raise :class:`NonFiniteWeightsError` naming the tensors of ``what`` that hold NaN or infinity.
    Reads one flag per tensor back from the device, all at once: meant for checkpoints, not every step."""
    names, flags = [], []
    for name, tensor in named_tensors:
        if torch.is_tensor(tensor) and tensor.is_floating_point() and tensor.numel():
            names.append(name)
            flags.append(torch.isfinite(tensor).all())
    if not flags:
        return
    finite = torch.stack([f.to(flags[0].device) for f in flags]).tolist()
    bad = [name for name, ok in zip(names, finite) if not ok]
    if bad:
        raise NonFiniteWeightsError(
            f"{what} hold NaN or infinity in {len(bad)} tensor(s): {', '.join(bad[:5])}"
            f"{' ...' if len(bad) > 5 else ''}. "
            "Nothing was written, so the previous checkpoint is kept. The training diverged before this point: "
            "resume from that checkpoint with a lower lr, gradient clipping (grad_clip) or bf16 instead of fp16, "
            "and check the data")
