"""RewardRunner audit: reward functions that hang, crash, misbehave or leave processes behind (each test a few seconds).

The helper reward functions live in a module each test writes to tmp_path, referenced as `path/to/file.py:function`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

try:
    import rollwise  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rollwise.config import RewardConfig
from rollwise.errors import RewardWorkerError
from rollwise.rewards import RewardRunner
from rollwise.rewards import runner as runner_mod
from rollwise.types import PromptItem

HELPERS = r'''
import ctypes
import os
import subprocess
import sys
import threading
import time

def answer(completion, item):
    """float(completion): the sample's own number, so that a misattributed reward shows."""
    return float(completion)

def hang(completion, item):
    if completion == "busy":
        while True:
            pass
    if completion == "sleep":
        time.sleep(600)
    if completion == "read":
        r, w = os.pipe()
        os.read(r, 1)
    if completion == "thread":
        t = threading.Thread(target=time.sleep, args=(600,))
        t.start()
        t.join()
    return float(completion)

def crash(completion, item):
    if completion == "exit":
        sys.exit(3)
    if completion == "_exit":
        os._exit(0)
    if completion == "segv":
        ctypes.string_at(0)
    if completion == "kill":  # as the OOM killer would
        os.kill(os.getpid(), 9)
    if completion == "raise":
        raise ValueError("bad answer")
    return float(completion)

class Weird:
    def __float__(self):
        raise TypeError("no float")
    def __str__(self):
        raise RuntimeError("no str")

def returns(completion, item):
    import numpy as np
    import torch
    return {
        "none": None, "str": "1.0", "list": [1.0], "nan": float("nan"), "inf": float("inf"), "ninf": -float("inf"),
        "true": True, "false": False, "np": np.float32(0.25), "npnan": np.float64("nan"), "npint": np.int64(2),
        "t0": torch.tensor(0.5), "tnan": torch.tensor(float("nan")), "tvec": torch.tensor([1.0, 2.0]),
        "big": 10 ** 400, "weird": Weird(), "complex": 1j, "dict": {"a": 1},
    }[completion]

def chatty(completion, item):
    sys.stdout.write("x" * 1_000_000 + "\n")
    sys.stdout.flush()
    print("y" * 1000, file=sys.stderr)
    return 1.0

def chdir_away(completion, item):
    os.chdir(item.answer)
    return 1.0

def where_am_i(completion, item):
    """1 in the folder the run started in (its cwd), 0 elsewhere."""
    return float(os.getcwd() == item.question)

def child_then_answer(completion, item):
    """Starts a child that outlives the call (pid written to item.answer), then scores."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(item.answer, "a") as f:
        f.write(f"{child.pid}\n")
    if completion == "hang":
        time.sleep(600)
    return 1.0

def huge_error(completion, item):
    raise ValueError("z" * 5_000_000)

def fork_then_die(completion, item):
    """A sandbox that forks a helper (which inherits the worker's end of the pipe), then crashes."""
    if completion == "die":
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)
        os._exit(1)
    return float(completion)

def dies_after_returning(completion, item):
    """Leaves a forked helper (holding the worker's end of the pipe) and a thread that ends the worker once the call
    has returned: the worker dies idle, between batches."""
    if completion == "first":
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)
        threading.Timer(0.2, os._exit, args=(1,)).start()
        return 1.0
    return float(completion)

def holds_the_gil(completion, item):
    """Writes the worker's pid to item.answer, then runs a regex that backtracks for ages without releasing the GIL."""
    import re
    with open(item.answer, "w") as f:
        f.write(str(os.getpid()))
    re.match(r"(a+)+$", "a" * 64 + "b")
    return 1.0

def ok_unless(completion, item):
    if completion == "ok":
        return 1.0
    if completion == "hang":
        time.sleep(600)
    if completion == "die":
        os._exit(1)
    raise KeyError("nope")
