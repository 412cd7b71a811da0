"""``make grade`` (tools.grade, tools.sandbox) and the checks' grading side channel (exercises._core).

Three parts: the side channel and the sandbox's audit hook, tested in-process or in a bare Python (fast); one
grading run over a tiny course notebook with one submission per failure kind (renamed, cells deleted, not JSON,
endless loops, sys.exit, os._exit, writes and connects outside, a forged log line, huge output), whose CSV and
feedback the tests read; and the real thing: student copies of chapter 2 (one of the quickest notebooks) with
the solutions filled in get full marks, untouched copies get zero ("not attempted"). The feedback's and
grades.csv's wording (exercise numbers, code cells, "not attempted", what the sandbox refused) and the review
flags are tested on records and cells built in the tests.
"""

import ast
import csv
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from gpuformer_lib.exercises import check_matmul_flops
from gpuformer_lib.exercises._core import GRADE_LOG_ENV
from gpuformer_lib.exercises.hardware import check_training_state_prediction
from gpuformer_lib.exercises.kernels import check_occupancy_limiter
from gpuformer_lib.tools import grade, sandbox, student
from gpuformer_lib.tools.notebooks import REPO_ROOT, notebook_paths

# --------------------------------------------------------------------------- the side channel


def test_without_the_variable_a_check_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(GRADE_LOG_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert check_matmul_flops(lambda m, n, k: 2 * m * n * k)
    assert list(tmp_path.iterdir()) == []
    assert "Correct" in capsys.readouterr().out  # printed as before


def test_each_check_appends_one_line_under_its_public_name(tmp_path, monkeypatch):
    log = tmp_path / "checks.jsonl"
    monkeypatch.setenv(GRADE_LOG_ENV, str(log))
    check_matmul_flops(lambda m, n, k: 2 * m * n * k)
    check_matmul_flops(lambda m, n, k: m * n * k)
    check_training_state_prediction(None, 16_000)  # through predictions._grade
    check_occupancy_limiter({}, threads_per_block=256, regs_per_thread=64, smem_per_block=24 * 1024)  # inner check
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["check"], e["passed"]) for e in lines] == [
        ("check_matmul_flops", True), ("check_matmul_flops", False), ("check_training_state_prediction", False),
        ("check_occupancy_limiter", False)]
    assert "2 FLOPs" in lines[1]["message"] and lines[1]["message"].startswith("❌")
    assert all(e["time"].endswith("+00:00") and e["pid"] == os.getpid() and e["execution_count"] is None
               for e in lines)


def test_an_unwritable_log_loses_the_grade_not_the_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(GRADE_LOG_ENV, str(tmp_path / "no such folder" / "checks.jsonl"))
    assert check_matmul_flops(lambda m, n, k: 2 * m * n * k)
    assert "could not be recorded" in capsys.readouterr().err


def test_a_learner_calling_the_writer_records_nothing(tmp_path, monkeypatch):
    from gpuformer_lib.exercises import _core
    log = tmp_path / "checks.jsonl"
    monkeypatch.setenv(GRADE_LOG_ENV, str(log))
    with pytest.raises(PermissionError, match="only a check"):
        _core._record("check_speedup", _core.CheckResult(True, "forged"))
    assert not log.exists()


def test_a_time_out_is_a_field_of_the_log_line(tmp_path, monkeypatch):
    log = tmp_path / "checks.jsonl"
    monkeypatch.setenv(GRADE_LOG_ENV, str(log))
    monkeypatch.setenv("GPUFORMER_CHECK_TIME_LIMIT", "0.2")

    def endless(m, n, k):
        while True:
            pass

    check_matmul_flops(endless)
    check_matmul_flops(lambda m, n, k: 0)
    assert [json.loads(line)["timed_out"] for line in log.read_text().splitlines()] == [True, False]


# the three routes to a forged pass found in review 18, each in a cell of its own
FORGERIES = [
    "from gpuformer_lib.exercises._core import _record, CheckResult\n_record('check_speedup', CheckResult(True, 'x'))",
    "import os\nexec(compile(\"import io; io.open(os.environ['X'], 'a').write('...')\", "
    "'/course/gpuformer_lib/exercises/_core.py', 'exec'))",
    "from gpuformer_lib.exercises import CheckResult, predictions\n"
    "predictions._report = lambda ok, msg: CheckResult(True, msg)\ncheck_speedup(speedup)",
]


def test_a_cell_calling_one_check_twice_is_one_exercise():
    """Chapter 3's exercise 3.3 calls its check twice in one cell (forward, then training)."""
    nb = json.loads((REPO_ROOT / "notebooks" / "03_attention.ipynb").read_text())
    found = grade.expected_exercises(nb, {"check_attention_memory_prediction"})
    assert found == ["check_attention_memory_prediction"]


def test_every_known_forgery_is_flagged_and_no_course_notebook_is():
    assert grade.suspicious(["x = 1", None, *FORGERIES]) == [  # None: a markdown cell, not counted
        "code cell 2: _record", "code cell 3: compile(, exec(", "code cell 4: _report, assigns to predictions._report"]
    assert grade.suspicious(["import gpuformer_lib.exercises.timing as t\nt.check_speedup = print"]) == [
        "code cell 1: assigns to t.check_speedup"]
    assert grade.suspicious(["from gpuformer_lib import exercises", "setattr(exercises.timing, 'x', 1)"]) == [
        "code cell 2: setattr on exercises.timing"]
    # a check's own answer, imported or reached by attribute, passes the check: flagged
    assert grade.suspicious(["from gpuformer_lib.exercises.proteins import check_mcc, _reference_mcc\n"
                             "check_mcc(_reference_mcc)",
                             "from gpuformer_lib.exercises import forecasting as f\n"
                             "f.check_trailing_mean(f._reference_trailing_mean)",
                             "import gpuformer_lib\nx = gpuformer_lib.exercises.case_studies._reference_diagnosis",
                             "from gpuformer_lib import proteins\nproteins._private_helper = 1"]) == [
        "code cell 1: a check's private _reference_mcc", "code cell 2: a check's private _reference_trailing_mean",
        "code cell 3: a check's private _reference_diagnosis"]
    for path in notebook_paths():  # torch.compile(...), %time and the solutions are not suspicious
        nb = nbformat.read(path, as_version=4)
        assert grade.suspicious([c.source if c.cell_type == "code" else None for c in nb.cells]) == [], path.name


def test_only_code_is_flagged_not_what_strings_and_comments_say():
    """A learner explaining themselves in a print or a comment is not flagged; the same words as code are."""
    innocent = ['print("I did not use ctypes, nor exec( or eval(")  # no eval( here, no _record',
                "# subprocess.run([sys.executable, '-S']) would escape; I did not\nx = 1",
                "note = 'mount the data, then unshare it; checks.jsonl is the log'\nprint(note)",
                "phase = 'eval'\nmodel = torch.nn.Linear(2, 2).eval()\nfast = torch.compile(model)",
                "import subprocess\nsubprocess.run(['grep', '-E', 'x', 'f.txt'])",  # -E of grep, not of Python
                "import os, subprocess, sys\nsubprocess.run([sys.executable, '-c', '1'], env={**os.environ, 'X': '1'})"]
    assert grade.suspicious(innocent) == []
    assert grade.suspicious(["import ctypes", "x = __import__('ctypes')", "eval('1')",
                             "import os\nos.environ.get('GPUFORMER_GRADE_LOG')", "getattr(__builtins__, 'exec')('1')",
                             "f = compile", "print(open('../checks.jsonl').read())"]) == [
        "code cell 1: ctypes", "code cell 2: ctypes", "code cell 3: eval(", "code cell 4: the grading log",
        "code cell 5: exec(", "code cell 6: compile(", "code cell 7: the grading log"]


