"""The reward worker's hygiene: processes its functions start that leave its process group, os.environ and sys.path
changed by one call, and the run-start check of reasoning-gym scorers that runs in the trainer.

The helper reward functions live in a module each test writes to tmp_path, referenced as `path/to/file.py:function`.
Every process a test starts is killed at its end (only if it is still the same process: its start time is checked).
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

try:
    import rollwise  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from test_reward_runner_audit import started_trainer

from rollwise.config import RewardConfig
from rollwise.rewards import RewardRunner, verifiers
from rollwise.types import PromptItem

LINUX = sys.platform.startswith("linux") and Path("/proc/self/stat").exists()
needs_proc = pytest.mark.skipif(not LINUX, reason="reads /proc; the worker finds its descendants there")


def _pidfds() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
        return hasattr(signal, "pidfd_send_signal")
    except (AttributeError, OSError):
        return False


PIDFDS = _pidfds()  # what finds the programs a crashed worker left (Linux 5.3+)

HELPERS = r'''
import os
import subprocess
import sys
import time

def _note(path, pid):
    """pid and its start time (for the test to kill it at its end only if it is still that process)."""
    with open(f"/proc/{pid}/stat") as f:
        started = f.read().rsplit(")", 1)[1].split()[19]
    with open(path, "a") as f:
        f.write(f"{pid} {started}\n")

def setsid_child(completion, item):
    """Starts a program in a session of its own (out of the worker's group), writes its pid to item.answer, then
    hangs ("hang"), kills the worker ("crash") or scores 1."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _note(item.answer, child.pid)
    if completion == "hang":
        time.sleep(600)
    if completion == "crash":
        os._exit(1)
    return 1.0

def daemon(completion, item):
    """A daemon's double fork, without exec: the forked child starts a session, forks the daemon and exits, so the
    daemon is an orphan in another group (and its environment is the worker's at start)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                os.write(w, str(os.getpid()).encode())
                time.sleep(600)
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    _note(item.answer, int(os.read(r, 32)))
    os.close(r)
    if completion == "hang":
        time.sleep(600)
    return 1.0

def background_job(completion, item):
    """`sh -c "cmd &"`: sh exits at once, leaving its job an orphan, which ends soon after."""
    out = subprocess.run(["sh", "-c", "sleep 0.2 > /dev/null 2>&1 & echo $!"], capture_output=True, text=True)
    _note(item.answer, int(out.stdout))
    return 1.0

KEPT = {}

def keeps_a_child(completion, item):
    """"start": starts a child that exits with code 3 and keeps its Popen; "wait": its exit code."""
    if completion == "start":
        KEPT["p"] = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
        _note(item.answer, KEPT["p"].pid)
        return 1.0
    if completion == "wait":
        return float(KEPT["p"].wait(timeout=60))
    return 1.0

def changes_env(completion, item):
    os.environ["ROLLWISE_TEST_LEAK"] = "1"
    os.environ.pop("OMP_NUM_THREADS", None)  # one the worker sets at start
    os.environ["PATH"] = "/nowhere"
    sys.path.insert(0, "/nonexistent/rollwise-leak")
    if completion == "rebind":
        os.environ = dict(os.environ, ROLLWISE_TEST_REBOUND="1")
        sys.path = ["/nonexistent/rollwise-rebound"] + sys.path
    return 1.0

def sees_env(completion, item):
    """1 where no change of changes_env shows, and the worker's own variables are there."""
    clean = ("ROLLWISE_TEST_LEAK" not in os.environ and "ROLLWISE_TEST_REBOUND" not in os.environ
             and os.environ.get("OMP_NUM_THREADS") == "1" and os.environ.get("PATH") != "/nowhere"
             and not any(p.startswith("/nonexistent/rollwise-") for p in sys.path)
             and os.getenv("ROLLWISE_TEST_LEAK") is None)
    return float(clean)
'''


@pytest.fixture
def fns(tmp_path: Path) -> str:
    """'path/to/helpers.py:' to prefix a helper's name with."""
    path = tmp_path / "hygiene_helpers.py"
    path.write_text(textwrap.dedent(HELPERS))
    return f"{path}:"


def item(answer: str = "1") -> PromptItem:
    return PromptItem(uid=f"t:{answer}", task="t", question="q", answer=answer)


def cfg(*names: str, timeout: float = 5.0) -> RewardConfig:
    return RewardConfig(functions=[{"name": n} for n in names], timeout=timeout)


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _running(pid: int, started: str | None = None) -> bool:
    """Alive (not gone, not a zombie) and, given its start time, still that process."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z" and (started is None or fields[19] == started)


def _wait_gone(pids: dict[int, str], seconds: float = 15.0) -> list[int]:
    deadline = time.monotonic() + seconds  # a bound on the wait, not a timing under test
    while time.monotonic() < deadline and any(_running(p, s) for p, s in pids.items()):
        time.sleep(0.05)
    return [p for p, s in pids.items() if _running(p, s)]


class Started:
    """The pids a helper wrote to `path`, each with its start time; `kill_all` ends those still running at a test's
    end, whatever happened."""

    def __init__(self, path: Path) -> None:
        self.path, self.pids = path, {}

    def read(self) -> dict[int, str]:
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                pid, started = line.split()
                self.pids[int(pid)] = started
        return self.pids

    def kill_all(self) -> None:
        self.read()
        for pid, started in self.pids.items():
            if _running(pid, started):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def started(tmp_path: Path):
    s = Started(tmp_path / "pids")
    yield s
    s.kill_all()


# ------------------------------------------------------------------ processes that leave the worker's group


@needs_proc
@pytest.mark.parametrize("end", ["timeout", "close", pytest.param("crash", marks=pytest.mark.skipif(
    not PIDFDS, reason="no pidfds: a crashed worker's programs are not looked for"))])
def test_a_program_started_in_a_session_of_its_own_ends_with_the_worker(fns, started, end):
    """subprocess's start_new_session=True (setsid) took the program out of the worker's process group, which is what
    a timeout, a crash and close() killed: it ran on, for ever, after each."""
    runner = RewardRunner(cfg(fns + "setsid_child", timeout=3.0))
    try:
        completion = {"timeout": "hang", "crash": "crash", "close": "ok"}[end]
        res = runner.score([completion], [item(str(started.path))])
        assert (res.timeouts, res.errors) == ((1, 0) if end == "timeout" else (0, 1) if end == "crash" else (0, 0))
        assert len(started.read()) == 1
        if end == "close":
            assert all(_running(p, s) for p, s in started.pids.items())  # between batches it is left alone
    finally:
        runner.close()
    assert _wait_gone(started.read()) == [], f"the program the reward function started outlived the worker ({end})"


@needs_proc
@pytest.mark.parametrize("end", ["timeout", "close"])
def test_a_daemon_a_reward_function_forked_twice_ends_with_the_worker(fns, started, end):
    """A double fork orphans the daemon (init adopted it) in a session of its own: no group kill and no walk of the
    worker's children reached it. The worker, a child subreaper, adopts it instead, so it is found and killed."""
    runner = RewardRunner(cfg(fns + "daemon", timeout=3.0))
    try:
        res = runner.score(["hang" if end == "timeout" else "ok"], [item(str(started.path))])
        assert res.timeouts == (1 if end == "timeout" else 0), res
        assert len(started.read()) == 1
    finally:
        runner.close()
    assert _wait_gone(started.read()) == [], f"the daemon outlived the worker ({end})"


@needs_proc
def test_a_killed_trainer_also_ends_the_programs_that_left_the_workers_group(fns, started, tmp_path):
    """The watchdog's group kill, when the trainer died, left a program started with start_new_session=True."""
    with started_trainer(tmp_path, fns + "setsid_child", "hang", started.path, started.read,
                         "its reward call started") as run:
        assert started.pids, "the reward call did not start"
        run.kill()
        run.wait()
        assert _wait_gone(started.pids) == [], "the program the reward function started outlived the killed trainer"


@needs_proc
def test_an_orphan_the_worker_adopted_is_reaped_once_it_ends(fns, started):
    """As a subreaper the worker adopts orphans (the job `sh -c "cmd &"` leaves) that init would have reaped: left
    unreaped, each would hold a pid for the rest of the run."""
    with RewardRunner(cfg(fns + "background_job")) as runner:
        assert runner.score(["x"], [item(str(started.path))]).rewards == [1.0]
        worker = runner._proc.pid
        (job, _), = started.read().items()
        deadline = time.monotonic() + 30  # bounds on the waits, not timings under test
        while (_stat(job) or ["Z"])[0] != "Z" and time.monotonic() < deadline:
            time.sleep(0.05)
        runner.score(["x"], [item(str(started.path))])  # the worker reaps at a batch's end
        deadline = time.monotonic() + 15
        while (_stat(job) or ["", ""])[1] == str(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (_stat(job) or ["", ""])[1] != str(worker), f"the worker left its adopted job unreaped: {_stat(job)}"


@needs_proc
def test_a_child_a_function_keeps_is_left_for_it_to_wait_for(fns, started):
    """The adopted orphans are reaped, but not a child the function holds a Popen of: reaped by the worker, its
    exit code would read 0."""
    with RewardRunner(cfg(fns + "keeps_a_child")) as runner:
        assert runner.score(["start"], [item(str(started.path))]).rewards == [1.0]
        (pid, _), = started.read().items()
        deadline = time.monotonic() + 30  # a bound on the wait, not a timing under test
        while (_stat(pid) or ["Z"])[0] != "Z" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert runner.score(["other"], [item(str(started.path))]).rewards == [1.0]  # its end: the worker reaps
        assert runner.score(["wait"], [item(str(started.path))]).rewards == [3.0]


# ------------------------------------------------------------------ os.environ and sys.path


@pytest.mark.parametrize("how", ["change", "rebind"])
def test_a_calls_changes_to_the_environment_and_sys_path_do_not_reach_the_next_call(fns, how):
    """A function that set a variable, removed one the worker sets (OMP_NUM_THREADS) or added to sys.path changed
    every later call, any function's, until the worker restarted."""
    with RewardRunner(cfg(fns + "changes_env", fns + "sees_env")) as runner:
        first = runner.score([how, how], [item(), item()])
        again = runner.score(["x"], [item()])
    assert first.parts == [{fns + "changes_env": 1.0, fns + "sees_env": 1.0}] * 2, first
    assert again.rewards == [2.0], again


# ------------------------------------------------------------------ the run-start check of the scorers


def _rg_items(task: str, n: int = 3) -> list[PromptItem]:
    return [PromptItem(uid=f"{task}:{i}", task=task, question="q", answer=str(i),
                       entry={"metadata": {"source_dataset": task}}) for i in range(n)]


def _slow_for(task: str):
    def score(completion: str, item: PromptItem) -> float:
        if item.task != task:
            return 1.0  # full credit for any answer: a lenient scorer
        deadline = time.monotonic() + 30  # a bound, so that a check without a limit still ends (and fails)
        while time.monotonic() < deadline:
            time.sleep(0.05)
        return 0.0
    return score


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="the bound is SIGALRM's (POSIX)")
def test_a_scorer_that_hangs_stops_the_lenient_scorer_check_at_its_budget(monkeypatch):
    """lenient_scorer_note runs the tasks' scorers in the trainer at the run's start, unbounded: one that hung hung
    the run before its first step. It stops at its budget, says so, and keeps what it found before."""
    monkeypatch.setattr(verifiers, "reasoning_gym", _slow_for("slow"))
    before = signal.getsignal(signal.SIGALRM)
    items = _rg_items("lenient") + _rg_items("slow") + _rg_items("after")
    note = verifiers.lenient_scorer_note(items, "reasoning_gym", budget=2.0)
    assert note is not None and "lenient (gold" in note, note
    assert "stopped after 2 s, at task slow: it and 1 later task went unchecked" in note, note
    assert "after (gold" not in note
    assert signal.getsignal(signal.SIGALRM) is before and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    alone = verifiers.lenient_scorer_note(_rg_items("slow"), "reasoning_gym", budget=2.0)
    assert alone is not None and "took too long" in alone and "at task slow: it went unchecked" in alone, alone


def test_fast_scorers_give_the_same_note_with_or_without_the_budget(monkeypatch):
    monkeypatch.setattr(verifiers, "reasoning_gym", _slow_for("none of them"))
    items = _rg_items("a") + _rg_items("b")
    assert verifiers.lenient_scorer_note(items, "reasoning_gym") == \
        verifiers.lenient_scorer_note(items, "reasoning_gym", budget=None)
    assert verifiers.lenient_scorer_note(items, "reasoning_gym").startswith("the reasoning-gym scorer of a (gold")
