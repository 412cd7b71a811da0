"""Grade a class's submitted notebooks in one command: ``make grade SUBMISSIONS=dir [OUT=dir]``.

    python -m gpuformer_lib.tools.grade SUBMISSIONS [--out _build/grades] [--jobs 2] [--notebooks 06 09]

**The layout.** ``SUBMISSIONS`` holds one folder per student, named after the student, with their notebooks
in it (subfolders are searched too; ``.ipynb_checkpoints`` and hidden files are skipped), and/or flat
notebook files ``<student>.ipynb`` (one notebook per student). A submission is matched to its course
notebook by the student copy's metadata (``gpuformer_student.source``, written by ``make student``), else by
its file name, else by a chapter number in its name (``Copy of 06_losses (2).ipynb``), so a renamed notebook
is still graded. The exercises of a course notebook are the ``check_*`` functions of
:mod:`gpuformer_lib.exercises` that its non-solution cells call, read from the instructor's copy
(``--course``, default the course's ``notebooks/``); a column is ``<chapter>:<check name>``. The notebooks
graded are those given with ``--notebooks`` (file names or chapter numbers), else every course notebook that
some submission matched; a student without one gets "did not run" for its exercises.

**How a notebook runs.** Each notebook runs in its own process (:mod:`gpuformer_lib.tools.sandbox`) on a
copy in a fresh work folder (the submission is never opened for writing; the course folder's other files,
such as recorded traces, are copied beside it), with a time limit per cell and per
notebook, on the CPU (``CUDA_VISIBLE_DEVICES`` empty, ``GPUFORMER_DEVICE=cpu``), with ``GPUFORMER_DATA``
passed, proxy variables cleared, ``HOME`` and ``TMPDIR`` inside the work folder, in a network namespace with
no network (``unshare``; where that is not allowed, a warning, and only the audit hook stands in), and under
the sandbox's audit hook (what it refuses and what it cannot stop: see :mod:`gpuformer_lib.tools.sandbox`).
Every check reports its result through the grading side channel (``GPUFORMER_GRADE_LOG``, see
:mod:`gpuformer_lib.exercises._core`), so nothing printed is parsed.

**The statuses.** Per exercise: ``passed``; ``failed`` (with the check's hint); ``timed out`` (the check said
the learner's function did not return in time, or the cell calling it ran past the cell time limit); ``crashed``
(the cell calling the check raised, ``sys.exit`` included, or the kernel died in it); ``did not run`` (no cell
of the submission calls the check, the cell never ran because the run ended before it, or it ran without the
check reporting). Which cell calls which check is read from the submitted notebook's own cells, never from cell
positions, and each result is attributed to the cell that was running when the check wrote it. **The grade of an
exercise is its last result**: the results its check reported in the last cell that called it (one cell may call
a check twice: it passes only if every call in that cell passed). ``total`` counts the passed exercises.

**What it writes.** ``OUT/grades.csv`` (one row per student), ``OUT/feedback/<student>.md`` (each exercise's
status and hint, and what happened to each notebook), and ``OUT/work/<student>/`` (each notebook's work folder,
its executed copy, check log, run record and the worker's log). It refuses an ``OUT`` inside the submissions
folder (or holding it), and an existing ``OUT`` that is not a grades folder it wrote (it marks its own with
``.gpuformer_grades``); a grades folder of its own is replaced. One broken or malicious submission cannot stop
the others: each runs in its own process under its own limits, and whatever happens is reported.
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
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from gpuformer_lib.tools import sandbox
from gpuformer_lib.tools.notebooks import REPO_ROOT, notebook_paths
from gpuformer_lib.tools.student import SOLUTION_TAG, STUDENT_KEY

PASSED, FAILED, TIMED_OUT, CRASHED, DID_NOT_RUN = "passed", "failed", "timed out", "crashed", "did not run"
STATUSES = (PASSED, FAILED, TIMED_OUT, CRASHED, DID_NOT_RUN)
MARKER = ".gpuformer_grades"
"""File that marks a folder as one ``make grade`` wrote (and may replace)."""

NETNS = ["unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child"]
_PROXY_VARS = ("http_proxy", "https_proxy", "ftp_proxy", "all_proxy", "no_proxy")
_TIMED_OUT_HINT = "did not return within"  # what a check's hint says when the learner's code ran out of time


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
        if cell.get("cell_type") == "code" and SOLUTION_TAG not in cell.get("metadata", {}).get("tags", []):
            found += [name for name in _calls(_source(cell), names) if name not in found]
    return found


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
    problem: str | None = None  # why it cannot run (not JSON, not a notebook), if so
    cells: list[str] = field(default_factory=list)  # the code cells' sources, by cell index ('' for markdown)


def _student_name(raw: str) -> str:
    return re.sub(r"[^\w.@+-]+", "_", raw).strip("._") or "student"


def discover(submissions: Path) -> dict[str, list[Path]]:
    """Student name -> their notebook files, from the layout in the module docstring."""
    found: dict[str, list[Path]] = {}
    for entry in sorted(submissions.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            files = sorted(p for p in entry.rglob("*.ipynb") if not any(
                part.startswith(".") for part in p.relative_to(entry).parts))
            found.setdefault(_student_name(entry.name), []).extend(files)
        elif entry.suffix == ".ipynb":
            found.setdefault(_student_name(entry.stem), []).append(entry)
    return found


def read_submission(student: str, path: Path, course_names: list[str]) -> Submission:
    """Read ``path`` (as JSON, never executing or changing it) and match it to a course notebook."""
    sub = Submission(student, path)
    nb = None
    try:
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
        sub.course, sub.matched_by = source, "the metadata of the student copy"
    elif path.name in course_names:
        sub.course, sub.matched_by = path.name, "its file name"
    elif number and number.group(1) in by_chapter:
        sub.course, sub.matched_by = by_chapter[number.group(1)], f"the chapter number {number.group(1)} in its name"
    if nb is not None:
        sub.cells = [_source(c) if c.get("cell_type") == "code" else "" for c in nb["cells"] if isinstance(c, dict)]
        if len(sub.cells) != len(nb["cells"]):
            sub.problem = "some of its cells are not notebook cells, so nothing in it ran"
    return sub


# --------------------------------------------------------------------------- running one notebook


def netns_available() -> bool:
    """Whether this system lets an unprivileged user create the network and PID namespaces."""
    try:
        return subprocess.run([*NETNS, "true"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.lower() not in _PROXY_VARS
           and not k.startswith(("GPUFORMER_", "JUPYTER", "IPYTHON", "MPL")) and k != "PYTHONPATH"}
    for name in ("GPUFORMER_DATA", "GPUFORMER_CHECK_TIME_LIMIT"):
        if os.environ.get(name):
            env[name] = os.environ[name]
    tmp = home / "tmp"
    env.update(HOME=str(home), TMPDIR=str(tmp), TEMP=str(tmp), TMP=str(tmp), XDG_CACHE_HOME=str(home / ".cache"),
               XDG_CONFIG_HOME=str(home / ".config"), MPLCONFIGDIR=str(home / ".config" / "matplotlib"),
               IPYTHONDIR=str(home / ".ipython"), JUPYTER_RUNTIME_DIR=str(home / ".jupyter-runtime"),
               JUPYTER_DATA_DIR=str(home / ".jupyter-data"), CUDA_VISIBLE_DEVICES="", GPUFORMER_DEVICE="cpu",
               PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_notebook(sub: Submission, job_dir: Path, course_dir: Path, hidden: list[Path], cell_timeout: float,
                 notebook_timeout: float, netns: bool) -> dict:
    """Run one submission in a fresh work folder under ``job_dir`` that also holds ``course_dir``'s files other
    than notebooks (what the notebooks read beside them); return its run record and check log."""
    if job_dir.exists():
        shutil.rmtree(job_dir)
    work = job_dir / "work"
    (work / "tmp").mkdir(parents=True)
    site = job_dir / "sandbox"
    site.mkdir()
    log, record_path = job_dir / "checks.jsonl", job_dir / "run.json"
    log.touch()
    shutil.copyfile(sub.path, work / sub.course)  # a copy: the submission itself is never run or changed
    for asset in course_dir.iterdir():  # what the notebooks read beside them (chapter 10's recorded trace)
        if asset.suffix != ".ipynb" and not asset.name.startswith("."):
            (shutil.copytree if asset.is_dir() else shutil.copy2)(asset, work / asset.name)
    (site / "sitecustomize.py").write_text(sandbox.sitecustomize_source(work, hidden, log))
    env = _clean_env(work)
    marker = uuid.uuid4().hex
    from gpuformer_lib.distributed import JOB_ENV, _stop_job
    env[JOB_ENV] = marker
    kernel_env = {**env, "PYTHONPATH": str(site), "GPUFORMER_GRADE_LOG": str(log)}
    job = {"work": str(work), "notebook": sub.course, "record": str(record_path),
           "executed": str(job_dir / "executed.ipynb"), "cell_timeout": cell_timeout,
           "notebook_timeout": notebook_timeout, "kernel_env": kernel_env, "netns": netns}
    (job_dir / "job.json").write_text(json.dumps(job, indent=1))
    worker_env = {**env, "PYTHONPATH": str(REPO_ROOT)}
    cmd = [*(NETNS if netns else []), sys.executable, "-m", "gpuformer_lib.tools.sandbox", str(job_dir / "job.json")]
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
                    unreadable: list[str] = ()) -> tuple[str, str]:
    """(status, what to tell the learner) for one exercise (see the module docstring); ``unreadable``: the
    student's files that were neither readable nor matched to a chapter."""
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
        where = f" (cell {last + 1})" if last is not None else ""
        failed = [e for e in results if not e["passed"]]
        if not failed:
            return PASSED, results[-1]["message"] + where
        hint = failed[0]["message"]
        return (TIMED_OUT if _TIMED_OUT_HINT in hint else FAILED), hint + where
    calls = [i for i, source in enumerate(sub.cells) if check in _calls(source, {check})]
    if not calls:
        return DID_NOT_RUN, (f"no cell of the submitted notebook calls {check}(...): was the exercise's cell deleted "
                             "or its check call removed?")
    ran = {c["index"]: c for c in record["cells"]}
    done = [i for i in calls if i in ran]
    if not done:
        why = record.get("stopped") or "the run ended before it"
        return DID_NOT_RUN, f"cell {calls[0] + 1}, which calls {check}, never ran: {why}"
    cell = ran[done[-1]]
    if cell["status"] == "timeout":
        return TIMED_OUT, (f"cell {done[-1] + 1} ran past its time limit of {cell.get('limit_s', '?')} s and was "
                           "interrupted: an endless loop, or far too much work?")
    if cell["status"] == "error":
        return CRASHED, f"cell {done[-1] + 1} raised {cell.get('ename')}: {cell.get('evalue', '')}".rstrip(": ")
    if cell["status"] == "dead":
        return CRASHED, (f"the kernel died in cell {done[-1] + 1} (os._exit, a crash in compiled code, or out of "
                         "memory)")
    return DID_NOT_RUN, (f"cell {done[-1] + 1} ran, but {check} reported no result: is the call inside a branch "
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
            parts.append(f"cell {c['index'] + 1} raised {c.get('ename')}")
        elif c["status"] == "timeout":
            parts.append(f"cell {c['index'] + 1} ran past its time limit ({c.get('limit_s')} s)")
    if record.get("stopped"):
        parts.append(f"the run ended early: {record['stopped']}")
    return "; ".join(parts[:12]) + ("; ..." if len(parts) > 12 else "") + "."


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
    students = discover(submissions)
    if not students:
        raise GradingRefused(f"{submissions} holds no notebooks: the layout is one folder per student with their "
                             ".ipynb files in it, or one <student>.ipynb per student")
    subs = {student: [read_submission(student, p, list(course)) for p in paths] for student, paths in students.items()}
    if notebooks:
        chosen = [_course_name(n, course) for n in notebooks]
    else:
        chosen = sorted({s.course for ss in subs.values() for s in ss if s.course})
    expected = {name: expected_exercises(json.loads(course[name].read_text(encoding="utf-8")), names)
                for name in chosen}
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
    hidden = [course_dir, submissions, out, REPO_ROOT / "notebooks"]
    plan: dict[str, dict[str, Submission]] = {}
    notes: dict[str, list[str]] = {}
    unreadable: dict[str, list[str]] = {}
    for student, ss in subs.items():
        plan[student], notes[student], unreadable[student] = {}, [], []
        for s in sorted(ss, key=lambda s: (s.path.stat().st_mtime, str(s.path))):
            if s.course is None and s.problem:
                unreadable[student].append(s.path.name)
                notes[student].append(f"`{s.path.name}` could not be graded: {s.problem}; nor could its chapter be "
                                      "told (no readable metadata, no course file name or chapter number in its name)")
            elif s.course is None:
                notes[student].append(f"`{s.path.name}` is not one of the course's notebooks (no metadata, file name "
                                      "or chapter number matched): not graded")
            elif s.course not in expected:
                named = "" if s.path.name == s.course else f" ({s.course})"
                notes[student].append(f"`{s.path.name}`{named} is not part of this assignment: not graded")
            else:
                if s.course in plan[student]:
                    notes[student].append(f"`{plan[student][s.course].path.name}` and `{s.path.name}` are both "
                                          f"{s.course}: the newer one, `{s.path.name}`, is graded")
                plan[student][s.course] = s
    runs = [(student, s) for student in plan for s in plan[student].values() if not s.problem]
    records: dict[tuple[str, str], dict] = {}

    def one(item: tuple[str, Submission]) -> tuple[tuple[str, str], dict]:
        student, s = item
        job_dir = out / "work" / student / Path(s.course).stem
        try:
            return (student, s.course), run_notebook(s, job_dir, course_dir, hidden, cell_timeout,
                                                           notebook_timeout, netns)
        except Exception as err:  # noqa: BLE001  whatever went wrong with this one, the others are graded
            return (student, s.course), {"cells": [], "checks": [], "kernel": "not started", "seconds": 0.0,
                                         "stopped": f"the grader could not run it ({type(err).__name__}: {err})"}

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(one, run) for run in runs]
        for future in tqdm(concurrent.futures.as_completed(futures), total=len(runs), desc="notebooks", unit="nb",
                           disable=not progress):
            key, record = future.result()
            records[key] = record
    columns = [(name, check) for name in chosen for check in expected[name]]
    results = {student: {(name, check): exercise_status(check, plan[student].get(name),
                                                        records.get((student, name)), unreadable[student])
                         for name, check in columns} for student in plan}
    _write_csv(out / "grades.csv", columns, results)
    (out / "feedback").mkdir(exist_ok=True)
    for student in plan:
        _write_feedback(out / "feedback" / f"{student}.md", student, chosen, expected, plan[student], records,
                        results[student], notes[student])
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


def _write_csv(path: Path, columns: list[tuple[str, str]], results: dict) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student", *(f"{chapter_of(name)}:{check}" for name, check in columns), "total", "out_of"])
        for student in sorted(results):
            statuses = [results[student][col][0] for col in columns]
            writer.writerow([student, *statuses, statuses.count(PASSED), len(columns)])


def _write_feedback(path: Path, student: str, chosen: list[str], expected: dict, subs: dict, records: dict,
                    results: dict, notes: list[str]) -> None:
    passed = sum(1 for status, _ in results.values() if status == PASSED)
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# Feedback for {student}", "",
             f"Graded {when}: **{passed} of {len(results)} exercises passed.** An exercise's grade is its last "
             "result: what its check reported the last time a cell calling it ran.", ""]
    lines += [f"- Note: {note}." for note in notes]
    for name in chosen:
        sub = subs.get(name)
        lines += ["", f"## {name}", ""]
        lines.append(run_summary(sub, records.get((student, name))) if sub else "Not submitted.")
        lines.append("")
        for check in expected[name]:
            status, hint = results[(name, check)]
            lines.append(f"- **{check}**: {status}. {hint}".rstrip())
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
