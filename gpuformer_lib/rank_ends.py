"""How each rank of a :func:`gpuformer_lib.distributed.launch` job ended, recorded by a watcher around the rank,
and the launcher's account of a failure or a timeout built from it.

torchrun starts this module in place of the worker (``python -m gpuformer_lib.rank_ends ENDS SCRIPT ARGS...``); it runs
``python -u SCRIPT ARGS...`` as its child in the same process group, waits, and writes ``ENDS/rank<R>.json``:
the child's exit code (negative: the number of the signal that killed it), when it ended (``time.monotonic()``,
one clock for all the machine's processes) and the signal this watcher received before that, if any: once a
rank has failed, torchrun stops the others by sending SIGTERM to each rank's process group, the watcher's and
its child's. The watcher then ends as its child did, so torchrun sees what it would have seen without it.

Why a watcher, and not torchrun's summary or the rank itself: a rank killed by SIGKILL or crashing in C
(SIGSEGV) writes nothing; torchrun's "Root Cause (first observed failure)" is the failure with the earliest
time stamp, stamped to the second, so a rank whose collective failed because its peer had just died, caught
in the same poll, can be named as the root cause; and torchrun reports nothing at all for a rank that
finished, or for a job the launcher had to kill. A rank whose error is a lost peer or a timed-out collective
(:data:`WAITING`) was waiting for another; the first rank to fail by itself is the one to blame.

Imports only the standard library: it runs in every rank, before the worker's own imports. Leaves out:
starting and stopping the job (``distributed.launch``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

STOPPING = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
"""The signals torchrun's agent sends to stop the ranks (its TORCHELASTIC_SIGNALS_TO_HANDLE)."""

WAITING = re.compile(r"timed out|timeout|closed by peer|connection reset|connection refused|broken pipe|"
                     r"remote worker|socket closed|DistNetworkError|DistStoreError|communicator was aborted",
                     re.IGNORECASE)
"""An error that says the rank was waiting for another one (gloo's and NCCL's words for a peer gone, a
collective timed out, or the rendezvous store lost)."""

ERROR_LINE = re.compile(r"^\[rank (\d+)\].*?\b\w*(?:Error|Exception)\b: ")
"""A line of the launcher's output where rank N printed an exception ('[rank N] ... ValueError: ...')."""


@dataclasses.dataclass(frozen=True)
class RankEnd:
    """How one rank ended, as its watcher recorded it."""

    rank: int
    returncode: int
    """The rank's own exit code; -N when signal N killed it."""
    at: float
    """``time.monotonic()`` just after it ended: orders the ranks' ends."""
    stopped_by: str | None
    """The signal its watcher received before the rank ended (torchrun stopping the job), or None."""

    @property
    def how(self) -> str:
        """'exit code 3', or 'killed by SIGKILL'."""
        if self.returncode >= 0:
            return f"exit code {self.returncode}"
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-self.returncode).name}"
        return f"killed by signal {-self.returncode}"


