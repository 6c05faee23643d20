"""Held-out scoring audit: answers a grader reads as right that the verifiers scored 0."""

from __future__ import annotations

import pytest

from rollwise.rewards import exact_match, extract_answer, math_verify, reasoning_gym
from rollwise.types import PromptItem


def item(answer: str) -> PromptItem:
    return PromptItem(uid=f"t:{answer}", task="t", question="q", answer=answer)


@pytest.mark.parametrize(("completion", "expected"), [
    ("The total is:\n\\[\n5 + 7 = 12\n\\]", "12"),  # a display block: its closing "\]" was read as the answer
    ("The answer is:\n\\[\n12\n\\]", "12"),
    ("The answer is:\n$$\n12\n$$", "12"),  # "$$" was read as the empty answer
    ("The answer is:\n```\n12\n```", "12"),
])
def test_a_closing_math_or_code_delimiter_line_is_not_the_answer(completion: str, expected: str) -> None:
    assert extract_answer(completion) == expected
    assert exact_match(completion, item(expected)) == 1.0
    assert exact_match(completion, item("13")) == 0.0


@pytest.mark.parametrize("completion", [
    "The answer is \\$18.", "The answer is **\\$18**.", "\\boxed{\\$18}", "<answer>\\$18</answer>",
])
def test_exact_match_reads_a_latex_dollar_sign_as_a_plain_one(completion: str) -> None:
    """"$18" scored 1 and "\\$18" (LaTeX's dollar sign, common in GSM8K-style answers) scored 0."""
    assert exact_match(completion, item("18")) == 1.0
    assert exact_match(completion, item("17")) == 0.0
    assert exact_match("The answer is \\$1,000.", item("1000")) == 1.0


@pytest.mark.parametrize("completion", ["The answer is \\(12\\).", "\\(12\\)", "The answer is \\[12\\]", "<answer>\\(12\\)</answer>"])
def test_exact_match_reads_latex_inline_math_as_it_reads_dollars(completion: str) -> None:
    """"$12$" scored 1 and "\\(12\\)", the same inline math, scored 0."""
    assert exact_match(completion, item("12")) == 1.0
    assert exact_match(completion, item("13")) == 0.0
    assert exact_match("\\(\\frac{3}{4}\\)", item("0.75")) == 1.0


def test_reasoning_gym_on_a_file_item_reads_the_same_forms() -> None:
    it = PromptItem(uid="u", task="t", question="q", answer="18", entry={"question": "q", "answer": "18"})
    assert reasoning_gym("The answer is \\$18.", it) == 1.0
    assert reasoning_gym("The answer is \\(18\\).", it) == 1.0


@pytest.mark.parametrize("completion", [
    "The answer is \\$18.", "She earns \\$18 every day.", "Total: \\$18", "The answer is **\\$18**.",
])
def test_math_verify_reads_a_latex_dollar_sign(completion: str) -> None:
    """math-verify parses "\\$18" to nothing: a right answer in dollars scored 0."""
    assert math_verify(completion, item("18")) == 1.0
    assert math_verify(completion, item("17")) == 0.0


@pytest.mark.parametrize(("completion", "gold"), [
    ("The answer is: **3/4**", "3/4"), ("The answer is: **-3/4**", "-0.75"), ("<answer>**12**</answer>", "12"),
    ("x**2 = 9, so x = **3**", "3"),
])
def test_math_verify_reads_an_answer_in_markdown_bold(completion: str, gold: str) -> None:
    """math-verify read "**3/4**" as 3 (a right answer scored 0, the wrong 3 scored 1) and a bold tagged answer
    as nothing."""
    assert math_verify(completion, item(gold)) == 1.0
    assert math_verify("The answer is: **3/4**", item("3")) == 0.0
    assert math_verify("2**3 = 8", item("8")) == 1.0  # Python's power is left alone



def test_rollwise_eval_says_the_rollout_and_reward_settings_of_training_it_ignores(tiny_model_dir, capsys):
    """rollout.num_generations=8 (not the samples of pass@k), the planner's prompts per step, partial and
    speculative rollouts and the training reward's shaping were taken without a word."""
    from rollwise.evalcmd import _target_config

    given = ["rollout.num_generations=8", "rollout.prompts_per_step=4", "rollout.speculative_reuse=true",
             "rollout.partial_rollouts=true", "reward.overlong_buffer=4", "reward.truncated_reward=0"]
    _target_config(str(tiny_model_dir), given)
    err = capsys.readouterr().err
    assert f"{', '.join(k.split('=')[0] for k in given)} has no effect here: it is a setting of training" in err, err
    _target_config(str(tiny_model_dir), ["rollout.temperature=0.5", "rollout.top_p=0.9", "rollout.max_completion_length=9",
                                         "rollout.engine_dtype=float32", "reward.timeout=5"])
    assert "warning" not in capsys.readouterr().err  # what `rollwise eval` reads


def test_reasoning_gym_leaves_the_case_of_a_lettered_answer_to_the_tasks_own_scorer():
    # exact_match lowers case; caesar_cipher's scorer gives a lower-cased decryption 0, and so must the reward
    import reasoning_gym

    from rollwise.rewards.verifiers import reasoning_gym as rg_reward
    entry = reasoning_gym.create_dataset("caesar_cipher", size=1, seed=0)[0]
    it = PromptItem(uid="c", task="caesar_cipher", question=entry["question"], answer=entry["answer"], entry=entry)
    assert rg_reward(f"The answer is {entry['answer']}", it) == 1.0
    assert rg_reward(f"The answer is {entry['answer'].lower()}", it) == 0.0


def test_rollwise_eval_takes_one_model_and_reads_a_run_folder_named_with_an_equals_sign(tiny_model_dir, tmp_path):
    # `rollwise eval MODEL_A model.name_or_path=B` evaluated B without a word; `runs/lr=1e-5` was read as an override
    from rollwise.config import ConfigError
    from rollwise.evalcmd import _target_config

    with pytest.raises(ConfigError, match="two models; give the model once"):
        _target_config(str(tiny_model_dir), [f"model.name_or_path={tmp_path}"])
    cfg, _ = _target_config(str(tiny_model_dir), [f"model.name_or_path={tiny_model_dir}"])  # the same one: fine
    folder = tmp_path / "lr=1e-5"
    folder.mkdir()
    (folder / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    for f in tiny_model_dir.iterdir():
        if f.is_file() and f.name != "config.json":
            (folder / f.name).write_bytes(f.read_bytes())
    cfg, _ = _target_config(str(folder), [])
    assert cfg.model.name_or_path == str(folder)
