"""Reward functions used by the end-to-end tests (loaded as `rewards_for_tests:NAME`)."""


def digit_share(completion: str, item) -> float:
    """Share of characters that are digits: a tiny random model can learn to raise it."""
    return sum(c.isdigit() for c in completion) / max(1, len(completion))


def space_share(completion: str, item) -> float:
    """Share of characters that are spaces: another reward a tiny model can raise."""
    return completion.count(" ") / max(1, len(completion))



_calls = [0]


def slow_digit_share(completion: str, item) -> float:
    """digit_share, taking 0.3 s on every eighth call of a worker: scored 0 under a reward.timeout below that
    (a timed-out call restarts the worker, so only a few do)."""
    import time

    _calls[0] += 1
    if _calls[0] % 8 == 0:
        time.sleep(0.3)
    return digit_share(completion, item)


def has_digit(completion: str, item) -> float:
    """1 when the answer holds a digit, else 0: a right-or-wrong reward that an untrained tiny model earns
    about half the time, so some groups are all right or all wrong and others mixed."""
    return float(any(c.isdigit() for c in completion))


def always_raises(completion: str, item) -> float:
    """A broken reward function: the run must stop rather than train on its zeros."""
    raise KeyError("answer_key")


def starts_a_hanging_child(completion: str, item) -> float:
    """Runs a helper process that never ends (as a code-execution reward runs a submitted program) and waits for
    it; the helper's pid goes to the file named by item.answer."""
    import subprocess
    import sys
    from pathlib import Path

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    Path(item.answer).write_text(str(child.pid))
    child.wait()
    return 1.0


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


def raises_an_unprintable_error(completion: str, item) -> float:
    """Raises an exception whose str() itself raises."""
    if completion == "bad":
        raise UnprintableError()
    return 1.0


def forks_a_child_that_raises(completion: str, item) -> float:
    """A naive sandbox: runs code in a forked child, which raises instead of exiting; scores float(item.answer)."""
    import os

    pid = os.fork()
    if pid == 0:
        raise ValueError("the submitted code failed")
    os.waitpid(pid, 0)
    return float(item.answer)


def raises_unless_ok(completion: str, item) -> float:
    """1 for the completion 'ok'; raises on any other."""
    if completion != "ok":
        raise KeyError("answer_key")
    return 1.0


def consumes_the_answer(completion: str, item) -> float:
    """1 when the completion is the gold answer; it then overwrites the item's answer and entry in place (a
    careless function): the next call on that prompt must still see the gold answer."""
    right = float(completion == item.answer)
    item.answer = "overwritten"
    item.entry["seen"] = True
    return right


def reads_the_answer_by_key(completion: str, item) -> float:
    """A reward written for dataset rows: item["answer"], as TRL's reward functions read a column."""
    return float(completion.strip() == item["answer"])


def sigint_at_start(conn) -> None:
    """A spawned process's SIGINT handler as it starts: whether it inherited an ignore."""
    import signal

    conn.send(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)
