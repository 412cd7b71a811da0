"""Grade a class's submitted notebooks in one command: ``make grade SUBMISSIONS=dir [OUT=dir]``.

    python -m gpuformer_lib.tools.grade SUBMISSIONS [--out _build/grades] [--jobs 2] [--notebooks 06 09]

**The layout.** ``SUBMISSIONS`` holds one folder per student, named after the student, with their notebooks
in it (subfolders are searched too; ``.ipynb_checkpoints`` and hidden files are skipped), and/or flat
notebook files ``<student>.ipynb`` (one notebook per student). Hidden entries are skipped and listed on
stderr. Two entries that would be the same student (``John Smith/`` and ``John_Smith/``, ``ada/`` and
``ada.ipynb``, ``Ada`` and ``ada``: compared NFC-normalised and case-insensitively) are refused, naming both,
before anything is written. A file over 50 MB is not read. A submission is matched to its course
notebook by the student copy's metadata (``gpuformer_student.source``, written by ``make student``), else by
its file name, else by a chapter number in its name (``Copy of 06_losses (2).ipynb``), so a renamed notebook
is still graded. When a student has two files for one chapter, the one matched better is graded (metadata,
then file name, then chapter number; between equals the first path in alphabetical order), never the one with
the newer time stamp; the feedback names both. The exercises of a course notebook are the ``check_*`` functions of
:mod:`gpuformer_lib.exercises` that its non-solution cells call, read from the instructor's copy
(``--course``, default the course's ``notebooks/``). Each is named as the book numbers it: the number of the
nearest exercise heading above its code cell there (``### Exercise 3.1: ...``, or a paragraph opening with
``**13.2 ...**``; a heading of another kind in between ends an exercise; :func:`course_exercises`), with a letter
when one exercise's cell calls several checks (``1.4a``, ``1.4b``). A column of ``grades.csv`` is
``<chapter>:<number>:<check name>`` (``03:3.1:check_causal_mask``: the check's name is the stable id, so split on
``:``); the feedback says ``Exercise 3.1 (check_causal_mask): failed. <hint>``, and cites a cell as the learner
numbers it, counting code cells only (``code cell 12, the code cell of exercise 3.1``). The notebooks
graded are those given with ``--notebooks`` (file names or chapter numbers), else every course notebook that
some submission matched; a student without one gets "did not run" for its exercises.

**How a notebook runs.** Each notebook runs in its own process (:mod:`gpuformer_lib.tools.sandbox`) on a
copy in a fresh work folder (the submission is never opened for writing; the course folder's data files,
such as chapter 10's ``traces/``, are copied beside it, from the course's own ``notebooks/`` when ``--course``
lacks them), with a time limit per cell and per
notebook, on the CPU (``CUDA_VISIBLE_DEVICES`` empty, ``GPUFORMER_DEVICE=cpu``), with ``GPUFORMER_DATA``
passed, ``OMP_NUM_THREADS=1``, proxy variables cleared, ``HOME`` and ``TMPDIR`` inside the work folder, in a
network namespace with no network and a mount namespace where everything outside the job's folder is read-only
(``unshare``; where either is not allowed, a warning, and only the audit hook stands in), and under the
sandbox's audit hook (what it refuses and what it cannot stop: see :mod:`gpuformer_lib.tools.sandbox`).
Every check reports its result through the grading side channel (``GPUFORMER_GRADE_LOG``, see
:mod:`gpuformer_lib.exercises._core`), so nothing printed is parsed.

**The statuses.** Per exercise: ``passed``; ``failed`` (with the check's hint); ``not attempted`` (the check failed
on the stub itself: its log line says ``not_attempted``, because the learner's function still raised the stub's
bare ``NotImplementedError`` or the answer was still the stub's ``None``/``...``/``"?"``, see
:mod:`gpuformer_lib.exercises._core`; or the cell that ran it is, but for trailing spaces, the exercise's code cell
as the student copy has it, the instructor's non-solution cell that ``make student`` keeps; it counts 0 like
``failed``); ``timed out`` (the check's log
line says ``timed_out``: the learner's function did not return in time; or the cell calling it ran past the cell
time limit); ``crashed``
(the cell calling the check raised, ``sys.exit`` included, or the kernel died in it); ``did not run`` (no cell
of the submission calls the check, the cell never ran because the run ended before it, or it ran without the
check reporting). Which cell calls which check is read from the submitted notebook's own cells, never from cell
positions, and each result is attributed to the cell that was running when the check wrote it. **The grade of an
exercise is its last result**: the results its check reported in the last cell that called it (one cell may call
a check twice: it passes only if every call in that cell passed). ``total`` counts the passed exercises.

**Forged results, and escapes.** The learner's code runs in the same process as the checks and can record any
result (see :mod:`gpuformer_lib.exercises._core`). The grader flags every code cell whose code (not its comments or
prose strings: :mod:`gpuformer_lib.tools.review`) uses the grading channel's internals,
``exec``/``compile``/``eval``, ``ctypes``, an audit hook, assigns to an attribute of a ``gpuformer_lib.exercises``
module, starts a Python child without the sandbox's hook (``-S``, ``-I``, ``-E``, an ``env=`` without
``PYTHONPATH``) or names ``mount``, ``unshare``, ``nsenter``, ``chroot`` or ``pivot_root``: the ``flags`` column of
``grades.csv`` and a "review by hand" line in the feedback. A flagged row is not trustworthy until a person has read
those cells. What the sandbox refused (the run record's ``refusals``: writing outside, starting a program, the
network, reading the solutions) is reported too: the ``refused`` column (how many, then each with the code cell
that was running) and a "Refused by the sandbox" section of the feedback.

**What it writes.** ``OUT/grades.csv`` (one row per student: a column per exercise, ``total``, ``out_of``,
``flags``, ``refused``), ``OUT/feedback/<student>.md`` (each exercise's
status and hint, and what happened to each notebook), and ``OUT/work/<student>/`` (each notebook's work folder,
its executed copy, check log, run record and the worker's log). It refuses an ``OUT`` inside the submissions
folder (or holding it), and an existing ``OUT`` that is not a grades folder it wrote (it marks its own with
``.gpuformer_grades``); a grades folder of its own is replaced. One broken or malicious submission cannot stop
the others: each runs in its own process under its own limits, and whatever happens is reported. Exit code 0:
every notebook was graded; 1: grades written, but some notebook could not be run for the grader's or the
machine's reasons (a worker that failed, a kernel that did not start); 2: refused, nothing written.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import csv
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import time
import unicodedata
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from gpuformer_lib.tools import sandbox
from gpuformer_lib.tools.notebooks import REPO_ROOT
from gpuformer_lib.tools.review import suspicious
from gpuformer_lib.tools.student import STUDENT_KEY, data_files, is_solution

PASSED, FAILED, TIMED_OUT, CRASHED, DID_NOT_RUN = "passed", "failed", "timed out", "crashed", "did not run"
NOT_ATTEMPTED = "not attempted"
STATUSES = (PASSED, FAILED, NOT_ATTEMPTED, TIMED_OUT, CRASHED, DID_NOT_RUN)
MAX_SUBMISSION_BYTES = 50_000_000
"""A bigger submitted notebook is not read (huge outputs, or not a notebook): graded as not valid."""
MARKER = ".gpuformer_grades"
"""File that marks a folder as one ``make grade`` wrote (and may replace)."""

NETNS = ["unshare", "--user", "--map-root-user", "--net", "--ipc", "--uts", "--pid", "--fork", "--kill-child"]
"""The worker's namespaces: its own user, network (loopback only), System V IPC (no shared memory with the
host), host name and PID namespaces; ``--mount`` is added where the jail can be built."""
_PROXY_VARS = ("http_proxy", "https_proxy", "ftp_proxy", "all_proxy", "no_proxy")


class GradingRefused(Exception):
    """The grading run would write somewhere it must not; nothing was written."""


# --------------------------------------------------------------------------- the course's exercises


def exercise_check_names() -> set[str]:
    """Every public ``check_*`` defined in :mod:`gpuformer_lib.exercises` (read from the source, no import)."""
    names = set()
    for path in (REPO_ROOT / "gpuformer_lib" / "exercises").glob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("check_"):
                names.add(node.name)
    return names


def _calls(source: str, names: set[str]) -> list[str]:
    return [name for name in re.findall(r"\b(check_\w+)\s*\(", source) if name in names]


def expected_exercises(nb: dict, names: set[str]) -> list[str]:
    """The checks the non-solution code cells of an instructor's notebook call, in order, each once."""
    found: list[str] = []
    for cell in nb["cells"]:
        if cell.get("cell_type") == "code" and not is_solution(cell):
            found += [name for name in _calls(_source(cell), names) if name not in found]
    return list(dict.fromkeys(found))  # a cell that calls one check twice (two parts of an exercise) is one column


