"""Reward functions and the process-isolated RewardRunner (expected values written by hand)."""

from __future__ import annotations

import math
import sys
import textwrap
from pathlib import Path

import pytest

try:
    import rollwise  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rollwise.config import ConfigError, RewardConfig
from rollwise.rewards import (
    RewardRunner,
    exact_match,
    extract_answer,
    format_reward,
    load_user_function,
    math_verify,
    reasoning_gym,
)
from rollwise.types import PromptItem

USER_MODULE = """
import time

def half(completion, item):
    return 0.5

def trl_style(completions, **kwargs):
    return [0.0 for _ in completions]

def with_defaults(completion, item=None, *, scale=1.0):
    return scale

def broken(completion, item):
    if completion == "ok":
        return 1.0
    raise ValueError("no such key")

def flaky(completion, item):
    if completion == "boom":
        raise RuntimeError("kaboom")
    if completion == "hang":
        time.sleep(10**6)
    if completion == "nan":
        return float("nan")
    if completion == "none":
        return None
    return completion == item.answer  # a bool counts as 1.0 / 0.0
"""


def item(answer: str, question: str = "q", entry: dict | None = None) -> PromptItem:
    return PromptItem(uid=f"t:{answer}", task="t", question=question, answer=answer, entry=entry or {})


@pytest.fixture()
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "rw_user_fns.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("rw_user_fns", None)
    return "rw_user_fns"


# ------------------------------------------------------------------ extraction and verifiers


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<answer> 42 </answer>", "42"),
        ("first <answer>1</answer> then <answer>2</answer>", "2"),
        ("so \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}"),
        ('\\boxed{{"s": "}", "n": 1}}', '{"s": "}", "n": 1}'),  # a brace inside a JSON string (codeio)
        ('\\boxed{5"} tall', '5"'),  # a stray quote: braces are counted as they come
        ("The answer is 1,000.", "1000"),
        ("**-4**", "-4"),
        ("x+2", "x+2"),
        ("work\n\nAnswer: 7\n", "7"),
        ("4 - 1 - 7 = -4", "-4"),
        ("", ""),
        ("no number here", "no number here"),
    ],
)
def test_extract_answer(completion: str, expected: str) -> None:
    assert extract_answer(completion) == expected


@pytest.mark.parametrize("task", ["chain_sum", "products", "basic_arithmetic", "gcd", "lcm"])
def test_reasoning_gym_scores_gold_one_and_wrong_zero(task: str) -> None:
    import reasoning_gym as rg

    for entry in rg.create_dataset(task, size=5, seed=7):
        it = item(entry["answer"], entry["question"], entry)
        gold = entry["answer"]
        wrong = str(int(gold) + 1)
        for right in (gold, f"The answer is {gold}.", f"<answer>{gold}</answer>", f"\\boxed{{{gold}}}"):
            assert reasoning_gym(right, it) == 1.0, (task, right)
        for bad in (wrong, f"<answer>{wrong}</answer>", ""):
            assert reasoning_gym(bad, it) == 0.0, (task, bad)


def test_reasoning_gym_on_a_file_item_falls_back_to_exact_match() -> None:
    it = item("12", entry={"question": "q", "answer": "12"})
    assert reasoning_gym("The total is 12.", it) == 1.0
    assert reasoning_gym("13", it) == 0.0


@pytest.mark.parametrize(("completion", "expected"), [
    ("The answer is 2, since 98 = 2 * 49", "2"),  # the number the prefix names, not the last one
    ("The answer is 42 (rounded to 2 decimal places).", "42"),
    ("The answer is 7, not 12.", "7"),
    ("The answer is 3.\n\nI hope it is correct.", "3"),  # a closing sentence does not hide the answer
    ("So 2+3 = 5", "5"),
    ("Yes", "Yes"),
    ("ANSWERED THE FACE", "ANSWERED THE FACE"),  # a word that starts with "answer" is no prefix
    ("**ANSWERS ARE HERE**", "ANSWERS ARE HERE"),
    ("Answer: 4", "4"),
])
def test_extract_answer_reads_what_the_answer_line_says(completion: str, expected: str) -> None:
    assert extract_answer(completion) == expected


@pytest.mark.parametrize(("completion", "gold"), [
    ("12 apples", "12 apples"), ("2, 3", "2, 3"), ("(1, 2)", "(1, 2)"), ("x = 12", "x = 12"),
    ("<answer>2,3</answer>", "2, 3"), ("\\boxed{\\frac{3}{4}}", "3/4"), ("\\dfrac{1}{2}", "0.5"),
    ("\u22125", "-5"), ("\\boxed{x = 12}", "12"), ("12%", "12"), ("(12)", "12"), ("12!", "12"),
])
def test_exact_match_accepts_the_forms_a_correct_answer_takes(completion: str, gold: str) -> None:
    assert exact_match(completion, item(gold)) == 1.0


