"""Config defects found by a second audit of src/rollwise/config/: settings accepted that fail only after the
model has loaded, bounds that let a value crash mid-run, override text that cannot be given, a YAML file
refused for a section whose keys are all commented out, and a setting that another one leaves idle."""

from __future__ import annotations

import multiprocessing

import pytest

from rollwise.config import ConfigError, load_config, parse_overrides, unused_settings


def keys(*overrides: str) -> list[str]:
    return [line.split("=")[0] for line in unused_settings(load_config(None, list(overrides)))]


# ---------------------------------------------------------------- refused at load, not after the model loads


@pytest.mark.parametrize("strategy", ["adaptive", "dars"])
def test_a_sample_cap_below_one_group_is_refused_before_the_model_loads(strategy):
    # the screen (adaptive) and hardness (dars) allocators give every prompt num_generations before they add any:
    # make_planner refused this, but only in setup() after the policy loaded and the run folder was made
    with pytest.raises(ConfigError, match=r"max_samples_per_prompt \(4\) is below rollout.num_generations \(8\)"):
        load_config(None, [f"planner.strategy={strategy}", "planner.max_samples_per_prompt=4"])
    load_config(None, [f"planner.strategy={strategy}", "planner.max_samples_per_prompt=8"])
    # knapsack and e3 may give a prompt fewer than num_generations: no contradiction there
    load_config(None, ["planner.strategy=knapsack", "planner.max_samples_per_prompt=4"])
    load_config(None, ["planner.strategy=e3", "planner.max_samples_per_prompt=4"])


def test_a_sample_minimum_above_the_allocators_default_maximum_is_refused():
    # knapsack's default maximum is 16 x num_generations, e3's (rank) num_generations + num_generations // 2:
    # a minimum above it was accepted and then broken (every prompt got the maximum, below the minimum)
    with pytest.raises(ConfigError, match=r"min_samples_per_prompt \(13\) must be <= .*12"):
        load_config(None, ["planner.strategy=e3", "planner.min_samples_per_prompt=13"])
    with pytest.raises(ConfigError, match=r"min_samples_per_prompt \(129\) must be <= .*128"):
        load_config(None, ["planner.strategy=knapsack", "planner.min_samples_per_prompt=129"])
    load_config(None, ["planner.strategy=e3", "planner.min_samples_per_prompt=12"])
    load_config(None, ["planner.strategy=knapsack", "planner.min_samples_per_prompt=128"])
    load_config(None, ["planner.strategy=e3", "planner.min_samples_per_prompt=13", "planner.max_samples_per_prompt=16"])


# ---------------------------------------------------------------- bounds


def test_a_reward_timeout_the_worker_pipe_cannot_wait_is_refused():
    # the reward runner waits with Connection.poll(reward.timeout), which raises OverflowError above about
    # 2.1e6 s (its milliseconds must fit a C int): the run crashed at its first reward call
    a, _ = multiprocessing.Pipe()
    with pytest.raises(OverflowError):
        a.poll(3e6)
    with pytest.raises(ConfigError, match="reward.timeout"):
        load_config(None, ["reward.timeout=3e6"])
    assert load_config(None, ["reward.timeout=86400"]).reward.timeout == 86400


# ---------------------------------------------------------------- overrides


def test_a_text_option_that_starts_and_ends_with_a_quote_keeps_the_text():
    # `"Answer" then "stop"` is not one quoted YAML string: it was refused as invalid YAML
    text = '"Answer" then "stop"'
    assert parse_overrides([f"data.instruction={text}"]) == {"data": {"instruction": text}}
    assert load_config(None, ["data.instruction='a' or 'b'"]).data.instruction == "'a' or 'b'"
    # one quoted string is still unquoted (and 'null' in quotes is the text null)
    assert load_config(None, ['data.instruction="a: b"']).data.instruction == "a: b"
    assert load_config(None, ["data.system_prompt='null'"]).data.system_prompt == "null"


# ---------------------------------------------------------------- YAML files


def test_a_section_whose_keys_are_all_commented_out_is_an_empty_section(tmp_path):
    # YAML reads `model:` with nothing under it as null; the section was refused ("Input should be a valid
    # dictionary"), yet accepted once an override touched it
    p = tmp_path / "c.yaml"
    p.write_text("model:\n  # dtype: bfloat16\n  lora:\ntrain:\n  max_steps: 3\n")
    cfg = load_config(str(p))
    assert cfg.train.max_steps == 3 and cfg.model.dtype == "auto" and cfg.model.lora.enabled is False
    p.write_text("model: 3\n")  # a value that is no section is still an error
    with pytest.raises(ConfigError, match="model"):
        load_config(str(p))


# ---------------------------------------------------------------- idle settings


def test_share_prompt_forward_off_under_gradient_checkpointing_is_named():
    # gradient checkpointing turns the shared-prompt layout off (shares_prompts), so switching it off changes nothing
    assert keys("train.gradient_checkpointing=true", "train.share_prompt_forward=false") == ["train.share_prompt_forward"]
    assert keys("train.share_prompt_forward=false") == []
    assert keys("train.gradient_checkpointing=true") == []


def test_transpose_weights_off_under_vllm_is_named():
    # true is refused with vLLM; false was accepted without a word, though vLLM keeps its own layout
    assert keys("rollout.engine=vllm", "rollout.transpose_weights=false") == ["rollout.transpose_weights"]
    assert keys("rollout.transpose_weights=false") == []


def test_lora_with_no_target_module_is_refused_before_the_model_loads():
    # peft refuses an empty list only in setup(), after the run folder is made ("No `target_modules` passed")
    with pytest.raises(ConfigError, match="model.lora.target_modules"):
        load_config(None, ["model.lora.enabled=true", "model.lora.target_modules=[]"])
    # with LoRA off the list is read by nothing: an older run's config.yaml holding [] still loads (found in review)
    assert load_config(None, ["model.lora.target_modules=[]"]).model.lora.target_modules == []


# ---------------------------------------------------------------- descriptions


def test_truncated_reward_says_the_overlong_penalty_still_applies():
    # loop.score: a cut sample's reward is truncated_reward, then less overlong_punishment, which at the cap is the
    # whole penalty; the description said the value itself decided success
    from rollwise.config import describe_fields
    from rollwise.loop import overlong_punishment

    assert overlong_punishment(48, 48, 8, 0.7) == 0.7
    desc = {k: d for k, _, d in describe_fields()}["reward.truncated_reward"]
    assert "overlong_penalty" in desc and "unless the value is at least" not in desc


def test_greso_thresholds_that_overlap_are_named():
    # selectors.SkipSelector tests `>= easy` first: with hard >= easy a visit between them, which the description
    # of greso_hard_threshold calls hard, counts as easy (a warning: easy=0.01, any success easy, is a use)
    got = unused_settings(load_config(None, ["planner.strategy=greso", "planner.greso_easy_threshold=0.4",
                                             "planner.greso_hard_threshold=0.5"]))
    assert len(got) == 1 and got[0].startswith("planner.greso_hard_threshold=0.5 is not below"), got
    assert keys("planner.strategy=greso", "planner.greso_easy_threshold=0.6", "planner.greso_hard_threshold=0.5") == []


@pytest.mark.parametrize("item", ["algo..beta=1", ".beta=1", "algo.beta.=1"])
def test_an_override_key_with_an_empty_part_is_named(item):
    # was "unknown config key 'algo.'", "unknown config key '(config)'" or "'algo.beta': Input should be a valid
    # number (got {'': 1})"
    with pytest.raises(ConfigError, match="has an empty part"):
        parse_overrides([item])
