"""`rollwise simulate --fit RUN_DIR`: a simulated world fitted to a run's own first visits."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest
import yaml

from rollwise.sim.command import register
from rollwise.sim.fit import FitError, Visit, first_visits, fit_world, observed_histogram, predicted_histogram
from rollwise.sim.world import SimParams, World


def _draw(params: SimParams, seed: int, sizes=(2, 8)) -> tuple[World, list[Visit]]:
    """One first visit of every training prompt of a simulated world, group sizes drawn from `sizes`."""
    w = World(params, seed, 8, 8)
    rng = np.random.default_rng(seed + 100)
    q = w.solve_rate(np.arange(params.n_train))
    visits = []
    for i in range(params.n_train):
        n = int(rng.choice(sizes))
        visits.append(Visit(f"k{w.task[i]}", "".join("1" if x else "0" for x in rng.random(n) < q[i]), 1))
    return w, visits


def test_fit_recovers_the_world_it_was_drawn_from() -> None:
    p = SimParams(n_train=2000, tasks=3, skill0=-1.0, difficulty_sd=1.2, task_sd=0.6, unsolvable=0.1)
    w, visits = _draw(p, 3)
    fit = fit_world(visits)
    assert fit.tasks == ["k0", "k1", "k2"] and fit.groups == 2000
    for t, level in enumerate(fit.levels):  # a task's level: skill minus the mean difficulty of its prompts
        truth = p.skill0 - w.b[: p.n_train][w.task[: p.n_train] == t].mean()
        assert abs(level - truth) < 0.3, (t, level, truth)
    assert abs(fit.spread - math.sqrt(1.2**2 - 0.6**2)) < 0.2, fit.spread
    assert abs(fit.unsolvable - 0.1) < 0.06 and fit.lr_unsolvable > 2.71, fit
    assert fit.se_skill0 is not None and 0 < fit.se_skill0 < 0.3
    # the fitted world predicts the groups it was fitted to
    obs = observed_histogram(visits, 2)
    pred = predicted_histogram(fit, 2, task_shares=[sum(v.task == t for v in visits) for t in fit.tasks])
    assert np.abs(obs - pred).max() < 0.03, (obs.round(3), pred.round(3))


def test_the_fit_and_its_check_hold_under_a_planner_that_tops_up_what_it_saw() -> None:
    # a probe of 2; a prompt with a correct answer gets 10 more: the group size depends on the outcome
    p = SimParams(n_train=2000, skill0=-1.5, difficulty_sd=1.0, unsolvable=0.0)
    w = World(p, 7, 8, 8)
    rng = np.random.default_rng(7)
    visits = []
    for q in w.solve_rate(np.arange(p.n_train)):
        probe = "".join("1" if x else "0" for x in rng.random(2) < q)
        more = "".join("1" if x else "0" for x in rng.random(10) < q) if "1" in probe else ""
        visits.append(Visit("k0", probe + more, 1))
    fit = fit_world(visits)
    assert abs(fit.skill0 + 1.5) < 0.25 and abs(fit.spread - 1.0) < 0.3, fit
    twos = [v for v in visits if v.n == 2]
    assert all(v.correct == 0 for v in twos)  # groups of 2 alone are chosen by outcome: no fair check
    obs = observed_histogram(visits, 2)  # the first 2 samples of every visit are
    assert np.abs(obs - predicted_histogram(fit, 2)).max() < 0.03


def test_fit_tells_a_hard_world_from_an_easy_one_and_keeps_a_given_unsolvable_share() -> None:
    hard = fit_world(_draw(SimParams(n_train=600, skill0=-2.0, difficulty_sd=0.8, unsolvable=0.0), 1)[1])
    easy = fit_world(_draw(SimParams(n_train=600, skill0=1.0, difficulty_sd=0.8, unsolvable=0.0), 1)[1])
    assert hard.skill0 < -1.5 and easy.skill0 > 0.5, (hard.skill0, easy.skill0)
    # no unsolvable prompts in that world: the likelihood-ratio test keeps the share at 0
    assert hard.unsolvable == 0.0 and hard.lr_unsolvable is not None and hard.lr_unsolvable <= 2.71
    fixed = fit_world(_draw(SimParams(n_train=600, skill0=-2.0, difficulty_sd=0.8, unsolvable=0.0), 1)[1],
                      unsolvable=0.2)
    assert fixed.unsolvable == 0.2 and fixed.unsolvable_given and fixed.other_branch is None
    # the fit with a free share, the branch the test turned down, is kept for the printout: the SEs hold
    # only given the test's choice, and the two branches can differ by several of them
    k0, spread, u = hard.other_branch
    assert u > 0.0 and k0 >= hard.skill0 - 1e-6
    assert fixed.skill0 > hard.skill0  # a fifth unsolvable explains some all-wrong groups: the rest look easier


def test_the_unsolvable_shares_profile_interval_holds_the_truth_where_the_test_picks_the_wrong_branch() -> None:
    # a world with 30% unsolvable: the interval holds the share and leaves out none
    p = SimParams(n_train=600, skill0=-1.0, difficulty_sd=1.0, unsolvable=0.3)
    fit = fit_world(_draw(p, 5, sizes=(8,))[1])
    lo, hi = fit.unsolvable_interval
    assert 0.0 < lo < 0.3 < hi < 0.6 and lo <= fit.unsolvable <= hi, fit.unsolvable_interval
    assert fit.skill0_range[0] <= fit.skill0 <= fit.skill0_range[1]
    # a wider world with few prompts: the test keeps no share, its SE does not hold the true level, and
    # the interval (which reaches 0.3) and the range of skill0 across it do
    p = SimParams(n_train=200, skill0=-1.0, difficulty_sd=2.5, unsolvable=0.3)
    w, visits = _draw(p, 1, sizes=(8,))
    fit = fit_world(visits)
    level = p.skill0 - w.b[: p.n_train].mean()
    assert fit.unsolvable == 0.0 and abs(fit.skill0 - level) > 1.96 * fit.se_skill0, (fit.skill0, level)
    lo, hi = fit.unsolvable_interval
    assert lo == 0.0 and 0.3 < hi < 0.9, fit.unsolvable_interval
    assert fit.skill0_range[0] < level < fit.skill0_range[1], (fit.skill0_range, level)
    # a given share has no interval
    assert fit_world(visits, unsolvable=0.2).unsolvable_interval is None


def test_the_profile_interval_is_cut_against_the_best_fit_of_its_own_family() -> None:
    # visits from two points of training: a growing spread is tried and turned down, so the profile is
    # of fixed-spread fits, and its cut (3.84) is measured from the best fixed-spread fit, not from the
    # growing one, whose extra parameter would narrow the interval
    from rollwise.sim.fit import LR_PROFILE, _fit

    p = SimParams(n_train=600, skill0=-1.0, difficulty_sd=1.0, unsolvable=0.3)
    w = World(p, 4, 8, 8)
    rng = np.random.default_rng(104)
    q = w.solve_rate(np.arange(p.n_train))
    visits = [Visit("k0", "".join("1" if x else "0" for x in rng.random(8) < q[i]), 1, signal=0.0 if i % 2 else 0.5)
              for i in range(p.n_train)]
    fit = fit_world(visits)
    assert fit.growth is None and fit.lr_growth > 1.0, fit.lr_growth  # tried, turned down
    top = _fit(visits, 1.5, None, 20, False).loglik
    lo, hi = fit.unsolvable_interval
    for end in (lo, hi):
        drop = 2.0 * (top - _fit(visits, 1.5, end, 20, False).loglik)
        assert abs(drop - LR_PROFILE) < 0.5, (end, drop)


def _run_dir(tmp_path, groups_by_step: dict[int, list[list]], scale=(4, 4, 40, 500)):
    d = tmp_path / "run"
    d.mkdir()
    pps, n, steps, pool = scale
    (d / "config.yaml").write_text(yaml.safe_dump({
        "rollout": {"prompts_per_step": pps, "num_generations": n}, "train": {"max_steps": steps},
        "data": {"train_size": pool}}))
    lines = [{"step": 0, "eval/accuracy": 0.1}]
    lines += [{"step": s, "rollout/rollouts": float(sum(len(g[1]) for g in gs)), "rollout/groups": gs}
              for s, gs in groups_by_step.items()]
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return d


def test_first_visits_are_the_first_group_of_each_prompt_in_the_fitted_steps(tmp_path) -> None:
    d = _run_dir(tmp_path, {1: [["chain_sum:train:1", "00"], ["gcd:train:7", "01100100"]],
                            2: [["chain_sum:train:1", "11101010"], ["gcd:train:9", "10"]],
                            3: [["gcd:train:11", "11111111"]]})
    got = first_visits(d, fit_steps=2)
    assert [(v.task, v.n, v.correct, v.step) for v in got] == [("chain_sum", 2, 0, 1), ("gcd", 8, 3, 1), ("gcd", 2, 1, 2)]
    assert len(first_visits(d, fit_steps=3)) == 4
    # runs since 2026-12-04 log each response's length as a third field; the signal reads both forms
    # (step 1: 4*1*1/2 + 4*3*5/8 = 9.5 effective samples; over n_ref 16 that is 0.59375 before step 2)
    (tmp_path / "with_lengths").mkdir()
    d3 = _run_dir(tmp_path / "with_lengths", {1: [["chain_sum:train:1", "01", [3, 9]], ["gcd:train:7", "01100100",
                                                                                      [5] * 8]],
                                            2: [["gcd:train:9", "10", [2, 4]]]})
    got = first_visits(d3, n_ref=16)
    assert [(v.task, v.correct, v.step) for v in got] == [("chain_sum", 1, 1), ("gcd", 3, 1), ("gcd", 1, 2)]
    assert [v.signal for v in got] == pytest.approx([0.0, 0.0, 9.5 / 16])


def test_runs_that_cannot_be_fitted_say_why(tmp_path) -> None:
    with pytest.raises(FitError, match="no metrics.jsonl"):
        first_visits(tmp_path, 10)
    old = tmp_path / "old"
    old.mkdir()
    (old / "metrics.jsonl").write_text(json.dumps({"step": 1, "rollout/rollouts": 64.0}) + "\n")
    with pytest.raises(FitError, match="older than `simulate --fit`"):
        first_visits(old, 10)
    with pytest.raises(FitError, match="at least 20"):
        fit_world([Visit("a", "01000000", 1)] * 5)


def test_simulate_fit_end_to_end(tmp_path, capsys) -> None:
    p = SimParams(n_train=300, tasks=2, skill0=-1.5, difficulty_sd=1.0, task_sd=0.5, unsolvable=0.0)
    w, visits = _draw(p, 5, sizes=(4,))
    groups = {1 + i // 30: [] for i in range(len(visits))}
    for i, v in enumerate(visits):
        groups[1 + i // 30].append([f"{v.task}:train:{i}", v.outcomes])
    d = _run_dir(tmp_path, groups)
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="cmd"))
    out = tmp_path / "sim"
    args = parser.parse_args(["simulate", "--fit", str(d), "--fit-steps", "5", "--strategies", "uniform", "adaptive",
                              "--seeds", "1", "--steps", "3", "--eval-size", "16", "--out", str(out)])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "fitted to" in text and "first visits of 150 prompts in steps 1-5" in text
    assert "the same world without the run: rollwise simulate --skill0" in text
    assert "the unsolvable share's 95% profile-likelihood interval is [0.000, " in text
    assert "skill0 runs" in text and "the SEs above hold only at the share chosen" in text
    data = json.loads((out / "results.json").read_text())
    assert data["fit"]["groups"] == 150 and data["fit"]["fit_steps"] == 5
    prm = data["params"]
    assert prm["tasks"] == 2 and prm["n_train"] == 500 and abs(prm["skill0"] + 1.5) < 0.5
    assert data["args"]["prompts_per_step"] == 4 and data["args"]["steps"] == 3  # the run's scale; flags win
    both = parser.parse_args(["simulate", "--fit", str(d), "--skill0", "-1", "--out", str(out), "--quiet"])
    assert both.func(both) == 2
    assert "drop it or drop --fit" in capsys.readouterr().err
    missing = parser.parse_args(["simulate", "--fit", str(tmp_path / "nope"), "--out", str(out), "--quiet"])
    assert missing.func(missing) == 2
    assert "no config.yaml" in capsys.readouterr().err
    # two seeds of one setup are fitted together (each run's own first visits); another setup is refused
    import shutil

    shutil.copytree(d, tmp_path / "run2")
    two = parser.parse_args(["simulate", "--fit", str(d), str(tmp_path / "run2"), "--fit-steps", "5", "--strategies",
                             "uniform", "--seeds", "1", "--steps", "3", "--eval-size", "16", "--out", str(out)])
    assert two.func(two) == 0
    assert "fitted to 2 runs" in capsys.readouterr().out
    assert json.loads((out / "results.json").read_text())["fit"]["groups"] == 300
    twice = parser.parse_args(["simulate", "--fit", str(d), str(d), "--out", str(out), "--quiet"])
    assert twice.func(twice) == 2
    assert "given twice" in capsys.readouterr().err
    mean = parser.parse_args(["simulate", "--fit", str(d), "--fit-steps", "5", "--law", "mean", "--strategies", "uniform",
                              "--seeds", "1", "--steps", "3", "--eval-size", "16", "--out", str(out)])
    assert mean.func(mean) == 0
    assert "--law mean --eval-size 16" in capsys.readouterr().out  # the equivalent command repeats them
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.yaml").write_text(yaml.safe_dump({"rollout": {"prompts_per_step": 8, "num_generations": 4},
                                                      "train": {"max_steps": 40}, "data": {"train_size": 500}}))
    mixed = parser.parse_args(["simulate", "--fit", str(d), str(other), "--out", str(out), "--quiet"])
    assert mixed.func(mixed) == 2
    assert "fit runs of one setup together" in capsys.readouterr().err


def _uniform_run_visits(p: SimParams, steps: int = 20) -> tuple[World, list[Visit]]:
    """The first visits of a uniform run in the simulator (16 x 8), each with the effective samples
    trained on before its step per uniform batch."""
    from rollwise.config import PlannerConfig
    from rollwise.planner import build_planner
    from rollwise.sim.runner import play_step

    w = World(p, 0, 16, 8)
    pl = build_planner(PlannerConfig(strategy="uniform"), w.train_uids, 16, 8, p.max_len, 0)
    seen, visits, signal = set(), [], 0.0
    for step in range(steps):
        groups, _ = play_step(pl, w, step, False)
        out = pl.end_step()
        w.learn(groups, out.train, out.replay)
        for uid, r in groups.items():
            if uid not in seen:
                seen.add(uid)
                visits.append(Visit("k0", "".join("1" if x else "0" for x in r), step + 1, signal))
        signal += sum(4 * sum(r) * (len(r) - sum(r)) / len(r) for r in groups.values()) / (16 * 8)
    return w, visits


def test_the_fit_recovers_the_simulators_learning_rate_from_a_simulated_run() -> None:
    # a uniform run in the simulator (signal law, lr 0.3): first visits later in the run find a more
    # skilled policy, in proportion to the effective samples trained on before them
    p = SimParams(n_train=4000, skill0=-1.5, difficulty_sd=1.0, unsolvable=0.0, lr=0.3)
    _, visits = _uniform_run_visits(p)
    fit = fit_world(visits)
    assert fit.learning is not None and abs(fit.learning - 0.3) < 0.08, (fit.learning, fit.se_learning)
    assert abs(fit.skill0 + 1.5) < 0.3, fit.skill0  # the skill at the start, not the run's average
    assert fit.growth is None and fit.lr_growth is not None and fit.lr_growth < 2.71  # every prompt shifted alike
    # the same visits without their place in training: no learning rate, a skill between start and end
    flat = fit_world([Visit(v.task, v.outcomes, 1) for v in visits])
    assert flat.learning is None and flat.skill0 > fit.skill0 + 0.3 and flat.lr_growth is None


def test_the_fit_recovers_a_spread_that_grows_and_simulate_turns_it_into_polarise() -> None:
    # polarise 0.5 under the add law with lr 0.6: per effective sample the skill shifts by 0.3 and
    # the spread's learnability weight g grows by 0.3
    p = SimParams(n_train=4000, skill0=-1.5, difficulty_sd=1.0, unsolvable=0.0, lr=0.6, polarise=0.5,
                  polarise_law="add")
    w, visits = _uniform_run_visits(p)
    fit = fit_world(visits)
    assert fit.growth is not None and abs(fit.growth - 0.3) < 0.1, (fit.growth, fit.se_growth)
    assert fit.learning is not None and abs(fit.learning - 0.3) < 0.1, fit.learning
    assert fit.lr_growth > 10
    assert w.g == pytest.approx(0.5 * 0.6 * visits[-1].signal, rel=0.2)  # g = p * lr * X
    # the check's prediction follows each visit's point of training
    late = [v for v in visits if v.signal > 4]
    early_pred = predicted_histogram(fit, 8, visits=[v for v in visits if v.signal == 0])
    late_pred = predicted_histogram(fit, 8, visits=late)
    assert late_pred[0] + late_pred[8] > early_pred[0] + early_pred[8]  # a wider spread: more all-equal groups
    assert fit_world(visits, growth=False).growth is None


def test_simulate_fit_sets_polarise_from_a_run_whose_spread_grew(tmp_path, capsys) -> None:
    p = SimParams(n_train=4000, skill0=-1.5, difficulty_sd=1.0, unsolvable=0.0, lr=0.6, polarise=0.5,
                  polarise_law="add")
    _, visits = _uniform_run_visits(p)
    groups: dict[int, list[list]] = {}
    for i, v in enumerate(visits):  # a 4,000-prompt pool in 20 steps of 16: every group is a first visit
        groups.setdefault(v.step, []).append([f"{v.task}:train:{i}", v.outcomes])
    d = _run_dir(tmp_path, groups, scale=(16, 8, 20, 4000))
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="cmd"))
    out = tmp_path / "sim"
    args = parser.parse_args(["simulate", "--fit", str(d), "--strategies", "uniform", "--seeds", "1", "--steps", "3",
                              "--eval-size", "16", "--out", str(out)])
    assert args.func(args) == 0
    captured = capsys.readouterr()
    text = captured.out
    assert "and the spread grew" in text and "--polarise-law add" in text
    assert "--task-sd" not in captured.err  # one task: the fit sets no spread between tasks to warn of
    prm = json.loads((out / "results.json").read_text())["params"]
    assert prm["polarise_law"] == "add" and abs(prm["polarise"] - 0.5) < 0.15 and abs(prm["lr"] - 0.6) < 0.15
    given = parser.parse_args(["simulate", "--fit", str(d), "--polarise", "0.3", "--out", str(out), "--quiet"])
    assert given.func(given) == 2
    assert "--polarise" in capsys.readouterr().err


def test_a_run_stopped_by_its_token_budget_is_simulated_for_the_steps_it_ran(tmp_path) -> None:
    from rollwise.sim.fit import run_scale

    d = _run_dir(tmp_path, {1: [["gcd:train:1", "0101"]], 2: [["gcd:train:2", "0011"]]}, scale=(4, 4, 1000, 200))
    assert run_scale(d)["steps"] == 1000  # max_steps: the run was meant to go on
    cfg = yaml.safe_load((d / "config.yaml").read_text())
    cfg["train"]["max_rollout_tokens"] = 27000
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert run_scale(d)["steps"] == 2  # the budget stopped it after the steps it logged
    (d / "config.yaml").write_text("rollout: [unclosed\n")
    with pytest.raises(FitError, match="not valid YAML"):
        run_scale(d)