'''


@pytest.fixture()
def fns(tmp_path: Path) -> str:
    """'path/to/helpers.py:' to prefix a helper's name with."""
    path = tmp_path / "audit_helpers.py"
    path.write_text(textwrap.dedent(HELPERS))
    return f"{path}:"


def item(answer: str = "1", question: str = "q") -> PromptItem:
    return PromptItem(uid=f"t:{answer}", task="t", question=question, answer=answer)


def cfg(*names: str, timeout: float = 1.0, weights: list[float] | None = None) -> RewardConfig:
    weights = weights or [1.0] * len(names)
    return RewardConfig(functions=[{"name": n, "weight": w} for n, w in zip(names, weights)], timeout=timeout)


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _children() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


def _wait_gone(pids, seconds: float = 5.0) -> list[int]:
    deadline = time.monotonic() + seconds  # a bound on the wait, not a timing under test
    while time.monotonic() < deadline and any(_running(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _running(p)]


# ------------------------------------------------------------------ hangs


@pytest.mark.parametrize("how", ["busy", "sleep", "read", "thread"])
def test_a_hanging_call_times_out_scores_0_and_the_batch_keeps_each_samples_reward(fns, how):
    with RewardRunner(cfg(fns + "hang", fns + "answer", timeout=0.5)) as runner:
        res = runner.score(["1", how, "3", "4"], [item()] * 4)
        assert res.rewards == [2.0, 0.0, 6.0, 8.0], res
        assert [p[fns + "answer"] for p in res.parts] == [1.0, 0.0, 3.0, 4.0]  # float("busy") raises
        assert (res.timeouts, res.errors, runner.restarts) == (1, 1, 1), res
        assert "ran past reward.timeout=0.5 s" in res.messages[0]
        assert runner.score(["5"], [item()]).rewards == [10.0]


def test_rewards_keep_the_completions_order_across_several_restarts_mid_batch(fns):
    comps = ["1", "sleep", "3", "sleep", "5", "6", "sleep"]
    with RewardRunner(cfg(fns + "answer", fns + "hang", timeout=0.4)) as runner:
        res = runner.score(comps, [item()] * len(comps))
    assert [p[fns + "answer"] for p in res.parts] == [1.0, 0.0, 3.0, 0.0, 5.0, 6.0, 0.0]  # float("sleep") raises
    assert [p[fns + "hang"] for p in res.parts] == [1.0, 0.0, 3.0, 0.0, 5.0, 6.0, 0.0]
    assert res.timeouts == 3 and res.errors == 3 and runner.restarts == 3


# ------------------------------------------------------------------ crashes and bad values


@pytest.mark.parametrize(("how", "says"), [
    ("exit", "raised SystemExit: 3"), ("_exit", "killed the reward worker (it exited with code 0)"),
    ("segv", "killed the reward worker (it was killed by SIGSEGV)"),
    ("kill", "killed the reward worker (it was killed by SIGKILL, as the out-of-memory killer does)"),
    ("raise", "raised ValueError: bad answer"),
])
def test_a_call_that_exits_or_crashes_the_worker_scores_0_and_the_rest_is_scored(fns, how, says, capsys):
    with RewardRunner(cfg(fns + "crash", timeout=5)) as runner:
        t0 = time.monotonic()
        res = runner.score(["1", how, "3"], [item()] * 3)
        assert time.monotonic() - t0 < 4, "a crash was waited out as a hang"
        assert res.rewards == [1.0, 0.0, 3.0], res
        assert (res.errors, res.timeouts, res.nans) == (1, 0, 0), res
        assert res.messages == [f"sample 1: {fns}crash {says}"]
        assert runner.score(["2", how], [item()] * 2).rewards == [2.0, 0.0]
    err = capsys.readouterr().err
    assert err.count("rollwise: warning: reward function") == 1 and says in err, err


RETURNS = [  # what the function returns, its score, the counter it lands in
    ("none", 0.0, "errors"), ("str", 0.0, "errors"), ("list", 0.0, "errors"), ("dict", 0.0, "errors"),
    ("nan", 0.0, "nans"), ("inf", 0.0, "nans"), ("ninf", 0.0, "nans"), ("npnan", 0.0, "nans"),
    ("tnan", 0.0, "nans"), ("true", 1.0, None), ("false", 0.0, None), ("np", 0.25, None), ("npint", 2.0, None),
    ("t0", 0.5, None), ("tvec", 0.0, "errors"), ("big", 0.0, "errors"), ("weird", 0.0, "errors"),
    ("complex", 0.0, "errors"),
]


def test_each_kind_of_return_value_scores_and_counts_as_documented(fns, monkeypatch):
    monkeypatch.setattr(runner_mod, "MAX_MESSAGES", 100)
    values = [v for v, _, _ in RETURNS]
    with RewardRunner(cfg(fns + "returns", timeout=30)) as runner:
        res = runner.score(values, [item()] * len(values))
        assert runner.restarts == 0
    assert res.rewards == [s for _, s, _ in RETURNS] and all(type(r) is float for r in res.rewards), res
    assert (res.errors, res.nans, res.timeouts) == tuple(sum(k == kind for _, _, k in RETURNS)
                                                         for kind in ("errors", "nans", "timeouts")), res
    failed = [f"sample {i}:" for i, (_, _, k) in enumerate(RETURNS) if k is not None]
    assert [m.split(" ", 2)[0] + " " + m.split(" ", 2)[1] for m in res.messages] == failed, res.messages
    assert all(("returned nan" in m or "returned inf" in m or "returned -inf" in m)
               == (RETURNS[int(m.split()[1][:-1])][2] == "nans") for m in res.messages), res.messages


def test_a_function_printing_a_lot_is_scored_and_leaves_the_protocol_alone(fns, capfd):
    with RewardRunner(cfg(fns + "chatty", timeout=10)) as runner:
        res = runner.score(["a"] * 3, [item()] * 3)
    assert res.rewards == [1.0] * 3 and res.errors == 0 and runner.restarts == 0, res
    capfd.readouterr()


def test_a_function_that_changes_the_folder_does_not_move_the_later_calls(fns, tmp_path):
    away = tmp_path / "away"
    away.mkdir()
    here = os.getcwd()
    with RewardRunner(cfg(fns + "chdir_away", fns + "where_am_i", timeout=30)) as runner:
        res = runner.score(["a", "b"], [item(str(away), question=here)] * 2)
    assert [p[fns + "where_am_i"] for p in res.parts] == [1.0, 1.0], res


def test_a_huge_error_message_is_cut_short(fns, capsys):
    with RewardRunner(cfg(fns + "huge_error", timeout=30)) as runner:
        res = runner.score(["a", "b"], [item()] * 2)
    assert res.errors == 2 and all(len(m) < 2000 for m in res.messages), [len(m) for m in res.messages]
    assert len(capsys.readouterr().err) < 5000


def test_a_crash_is_seen_at_once_even_when_a_forked_helper_holds_the_pipe_open(fns, capsys):
    """The worker's death was noticed only by the end of its pipe, which a process it forked still held open: the
    crash was waited out as a hang (reward.timeout per crash) and counted in reward/timeouts."""
    with RewardRunner(cfg(fns + "fork_then_die", timeout=6)) as runner:
        t0 = time.monotonic()
        res = runner.score(["1", "die", "3"], [item()] * 3)
        assert time.monotonic() - t0 < 5, "a crash was waited out as a hang"
    assert res.rewards == [1.0, 0.0, 3.0] and (res.errors, res.timeouts) == (1, 0), res
    assert "fork_then_die killed the reward worker (it exited with code 1)" in res.messages[0], res.messages


def test_a_worker_that_died_between_batches_is_restarted_and_the_next_batch_scored(fns, monkeypatch):
    """A worker that died idle while a process it forked held its pipe open took the next batch (the send did not
    fail), never answered, and the whole batch scored 0 as timeouts after STARTUP_TIMEOUT (120 s)."""
    monkeypatch.setattr(runner_mod, "STARTUP_TIMEOUT", 5.0)
    with RewardRunner(cfg(fns + "dies_after_returning", timeout=5)) as runner:
        assert runner.score(["first"], [item()]).rewards == [1.0]
        time.sleep(0.6)
        t0 = time.monotonic()
        res = runner.score(["2", "3"], [item()] * 2)
        assert time.monotonic() - t0 < 4.5
    assert res.rewards == [2.0, 3.0] and (res.errors, res.timeouts) == (0, 0), res


@pytest.mark.skipif(not Path("/proc/self/oom_score_adj").exists(), reason="Linux's out-of-memory killer")
def test_the_out_of_memory_killer_takes_the_worker_before_the_trainer(fns):
    """A reward function that leaks memory grows the worker until the kernel kills a process: the trainer, whose
    model made it the larger, was as likely a victim as the worker (the run died instead of one call)."""
    with RewardRunner(cfg(fns + "answer", timeout=30)) as runner:
        runner.start()
        assert Path(f"/proc/{runner._proc.pid}/oom_score_adj").read_text().strip() == "1000"
    assert Path("/proc/self/oom_score_adj").read_text().strip() != "1000"  # the trainer keeps its own


# ------------------------------------------------------------------ failures in a row


def test_failures_in_a_row_count_across_batches_kinds_and_restarts_and_reset_on_success(fns, monkeypatch):
    monkeypatch.setattr(runner_mod, "FAILING_IN_A_ROW", 4)
    with RewardRunner(cfg(fns + "ok_unless", timeout=0.4)) as runner:
        assert runner.score(["x", "hang", "ok"], [item()] * 3).rewards == [0.0, 0.0, 1.0]  # reset
        assert runner.score(["x", "die", "hang"], [item()] * 3).rewards == [0.0] * 3  # 3 in a row
        with pytest.raises(RewardWorkerError, match=r"ok_unless failed on 4 calls in a row \(the last: .*KeyError"):
            runner.score(["x", "ok"], [item()] * 2)
        assert runner.score(["ok", "x", "x", "x"], [item()] * 4).errors == 3  # reset by the success


def test_one_function_failing_does_not_reset_anothers_count(fns, monkeypatch):
    monkeypatch.setattr(runner_mod, "FAILING_IN_A_ROW", 3)
    with RewardRunner(cfg(fns + "ok_unless", fns + "answer", timeout=5)) as runner:
        runner.score(["1", "2"], [item()] * 2)  # ok_unless fails twice, answer succeeds
        with pytest.raises(RewardWorkerError, match="ok_unless failed on 3 calls in a row"):
            runner.score(["3"], [item()])


# ------------------------------------------------------------------ weights


def test_weighted_sum_with_one_function_failing(fns):
    with RewardRunner(cfg(fns + "answer", fns + "crash", fns + "hang", timeout=0.5,
                          weights=[2.0, -1.0, 0.5])) as runner:
        res = runner.score(["4", "raise", "sleep", "segv"], [item()] * 4)
    assert res.parts == [
        {fns + "answer": 4.0, fns + "crash": 4.0, fns + "hang": 4.0},
        {fns + "answer": 0.0, fns + "crash": 0.0, fns + "hang": 0.0},
        {fns + "answer": 0.0, fns + "crash": 0.0, fns + "hang": 0.0},
        {fns + "answer": 0.0, fns + "crash": 0.0, fns + "hang": 0.0},
    ], res
    assert res.rewards == [2 * 4.0 - 4.0 + 0.5 * 4.0, 0.0, 0.0, 0.0]


# ------------------------------------------------------------------ shutdown


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_closing_leaves_no_process_behind_also_after_a_timeout(fns, tmp_path):
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()  # multiprocessing's own helper, started with the first spawned process
    pidfile = tmp_path / "pids"
    before = _children()
    runner = RewardRunner(cfg(fns + "child_then_answer", timeout=0.5))
    res = runner.score(["a", "hang", "b"], [item(str(pidfile))] * 3)
    assert res.rewards == [1.0, 0.0, 1.0] and res.timeouts == 1
    worker = runner._proc.pid
    runner.close()
    pids = [int(p) for p in pidfile.read_text().split()] + [worker]
    try:
        assert _wait_gone(pids) == []
        assert _children() - before == set()
    finally:
        for p in pids:
            if _running(p):
                os.kill(p, signal.SIGKILL)


@contextlib.contextmanager
def started_trainer(tmp_path: Path, function: str, completion: str, answer: Path, ready: Any, what: str) -> Any:
    """A trainer, as a script of its own (to be killed): scores `completion` with reward function `function` for an
    item whose gold answer is `answer` (a path the function reads), with a timeout it never reaches. Yields the
    process once `ready()` (within a bound on the wait, not a timing under test); it is killed at the end."""
    import subprocess

    script = tmp_path / "run.py"
    paths = [str(Path(runner_mod.__file__).resolve().parents[2]), str(Path(__file__).parent)]  # src, tests
    script.write_text(
        "import sys\n"
        f"sys.path[:0] = {paths!r}\n"
        "from rollwise.config import RewardConfig\n"
        "from rollwise.rewards import RewardRunner\n"
        "from rollwise.types import PromptItem\n"
        "if __name__ == '__main__':\n"
        f"    cfg = RewardConfig(functions=[{{'name': {function!r}}}], timeout=600)\n"
        f"    RewardRunner(cfg).score([{completion!r}], [PromptItem('u', 't', 'q', {str(answer)!r})])\n")
    run = subprocess.Popen([sys.executable, str(script)])
    try:
        deadline = time.monotonic() + 120
        while not ready() and time.monotonic() < deadline:
            assert run.poll() is None, f"the run ended before {what}"
            time.sleep(0.05)
        yield run
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()


def _pid_in(path: Path) -> Any:
    return lambda: path.exists() and bool(path.read_text().strip())


@pytest.mark.skipif(not Path("/proc/self/stat").exists() or not hasattr(os, "killpg"), reason="reads /proc")
def test_a_killed_trainer_ends_a_worker_stuck_in_a_call_that_holds_the_gil(fns, tmp_path):
    """The worker watched for the trainer's death from a thread, which cannot run while a reward call holds the GIL
    (a regex that backtracks, a C loop): the worker outlived the killed trainer, busy, for as long as that call ran."""
    pidfile = tmp_path / "worker.pid"
    pid = None
    try:
        with started_trainer(tmp_path, fns + "holds_the_gil", "x", pidfile, _pid_in(pidfile),
                             "its reward call started") as run:
            pid = int(pidfile.read_text())
            time.sleep(0.2)  # into the regex
            run.kill()
            run.wait()
            assert _wait_gone([pid], 5.0) == [], "the reward worker outlived the killed trainer"
    finally:
        if pid is not None and _running(pid):
            os.kill(pid, signal.SIGKILL)
