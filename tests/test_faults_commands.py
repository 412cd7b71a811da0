"""Fault injection for the commands and the launcher: a wrong first argument, a file that is not a
notebook, a crash mid-write, a hung rank, a failing rank, Ctrl-C while waiting (gpuformer issue 14).

The launcher's tests start real torchrun jobs of a tiny worker (no torch import in the ranks) on two
gloo processes; each takes a few seconds and kills whatever it finds left behind, so a failure here
never leaves sleeping processes on the machine. Those that check which rank a failure is blamed on run a
worker whose ranks wait in real gloo collectives.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from gpuformer_lib import distributed as D
from gpuformer_lib import rank_ends
from gpuformer_lib.tools import execute, student
from gpuformer_lib.tools.notebooks import REPO_ROOT, NotANotebookError, write_notebook_atomically

# --------------------------------------------------------------------------- student copies


def course(root: Path) -> list[Path]:
    """A small course in ``root``: notebooks/01_a.ipynb and 02_b.ipynb, each with a solution cell and outputs."""
    (root / "notebooks").mkdir()
    paths = []
    for name in ("01_a", "02_b"):
        solution = new_code_cell("answer = 42", metadata={"tags": ["solution"]})
        stub = new_code_cell("answer = None", execution_count=1,
                             outputs=[nbformat.v4.new_output("stream", name="stdout", text="x\n")])
        path = root / "notebooks" / f"{name}.ipynb"
        nbformat.write(new_notebook(cells=[new_markdown_cell("# Exercise"), stub, solution]), path)
        paths.append(path)
    return paths


@pytest.fixture
def fake_course(tmp_path, monkeypatch):
    """The course's notebooks as the student command sees them, in tmp_path (which is the working folder)."""
    paths = course(tmp_path)
    monkeypatch.setattr(student, "REPO_ROOT", tmp_path)
    monkeypatch.chdir(tmp_path)
    return paths


def snapshot(paths):
    return {path: path.read_bytes() for path in paths}


@pytest.mark.parametrize("out", ["notebooks", "./notebooks", "notebooks/../notebooks", "link"])
def test_student_with_the_notebooks_folder_as_its_only_argument_writes_nothing(fake_course, tmp_path, capsys, out):
    """The reviewer's finding: `student notebooks` wrote the stripped copies over the course's notebooks."""
    (tmp_path / "link").symlink_to(tmp_path / "notebooks")
    before = snapshot(fake_course)
    assert student.main([out]) != 0
    assert snapshot(fake_course) == before
    err = capsys.readouterr().err
    assert "would overwrite the notebook" in err and "_build/student" in err


def test_student_refuses_an_input_given_twice_or_named_in_the_output_folder(fake_course, tmp_path):
    before = snapshot(fake_course)
    assert student.main(["notebooks", "notebooks/01_a.ipynb"]) != 0  # an input, not a course default
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "01_a.ipynb").symlink_to(fake_course[0])  # a link in the output folder to a course notebook
    assert student.main(["out"]) != 0
    assert snapshot(fake_course) == before


def test_student_writes_copies_and_rewrites_only_its_own_unedited_ones(fake_course, tmp_path, capsys):
    assert student.main(["_build/student"]) == 0
    out = tmp_path / "_build" / "student"
    copy = nbformat.read(out / "01_a.ipynb", as_version=4)
    assert [c.source for c in copy.cells] == ["# Exercise", "answer = None"] and copy.cells[1].outputs == []
    assert student.main(["_build/student"]) == 0  # again: its own copies, unedited
    copy.cells[1].source = "answer = 41  # a learner's attempt"
    nbformat.write(copy, out / "01_a.ipynb")
    edited = (out / "01_a.ipynb").read_bytes()
    capsys.readouterr()
    assert student.main(["_build/student"]) != 0
    assert "01_a.ipynb" in capsys.readouterr().err and (out / "01_a.ipynb").read_bytes() == edited
    assert student.main(["_build/student", "--force"]) == 0
    rewritten = nbformat.read(out / "01_a.ipynb", as_version=4)
    assert [c.source for c in rewritten.cells] == ["# Exercise", "answer = None"]  # the attempt is gone