def read_ends(folder: Path) -> dict[int, RankEnd]:
    """The ends recorded in ``folder`` so far, by rank."""
    ends = {}
    for path in Path(folder).glob("rank*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            end = RankEnd(**json.loads(path.read_text()))
            ends[end.rank] = end
    return ends


def last_error(lines: list[str], rank: int) -> str | None:
    """The last exception line rank ``rank`` printed (its final error), or None."""
    errors = [line for line in lines if (m := ERROR_LINE.match(line)) and int(m.group(1)) == rank]
    return errors[-1] if errors else None


def was_waiting(end: RankEnd, lines: list[str]) -> bool:
    """Whether the rank ended because of another: stopped by torchrun, or its error a lost peer or a timeout."""
    if end.stopped_by is not None:
        return True
    error = last_error(lines, end.rank)
    return end.returncode != 0 and error is not None and WAITING.search(error) is not None


def first_failure(ends: dict[int, RankEnd], lines: list[str]) -> RankEnd | None:
    """The rank that failed first by itself (not waiting for another), or None."""
    failed = [end for end in ends.values() if end.returncode != 0 and not was_waiting(end, lines)]
    return min(failed, key=lambda end: end.at) if failed else None


def explain_failure(ends: dict[int, RankEnd], lines: list[str], nproc: int) -> tuple[int | None, str, str]:
    """The rank to blame for a failed job, what it did in a few words ('exit code 3', 'killed by SIGKILL',
    'hung'), and a sentence naming it and what each other rank did.

    The rank that failed first by itself, with its exit code or the signal that killed it. If every rank
    that failed was waiting (its collective timed out, say), the ranks still running when the first of them
    gave up (hung), else those that had finished while it waited. ``(None, "", "")`` without a failure
    recorded."""
    culprit = first_failure(ends, lines)
    gave_up = sorted((end for end in ends.values() if end.returncode != 0 and end.stopped_by is None),
                     key=lambda end: end.at)
    if culprit is None and not gave_up:
        return None, "", ""
    if culprit is not None:
        blamed, named, what = culprit.rank, [culprit.rank], culprit.how
        parts = [f"rank {culprit.rank} failed first ({culprit.how})"]
    else:
        first = gave_up[0]
        hung = [r for r in range(nproc) if r not in ends or ends[r].stopped_by is not None]
        finished = [r for r in range(nproc) if r in ends and ends[r].returncode == 0]
        named = hung or finished
        if hung:
            what = "hung"
            parts = [f"{_ranks(hung)} hung: still running when rank {first.rank} gave up waiting for "
                     f"{'it' if len(hung) == 1 else 'them'} in a collective ({first.how})"]
        elif finished:
            what = "finished while the others waited"
            parts = [f"{_ranks(finished)} had finished (exit code 0) while rank {first.rank} waited in a "
                     f"collective ({first.how})"]
        else:
            what = f"gave up waiting in a collective, {first.how}"
            parts = [f"every rank gave up waiting in a collective, rank {first.rank} first ({first.how})"]
        blamed = named[0] if named else first.rank
        named = named + [first.rank]
    after = f" after rank {blamed} failed" if culprit is not None else ""
    for r in range(nproc):
        end = ends.get(r)
        if r in named:
            continue
        if end is None:
            parts.append(f"rank {r} was still running when the job was stopped")
        elif end.stopped_by is not None:
            parts.append(f"rank {r} was waiting: stopped by torchrun ({end.stopped_by}){after}")
        elif end.returncode == 0:
            parts.append(f"rank {r} had finished (exit code 0)")
        elif was_waiting(end, lines):
            parts.append(f"rank {r} was waiting: its collective failed ({end.how}){after}")
        else:
            parts.append(f"rank {r} failed too, later ({end.how})")
    return blamed, what, "; ".join(parts)


def explain_timeout(ends: dict[int, RankEnd], nproc: int) -> str:
    """Which ranks had not finished when the launcher's timeout expired, and how the others had ended."""
    running = [r for r in range(nproc) if r not in ends]
    parts = []
    if running:
        parts.append(f"{_ranks(running)} had not finished (hung, or waiting in a collective for one that hung)")
    for r, end in sorted(ends.items()):
        state = "finished" if end.returncode == 0 else "failed" if end.stopped_by is None else "been stopped"
        parts.append(f"rank {r} had {state} ({end.how})")
    return "; ".join(parts)


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def watch(ends: Path, script: str, args: list[str]) -> None:
    """Run ``script`` as this rank, record how it ended in ``ends``, and end the same way."""
    rank = int(os.environ.get("RANK", "0"))
    received: list[str] = []
    for name in STOPPING:
        # only noted: the signal went to the whole process group, the rank included
        signal.signal(getattr(signal, name), lambda signum, frame: received.append(signal.Signals(signum).name))
    child = subprocess.Popen([sys.executable, "-u", script, *args])
    returncode = child.wait()
    record = {"rank": rank, "returncode": returncode, "at": time.monotonic(),
              "stopped_by": received[0] if received else None}
    tmp = ends / f"rank{rank}.tmp"
    with contextlib.suppress(OSError):
        tmp.write_text(json.dumps(record))
        os.replace(tmp, ends / f"rank{rank}.json")
    if returncode < 0:
        number = -returncode
        with contextlib.suppress(ImportError, ValueError, OSError):
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the rank may have dumped core; this watcher must not
        with contextlib.suppress(ValueError, OSError):
            signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)
        returncode = 128 + number
    sys.exit(returncode)


if __name__ == "__main__":
    watch(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