def test_the_routes_past_the_sandbox_a_determined_student_used_are_flagged():
    no_hook = "a Python child without the sandbox's hook"
    cells = {
        "import subprocess, sys\nsubprocess.run([sys.executable, '-S', '-c', 'print(1)'])": f"{no_hook} (-S)",
        "import subprocess, sys\ncmd = [sys.executable, '-I', 'x.py']\nsubprocess.Popen(cmd)": f"{no_hook} (-I)",
        "import os, sys\nos.execv(sys.executable, [sys.executable, '-ESc', 'pass'])": f"{no_hook} (-E, -S)",
        "import os\nos.system('python3 -S -c 1')": f"{no_hook} (-S)",
        "!python -I -c 'import os'": f"{no_hook} (-I)",
        "import subprocess, sys\nsubprocess.run([sys.executable, 'x.py'], env={'PATH': '/usr/bin'})":
            "a child process with its own env= (without the sandbox's PYTHONPATH)",
        "import os\ndel os.environ['PYTHONPATH']": "changes PYTHONPATH (the sandbox's hook)",
        "import os\nos.environ.pop('PYTHONPATH', None)": "changes PYTHONPATH (the sandbox's hook)",
        "import subprocess\nsubprocess.run(['mount', '-o', 'remount,rw', '/'])": "starting the program mount",
        "import subprocess\nsubprocess.run('umount /x; true', shell=True)": "starting the program umount",
        "import subprocess\nsubprocess.run(['sh', '-c', 'echo x > /tmp/y; nsenter -t 1 -m sh'])":
            "starting the program nsenter",
        "argv = ['/usr/sbin/chroot', '/', 'sh']": "starting the program chroot",
        "from subprocess import run\nrun(['unshare', '-r', 'sh'])": "starting the program unshare",
        "!pivot_root . old": "starting the program pivot_root",
        "import os\nos.unshare(os.CLONE_NEWNS)": "calling unshare()",
        "import ctypes\nlibc = ctypes.CDLL(None)\nlibc.mount(None, b'/', None, 32, None)": "calling mount()",
        "import ctypes\ngetattr(ctypes.CDLL(None), 'umount2')(b'/x', 2)": "calling umount2()",
    }
    for source, label in cells.items():
        flagged = grade.suspicious([source])
        assert len(flagged) == 1 and label in flagged[0], (source, flagged)
    # the code a child Python is given with -c is read as code: the determined student's second route
    child = ("import subprocess, sys\n"
             "code = ('import subprocess; subprocess.run([\"mount\", \"-o\", \"remount,rw\", '\n"
             "        '\"/\"])')\nsubprocess.run([sys.executable, '-S', '-c', code], check=True)")
    assert grade.suspicious([child]) == [f"code cell 1: {no_hook} (-S), starting the program mount"]


# --------------------------------------------------------------------------- the audit hook, in a bare Python


def test_the_sandbox_hook_refuses_what_it_should_and_allows_the_work_folder(tmp_path):
    work, hidden, log = tmp_path / "work", tmp_path / "course", tmp_path / "checks.jsonl"
    work.mkdir(), hidden.mkdir(), log.touch()
    (hidden / "01_x.ipynb").write_text("{}")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(sandbox.sitecustomize_source(work, [hidden], log))
    probe = textwrap.dedent(f"""
        import json, os, socket, subprocess, sys
        def attempt(what, fn):
            try:
                fn()
                return "allowed"
            except PermissionError as err:
                return "refused" if "graded run" in str(err) else repr(err)
            except Exception:
                return "allowed"  # got past the hook, failed later (no route, a child's error)
        print(json.dumps({{
            "write inside": attempt(0, lambda: open({str(work / 'a.txt')!r}, "w").write("x")),
            "write outside": attempt(0, lambda: open({str(tmp_path / 'outside.txt')!r}, "w")),
            "os.open outside": attempt(0, lambda: os.open({str(tmp_path / 'o2.txt')!r}, os.O_CREAT | os.O_WRONLY)),
            "rename out": attempt(0, lambda: os.rename({str(work / 'a.txt')!r}, {str(tmp_path / 'b.txt')!r})),
            "read solutions": attempt(0, lambda: open({str(hidden / '01_x.ipynb')!r}).read()),
            "forge log": attempt(0, lambda: open({str(log)!r}, "a")),
            "connect": attempt(0, lambda: socket.create_connection(("192.0.2.1", 80), timeout=0.5)),
            "lookup": attempt(0, lambda: socket.getaddrinfo("example.com", 80)),
            "shell": attempt(0, lambda: os.system("true")),
            "program": attempt(0, lambda: subprocess.run(["true"])),
            "a compiler, not from torch": attempt(0, lambda: subprocess.run(["cc", "--version"])),
            "python child": attempt(0, lambda: subprocess.run([sys.executable, "-c", "open({str(tmp_path / 'c.txt')!r}, 'w')"])),
            "a shell through torch": attempt(0, lambda: __import__("torch.utils.collect_env").utils.collect_env.run(
                "echo x > {str(tmp_path / 'torch-shell.txt')}")),
            "shell=True": attempt(0, lambda: subprocess.run("cc --version", shell=True)),
            "python -S": attempt(0, lambda: subprocess.run([sys.executable, "-S", "-c", "pass"])),
            "python -IE": attempt(0, lambda: subprocess.run([sys.executable, "-X", "utf8", "-IE", "-c", "pass"])),
            "python, PYTHONPATH dropped": attempt(0, lambda: subprocess.run([sys.executable, "-c", "pass"], env={{}})),
            "ctypes mount": attempt(0, lambda: __import__("ctypes").CDLL(None).mount),
            "another clone's notebook": attempt(0, lambda: open({str(tmp_path / 'clone' / '03_x.ipynb')!r})),
            "a built book": attempt(0, lambda: open({str(tmp_path / '_build' / 'x.html')!r})),
            "the record of refusals": attempt(0, lambda: open({str(tmp_path / 'refusals.jsonl')!r}, "a")),
            "erasing the record through its descriptor": attempt(0, lambda: os.ftruncate(next(
                int(fd) for fd in os.listdir("/proc/self/fd")
                if os.readlink("/proc/self/fd/" + fd) == {str(tmp_path / 'refusals.jsonl')!r}), 0)),
            "writing after switching the module's refusal off": attempt(0, lambda: (
                setattr(__import__("sitecustomize"), "_refuse", lambda what: None),
                open({str(tmp_path / 'outside2.txt')!r}, "w"))),
        }}))
    """)
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=work, timeout=60)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got.pop("write inside") == "allowed"
    assert got.pop("python child") == "allowed"  # it started; its own write was refused by its own hook:
    assert not (tmp_path / "c.txt").exists()
    assert got == dict.fromkeys(got, "refused"), got
    assert not (tmp_path / "outside.txt").exists() and not (tmp_path / "o2.txt").exists()
    assert not (tmp_path / "torch-shell.txt").exists()
    recorded = [json.loads(line)["what"] for line in (tmp_path / "refusals.jsonl").read_text().splitlines()]
    assert len(recorded) == len(got) + 1, recorded  # each refusal, and the Python child's own refused write
    assert "calling the C library's mount() through ctypes" in recorded and any("c.txt" in r for r in recorded)


def test_the_kernel_inherits_no_cache_or_setting_from_the_graders_process(tmp_path, monkeypatch):
    """Before: once a test in the same process had compiled, torch had set TORCHINDUCTOR_CACHE_DIR=/tmp/...; the
    graded kernel inherited it, and its first torch.compile wrote outside its work folder (refused)."""
    for name, value in (("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_x"), ("TRITON_CACHE_DIR", "/tmp/t"),
                        ("PYTHONSTARTUP", "/tmp/s.py"), ("PYTHONPATH", "/x"), ("GPUFORMER_PRESET", "big"),
                        ("https_proxy", "http://p")):
        monkeypatch.setenv(name, value)
    env = grade._clean_env(tmp_path)
    assert not {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "PYTHONSTARTUP", "PYTHONPATH", "GPUFORMER_PRESET",
                "https_proxy"} & set(env)
    assert env["TMPDIR"] == str(tmp_path / "tmp") and env["HOME"] == str(tmp_path) and env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and "PATH" in env


