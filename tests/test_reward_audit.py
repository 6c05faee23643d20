"""RewardRunner under reward functions that misbehave: what they start, what they raise, how often they fail."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

try:
    import rollwise  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from test_reward_runner_audit import _pid_in, started_trainer

from rollwise.config import RewardConfig
from rollwise.errors import RewardWorkerError
from rollwise.rewards import RewardRunner
from rollwise.types import PromptItem


def item(answer: str) -> PromptItem:
    return PromptItem(uid=f"t:{answer}", task="t", question="q", answer=answer)


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_timed_out_call_ends_the_processes_the_reward_function_started(tmp_path):
    """The worker was killed on a timeout, but a process its reward function started (a program under test, a
    judge) lived on, orphaned: one more leaked process for every timed-out call."""
    pidfile = tmp_path / "child.pid"
    cfg = RewardConfig(functions=[{"name": "rewards_for_tests:starts_a_hanging_child"}], timeout=0.5)
    with RewardRunner(cfg) as runner:
        res = runner.score(["x"], [item(str(pidfile))])
    assert res.rewards == [0.0] and res.timeouts == 1
    pid = int(pidfile.read_text())
    try:
        deadline = time.monotonic() + 10  # a bound on the wait, not a timing under test
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(pid), "the reward function's child process outlived the timed-out call"
    finally:
        if _running(pid):
            os.kill(pid, signal.SIGKILL)


def test_an_exception_whose_message_cannot_be_read_is_counted_without_killing_the_worker():
    """Formatting str(e) raised in the worker: it crashed with a traceback, the call was reported as having
    killed the reward worker, and the worker was restarted."""
    cfg = RewardConfig(functions=[{"name": "rewards_for_tests:raises_an_unprintable_error"}], timeout=30)
    with RewardRunner(cfg) as runner:
        res = runner.score(["ok", "bad", "ok"], [item("1")] * 3)
        assert res.rewards == [1.0, 0.0, 1.0] and res.errors == 1
        assert "raises_an_unprintable_error raised UnprintableError" in res.messages[0], res.messages
        assert runner.restarts == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_a_forked_child_that_returns_into_the_worker_does_not_answer_for_it():
    """A reward function whose forked child raised instead of exiting: the child went on in the worker's loop and
    sent its own answers, which the parent took for the worker's (sample 0 scored 0 with the child's error)."""
    cfg = RewardConfig(functions=[{"name": "rewards_for_tests:forks_a_child_that_raises"}], timeout=30)
    with RewardRunner(cfg) as runner:
        for _ in range(2):
            res = runner.score(["a", "b", "c"], [item("1"), item("2"), item("3")])
            assert res.rewards == [1.0, 2.0, 3.0] and res.errors == 0, res.messages


def test_a_function_failing_on_every_call_stops_the_run_within_the_batch(monkeypatch):
    """The failures in a row were checked only after the whole batch: a function failing (or timing out) on every
    call ran on through a batch of any size, and one success at its end hid the failures in a row before it."""
    from rollwise.rewards import runner as runner_mod

    monkeypatch.setattr(runner_mod, "FAILING_IN_A_ROW", 3)
    cfg = RewardConfig(functions=[{"name": "rewards_for_tests:raises_unless_ok"}], timeout=30)
    with RewardRunner(cfg) as runner:
        assert runner.score(["x", "x", "ok"], [item("1")] * 3).errors == 2  # two in a row: counted, scored 0
        with pytest.raises(RewardWorkerError, match=r"raises_unless_ok failed on 3 calls in a row .*KeyError"):
            runner.score(["x", "x", "x", "ok"], [item("1")] * 4)
        assert runner.score(["ok"], [item("1")]).rewards == [1.0]  # a fixed function: a new worker scores


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_killed_run_ends_the_processes_its_reward_functions_started(tmp_path):
    """When the run itself died (killed, its terminal closed), the worker ended but a process its reward function
    started lived on."""
    pidfile = tmp_path / "child.pid"
    pid = None
    try:
        with started_trainer(tmp_path, "rewards_for_tests:starts_a_hanging_child", "x", pidfile, _pid_in(pidfile),
                             "its reward function started its child") as run:
            pid = int(pidfile.read_text())
            run.kill()
            run.wait()
            deadline = time.monotonic() + 15
            while _running(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not _running(pid), "the reward function's child process outlived the run"
    finally:
        if pid is not None and _running(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_function_that_changes_its_item_in_place_does_not_change_later_calls():
    """A group's samples share one PromptItem, and the worker handed that same object to every call: a reward
    function that changed it (popped a key, rewrote the answer) scored the group's later samples, and the other
    functions, against what it left behind."""
    cfg = RewardConfig(functions=[{"name": "rewards_for_tests:consumes_the_answer"},
                                  {"name": "exact_match"}], timeout=30)
    shared = item("12")
    with RewardRunner(cfg) as runner:
        res = runner.score(["12", "12", "7"], [shared] * 3)
    assert [list(p.values()) for p in res.parts] == [[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]], res.parts
    assert shared.answer == "12" and shared.entry == {}


def test_a_reward_function_may_read_the_item_by_key():
    """item["answer"] raised "'PromptItem' object is not subscriptable": a reward written for dataset rows (as
    TRL's are) scored 0 on every call, counted as errors."""
    cfg = RewardConfig(functions=[{"name": "rewards_for_tests:reads_the_answer_by_key"}], timeout=30)
    with RewardRunner(cfg) as runner:
        res = runner.score(["12", "7"], [item("12")] * 2)
    assert res.rewards == [1.0, 0.0] and res.errors == 0, res.messages
    rg = PromptItem(uid="u", task="t", question="q", answer="4", entry={"metadata": {"x": 1}})
    assert rg["question"] == "q" and rg["metadata"] == {"x": 1} and rg.get("nope", 5) == 5
    with pytest.raises(KeyError, match="a prompt item has uid, task, question, answer, entry, and its entry 'metadata'"):
        rg["nope"]


def test_the_reward_worker_starts_with_sigint_ignored():
    """Ctrl-C reaches the whole foreground group: during the worker's imports (before its own code ignores SIGINT) it
    printed a KeyboardInterrupt traceback of its own. The worker is now started with SIGINT ignored from the start."""
    import multiprocessing as mp

    import rewards_for_tests

    from rollwise.rewards import runner as runner_mod

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    with runner_mod._sigint_ignored_by_children():
        proc = ctx.Process(target=rewards_for_tests.sigint_at_start, args=(child,))
        proc.start()
    assert parent.recv() is True
    proc.join(timeout=30)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the parent's handler is back


def test_an_item_answers_in_and_dict_like_a_row():
    """With __getitem__ alone Python took the item for a sequence: `"answer" in item` and `dict(item)` indexed it with
    0 and raised KeyError (found in review)."""
    it = PromptItem(uid="u", task="t", question="q", answer="4", entry={"metadata": {"x": 1}})
    assert "answer" in it and "metadata" in it and "nope" not in it
    assert dict(it) == {"uid": "u", "task": "t", "question": "q", "answer": "4", "entry": {"metadata": {"x": 1}},
                        "metadata": {"x": 1}}
