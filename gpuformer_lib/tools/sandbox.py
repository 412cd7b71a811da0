"""Run one submitted notebook for grading, in its own process, as far as it goes: ``make grade``'s worker.

    python -m gpuformer_lib.tools.sandbox JOB.json      # started by gpuformer_lib.tools.grade, one per notebook

:mod:`gpuformer_lib.tools.grade` copies the notebook into a fresh work folder, writes ``JOB.json`` and starts
this module, inside ``unshare --user --map-root-user --net --ipc --uts --pid --fork --kill-child --mount`` where
the system allows it (a network namespace with nothing but loopback, System V IPC and a host name of its own, a
PID namespace whose processes all die with it, and a mount namespace). There the worker first moves into a root of its own
(:func:`gpuformer_lib.tools.fslock.enter_jail`: only an allowlist of paths, read-only, and the job folder) and
starts the kernel one user namespace further in (:func:`gpuformer_lib.tools.fslock.kernel_argv`), where the
job folder is read-only but for the work folder and the two logs, and no mount can be undone: **the real
boundary**, enforced by the OS kernel for everything the notebook runs, compiled code and programs included. It
executes the copy cell by cell with nbclient: a cell that raises is recorded and the next one runs; a cell past
its time limit is recorded, the kernel interrupted and the run goes on if the kernel answers again; a kernel
that dies, or the notebook's own time limit, ends the run. After every cell the record (``RUN.json``: per cell
its status, error, execution count and the lines of the checks' log and of the refusals log it wrote) is
rewritten, so a worker killed from outside still leaves what it did; at the end it gains ``refusals``
(:func:`refusals`). Outputs are capped per cell, so a cell that prints gigabytes fills neither the worker's
memory nor the executed notebook.

The kernel starts with a ``sitecustomize.py`` (written by :func:`sitecustomize_source`) that installs a Python
audit hook before any of the learner's code runs, in the kernel and in every Python process it starts. It
refuses, and appends to the refusals log (``refusals.jsonl``, opened before the hook; any later open of it, and
truncating its descriptor, is refused; the hook keeps its settings in closures, not in the ``sitecustomize``
module, so reassigning the module's names changes nothing it uses): opening a file for writing, renaming, deleting, linking or changing the mode of anything outside the
work folder; reading notebooks outside the work folder, anything in a ``_build`` folder, and the repository, the
course folder, the submissions and the grades folders (but the library, the environment and the data);
opening the grading log except from code whose file name is ``gpuformer_lib/exercises/_core.py``; network
connects and name look-ups other than loopback; looking up C-library calls that go around the hook through
``ctypes`` (:data:`LOW_LEVEL_CALLS`); and starting any program other than Python with the hook (never ``python
-S``, ``-I``, ``-E`` or an environment without the hook's ``PYTHONPATH``), except a compiler
(:data:`COMPILER_PROGRAMS`: ``g++``, ``cc``, ``openssl``, ...) that torch's compiler or Triton starts (a caller
in ``torch/_inductor``, ``torch/utils/cpp_extension.py`` or ``triton/``), and ``uname`` and ``fc-list``
(asked by ``platform`` and matplotlib; they only read); a shell (``shell=True``,
``os.system``, ``sh -c``) is always refused, so ``torch.utils.collect_env.run('echo x > outside')`` is refused
too.

What the hook does not stop: code that reaches its closures through the garbage collector (``gc.get_objects``)
and rewrites them, after which refusals go unrecorded (the operating system's boundary stands regardless); code
that claims a torch or ``_core.py`` file name (``compile(src, ".../torch/
_inductor/x.py", "exec")``) and so starts a listed compiler or opens the log; what a compiler it lets through
does (``gcc -wrapper`` runs any program); code below Python that does not look functions up by name; reading
files on the allowlist; using memory and CPU. In the jail the OS refuses all of that's writes and reads
outside the allowlist (the grader checks the jail before grading, and warns when it cannot build it); the work
folder and the checks' log stay writable, so a notebook can still forge its own results (see
:mod:`gpuformer_lib.exercises._core`: the grader flags the cells that try). Without the jail the hook is a guard
against accidents and casual cheating, not a security boundary: grade untrusted submissions inside a container
or virtual machine without the course's solutions or other secrets in it (see the instructor's guide).
"""

from __future__ import annotations

import asyncio
import atexit
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbclient.util import ensure_async

from gpuformer_lib.tools import fslock