def test_student_never_overwrites_a_notebook_with_solutions_even_with_force(fake_course, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    original = elsewhere / "01_a.ipynb"
    original.write_bytes(fake_course[0].read_bytes())  # a second checkout's notebook, solutions included
    before = original.read_bytes()
    assert student.main(["elsewhere", "--force"]) != 0
    assert original.read_bytes() == before
    foreign = tmp_path / "other"
    foreign.mkdir()
    nbformat.write(new_notebook(cells=[new_code_cell("mine = 1")]), foreign / "notes.ipynb")
    assert student.main(["other"]) != 0  # a folder of someone's notebooks: refused without --force
    assert not (foreign / "01_a.ipynb").exists()


def test_student_refuses_a_file_that_is_not_a_notebook(fake_course, tmp_path, capsys):
    (tmp_path / "notes.ipynb").write_text("not json")
    assert student.main(["out", "notes.ipynb"]) != 0
    assert "cannot be read as a Jupyter notebook" in capsys.readouterr().err
    assert student.main(["out", "missing.ipynb"]) != 0
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_clean_removes_the_build_outputs_and_keeps_the_student_copies(tmp_path):
    """The instructor guide has learners work in _build/student: `make clean` (which was `rm -rf _build`) must not
    delete their answers. The real recipe, run by make in a copy of the Makefile beside a fake _build."""
    shutil.copyfile(REPO_ROOT / "Makefile", tmp_path / "Makefile")
    build = tmp_path / "_build"
    for output in ("html/index.html", "jupyter_execute/01_a.ipynb", ".doctrees/environment.pickle", "grades/grades.csv",
                   "stray.txt"):
        (build / output).parent.mkdir(parents=True, exist_ok=True)
        (build / output).write_text("built")
    answers = build / "student" / "01_a.ipynb"
    (build / "student" / "traces").mkdir(parents=True)
    answers.write_text("the learner's answers")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # under `make test`

    def clean():
        return subprocess.run(["make", "--no-print-directory", "clean"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)

    done = clean()
    assert done.returncode == 0, done.stderr
    assert [p.name for p in build.iterdir()] == ["student"]
    assert answers.read_text() == "the learner's answers" and (build / "student" / "traces").is_dir()
    shutil.rmtree(build)
    done = clean()  # nothing to clean is not an error
    assert done.returncode == 0 and not build.exists(), done.stderr


# --------------------------------------------------------------------------- executing notebooks


def test_a_crash_while_writing_a_notebook_leaves_the_old_one(tmp_path, monkeypatch):
    path = tmp_path / "nb.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("x = 1")]), path)
    before = path.read_bytes()
    real_write = nbformat.write

    def write_half_then_die(nb, f, *args, **kwargs):
        f.write('{"cells": [')  # half a notebook on disk, then the process is interrupted
        raise KeyboardInterrupt

    monkeypatch.setattr(nbformat, "write", write_half_then_die)
    with pytest.raises(KeyboardInterrupt):
        write_notebook_atomically(new_notebook(cells=[new_code_cell("x = 2")]), path)
    monkeypatch.setattr(nbformat, "write", real_write)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["nb.ipynb"]


class FakeClient:
    """A NotebookClient stand-in: runs no kernel; ``fail`` is what its execute raises, ``during`` what it does."""

    fail: BaseException | None = None
    during = staticmethod(lambda: None)

    def __init__(self, nb, **kwargs):
        self.nb = nb

    def execute(self):
        FakeClient.during()
        if FakeClient.fail is not None:
            raise FakeClient.fail
        self.nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="ran\n")]


@pytest.fixture
def fake_kernel(monkeypatch):
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    monkeypatch.setattr(execute, "NotebookClient", FakeClient)
    monkeypatch.setattr(execute, "_describe_in_subprocess", lambda: ({"device": "cpu", "gpu_name": None}, "tiny"))
    monkeypatch.delenv("GPUFORMER_REHEARSE", raising=False)
    monkeypatch.setattr(FakeClient, "fail", None)
    monkeypatch.setattr(FakeClient, "during", staticmethod(lambda: None))
    return CellTimeoutError, DeadKernelError


def test_execute_goes_on_past_a_timeout_or_a_dead_kernel_and_leaves_those_notebooks(tmp_path, fake_kernel):
    """Before: a cell timeout or a dead kernel stopped `make outputs` with a traceback, the rest not run."""
    for failure in (fake_kernel[0]("cell timed out"), fake_kernel[1]("kernel died")):
        first, second = tmp_path / "a.ipynb", tmp_path / "b.ipynb"
        for path in (first, second):
            nbformat.write(new_notebook(cells=[new_code_cell("print(1)")]), path)
        before = first.read_bytes()
        runs = []

        def fail_first(failure=failure):
            runs.append(1)
            FakeClient.fail = failure if len(runs) == 1 else None

        FakeClient.during = staticmethod(fail_first)
        assert execute.main([str(first), str(second)]) == 1
        assert first.read_bytes() == before and "ran" in second.read_text()