def test_a_jailed_kernel_cannot_undo_its_read_only_file_system(tmp_path):
    """Below the audit hook: a shell in the kernel's place (as code below Python could start) tries to remount /
    and its job folder read-write and to write outside its work folder; the OS refuses all of it. Reading
    outside the allowlist finds nothing."""
    _require_sandbox()
    job = tmp_path / "job"
    (job / "work").mkdir(parents=True)
    outside = tmp_path / "out.txt"
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    key = 0x6F00000 + os.getpid() % 0xFFFF  # a System V shared-memory segment of the host's
    segment = libc.shmget(key, 4096, 0o1000 | 0o600)  # IPC_CREAT
    assert segment >= 0, os.strerror(ctypes.get_errno())
    attempt = (f"mount -o remount,bind,rw /; mount -o remount,bind,rw {job}; echo x > {job}/work/in.txt; "
               f"echo x > {outside}; echo x > {job}/record.json; cat {REPO_ROOT / 'README.md'} | head -1; "
               # a host-wide setting, written back unchanged (harmless if it got through), and a proc of its own
               "cat /proc/sys/kernel/core_pattern > /proc/sys/kernel/core_pattern; "
               "unshare --user --map-root-user --mount --pid --fork --mount-proc true || echo NO-PROC-OF-ITS-OWN; "
               f"grep -c ' {key} ' /proc/sysvipc/shm || true")
    script = ("import subprocess, sys; from pathlib import Path; from gpuformer_lib.tools import fslock; "
              "job = Path(sys.argv[1]); fslock.enter_jail(job); "
              "sys.exit(subprocess.run(fslock.kernel_argv(job, [job / 'work'], ['sh', '-c', sys.argv[2]])).returncode)")
    try:
        done = subprocess.run([*grade.NETNS, "--mount", sys.executable, "-c", script, str(job), attempt],
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    finally:
        libc.shmctl(segment, 0, None)  # IPC_RMID
    assert (job / "work" / "in.txt").is_file(), done.stderr
    assert not outside.exists() and not (job / "record.json").exists()
    assert done.stderr.count("Read-only file system") >= 2 and "permission denied" in done.stderr.lower()
    assert "core_pattern: Read-only file system" in done.stderr, done.stderr
    assert "NO-PROC-OF-ITS-OWN" in done.stdout and done.stdout.splitlines()[-1] == "0", done.stdout  # no host shm
    assert "gpuformer" not in done.stdout.lower()  # the README is not there


# --------------------------------------------------------------------------- statuses from a run


def test_the_grade_is_the_last_cell_that_called_the_check():
    sub = grade.Submission("s", Path("x.ipynb"), "01_x.ipynb", cells=["", "check_a(f)", "check_a(f)\ncheck_a(g)"])

    def entry(passed, line, message="m"):
        return {"check": "check_a", "passed": passed, "message": message, "line": line}

    # cell 2 (index 1) wrote log line 0, cell 3 (index 2) lines 1 and 2
    cells = [{"index": 1, "status": "ok", "log_lines": [0, 1]}, {"index": 2, "status": "ok", "log_lines": [1, 3]}]
    status = lambda *entries: grade.exercise_status("check_a", sub, {"cells": cells, "checks": list(entries)})
    assert status(entry(False, 0), entry(True, 1), entry(True, 2))[0] == grade.PASSED
    assert status(entry(True, 0), entry(False, 1, "❌ hint"), entry(True, 2)) == (grade.FAILED,
                                                                                 "❌ hint (code cell 3)")
    assert status(entry(True, 0), entry(True, 2))[0] == grade.PASSED  # the first line of the log counts for cell 2
    assert status({**entry(False, 1, "did not return within 10 s"), "timed_out": True})[0] == grade.TIMED_OUT
    assert status(entry(False, 1, "did not return within 10 s"))[0] == grade.FAILED  # the field, not the text
    assert status()[0] == grade.DID_NOT_RUN and "reported no result" in status()[1]
    assert grade.exercise_status("check_b", sub, {"cells": cells, "checks": []})[1].startswith("no cell")


def test_every_exercise_of_every_course_notebook_is_numbered_as_the_book_numbers_it():
    """Each check column of each course notebook gets the number of its exercise's heading: one of this chapter's,
    each once, in the book's order (chapter 1's exercise 1.4 grades two predictions: 1.4a and 1.4b)."""
    names = grade.exercise_check_names()
    seen = {}
    for path in notebook_paths():
        nb = json.loads(path.read_text(encoding="utf-8"))
        exercises = grade.course_exercises(nb, names)
        assert [e.check for e in exercises] == grade.expected_exercises(nb, names), path.name
        numbers = [e.number for e in exercises]
        assert None not in numbers, (path.name, [e.check for e in exercises if e.number is None])
        assert len(set(numbers)) == len(numbers), (path.name, numbers)
        chapter = int(grade.chapter_of(path.name))
        assert all(n.split(".")[0] == str(chapter) for n in numbers), (path.name, numbers)
        order = [(int(n.split(".")[1].rstrip("abcdefgh")), n) for n in numbers]
        assert order == sorted(order), (path.name, numbers)
        assert all(e.stubs and all(e.check in stub for stub in e.stubs) for e in exercises), path.name
        seen[path.name] = dict(zip((e.check for e in exercises), numbers))
    assert seen["03_attention.ipynb"]["check_causal_mask"] == "3.1"
    assert seen["13_translation_case_study.ipynb"]["check_refusal_diagnosis"] == "13.2"  # a **13.2 ...** paragraph
    assert seen["12_model_parallel.ipynb"]["check_one_f_one_b"] == "12.1"
    assert (seen["01_why_gpus.ipynb"]["check_add_time_prediction"],
            seen["01_why_gpus.ipynb"]["check_matmul_time_prediction"]) == ("1.4a", "1.4b")


def test_a_check_call_without_an_exercise_heading_above_it_gets_no_number():
    nb = {"cells": [
        {"cell_type": "markdown", "source": "## Exercises\n\n### Exercise 2.1: the first"},
        {"cell_type": "code", "source": "check_a(f)", "metadata": {}},
        {"cell_type": "code", "source": "assert check_a(g)", "metadata": {"tags": ["solution"]}},
        {"cell_type": "markdown", "source": "## 2.9 A section that is not an exercise"},
        {"cell_type": "code", "source": "check_b(f)", "metadata": {}},
        {"cell_type": "markdown", "source": "**2.2 A diagnosis.** Find the bug."},
        {"cell_type": "code", "source": "check_c(x)\ncheck_d(y)", "metadata": {}}]}
    found = grade.course_exercises(nb, {"check_a", "check_b", "check_c", "check_d"})
    assert [(e.check, e.number, e.stubs) for e in found] == [
        ("check_a", "2.1", ("check_a(f)",)), ("check_b", None, ("check_b(f)",)),
        ("check_c", "2.2a", ("check_c(x)\ncheck_d(y)",)), ("check_d", "2.2b", ("check_c(x)\ncheck_d(y)",))]
    assert grade.column_name("02_x.ipynb", "check_b", None) == "02::check_b"
    assert grade.exercise_label("check_b", None) == "check_b"


def _chapter_three(*exercise_cell: str) -> grade.Submission:
    """A submitted chapter 3 as the grader reads it: markdown, the imports, markdown, then ``exercise_cell``."""
    cells = ["", "from gpuformer_lib.exercises import check_causal_mask", "", *exercise_cell]
    kinds = ["markdown", "code", "markdown", *["code"] * len(exercise_cell)]
    return grade.Submission("ada", Path("03_attention.ipynb"), "03_attention.ipynb", matched_by="its file name",
                            cells=cells, kinds=kinds)


STUB_31 = "def causal_mask(T):\n    raise NotImplementedError  # your code here\n\n\ncheck_causal_mask(causal_mask)"


def _entry(passed, message, line=0, **fields):
    return {"check": "check_causal_mask", "passed": passed, "message": message, "line": line, **fields}


def _ran(*indexes):
    return [{"index": i, "status": "ok", "log_lines": [k, k + 1]} for k, i in enumerate(indexes)]


def test_feedback_names_the_exercise_as_the_book_does_and_cites_code_cells():
    answer = "def causal_mask(T):\n    return torch.ones(T, T)\n\n\ncheck_causal_mask(causal_mask)"
    sub = _chapter_three(answer)  # notebook cell 4 (index 3) is the learner's second code cell
    record = {"cells": _ran(3), "checks": [_entry(False, "❌ Not yet. Mask the future.")]}
    status = grade.exercise_status("check_causal_mask", sub, record, number="3.1", stubs=(STUB_31,))
    assert status == (grade.FAILED, "❌ Not yet. Mask the future. (code cell 2, the code cell of exercise 3.1)")
    assert grade.cell_name(sub, 3) == "code cell 2" and grade.code_cell(sub, 1) == 1
    crashed = grade.exercise_status("check_causal_mask", sub, {"cells": [{"index": 3, "status": "error",
                                                                           "ename": "NameError", "evalue": "torch"}],
                                                               "checks": []}, number="3.1")
    assert crashed == (grade.CRASHED, "code cell 2, the code cell of exercise 3.1 raised NameError: torch")
    never = grade.exercise_status("check_causal_mask", sub, {"cells": [], "checks": [],
                                                             "stopped": "the kernel died in cell 2"}, number="3.1")
    assert never[1] == ("code cell 2, the code cell of exercise 3.1, which calls check_causal_mask, never ran: the "
                        "kernel died in code cell 1")
    out = Path(tempfile.mkdtemp())
    key = ("03_attention.ipynb", "check_causal_mask")
    grade._write_feedback(out / "ada.md", "ada", ["03_attention.ipynb"], {"03_attention.ipynb": ["check_causal_mask"]},
                          {"03_attention.ipynb": sub}, {("ada", "03_attention.ipynb"): record}, {key: status}, [],
                          numbers={key: "3.1"})
    feedback = (out / "ada.md").read_text()
    assert ("- Exercise 3.1 (check_causal_mask): failed. ❌ Not yet. Mask the future. (code cell 2, the code cell of "
            "exercise 3.1)") in feedback
    assert "Refused by the sandbox" not in feedback  # the record has no "refusals": nothing refused
    grade._write_csv(out / "grades.csv", [key], {"ada": {key: status}}, {"ada": []}, {key: "3.1"})
    rows = list(csv.DictReader((out / "grades.csv").open()))
    assert rows == [{"student": "ada", "03:3.1:check_causal_mask": "failed", "total": "0", "out_of": "1",
                     "flags": "", "refused": ""}]


def test_an_untouched_stub_is_not_attempted_and_a_wrong_answer_failed():
    stubbed = _chapter_three(STUB_31 + "\n")  # trailing space and lines do not count
    hint = "❌ Not yet. The check could not use what your function returned."
    status = grade.exercise_status("check_causal_mask", stubbed, {"cells": _ran(3), "checks": [_entry(False, hint)]},
                                   number="3.1", stubs=(STUB_31,))
    assert status[0] == grade.NOT_ATTEMPTED and status[1].startswith("its code cell is still the stub")
    # edited, but the function still raises the stub's NotImplementedError: the check's log line says so
    edited = _chapter_three(STUB_31.replace("# your code here", "# TODO tomorrow"))
    placeholder = _entry(False, "❌ Not yet. The function still raises NotImplementedError", not_attempted=True)
    status = grade.exercise_status("check_causal_mask", edited, {"cells": _ran(3), "checks": [placeholder]},
                                   number="3.1", stubs=(STUB_31,))
    assert status == (grade.NOT_ATTEMPTED, "❌ Not yet. The function still raises NotImplementedError (code cell 2, "
                                           "the code cell of exercise 3.1)")
    wrong = _entry(False, "❌ Not yet. Mask the future.", not_attempted=False)
    assert grade.exercise_status("check_causal_mask", edited, {"cells": _ran(3), "checks": [wrong]},
                                 number="3.1", stubs=(STUB_31,))[0] == grade.FAILED
    # two calls in one cell (exercise 3.2): one answered, one left None is an attempt that failed
    both = {"cells": [{"index": 3, "status": "ok", "log_lines": [0, 2]}],
            "checks": [_entry(True, "✅", 0), _entry(False, "None", 1, not_attempted=True)]}
    assert grade.exercise_status("check_causal_mask", edited, both, number="3.1")[0] == grade.FAILED
    # a stub that timed out is timed out
    looped = _entry(False, "did not return within 10 s", timed_out=True)
    assert grade.exercise_status("check_causal_mask", stubbed, {"cells": _ran(3), "checks": [looped]},
                                 number="3.1", stubs=(STUB_31,))[0] == grade.TIMED_OUT
    out = Path(tempfile.mkdtemp())
    key = ("03_attention.ipynb", "check_causal_mask")
    grade._write_csv(out / "grades.csv", [key], {"ada": {key: status}}, {"ada": []}, {key: "3.1"})
    row = next(csv.DictReader((out / "grades.csv").open()))
    assert (row["03:3.1:check_causal_mask"], row["total"]) == ("not attempted", "0")


def test_the_checks_log_says_when_an_answer_is_still_the_stubs_placeholder(tmp_path, monkeypatch):
    from gpuformer_lib.exercises.heads import check_kv_cache_prediction
    log = tmp_path / "checks.jsonl"
    monkeypatch.setenv(GRADE_LOG_ENV, str(log))

    def stub(m, n, k):
        raise NotImplementedError  # your code here

    check_matmul_flops(stub)
    check_matmul_flops(lambda m, n, k: m * n * k)  # wrong: attempted
    check_training_state_prediction(None, 16_000)
    check_training_state_prediction(8_000, 16_000)
    check_kv_cache_prediction({"MHA": None, "MQA": None}, {"MHA": 1024, "MQA": 128})
    check_kv_cache_prediction("about a kilobyte", {"MHA": 1024})  # a not-yet of the check's own: recorded too
    check_occupancy_limiter({"T4": (None, {}), "H100 SXM": (None, {})}, threads_per_block=256, regs_per_thread=64,
                            smem_per_block=24 * 1024)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["check"], e["not_attempted"]) for e in lines] == [
        ("check_matmul_flops", True), ("check_matmul_flops", False), ("check_training_state_prediction", True),
        ("check_training_state_prediction", False), ("check_kv_cache_prediction", True),
        ("check_kv_cache_prediction", False), ("check_occupancy_limiter", True)]
    assert not any(e["passed"] for e in lines)


