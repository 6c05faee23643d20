"""The reward worker's descendants: find and end the processes the worker's reward functions start (Linux, /proc).

The worker runs in a session and process group of its own, and a group kill (os.killpg) ended the processes its reward
functions start. A process that leaves the group (setsid, subprocess's start_new_session=True, a daemon's double
fork) escaped it and ran on after a timeout, a crash or close(). So, on Linux (/proc):
- the worker is a "child subreaper" (prctl PR_SET_CHILD_SUBREAPER): a descendant whose parent dies (a double fork)
  is adopted by the worker rather than by init, so while the worker lives all its descendants are in its tree. It
  reaps the adopted ones that end, between batches (`_reap_adopted`); an orphan's os.getppid() is the worker's pid;
- ending a live worker (a timeout: the trainer; close(): the worker itself; the trainer's end: the watchdog) stops
  (SIGSTOP) the worker, then each of its descendants, each before its own children are read (a stopped process
  starts none and reaps none, so the pids read stay its children's), then kills (SIGKILL) them all (`_kill_tree`);
- each worker puts a random token in its environment (_TOKEN_VAR), which the programs its functions run inherit:
  after the worker died on its own (a crash: its descendants went to init, out of its tree) the processes whose
  /proc/PID/environ holds the token are killed (`_kill_marked`, which needs pidfds).
Not covered: after a crash, a descendant without the token (a fork of the worker without exec, whose /proc environ
is the worker's at its start; a program given an environment without it, env={...} or `env -i`); a process the
worker's user may not signal (a setuid program); one started by another process on a function's behalf (a service
manager's, a container daemon's: not a descendant). Without /proc (not Linux) only the group kill remains.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

_TOKEN_VAR = "ROLLWISE_REWARD_WORKER"
_PR_SET_CHILD_SUBREAPER = 36
_MAX_PASSES = 64  # of a walk that stops the tree: a pass that finds no process not yet stopped ends it


def _become_subreaper() -> bool:
    """Make this process adopt its orphaned descendants (Linux); False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state, ppid, pgrp, ...); None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].decode().split()
    except (OSError, IndexError):
        return None


def _has_children_files() -> bool:
    return os.path.exists(f"/proc/self/task/{threading.get_native_id()}/children")


def _children_of(pids: list[int]) -> dict[int, list[int]]:
    """The child processes of each of `pids` ([] for one that is gone): /proc/PID/task/*/children, or where the
    kernel lacks those files (CONFIG_PROC_CHILDREN), the parent pid in each process's /proc/PID/stat."""
    out: dict[int, list[int]] = {p: [] for p in pids}
    if _has_children_files():
        for p in pids:
            with contextlib.suppress(OSError):
                for task in os.listdir(f"/proc/{p}/task"):
                    with contextlib.suppress(OSError, ValueError), open(f"/proc/{p}/task/{task}/children") as f:
                        out[p] += [int(c) for c in f.read().split()]
        return out
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for name in entries:
        if name.isdigit():
            fields = _stat(int(name))
            if fields is not None and len(fields) > 1 and int(fields[1]) in out:
                out[int(fields[1])].append(int(name))
    return out


def _pidfd(pid: int) -> int | None:
    """A pidfd of `pid` (Linux 5.3+): signals sent through it reach that process or none, never one that took its
    pid after it ended. None where there is none (the process is gone, or no pidfds here)."""
    if not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def _send(pid: int, fd: int | None, sig: int) -> bool:
    try:
        if fd is not None:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)
        return True
    except OSError:  # gone, or not ours to signal (a setuid program)
        return False


def _kill_tree(root: int, include_root: bool) -> int:
    """SIGKILL the descendants of `root` (a process this one is sure of: its unreaped child, or itself), and `root`
    too if include_root; returns how many were signalled. Each is stopped before its children are read (see above):
    none can start a process unseen, and a pid read is not reused before the kill; a pid is also checked to be a
    child of one of them after its pidfd is opened. Passes repeat until one finds nothing new, for an orphan adopted
    by a subreaper (the worker) after that one's children were read. Whatever was stopped is killed, also on an
    error."""
    if not os.path.isdir("/proc/self"):
        return 0
    me = os.getpid()
    fds: dict[int, int | None] = {}  # pid -> its pidfd: stopped, to kill
    tree, in_tree, seen = [root], {root}, {root, me}
    try:
        if include_root:
            fds[root] = _pidfd(root)
            _send(root, fds[root], signal.SIGSTOP)
        for _ in range(_MAX_PASSES):
            new = [c for kids in _children_of(tree).values() for c in kids if c not in seen]
            if not new:
                break
            for c in new:
                seen.add(c)
                fd = _pidfd(c)
                fields = _stat(c)  # read after the pidfd opened: the parent of the process the pidfd is of
                if fields is None or len(fields) < 2 or int(fields[1]) not in in_tree:
                    if fd is not None:
                        os.close(fd)
                    continue
                fds[c] = fd
                _send(c, fd, signal.SIGSTOP)
                tree.append(c)
                in_tree.add(c)
    finally:
        killed = 0
        for pid, fd in fds.items():
            killed += _send(pid, fd, signal.SIGKILL)
            if fd is not None:
                os.close(fd)
    return killed


