"""A small gold-answer sweep: reasoning-gym items built through rollwise's data path, their gold answers written
the ways a model answers, scored by the reasoning_gym reward (the default). Correct forms get full credit, another
item's gold answer does not. The default mixture's tasks, and the tasks where the sweep over all generators found
a correct answer read wrongly or a wrong one read as right."""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

import pytest

try:
    import rollwise  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rollwise.config import DataConfig, TaskSpec
from rollwise.config.schema import DEFAULT_TASKS
from rollwise.data.tasks import build_items
from rollwise.rewards import extract_answer, reasoning_gym
from rollwise.rewards.verifiers import _named_later, answers_match, gold_answer
from rollwise.types import PromptItem

REASONING = ("Let me solve this step by step.\n"
             "First I look at the numbers: 3 and 5 give 8 in total.\n"
             "Now I combine the results and check them.\n")

DEFAULT = [t["name"] for t in DEFAULT_TASKS]
# a single-line gold answer with spaces and letters (or several numbers), scored as its last number or as a
# sentence's partial credit; a word answer after reasoning with numbers, read as the reasoning line; a list of roots
FIXED = ["complex_arithmetic", "simple_integration", "polynomial_multiplication", "time_intervals", "codeio",
         "emoji_mystery", "sentence_reordering", "caesar_cipher", "word_sorting", "knights_knaves",
         "polynomial_equations"]


@cache
def _items(name: str) -> tuple[PromptItem, ...]:
    spec = next((TaskSpec(**t) for t in DEFAULT_TASKS if t["name"] == name), None) or TaskSpec(name=name)
    train, evals = build_items(DataConfig(tasks=[spec], train_size=2, eval_size=4), seed=0)
    return tuple(evals + train)


def _right_forms(gold: str) -> dict[str, str]:
    forms = {"tag": REASONING + f"<answer>{gold}</answer>", "boxed": REASONING + f"\\boxed{{{gold}}}"}
    if "\n" not in gold.strip():  # a multi-line answer needs a tag or a box (verifiers' module docstring)
        forms |= {
            "bare": gold,
            "reasoning, then the answer": REASONING + gold,
            "The answer is X": REASONING + f"The answer is {gold}",
            "The answer is X.": REASONING + f"The answer is {gold}.",
            "Final answer: X": REASONING + f"Final answer: {gold}",
            "So the answer is X": REASONING + f"So the answer is {gold}",
            "then a closing sentence": REASONING + f"The answer is {gold}\nI hope it is correct.",
        }
    return forms


def _wrong_forms(gold: str, other: str, task: str) -> dict[str, str]:
    forms = {"tag": REASONING + f"<answer>{other}</answer>"}
    if "\n" not in gold.strip() and "\n" not in other.strip():
        forms |= {
            "bare": REASONING + other,
            "The answer is Y": REASONING + f"The answer is {other}",
            "So the answer is Y": REASONING + f"So the answer is {other}",
        }
        # a take-back is read where its answer is short and does not start like a remark ("the", "in", ...; at most
        # eight words, the verifiers' docstring): a longer sentence after "the answer is" reads as a remark on it
        if _named_later(f"No wait, the answer is {other}") is not None:
            forms["X taken back for Y"] = REASONING + f"The answer is {gold}\nNo wait, the answer is {other}"
        if task in DEFAULT or task == "polynomial_equations":  # not word_sorting's scorer, which reads the start
            forms["The answer is X, Y"] = REASONING + f"The answer is {gold}, {other}"
    return forms


@pytest.mark.parametrize("task", DEFAULT + FIXED)
def test_gold_answers_get_full_credit_and_other_items_answers_do_not(task):
    items = _items(task)
    assert items, f"{task}: no items built"
    failures = []
    for k, it in enumerate(items):
        for form, completion in _right_forms(it.answer).items():
            score = reasoning_gym(completion, it)
            if score != 1.0:
                failures.append(f"{it.uid} correct, {form}: {score} for {it.answer[:60]!r}")
        gold = gold_answer(it)
        other = next((o.answer for o in items[k + 1:] + items[:k]
                      if o.answer.strip() != it.answer.strip() and not answers_match(gold_answer(o), gold)), None)
        if other is None:
            continue
        for form, completion in _wrong_forms(it.answer, other, task).items():
            score = reasoning_gym(completion, it)
            if score >= 1.0:
                failures.append(f"{it.uid} wrong, {form}: {score} for {other[:40]!r} (gold {it.answer[:40]!r})")
    assert not failures, "\n".join(failures)


def _rg_item(task: str, answer: str) -> PromptItem:
    entry = {"question": "q", "answer": answer, "metadata": {"source_dataset": task}}
    return PromptItem(uid=f"{task}:t:0", task=task, question="q", answer=answer, entry=entry)


def test_a_list_of_numbers_after_the_answer_prefix_is_the_whole_answer():
    """"The answer is 0.0, 0.5238" was read as 0.0: a wrong extra root (and any hedged "12, 395") got full credit."""
    assert extract_answer("The answer is 0.0, 0.5238") == "0.0, 0.5238"
    assert extract_answer("No wait, the answer is 0.0, 0.5238") == "0.0, 0.5238"
    assert extract_answer("4.89 4.56") == "4.89 4.56"
    # read number by number: one pattern for the whole list backtracked exponentially on this line
    assert extract_answer("The answer is 1" + ",000" * 60 + " apples") == "1" + "000" * 60
    assert reasoning_gym(REASONING + "The answer is 12, 395", _rg_item("chain_sum", "12")) < 1.0
    assert reasoning_gym(REASONING + "The answer is 12, 395.", _rg_item("chain_sum", "395")) < 1.0
    # unchanged: a prefix with words after its number, and a lone list that is the gold answer
    assert extract_answer("The answer is 2, since 98 = 2 * 49") == "2"
    assert reasoning_gym("The answer is 12.", _rg_item("chain_sum", "12")) == 1.0