@dataclass(frozen=True)
class Exercise:
    """One exercise of a course notebook, as the instructor's copy states it."""
    check: str
    """The check its code cell calls: the exercise's stable id."""
    number: str | None
    """As the book numbers it: ``3.1``; ``1.4a`` and ``1.4b`` for two checks of one exercise; None where no heading
    above its cell names an exercise (a course notebook always has one: a test says so)."""
    stubs: tuple[str, ...] = ()
    """The sources of the non-solution code cells that call the check: the exercise's cell in the student copy."""


_EXERCISE_LABEL = re.compile(r"^\s*(?:#{1,6}\s*Exercise\s+(\d+\.\d+)\b|\*\*(?:Exercise\s+)?(\d+\.\d+)\b)", re.I)
_HEADING = re.compile(r"^\s*#{1,6}\s")


def course_exercises(nb: dict, names: set[str]) -> list[Exercise]:
    """The exercises of an instructor's notebook (those of :func:`expected_exercises`, in order), each with its
    number: that of the nearest exercise label above its first non-solution code cell, where a label is a markdown
    heading ``### Exercise 3.1: ...`` or a paragraph opening with ``**13.2 ...**`` (in a markdown cell, or in a
    prose cell's text: ``viz.prose``), and any other heading in between ends the exercise (no number). A cell that
    calls several checks gives each a letter, in the order the cell calls them (``1.4a``, ``1.4b``)."""
    numbers: dict[str, str | None] = {}
    stubs: dict[str, list[str]] = {}
    current: str | None = None
    for cell in nb["cells"]:
        source = _source(cell)
        prose = "prose" in cell.get("metadata", {}).get("tags", [])
        if cell.get("cell_type") == "markdown" or prose:
            for line in source.splitlines():
                label = _EXERCISE_LABEL.match(line)
                if label:
                    current = label.group(1) or label.group(2)
                elif _HEADING.match(line):
                    current = None
        elif cell.get("cell_type") == "code" and not is_solution(cell):
            checks = list(dict.fromkeys(_calls(source, names)))
            for part, check in enumerate(checks):
                stubs.setdefault(check, []).append(source)
                if check not in numbers:
                    letter = "abcdefghijklmnopqrstuvwxyz"[part] if len(checks) > 1 and part < 26 else ""
                    numbers[check] = f"{current}{letter}" if current else None
    return [Exercise(check, numbers[check], tuple(stubs[check])) for check in expected_exercises(nb, names)]


def column_name(notebook: str, check: str, number: str | None) -> str:
    """``03:3.1:check_causal_mask``: a ``grades.csv`` column (``03::check_x`` for an exercise without a number)."""
    return f"{chapter_of(notebook)}:{number or ''}:{check}"


