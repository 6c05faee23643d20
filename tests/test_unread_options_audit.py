"""Options accepted without a word in combinations where they change nothing (found by an audit of every
key): each is now named by `unused_settings`, what `rollwise train` warns about before it starts. The
planner cases are also run through the real planner, executor and produce_batch on the scripted engine of
tests/test_option_matrix.py, with and without the option: the samples trained are the same."""

from __future__ import annotations

import pytest
from test_option_matrix import _build

from rollwise.config import load_config, unused_settings
from rollwise.loop import produce_batch


def keys(*overrides: str) -> list[str]:
    return [line.split("=")[0] for line in unused_settings(load_config(None, list(overrides)))]


def test_an_overlong_buffer_with_no_penalty_is_named():
    assert keys("reward.overlong_buffer=8", "reward.overlong_penalty=0") == ["reward.overlong_buffer"]
    assert keys("reward.overlong_buffer=8", "reward.overlong_penalty=0.5") == []


def test_overlapped_rounds_without_follow_up_rounds_are_named():
    # uniform (and greso, mopps, vade, knapsack, e3) asks for all of a step's samples at once
    assert keys("planner.strategy=uniform", "rollout.overlap_rounds=true") == ["rollout.overlap_rounds"]
    assert keys("planner.strategy=knapsack", "rollout.overlap_rounds=true") == ["rollout.overlap_rounds"]
    # adaptive's follow-ups queued for the next step, ar3po with a single stage: none within the step
    assert keys("planner.screen_followup=next_step", "rollout.overlap_rounds=true") == ["rollout.overlap_rounds"]
    assert keys("planner.strategy=ar3po", "planner.ar3po_stages=1", "rollout.overlap_rounds=true") == [
        "rollout.overlap_rounds"]
    # false where nothing could overlap anyway
    assert keys("planner.strategy=dapo", "rollout.overlap_rounds=false") == ["rollout.overlap_rounds"]
    assert keys("rollout.engine=hf", "rollout.overlap_rounds=false") == ["rollout.overlap_rounds"]
    assert keys("rollout.overlap_rounds=true") == []
    assert keys("rollout.overlap_rounds=false") == []
    assert keys("planner.strategy=ar3po", "rollout.overlap_rounds=true") == []


def test_a_success_threshold_no_planner_part_reads_is_named():
    for strategy in ("uniform", "dapo"):
        got = unused_settings(load_config(None, [f"planner.strategy={strategy}", "planner.success_threshold=0.8"]))
        assert len(got) == 1 and got[0].startswith("planner.success_threshold=0.8 decides which samples count"), got
        assert f"strategy '{strategy}'" in got[0] and "changes only the metrics" in got[0]
    for strategy in ("greso", "mopps", "vade", "knapsack", "dars", "ar3po", "e3", "adaptive"):
        assert keys(f"planner.strategy={strategy}", "planner.success_threshold=0.8") == [], strategy
    assert keys("planner.strategy=uniform", "planner.repair=replay", "planner.success_threshold=0.8") == []


def test_task_shares_with_a_single_task_are_named():
    one = "data.tasks=[{name: gcd}]"
    assert keys(one, "planner.stratify=false", "planner.stratify_rollouts=false", "planner.group_prior=false") == [
        "planner.stratify", "planner.stratify_rollouts", "planner.group_prior"]
    assert keys(one, "planner.strategy=mopps", "planner.stratify=true") == ["planner.stratify"]
    two = "data.tasks=[{name: gcd}, {name: lcm}]"
    assert keys(two, "planner.stratify=false", "planner.stratify_rollouts=false", "planner.group_prior=false") == []


def test_growth_options_where_no_group_grows_are_named():
    assert keys("planner.max_samples_per_prompt=8", "planner.screen_growth=eager",
                "planner.stratify_rollouts=false") == ["planner.stratify_rollouts", "planner.screen_growth"]
    assert keys("planner.max_samples_per_prompt=12", "planner.screen_growth=eager",
                "planner.stratify_rollouts=false") == []
    assert keys("planner.strategy=dars", "planner.max_samples_per_prompt=8", "planner.dars_schedule=hw") == [
        "planner.dars_schedule"]
    assert keys("planner.strategy=dars", "planner.dars_schedule=hw") == []