def test_a_gold_answer_with_words_written_out_gets_full_credit():
    """A completion that is the gold answer "-36.0 + 15.0i", as the question asks, scored 8e-24 (its last number
    "15.0" against the gold); "1 days, 14:27:36" scored 0."""
    complex_item = next(it for it in _items("complex_arithmetic") if it.answer == "-36.0 + 15.0i")
    assert reasoning_gym("-36.0 + 15.0i", complex_item) == 1.0
    assert reasoning_gym(REASONING + "So the answer is -36.0 + 15.0i.", complex_item) == 1.0
    assert reasoning_gym("-36.0 + 15.0i\n", complex_item) == 1.0
    assert reasoning_gym("-6.0 - 6.0i", complex_item) < 1.0
    intervals = next(it for it in _items("time_intervals") if it.answer == "1 days, 14:27:36")
    assert reasoning_gym("The answer is 1 days, 14:27:36", intervals) == 1.0


def test_an_answer_named_later_in_the_last_line_is_read():
    """"So the answer is Paris" after reasoning with numbers was read as the reasoning line's 8, and "No wait, the
    answer is Rome" as the answer it took back."""
    assert extract_answer(REASONING + "So the answer is Paris.") == "Paris"
    assert extract_answer(REASONING + "The answer is Paris\nNo wait, the answer is Rome") == "Rome"
    # a closing remark still does not hide the answer
    assert extract_answer(REASONING + "The answer is Paris.\nI hope the answer is correct.") == "Paris"
    assert extract_answer(REASONING + "The answer is Paris.\nI hope it is correct.") == "Paris"
    caesar = _rg_item("caesar_cipher", "THE GOOD REMARKED MRS")
    assert reasoning_gym(REASONING + "THE GOOD REMARKED MRS", caesar) == 1.0
    assert reasoning_gym(REASONING + "The answer is THE GOOD REMARKED MRS\nNo wait, the answer is SMITH", caesar) < 1.0


@pytest.mark.parametrize("remark", ["So the answer is consistent with the check.", "So the answer is reasonable.",
                                    "I think the answer is correct."])
def test_a_remark_on_an_earlier_answer_is_not_read_as_the_answer(remark):
    """A line after the answer that only remarks on it names no answer: the line with the number is read."""
    from rollwise.rewards.verifiers import extract_answer

    assert extract_answer(f"12 + 5 = 17\n{remark}") == "17"
    assert extract_answer("Paris is the capital.\nSo the answer is Paris.") == "Paris"


def test_a_task_whose_own_scorer_gives_wrong_answers_full_credit_is_named():
    """game_of_life_halting's scorer compares bool(answer) with bool(gold): any answer scores 1, so every group has
    equal rewards and the task teaches nothing. The run is told which task, with an example."""
    from rollwise.rewards.verifiers import lenient_scorer_note

    cfg = DataConfig(tasks=[TaskSpec(name="game_of_life_halting"), TaskSpec(name="chain_sum")], train_size=40,
                     eval_size=8)
    train, evals = build_items(cfg, 0)
    note = lenient_scorer_note(train + evals, "reasoning_gym")
    assert note is not None and "game_of_life_halting" in note and "chain_sum" not in note, note
    assert lenient_scorer_note(train + evals, "exact_match") is None  # only reasoning_gym uses the task's scorer
    ok = DataConfig(tasks=[TaskSpec(**t) for t in DEFAULT_TASKS],
                    train_size=60, eval_size=10)
    train, evals = build_items(ok, 0)
    assert lenient_scorer_note(train + evals, "reasoning_gym") is None


@pytest.mark.parametrize("completion", [
    "Therefore, the answer is 12.\nI hope this answer is helpful!",
    "The answer is 12.\nHopefully the answer is clear!",
    "Therefore, the answer is 12.\nThis answer is based on the information given.",
    "Therefore, the answer is 12.\nLet me know if the answer is what you were looking for.",
    "The answer is 12.\nNote: the answer is rounded to the nearest whole number.",
    "The answer is 12.\nDouble-checking, the answer is the same.",
    "5 + 7 = 12\nSo the answer is final.",
    "5 + 7 = 12\nSo the answer is unchanged.",
    "5 + 7 = 12\nSo the answer is definitely right.",
    "The answer is 12.\nThat answer is final!",
    "I think the answer is 12, but let me check: 5 + 7 = 12. Yes.",
    "**12**",
    "So, 5 + 7 = 12.",
    "The answer is: 12",
])
def test_a_correct_number_followed_by_a_remark_keeps_full_credit(completion):
    """Closing remarks that name no answer ("I hope this answer is helpful!") must not take the answer's place."""
    from rollwise.rewards.verifiers import exact_match

    item = PromptItem(uid="u", task="t", question="What is 5 + 7?", answer="12")
    assert extract_answer(completion) == "12", extract_answer(completion)
    assert exact_match(completion, item) == 1.0