JAILED = ("a root of its own: only the allowlist readable, all read-only but the work folder and the logs; the "
          "kernel in a nested user namespace that cannot remount")
"""What a run record's ``filesystem`` says when :func:`gpuformer_lib.tools.fslock.enter_jail` held."""
GRADED_KERNEL = "gpuformer-graded"
"""The kernel spec a jailed worker writes into its job folder: ipykernel behind :func:`fslock.kernel_argv`."""

OUTPUT_CAP_BYTES = 200_000
"""Most bytes of output kept per cell; the rest is dropped with a note (the kernel still runs the cell)."""

COMPILER_PROGRAMS = ("c++", "g++", "gcc", "cc", "clang", "clang++", "ld", "nvcc", "ptxas", "openssl")
"""The programs the hook lets torch's compiler (``torch/_inductor``, ``torch/utils/cpp_extension.py``) and Triton
start, by base name (``g++-12``, ``x86_64-linux-gnu-gcc`` included); never a shell."""

PROBE_TIMEOUT_S = 15
"""Seconds the kernel has to answer after a timed-out cell is interrupted, before the run is given up."""

_TEMPLATE = r'''# Written by gpuformer_lib.tools.sandbox for one graded notebook: see that module's docstring.
import os as _os, sys as _sys


def _install():
    # Everything below lives in this function's scope, not in the module: the hook reads its settings and
    # its record's descriptor from closures, so `import sitecustomize; sitecustomize._refuse = ...` changes
    # nothing it uses.

    _WORK = {work!r}
    _HIDDEN = {hidden!r}
    _READABLE_IN_HIDDEN = {readable_in_hidden!r}
    _LOG = {log!r}
    _REFUSALS = {refusals!r}
    _SITE = _os.path.dirname(_os.path.realpath(__file__))  # a child Python must keep it on PYTHONPATH
    _CORE = {core!r}
    _PYTHONS = {pythons!r}
    _WRITABLE = (_WORK, "/dev/null", "/dev/shm")
    _LOW_LEVEL = {low_level!r}
    _ISOLATING_FLAGS = set("SIE")  # python -S, -I, -E: a child that would start without this hook
    _COMPILER_CALLERS = {callers!r}
    _COMPILER_PROGRAMS = {programs!r}
    _INFO_PROGRAMS = ("uname", "fc-list")  # platform.uname() and matplotlib's font cache ask them; they only read
    _SHELLS = ("sh", "bash", "dash", "zsh", "ksh", "csh", "tcsh", "fish", "busybox", "env")
    _LOCAL = ("localhost", "127.0.0.1", "::1", "", None)
    _WRITE_FLAGS = _os.O_WRONLY | _os.O_RDWR | _os.O_APPEND | _os.O_CREAT | getattr(_os, "O_TRUNC", 0)


    def _real(path):
        return _os.path.realpath(_os.fsdecode(path))


    def _inside(path, roots):
        return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


    try:  # opened before the hook is installed; the hook refuses any later open of it
        _REFUSALS_FD = _os.open(_REFUSALS, _os.O_WRONLY | _os.O_APPEND | _os.O_CREAT | _os.O_CLOEXEC, 0o644)
    except OSError:
        _REFUSALS_FD = None


    def _refuse(what):
        if _REFUSALS_FD is not None:  # reported to the instructor (grades.csv, feedback), then refused
            import json
            try:
                _os.write(_REFUSALS_FD, (json.dumps({{"what": what[:300], "pid": _os.getpid()}}) + "\n").encode())
            except (OSError, ValueError):
                pass
        raise PermissionError(f"graded run: {{what}} is not allowed here (the notebook runs in a sandbox that keeps "
                              f"its writes inside its work folder {{_WORK}} and has no network)")


    def _check_write(path, what):
        if isinstance(path, int):
            if _REFUSALS_FD is not None and path == _REFUSALS_FD:
                _refuse(f"{{what}} of the sandbox's record of refusals")
            return
        real = _real(path)
        if not _inside(real, _WRITABLE):
            _refuse(f"{{what}} {{real}}")


    def _is_python(executable):
        if executable is None:
            return False
        name = _os.fsdecode(executable)
        if "/" not in name:
            import shutil
            name = shutil.which(name) or name
        return _real(name) in _PYTHONS


    def _from_compiler_stack():
        """Whether torch's compiler or Triton is asking (torch.compile runs a C++ compiler, and openssl, for its
        kernels): a caller frame in torch/_inductor, torch/utils/cpp_extension.py or triton/."""
        frame = _sys._getframe(2)
        while frame is not None:
            if _inside(_real(frame.f_code.co_filename), _COMPILER_CALLERS):
                return True
            frame = frame.f_back
        return False


    def _basename(executable):
        return _os.path.basename(_os.fsdecode(executable)) if executable is not None else ""


    def _hookless_python(argv, env):
        """Why a Python child would start without this hook (``-S``, ``-I``, ``-E``, or an environment without
        this folder on ``PYTHONPATH``); None if it would have it."""
        args = list(argv[1:]) if isinstance(argv, (list, tuple)) else []
        while args:  # the interpreter's options, up to the script, -c or -m
            arg = _os.fsdecode(args.pop(0)) if isinstance(args[0], (str, bytes)) else ""
            if not arg.startswith("-") or arg in ("-", "--") or arg.startswith("--"):
                break
            flags, taking = arg[1:], None
            for i, flag in enumerate(flags):
                if flag in _ISOLATING_FLAGS:
                    return f"python -{{flag}}"
                if flag in "cmWX":  # the rest of the word, or the next word, is this option's argument
                    taking = flag
                    if flag in "WX" and i == len(flags) - 1 and args:
                        args.pop(0)
                    break
            if taking in ("c", "m"):  # what follows is the code or the module, not options
                break
        if env is not None:
            paths = str(env.get("PYTHONPATH", env.get(b"PYTHONPATH", b"").decode(errors="replace"))).split(":")
            if _SITE not in [_os.path.realpath(p) for p in paths if p]:
                return "a Python without the sandbox's PYTHONPATH"
        return None


    def _allowed_program(executable, argv=None, env=None):
        """Python (with this hook); or a compiler on the list, started by torch's compiler or Triton. Never a shell."""
        name = _basename(executable)
        if name in _SHELLS or (isinstance(argv, (list, tuple)) and len(argv) > 1 and argv[1] == "-c"
                               and _basename(argv[0]) in _SHELLS):
            return False
        if name in _INFO_PROGRAMS:
            return True
        if _is_python(executable):
            hookless = _hookless_python(argv, env)
            if hookless:
                _refuse(f"starting {{hookless}} (a child that would run without the sandbox's checks)")
            return True
        import re
        compiler = re.fullmatch(r"(?:[\w]+-linux-gnu-)?(?:" + "|".join(map(re.escape, _COMPILER_PROGRAMS))
                                + r")(?:-[\d.]+)?", name)
        return bool(compiler) and _from_compiler_stack()


    def _hook(event, args):
        if event == "open":
            path, mode, flags = args
            if isinstance(path, int) or path is None:
                return
            real = _real(path)
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS)
            if real == _LOG:
                caller = _sys._getframe(1).f_code.co_filename
                if not (writing and _real(caller) == _CORE):
                    _refuse(f"opening the grading log {{real}}")
                return
            if real == _REFUSALS:
                _refuse(f"opening the sandbox's record of refusals {{real}}")
            if writing and not _inside(real, _WRITABLE):
                _refuse(f"writing {{real}}")
            if not _inside(real, (_WORK, _SITE)) and (
                    (_inside(real, _HIDDEN) and not _inside(real, _READABLE_IN_HIDDEN)) or real.endswith(".ipynb")
                    or "/_build/" in real):
                _refuse(f"reading {{real}} (the course's notebooks, their builds and other learners' work are "
                        "not readable here)")
        elif event == "ctypes.dlsym":
            name = args[1] if len(args) > 1 else None
            name = name.decode(errors="replace") if isinstance(name, bytes) else name
            if isinstance(name, str) and name in _LOW_LEVEL:
                _refuse(f"calling the C library's {{name}}() through ctypes")
        elif event in ("os.rename", "os.replace", "os.link", "os.symlink"):
            _check_write(args[1], event.split(".")[1])
            if event != "os.symlink":
                _check_write(args[0], event.split(".")[1])
        elif event in ("os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime",
                       "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr", "shutil.rmtree"):
            _check_write(args[0], event.split(".")[1])
        elif event in ("socket.connect", "socket.sendto", "socket.bind"):
            address = args[1]
            if isinstance(address, tuple) and address and not (
                    str(address[0]) in _LOCAL or str(address[0]).startswith("127.")):
                _refuse(f"the network ({{event}} to {{address[0]}})")
        elif event == "socket.getaddrinfo":
            host = args[0]
            host = host.decode() if isinstance(host, bytes) else host
            if not (host in _LOCAL or str(host).startswith("127.")):
                _refuse(f"the network (looking up {{host}})")
        elif event == "subprocess.Popen":
            executable, argv = args[0], args[1]
            program = executable or (argv[0] if isinstance(argv, (list, tuple)) and argv else argv)
            if not _allowed_program(program, argv, args[3] if len(args) > 3 else None):
                _refuse(f"starting the program {{program}} (only Python, and a compiler started by torch.compile)")
        elif event in ("os.exec", "os.posix_spawn"):
            if not _allowed_program(args[0], args[1], args[2] if len(args) > 2 else None):
                _refuse(f"starting the program {{args[0]}} (only Python, and a compiler started by torch.compile)")
        elif event == "os.spawn":
            if not _allowed_program(args[1], args[2], args[3] if len(args) > 3 else None):
                _refuse(f"starting the program {{args[1]}} (only Python, and a compiler started by torch.compile)")
        elif event in ("os.system", "pty.spawn", "os.startfile"):
            _refuse(f"{{event}}")


    _sys.addaudithook(_hook)


_install()
del _install
'''