def test_execute_keeps_an_edit_saved_while_the_notebook_ran(tmp_path, fake_kernel):
    path = tmp_path / "a.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("print(1)")]), path)
    edited = new_notebook(cells=[new_code_cell("print('my edit')")])
    FakeClient.during = staticmethod(lambda: nbformat.write(edited, path))
    assert execute.main([str(path)]) == 1
    assert "my edit" in path.read_text() and "ran" not in path.read_text()


def test_execute_refuses_what_is_not_a_notebook_before_running_any(tmp_path, fake_kernel, capsys):
    good = tmp_path / "a.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("print(1)")]), good)
    before = good.read_bytes()
    for bad, says in ((tmp_path / "b.ipynb", "cannot be read as a Jupyter notebook"),
                      (tmp_path / "script.py", "is not a notebook"), (tmp_path / "missing.ipynb", "no such notebook")):
        if bad.name != "missing.ipynb":
            bad.write_text("print(1)\n")
        with pytest.raises(SystemExit) as exit_info:
            execute.main([str(good), str(bad)])
        assert exit_info.value.code == 2 and says in capsys.readouterr().err
    assert good.read_bytes() == before  # refused before the first notebook ran
    with pytest.raises(NotANotebookError):
        student.read_notebook(tmp_path / "b.ipynb")


def test_the_ladder_refuses_to_write_its_results_over_a_notebook(tmp_path, capsys):
    """`--json` replaces the file it names: a notebook (or a folder) named there by mistake is refused at once."""
    from gpuformer_lib import ladder

    notebook = tmp_path / "01_a.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("x = 1")]), notebook)
    before = notebook.read_bytes()
    for target in (notebook, tmp_path):
        with pytest.raises(SystemExit) as exit_info:
            ladder.main(["--device", "cpu", "--preset", "tiny", "--steps", "1", "--warmup", "1",
                         "--skip", ",".join(ladder.RUNG_KEYS), "--json", str(target)])
        assert exit_info.value.code == 2 and "ending in .json" in capsys.readouterr().err
    assert notebook.read_bytes() == before


# --------------------------------------------------------------------------- the launcher