def exercise_label(check: str, number: str | None) -> str:
    """``Exercise 3.1 (check_causal_mask)``: an exercise as the feedback names it (the check alone without a number)."""
    return f"Exercise {number} ({check})" if number else check


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def chapter_of(name: str) -> str:
    """``06`` for ``06_losses_and_optimizers.ipynb``; the stem for a notebook without a chapter number."""
    match = re.match(r"(\d\d)_", name)
    return match.group(1) if match else Path(name).stem


# --------------------------------------------------------------------------- the submissions


@dataclass
class Submission:
    """One submitted notebook: whose, where, which course notebook it is, and how that was decided."""
    student: str
    path: Path
    course: str | None = None
    matched_by: str = ""
    match_rank: int = 9  # 0 by metadata, 1 by file name, 2 by chapter number: the better match is graded
    problem: str | None = None  # why it cannot run (not JSON, not a notebook), if so
    cells: list[str] = field(default_factory=list)  # the code cells' sources, by cell index ('' for markdown)
    flags: list[str] = field(default_factory=list)  # cells to review by hand (:func:`suspicious`)
    kinds: list[str] = field(default_factory=list)  # each cell's type, by cell index ("code", "markdown", "raw")


def code_cell(sub: Submission, index: int) -> int:
    """The number a learner gives the cell at ``index`` (a run record's cell index, which counts every cell): its
    place among the notebook's code cells, from 1. Without ``kinds`` every cell counts."""
    kinds = sub.kinds or ["code"] * max(len(sub.cells), index + 1)
    return sum(1 for kind in kinds[:index + 1] if kind == "code")


def cell_name(sub: Submission, index: int, check: str | None = None, number: str | None = None) -> str:
    """``code cell 12, the code cell of exercise 3.1`` (the first cell of the submission that calls ``check``), else
    ``code cell 12``: a cell as the learner finds it."""
    name = f"code cell {code_cell(sub, index)}"
    if check and number:
        calls = [i for i, source in enumerate(sub.cells) if check in _calls(source, {check})]
        if calls and calls[0] == index:
            name += f", the code cell of exercise {number}"
    return name


def _learner_cells(text: str, sub: Submission) -> str:
    """A run record's sentence (``the kernel died in cell 5``, counting every cell) with each cell named as the
    learner numbers it (``code cell 3``)."""
    return re.sub(r"(?<!code )\bcell (\d+)\b",
                  lambda m: cell_name(sub, int(m.group(1)) - 1) if int(m.group(1)) > 0 else m.group(0), text)


def _unchanged_stub(source: str, stubs: tuple[str, ...] | list[str]) -> bool:
    """Whether a submitted cell is, but for trailing spaces and blank lines, one of the exercise's stubs."""
    def norm(text: str) -> str:
        return "\n".join(line.rstrip() for line in text.strip().splitlines())
    return bool(source.strip()) and norm(source) in {norm(stub) for stub in stubs}


def _student_name(raw: str) -> str:
    return re.sub(r"[^\w.@+-]+", "_", unicodedata.normalize("NFC", raw)).strip("._") or "student"


def discover(submissions: Path, skipped: list[str] | None = None) -> dict[str, list[Path]]:
    """Student name -> their notebook files, from the layout in the module docstring. Hidden entries (names
    starting with ".") are left out and appended to ``skipped``. Raises :class:`GradingRefused` when two entries
    would be the same student (``John Smith/`` and ``John_Smith/``, ``ada/`` and ``ada.ipynb``, ``Ada`` and
    ``ada``: names are compared after cleaning, NFC-normalised and case-insensitively)."""
    found: dict[str, list[Path]] = {}
    owner: dict[str, str] = {}  # the cleaned name, case-folded -> the entry that gave it
    skipped = [] if skipped is None else skipped
    for entry in sorted(submissions.iterdir()):
        if entry.name.startswith("."):
            skipped.append(entry.name)
            continue
        if entry.is_dir():
            name = _student_name(entry.name)
            files = []
            for p in sorted(entry.rglob("*.ipynb")):
                hidden = [part for part in p.relative_to(entry).parts if part.startswith(".")]
                if hidden and hidden[0] != ".ipynb_checkpoints":
                    skipped.append(str(p.relative_to(submissions)))
                elif not hidden:
                    files.append(p)
        elif entry.suffix == ".ipynb":
            name, files = _student_name(entry.stem), [entry]
        else:
            continue
        key = name.casefold()
        if key in owner:
            raise GradingRefused(f"`{owner[key]}` and `{entry.name}` in {submissions} would both be graded as the "
                                 f"student {name}: one student's grade would be lost. Rename one of them (a folder "
                                 "per student, each name different even ignoring case, spaces and punctuation), "
                                 "or put one student's notebooks in one folder")
        owner[key] = entry.name
        found[name] = files
    return found


