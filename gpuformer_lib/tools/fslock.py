"""A read-only view of the file system for one graded notebook's worker, except its own job folder.

    unshare --user --map-root-user --mount python -m gpuformer_lib.tools.fslock FOLDER   # a probe: 0 if it works

Inside its own mount namespace (``unshare --mount``, which :mod:`gpuformer_lib.tools.grade` uses where the system
allows it) a process may remount file systems for itself alone: :func:`lock_filesystem` bind-mounts the writable
folders onto themselves, then remounts every other mount point read-only (``/proc``, ``/sys`` and ``/dev`` are left
as they are, ``/dev/shm`` gets a private tmpfs). The kernel enforces it, so it holds for code below Python
(``ctypes``, a compiled extension) and for programs the notebook starts, which the audit hook of
:mod:`gpuformer_lib.tools.sandbox` cannot see. It does not stop reading files, or writing inside the job folder.
Kept apart from the sandbox module so that the probe starts in a fraction of a second (no nbclient import).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

_NOT_LOCKED = ("/proc", "/sys", "/dev")  # kernel file systems: left as they are (/dev/shm gets a private tmpfs)


def _mount_points() -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
        if point not in points:
            points.append(point)
    return points


def lock_filesystem(writable: list[Path]) -> str | None:
    """Make every file system read-only except the folders ``writable`` (bind-mounted onto themselves first) and
    a private ``/dev/shm``; for a process that has its own mount namespace (``unshare --mount``, as
    :mod:`gpuformer_lib.tools.grade` starts this worker), so nothing outside it changes. Returns None, or what
    failed (then some file systems may still be writable: the audit hook stands alone for them)."""
    mount = shutil.which("mount")
    if mount is None:
        return "no mount command"
    keep = [os.path.realpath(w) for w in writable]
    failed = []

    def run(*args: str) -> None:
        done = subprocess.run([mount, *args], capture_output=True, text=True, timeout=20)
        if done.returncode:
            failed.append(f"mount {' '.join(args)}: {done.stderr.strip()[:200]}")

    points = _mount_points()
    for path in keep:
        run("--bind", path, path)
    for point in points:
        if point in keep or any(point == k or point.startswith(k + "/") for k in _NOT_LOCKED):
            continue
        run("-o", "remount,bind,ro", point)
    if os.path.isdir("/dev/shm"):
        run("-t", "tmpfs", "-o", "size=1g", "tmpfs", "/dev/shm")
    return "; ".join(failed) or None


def _probe_lock(folder: Path) -> int:
    """Lock the file system but ``folder``; 0 if a write there works and one beside it is refused."""
    error = lock_filesystem([folder])
    if error:
        print(error, file=sys.stderr)
        return 1
    try:
        (folder / "inside").write_text("x")
    except OSError as err:
        print(f"could not write inside {folder}: {err}", file=sys.stderr)
        return 1
    try:
        (folder.parent / f"{folder.name}-outside").write_text("x")
    except OSError:
        return 0
    print("a write outside the folder was not refused", file=sys.stderr)
    return 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m gpuformer_lib.tools.fslock FOLDER  (inside unshare --mount; a probe)", file=sys.stderr)
        sys.exit(2)
    sys.exit(_probe_lock(Path(sys.argv[1])))
