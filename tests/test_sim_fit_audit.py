"""Audit of `rollwise simulate --fit`: runs the fit must refuse, or cut, rather than fit in silence."""

from __future__ import annotations

import json

import pytest
import yaml

from rollwise.sim.fit import FitError, Visit, first_visits, fit_world


def _run(tmp_path, rows: list[dict]):
    d = tmp_path / "run"
    d.mkdir()
    (d / "config.yaml").write_text(yaml.safe_dump({
        "rollout": {"prompts_per_step": 2, "num_generations": 4}, "train": {"max_steps": 10},
        "data": {"train_size": 100}}))
    lines = [{"step": 0, "eval/accuracy": 0.1}]
    for r in rows:  # a step's line as the training loop writes it (reward_mean marks it as a step's)
        lines.append({"step": r["step"], "rollout/rollouts": 8.0, "rollout/reward_mean": 0.5,
                      **({"rollout/groups": r["groups"]} if "groups" in r else {})})
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return d


def test_steps_logged_without_group_outcomes_end_the_first_visits(tmp_path) -> None:
    # a run begun by a rollwise older than --fit and resumed with this one: the prompts of its first
    # steps are unknown, so a group after them may be a revisit the planner chose by its outcome
    old_first = _run(tmp_path, [{"step": 1}, {"step": 2},
                                {"step": 3, "groups": [["gcd:train:1", "0011"], ["gcd:train:2", "0001"]]}])
    with pytest.raises(FitError, match="step 1 .*no rollout/groups"):
        first_visits(old_first, n_ref=8)
    # a gap in the middle: the first visits stop before it (and the signal with them)
    (tmp_path / "gap").mkdir()
    gap = _run(tmp_path / "gap", [{"step": 1, "groups": [["gcd:train:1", "0011"]]}, {"step": 2},
                                  {"step": 3, "groups": [["gcd:train:2", "0001"]]}])
    assert [(v.step, v.outcomes) for v in first_visits(gap, n_ref=8)] == [(1, "0011")]


@pytest.mark.parametrize("outcome", ["0000", "1111"])
def test_a_task_whose_first_visits_all_agree_is_refused(outcome) -> None:
    # every sample of a task wrong (or right): its level's maximum likelihood is at infinity, and the fit
    # put it at about -41 (or +34), which made the spread between tasks, and so difficulty_sd, about 23
    mixed = [Visit("gcd", "0110", 1), Visit("gcd", "0001", 1), Visit("gcd", "0000", 1), Visit("gcd", "1101", 1)] * 10
    with pytest.raises(FitError, match=f"chain_sum.*{'wrong' if outcome == '0000' else 'correct'}"):
        fit_world(mixed + [Visit("chain_sum", outcome, 1)] * 20)
    with pytest.raises(FitError, match="every sample"):  # a run with every reward 0 (or 1)
        fit_world([Visit("gcd", outcome, 1)] * 40)