def read_submission(student: str, path: Path, course_names: list[str]) -> Submission:
    """Read ``path`` (as JSON, never executing or changing it) and match it to a course notebook."""
    sub = Submission(student, path)
    nb = None
    try:
        size = path.stat().st_size
        if size > MAX_SUBMISSION_BYTES:
            raise ValueError(f"it holds {size / 1e6:.0f} MB, more than the {MAX_SUBMISSION_BYTES / 1e6:.0f} MB a "
                             "notebook is allowed here (clear its outputs and submit it again)")
        nb = json.loads(path.read_bytes().decode("utf-8"))
        if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
            raise ValueError("it has no list of cells")
    except (OSError, UnicodeDecodeError, ValueError) as err:
        sub.problem = f"it is not a valid notebook ({type(err).__name__}: {str(err)[:160]}), so nothing in it ran"
        nb = None
    source = ((nb or {}).get("metadata") or {}).get(STUDENT_KEY, {}) if nb else {}
    source = source.get("source") if isinstance(source, dict) else None
    by_chapter = {chapter_of(name): name for name in course_names}
    number = re.search(r"(?<!\d)(\d\d)_", path.name)
    if source in course_names:
        sub.course, sub.matched_by, sub.match_rank = source, "the metadata of the student copy", 0
    elif path.name in course_names:
        sub.course, sub.matched_by, sub.match_rank = path.name, "its file name", 1
    elif number and number.group(1) in by_chapter:
        sub.course, sub.match_rank = by_chapter[number.group(1)], 2
        sub.matched_by = f"the chapter number {number.group(1)} in its name"
    if nb is not None:
        sub.cells = [_source(c) if c.get("cell_type") == "code" else "" for c in nb["cells"] if isinstance(c, dict)]
        if len(sub.cells) != len(nb["cells"]):
            sub.problem = "some of its cells are not notebook cells, so nothing in it ran"
        sub.kinds = [str(c.get("cell_type")) for c in nb["cells"] if isinstance(c, dict)]
        sub.flags = suspicious([source if kind == "code" else None for source, kind in zip(sub.cells, sub.kinds)])
    return sub


# --------------------------------------------------------------------------- running one notebook