def test_every_check_records_its_result_whatever_path_it_takes():
    """A public check records through _safe_check; one that is not wrapped (a prediction, which lets a bad
    measurement raise) may only return what records itself: grade_prediction's or grade_model's result, own_result's, an inner
    checker's. A check that returned a result of its own unrecorded (check_kv_cache_prediction's "predict a
    dict", check_padding_prediction's endless function) was graded "did not run"."""
    for path in (REPO_ROOT / "gpuformer_lib" / "exercises").glob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("check_")):
                continue
            if any(ast.unparse(d) == "_safe_check" for d in node.decorator_list):
                continue
            recorders = {"grade_prediction", "grade_model", "own_result"} | {f.name for f in node.body if isinstance(
                f, ast.FunctionDef) and any(ast.unparse(d) == "_safe_check" for d in f.decorator_list)}  # inner
            returns, todo = [], list(node.body)
            while todo:  # its own returns, not those of the functions it defines
                statement = todo.pop()
                if isinstance(statement, ast.Return):
                    returns.append(statement)
                elif not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                    todo += list(ast.iter_child_nodes(statement))
            recorded = {t.id for a in ast.walk(node) if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)
                        and ast.unparse(a.value.func) in recorders for t in a.targets if isinstance(t, ast.Name)}
            assert returns and all(isinstance(r.value, ast.Call) and ast.unparse(r.value.func) in recorders
                                   or isinstance(r.value, ast.Name) and r.value.id in recorded
                                   for r in returns), f"{path.name}: {node.name} returns a result it does not record"


