"""One process at a time per run folder: two that train into the same folder (a `--resume` started
while the run still goes, the same run.name started twice) would interleave their metrics and
overwrite each other's checkpoints.

The lock is a POSIX record lock on RUN_DIR/.lock, held until the process ends (the operating system
drops it when the process dies, even on SIGKILL, so a crash never leaves a stale lock). Record locks
belong to a process, so the same process may take it again (tests call `main` several times).
Where the file system cannot lock (some network mounts) or the platform has no fcntl, the run goes
on unlocked.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from rollwise.errors import RunInUseError

LOCK_NAME = ".lock"
_held: dict[str, int] = {}  # resolved run folder -> the open descriptor holding its lock (never closed)


def lock_run_dir(run_dir: Path) -> None:
    """Hold `run_dir`'s lock for the rest of this process; RunInUseError when another process holds it."""
    try:
        import fcntl
    except ImportError:  # Windows
        return
    key = str(Path(run_dir).resolve())
    if key in _held:
        return
    fd = os.open(Path(run_dir) / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        held_by = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        if e.errno not in (errno.EACCES, errno.EAGAIN):  # no locking here (ENOLCK on some NFS mounts)
            return
        who = f"process {held_by}" if held_by.isdigit() else "another process"
        raise RunInUseError(f"{run_dir} is in use by {who}, which is training in it; wait for it to finish or "
                            "stop it, then run the command again (or give a new run.name)") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[key] = fd
