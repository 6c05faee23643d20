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


def test_a_task_whose_first_visits_are_all_right_is_refused() -> None:
    # every sample of a task right: its level's maximum likelihood is at infinity, and the fit put it at about
    # +34, which made the spread between tasks, and so difficulty_sd, about 23
    mixed = [Visit("gcd", "0110", 1), Visit("gcd", "0001", 1), Visit("gcd", "0000", 1), Visit("gcd", "1101", 1)] * 10
    with pytest.raises(FitError, match="chain_sum.*correct"):
        fit_world(mixed + [Visit("chain_sum", "1111", 1)] * 20)
    with pytest.raises(FitError, match="every sample"):  # a run with every reward 1
        fit_world([Visit("gcd", "1111", 1)] * 40)


def test_a_task_never_solved_is_taken_as_unsolvable_and_the_others_are_fitted() -> None:
    """A task whose first visits were all wrong was refused ("its level is beyond what the rollouts can measure"):
    a run on a mixture with one task the model cannot do, a common case, could not be fitted at all."""
    mixed = [Visit("gcd", "0110", 1), Visit("gcd", "0001", 1), Visit("gcd", "0000", 1), Visit("gcd", "1101", 1)] * 10
    alone = fit_world(mixed)
    both = fit_world(mixed + [Visit("chain_sum", "0000", 1)] * 20)  # 20 of 60 first visits: h = 1/3
    assert both.tasks == ["gcd"] and both.hopeless == {"chain_sum": 20} and both.groups == 60
    assert both.levels == pytest.approx(alone.levels) and both.spread == pytest.approx(alone.spread)
    assert both.unsolvable == pytest.approx(1 / 3 + 2 / 3 * alone.unsolvable)
    assert both.unsolvable_in_fitted_tasks == pytest.approx(alone.unsolvable)
    lo, hi = both.unsolvable_interval
    assert lo == pytest.approx(1 / 3 + 2 / 3 * alone.unsolvable_interval[0]) and hi <= 1.0
    # a share given for the whole run must hold the hopeless task's prompts
    assert fit_world(mixed + [Visit("chain_sum", "0000", 1)] * 20, unsolvable=0.5).unsolvable == 0.5
    with pytest.raises(FitError, match=r"--unsolvable 0.2 is below .*0.333.*chain_sum \(20 first visits\).*--unsolvable 0.334"):
        fit_world(mixed + [Visit("chain_sum", "0000", 1)] * 20, unsolvable=0.2)
    with pytest.raises(FitError, match="every sample of every first visit was wrong"):  # a run with every reward 0
        fit_world([Visit("gcd", "0000", 1)] * 40)


def test_the_check_of_a_fit_with_a_hopeless_task_predicts_its_all_wrong_groups() -> None:
    import numpy as np

    from rollwise.sim.fit import observed_histogram, predicted_histogram

    rng = np.random.default_rng(0)
    q = 1 / (1 + np.exp(-rng.normal(-0.5, 1.0, 400)))
    visits = [Visit("gcd", "".join("1" if x else "0" for x in rng.random(4) < p), 1) for p in q]
    visits += [Visit("chain_sum", "0000", 1)] * 200  # a third of the first visits
    fit = fit_world(visits)
    obs, pred = observed_histogram(visits, 4), predicted_histogram(fit, 4, visits=visits)
    assert obs[0] > 0.4 and np.abs(obs - pred).max() < 0.03, (obs.round(3), pred.round(3))


def test_simulate_fit_says_which_tasks_it_took_as_unsolvable(tmp_path, capsys) -> None:
    from test_sim_audit import parsed
    from test_sim_fit import _draw, _run_dir

    from rollwise.sim.world import SimParams

    _, visits = _draw(SimParams(n_train=240, tasks=2, skill0=-1.0, difficulty_sd=1.0, task_sd=0.5, unsolvable=0.0), 5,
                      sizes=(4,))
    visits += [Visit("spell_backward", "0000", 1)] * 60  # 60 of 300 first visits: h = 0.2
    groups: dict[int, list] = {}
    for i, v in enumerate(visits):
        groups.setdefault(1 + i % 5, []).append([f"{v.task}:train:{i}", v.outcomes])
    d = _run_dir(tmp_path, groups)
    out = tmp_path / "sim"
    args = parsed("--fit", str(d), "--strategies", "uniform", "--seeds", "1", "--steps", "2", "--eval-size", "16",
                  "--out", str(out))
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "never solved in their first visits, so taken as unsolvable: spell_backward (60 first visits)" in text, text
    assert "0.200, is part of the unsolvable share, and the simulated world has the other 2 task(s)" in text, text
    data = json.loads((out / "results.json").read_text())
    assert data["params"]["tasks"] == 2 and data["params"]["unsolvable"] >= 0.2
    assert data["fit"]["hopeless"] == {"spell_backward": 60} and data["fit"]["groups"] == 300


def test_too_few_first_visits_once_hopeless_tasks_are_set_aside_says_so() -> None:
    """11 first visits, 10 of them in a task never solved: the fit said "only 1 prompts were rolled out for the first
    time ... raise --fit-steps", with --fit-steps unset and no word of the 10 set aside."""
    with pytest.raises(FitError, match=r"only 1 of the 11 first visits are in tasks solved at least once \(chain_sum "
                                       r"\(10 first visits\) never were: set aside as unsolvable\)"):
        fit_world([Visit("gcd", "0110", 1)] + [Visit("chain_sum", "0000", 1)] * 10)