def test_what_the_sandbox_refused_is_a_column_and_a_feedback_section():
    sub = _chapter_three("import subprocess\nsubprocess.run(['mount'])", "open('/etc/x', 'w')")
    record = {"cells": _ran(3, 4), "checks": [], "refusals": [
        {"what": "starting the program mount (only Python, ...)", "cell": 3},
        {"what": "writing /etc/x", "cell": 4}, {"what": "writing /etc/x", "cell": 4},
        {"what": "the network (looking up\nexample.com)", "cell": None}]}
    refused = grade.refusals(sub, record)
    assert refused == [("starting the program mount (only Python, ...) (code cell 2)", 1),
                       ("writing /etc/x (code cell 3)", 2), ("the network (looking up example.com)", 1)]
    assert grade.refusals(sub, {"cells": []}) == [] and grade.refusals(sub, None) == []  # no "refusals": none
    triples = [("03", what, times) for what, times in refused]
    assert grade.refused_cell(triples) == ("4: 03 starting the program mount (only Python, ...) (code cell 2); 03 "
                                           "writing /etc/x (code cell 3), 2 times; 03 the network (looking up "
                                           "example.com)")
    assert grade.refused_cell([]) == ""
    assert grade.refused_cell([("03", f"writing /x{i}", 1) for i in range(12)]).endswith("writing /x9; ...")
    out = Path(tempfile.mkdtemp())
    key = ("03_attention.ipynb", "check_causal_mask")
    results = {key: (grade.DID_NOT_RUN, "x")}
    grade._write_csv(out / "grades.csv", [key], {"ada": results}, {"ada": []}, {key: "3.1"}, {"ada": triples})
    assert next(csv.DictReader((out / "grades.csv").open()))["refused"].startswith("4: 03 starting the program mount")
    grade._write_feedback(out / "ada.md", "ada", ["03_attention.ipynb"], {"03_attention.ipynb": ["check_causal_mask"]},
                          {"03_attention.ipynb": sub}, {("ada", "03_attention.ipynb"): record}, results, [])
    feedback = (out / "ada.md").read_text()
    section = feedback.split("## Refused by the sandbox\n")[1].split("\n## ")[0]
    assert "4 attempt(s)" in section
    assert ("- 03_attention.ipynb: starting the program mount (only Python, ...) (code cell 2)\n"
            "- 03_attention.ipynb: writing /etc/x (code cell 3), 2 times\n"
            "- 03_attention.ipynb: the network (looking up example.com)") in section


# --------------------------------------------------------------------------- a class of broken submissions

TINY = "01_tiny.ipynb"
EXERCISES = ["check_matmul_flops", "check_speedup", "check_training_state_prediction"]
STUBS = [
    "def flops(m, n, k):\n    raise NotImplementedError  # your code here\n\n\ncheck_matmul_flops(flops)",
    "def speedup(before, after):\n    raise NotImplementedError  # your code here\n\n\ncheck_speedup(speedup)",
    "predicted_bytes = None  # your prediction\ncheck_training_state_prediction(predicted_bytes, measured_bytes)",
]
SOLUTIONS = [
    "def flops(m, n, k):\n    return 2 * m * n * k\n\n\nassert check_matmul_flops(flops)",
    "def speedup(before, after):\n    return before / after\n\n\nassert check_speedup(speedup)",
    "predicted_bytes = 16 * 1000\nassert check_training_state_prediction(predicted_bytes, measured_bytes)",
]
IMPORTS = ("from gpuformer_lib.exercises import check_matmul_flops, check_speedup\n"
           "from gpuformer_lib.exercises.hardware import check_training_state_prediction\nmeasured_bytes = 16_000")