LOW_LEVEL_CALLS = ("mount", "umount", "umount2", "unshare", "setns", "pivot_root", "chroot", "syscall", "ptrace",
                   "prctl", "capset", "execve", "execv", "execvp", "execvpe", "execl", "execlp", "system", "popen",
                   "fork", "vfork", "clone", "clone3", "posix_spawn", "posix_spawnp", "open", "open64", "openat",
                   "openat64", "creat", "creat64", "fopen", "fopen64", "freopen", "rename", "renameat", "renameat2",
                   "unlink", "unlinkat", "rmdir", "mkdir", "mkdirat", "truncate", "truncate64", "ftruncate",
                   "chmod", "fchmod", "fchmodat", "chown", "link", "linkat", "symlink", "symlinkat", "socket",
                   "connect", "bind", "sendto", "kill", "dlopen")
"""C library functions the hook refuses to look up through ``ctypes`` (and reports): the routes below Python
around its checks. Looking them up is refused; libraries keep loading with ``ctypes.CDLL``."""


def sitecustomize_source(work: Path, hidden: list[Path], log: Path, refusals: Path | None = None,
                         readable_in_hidden: list[Path] = ()) -> str:
    """The ``sitecustomize.py`` that installs the audit hook for a run in ``work`` (see the module docstring):
    ``hidden`` (but ``readable_in_hidden`` and ``work``) may not be read, ``log`` is opened by the checks only,
    and each refusal is appended to ``refusals`` (default: ``refusals.jsonl`` beside ``log``). It is to be
    written as ``sitecustomize.py`` into a folder of its own, which the children's ``PYTHONPATH`` must keep."""
    refusals = refusals or Path(log).with_name("refusals.jsonl")
    core = Path(__file__).resolve().parents[1] / "exercises" / "_core.py"
    pythons = sorted({os.path.realpath(sys.executable), os.path.realpath(sys._base_executable)})
    callers = []  # the code that may start a compiler: torch's compiler and Triton, found without importing them
    for name, parts in (("torch", ("_inductor", "utils/cpp_extension.py")), ("triton", ("",))):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            root = os.path.realpath(os.path.dirname(spec.origin))
            callers += [os.path.join(root, part).rstrip("/") for part in parts]
    library = Path(__file__).resolve().parents[1]
    from gpuformer_lib.data import data_dir  # imported here: the worker itself does not need torch to start
    readable = [library, Path(sys.prefix), data_dir(), *readable_in_hidden]
    return _TEMPLATE.format(work=os.path.realpath(work), hidden=[os.path.realpath(p) for p in hidden],
                            readable_in_hidden=[os.path.realpath(p) for p in readable],
                            log=os.path.realpath(log), refusals=os.path.realpath(refusals),
                            core=str(core), pythons=pythons, callers=callers,
                            programs=COMPILER_PROGRAMS, low_level=LOW_LEVEL_CALLS)


