"""The file system one graded notebook sees: a root of its own, read-only but for its job folder, holding only an
allowlist of paths; and a kernel that cannot undo it.

    python -m gpuformer_lib.tools.fslock FOLDER   # a probe, inside unshare --user --map-root-user --mount --pid ...

**Why a root of its own.** :mod:`gpuformer_lib.tools.grade` starts each worker inside ``unshare --user
--map-root-user --net --pid --fork --kill-child --mount``: its own user, network, PID and mount namespaces. There the
worker is root of a user namespace and may mount for itself alone. :func:`enter_jail` builds a new root on a small
tmpfs, bind-mounts into it, read-only, only what Python and the course need (:func:`allowlist`: the system's
``/usr``, ``/etc`` and ``/lib`` folders, the Python installation and virtual environment, the library
``gpuformer_lib`` and the data folder), the job folder read-write, a fresh ``/proc`` for the worker's own PID
namespace with its machine-wide parts read-only or covered (:data:`PROC_READ_ONLY`, :data:`PROC_HIDDEN`: a kernel
mapped to the host's root must not write ``/proc/sys``), a ``/dev`` with ``null``, ``zero``, ``full``,
``random`` and ``urandom`` only, and private tmpfs ``/tmp`` and ``/dev/shm``; then it moves the worker into that root (``pivot_root``) and drops the old one. What is
not on the list does not exist for the notebook: the course's notebooks, ``_build`` (the solutions in
``html/_sources`` and ``jupyter_execute``), other clones, the home folder, other students' work.

**Why the kernel cannot undo it.** The worker keeps ``CAP_SYS_ADMIN`` in its user namespace, so a process sharing
that namespace could remount ``/`` read-write (one ``mount -o remount,bind,rw /``, from ``ctypes`` or a child
program). The kernel is therefore started by :func:`kernel_argv` one level further in: a mount namespace of the
worker's in which the job folder becomes read-only but for the work folder, the checks' log and the refusals
log, then a nested user namespace with its own mount namespace (``unshare --user --map-root-user --mount``).
Mounts that a less privileged user namespace inherits are locked together with their read-only flag (see
``mount_namespaces(7)``), so in the kernel a remount, an unmount or a ``setns`` back is refused by the operating
system, whatever code asks: Python, ``ctypes``, a compiled extension, a child program.

What it does not stop: reading what is on the list (the library, its exercise checks included: the solutions are
public anyway), writing in the work folder and the two logs (a notebook can still forge its own results: see
:mod:`gpuformer_lib.exercises._core` and the grader's flags), using CPU and memory within the grader's time limits.
Kept apart from the sandbox module, and free of third-party imports, so that the probe starts in a fraction of a
second.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
# statvfs flags that a bind remount must keep (a user namespace may not clear them on a mount it inherited)
_KEPT_FLAGS = {os.ST_NOSUID: MS_NOSUID, os.ST_NODEV: MS_NODEV, os.ST_NOEXEC: MS_NOEXEC,
               getattr(os, "ST_NOATIME", 1024): 1024, getattr(os, "ST_NODIRATIME", 2048): 2048,
               getattr(os, "ST_RELATIME", 4096): 1 << 21}
DEVICES = ("null", "zero", "full", "random", "urandom")
"""The device nodes a graded notebook sees (no disks, no terminals)."""
SYSTEM = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""System folders on the allowlist (symbolic links such as ``/bin -> usr/bin`` are recreated as links)."""

_libc = ctypes.CDLL(None, use_errno=True)


class JailError(OSError):
    """The jail could not be built: the caller grades without it (and says so) or refuses to grade."""


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
    if _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        err = ctypes.get_errno()
        raise JailError(err, f"mount {source or ''} on {target} ({fstype or 'bind/remount'}): {os.strerror(err)}")


def _bind(source: str, target: str, writable: bool = False) -> None:
    """Bind ``source`` on ``target``, then make that mount read-only unless ``writable``. A read-only bind takes
    the mounts below ``source`` along (the kernel refuses to separate a mount from those a user namespace
    inherited with it) and makes each of them read-only too; a writable one takes ``source`` alone."""
    _mount(source, target, None, MS_BIND | (0 if writable else MS_REC))
    for point in [target] if writable else [p for p in _mount_points() if _under(p, [target])]:
        kept = sum(flag for st, flag in _KEPT_FLAGS.items() if os.statvfs(point).f_flag & st)
        _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_NOSUID | kept | (0 if writable else MS_RDONLY))