WORKER = textwrap.dedent('''
    """Rank 1 starts a child in a session of its own (a stuck helper process) and sleeps; rank 0 waits for it,
    then fails (``fail``) or returns (``hang``). Each rank writes its pids and the job's marker first."""
    import os, subprocess, sys, time
    from pathlib import Path

    out, mode, rank = Path(sys.argv[1]), sys.argv[2], int(os.environ["RANK"])
    pids = [os.getpid()]
    if rank == 1:
        pids.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)"],
                                     start_new_session=True).pid)
    tmp = out / f"rank{rank}.tmp"
    tmp.write_text(os.environ.get("GPUFORMER_JOB", "") + "\\n" + " ".join(map(str, pids)))
    os.replace(tmp, out / f"rank{rank}.pids")
    print("ready", flush=True)
    if rank == 0:
        deadline = time.time() + 60
        while not (out / "rank1.pids").exists() and time.time() < deadline:
            time.sleep(0.05)
        if mode == "fail":
            raise RuntimeError("rank 0 failed on purpose")
    else:
        time.sleep(1000)
''')


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its new parent, does not count)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def carriers(marker: str) -> list[int]:
    """Pids whose environment holds the job's marker, read from /proc independently of the launcher."""
    needle = f"{D.JOB_ENV}={marker}".encode()
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(name))
            except OSError:
                pass
    return found


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@pytest.fixture
def job(tmp_path):
    """The worker's file and its output folder; afterwards, SIGKILL whatever it left (also when a test failed)."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    yield script, tmp_path
    for pid in job_pids(tmp_path):
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def job_pids(folder: Path) -> list[int]:
    return [int(p) for f in sorted(folder.glob("rank*.pids")) for p in f.read_text().split("\n")[1].split()]


def assert_nothing_left(folder: Path) -> None:
    files = sorted(folder.glob("rank*.pids"))
    assert len(files) == 2, "the ranks did not start: the test proved nothing"
    pids = job_pids(folder)
    assert len(pids) == 3
    assert [pid for pid in pids if alive(pid)] == [], "processes of the job still run"
    marker = files[0].read_text().split("\n")[0]
    assert marker, f"the ranks' environment has no {D.JOB_ENV}"
    assert [pid for pid in carriers(marker) if alive(pid)] == []


@linux_only
@pytest.mark.parametrize("finder", ["proc", "psutil"])
def test_a_hung_rank_is_killed_with_its_children_when_the_job_times_out(job, monkeypatch, finder):
    """Before: torchrun was killed, the sleeping rank (in a session of its own) ran on as an orphan.
    ``psutil``: the way processes are found where there is no /proc (macOS), tried here on Linux."""
    if finder == "psutil":
        pytest.importorskip("psutil")
        monkeypatch.setattr(D, "_has_proc", lambda: False)
    script, folder = job
    # the time-out fires once both ranks have started and hang, not after 8 s of a clock a busy machine may spend
    # starting them
    monkeypatch.setattr(D.threading, "Timer", lambda interval, function: TimerWhen(
        lambda: len(list(folder.glob("rank*.pids"))) == 2, function))
    with pytest.raises(D.LaunchError, match="did not finish within 8 s"):
        D.launch(script, 2, [str(folder), "hang"], backend="gloo", echo=False, timeout_s=8)
    assert_nothing_left(folder)


@linux_only
def test_a_failing_rank_leaves_no_process_behind(job):
    script, folder = job
    with pytest.raises(D.LaunchError, match="failed on purpose"):
        D.launch(script, 2, [str(folder), "fail"], backend="gloo", echo=False, timeout_s=60)
    assert_nothing_left(folder)


@linux_only
def test_an_interrupt_while_waiting_kills_the_job(job):
    """Ctrl-C in a notebook while launch waits: the KeyboardInterrupt propagates, and the job is gone."""
    script, folder = job
    done = threading.Event()

    def interrupt_when_started():
        deadline = time.monotonic() + 60
        while len(list(folder.glob("rank*.pids"))) < 2 and time.monotonic() < deadline and not done.is_set():
            time.sleep(0.05)
        if not done.is_set():
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # wakes the blocked read, as Ctrl-C

    # A process started in the background by a non-interactive shell inherits SIGINT as ignored, and Python then
    # installs no KeyboardInterrupt handler: install it here, as an interactive kernel has it, and put back
    # whatever the process had.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    watcher = threading.Thread(target=interrupt_when_started, daemon=True)
    watcher.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            D.launch(script, 2, [str(folder), "hang"], backend="gloo", echo=False, timeout_s=120)
    finally:
        done.set()
        watcher.join(timeout=5)
        signal.signal(signal.SIGINT, inherited)
    assert_nothing_left(folder)


@pytest.mark.parametrize("nproc", [0, -1])
def test_nproc_zero_is_refused_not_replaced_by_the_default(job, nproc):
    """Before: `nproc or default_world_size()` quietly ran the default world size for nproc=0."""
    with pytest.raises(ValueError, match=f"nproc must be at least 1, got {nproc}"):
        D.launch(job[0], nproc, [str(job[1]), "hang"], backend="gloo", echo=False, timeout_s=5)
    assert not list(job[1].glob("rank*.pids"))


# --------------------------------------------------------------------------- which rank the launcher blames

COLLECTIVE_WORKER = textwrap.dedent('''
    """Both ranks join a gloo group, then, by ``mode``: rank 1 enters an all-reduce, and rank 0, once rank 1 has
    said it is about to, exits with code 3 (``exit3``) or kills itself with SIGKILL (``sigkill``); or (``hang``)
    rank 1 hangs and rank 0's all-reduce, in a group with a 10 s timeout, gives up waiting for it."""
    import datetime, os, signal, sys, time
    from pathlib import Path

    import torch
    import torch.distributed as dist

    out, mode, rank = Path(sys.argv[1]), sys.argv[2], int(os.environ["RANK"])
    (out / f"rank{rank}.pid").write_text(os.environ.get("GPUFORMER_JOB", "") + "\\n" + str(os.getpid()))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    dist.barrier()  # both ranks are here: the group below is set up at once, well within its timeout
    short = dist.new_group(timeout=datetime.timedelta(seconds=10))
    print("in the group", flush=True)
    if rank == 1:
        (out / "waiting").write_text("")
        if mode == "hang":
            time.sleep(1000)
        dist.all_reduce(torch.ones(1))
        time.sleep(1000)
    elif mode == "hang":
        dist.all_reduce(torch.ones(1), group=short)
    else:
        deadline = time.time() + 60
        while not (out / "waiting").exists() and time.time() < deadline:
            time.sleep(0.05)
        if mode == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(3)
