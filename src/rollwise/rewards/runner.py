"""Score completions with the configured reward functions, safely.

The functions run in one worker process (multiprocessing "spawn": the trainer has torch
threads, so it must not fork). A whole batch goes to the worker in one message; the worker
answers after every (sample, function) call. A call that raises, returns NaN/None/a
non-number, or runs past `RewardConfig.timeout` scores 0 and is counted; on a timeout the
worker is killed and restarted and the batch continues after the stuck call; a call that kills the
worker (a crash, os._exit, the out-of-memory killer) scores 0 and the worker is restarted. A function
failing 64 calls in a row, or a worker that cannot be restarted, stops the run (its last checkpoint
stays).

Each call starts as the worker got ready: its working directory, os.environ and sys.path are put back after every
call. The processes reward functions start end with the worker (a kill, a crash, close(), the trainer's end), also
those that leave its process group (setsid, a daemon's double fork): see rollwise.rewards.proctree for how, and
for what is not covered.
"""

from __future__ import annotations

import contextlib
import copy
import math
import multiprocessing as mp
import os
import secrets
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.util import Finalize
from typing import Any, Self

from rollwise.config import ConfigError, RewardConfig
from rollwise.errors import RewardWorkerError
from rollwise.rewards.proctree import (
    _TOKEN_VAR,
    _alive_child,
    _become_subreaper,
    _kill_marked,
    _kill_tree,
    _reap_adopted,
)
from rollwise.types import PromptItem

MAX_MESSAGES = 5
MESSAGE_CHARS = 500  # of an exception's message: one that holds a whole document must not flood stderr and the logs
LIVENESS_CHECK_S = 0.2  # how often a wait on the worker also checks that it is alive
# a function that fails (raises, hangs, returns no number) on this many calls in a row is broken, not unlucky:
# the run stops (its last checkpoint stays) instead of training on its zeros to the end
FAILING_IN_A_ROW = 64
STARTUP_TIMEOUT = 120.0  # seconds for the worker to import its functions (not a reward call)


@dataclass
class RewardResult:
    """Per-sample weighted rewards and parts, plus what went wrong (counted, not raised)."""

    rewards: list[float]
    parts: list[dict[str, float]]
    errors: int = 0
    timeouts: int = 0
    nans: int = 0
    messages: list[str] = field(default_factory=list)

    def _note(self, kind: str, message: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.messages) < MAX_MESSAGES:
            self.messages.append(message)


# ------------------------------------------------------------------ worker side


def _check(name: str, value: Any) -> tuple[float, str, str]:
    """(score, status, message) for a function's return value (numpy/0-d torch scalars work)."""
    try:
        score = None if isinstance(value, (str, bytes)) else float(value)
    except Exception:  # noqa: BLE001  (None, lists, multi-element tensors, ...)
        score = None
    if score is None:
        return 0.0, "errors", f"{name} returned {type(value).__name__} {str(value)[:60]!r}, expected a number"
    if not math.isfinite(score):
        return 0.0, "nans", f"{name} returned {score}"
    return score, "ok", ""