def _mount_points() -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
        if point not in points:
            points.append(point)
    return points


def _under(path: str, roots: list[str] | tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def allowlist(extra: list[str | Path] = ()) -> list[str]:
    """What a graded notebook may read: the system folders, this Python (installation and virtual environment),
    Python's own path entries outside the repository, the library ``gpuformer_lib`` (not the repository around it:
    its notebooks and ``_build`` hold the solutions), the data folder, and ``extra``."""
    repo = os.path.realpath(Path(__file__).resolve().parents[2])
    paths = list(SYSTEM)
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        paths += [prefix, os.path.realpath(prefix)]
    paths.append(os.path.dirname(os.path.realpath(sys.executable)))
    paths += [p for p in map(os.path.realpath, filter(None, sys.path))
              if os.path.isdir(p) and not _under(p, [repo]) and p != "/"]
    paths.append(os.path.join(repo, "gpuformer_lib"))
    data = os.environ.get("GPUFORMER_DATA") or os.path.join(repo, "data")
    paths += [data, *map(str, extra)]
    found = []
    for path in paths:
        path = os.path.abspath(path)
        if os.path.lexists(path) and path not in found and path != "/":
            found.append(path)
    return found


def enter_jail(job_dir: Path, readable: list[str] | None = None) -> None:
    """Move this process (root of its own user and mount namespaces, first in its own PID namespace) into a new
    root holding ``readable`` (default :func:`allowlist`) read-only and ``job_dir`` read-write; see the module
    docstring. Raises :class:`JailError` when the system refuses a step (nothing outside this mount namespace
    changed then; the caller must not run untrusted code in it)."""
    job = os.path.realpath(job_dir)
    readable = [os.path.abspath(p) for p in (readable if readable is not None else allowlist())]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here propagates out
    root = os.path.join(job, ".root")
    os.makedirs(root, exist_ok=True)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=755")
    for folder in ("proc", "dev", "tmp", "sys", ".old"):
        os.makedirs(os.path.join(root, folder), exist_ok=True)
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # this PID namespace's processes only
    _mask_proc(root + "/proc")
    _mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=1g,mode=1777")
    _mount("tmpfs", root + "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=755")
    for name in DEVICES:
        Path(root, "dev", name).touch()
        _bind(f"/dev/{name}", f"{root}/dev/{name}", writable=True)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{root}/dev/{name}")
    os.makedirs(f"{root}/dev/shm")
    _mount("tmpfs", f"{root}/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=1g,mode=1777")
    binds: list[str] = []
    for path in sorted(readable, key=len):
        if _under(path, [job]) or any(_under(path, [b]) and os.path.realpath(path) == path for b in binds):
            continue
        target = root + path
        if os.path.islink(path) and os.path.dirname(path) == "/":  # /bin -> usr/bin: the same link
            os.symlink(os.readlink(path), target)
            continue
        real = os.path.realpath(path)  # a path through a link: what it points to is shown at the path asked for
        _make_mount_point(real, target)
        _bind(real, target)
        binds.append(path)
    _make_mount_point(job, root + job)
    _bind(job, root + job, writable=True)
    _bind("/sys", root + "/sys")
    _mount(None, root + "/dev", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    pivot = shutil.which("pivot_root") or "/usr/sbin/pivot_root"
    done = subprocess.run([pivot, root, root + "/.old"], capture_output=True, text=True, timeout=20)
    if done.returncode:
        raise JailError(1, f"pivot_root {root}: {done.stderr.strip()[:200]}")
    os.chdir("/")
    if _libc.umount2(b"/.old", MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise JailError(err, f"dropping the old root: {os.strerror(err)}")
    os.chdir(job)


PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs", "acpi", "scsi")
"""Parts of ``/proc`` that act on the whole machine, made read-only in the jail: a kernel mapped to the host's
root (the grader run as root) could otherwise write host-wide settings (``/proc/sys/kernel/core_pattern`` runs a
program as the host's root) or trigger ``sysrq``. Read-only covers over /proc also stop a nested namespace from
mounting a ``proc`` of its own (the kernel refuses a proc mount that would reveal what these hide)."""
PROC_HIDDEN = ("kcore", "keys", "timer_list", "kmsg", "kallsyms")
"""Files of ``/proc`` covered by ``/dev/null``: the host's memory image, keys, timers and kernel log."""


def _mask_proc(proc: str) -> None:
    for name in PROC_READ_ONLY:
        if os.path.exists(f"{proc}/{name}"):
            _bind(f"{proc}/{name}", f"{proc}/{name}")
    for name in PROC_HIDDEN:
        if os.path.exists(f"{proc}/{name}"):
            _mount("/dev/null", f"{proc}/{name}", None, MS_BIND)


def _make_mount_point(source: str, target: str) -> None:
    if os.path.lexists(target):
        return
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        Path(target).touch()


def kernel_argv(job_dir: Path, writable: list[Path], command: list[str], output: Path | None = None) -> list[str]:
    """The command that starts the graded kernel inside the jail: a mount namespace of the worker's in which
    ``job_dir`` is read-only but for ``writable`` (the work folder and the logs), then a nested user namespace
    with its own mount namespace, where every mount is locked (see the module docstring), then ``command``, its
    standard output and error appended to ``output`` (one of ``writable``'s files or inside one of its folders;
    default: inherited), so that it holds no descriptor on the worker's own log."""
    binds = " && ".join(f"mount --bind {_quote(w)} {_quote(w)}" for w in map(os.path.realpath, writable))
    into = f" >>{_quote(str(output))} 2>&1" if output is not None else ""
    script = (f"{binds} && mount -o remount,bind,ro,nosuid,nodev {_quote(os.path.realpath(job_dir))} && "
              f'cd -- "$PWD" && exec unshare --user --map-root-user --mount -- "$@"{into}')  # cd: onto the new mounts
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", *command]


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _probe(folder: Path) -> int:
    """Build the jail around ``folder`` and check it from a kernel's place: a write to ``folder/work`` works; a
    remount of ``/`` or of ``folder`` read-write from the nested namespace, a write to ``folder`` itself and
    reading this repository's README all fail. 0 when all hold; otherwise what failed, on stderr. The caller
    checks that ``<folder>-outside``, written beside it, did not appear outside the jail."""
    readme = Path(__file__).resolve().parents[2] / "README.md"
    try:
        enter_jail(folder)
    except OSError as err:
        print(f"the jail could not be built: {err}", file=sys.stderr)
        return 1
    inside, outside = folder / "work" / "inside", folder.parent / f"{folder.name}-outside"
    (folder / "work").mkdir(exist_ok=True)
    attempt = (f"mount -o remount,bind,rw / 2>/dev/null; mount -o remount,bind,rw {_quote(str(folder))} "
               f"2>/dev/null; echo x > {_quote(str(inside))}; echo x > {_quote(str(outside))} 2>/dev/null; "
               f"echo x > {_quote(str(folder / 'job-file'))} 2>/dev/null; "
               "cat /proc/sys/kernel/core_pattern > /proc/sys/kernel/core_pattern 2>/dev/null && echo SYSCTL-WRITTEN; "
               f"cat {_quote(str(readme))} >/dev/null 2>&1 && echo README-READ; true")
    done = subprocess.run(kernel_argv(folder, [folder / "work"], ["sh", "-c", attempt]), capture_output=True,
                          text=True, timeout=60)
    problems = []
    if done.returncode or not inside.is_file():
        problems.append(f"the kernel's command failed or could not write its work folder: {done.stderr.strip()}")
    if (folder / "job-file").exists():  # the caller checks ``outside`` from outside (here it is a private /tmp)
        problems.append("a write to the job folder outside the work folder was not refused")
    if "SYSCTL-WRITTEN" in done.stdout:
        problems.append("a host-wide setting in /proc/sys was writable")
    if "README-READ" in done.stdout:
        problems.append(f"{readme}, outside the allowlist, was readable")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m gpuformer_lib.tools.fslock FOLDER  (a probe, inside unshare --user --mount --pid)",
              file=sys.stderr)
        sys.exit(2)
    sys.exit(_probe(Path(sys.argv[1])))
