"""Audit of answer extraction, the reasoning_gym reward and the mixture allocation (expected values by hand)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

try:
    import rollwise  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rollwise.data.tasks import allocate
from rollwise.rewards import exact_match, extract_answer, reasoning_gym
from rollwise.types import PromptItem


def item(answer: str) -> PromptItem:
    return PromptItem(uid=f"t:{answer}", task="t", question="q", answer=answer)


# ------------------------------------------------------------------ extraction


def test_a_decimal_written_without_its_leading_zero_keeps_its_value() -> None:
    # ".5" in a sentence was read as 5: a wrong answer 5 scored 1, the right 0.5 scored 0
    assert extract_answer("The answer is .5 meters") == ".5"
    assert extract_answer("So the change is -.25 dollars") == "-.25"
    assert exact_match("The answer is .5 meters", item("0.5")) == 1.0
    assert exact_match("The answer is .5 meters", item("5")) == 0.0


@pytest.mark.parametrize("completion", [
    "**Answer**: Paris", "**Final Answer**: Paris", "### Answer: Paris", "## Final answer: Paris",
    "__Answer__: Paris",
])
def test_a_markdown_answer_label_is_not_part_of_the_answer(completion: str) -> None:
    # "**Answer**: Paris" was read as ": Paris", so a correct word answer scored 0
    assert extract_answer(completion) == "Paris"
    assert exact_match(completion, item("paris")) == 1.0


def test_a_markdown_answer_label_with_words_and_a_number() -> None:
    assert exact_match("**Answer**: 12 apples", item("12 apples")) == 1.0


@pytest.mark.parametrize("completion, gold", [
    ("<answer>\\boxed{12}</answer>", "12"),
    ("<answer>$\\boxed{3/4}$</answer>", "0.75"),
    ("\\boxed{\\text{Yes}}", "yes"),
    ("<answer>\\text{Paris}</answer>", "Paris"),
    ("\\boxed{\\textbf{12}}", "12"),
    ("\\boxed{\\mathrm{B}}", "B"),
])
def test_a_box_inside_the_answer_tag_and_a_text_wrapper_are_decoration(completion: str, gold: str) -> None:
    assert exact_match(completion, item(gold)) == 1.0


def test_a_box_or_text_wrapper_is_not_removed_from_an_answer_that_is_more_than_it() -> None:
    assert extract_answer("\\boxed{\\text{x} + 1}") == "\\text{x} + 1"
    assert extract_answer("<answer>\\boxed{1} or \\boxed{2}</answer>") == "\\boxed{1} or \\boxed{2}"


# ------------------------------------------------------------------ reasoning_gym


def _rg_item(name: str, seed: int = 1) -> PromptItem:
    import reasoning_gym as rg

    entry = rg.create_dataset(name, size=1, seed=seed)[0]
    return PromptItem(uid="u", task=name, question=entry["question"], answer=str(entry["answer"]), entry=entry)


def test_reasoning_gym_scores_a_correct_expression_answer_on_the_answer_line() -> None:
    # countdown (seed 1): reach 309 with 6, 61, 94, 4; the gold answer is "94*4 - 61 - 6". Another correct
    # expression, written the way the task's own instructions ask, got only "61" (the line's last number) scored
    it = _rg_item("countdown")
    assert "309" in it.question and it.answer == "94*4 - 61 - 6"
    for completion in ("4*94 - 6 - 61", "The answer is 4*94 - 6 - 61", "Answer: 4 * 94 - 6 - 61."):
        assert reasoning_gym(completion, it) == 1.0, completion
    assert reasoning_gym("4*94 - 6 - 60", it) < 1.0  # a wrong expression still does not pass


def test_reasoning_gym_keeps_the_deliberate_reading_of_an_equation_line() -> None:
    # "The answer is 5 + 7 = 12." reads 5 (documented, left alone): the line is no full-credit answer either
    assert reasoning_gym("The answer is 5 + 7 = 12.", PromptItem(
        uid="u", task="chain_sum", question="q", answer="12",
        entry={"question": "q", "answer": "12", "metadata": {"source_dataset": "chain_sum"}})) == 0.0


# ------------------------------------------------------------------ mixture allocation


@pytest.mark.parametrize("total, weights, expected", [
    (2, [0.3, 0.1], [2, 0]),  # 1.5 and 0.5: a tie, to the earlier task
    (100, [0.1, 0.7], [13, 87]),  # 12.5 and 87.5
    (3, [0.3, 1.5], [1, 2]),  # 0.5 and 2.5
    (3, [0.5, 0.1], [3, 0]),  # 2.5 and 0.5
])
def test_allocate_breaks_exact_ties_to_the_earlier_task_whatever_float_rounding_says(total, weights, expected) -> None:
    assert allocate(total, weights) == expected
    assert sum(allocate(total, weights)) == total


@pytest.mark.parametrize("text,want", [
    ("So the answer is 2, since 98 = 2 * 49.", "2"),
    ("Thus the final answer is 12.", "12"),
    ("We know 5 + 7 = 12, so the answer is 12", "12"),
    ("Therefore, the answer is -3 (we checked 4 cases)", "-3"),
    ("The sum is 12.", "12"),  # no "answer is": the last number, as before
])
def test_answer_is_later_in_the_line_names_the_answer_as_at_its_start(text, want):
    """"So the answer is 2, since 98 = 2 * 49." read 49: the "answer is" rule held only at the start of the line."""
    from rollwise.rewards.verifiers import extract_answer

    assert extract_answer(text) == want


def test_a_line_with_words_is_no_second_chance_for_a_lenient_scorer() -> None:
    """The whole answer line was also given to the task's scorer: gsm_symbolic's reads the first number of free text,
    so "There are 288 boxes ..., so the answer is 1152." scored 1 for a gold answer of 288 (found in review)."""
    it = _rg_item("gsm_symbolic")
    gold = it.answer
    wrong = str(int(float(gold)) * 4 + 1)
    assert reasoning_gym(f"There are {gold} boxes with 4 in each, so the answer is {wrong}.", it) < 1.0
    assert reasoning_gym(f"Thinking...\n{gold} is what I first had, but the total is {wrong}", it) < 1.0
    assert reasoning_gym(f"The answer is {gold}.", it) == 1.0


@pytest.mark.parametrize("text,want", [
    ("If the answer is x, then 2x = 10, so x = 5", "5"),
    ("Since the answer is divisible by 3 and less than 10, it is 9.", "9"),
])
def test_answer_is_names_a_number_only_right_after_it(text, want):
    """The mid-line rule took the first number anywhere after "answer is" (found in review)."""
    from rollwise.rewards.verifiers import extract_answer

    assert extract_answer(text) == want