def _watch_parent(parent_pid: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            with contextlib.suppress(Exception):  # those that left its group (setsid) too
                _kill_tree(os.getpid(), include_root=False)
            if hasattr(os, "killpg") and os.getpgrp() == os.getpid():  # the processes its reward functions started too
                os.killpg(0, signal.SIGKILL)
            os._exit(1)


def _start_watchdog(lifeline: Connection) -> None:
    """A process in the worker's group that kills the group once the trainer is gone (its end of `lifeline`, whose
    other end only the trainer holds, reads EOF), and first the worker's descendants that left the group
    (rollwise.rewards.proctree run as a script: `watch`). _watch_parent, a thread, cannot run while a reward function
    holds the GIL (a catastrophic regex, a C loop): the worker then outlived a killed trainer for as long as that call
    ran."""
    import subprocess

    from rollwise.rewards import proctree

    with contextlib.suppress(OSError):  # it cannot start: the thread alone watches
        # -I: none of the user's environment or paths (proctree needs the standard library alone)
        subprocess.Popen([sys.executable, "-I", proctree.__file__, str(os.getpid())], stdin=lifeline.fileno(),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
    lifeline.close()


def _restore(environ: Any, env: dict[str, dict], path: list[str], path_value: list[str]) -> None:
    """os.environ and sys.path as they were when the worker got ready (`environ` and `path`: the objects, `env` and
    `path_value`: their contents): one call's changes must not change the next one's behaviour (any function's).
    A change made around os.environ (os.putenv, C code's setenv) is not seen."""
    if os.environ is not environ:  # rebound: os.environ = {...}
        os.environ = environ  # noqa: B003 - the original mapping back, not a new environment
    # os._Environ keeps the encoded variables in _data: comparing those costs well under a microsecond a call
    unchanged = environ._data == env["_data"] if hasattr(environ, "_data") else dict(environ) == env["vars"]
    if not unchanged:
        vars_ = env["vars"]
        for var in [var for var in environ if var not in vars_]:
            with contextlib.suppress(Exception):
                del environ[var]
        for var, value in vars_.items():
            if environ.get(var) != value:
                with contextlib.suppress(Exception):
                    environ[var] = value
    if sys.path is not path or path != path_value:
        sys.path = path
        path[:] = path_value


def _worker_main(conn: Connection, names: list[str], sys_path: list[str], parent_pid: int,
                 lifeline: Connection | None = None, token: str = "") -> None:
    if token:  # before the watchdog starts: the processes its functions start carry it (see _kill_marked)
        os.environ[_TOKEN_VAR] = token
    if hasattr(os, "setsid"):  # a group of its own: a kill also ends the processes its reward functions start
        # in a session of its own too: in the trainer's, the trainer's death orphaned the group while the watchdog
        # had it stopped, and the kernel's SIGHUP to such a group ended the worker before the watchdog found the
        # programs that had left its group (they ran on, 1 kill in 15 under load)
        os.setsid()
        if lifeline is not None:
            _start_watchdog(lifeline)
    adopts = _become_subreaper()  # and those that leave the group, through it (see rollwise.rewards.proctree)
    me = os.getpid()
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TOKENIZERS_PARALLELISM"):
        os.environ[var] = "false" if var == "TOKENIZERS_PARALLELISM" else "1"
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # a reward function that leaks memory: the kernel's out-of-memory killer then takes this worker (restarted, the
    # call counted) rather than the trainer, whose model makes it the larger process
    with contextlib.suppress(OSError):
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    home = os.getcwd()
    sys.path[:] = sys_path
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    from rollwise.rewards import verifiers

    try:
        fns = [verifiers.resolve(n) for n in names]
        if "reasoning_gym" in names:
            import reasoning_gym  # noqa: F401  (import time must not count against a call)
        if "math_verify" in names:
            verifiers.math_verify("1", PromptItem(uid="", task="", question="", answer="1"))
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(1)
    except BaseException as e:  # noqa: BLE001  (reported to the parent, which raises)
        conn.send(("init_error", f"{type(e).__name__}: {e}"))
        return
    # what each call starts from: the variables set above and at import are kept, a call's changes are undone
    environ, path, path_value = os.environ, sys.path, list(sys.path)
    env = {"vars": dict(environ), "_data": dict(getattr(environ, "_data", {}))}
    conn.send(("ready",))
    while True:
        if adopts:
            with contextlib.suppress(Exception):  # housekeeping: never a reason to fail
                _reap_adopted()
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] == "stop":
            with contextlib.suppress(Exception):  # the trainer's group kill misses those that left the group
                _kill_tree(me, include_root=False)
            return
        _, first_fn, completions, items = msg
        if "reasoning_gym" in names:
            verifiers.prepare_reasoning_gym(items)
        conn.send(("prepared",))
        for i, (completion, item) in enumerate(zip(completions, items)):
            for f in range(first_fn if i == 0 else 0, len(fns)):
                try:
                    # a user function gets a copy: a group's samples share one item, which it may change in place
                    # (the built-in verifiers do not; a copy costs about as much as a cheap reward)
                    out = _check(names[f], fns[f](completion, copy.deepcopy(item) if ":" in names[f] else item))
                except BaseException as e:  # noqa: BLE001  (the contract: count, never stop)
                    try:
                        why = f"{type(e).__name__}: {e}"
                    except BaseException:  # noqa: BLE001  (an exception whose str() raises)
                        why = f"{type(e).__name__} (its message could not be read)"
                    if len(why) > MESSAGE_CHARS:
                        why = f"{why[:MESSAGE_CHARS]}... ({len(why)} characters)"
                    out = (0.0, "errors", f"{names[f]} raised {why}")
                if os.getpid() != me:  # a child the function forked (os.fork) came back here: only the worker answers
                    os._exit(1)
                with contextlib.suppress(OSError):  # os.chdir() in one call must not move the later ones (any function's)
                    os.chdir(home)
                _restore(environ, env, path, path_value)  # nor a change to os.environ or sys.path
                conn.send(out)


# ------------------------------------------------------------------ parent side


@contextlib.contextmanager
def _sigint_ignored_by_children() -> Any:
    """SIGINT ignored while the worker starts, so that it inherits the ignore: a Ctrl-C (which reaches the whole
    foreground group) during its imports printed a KeyboardInterrupt traceback from it. Only the main thread may
    change a handler; elsewhere the worker ignores SIGINT once its own code runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        if before is not None:  # None: a handler not set from Python (an embedding program's), not restorable here
            signal.signal(signal.SIGINT, before)


def _stop(proc: Any, conn: Connection, lifeline: Connection | None = None, token: str = "") -> None:
    if _alive_child(proc.pid):  # before its watchdog wakes (lifeline's close): the worker's descendants outside its
        with contextlib.suppress(Exception):  # group are found through the worker itself, while it lives
            _kill_tree(proc.pid, include_root=True)
    with contextlib.suppress(OSError):
        conn.close()
    if lifeline is not None:
        with contextlib.suppress(OSError):
            lifeline.close()
    if proc.pid is not None and hasattr(os, "killpg"):  # the worker's group: processes its reward functions started
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
    if proc.is_alive():
        proc.kill()
    proc.join(timeout=5)
    with contextlib.suppress(Exception):  # those a worker that died on its own (a crash) left to init
        _kill_marked(token)


def _resolve_in_time(name: str) -> None:
    """resolve(name) in this process, given STARTUP_TIMEOUT as the worker is: a module that hangs at
    import would otherwise hang the run before any limit applies. The import runs in a daemon thread
    that is left behind when it takes too long (the run stops with the error)."""
    box: dict[str, BaseException] = {}

    def target() -> None:
        from rollwise.rewards.verifiers import resolve

        try:
            resolve(name)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    t = threading.Thread(target=target, name=f"rollwise-import-{name}", daemon=True)
    t.start()
    t.join(STARTUP_TIMEOUT)
    if t.is_alive():
        raise ConfigError(f"reward function '{name}': importing it took more than {STARTUP_TIMEOUT:g} s; does its "
                          "module do work at import (a download, a server, input())? Move that into the function "
                          "or behind a cache, then start again")
    err = box.get("error")
    if err is not None and "main thread" in str(err.__cause__ or err):  # signal.signal() at import: main thread only
        from rollwise.rewards.verifiers import resolve

        resolve(name)  # no time limit here; the worker's start-up still has one
        return
    if err is not None:
        raise err


class RewardRunner:
    """Scores batches with the weighted sum of `cfg.functions`; see the module docstring.

    Unknown or unimportable functions raise ConfigError here, before any model loads. The
    worker starts on `start()` or the first `score` call; `close()` (or `with`) stops it.
    """

    def __init__(self, cfg: RewardConfig) -> None:
        self.cfg = cfg
        self.names = [spec.name for spec in cfg.functions]
        self.weights = [spec.weight for spec in cfg.functions]
        self.keys: list[str] = []
        for name in self.names:
            key, k = name, 2
            while key in self.keys:
                key, k = f"{name}#{k}", k + 1
            self.keys.append(key)
        for name in self.names:
            _resolve_in_time(name)  # fail fast: ConfigError naming the function
        self.restarts = 0
        self._told: set[tuple[str, str]] = set()  # (function, kind) already shown on stderr
        self._failing: dict[str, tuple[int, str]] = {}  # function -> (calls failed in a row, the last message)
        self._started = False  # whether a worker has started once (a later failure to start is not the config's)
        self._lock = threading.Lock()
        self._proc: Any = None
        self._conn: Connection | None = None
        self._finalizer: Finalize | None = None
        self._dead_exitcode: int | None = None  # the exit code of the worker `_kill` found dead (None: alive or unknown)

    # -- worker lifecycle

    def _start(self) -> Connection:
        ctx = mp.get_context("spawn")
        token = secrets.token_hex(16)  # marks the processes this worker's functions run (see _kill_marked)
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        watched, lifeline = ctx.Pipe(duplex=False)  # the worker's watchdog reads EOF when `lifeline` closes
        proc = ctx.Process(
            target=_worker_main,
            args=(child_conn, self.names, list(sys.path), os.getpid(), watched, token),
            name="rollwise-reward-worker",
            daemon=False,  # reward functions may start their own processes
        )
        with _sigint_ignored_by_children():
            proc.start()
        child_conn.close()
        watched.close()
        self._proc, self._conn = proc, parent_conn
        self._finalizer = Finalize(self, _stop, args=(proc, parent_conn, lifeline, token), exitpriority=10)
        msg = self._recv(STARTUP_TIMEOUT)
        if msg is None or msg[0] != "ready":
            self._kill()
            why = msg[1] if msg is not None and msg[0] == "init_error" else "it died or did not start in time"
            if self._started:  # a restart mid-run (after a hang or a crash): the functions imported before
                raise RewardWorkerError(f"the reward worker for reward.functions {', '.join(self.names)} failed to restart "
                                        f"({why}); continue with `rollwise train --resume RUN_DIR`")
            raise ConfigError(f"the reward worker for reward.functions {', '.join(self.names)} failed to start ({why}): "
                              "check that each module imports in a fresh `python -c 'import MODULE'`, and keep slow "
                              f"setup out of import time (the worker has {STARTUP_TIMEOUT:g} s to start)")
        self._started = True
        return parent_conn

    def _recv(self, timeout: float) -> tuple | None:
        """The next worker message; None after `timeout` seconds; ("dead",) if the worker died.

        The worker's death is also checked on its process, not only on its end of the pipe: a process a reward function
        forked (a sandbox, a multiprocessing pool) inherits that end and keeps it open, and a crash was then waited out
        as a hang (or, between batches, as a batch never prepared)."""
        assert self._conn is not None
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if self._conn.poll(max(0.0, min(left, LIVENESS_CHECK_S))):
                    return self._conn.recv()
                if self._proc is not None and not self._proc.is_alive():
                    return self._conn.recv() if self._conn.poll(0) else ("dead",)  # its last words first
                if left <= LIVENESS_CHECK_S:
                    return None
        except (EOFError, OSError):
            return ("dead",)

    def _how_it_died(self) -> str:
        """How the worker process ended (after `_kill`, which waits for it), for the message of the call it died in."""
        code = self._dead_exitcode
        if code is None:
            return "its end of the pipe closed"
        if code < 0:
            with contextlib.suppress(ValueError):
                name = signal.Signals(-code).name
                return f"it was killed by {name}" + (", as the out-of-memory killer does" if name == "SIGKILL" else "")
            return f"it was killed by signal {-code}"
        return f"it exited with code {code}"

    def _kill(self, wait: float = 0.0) -> None:
        """Stop the worker now; `wait`: seconds to let one whose pipe closed finish dying, for its own exit code."""
        if wait and self._proc is not None:
            self._proc.join(wait)
        alive = self._proc is not None and self._proc.is_alive()  # (is_alive also collects the exit code of a dead one)
        self._dead_exitcode = None if self._proc is None or alive else self._proc.exitcode
        if self._finalizer is not None:
            self._finalizer()  # runs _stop once
        self._proc, self._conn, self._finalizer = None, None, None

    def start(self) -> None:
        """Start the worker now rather than at the first `score`: a run's setup then includes its
        start-up (seconds: it imports the reward functions' modules) instead of its first step's
        time/reward_s, and a function that fails to import in it stops the run before the model loads."""
        with self._lock:
            if self._conn is None:
                self._start()

    def close(self) -> None:
        """Stop the worker (a later `score` starts a new one)."""
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.send(("stop",))
            if self._proc is not None:
                self._proc.join(timeout=2)
        self._kill()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- scoring

    def score(self, completions: list[str], items: list[PromptItem]) -> RewardResult:
        """Weighted rewards for completions[i] answering items[i]."""
        with self._lock:  # one worker, one pipe: the asynchronous loop scores from two threads
            return self._score(completions, items)

    def _note(self, result: RewardResult, kind: str, name: str, message: str, sample: int) -> None:
        """Count a failed call in `result`; the first failure of each kind of each function is also
        shown on stderr, whatever the progress display (a run otherwise trains on its zeros)."""
        result._note(kind, f"sample {sample}: {message}")
        self._failing[name] = (self._failing.get(name, (0, ""))[0] + 1, message)
        if (name, kind) not in self._told:
            self._told.add((name, kind))
            print(f"rollwise: warning: reward function {message}; the call scored 0 and the run goes on. Later "
                  f"{kind} of {name} are only counted (metric reward/{kind})", file=sys.stderr, flush=True)
        self._stop_if_broken()  # now, not after the batch: a hanging function would time out on every call of it

    def _stop_if_broken(self) -> None:
        broken = [(name, n, last) for name, (n, last) in self._failing.items() if n >= FAILING_IN_A_ROW]
        if broken:
            name, n, last = broken[0]
            raise RewardWorkerError(
                f"reward function {name} failed on {n} calls in a row (the last: {last}); a run "
                "would train on its zeros. Fix the function (or drop it from reward.functions), then continue from the "
                "last checkpoint with `rollwise train --resume RUN_DIR`")

    def _score(self, completions: list[str], items: list[PromptItem]) -> RewardResult:
        if len(completions) != len(items):
            raise ValueError(f"score: {len(completions)} completions but {len(items)} items")
        n, nf = len(items), len(self.names)
        values = [[0.0] * nf for _ in range(n)]
        result = RewardResult(rewards=[], parts=[])
        pos = 0  # next call, numbered sample * nf + function
        retried = False  # whether a worker that died before preparing this batch was replaced once already
        try:
            while pos < n * nf:
                conn = self._conn if self._conn is not None else self._start()
                i0 = pos // nf
                batch = ("batch", pos % nf, completions[i0:], items[i0:])
                try:
                    conn.send(batch)
                except OSError:  # the idle worker died since the last batch: start afresh
                    self._kill()
                    self.restarts += 1
                    self._start().send(batch)
                reply = self._recv(STARTUP_TIMEOUT)
                if reply != ("prepared",):
                    self._kill()
                    if reply == ("dead",) and not retried:  # it died idle (its pipe held open) or preparing: once more
                        retried = True
                        self.restarts += 1
                        continue
                    kind, why = ("errors", "died") if reply == ("dead",) else ("timeouts", "stuck")
                    for p in range(pos, n * nf):
                        result._note(kind, f"sample {p // nf}: reward worker {why} preparing the batch")
                    break
                while pos < n * nf:
                    msg = self._recv(self.cfg.timeout)
                    if msg is None or msg == ("dead",):
                        died = msg is not None
                        self._kill(wait=1.0 if died else 0.0)
                        self.restarts += 1
                        i, name = pos // nf, self.names[pos % nf]
                        if died:
                            self._note(result, "errors", name, f"{name} killed the reward worker ({self._how_it_died()})",
                                       i)
                        else:
                            self._note(result, "timeouts", name,
                                       f"{name} ran past reward.timeout={self.cfg.timeout:g} s", i)
                        pos += 1
                        break
                    score, status, message = msg
                    values[pos // nf][pos % nf] = score
                    if status != "ok":
                        self._note(result, status, self.names[pos % nf], message, pos // nf)
                    else:
                        self._failing.pop(self.names[pos % nf], None)
                    pos += 1
        except BaseException:
            self._kill()  # the worker is mid-batch; never reuse it
            raise
        self._stop_if_broken()
        for row in values:
            result.parts.append(dict(zip(self.keys, row)))
            result.rewards.append(sum(w * v for w, v in zip(self.weights, row)))
        return result