def test_multiline_gold_answers_get_a_warning_unless_the_instruction_asks_for_tags() -> None:
    from rollwise.rewards.verifiers import multiline_answers_note

    grid = PromptItem(uid="g", task="rotate_matrix", question="q", answer="3 7\n1 8")
    items = [grid, item("12")]
    note = multiline_answers_note(items, "", "reasoning_gym")
    assert "rotate_matrix" in note and "data.instruction" in note
    assert exact_match("3 7\n1 8", grid) == 0.0  # what the warning is about: only "1 8" is read
    assert exact_match("<answer>3 7\n1 8</answer>", grid) == 1.0
    assert multiline_answers_note(items, "Give the final answer in <answer></answer> tags.", "reasoning_gym") is None
    assert multiline_answers_note(items, "", "rewards_for_tests:digit_share") is None  # a user function reads as it likes
    assert multiline_answers_note([item("12")], "", "exact_match") is None


def test_exact_match_refuses_a_wrong_number_after_the_answer_prefix() -> None:
    assert exact_match("The answer is 7, not 12.", item("12")) == 0.0
    assert exact_match("12 pears", item("12 apples")) == 0.0
    assert exact_match("2, 4", item("2, 3")) == 0.0


def test_reasoning_gym_gives_a_correct_answer_full_credit_however_it_is_decorated() -> None:
    """The generators' scorers compare exact strings: "3." or "$3$" for 3 got partial credit."""
    from rollwise.config import DataConfig
    from rollwise.data import build_items
    from rollwise.data.tasks import TaskSpec

    it = build_items(DataConfig(tasks=[TaskSpec(name="gcd")], train_size=4, eval_size=0), seed=0)[0][0]
    g = it.answer
    for c in (f"<answer>${g}$</answer>", f"<answer>{g}.</answer>", f"<answer>**{g}**</answer>", f"\\boxed{{{g}.0}}"):
        assert reasoning_gym(c, it) == 1.0, c
    assert reasoning_gym(f"1{g}", it) < 1.0  # a wrong answer keeps the generator's own partial credit


@pytest.mark.parametrize(("completion", "gold", "score"), [
    ("\\boxed{2}", "2\\sqrt{2}", 0.0), ("\\boxed{2\\sqrt{2}}", "2\\sqrt{2}", 1.0), ("\\boxed{1}", "x^2 + 1", 0.0),
    ("<answer>\\sqrt{2}</answer>", "\\sqrt{2}", 1.0), ("\\boxed{3}", "3\\pi", 0.0),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}", 1.0), ("1,234", "1234", 1.0), ("3/4", "0.75", 1.0),
])
def test_math_verify_reads_a_bare_latex_gold_answer_as_math(completion: str, gold: str, score: float) -> None:
    """A gold answer written as bare LaTeX (MATH-style files) parsed raw gave [] or its last number:
    wrong answers scored 1 and right ones 0."""
    assert math_verify(completion, item(gold)) == score


def test_math_verify() -> None:
    assert math_verify("\\frac{1}{2}", item("0.5")) == 1.0
    assert math_verify("So the final answer is $\\boxed{42}$.", item("42")) == 1.0
    assert math_verify("<answer>42</answer>", item("42")) == 1.0
    assert math_verify("43", item("42")) == 0.0
    assert math_verify("no idea", item("42")) == 0.0


def test_exact_match() -> None:
    assert exact_match("The answer is 1,000.", item("1000")) == 1.0
    assert exact_match("4.0", item("4")) == 1.0
    assert exact_match("<answer>Paris</answer>", item("paris")) == 1.0
    assert exact_match("so #### 72", item("Janet sells ... #### 72")) == 1.0
    assert exact_match("5", item("4")) == 0.0
    assert exact_match("", item("4")) == 0.0


def test_format() -> None:
    assert format_reward("42", item("1")) == 1.0
    assert format_reward("reasoning...\nmore\n<answer>7</answer>", item("1")) == 1.0
    assert format_reward("long\n\\boxed{3}", item("1")) == 1.0
    assert format_reward("x" * 32, item("1")) == 1.0
    assert format_reward("x" * 33, item("1")) == 0.0
    assert format_reward("42\n43", item("1")) == 0.0
    assert format_reward("   ", item("1")) == 0.0
    assert format_reward("<answer></answer>", item("1")) == 0.0


# ------------------------------------------------------------------ user functions