def netns_available() -> bool:
    """Whether this system lets an unprivileged user create the network and PID namespaces."""
    try:
        return subprocess.run([*NETNS, "true"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def filesystem_lock_available(scratch: Path) -> bool:
    """Whether a worker can build its jail (:func:`gpuformer_lib.tools.fslock.enter_jail`: a root of its own
    holding only the allowlist, read-only but for the job folder) and start a kernel there that cannot remount
    it, tried for real on a folder in ``scratch`` (:func:`gpuformer_lib.tools.fslock._probe`)."""
    probe = scratch / f".lock-probe-{uuid.uuid4().hex}"
    probe.mkdir(parents=True)
    try:
        done = subprocess.run([*NETNS, "--mount", sys.executable, "-m", "gpuformer_lib.tools.fslock", str(probe)],
                              capture_output=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        return (done.returncode == 0 and (probe / "work" / "inside").is_file()
                and not (scratch / f"{probe.name}-outside").exists())
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        shutil.rmtree(probe, ignore_errors=True)
        (scratch / f"{probe.name}-outside").unlink(missing_ok=True)


_NOT_PASSED = ("GPUFORMER_", "JUPYTER", "IPYTHON", "MPL", "TORCHINDUCTOR_", "TRITON_", "TORCH_", "PYTORCH_", "CUDA_",
               "PYTHON")
"""Prefixes of the variables a graded kernel does not inherit: the course's and the tools' settings, and the
caches and choices torch, Triton and CUDA read (torch itself sets ``TORCHINDUCTOR_CACHE_DIR`` in the grader's
process once anything there compiled: the kernel would then use a cache outside its work folder)."""


def _clean_env(home: Path) -> dict[str, str]:
    """The kernel's environment: the grader's, without proxies and :data:`_NOT_PASSED`, with ``HOME``, the
    temporary folder and every cache inside the work folder ``home``, on the CPU, one thread."""
    env = {k: v for k, v in os.environ.items() if k.lower() not in _PROXY_VARS and not k.startswith(_NOT_PASSED)}
    if os.environ.get("GPUFORMER_CHECK_TIME_LIMIT"):
        env["GPUFORMER_CHECK_TIME_LIMIT"] = os.environ["GPUFORMER_CHECK_TIME_LIMIT"]
    from gpuformer_lib.data import data_dir
    env["GPUFORMER_DATA"] = str(data_dir())  # the folder the learner's run would use, and the sandbox shows
    tmp = home / "tmp"
    env.update(HOME=str(home), TMPDIR=str(tmp), TEMP=str(tmp), TMP=str(tmp), XDG_CACHE_HOME=str(home / ".cache"),
               XDG_CONFIG_HOME=str(home / ".config"), MPLCONFIGDIR=str(home / ".config" / "matplotlib"),
               IPYTHONDIR=str(home / ".ipython"), JUPYTER_RUNTIME_DIR=str(home / ".jupyter-runtime"),
               JUPYTER_DATA_DIR=str(home / ".jupyter-data"), CUDA_VISIBLE_DEVICES="", GPUFORMER_DEVICE="cpu",
               PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg")
    env["OMP_NUM_THREADS"] = "1"  # always: with --jobs N, N notebooks share the machine
    return env


def run_notebook(sub: Submission, job_dir: Path, course_dir: Path, hidden: list[Path], cell_timeout: float,
                 notebook_timeout: float, netns: bool, lock_fs: bool = False) -> dict:
    """Run one submission in a fresh work folder under ``job_dir`` that also holds ``course_dir``'s files other
    than notebooks (what the notebooks read beside them); return its run record and check log."""
    if job_dir.exists():
        shutil.rmtree(job_dir)
    work = job_dir / "work"
    (work / "tmp").mkdir(parents=True)
    site = job_dir / "sandbox"
    site.mkdir()
    log, record_path, refused = job_dir / "checks.jsonl", job_dir / "run.json", job_dir / "refusals.jsonl"
    log.touch()
    refused.touch()
    shutil.copyfile(sub.path, work / sub.course)  # a copy: the submission itself is never run or changed
    # what the notebooks read beside them (chapter 10's recorded trace): from --course, and what that lacks (a
    # folder of student copies made before `make student` copied them) from the course's own notebooks folder
    for folder in dict.fromkeys([course_dir.resolve(), (REPO_ROOT / "notebooks").resolve()]):
        for asset in data_files(folder) if folder.is_dir() else []:
            if not (work / asset.name).exists():
                (shutil.copytree if asset.is_dir() else shutil.copy2)(asset, work / asset.name)
    (site / "sitecustomize.py").write_text(sandbox.sitecustomize_source(work, hidden, log, refused))
    env = _clean_env(work)
    marker = uuid.uuid4().hex
    from gpuformer_lib.distributed import JOB_ENV, _stop_job
    env[JOB_ENV] = marker
    kernel_env = {**env, "PYTHONPATH": str(site), "GPUFORMER_GRADE_LOG": str(log)}
    job = {"work": str(work), "notebook": sub.course, "record": str(record_path),
           "executed": str(job_dir / "executed.ipynb"), "cell_timeout": cell_timeout,
           "notebook_timeout": notebook_timeout, "kernel_env": kernel_env, "netns": netns,
           "lock_fs": bool(netns and lock_fs), "refusals": str(refused)}
    (job_dir / "job.json").write_text(json.dumps(job, indent=1))
    worker_env = {**env, "PYTHONPATH": str(REPO_ROOT)}
    isolate = [*NETNS, "--mount"] if netns and lock_fs else NETNS if netns else []
    cmd = [*isolate, sys.executable, "-m", "gpuformer_lib.tools.sandbox", str(job_dir / "job.json")]
    killed = None
    with (job_dir / "worker.log").open("wb") as worker_log:  # a file, not a pipe: the kernel's own output is unbounded
        proc = subprocess.Popen(cmd, cwd=job_dir, env=worker_env, stdout=worker_log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.wait(timeout=notebook_timeout + 60)  # the worker stops itself at the limit first
        except subprocess.TimeoutExpired:
            killed = f"the run was stopped after {notebook_timeout + 60:g} s"
        finally:
            _stop_job(proc, marker, wait_s=5)
    record = {"cells": [], "stopped": None, "kernel": "not started", "seconds": 0.0}
    if record_path.is_file():
        record = json.loads(record_path.read_text())
    if killed or (proc.returncode and not record.get("stopped")):
        with (job_dir / "worker.log").open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 2000))
            tail = f.read().decode(errors="replace").strip().splitlines()[-3:]
        record["stopped"] = killed or f"the grader's worker failed (exit code {proc.returncode}): {' / '.join(tail)}"
    record["checks"] = _read_log(log)
    record.setdefault("refusals", sandbox.refusals(record, refused) if record.get("cells") else [])
    return record


def _read_log(log: Path) -> list[dict]:
    """The checks' results, each with ``line``, its line number in the log (which cell wrote it)."""
    entries = []
    for number, line in enumerate(log.read_text(encoding="utf-8", errors="replace").splitlines()):
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a torn or foreign line counts for nothing
        if isinstance(entry, dict) and isinstance(entry.get("check"), str) and isinstance(entry.get("passed"), bool):
            entries.append({**entry, "line": number})
    return entries


# --------------------------------------------------------------------------- from the run to the statuses


def exercise_status(check: str, sub: Submission | None, record: dict | None,
                    unreadable: list[str] = (), number: str | None = None, stubs: tuple[str, ...] = ()
                    ) -> tuple[str, str]:
    """(status, what to tell the learner) for one exercise (see the module docstring); ``unreadable``: the
    student's files that were neither readable nor matched to a chapter; ``number``: the exercise's number in the
    book (cells are cited with it); ``stubs``: its code cell in the student copy (an unchanged one is not
    attempted)."""
    if sub is None and unreadable:
        return DID_NOT_RUN, f"no readable notebook for this chapter: {', '.join(unreadable)} could not be read"
    if sub is None:
        return DID_NOT_RUN, "no notebook for this chapter was submitted"
    if sub.problem:
        return DID_NOT_RUN, f"the notebook did not run: {sub.problem}"
    record = record or {"cells": [], "checks": []}

    def cell_of(entry: dict) -> int | None:  # the cell that was running when the check wrote its line
        return next((c["index"] for c in record["cells"]
                     if c.get("log_lines") and c["log_lines"][0] <= entry.get("line", -1) < c["log_lines"][1]), None)

    mine = [entry for entry in record.get("checks", []) if entry["check"] == check]
    if mine:
        last = cell_of(mine[-1])
        results = [e for e in mine if cell_of(e) == last] if last is not None else mine[-1:]
        where = f" ({cell_name(sub, last, check, number)})" if last is not None else ""
        failed = [e for e in results if not e["passed"]]
        if not failed:
            return PASSED, results[-1]["message"] + where
        hint = failed[0]["message"]
        if failed[0].get("timed_out") is True:
            return TIMED_OUT, hint + where
        untouched = last is not None and last < len(sub.cells) and _unchanged_stub(sub.cells[last], stubs)
        if untouched:
            return NOT_ATTEMPTED, f"its code cell is still the stub of the student copy. {hint}{where}"
        if len(failed) == len(results) and all(e.get("not_attempted") is True for e in failed):
            return NOT_ATTEMPTED, hint + where
        return FAILED, hint + where
    calls = [i for i, source in enumerate(sub.cells) if check in _calls(source, {check})]
    if not calls:
        return DID_NOT_RUN, (f"no cell of the submitted notebook calls {check}(...): was the exercise's cell deleted "
                             "or its check call removed?")
    ran = {c["index"]: c for c in record["cells"]}
    done = [i for i in calls if i in ran]
    if not done:
        why = _learner_cells(record.get("stopped") or "the run ended before it", sub)
        return DID_NOT_RUN, f"{cell_name(sub, calls[0], check, number)}, which calls {check}, never ran: {why}"
    cell, named = ran[done[-1]], cell_name(sub, done[-1], check, number)
    if cell["status"] == "timeout":
        return TIMED_OUT, (f"{named} ran past its time limit of {cell.get('limit_s', '?')} s and was "
                           "interrupted: an endless loop, or far too much work?")
    if cell["status"] == "error":
        return CRASHED, f"{named} raised {cell.get('ename')}: {cell.get('evalue', '')}".rstrip(": ")
    if cell["status"] == "dead":
        return CRASHED, f"the kernel died in {named} (os._exit, a crash in compiled code, or out of memory)"
    return DID_NOT_RUN, (f"{named} ran, but {check} reported no result: is the call inside a branch "
                         "that did not run, or was the check replaced?")


def run_summary(sub: Submission, record: dict | None) -> str:
    """What happened to one notebook, in a sentence or two."""
    said = f"submitted as `{sub.path.name}`, graded as `{sub.course}` (matched by {sub.matched_by})"
    if sub.problem:
        return f"{said}. Not run: {sub.problem}."
    if record is None:
        return f"{said}. Not run."
    cells = record["cells"]
    code = sum(1 for source in sub.cells if source.strip())
    parts = [f"{said}. Ran {len(cells)} of its {code} code cells in {record.get('seconds', 0):.0f} s"]
    for c in cells:
        if c["status"] == "error":
            parts.append(f"{cell_name(sub, c['index'])} raised {c.get('ename')}")
        elif c["status"] == "timeout":
            parts.append(f"{cell_name(sub, c['index'])} ran past its time limit ({c.get('limit_s')} s)")
    if record.get("stopped"):
        parts.append(f"the run ended early: {_learner_cells(record['stopped'], sub)}")
    return "; ".join(parts[:12]) + ("; ..." if len(parts) > 12 else "") + "."


def refusals(sub: Submission | None, record: dict | None) -> list[tuple[str, int]]:
    """What the sandbox refused in one run (the record's ``refusals``, each ``{"what": ..., "cell": index or
    None}``; none when the key is missing), each distinct attempt once with how many times it was made:
    ``("writing /etc/x (code cell 5)", 3)``."""
    found: dict[str, int] = {}
    listed = (record or {}).get("refusals") or []
    for refusal in listed if isinstance(listed, list) else []:
        what = refusal.get("what") if isinstance(refusal, dict) else refusal
        what = " ".join(str(what).split())[:200] or "(not said)"
        cell = refusal.get("cell") if isinstance(refusal, dict) else None
        if isinstance(cell, int) and not isinstance(cell, bool) and cell >= 0 and sub is not None:
            what += f" ({cell_name(sub, cell)})"
        found[what] = found.get(what, 0) + 1
    return list(found.items())


def _refusal_text(what: str, times: int) -> str:
    return what if times == 1 else f"{what}, {times} times"


REFUSALS_LISTED = 10
"""The refusals a ``grades.csv`` cell lists (after their count); the feedback lists them all."""


def refused_cell(refused: list[tuple[str, str, int]]) -> str:
    """A ``grades.csv`` ``refused`` cell: ``3: 01 writing /x (code cell 5); 01 starting the program mount (code
    cell 7); ...`` (how many attempts, then each distinct one with its chapter), empty when nothing was refused.
    ``refused``: (chapter, what, times) triples."""
    if not refused:
        return ""
    listed = [f"{chapter} {_refusal_text(what, times)}" for chapter, what, times in refused[:REFUSALS_LISTED]]
    more = "; ..." if len(refused) > REFUSALS_LISTED else ""
    return f"{sum(times for _, _, times in refused)}: " + "; ".join(listed) + more


# --------------------------------------------------------------------------- the whole class


def check_out_dir(out: Path, submissions: Path) -> None:
    """Raise :class:`GradingRefused` unless ``out`` may be (re)written (see the module docstring)."""
    o, s = out.resolve(), submissions.resolve()
    if o == s or s in o.parents:
        raise GradingRefused(f"the grades folder {out} is inside the submissions folder {submissions}: it would "
                             "be graded as a submission next time. Give --out a folder outside it, e.g. _build/grades")
    if o in s.parents:
        raise GradingRefused(f"the submissions folder {submissions} is inside the grades folder {out}, which is "
                             "replaced on every run: move the submissions out, or give --out another folder")
    if o in REPO_ROOT.resolve().parents or o == REPO_ROOT.resolve() or o == (REPO_ROOT / "notebooks").resolve():
        raise GradingRefused(f"{out} holds the course itself: give --out a folder of its own, e.g. _build/grades")
    if out.exists() and not out.is_dir():
        raise GradingRefused(f"{out} is a file: give --out a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise GradingRefused(f"{out} already holds files and is not a grades folder written by this command (it has "
                             f"no {MARKER}): nothing is overwritten. Give --out a new or empty folder")


def grade(submissions: Path, out: Path, course_dir: Path, notebooks: list[str] | None = None, jobs: int = 1,
          cell_timeout: float = 300, notebook_timeout: float = 1200, progress: bool = True) -> dict:
    """Grade every submission; write ``grades.csv`` and the feedback; return what was found per student."""
    if not submissions.is_dir():
        raise GradingRefused(f"no submissions folder {submissions}: give the folder that holds one folder (or one "
                             ".ipynb) per student")
    check_out_dir(out, submissions)
    course = {p.name: p for p in sorted(course_dir.glob("*.ipynb"))}
    if not course:
        raise GradingRefused(f"no course notebooks in {course_dir}: --course is the instructor's notebooks folder")
    names = exercise_check_names()
    skipped: list[str] = []
    students = discover(submissions, skipped)
    if skipped:
        print(f"grade: skipped {len(skipped)} hidden entr{'y' if len(skipped) == 1 else 'ies'} (names starting with "
              f"'.'): {', '.join(skipped[:10])}{', ...' if len(skipped) > 10 else ''}", file=sys.stderr)
    if not students:
        raise GradingRefused(f"{submissions} holds no notebooks: the layout is one folder per student with their "
                             ".ipynb files in it, or one <student>.ipynb per student")
    subs = {student: [read_submission(student, p, list(course)) for p in paths] for student, paths in students.items()}
    if notebooks:
        chosen = [_course_name(n, course) for n in notebooks]
    else:
        chosen = sorted({s.course for ss in subs.values() for s in ss if s.course})
    exercises = {name: course_exercises(json.loads(course[name].read_text(encoding="utf-8")), names)
                 for name in chosen}
    expected = {name: [exercise.check for exercise in exercises[name]] for name in chosen}
    numbers = {(name, e.check): e.number for name in chosen for e in exercises[name]}
    stubs = {(name, e.check): e.stubs for name in chosen for e in exercises[name]}
    netns = netns_available()
    if not netns:
        print("grade: warning: unshare cannot create a network namespace here, so the notebooks run WITH the "
              "machine's network; only the audit hook refuses connections. Grade untrusted work in a container "
              "without network.", file=sys.stderr)
    if out.exists():
        for old in ("work", "feedback", "grades.csv"):
            target = out / old
            shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("A grades folder written by gpuformer_lib.tools.grade; it is replaced on every run.\n")
    lock_fs = netns and filesystem_lock_available(out)
    if netns and not lock_fs:
        print("grade: warning: this system does not let the grader give each notebook a file system of its own "
              "(user and mount namespaces, pivot_root), so the notebooks can read what this user can read (the "
              "solutions in _build and other clones included) and only the audit hook keeps their writes inside "
              "their work folders (code below Python gets past it). Grade untrusted work in a container without "
              "the solutions (see the instructor's guide).", file=sys.stderr)
    hidden = [course_dir, submissions, out, REPO_ROOT]  # the hook reports reads there (the library excepted)
    plan: dict[str, dict[str, Submission]] = {}
    notes: dict[str, list[str]] = {}
    unreadable: dict[str, list[str]] = {}
    for student, ss in subs.items():
        plan[student], notes[student], unreadable[student] = {}, [], []
        for s in sorted(ss, key=lambda s: (s.match_rank, str(s.path))):
            shown = s.path.relative_to(submissions).as_posix()
            if s.course is None and s.problem:
                unreadable[student].append(s.path.name)
                notes[student].append(f"`{shown}` could not be graded: {s.problem}; nor could its chapter be "
                                      "told (no readable metadata, no course file name or chapter number in its name)")
            elif s.course is None:
                notes[student].append(f"`{shown}` is not one of the course's notebooks (no metadata, file name "
                                      "or chapter number matched): not graded")
            elif s.course not in expected:
                named = "" if s.path.name == s.course else f" ({s.course})"
                notes[student].append(f"`{shown}`{named} is not part of this assignment: not graded")
            elif s.course in plan[student]:
                kept = plan[student][s.course]
                notes[student].append(
                    f"`{kept.path.relative_to(submissions).as_posix()}` and `{shown}` are both {s.course}: "
                    f"`{kept.path.relative_to(submissions).as_posix()}` is graded (matched by {kept.matched_by}; "
                    f"`{shown}` by {s.matched_by}; a match by metadata beats one by file name, which beats one by "
                    "chapter number, and between equals the first path in alphabetical order is graded): submit "
                    "one copy per chapter")
            else:
                plan[student][s.course] = s
    runs = [(student, s) for student in plan for s in plan[student].values() if not s.problem]
    records: dict[tuple[str, str], dict] = {}

    def one(item: tuple[str, Submission]) -> tuple[tuple[str, str], dict]:
        student, s = item
        job_dir = out / "work" / student / Path(s.course).stem
        try:
            return (student, s.course), run_notebook(s, job_dir, course_dir, hidden, cell_timeout,
                                                     notebook_timeout, netns, lock_fs)
        except Exception as err:  # noqa: BLE001  whatever went wrong with this one, the others are graded
            record = {"cells": [], "checks": [], "kernel": "not started", "seconds": 0.0,
                      "stopped": f"the grader could not run it ({type(err).__name__}: {err})"}
            try:  # kept where grader_failures (the exit code) finds it
                job_dir.mkdir(parents=True, exist_ok=True)
                (job_dir / "run.json").write_text(json.dumps(record, indent=1))
            except OSError:
                pass
            return (student, s.course), record

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(one, run) for run in runs]
        for future in tqdm(concurrent.futures.as_completed(futures), total=len(runs), desc="notebooks", unit="nb",
                           disable=not progress):
            key, record = future.result()
            records[key] = record
    columns = [(name, check) for name in chosen for check in expected[name]]
    results = {student: {(name, check): exercise_status(check, plan[student].get(name),
                                                        records.get((student, name)), unreadable[student],
                                                        numbers[(name, check)], stubs[(name, check)])
                         for name, check in columns} for student in plan}
    flags = {student: [f"{chapter_of(name)} {flag}" for name, s in sorted(plan[student].items()) for flag in s.flags]
             for student in plan}
    refused = {student: [(chapter_of(name), what, times) for name, s in sorted(plan[student].items())
                         for what, times in refusals(s, records.get((student, name)))] for student in plan}
    _write_csv(out / "grades.csv", columns, results, flags, numbers, refused)
    (out / "feedback").mkdir(exist_ok=True)
    for student in plan:
        _write_feedback(out / "feedback" / f"{student}.md", student, chosen, expected, plan[student], records,
                        results[student], notes[student], flags[student], numbers)
    return results


def _course_name(given: str, course: dict[str, Path]) -> str:
    name = Path(given).name
    if name in course:
        return name
    matches = [n for n in course if chapter_of(n) == given.zfill(2)]
    if len(matches) != 1:
        raise GradingRefused(f"--notebooks {given}: not a course notebook; give a file name from the course "
                             f"({', '.join(list(course)[:3])}, ...) or a chapter number (6 or 06)")
    return matches[0]


def _write_csv(path: Path, columns: list[tuple[str, str]], results: dict, flags: dict[str, list[str]],
               numbers: dict | None = None, refused: dict | None = None) -> None:
    """One row per student: a column per exercise (:func:`column_name`; ``numbers``: (notebook, check) -> the
    exercise's number), ``total``, ``out_of``, ``flags`` (the cells to review by hand before trusting the row) and
    ``refused`` (:func:`refused_cell`; ``refused``: student -> (chapter, what, times) triples); empty: none."""
    numbers, refused = numbers or {}, refused or {}
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student", *(column_name(name, check, numbers.get((name, check))) for name, check in columns),
                         "total", "out_of", "flags", "refused"])
        for student in sorted(results):
            statuses = [results[student][col][0] for col in columns]
            writer.writerow([student, *statuses, statuses.count(PASSED), len(columns), "; ".join(flags[student]),
                             refused_cell(refused.get(student, []))])


def _write_feedback(path: Path, student: str, chosen: list[str], expected: dict, subs: dict, records: dict,
                    results: dict, notes: list[str], flags: list[str] = (), numbers: dict | None = None) -> None:
    """One student's feedback: the total, what to review by hand, what the sandbox refused, then per notebook what
    happened to it and each exercise (``numbers``: (notebook, check) -> its number in the book)."""
    numbers = numbers or {}
    passed = sum(1 for status, _ in results.values() if status == PASSED)
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# Feedback for {student}", "",
             f"Graded {when}: **{passed} of {len(results)} exercises passed.** An exercise's grade is its last "
             "result: what its check reported the last time a cell calling it ran.", ""]
    if flags:
        lines += [f"- **Review by hand** before trusting this grade: these cells touch the grading machinery or run "
                  f"code in ways that can forge a result or get past the sandbox (chapter, cell, what): "
                  f"{'; '.join(flags)}.", ""]
    lines += [f"- Note: {note}." for note in notes]
    refused = [(name, what, times) for name in chosen if subs.get(name)
               for what, times in refusals(subs[name], records.get((student, name)))]
    if refused:
        lines += ["", "## Refused by the sandbox", "",
                  f"{sum(t for _, _, t in refused)} attempt(s) to reach outside the notebook's work folder were "
                  "refused (nothing of it happened; the grade is what the checks reported). Worth a look: an "
                  "accident (a path outside the work folder, a download), or an attempt on the grading.", ""]
        lines += [f"- {name}: {_refusal_text(what, times)}" for name, what, times in refused]
    for name in chosen:
        sub = subs.get(name)
        lines += ["", f"## {name}", ""]
        lines.append(run_summary(sub, records.get((student, name))) if sub else "Not submitted.")
        lines.append("")
        for check in expected[name]:
            status, hint = results[(name, check)]
            lines.append(f"- {exercise_label(check, numbers.get((name, check)))}: {status}. {hint}".rstrip())
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