def test_estimator_and_selector_options_another_setting_idles_are_named():
    vade = "planner.strategy=vade"
    assert keys(vade, "planner.vade_fast_weight=0", "planner.vade_fast_decay=0.3") == ["planner.vade_fast_decay"]
    assert keys(vade, "planner.vade_fast_weight=1", "planner.vade_slow_decay=0.8") == ["planner.vade_slow_decay"]
    assert keys(vade, "planner.vade_fast_weight=0.3", "planner.vade_fast_decay=0.3", "planner.vade_slow_decay=0.8") == []
    assert keys("planner.strategy=ar3po", "planner.ar3po_stages=1", "planner.staged_rule=while_informative") == [
        "planner.staged_rule"]
    assert keys("planner.strategy=ar3po", "planner.staged_rule=while_informative") == []
    greso = ("planner.strategy=greso", "planner.greso_explore_step=0")
    assert keys(*greso, "planner.greso_zero_variance_target=0.5", "planner.greso_explore_min=0.1",
                "planner.greso_explore_max=0.9") == [
        "planner.greso_zero_variance_target", "planner.greso_explore_min", "planner.greso_explore_max"]
    # an initial probability outside the bounds is clipped into them even with a step of 0
    assert keys(*greso, "planner.greso_explore_init=0.99", "planner.greso_explore_max=0.9") == []
    assert keys("planner.strategy=greso", "planner.greso_zero_variance_target=0.5", "planner.greso_explore_min=0.1") == []


def test_a_min_delta_no_evaluation_is_compared_with_is_named():
    delta = "eval.early_stopping_min_delta=0.01"
    assert keys("data.eval_size=0", "eval.save_best=true", delta) == ["eval.save_best", "eval.early_stopping_min_delta"]
    assert keys("eval.at_start=false", "eval.save_best=true", delta) == ["eval.early_stopping_min_delta"]  # one evaluation
    assert keys("eval.every_n_steps=10", "eval.early_stopping_patience=4", delta) == [
        "eval.early_stopping_patience", "eval.early_stopping_min_delta"]
    assert keys("eval.save_best=true", delta) == []
    assert keys("eval.at_start=false", "eval.every_n_steps=10", "eval.save_best=true", delta) == []
    assert keys("eval.every_n_steps=10", "eval.early_stopping_patience=3", delta) == []


def _trained(tasks: int, overlap: bool = False, steps: int = 12, **planner) -> list:
    """The samples trained in `steps` steps of the scripted loop over test_option_matrix's UIDS split among `tasks` tasks."""
    run, engine, ex, stream = _build(planner.pop("strategy", "adaptive"), "overlap" if overlap else "plain", None,
                                     tasks=tasks, **planner)
    assert stream == overlap
    out = []
    for step in range(steps):
        p = produce_batch(run, step, ex, stream=stream)
        out.append([(s.prompt_uid, tuple(s.response_ids), s.reward, s.stop_gradient) for s in p.batch])
        engine.version = step + 1
    return out


# (tasks, planner settings of both runs, the setting that differs: its value in the first run, in the second)
IDLE = [
    (1, {"strategy": "adaptive"}, ("stratify", True, False)),
    (1, {"strategy": "adaptive", "budget_rollouts": 96}, ("stratify_rollouts", True, False)),
    (1, {"strategy": "adaptive"}, ("group_prior", True, False)),
    (2, {"strategy": "uniform"}, ("success_threshold", 0.5, 1.5)),
    (2, {"strategy": "dapo"}, ("success_threshold", 0.5, 1.5)),
    (2, {"strategy": "vade", "vade_fast_weight": 0.0}, ("vade_fast_decay", 0.5, 0.9)),
    (2, {"strategy": "vade", "vade_fast_weight": 1.0}, ("vade_slow_decay", 0.95, 0.7)),
    (2, {"strategy": "ar3po", "ar3po_stages": 1}, ("staged_rule", "until_correct", "while_informative")),
    (2, {"strategy": "adaptive", "max_samples_per_prompt": 8}, ("screen_growth", "stages", "eager")),
    (2, {"strategy": "dars", "max_samples_per_prompt": 8}, ("dars_schedule", "et", "hw")),
    (2, {"strategy": "greso", "greso_explore_step": 0.0, "steps": 30}, ("greso_zero_variance_target", 0.25, 0.9)),
]


@pytest.mark.parametrize(("tasks", "common", "setting"), IDLE, ids=[f"{c['strategy']}-{s[0]}" for _, c, s in IDLE])
def test_the_named_planner_settings_change_nothing_trained(tasks, common, setting) -> None:
    key, a, b = setting
    assert _trained(tasks, **common, **{key: a}) == _trained(tasks, **common, **{key: b})


def test_overlapped_rounds_change_nothing_trained_for_a_planner_without_follow_ups() -> None:
    for strategy in ("uniform", "knapsack"):
        assert _trained(2, strategy=strategy) == _trained(2, overlap=True, strategy=strategy)
    assert _trained(2, strategy="ar3po", ar3po_stages=1) == _trained(2, overlap=True, strategy="ar3po", ar3po_stages=1)


def test_one_sample_per_prompt_with_a_fixed_allocator_is_refused():
    # every group of one sample has advantage 0: the run would train nothing, step after step
    from rollwise.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"num_generations=1 .*advantage .* is 0"):
        load_config(None, ["rollout.num_generations=1", "planner.strategy=uniform"])
    load_config(None, ["rollout.num_generations=1", "planner.strategy=knapsack"])  # it gives groups of 2 or more