def test_load_user_function(user_module: str) -> None:
    assert load_user_function(f"{user_module}:half")("x", item("1")) == 0.5
    with pytest.raises(ConfigError, match="cannot import module 'no_such_module_xyz'"):
        load_user_function("no_such_module_xyz:f")
    with pytest.raises(ConfigError, match=f"module '{user_module}' has no attribute 'missing'"):
        load_user_function(f"{user_module}:missing")
    with pytest.raises(ConfigError, match="module:function"):
        load_user_function(":f")
    with pytest.raises(ConfigError, match=r"signature \(completions, \*\*kwargs\).*TRL-style"):
        load_user_function(f"{user_module}:trl_style")
    assert load_user_function(f"{user_module}:with_defaults")("x", item("1")) == 1.0


def test_a_user_function_next_to_the_user_or_given_by_its_file(tmp_path, monkeypatch) -> None:
    (tmp_path / "rw_here.py").write_text("def score(completion, item):\n    return 0.25\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "rw_file.py").write_text("def score(completion, item):\n    return 0.75\n")
    monkeypatch.chdir(tmp_path)
    # the `rollwise` console script has neither '' nor the current folder on sys.path, unlike `python -m`
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "rw_here", raising=False)
    assert load_user_function("rw_here:score")("x", item("1")) == 0.25
    assert sys.path[-1] == str(tmp_path)  # appended last: never shadows an installed package
    assert load_user_function("sub/rw_file.py:score")("x", item("1")) == 0.75
    with pytest.raises(ConfigError, match="file 'sub/nope.py' not found"):
        load_user_function("sub/nope.py:score")
    cfg = RewardConfig(functions=[{"name": "sub/rw_file.py:score"}])
    with RewardRunner(cfg) as runner:  # the worker process imports it the same way
        assert runner.score(["x"], [item("1")]).rewards == [0.75]


def test_runner_fails_fast_on_unimportable_function(user_module: str) -> None:
    cfg = RewardConfig(functions=[{"name": "exact_match"}, {"name": f"{user_module}:nope"}])
    with pytest.raises(ConfigError, match=f"{user_module}:nope"):
        RewardRunner(cfg)