''')


@pytest.fixture
def collective_job(tmp_path):
    """The collective worker's file and its output folder; afterwards, SIGKILL whatever of the job is left."""
    script = tmp_path / "collective_worker.py"
    script.write_text(COLLECTIVE_WORKER)
    yield script, tmp_path
    for marker in {f.read_text().split("\n")[0] for f in tmp_path.glob("rank*.pid")} - {""}:
        for pid in carriers(marker):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def assert_job_gone(folder: Path) -> None:
    files = sorted(folder.glob("rank*.pid"))
    assert len(files) == 2, "the ranks did not start: the test proved nothing"
    marker = files[0].read_text().split("\n")[0]
    assert marker and [pid for pid in carriers(marker) if alive(pid)] == []


@linux_only
@pytest.mark.parametrize("mode, how", [("exit3", "exit code 3"), ("sigkill", "killed by SIGKILL")])
def test_the_rank_that_failed_first_is_named_with_its_exit_code_or_signal_and_the_waiting_one_as_waiting(
        collective_job, mode, how):
    """Before: 'failed on rank 0 (exit code 1)', torchrun's exit code, not the rank's, no signal named, and
    nothing said of rank 1; and the root cause torchrun names is the failure with the earliest time stamp,
    to the second, so the waiting rank, whose all-reduce failed when its peer vanished, could be blamed.
    Rank 1 ends either way (stopped by torchrun, or its all-reduce failing): both are waiting."""
    script, folder = collective_job
    with pytest.raises(D.LaunchError) as info:
        D.launch(script, 2, [str(folder), mode], backend="gloo", echo=False, timeout_s=120)
    message = str(info.value)
    assert message.startswith(f"collective_worker.py failed on rank 0 ({how}):"), message
    assert f"rank 0 failed first ({how})" in message and "rank 1 was waiting" in message, message
    assert "rank 1 failed" not in message and "rank 1 hung" not in message, message
    assert_job_gone(folder)


@linux_only
def test_a_hung_rank_is_named_not_the_one_whose_collective_timed_out_waiting_for_it(collective_job):
    """Before: rank 0's all-reduce timed out and torchrun named it as the root cause ('failed on rank 0')."""
    script, folder = collective_job
    with pytest.raises(D.LaunchError) as info:
        D.launch(script, 2, [str(folder), "hang"], backend="gloo", echo=False, timeout_s=120)
    message = str(info.value)
    assert message.startswith("collective_worker.py failed on rank 1 (hung):"), message
    assert "rank 1 hung: still running when rank 0 gave up waiting for it in a collective" in message, message
    assert_job_gone(folder)


class TimerWhen:
    """``threading.Timer``'s stand-in for launch's timeout: calls its function once ``ready()`` holds (or
    after 60 s), not after a wall-clock interval, so what the ranks have done by then is known."""

    def __init__(self, ready, function):
        self.ready, self.function, self.cancelled = ready, function, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        deadline = time.monotonic() + 60
        while not self.ready() and time.monotonic() < deadline and not self.cancelled.is_set():
            time.sleep(0.05)
        if not self.cancelled.is_set():
            self.function()

    def start(self):
        self.thread.start()

    def cancel(self):
        self.cancelled.set()


@linux_only
def test_the_timeout_names_the_hung_rank_and_the_one_that_had_finished(job, monkeypatch, tmp_path):
    """Before: 'did not finish within ... s', no rank named. The timeout fires once rank 0 has ended (its
    watcher's record is in launch's folder, created in the temporary folder set here) and rank 1 has started."""
    script, folder = job
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))

    def ready():
        return (folder / "rank1.pids").exists() and any(temporary.glob("gpuformer_launch_*/rank0.json"))

    monkeypatch.setattr(D.threading, "Timer", lambda interval, function: TimerWhen(ready, function))
    with pytest.raises(D.LaunchError) as info:
        D.launch(script, 2, [str(folder), "hang"], backend="gloo", echo=False, timeout_s=30)
    message = str(info.value)
    assert message.startswith("worker.py did not finish within 30 s and was stopped: rank 1 had not finished"), message
    assert "rank 0 had finished (exit code 0)" in message, message
    assert_nothing_left(folder)
    assert list(temporary.iterdir()) == []  # launch removed its folder


def test_the_explanation_reads_what_each_rank_did_not_the_order_their_watchers_wrote(tmp_path):
    """Records as the watchers write them, no processes: a waiting rank whose collective failed is not blamed
    even when its record is the earlier one; a later failure, a rank stopped by torchrun and one with no record
    are each named for what they did; a rank that finished while the other waited is blamed for the wait."""
    End = rank_ends.RankEnd
    lost_peer = "[rank 0] RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:4829"
    timed_out = "[rank 0] RuntimeError: [unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation"
    ends = {0: End(0, 1, 1.0, None), 1: End(1, -9, 2.0, None)}
    blamed, what, text = rank_ends.explain_failure(ends, [lost_peer], 2)
    assert (blamed, what) == (1, "killed by SIGKILL")
    assert text == ("rank 1 failed first (killed by SIGKILL); rank 0 was waiting: its collective failed (exit code 1) "
                    "after rank 1 failed")
    ends = {1: End(1, -15, 6.0, "SIGTERM"), 2: End(2, 1, 5.0, None), 3: End(3, 3, 4.0, None)}
    blamed, what, text = rank_ends.explain_failure(ends, ["[rank 2] ValueError: bad batch"], 4)
    assert (blamed, what) == (3, "exit code 3")
    assert text == ("rank 3 failed first (exit code 3); rank 0 was still running when the job was stopped; "
                    "rank 1 was waiting: stopped by torchrun (SIGTERM) after rank 3 failed; "
                    "rank 2 failed too, later (exit code 1)")
    ends = {0: End(0, 1, 2.0, None), 1: End(1, 0, 1.0, None)}
    blamed, what, text = rank_ends.explain_failure(ends, [timed_out], 2)
    assert (blamed, what) == (1, "finished while the others waited")
    assert text == "rank 1 had finished (exit code 0) while rank 0 waited in a collective (exit code 1)"
    assert rank_ends.explain_failure({0: End(0, 0, 1.0, None)}, [], 2) == (None, "", "")
    assert rank_ends.explain_timeout({0: End(0, 0, 1.0, None), 2: End(2, 3, 1.0, None)}, 3) == (
        "rank 1 had not finished (hung, or waiting in a collective for one that hung); rank 0 had finished "
        "(exit code 0); rank 2 had failed (exit code 3)")
    (tmp_path / "rank0.json").write_text('{"rank": 0, "returncode": -11, "at": 1.5, "stopped_by": null}')
    (tmp_path / "rank1.json").write_text('{"rank": 1, "ret')  # cut short: ignored
    assert rank_ends.read_ends(tmp_path) == {0: End(0, -11, 1.5, None)}
    assert End(0, -11, 1.5, None).how == "killed by SIGSEGV"


def test_execute_refuses_an_error_a_cell_showed_without_failing():
    """IPython shows what a display formatter raises as an error output while the cell succeeds; such a run is
    refused, naming the cell, instead of storing the error for the book."""
    from nbclient.exceptions import CellExecutionError

    nb = new_notebook(cells=[new_code_cell("print(1)"), new_code_cell("fig")])
    nb.cells[1].outputs = [nbformat.v4.new_output("error", ename="ValueError", evalue="bad figure", traceback=[])]
    with pytest.raises(CellExecutionError, match="cell 1: ValueError"):
        execute._refuse_error_outputs(nb)
    nb.cells[1].outputs = []
    execute._refuse_error_outputs(nb)


def test_execute_keeps_widget_state_only_where_an_output_shows_a_widget():
    """The book loads the 4 MB widget bundle on a page whose notebook stores widget state."""
    view = {execute.WIDGET_VIEW: {"model_id": "m"}, "text/plain": "w"}
    for outputs, kept in (([], False), ([nbformat.v4.new_output("display_data", data=view)], True)):
        nb = new_notebook(cells=[new_code_cell("w")], metadata={"widgets": {"state": {}}})
        nb.cells[0].outputs = outputs
        execute._drop_unshown_widget_state(nb)
        assert ("widgets" in nb.metadata) == kept