GRADER_FAILURES = ("the grader's worker failed", "the grader could not run it", "the run failed: ")
"""How a run record's ``stopped`` begins when the grader, not the student's code, failed (exit code 1)."""


def grader_failures(out: Path) -> list[str]:
    """``student/notebook: why`` for each run in ``out/work`` that failed for the grader's own reasons."""
    found = []
    for record_path in sorted((out / "work").glob("*/*/run.json")):
        stopped = json.loads(record_path.read_text()).get("stopped") or ""
        if stopped.startswith(GRADER_FAILURES):
            found.append(f"{record_path.parent.parent.name}/{record_path.parent.name}: {stopped[:200]}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Exit codes: 0 every notebook was graded (whatever the grades); 1 grades written, but some "
               "notebook could not be run for the grader's or the machine's reasons (see the message and "
               "OUT/work/<student>/<notebook>/worker.log); 2 refused, nothing written (a bad folder or option).")
    parser.add_argument("submissions", type=Path, help="one folder (or one .ipynb) per student")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "_build" / "grades",
                        help="grades folder: grades.csv, feedback/, work/ (default _build/grades)")
    parser.add_argument("--course", type=Path, default=REPO_ROOT / "notebooks",
                        help="the instructor's notebooks, with solutions (default: the course's notebooks/)")
    parser.add_argument("--notebooks", nargs="*", help="the assignment: course notebook names or chapter numbers "
                                                       "(default: every course notebook some student submitted)")
    parser.add_argument("--jobs", type=int, default=1, help="notebooks run at once (default 1)")
    parser.add_argument("--cell-timeout", type=float, default=300, help="seconds per cell (default 300)")
    parser.add_argument("--notebook-timeout", type=float, default=1200, help="seconds per notebook (default 1200)")
    args = parser.parse_args(argv)
    for name in ("jobs", "cell_timeout", "notebook_timeout"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    start = time.perf_counter()
    try:
        results = grade(args.submissions, args.out, args.course, args.notebooks, args.jobs, args.cell_timeout,
                        args.notebook_timeout)
    except GradingRefused as err:
        print(f"grade: refused, nothing written: {err}", file=sys.stderr)
        return 2
    counts = {status: sum(1 for r in results.values() for s, _ in r.values() if s == status) for status in STATUSES}
    print(f"graded {len(results)} student(s) in {time.perf_counter() - start:.0f} s: "
          + ", ".join(f"{n} {status}" for status, n in counts.items() if n))
    print(f"wrote {args.out / 'grades.csv'} and {args.out / 'feedback'}/<student>.md")
    failures = grader_failures(args.out)
    if failures:
        print(f"grade: {len(failures)} notebook(s) could not be graded for a reason that is the grader's or the "
              f"machine's, not the student's (exit code 1): {'; '.join(failures[:5])}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