def test_a_reward_module_that_exits_or_hangs_at_import_is_a_config_error(tmp_path, monkeypatch) -> None:
    """sys.exit() at import made rollwise exit without a word; a module that hangs at import hung it
    before the reward worker's start-up limit applied (the check imports it in this process first)."""
    from rollwise.rewards import runner as runner_mod

    (tmp_path / "rw_exits.py").write_text("import sys\nsys.exit(3)\ndef score(completion, item):\n    return 1.0\n")
    (tmp_path / "rw_hangs.py").write_text("import time\ntime.sleep(30)\ndef score(completion, item):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"rw_exits.py:score': cannot import .*SystemExit"):
        load_user_function("rw_exits.py:score")
    monkeypatch.setattr(runner_mod, "STARTUP_TIMEOUT", 0.5)
    with pytest.raises(ConfigError, match=r"rw_hangs.py:score'.* more than 0.5 s"):  # not the 30 s of its import
        RewardRunner(RewardConfig(functions=[{"name": "rw_hangs.py:score"}]))
    # a module that sets a signal handler at import works as it did (signal.signal needs the main thread)
    (tmp_path / "rw_signal.py").write_text("import signal\nsignal.signal(signal.SIGUSR1, signal.SIG_IGN)\n"
                                           "def score(completion, item):\n    return 1.0\n")
    monkeypatch.setattr(runner_mod, "STARTUP_TIMEOUT", 30.0)
    with RewardRunner(RewardConfig(functions=[{"name": "rw_signal.py:score"}])) as runner:
        assert runner.score(["x"], [item("1")]).rewards == [1.0]


# ------------------------------------------------------------------ the runner


def test_weighted_sum_with_builtin_and_user_functions(user_module: str) -> None:
    cfg = RewardConfig(
        functions=[
            {"name": "exact_match", "weight": 1.0},
            {"name": "format", "weight": 0.5},
            {"name": f"{user_module}:half", "weight": -2.0},
        ]
    )
    items = [item("4"), item("4"), item("7")]
    completions = ["4", "line one\nthe answer is 4", "wrong"]
    with RewardRunner(cfg) as runner:
        res = runner.score(completions, items)
        assert res.rewards == [1.0 + 0.5 - 1.0, 1.0 + 0.0 - 1.0, 0.0 + 0.5 - 1.0]
        assert res.parts[1] == {"exact_match": 1.0, "format": 0.0, f"{user_module}:half": 0.5}
        assert (res.errors, res.timeouts, res.nans, res.messages) == (0, 0, 0, [])
        assert runner.score([], []).rewards == []
        with pytest.raises(ValueError, match="2 completions but 1 items"):
            runner.score(["a", "b"], [item("1")])
    runner.close()  # closing twice is fine


def test_a_function_that_fails_on_every_call_stops_the_run(user_module: str, capsys) -> None:
    from rollwise.errors import RewardWorkerError
    from rollwise.rewards.runner import FAILING_IN_A_ROW

    cfg = RewardConfig(functions=[{"name": f"{user_module}:broken", "weight": 1.0}])
    with RewardRunner(cfg) as runner:
        n = FAILING_IN_A_ROW - 1
        assert runner.score(["x"] * n, [item("1")] * n).errors == n  # unlucky so far: counted, scored 0
        assert runner.score(["ok"], [item("1")]).rewards == [1.0]  # a success starts the count again
        runner.score(["x"] * n, [item("1")] * n)
        with pytest.raises(RewardWorkerError, match=rf"broken failed on {FAILING_IN_A_ROW} calls in a row \(the last: "
                                                    r".*ValueError: no such key\).*--resume"):
            runner.score(["x"], [item("1")])


def test_failures_score_zero_are_counted_and_do_not_stop_the_batch(user_module: str, capsys) -> None:
    cfg = RewardConfig(
        functions=[{"name": f"{user_module}:flaky", "weight": 1.0}, {"name": "exact_match", "weight": 10.0}],
        timeout=5.0,  # the hanging call always times out; the others finish well within it on a slow machine
    )
    completions = ["4", "boom", "4", "hang", "nan", "none", "5", "4"]
    with RewardRunner(cfg) as runner:
        res = runner.score(completions, [item("4")] * len(completions))
        # flaky: 1 for "4", 0 otherwise; exact_match (x10) still runs on every sample,
        # including the one whose flaky call hung (the worker restarts after it).
        assert res.rewards == [11.0, 0.0, 11.0, 0.0, 0.0, 0.0, 0.0, 11.0]
        assert res.parts[3] == {f"{user_module}:flaky": 0.0, "exact_match": 0.0}
        assert (res.errors, res.timeouts, res.nans) == (2, 1, 1)  # errors: raised + None
        assert runner.restarts == 1
        assert any("kaboom" in m for m in res.messages)
        assert any("ran past reward.timeout=5 s" in m for m in res.messages)
        assert all(math.isfinite(r) for r in res.rewards)
        again = runner.score(["4", "boom"], [item("4"), item("4")])  # the new worker keeps going
        assert again.rewards == [11.0, 0.0] and again.errors == 1
    # each kind of failure of each function is shown once on stderr, whatever the progress display
    err = capsys.readouterr().err
    assert err.count("rollwise: warning: reward function") == 3, err
    assert "reward function rw_user_fns:flaky raised RuntimeError: kaboom; the call scored 0" in err
    assert "Later errors of rw_user_fns:flaky are only counted (metric reward/errors)" in err
    assert "ran past reward.timeout=5 s" in err and "rw_user_fns:flaky returned nan" in err


@pytest.mark.parametrize(("completion", "gold", "score"), [
    ("84/2", "42", 0.0),  # the question's expression is not its answer (a reward hack on division items)
    ("42/1", "42", 0.0),
    ("1/2", "0.5", 1.0),  # a fraction in lowest terms is a number
    ("-1/2", "-0.5", 1.0),
    ("Final answer: 12\nDone", "12", 1.0),  # a closing word after the named answer
    ("12\nDone", "12", 0.0),  # no answer named: the last line is the answer
])
def test_exact_match_reads_numbers_as_a_careful_grader_would(completion, gold, score):
    from rollwise.rewards.verifiers import exact_match
    from rollwise.types import PromptItem

    assert exact_match(completion, PromptItem("u", "t", "q", gold)) == score


def test_pathological_answers_cost_no_more_than_ordinary_ones(monkeypatch):
    """An exponent is not read (Fraction("1e10000000") builds 10^10^7: 6 s, past reward.timeout), and a
    repetition loop of unclosed boxes scans only the last MAX_BOXES of them (each scan runs to the end)."""
    from rollwise.rewards import verifiers as v

    assert v._as_fraction("1e10000000") is None and v._as_fraction("12.5") == v.Fraction(25, 2)
    scans = []
    real = v._box_end
    monkeypatch.setattr(v, "_box_end", lambda *a, **kw: scans.append(1) or real(*a, **kw))
    assert v._last_boxed("\\boxed{" * 5000) is None
    assert len(scans) == 2 * v.MAX_BOXES  # quote-aware, then plain, per box tried
    # the price: a closed box behind more than MAX_BOXES unclosed ones is not found (one box among a few is)
    assert v._last_boxed("\\boxed{7}" + " \\boxed{" * 50) is None
    assert v._last_boxed("\\boxed{7}" + " \\boxed{" * 5) == "7"


def test_math_verify_reads_a_unicode_minus():
    from rollwise.rewards.verifiers import math_verify
    from rollwise.types import PromptItem

    assert math_verify("\u22123", PromptItem("u", "t", "q", "-3")) == 1.0