def _kill_marked(token: str) -> int:
    """SIGKILL the processes whose environment holds `token` (see above; Linux with pidfds, else nothing): each
    pidfd is opened before its environment is read, so a pid reused meanwhile is never signalled. Whatever was
    stopped is killed, also on an error. Returns how many."""
    if not token or not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal"):
        return 0
    needle, me = f"{_TOKEN_VAR}={token}".encode(), os.getpid()
    found: dict[int, int] = {}  # pid -> pidfd, stopped
    try:
        for _ in range(_MAX_PASSES):  # until a pass finds none new: a marked process may start one before it stops
            try:
                entries = [int(n) for n in os.listdir("/proc") if n.isdigit()]
            except OSError:
                break
            new = 0
            for pid in entries:
                if pid == me or pid in found:
                    continue
                fd = _pidfd(pid)
                if fd is None:
                    continue
                try:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        marked = needle in f.read().split(b"\0")
                except OSError:  # gone, or another user's
                    marked = False
                if marked:
                    found[pid], new = fd, new + 1
                    _send(pid, fd, signal.SIGSTOP)
                else:
                    os.close(fd)
            if not new:
                break
    finally:
        killed = 0
        for pid, fd in found.items():
            killed += _send(pid, fd, signal.SIGKILL)
            os.close(fd)
    return killed


def _alive_child(pid: int | None) -> bool:
    """Whether `pid` is a child of this process that has not ended (a zombie, or one reaped, is not), asked
    without reaping it: only then is its pid sure to be still the worker's, for `_kill_tree`."""
    if pid is None or not hasattr(os, "waitid"):
        return False
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except OSError:  # ChildProcessError: reaped already
        return False


def _owned_children() -> set[int]:
    """The pids of child processes that code in this process will wait for: subprocess.Popen objects and
    multiprocessing processes (a pool's). `_reap_adopted` leaves their zombies to them: reaped here, the owner would
    read exit code 0 (subprocess) or a process that never ends (multiprocessing)."""
    owned: set[int] = set()
    mp_process = sys.modules.get("multiprocessing.process")
    for proc in list(getattr(mp_process, "_children", ())):
        with contextlib.suppress(Exception):
            if proc.pid:
                owned.add(proc.pid)
    subprocess = sys.modules.get("subprocess")
    if subprocess is not None:
        import gc

        for obj in gc.get_objects():
            if isinstance(obj, subprocess.Popen) and obj.returncode is None:
                owned.add(obj.pid)
    return owned


_left_to_owners: set[int] = set()  # ended children `_reap_adopted` found owned: not looked for again while they wait


def _reap_adopted() -> None:
    """Reap the worker's ended children that no code here waits for: as a subreaper it adopts orphans (the job that
    `sh -c "cmd &"` leaves), which init would have reaped; unreaped, each would hold a pid to the worker's end. Called
    between batches, on the worker's main thread. A child the worker's code started without a Popen or a
    multiprocessing object (os.fork, os.posix_spawn) and waits for only after it ended and a batch went by is reaped
    here too, and its owner's wait then fails (ChildProcessError)."""
    try:  # whether any child has ended, asked without reaping it: one system call, most batches no more
        if os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            return
    except ChildProcessError:  # no children
        return
    me = os.getpid()
    zombies = {c for c in _children_of([me])[me] if (_stat(c) or ["?"])[0] == "Z"}
    if zombies <= _left_to_owners:  # (a zombie's pid is not reused before it is reaped)
        return
    owned = _owned_children()
    for pid in zombies - owned:
        with contextlib.suppress(OSError):
            os.waitpid(pid, os.WNOHANG)
    _left_to_owners.clear()
    _left_to_owners.update(zombies & owned)


def watch(worker: int) -> None:
    """The watchdog (rewards.runner._start_watchdog starts it in the worker's group, as `python proctree.py
    WORKER_PID`, its stdin the trainer's lifeline): once stdin reads EOF (the trainer is gone), if the worker is still
    its parent (alive, its pid not reused), stop and kill it and its descendants (`_kill_tree`), then the group,
    itself included. Without /proc, or once the worker is gone, the group only."""
    with contextlib.suppress(Exception):
        while sys.stdin.buffer.read(65536):
            pass
    with contextlib.suppress(Exception):
        if os.getppid() == worker:
            _kill_tree(worker, include_root=True)
    os.killpg(0, signal.SIGKILL)


if __name__ == "__main__":
    watch(int(sys.argv[1]))