def notebook(cells, source=TINY):
    nb = new_notebook(cells=[new_code_cell(c) if isinstance(c, str) else c for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    if source:
        nb.metadata[student.STUDENT_KEY] = {"source": source, "cells_sha256": "x"}
    return nb


def instructor_copy():
    cells = [new_markdown_cell("# A tiny chapter"), IMPORTS]
    for number, (stub, solution) in enumerate(zip(STUBS, SOLUTIONS), start=1):
        cells += [new_markdown_cell(f"### Exercise 1.{number}: the {number}th"), stub,
                  new_code_cell(solution, metadata={"tags": ["hide-cell", student.SOLUTION_TAG]})]
    return notebook(cells, source=None)


def answered(*cells):
    """A student copy with the solutions below their stubs, and ``cells`` in front of the exercises."""
    body = [IMPORTS, *cells]
    for stub, solution in zip(STUBS, SOLUTIONS):
        body += [stub, solution]
    return body


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """One grading run over a class of eight, each submission broken in its own way."""
    root = tmp_path_factory.mktemp("class")
    course, subs, out = root / "course", root / "submissions", root / "grades"
    course.mkdir()
    nbformat.write(instructor_copy(), course / TINY)
    outside = root / "outside.txt"
    class_ = {
        "good": answered(),
        "renamed": answered("print('x' * 3_000_000)"),  # a huge output is capped; the run goes on
        "deleted": [IMPORTS, STUBS[0], SOLUTIONS[0], STUBS[2]],  # the speedup exercise's cells deleted
        "loop": [IMPORTS, "while True:\n    pass\ncheck_matmul_flops(lambda m, n, k: 0)",
                 "def speedup(before, after):\n    while True:\n        pass\n\n\ncheck_speedup(speedup)",
                 SOLUTIONS[2]],
        "exits": [IMPORTS, "import sys\nsys.exit(1)\ncheck_matmul_flops(None)",
                  "import os\nos._exit(1)\ncheck_speedup(None)", SOLUTIONS[2]],
        "evil": [IMPORTS, f"open({str(outside)!r}, 'w').write('gotcha')\n" + SOLUTIONS[0],
                 "import socket\nsocket.create_connection(('192.0.2.1', 80), timeout=1)\n" + SOLUTIONS[1],
                 "import json, os\nline = dict(check='check_training_state_prediction', passed=True, message='forged')\n"
                 "open(os.environ['GPUFORMER_GRADE_LOG'], 'a').write(json.dumps(line) + '\\n')\n" + STUBS[2],
                 "from gpuformer_lib.exercises._core import _record, CheckResult\n"
                 "_record('check_training_state_prediction', CheckResult(True, 'forged'))"],
    }
    for name, cells in class_.items():
        folder = subs / name
        folder.mkdir(parents=True)
        nbformat.write(notebook(cells), folder / ("my lab.ipynb" if name == "renamed" else TINY))
    nbformat.write(notebook(answered()), subs / "flat.ipynb")  # the flat layout: <student>.ipynb
    (subs / "good" / "0 old").mkdir()  # an untouched copy matched by file name only, written last: not graded
    nbformat.write(notebook([IMPORTS, *STUBS], source=None), subs / "good" / "0 old" / TINY)
    (subs / ".DS_Store").write_text("")
    (subs / "broken").mkdir()
    (subs / "broken" / TINY).write_text('{"cells": [')  # saved half-way
    (subs / "zed.ipynb").write_bytes(b"\x89PNG not a notebook")  # flat, unreadable, its chapter unknown
    before = {p: p.read_bytes() for p in subs.rglob("*") if p.is_file()}
    os.environ["GPUFORMER_CHECK_TIME_LIMIT"] = "2"
    try:
        results = grade.grade(subs, out, course, jobs=2, cell_timeout=15, notebook_timeout=180, progress=False)
    finally:
        del os.environ["GPUFORMER_CHECK_TIME_LIMIT"]
    after = {p: p.read_bytes() for p in subs.rglob("*") if p.is_file()}
    return {"results": results, "out": out, "outside": outside, "subs_unchanged": before == after}


def statuses(graded, student_name):
    return [graded["results"][student_name][(TINY, check)][0] for check in EXERCISES]


def hints(graded, student_name):
    return [graded["results"][student_name][(TINY, check)][1] for check in EXERCISES]


def test_the_csv_has_a_row_per_student_a_column_per_exercise_and_a_total(graded):
    with (graded["out"] / "grades.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["student", *(f"01:1.{i}:{c}" for i, c in enumerate(EXERCISES, start=1)), "total",
                             "out_of", "flags", "refused"]
    totals = {row["student"]: int(row["total"]) for row in rows}
    assert totals == {"broken": 0, "deleted": 1, "evil": 0, "exits": 0, "flat": 3, "good": 3, "loop": 1,
                      "renamed": 3, "zed": 0}
    assert all(row["out_of"] == "3" and row["total"] == str(list(row.values()).count("passed")) for row in rows)
    assert graded["subs_unchanged"]  # the submissions were copied, never written
    flags = {row["student"]: row["flags"] for row in rows if row["flags"]}
    assert flags == {"evil": "01 code cell 4: the grading log; 01 code cell 5: _record"}, flags
    refused = {row["student"]: row["refused"] for row in rows if row["refused"]}
    assert list(refused) == ["evil"] and refused["evil"].startswith("3: 01 writing "), refused
    assert "(code cell 2); 01 the network" in refused["evil"] and refused["evil"].endswith("(code cell 4)")


def test_a_duplicate_is_decided_by_how_it_matched_not_by_its_time(graded):
    assert statuses(graded, "good") == [grade.PASSED] * 3  # the metadata match, not the newer untouched copy
    feedback = (graded["out"] / "feedback" / "good.md").read_text()
    assert ("`good/01_tiny.ipynb` and `good/0 old/01_tiny.ipynb` are both 01_tiny.ipynb: `good/01_tiny.ipynb` is "
            "graded (matched by the metadata of the student copy; `good/0 old/01_tiny.ipynb` by its file name"
            ) in feedback


def test_a_renamed_notebook_is_matched_by_its_metadata_and_its_huge_output_capped(graded):
    assert statuses(graded, "renamed") == [grade.PASSED] * 3
    # cells: imports, the print, then stub and solution per exercise: the solutions are code cells 4, 6 and 8
    assert [hint.rsplit("(", 1)[1] for hint in hints(graded, "renamed")] == [
        "code cell 4)", "code cell 6)", "code cell 8)"]
    feedback = (graded["out"] / "feedback" / "renamed.md").read_text()
    assert "submitted as `my lab.ipynb`, graded as `01_tiny.ipynb` (matched by the metadata of the student copy)" in feedback
    executed = graded["out"] / "work" / "renamed" / "01_tiny" / "executed.ipynb"
    assert executed.stat().st_size < 2 * sandbox.OUTPUT_CAP_BYTES


def test_deleted_cells_and_an_invalid_notebook_did_not_run_and_say_why(graded):
    assert statuses(graded, "deleted") == [grade.PASSED, grade.DID_NOT_RUN, grade.NOT_ATTEMPTED]  # a stub left
    assert "no cell of the submitted notebook calls check_speedup" in hints(graded, "deleted")[1]
    assert statuses(graded, "broken") == [grade.DID_NOT_RUN] * 3
    assert "not a valid notebook" in (graded["out"] / "feedback" / "broken.md").read_text()
    assert statuses(graded, "zed") == [grade.DID_NOT_RUN] * 3
    assert hints(graded, "zed")[0] == "no readable notebook for this chapter: zed.ipynb could not be read"
    assert "`zed.ipynb` could not be graded: it is not a valid notebook (UnicodeDecodeError" in (
        graded["out"] / "feedback" / "zed.md").read_text()


def test_endless_loops_time_out_and_the_run_goes_on(graded):
    assert statuses(graded, "loop") == [grade.TIMED_OUT, grade.TIMED_OUT, grade.PASSED]
    cell, check = hints(graded, "loop")[:2]
    assert "ran past its time limit of 15 s" in cell and "did not return within 2 s" in check


def test_sys_exit_and_a_killed_kernel_are_crashes_and_the_rest_did_not_run(graded):
    assert statuses(graded, "exits") == [grade.CRASHED, grade.CRASHED, grade.DID_NOT_RUN]
    exit_hint, killed, after = hints(graded, "exits")
    assert "SystemExit" in exit_hint and "code cell 2, the code cell of exercise 1.1 raised" in exit_hint
    assert "kernel died in code cell 3, the code cell of exercise 1.2" in killed
    assert "never ran: the kernel died in code cell 3" in after


def test_writes_outside_connects_and_a_forged_pass_are_refused_and_flagged(graded):
    assert statuses(graded, "evil") == [grade.CRASHED, grade.CRASHED, grade.CRASHED]
    assert all("PermissionError: graded run" in hint for hint in hints(graded, "evil")), hints(graded, "evil")
    assert not graded["outside"].exists()
    log = graded["out"] / "work" / "evil" / "01_tiny" / "checks.jsonl"
    assert "forged" not in log.read_text()
    feedback = (graded["out"] / "feedback" / "evil.md").read_text()
    assert "**Review by hand** before trusting this grade" in feedback and "01 code cell 5: _record" in feedback
    assert "## Refused by the sandbox" in feedback and "- 01_tiny.ipynb: the network" in feedback
    assert "Review by hand" not in (graded["out"] / "feedback" / "good.md").read_text()
    evil = json.loads((graded["out"] / "work" / "evil" / "01_tiny" / "run.json").read_text())["refusals"]
    assert [r["cell"] for r in evil] == [1, 2, 3] and "writing" in evil[0]["what"], evil
    assert "the network" in evil[1]["what"] and "grading log" in evil[2]["what"]


def test_an_honest_run_has_nothing_refused(graded):
    """Nothing the course's own code does (torch, matplotlib, ipykernel, the checks) counts as an attempt."""
    for name in ("good", "loop", "renamed"):
        folder = graded["out"] / "work" / name
        for record in folder.glob("*/run.json"):
            assert json.loads(record.read_text())["refusals"] == [], (name, record)


def test_the_feedback_gives_each_status_and_hint(graded):
    feedback = (graded["out"] / "feedback" / "loop.md").read_text()
    assert feedback.startswith("# Feedback for loop") and "**1 of 3 exercises passed.**" in feedback
    assert "- Exercise 1.2 (check_speedup): timed out. ❌ Not yet. Your function did not return within 2 s" in feedback
    assert "code cell 2 ran past its time limit (15 s)" in feedback and "Refused by the sandbox" not in feedback


def test_two_entries_that_would_be_one_student_are_refused_naming_both(tmp_path):
    for a, b in (("John Smith", "John_Smith"), ("ada", "ada.ipynb"), ("Ada", "ada"), ("Jose\u0301", "Jos\u00e9")):
        subs = tmp_path / f"{a}-{b}".replace("/", "_")
        for name in (a, b):
            (subs / name).parent.mkdir(parents=True, exist_ok=True)
            if name.endswith(".ipynb"):
                (subs / name).write_text("{}")
            else:
                (subs / name).mkdir()
        if len({p.name for p in subs.iterdir()}) < 2:
            continue  # a file system that folds case or normalises names holds only one of them anyway
        with pytest.raises(grade.GradingRefused, match="would both be graded as the student") as refused:
            grade.discover(subs)
        assert f"`{a}`" in str(refused.value) or f"`{b}`" in str(refused.value)
        assert sum(f"`{n}`" in str(refused.value) for n in {p.name for p in subs.iterdir()}) == 2


def test_hidden_entries_are_listed_and_a_huge_file_is_not_read(tmp_path):
    (tmp_path / "ann" / ".ipynb_checkpoints").mkdir(parents=True)
    (tmp_path / "ann" / ".ipynb_checkpoints" / "01_tiny-checkpoint.ipynb").write_text("{}")
    (tmp_path / "ann" / ".secret").mkdir()
    (tmp_path / "ann" / ".secret" / "01_tiny.ipynb").write_text("{}")
    (tmp_path / ".git").mkdir()
    huge = tmp_path / "ann" / "01_tiny.ipynb"
    with huge.open("wb") as f:
        f.truncate(grade.MAX_SUBMISSION_BYTES + 1)  # sparse: nothing is written
    skipped = []
    assert grade.discover(tmp_path, skipped) == {"ann": [huge]}
    assert skipped == [".git", "ann/.secret/01_tiny.ipynb"]
    sub = grade.read_submission("ann", huge, [TINY])
    assert "more than the 50 MB" in sub.problem and sub.course == TINY


def test_a_failure_of_the_grader_itself_is_exit_code_1(tmp_path):
    for student_name, stopped in (("ann", "the kernel died in cell 3"), ("bob", "the grader's worker failed (x)")):
        (tmp_path / "work" / student_name / "01_tiny").mkdir(parents=True)
        (tmp_path / "work" / student_name / "01_tiny" / "run.json").write_text(json.dumps({"stopped": stopped}))
    assert grade.grader_failures(tmp_path) == ["bob/01_tiny: the grader's worker failed (x)"]


def test_grades_are_never_written_inside_the_submissions_or_over_a_foreign_folder(tmp_path, capsys):
    subs = tmp_path / "subs"
    (subs / "ann").mkdir(parents=True)
    nbformat.write(notebook(answered()), subs / "ann" / TINY)
    assert grade.main([str(subs), "--out", str(subs / "grades")]) == 2
    assert "inside the submissions folder" in capsys.readouterr().err and not (subs / "grades").exists()
    foreign = tmp_path / "thesis"
    foreign.mkdir()
    (foreign / "chapter1.tex").write_text("years of work")
    assert grade.main([str(subs), "--out", str(foreign)]) == 2
    assert "not a grades folder" in capsys.readouterr().err
    assert [p.name for p in foreign.iterdir()] == ["chapter1.tex"]
    assert grade.main([str(tmp_path / "nowhere")]) == 2


# --------------------------------------------------------------------------- the course's own notebooks


def test_student_copies_keep_every_exercise_check_and_each_has_a_solution():
    names = grade.exercise_check_names()
    for path in notebook_paths():
        nb = nbformat.read(path, as_version=4)
        expected = grade.expected_exercises(nb, names)
        assert expected, f"{path.name} has no exercise calling a check of gpuformer_lib.exercises"
        assert grade.expected_exercises(student.student_copy(nb), names) == expected, path.name
        solved = {n for c in nb.cells if student.SOLUTION_TAG in c.metadata.get("tags", [])
                  for n in grade._calls(c.source, names)}
        assert set(expected) <= solved, f"{path.name}: exercises without a solution calling their check"


def test_make_student_writes_to_build_student():
    recipe = (REPO_ROOT / "Makefile").read_text().split("\nstudent:")[1].split("\n\n")[0]
    assert "gpuformer_lib.tools.student _build/student" in recipe


def test_student_copies_get_the_data_files_their_notebooks_open(tmp_path):
    """Chapter 10 opens traces/cpu-tiny-step.json beside it (exercise 10.1): the copies' folder has it."""
    chapter10 = next(p for p in notebook_paths() if p.name.startswith("10_"))
    assert student.main([str(tmp_path / "student"), str(chapter10)]) == 0
    assert (tmp_path / "student" / "traces" / "cpu-tiny-step.json").read_bytes() == (
        REPO_ROOT / "notebooks" / "traces" / "cpu-tiny-step.json").read_bytes()
    assert student.main([str(tmp_path / "student"), str(chapter10)]) == 0  # again: the unedited copy is replaced


def fill_in_solutions(instructor: nbformat.NotebookNode, copy: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``copy`` with each solution cell of ``instructor`` inserted after the stub above it."""
    filled = nbformat.from_dict(copy)
    for i, cell in enumerate(instructor.cells):
        if student.SOLUTION_TAG in cell.metadata.get("tags", []):
            stub = next(c for c in reversed(instructor.cells[:i])
                        if c.cell_type == "code" and student.SOLUTION_TAG not in c.metadata.get("tags", []))
            at = next(k for k, c in enumerate(filled.cells) if c.source == stub.source)
            filled.cells.insert(at + 1, new_code_cell(cell.source))
    return filled


def test_solved_student_copies_get_full_marks_and_untouched_ones_zero(tmp_path):
    """Chapter 2 (about 15 s per run on the 2-core CPU): its checks cover a plain check, a prediction
    (through predictions._grade) and an inner checker (check_occupancy_limiter)."""
    source = REPO_ROOT / "notebooks" / "02_gpu_programming.ipynb"
    assert student.main([str(tmp_path / "student"), str(source)]) == 0
    copy = nbformat.read(tmp_path / "student" / source.name, as_version=4)
    subs = tmp_path / "submissions"
    (subs / "solved").mkdir(parents=True)
    (subs / "untouched").mkdir()
    nbformat.write(fill_in_solutions(nbformat.read(source, as_version=4), copy), subs / "solved" / "lab2.ipynb")
    (subs / "untouched" / source.name).write_bytes((tmp_path / "student" / source.name).read_bytes())
    results = grade.grade(subs, tmp_path / "grades", REPO_ROOT / "notebooks", jobs=2, progress=False)
    assert len(results["solved"]) == 5
    assert {status for status, _ in results["solved"].values()} == {grade.PASSED}, results["solved"]
    assert {status for status, _ in results["untouched"].values()} == {grade.NOT_ATTEMPTED}, results["untouched"]
    rows = {r["student"]: r for r in csv.DictReader((tmp_path / "grades" / "grades.csv").open())}
    assert (rows["solved"]["total"], rows["untouched"]["total"], rows["solved"]["out_of"]) == ("5", "0", "5")
    for record in (tmp_path / "grades" / "work").glob("*/*/run.json"):  # a real chapter: nothing refused
        assert json.loads(record.read_text())["refusals"] == [], record


# --------------------------------------------------------------------------- a determined student

def _require_sandbox() -> None:
    """Skip where the system gives no user namespaces, saying so; under .ci/run (GPUFORMER_REQUIRE_SANDBOX=1)
    fail instead, so CI cannot pass without testing the sandbox."""
    import tempfile
    with tempfile.TemporaryDirectory() as scratch:
        works = grade.netns_available() and grade.filesystem_lock_available(Path(scratch))
    if not works:
        message = ("this system does not let an unprivileged user create user, network, PID and mount namespaces "
                   "(unshare), so the sandbox cannot be tested here")
        if os.environ.get("GPUFORMER_REQUIRE_SANDBOX") == "1":
            pytest.fail(message + " (GPUFORMER_REQUIRE_SANDBOX=1)")
        pytest.skip(message)


def _fingerprint(paths: list[Path]) -> dict[str, str]:
    """sha256 of every file under ``paths`` (a folder's files, a file itself), by path; a missing path is noted."""
    import hashlib
    found = {}
    for root in paths:
        if not root.exists():
            found[str(root)] = "missing"
            continue
        for path in [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()):
            found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def test_a_determined_students_notebook_changes_nothing_outside_its_job_folder_and_each_attempt_is_reported(
        tmp_path):
    """The trial's malicious notebook (reviews of 2026-11-27, new-user-and-instructor.md, item 4): a remount by
    ctypes, a `python -S` child running mount, a program, reading solutions through _build and another clone,
    a socket, an endless loop. Nothing outside its job folder changes, no solution is read, and grades.csv and
    the feedback report every attempt."""
    _require_sandbox()
    token = uuid.uuid4().hex[:12]
    course, subs, out = tmp_path / "course", tmp_path / "class", tmp_path / "grades"
    course.mkdir()
    nbformat.write(instructor_copy(), course / TINY)
    clone = tmp_path / "other-clone"  # another clone of the course, with a built book
    (clone / "_build" / "html" / "_sources" / "notebooks").mkdir(parents=True)
    secret = f"SOLUTION-{token}"
    (clone / "_build" / "html" / "_sources" / "notebooks" / TINY).write_text(secret)
    (clone / "notebooks").mkdir()
    (clone / "notebooks" / TINY).write_text(secret)
    home, temp = Path(os.path.expanduser("~")), Path(tempfile.gettempdir())
    targets = {  # where the notebook tries to write: one new file in each place, and files it tries to change
        "home": home / f".gpuformer-canary-{token}", "tmp": temp / f"gpuformer-canary-{token}",
        "parent": tmp_path / f"canary-{token}", "repo": REPO_ROOT / f".canary-{token}",
        "course": course / TINY, "core": REPO_ROOT / "gpuformer_lib" / "exercises" / "_core.py",
        "readme": REPO_ROOT / "README.md"}
    # hashed before and after: what the notebook tries to change, and the folders around it (not all of the
    # repository: other tests running beside this one may write their own files there)
    watched = [targets["core"], targets["readme"], REPO_ROOT / "notebooks" / "03_attention.ipynb", course, clone,
               subs]
    repo_listing = sorted(p.name for p in REPO_ROOT.iterdir())
    w = {name: str(path) for name, path in targets.items()}
    everywhere = [w[k] for k in ("home", "tmp", "parent", "repo", "core", "readme", "course")]
    cells = [
        IMPORTS + f"\nEVERYWHERE = {everywhere!r}",
        # 1. ctypes: remount / read-write, then write outside (the trial's first route)
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print('mount:', libc.mount(None, b'/', None, 32 | 4096, None), ctypes.get_errno())\n"
        f"open({w['parent']!r}, 'w').write('x')",
        # 2. a child Python without the hook, running mount, then writing everywhere (the trial's second route)
        "import subprocess, sys\n"
        "code = ('import subprocess; subprocess.run([\"mount\", \"-o\", \"remount,bind,rw\", \"/\"])\\n'\n"
        "        f'for p in {EVERYWHERE!r}: open(p, \"a\").write(\"gotcha\")')\n"
        "subprocess.run([sys.executable, '-S', '-c', code], check=True)",
        # 2b. the same child with the hook's PYTHONPATH dropped
        "import subprocess, sys\n"
        "subprocess.run([sys.executable, '-c', code], env={'PATH': '/usr/bin'}, check=True)",
        # 3. a program, straight
        f"import subprocess\nsubprocess.run(['sh', '-c', 'echo x > {w['tmp']}; mount -o remount,rw /'], check=True)",
        # 4. reading solutions: another clone's built book and notebooks, the course's own
        f"print(open({str(clone / '_build' / 'html' / '_sources' / 'notebooks' / TINY)!r}).read())",
        f"print(open({str(clone / 'notebooks' / TINY)!r}).read())",
        f"print(open({str(REPO_ROOT / 'notebooks' / '03_attention.ipynb')!r}).read()[:100])",
        # 4b. below Python: the C library's open
        "import ctypes\nlibc = ctypes.CDLL(None)\n"
        f"print(libc.open({str(clone / 'notebooks' / TINY).encode()!r}, 0))",
        # 5. the network
        "import socket\nsocket.create_connection(('192.0.2.1', 80), timeout=2)",
        # 6. writes in the repository and the home folder, from Python
        f"open({w['repo']!r}, 'w').write('x')",
        f"open({w['core']!r}, 'a').write('# forged')",
        # 6b. below the hook for real: code that claims to be torch's compiler may start gcc, and gcc -wrapper runs
        # any program; here a shell script that remounts / read-write and writes everywhere: the OS refuses
        "import importlib.util, os\n"
        "open('evil.sh', 'w').write('echo ran > ran.txt; mount -o remount,bind,rw / ; for p in '\n"
        "                           + ' '.join(EVERYWHERE)\n"
        "                           + '; do echo gotcha >> $p; done')\n"
        "torch = importlib.util.find_spec('torch').submodule_search_locations[0]  # found, not imported: quick\n"
        "fake = os.path.join(torch, '_inductor', 'x.py')\n"
        "exec(compile(\"import subprocess; subprocess.run(['gcc', '-wrapper', 'sh,' + os.path.abspath('evil.sh'), "
        "'-x', 'c', '-c', '/dev/null', '-o', '/dev/null'])\", fake, 'exec'))",
        # 7. an endless loop, then a right answer: the run goes on
        "while True:\n    pass",
        *SOLUTIONS,
    ]
    (subs / "mal").mkdir(parents=True)
    nbformat.write(notebook(cells), subs / "mal" / TINY)
    before = _fingerprint(watched)
    results = grade.grade(subs, out, course, jobs=1, cell_timeout=20, notebook_timeout=300, progress=False)
    assert _fingerprint(watched) == before
    for name in ("home", "tmp", "parent", "repo"):
        assert not targets[name].exists(), f"the notebook wrote {targets[name]}"
    assert sorted(p.name for p in REPO_ROOT.iterdir()) == repo_listing
    assert [s for s, _ in results["mal"].values()] == [grade.PASSED] * 3  # the right answers still count
    job = out / "work" / "mal" / Path(TINY).stem
    executed = (job / "executed.ipynb").read_text()
    assert secret not in executed  # no solution was read, by any route
    assert (job / "work" / "ran.txt").is_file()  # the shell script behind gcc ran, and the OS refused its writes:
    assert "Read-only file system" in (job / "work" / "kernel-output.log").read_text(errors="replace")
    record = json.loads((job / "run.json").read_text())
    assert record["filesystem"] == sandbox.JAILED
    refused = [r["what"] for r in record["refusals"]]
    expected = {  # each attempt, as the record names it
        "ctypes remount": "C library's mount()", "python -S": "python -S", "no PYTHONPATH": "without the sandbox's",
        "a program": "starting the program sh", "the clone's _build": "other-clone/_build",
        "the clone's notebook": f"other-clone/notebooks/{TINY}", "the course's notebook": "03_attention.ipynb",
        "C open": "C library's open()", "socket": "192.0.2.1", "repo write": f".canary-{token}",
        "core write": "_core.py"}
    missing = {k: v for k, v in expected.items() if not any(v in r for r in refused)}
    assert not missing, (missing, refused)
    with (out / "grades.csv").open() as f:
        row = next(csv.DictReader(f))
    assert row["refused"] and str(len(refused)) in row["refused"]
    assert "compile(" in row["flags"] and "ctypes" in row["flags"]  # the route below the hook is flagged
    feedback = (out / "feedback" / "mal.md").read_text()
    assert "Refused by the sandbox" in feedback and "python -S" in feedback