class _CappedClient(NotebookClient):
    """An nbclient that keeps at most :data:`OUTPUT_CAP_BYTES` of output per cell."""

    def output(self, outs: list, msg: dict, display_id: Any, cell_index: int) -> Any:
        size = self._sizes.get(cell_index, 0) + len(json.dumps(msg.get("content", {}), default=str))
        self._sizes[cell_index] = size
        if size > OUTPUT_CAP_BYTES:
            if cell_index not in self._capped:
                self._capped.add(cell_index)
                outs.append(nbformat.v4.new_output("stream", name="stderr",
                                                   text=f"[grader: output past {OUTPUT_CAP_BYTES:,} bytes dropped]\n"))
            return None
        return super().output(outs, msg, display_id, cell_index)


def _loopback_up() -> bool:
    """Bring up loopback in a fresh network namespace (the kernel's channels use it); False if that fails."""
    try:
        return subprocess.run(["ip", "link", "set", "lo", "up"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _lines(log: Path) -> int:
    """How many lines the checks' log holds: a cell's results are the lines it added."""
    try:
        return log.read_bytes().count(b"\n")
    except OSError:
        return 0


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def run_job(job: dict, filesystem: str | None = None) -> dict:
    """Execute the job's notebook as far as it goes; return (and keep writing) the run record."""
    work, record_path = Path(job["work"]), Path(job["record"])
    record: dict[str, Any] = {"cells": [], "stopped": None, "seconds": 0.0, "kernel": "not started",
                              "filesystem": filesystem}
    nb = nbformat.read(work / job["notebook"], as_version=4)
    transport = "tcp"
    if job.get("netns") and not _loopback_up():
        transport = "ipc"  # no loopback: the kernel's channels go through files in the work folder instead
    kernel = GRADED_KERNEL if filesystem == JAILED else job.get("kernel", "python3")
    client = _CappedClient(nb, timeout=job["cell_timeout"], kernel_name=kernel,
                           allow_errors=True, interrupt_on_timeout=False, record_timing=False,
                           startup_timeout=120, resources={"metadata": {"path": str(work)}})
    client._sizes, client._capped = {}, set()
    client.km = client.create_kernel_manager()
    if transport == "ipc":
        client.km.transport, client.km.ip = "ipc", str(work / ".kernel-ipc")
    start = time.monotonic()
    try:
        asyncio.run(_run_cells(client, job, record, record_path, start))
    except Exception as err:  # noqa: BLE001  the kernel failed to start, or nbclient itself failed: say so
        record["stopped"] = record["stopped"] or f"the run failed: {type(err).__name__}: {str(err)[:300]}"
    finally:
        atexit.unregister(client._cleanup_kernel)  # the kernel is gone or never started
    record["seconds"] = round(time.monotonic() - start, 2)
    record["refusals"] = refusals(record, Path(job["refusals"])) if job.get("refusals") else []
    _write_json(record_path, record)
    nbformat.write(nb, job["executed"])
    return record


_OS_REFUSALS = ("Read-only file system", "Operation not permitted", "Permission denied")


def refusals(record: dict, path: Path) -> list[dict]:
    """What the sandbox refused, each ``{"what", "cell"}`` (``cell``: the index of the notebook cell that was
    running, None when unknown): the audit hook's record (``path``, one JSON line per refusal, attributed by the
    cells' ``refusal_lines``), and the operating system's refusals that ended a cell (an ``OSError`` saying
    read-only or not permitted that the hook did not raise)."""
    found = []
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    for number, line in enumerate(lines):
        try:
            what = str(json.loads(line)["what"])
        except (ValueError, KeyError, TypeError):
            what = f"an unreadable line in the sandbox's record of refusals: {line[:100]!r}"
        cell = next((c["index"] for c in record["cells"]
                     if c.get("refusal_lines") and c["refusal_lines"][0] <= number < c["refusal_lines"][1]), None)
        found.append({"what": what, "cell": cell})
    for c in record["cells"]:
        text = f"{c.get('ename', '')}: {c.get('evalue', '')}"
        if c["status"] == "error" and "graded run" not in text and any(m in text for m in _OS_REFUSALS):
            found.append({"what": f"the operating system refused: {text[:300]}", "cell": c["index"]})
    return found


async def _run_cells(client: NotebookClient, job: dict, record: dict, record_path: Path, start: float) -> None:
    nb, deadline = client.nb, start + job["notebook_timeout"]
    log = Path(job["kernel_env"].get("GPUFORMER_GRADE_LOG") or os.devnull)
    refused = Path(job.get("refusals") or os.devnull)
    replies: dict[int, dict] = {}
    client.on_cell_error = lambda cell, cell_index, execute_reply: replies.__setitem__(cell_index, execute_reply)
    async with client.async_setup_kernel(env=job["kernel_env"]):
        record["kernel"] = "started"
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code" or not cell.source.strip():
                continue
            left = deadline - time.monotonic()
            if left < 1:
                record["stopped"] = (f"the notebook's time limit ({job['notebook_timeout']:g} s) was reached "
                                     f"before cell {index + 1}")
                break
            client.timeout = max(1, int(min(job["cell_timeout"], left)))
            entry: dict[str, Any] = {"index": index, "status": "ok"}
            first_line, first_refusal = _lines(log), _lines(refused)
            cell_start = time.monotonic()
            try:
                await client.async_execute_cell(cell, index)
                if index in replies:  # the kernel's reply says the cell raised (its outputs may be capped)
                    content = replies[index].get("content", {})
                    entry.update(status="error", ename=content.get("ename", "?"),
                                 evalue=str(content.get("evalue", ""))[:500])
            except CellTimeoutError:
                entry.update(status="timeout", limit_s=client.timeout)
            except DeadKernelError:
                entry["status"] = "dead"
            entry["execution_count"] = cell.get("execution_count")
            entry["seconds"] = round(time.monotonic() - cell_start, 2)
            entry["log_lines"] = [first_line, _lines(log)]  # the checks' results this cell reported
            entry["refusal_lines"] = [first_refusal, _lines(refused)]  # what the sandbox refused it
            record["cells"].append(entry)
            record["seconds"] = round(time.monotonic() - start, 2)
            _write_json(record_path, record)
            if entry["status"] == "dead":
                record["stopped"] = f"the kernel died in cell {index + 1}"
                break
            if entry["status"] == "timeout":
                recovered = await _recovered(client)
                entry["log_lines"][1] = _lines(log)  # what the interrupted cell reported on its way out
                entry["refusal_lines"][1] = _lines(refused)
                _write_json(record_path, record)
                if not recovered:
                    record["stopped"] = (f"the kernel did not recover after cell {index + 1} ran past its time "
                                         "limit and was interrupted")
                    break


async def _recovered(client: NotebookClient) -> bool:
    """Interrupt a timed-out cell and see whether the kernel answers a trivial cell again."""
    for task in asyncio.all_tasks():  # nbclient leaves the timed-out cell's output reader running: it would
        if "_async_poll_output_msg" in getattr(task.get_coro(), "__qualname__", ""):  # eat the next cells' output
            task.cancel()
    try:
        await ensure_async(client.km.interrupt_kernel())
        probe = nbformat.v4.new_code_cell("pass")
        client.timeout = PROBE_TIMEOUT_S
        client.nb.cells.append(probe)
        try:
            await client.async_execute_cell(probe, len(client.nb.cells) - 1)
        finally:
            client.nb.cells.pop()
        return True
    except Exception:  # noqa: BLE001  a second timeout, a dead kernel: not recovered
        return False


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m gpuformer_lib.tools.sandbox JOB.json (started by gpuformer_lib.tools.grade)",
              file=sys.stderr)
        return 2
    job = json.loads(Path(args[0]).read_text())
    locked = None
    if job.get("lock_fs"):
        job_dir = Path(job["record"]).parent
        try:
            fslock.enter_jail(job_dir, fslock.allowlist(job.get("readable", [])))
        except OSError as err:  # the grader probed this before grading: a failure now is the machine's
            locked = f"not locked ({err})"
            record = {"cells": [], "stopped": f"the run failed: the sandbox could not be built ({err})",
                      "seconds": 0.0, "kernel": "not started", "filesystem": locked, "refusals": []}
            _write_json(Path(job["record"]), record)
            return 1
        locked = JAILED
        writable = [Path(job["work"]), Path(job["kernel_env"]["GPUFORMER_GRADE_LOG"]), Path(job["refusals"])]
        command = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        spec = job_dir / "jupyter" / "kernels" / GRADED_KERNEL
        spec.mkdir(parents=True, exist_ok=True)
        output = Path(job["work"]) / "kernel-output.log"  # what the kernel and its programs print outside cells
        _write_json(spec / "kernel.json", {"argv": fslock.kernel_argv(job_dir, writable, command, output),
                                           "display_name": "graded notebook", "language": "python",
                                           "interrupt_mode": "signal", "metadata": {"debugger": False}})
        os.environ["JUPYTER_PATH"] = str(job_dir / "jupyter")
    run_job(job, locked)
    return 0


if __name__ == "__main__":
    sys.exit(main())
