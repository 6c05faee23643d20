"""The simulator: world mechanics with hand-computed cases, runs, the table and the command."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace

import numpy as np
import pytest

from rollwise.planner import Request
from rollwise.sim.command import parse_strategy, register
from rollwise.sim.report import GRID, curve, first_reach, mean_interval, summarize
from rollwise.sim.runner import RunResult, RunSpec, play_step, run_many, run_one
from rollwise.sim.world import SimParams, World

SMALL = SimParams(n_train=64, n_eval=32)


def world(**kw) -> World:
    return World(SimParams(**{**SMALL.__dict__, **kw}), 0, prompts_per_step=4, num_generations=4)


def test_generate_binary_rewards_and_capped_lengths() -> None:
    w = world(max_len=50, length_median=40.0)
    res = w.generate(Request("t0", 200))
    assert set(res.rewards) <= {0.0, 1.0} and len(res.lengths) == 200
    assert max(res.lengths) <= 50
    capped = [r for r, n in zip(res.rewards, res.lengths) if n == 50]
    assert all(r == 0.0 for r in capped)  # truncated responses score 0
    w.solvable[:] = False
    assert sum(w.generate(Request("t1", 50)).rewards) == 0.0


def test_solve_rate_is_the_item_response_curve() -> None:
    w = world(max_len=10**9)
    w.theta, w.a[0], w.b[0], w.delta[0], w.solvable[0] = 0.5, 2.0, 1.0, 0.25, True
    assert w.solve_rate(np.array([0]))[0] == pytest.approx(1 / (1 + math.exp(-2.0 * (0.5 + 0.25 - 1.0))))


@pytest.mark.parametrize("law", ["signal", "mean", "saturating"])
def test_learning_laws_hand_computed(law: str) -> None:
    w = world(law=law, lr=0.1, local_lr=0.5, drift=0.0)
    t0 = w.theta
    groups = {"t0": [1.0, 0.0, 0.0, 0.0], "t1": [1.0, 1.0, 1.0, 1.0], "t2": [0.0] * 4}
    gain = w.learn(groups, ["t0", "t1", "t2"], replay=["t2"])
    e0 = 4 * (4 * 1 * 3 / 16)  # n * 4c(n-c)/n^2 = 3
    e2 = 0.5 * 4 * (4 * 1 * 4 / 25)  # replayed: 1 correct of 5, weight 0.5 = 1.28
    e = e0 + e2
    expected = {"signal": 0.1 * e / 16, "mean": 0.1 * e / 12,
                "saturating": 0.1 * 0.25 * (1 - math.exp(-e / (0.25 * 16)))}[law]
    assert gain == pytest.approx(expected) and w.theta - t0 == pytest.approx(expected)
    assert w.delta[0] == pytest.approx(0.5 * e0 / 4) and w.delta[1] == 0.0


def test_revisit_decay_discounts_a_prompts_retraining_hand_computed() -> None:
    w = world(lr=0.1, local_lr=0.5, drift=0.0, revisit_decay=0.5)
    group = {"t0": [1.0, 0.0, 0.0, 0.0], "t1": [1.0, 1.0, 0.0, 0.0], "t2": [0.0] * 4}
    e0, e1 = 3.0, 4.0  # n * 4c(n-c)/n^2
    gains = [w.learn(group, ["t0", "t2"], replay=[]) for _ in range(3)]  # t0 three times; t2 has no signal
    assert gains == pytest.approx([0.1 * e0 / 16, 0.1 * e0 * 0.5 / 16, 0.1 * e0 * 0.25 / 16])
    assert w.learn(group, ["t0", "t1"], replay=[]) == pytest.approx(0.1 * (e0 * 0.125 + e1) / 16)  # t1 is new
    assert w.delta[0] == pytest.approx(4 * 0.5 * e0 / 4)  # its own offset gains in full every time
    assert list(w.trained[:3]) == [4, 1, 0]
    with pytest.raises(ValueError, match="revisit_decay"):
        world(revisit_decay=1.5)


def test_polarising_gain_widens_the_spread_hand_computed() -> None:
    w = world(lr=0.1, local_lr=0.0, drift=0.0, polarise=0.75)
    t0, b = w.theta, w.b.copy()
    gain = w.learn({"t0": [1.0, 0.0, 0.0, 0.0]}, ["t0"], replay=[])
    g = 0.1 * 3 / 16  # the signal law, e = 3 (as above)
    assert gain == pytest.approx(g)
    assert w.theta - t0 == pytest.approx(0.25 * g)
    assert w.kappa == pytest.approx(1.0 + 0.75 * g / w.p.difficulty_sd)
    i = np.flatnonzero(w.solvable)[:3]
    expected = w.fit[i] / (1 + np.exp(-w.a[i] * (w.theta + w.delta[i] - w.kappa * b[i])))
    assert w.solve_rate(i) == pytest.approx(expected)
    # easy prompts got easier and hard ones harder than a plain shift would make them
    plain = world(lr=0.1, local_lr=0.0, drift=0.0)
    plain.learn({"t0": [1.0, 0.0, 0.0, 0.0]}, ["t0"], replay=[])
    easy, hard = int(np.argmin(np.where(w.solvable, b, np.inf))), int(np.argmax(np.where(w.solvable, b, -np.inf)))
    assert w.solve_rate(np.array([easy]))[0] > plain.solve_rate(np.array([easy]))[0]
    assert w.solve_rate(np.array([hard]))[0] < plain.solve_rate(np.array([hard]))[0]
    with pytest.raises(ValueError, match="polarise"):
        world(polarise=1.5)


def test_a_threshold_evaluation_counts_the_held_out_prompts_above_it() -> None:
    w = world(eval_threshold=0.3)
    q = w.solve_rate(w.eval_idx)
    assert w.eval_accuracy() == pytest.approx(float((q > 0.3).mean()))
    assert world().eval_accuracy() == pytest.approx(float(q.mean()))  # 0: the mean solve rate, the same world
    with pytest.raises(ValueError, match="eval_threshold"):
        world(eval_threshold=1.0)


def test_the_add_law_gives_each_prompt_a_learnability_of_its_own_hand_computed() -> None:
    w = world(lr=0.1, local_lr=0.0, drift=0.0, polarise=0.75, polarise_law="add")
    plain = world(lr=0.1, local_lr=0.0, drift=0.0)
    assert np.array_equal(w.b, plain.b) and np.array_equal(w.a, plain.a)  # the same world for a seed
    assert abs(np.corrcoef(w.v, w.b)[0, 1]) < 0.2  # the learnability is not the difficulty
    t0 = w.theta
    w.learn({"t0": [1.0, 0.0, 0.0, 0.0]}, ["t0"], replay=[])
    g = 0.1 * 3 / 16
    assert w.theta - t0 == pytest.approx(0.25 * g) and w.g == pytest.approx(0.75 * g) and w.kappa == 1.0
    i = np.flatnonzero(w.solvable)[:3]
    expected = w.fit[i] / (1 + np.exp(-w.a[i] * (w.theta + w.delta[i] - w.b[i] + w.g * w.v[i])))
    assert w.solve_rate(i) == pytest.approx(expected)
    with pytest.raises(ValueError, match="polarise law"):
        world(polarise_law="widen")


def test_tasks_split_the_gain_by_effective_samples_hand_computed() -> None:
    w = world(tasks=2, transfer=0.25, lr=0.1, local_lr=0.0, drift=0.0)
    k0 = [u for u in w.train_uids if u.startswith("k0:")]
    k1 = [u for u in w.train_uids if u.startswith("k1:")]
    assert k0 and k1 and len(k0) + len(k1) == len(w.train_uids)
    # one group of task 0 with 1/4 correct (E = 3), none of task 1: G = 0.1 * 3 / 16
    gain = w.learn({k0[0]: [1.0, 0.0, 0.0, 0.0], k1[0]: [1.0] * 4}, [k0[0], k1[0]], replay=[])
    g = 0.1 * 3 / 16
    assert gain == pytest.approx(g)
    assert w.theta == pytest.approx(SMALL.skill0 + 0.25 * g)
    assert w.phi == pytest.approx([0.75 * g * 2, 0.0])  # all of the task share went to task 0
    i = w.index[k1[1]]
    w.a[i], w.b[i], w.delta[i], w.solvable[i] = 1.0, 0.0, 0.0, True
    z = w.theta + w.phi[1]
    assert w.solve_rate(np.array([i]))[0] == pytest.approx(w.fit[i] / (1 + math.exp(-z)))


def test_balanced_training_moves_every_task_like_the_world_without_tasks() -> None:
    w = world(tasks=2, transfer=0.5, lr=0.1, local_lr=0.0, drift=0.0)
    a = next(u for u in w.train_uids if u.startswith("k0:"))
    b = next(u for u in w.train_uids if u.startswith("k1:"))
    gain = w.learn({a: [1.0, 0.0, 1.0, 0.0], b: [0.0, 1.0, 1.0, 0.0]}, [a, b], replay=[])
    assert w.theta + w.phi[0] == pytest.approx(SMALL.skill0 + gain)
    assert w.theta + w.phi[1] == pytest.approx(SMALL.skill0 + gain)


def test_task_difficulty_keeps_the_total_spread_and_the_world_without_tasks() -> None:
    big = dict(n_train=20000, n_eval=10)
    plain = World(SimParams(**big), 5, 4, 4)
    same = World(SimParams(**big, tasks=0, task_sd=2.0, transfer=0.1), 5, 4, 4)
    assert np.array_equal(plain.b, same.b) and plain.train_uids == same.train_uids  # K = 0: untouched
    tasked = World(SimParams(**big, tasks=400, task_sd=2.0), 5, 4, 4)
    assert np.std(tasked.b) == pytest.approx(SimParams().difficulty_sd, rel=0.05)
    means = np.array([tasked.b[tasked.task == t].mean() for t in range(400)])
    assert np.std(means) == pytest.approx(2.0, rel=0.15)  # the task's share of the spread
    with pytest.raises(ValueError, match="task_sd"):
        World(SimParams(**big, tasks=3, task_sd=3.0), 0, 4, 4)
    with pytest.raises(ValueError, match="transfer"):
        World(SimParams(**big, tasks=3, transfer=1.5), 0, 4, 4)


def test_prompt_feature_explains_its_share_of_difficulty_and_leaves_the_world_unchanged() -> None:
    big = dict(n_train=20000, n_eval=10)
    plain, featured = World(SimParams(**big), 5, 4, 4), World(SimParams(**big, feature_r2=0.5), 5, 4, 4)
    for name in ("b", "a", "solvable"):
        assert np.array_equal(getattr(plain, name), getattr(featured, name))
    assert not plain.feature.any()
    assert np.corrcoef(featured.feature, featured.b)[0, 1] ** 2 == pytest.approx(0.5, abs=0.02)
    assert np.std(featured.feature) == pytest.approx(1.0, abs=0.03)
    with pytest.raises(ValueError, match="feature_r2"):
        World(SimParams(**big, feature_r2=1.5), 0, 4, 4)


def test_length_prior_reads_the_simulated_feature(monkeypatch) -> None:
    """With a feature that is the difficulty itself, the irt prior learns that a higher feature means a
    harder prompt, and the planner's rollouts land on informative groups more often than without."""
    params = SimParams(n_train=256, n_eval=64, feature_r2=1.0)
    spec = RunSpec("adaptive", 0, steps=40, prompts_per_step=8, params=params)
    import rollwise.sim.runner as runner_mod

    built, orig = [], runner_mod.build_planner
    monkeypatch.setattr(runner_mod, "build_planner", lambda *a, **k: built.append(orig(*a, **k)) or built[-1])
    with_prior = run_one(replace(spec, planner={"length_prior": True}))
    est = built[0].estimator
    assert est.uses_covariate and est.beta[0] < -0.5  # longer (here: harder) prompts get a lower prior
    without = run_one(spec)
    assert with_prior.effective / with_prior.generated > without.effective / without.generated


def test_run_is_deterministic_and_spends_the_budget() -> None:
    spec = RunSpec("mopps", 3, steps=8, prompts_per_step=4, num_generations=4, params=SMALL)
    a, b = run_one(spec), run_one(spec)
    assert np.array_equal(a.accuracy, b.accuracy) and np.array_equal(a.rollouts, b.rollouts)
    assert a.rollouts[-1] >= 8 * 16 and a.rollouts[-2] < 8 * 16
    assert 0 <= a.effective <= a.generated


def test_a_strategy_with_its_own_step_budget_spends_the_same_total() -> None:
    """A row's budget_rollouts sets its step size, not its total: half the step, about twice the steps."""
    spec = RunSpec("uniform", 3, steps=8, prompts_per_step=4, num_generations=4, params=SMALL)
    whole = run_one(spec)
    half = run_one(RunSpec("uniform", 3, steps=8, prompts_per_step=4, num_generations=4, params=SMALL,
                           planner={"budget_rollouts": 8}))
    assert whole.budget_total == half.budget_total == 8 * 16
    assert half.rollouts[-1] == whole.rollouts[-1] == 8 * 16
    assert np.all(np.diff(half.rollouts) == 8) and len(half.rollouts) == 2 * len(whole.rollouts) - 1
    # under the signal law the gain is linear in effective samples; under `mean` (a loss averaged
    # over each step's batch) it is per step, so twice the steps of the same quality learn more
    mean = replace(SMALL, law="mean")
    whole_m = run_one(RunSpec("uniform", 3, steps=8, prompts_per_step=4, num_generations=4, params=mean))
    half_m = run_one(RunSpec("uniform", 3, steps=8, prompts_per_step=4, num_generations=4, params=mean,
                             planner={"budget_rollouts": 8}))
    assert half_m.accuracy[-1] > whole_m.accuracy[-1]


class _ScriptedWorld:
    """Lengths by uid and request number; every reward 1 (a stand-in for World.generate)."""

    def __init__(self, lengths: dict[str, list[list[int]]]):
        self.lengths, self.calls = lengths, {}

    def generate(self, r):
        from rollwise.planner import GroupResult

        k = self.calls[r.uid] = self.calls.get(r.uid, -1) + 1
        ls = self.lengths[r.uid][k]
        assert len(ls) == r.n
        return GroupResult(r.uid, [1.0] * r.n, ls)


class _FollowUp:
    """A planner that asks `a` for one follow-up of 2 samples after its first group."""

    streams = True

    def __init__(self):
        self.seen: list[str] = []

    def begin_step(self, step):
        return [Request("a", 2), Request("b", 2)]

    def observe(self, results):
        self.seen += [r.uid for r in results]
        return [Request("a", 2)] if [r.uid for r in results].count("a") and self.seen.count("a") == 1 else []


@pytest.mark.parametrize("overlap", [False, True])
def test_step_latency_hand_computed(overlap: bool) -> None:
    # a: 10 and 30 tokens, then a follow-up of 5 and 7; b: 50 and 20.
    # round by round: max(30, 50) + max(5, 7) = 57; overlapped: a ends at 30, its follow-up at 37,
    # b at 50: the step lasts 50, and the planner saw a before b
    w = _ScriptedWorld({"a": [[10, 30], [5, 7]], "b": [[50, 20]]})
    pl = _FollowUp()
    groups, took = play_step(pl, w, 0, overlap)
    assert took == (50 if overlap else 57)
    assert groups == {"a": [1.0] * 4, "b": [1.0] * 2}
    assert pl.seen == (["a", "a", "b"] if overlap else ["a", "b", "a"])


def test_overlapped_run_spends_the_same_budget_and_reports_latency() -> None:
    spec = RunSpec("adaptive", 1, steps=6, prompts_per_step=4, num_generations=4, params=SMALL)
    rounds, overlapped = run_one(spec), run_one(replace(spec, overlap=True))
    for r in (rounds, overlapped):
        assert r.rollouts[-1] >= 6 * 16 and len(r.latency) == len(r.rollouts)
        assert np.all(np.diff(r.latency) > 0)
    res = {"uniform": [run_one(replace(spec, strategy="uniform"))], "adaptive": [overlapped]}
    assert summarize(res, "rollouts", 0.0)["uniform"]["latency_share"].mean == 0.0  # reached at once
    share = summarize(res, "rollouts", None)["uniform"]["latency_share"].mean  # its own final accuracy
    assert 0.5 < share <= 1.0


def test_the_step_that_crosses_the_budget_gives_no_credit() -> None:
    """Under a token budget the last step overshoots the total (22 here). Its update needed tokens
    past the budget, so the run's accuracy at the total is the one after the last step inside it
    (0.3, not 0.36 interpolated), and uniform reaches that, its own target, when that step ends:
    at 20 of 22 tokens, 10 of its 11 time units."""
    x = np.array([0.0, 10.0, 20.0, 25.0])
    over = RunResult("uniform", 0, x, x, np.array([0.1, 0.2, 0.3, 0.4]), 5, 10, 0.2, 0.1, 0, 22.0,
                     latency=np.array([0.0, 5.0, 10.0, 12.5]))
    s = summarize({"uniform": [over]}, "tokens", None)["uniform"]
    assert s["final"].mean == pytest.approx(0.3)
    assert s["reach_share"].mean == pytest.approx(20 / 22) and s["latency_share"].mean == pytest.approx(10 / 11)
    assert curve(over, "tokens")[GRID // 2] == pytest.approx(0.2)  # at 11 tokens: after step 1, not 0.21


def test_token_budget_run() -> None:
    spec = RunSpec("knapsack", 0, steps=6, prompts_per_step=4, num_generations=4, unit="tokens", params=SMALL)
    r = run_one(spec)
    assert r.tokens[-1] >= r.budget_total and r.tokens[-2] < r.budget_total


def test_run_many_groups_by_strategy() -> None:
    base = RunSpec("uniform", 0, steps=4, prompts_per_step=4, num_generations=4, params=SMALL)
    out = run_many(base, ["uniform", "dapo"], [0, 1])
    assert {k: [r.seed for r in v] for k, v in out.items()} == {"uniform": [0, 1], "dapo": [0, 1]}


def fake(strategy: str, seed: int, acc: list[float]) -> RunResult:
    x = np.arange(len(acc), dtype=float) * 10
    return RunResult(strategy, seed, x, x * 100, np.array(acc), 5, 10, 0.2, 0.1, 0, float(x[-1]))


def test_first_reach_is_the_end_of_the_first_step_at_target_and_summary_pairs_seeds() -> None:
    r = fake("x", 0, [0.1, 0.3, 0.5])
    assert first_reach(r, "rollouts", 0.4) == pytest.approx(20.0)  # the step that got there ends at 20
    assert first_reach(r, "rollouts", 0.3) == pytest.approx(10.0)
    assert math.isnan(first_reach(r, "rollouts", 0.9))
    # the last step overshoots the budget (token budgets): uniform's own target, its accuracy at the
    # budget, is that of the last step inside it, reached when that step ended, not "never"
    # (seed 7 of `rollwise simulate --unit tokens`, where rounding once made it "never")
    x = np.array([14193972.0, 14278663.0, 14385571.0])
    acc = np.array([0.3544055605116394, 0.355833951172303, 0.358287687847312])
    over = RunResult("uniform", 7, x, x, acc, 5, 10, 0.2, 0.1, 0, 14384100.0)
    assert first_reach(over, "rollouts", float(curve(over, "rollouts")[-1])) == pytest.approx(14278663.0)
    res = {"uniform": [fake("uniform", 0, [0.1, 0.2, 0.4]), fake("uniform", 1, [0.1, 0.2, 0.3])],
           "fast": [fake("fast", 0, [0.1, 0.4, 0.5]), fake("fast", 1, [0.1, 0.5, 0.5])]}
    s = summarize(res, "rollouts", None)
    assert s["fast"]["reach"].mean == pytest.approx(10.0)  # targets .4 and .3, both at the end of step 1
    assert s["fast"]["effective"].mean == 0.5
    with pytest.raises(ValueError, match="target"):
        summarize({"fast": res["fast"]}, "rollouts", None)


def test_mean_interval() -> None:
    s = mean_interval(np.array([1.0, 2.0, 3.0, float("nan")]))
    # a Student-t interval: 2 +- t(0.975, 2) * 1 / sqrt(3), wider than the seeds' range over three seeds
    assert s.mean == 2.0 and s.n == 3 and s.lo == pytest.approx(2 - 4.302652730 / 3**0.5) and s.lo < 1.0
    assert s.hi == pytest.approx(2 + 4.302652730 / 3**0.5)
    assert s.fmt(digits=1).startswith("2.0 [")
    # one or two seeds: no useful 95% interval, the mean alone, with its count
    assert mean_interval(np.array([1.0, 2.0])).fmt(digits=1) == "1.5 (n=2)"
    assert mean_interval(np.array([float("nan")])).fmt() == "never"


def test_without_a_uniform_row_latency_is_not_defined_and_results_json_is_strict(tmp_path) -> None:
    from rollwise.sim.command import json_nulls

    def fake(name, seed, acc):
        x = np.array([0.0, 10.0, 20.0])
        return RunResult(name, seed, x, x, np.array(acc), 5, 10, 0.2, 0.1, 0, 20.0, latency=x / 2)

    s = summarize({"fast": [fake("fast", 0, [0.1, 0.4, 0.5])], "slow": [fake("slow", 0, [0.1, 0.1, 0.1])]},
                  "rollouts", 0.3)
    assert s["fast"]["latency_share"].fmt() == "n/a" and s["fast"]["reach"].n == 1  # reached, share undefined
    assert s["slow"]["reach"].fmt() == "never"
    text = json_nulls({"reach": float("nan"), "runs": [1.0, float("inf")]})
    assert json.loads(text) == {"reach": None, "runs": [1.0, None]} and "NaN" not in text


def test_oracle_estimator_reads_the_world_and_beats_the_belief() -> None:
    from rollwise.sim.oracle import OracleEstimator

    w = World(SimParams(n_train=50, n_eval=10), 0, 4, 8)
    idx = np.arange(5)
    assert np.allclose(OracleEstimator(w).mean(idx), w.solve_rate(idx))
    spec = RunSpec("mopps", 0, steps=40, prompts_per_step=8, params=SimParams(n_train=256, n_eval=64),
                   planner={"selection_score": "expected"})
    belief, oracle = run_one(spec), run_one(replace(spec, planner={**spec.planner, "estimator": "oracle"}))
    assert oracle.effective / oracle.generated > belief.effective / belief.generated + 0.1


def test_partial_oracles_know_seen_prompts_only() -> None:
    from rollwise.planner.irt import IRTEstimator
    from rollwise.sim.oracle import make_oracle, split_oracle

    w = World(SimParams(n_train=20, n_eval=4, unsolvable=0.0), 0, 4, 8)
    idx = np.arange(4)
    now, visit = make_oracle("oracle_seen", w, IRTEstimator(20)), make_oracle("oracle_visit", w, IRTEstimator(20))
    belief = IRTEstimator(20).mean(idx)
    assert np.allclose(now.mean(idx), belief) and np.allclose(visit.mean(idx), belief)  # nothing seen yet
    for est in (now, visit):
        est.update(1, 3, 8)
        est.after_step()
    at_visit = w.solve_rate(np.array([1]))[0]
    w.theta += 1.0  # the policy improves after the visit
    assert now.mean(idx)[1] == pytest.approx(w.solve_rate(np.array([1]))[0])  # follows the policy
    assert visit.mean(idx)[1] == pytest.approx(at_visit) != pytest.approx(w.solve_rate(np.array([1]))[0])
    assert now.mean(idx)[0] == pytest.approx(now.belief.mean(idx)[0])  # unseen: the preset's own belief
    assert now.count(idx)[1] > 1e5 and now.count(idx)[0] == 0
    assert now.expect(idx, lambda p: p * 2, np.random.default_rng(0))[1] == pytest.approx(2 * now.mean(idx)[1])
    assert split_oracle({"estimator": "oracle_visit", "screen_size": 1}) == ({"screen_size": 1}, "oracle_visit")
    assert split_oracle({"estimator": "irt"}) == ({"estimator": "irt"}, None)
    with pytest.raises(ValueError, match="allowed: oracle, oracle_seen, oracle_visit"):
        make_oracle("oracle_future", w, IRTEstimator(20))


def test_partial_oracles_rank_between_belief_and_oracle() -> None:
    spec = RunSpec("adaptive", 0, steps=40, prompts_per_step=8, params=SimParams(n_train=256, n_eval=64))
    ratio = {}
    for kind in ("irt", "oracle_seen", "oracle"):
        r = run_one(replace(spec, planner={"estimator": kind}))
        ratio[kind] = r.effective / r.generated
    assert ratio["irt"] < ratio["oracle_seen"] < ratio["oracle"]


def test_effective_ratio_of_trained_samples() -> None:
    """The issue's definition (share of trained samples) next to ours (of generated): equal when
    every group is trained on, 1 for DAPO's filter, which drops the groups that teach nothing."""
    spec = RunSpec("uniform", 0, steps=10, prompts_per_step=8, params=SimParams(n_train=128, n_eval=32))
    uni, dapo = run_one(spec), run_one(replace(spec, strategy="dapo"))
    assert uni.trained == uni.generated
    assert dapo.trained < dapo.generated and dapo.effective == dapo.trained
    s = summarize({"uniform": [uni], "dapo": [dapo]}, "rollouts", None)
    assert s["dapo"]["effective_trained"].mean == 1.0
    assert s["uniform"]["effective_trained"].mean == pytest.approx(s["uniform"]["effective"].mean)


def test_parse_strategy() -> None:
    assert parse_strategy("mopps:candidate_factor=16:estimator=irt") == (
        "mopps", {"candidate_factor": 16, "estimator": "irt"})
    with pytest.raises(ValueError, match="allowed"):
        parse_strategy("nope")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_strategy("mopps:oops")
    with pytest.raises(ValueError, match="planner.estimator.*allowed"):
        parse_strategy("uniform:estimator=bogus")
    with pytest.raises(ValueError, match="unknown config key 'planner.candidate_factr'.*candidate_factor"):
        parse_strategy("mopps:candidate_factr=4")
    assert parse_strategy("adaptive:estimator=oracle") == ("adaptive", {"estimator": "oracle"})
    assert parse_strategy("adaptive:estimator=oracle_seen") == ("adaptive", {"estimator": "oracle_seen"})
    assert parse_strategy("adaptive:length_prior=true") == ("adaptive", {"length_prior": True})  # real-data benches


def test_simulate_command_end_to_end(tmp_path, capsys) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args([
        "simulate", "--strategies", "uniform", "mopps:candidate_factor=2", "--seeds", "2", "--steps", "5",
        "--prompts-per-step", "4", "--num-generations", "4", "--pool", "48", "--eval-size", "16",
        "--out", str(tmp_path), "--quiet",
    ])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "uniform" in out and "mopps:candidate_factor=2" in out and "effective ratio" in out
    # the default world discounts revisits as real training measured (preregistered, bench/RESULTS.md)
    assert args.revisit_decay == 0.85 and "revisit decay 0.85" in out
    assert (tmp_path / "curves.png").stat().st_size > 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert set(data["summary"]) == {"uniform", "mopps:candidate_factor=2"}
    assert [r["steps"] for r in data["runs"]["uniform"]] == [5, 5] and data["runs"]["uniform"][0]["rollouts"] == 5 * 16
    curve = data["runs"]["uniform"][0]["curve"]  # each run's curve, to replot or compare with real runs
    assert curve["rollouts"] == [16.0 * k for k in range(6)] and len(curve["accuracy"]) == len(curve["tokens"]) == 6
    assert "| strategy |" in (tmp_path / "table.md").read_text()
    assert "did not gain" not in capsys.readouterr().err
    still = parser.parse_args(["simulate", "--strategies", "uniform", "adaptive", "--seeds", "2", "--steps", "3", "--lr", "0",
                               "--pool", "48", "--eval-size", "16", "--out", str(tmp_path), "--quiet"])
    assert still.func(still) == 0
    assert "uniform gained less than 0.5 points of held-out accuracy on 2 of 2 seeds" in capsys.readouterr().err
    lone = parser.parse_args(["simulate", "--strategies", "uniform", "--seeds", "1", "--steps", "2",
                              "--polarise-law", "add", "--pool", "48", "--eval-size", "16", "--out", str(tmp_path)])
    assert lone.func(lone) == 2
    assert "give --polarise" in capsys.readouterr().err  # a law for a polarisation that is not there
    bad = parser.parse_args(["simulate", "--strategies", "mopps", "--seeds", "1", "--steps", "2", "--pool", "32",
                             "--eval-size", "8", "--out", str(tmp_path), "--quiet"])
    assert bad.func(bad) == 2  # no uniform and no --target
    tasked = parser.parse_args(["simulate", "--strategies", "uniform", "adaptive", "--seeds", "1", "--steps", "3",
                                "--prompts-per-step", "4", "--num-generations", "4", "--pool", "48",
                                "--eval-size", "16", "--tasks", "3", "--out", str(tmp_path), "--quiet"])
    assert tasked.func(tasked) == 0
    assert json.loads((tmp_path / "results.json").read_text())["params"]["tasks"] == 3
    wrong = parser.parse_args(["simulate", "--tasks", "3", "--task-sd", "9", "--out", str(tmp_path), "--quiet"])
    assert wrong.func(wrong) == 2
    assert "--task-sd in [0, --difficulty-sd) (got --tasks=3, --task-sd=9.0" in capsys.readouterr().err  # flags named
    lengths = parser.parse_args(["simulate", "--strategies", "uniform", "adaptive:length_prior=true", "--quiet"])
    assert lengths.func(lengths) == 2
    assert "--feature-r2" in capsys.readouterr().err
    featured = parser.parse_args(["simulate", "--strategies", "uniform", "adaptive:length_prior=true", "--seeds", "1",
                                  "--steps", "3", "--prompts-per-step", "4", "--pool", "48", "--eval-size", "16",
                                  "--feature-r2", "0.5", "--out", str(tmp_path), "--quiet"])
    assert featured.func(featured) == 0
    # arguments out of range, and planner fields the simulator sets itself: a message, not a traceback
    for bad_args, says in ((["--seeds", "0"], "--seeds must be >= 1"), (["--budget", "0"], "--budget must be >= 1"),
                           (["--unsolvable", "2"], "--unsolvable is a share"), (["--max-len", "0"], "--max-len"),
                           (["--strategies", "uniform:strategy=dapo"], "name before the first ':'"),
                           (["--strategies", "uniform:budget_tokens=900"], "budget_rollouts=N, not budget_tokens"),
                           (["--strategies", "uniform", "adaptive:budget_rollouts="], "has no value"),
                           (["--strategies", "uniform", "adaptive:budget_rollouts=8:budget_rollouts=16"], "given twice"),
                           (["--strategies", "uniform", "uniform:budget_rollouts=1000000"], "more than the run's total"),
                           (["--strategies", "uniform:budget_rollouts=128", "adaptive"], "a plain 'uniform' row"),
                           (["--strategies", "uniform", "adaptive", "adaptive"], "'adaptive' twice"),
                           (["--revisit-decay", "1.5"], "--revisit-decay is a factor in [0, 1]"),
                           (["--seed-offset", "-1"], "--seed-offset must be in [0, 2**32"),
                           (["--fit-steps", "3"], "give --fit RUN_DIR too"),
                           (["--lr", "nan"], "--lr must be a finite number"),
                           (["--drift", "inf"], "--drift must be a finite number")):
        a = parser.parse_args(["simulate", *bad_args, "--out", str(tmp_path), "--quiet"])
        assert a.func(a) == 2
        assert says in capsys.readouterr().err


def test_simulate_warns_of_steps_below_one_group_and_marks_cells_over_fewer_seeds(tmp_path, capsys) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args([
        "simulate", "--strategies", "uniform", "uniform:budget_rollouts=2", "adaptive:budget_rollouts=8", "--seeds", "1",
        "--steps", "4", "--prompts-per-step", "4", "--num-generations", "4", "--pool", "48", "--eval-size", "16",
        "--out", str(tmp_path),
    ])
    assert args.func(args) == 0
    out, err = capsys.readouterr()
    # uniform rolls out one prompt's whole group of 4, twice its step budget of 2; 8 is two groups
    assert "strategy 'uniform:budget_rollouts=2': its step budget of 2 rollouts is less than one group" in err
    assert "spent 4 rollouts a step on average" in err and "budget_rollouts=8:" not in err
    assert "1 seed," in out and "1 seeds" not in out
    common = parser.parse_args(["simulate", "--strategies", "uniform", "--budget", "2", "--seeds", "1", "--steps", "4",
                                "--prompts-per-step", "4", "--num-generations", "4", "--pool", "48", "--eval-size", "16",
                                "--out", str(tmp_path), "--quiet"])
    assert common.func(common) == 0  # the common budget below one group: one group is 4 rollouts, whatever --budget
    assert "strategy 'uniform': its step budget of 2 rollouts is less than one group (4 samples)" in capsys.readouterr().err
    from rollwise.sim.report import Stat, table_rows

    full, part = Stat(1.0, 0.5, 1.5, 3), Stat(1.0, 0.5, 1.5, 2)
    row = table_rows({"x": {key: part if key == "reach" else full for key in
                            ("reach", "reach_share", "latency_share", "final", "auc", "effective",
                             "effective_trained", "all_wrong")}}, seeds=3)[0]
    assert row[1].endswith(" *") and not row[2].endswith("*") and row[-1] == "2/3"


def test_report_panels_cover_the_planner_metrics() -> None:
    from rollwise.report import panels_of

    hist = [
        {"step": 0, "eval/accuracy": 0.2},
        {"step": 1, "rollout/reward_mean": 0.1, "rollout/tokens_total": 10.0, "planner/effective_ratio": 0.5,
         "planner/all_wrong_share": 0.5, "planner/all_correct_share": 0.0, "planner/samples_per_prompt": [2, 8, 8],
         "planner/task_share/gcd": 0.25, "planner/task_share/sum": 0.75, "planner/prompts_trained": 3.0,
         "planner/revisit_share": 0.5, "rollout/frac_zero_std_groups": 0.0},
        {"step": 2, "rollout/reward_mean": 0.2, "rollout/tokens_total": 20.0, "planner/samples_per_prompt": [16]},
    ]
    panels = {title: (kind, data) for title, kind, data in panels_of(hist)}
    assert panels["samples per prompt (every step)"] == ("hist", [2, 8, 8, 16])
    kind, data = panels["share of rollouts per task"]
    assert [label for label, _ in data] == ["gcd", "sum"] and data[1][1] == [(1, 0.75)]
    # the series count successes (reward >= planner.success_threshold), not correct answers; with partial credit no group need have equal rewards
    assert [label for label, _ in panels["groups with no success / all successes"][1]] == ["no success", "all successes"]
    assert panels["groups with equal rewards (rollout/frac_zero_std_groups)"] == ("line", [("", [(1, 0.0)])])
    assert "estimator's Brier score" not in panels  # no panel for a metric the run never logged
    assert panels["effective ratio"] == ("line", [("of rollouts generated", [(1, 0.5)])])
    hist[1].update({"planner/brier": 0.2, "planner/effective_ratio_trained": 0.6})
    both = {title: data for title, _, data in panels_of(hist)}
    assert both["estimator's Brier score"] == [("every prompt rolled out", [(1, 0.2)])]
    assert [label for label, _ in both["effective ratio"]] == ["of rollouts generated", "of samples trained"]
    assert panels["prompts trained with a gradient (cumulative)"] == ("line", [("", [(1, 3.0)])])
    assert panels["gradient groups on prompts trained before"] == ("line", [("", [(1, 0.5)])])
    assert not [p for p in panels if p.startswith("solve rate on prompts never rolled out before")]  # a run without rollout/groups
    assert panels["held-out accuracy"] == ("line", [("", [(0, 0.2)])])  # no best-so-far line before save_best
    assert "held-out answers cut at the length cap" not in panels  # runs from before eval/truncated_frac
    hist[0].update({"eval/response_len_mean": 30.0, "eval/truncated_frac": 0.25})
    cut = {title: data for title, _, data in panels_of(hist)}
    assert cut["held-out answer length (tokens)"] == [("", [(0, 30.0)])]
    assert cut["held-out answers cut at the length cap"] == [("", [(0, 0.25)])]
    hist[0].update({"eval/best_accuracy": 0.2})
    hist.append({"step": 2, "eval/accuracy": 0.1, "eval/best_accuracy": 0.2})
    best = {title: data for title, _, data in panels_of(hist)}["held-out accuracy"]
    assert best == [("accuracy", [(0, 0.2), (2, 0.1)]), ("best so far", [(0, 0.2), (2, 0.2)])]


def test_solve_rate_on_unseen_prompts_reads_first_samples_of_first_visits() -> None:
    from rollwise.report import unseen_solve_rate

    steps = [{"step": s, "rollout/groups": g} for s, g in [
        (1, [["a", "10"], ["b", "0111"]]),          # first samples: 1, 0
        (2, [["a", "00000000"], ["c", "1"]]),       # a is a revisit; c: 1
        (6, [["d", "01", [5, 7]], ["b", "1", [3]], ["e", "0", [9]]]),  # d: 0, e: 0 (a run that logs lengths)
    ]]
    assert unseen_solve_rate(steps) == [(5.0, 2 / 3), (6.0, 0.0)]
    assert unseen_solve_rate([{"step": 1}]) == []
    from rollwise.report import length_by_outcome

    assert length_by_outcome(steps) == ([(6, 7.0)], [(6, 5.0)])  # only d is mixed and has lengths
    mixed = [{"step": 1, "rollout/groups": [["a", "0110", [10, 4, 6, 20]], ["b", "11", [1, 1]]]}]
    assert length_by_outcome(mixed) == ([(1, 5.0)], [(1, 15.0)])


def test_simulate_names_flags_and_row_fields_that_change_nothing() -> None:
    """An audit found these accepted without a word, with identical tables."""
    from rollwise.sim.command import idle_settings, prepare

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="cmd"))

    def parsed(*argv):
        return parser.parse_args(["simulate", *argv])

    args = parsed("--strategies", "uniform", "uniform:seed=3", "uniform:estimator=irt", "adaptive:stratify=false",
                  "adaptive:success_threshold=0.9", "adaptive:length_ema=0.5", "--transfer", "0.2", "--task-sd", "0.3",
                  "--feature-r2", "0.5")
    rows = prepare(args)[0]
    got = idle_settings(args, rows)
    assert [line.split(" has no effect")[0] for line in got] == [
        "--transfer 0.2", "--task-sd 0.3", "--feature-r2 0.5", "strategy 'uniform:seed=3': seed",
        "strategy 'uniform:estimator=irt': estimator=irt", "strategy 'adaptive:stratify=false': stratify",
        "strategy 'adaptive:success_threshold=0.9': success_threshold", "strategy 'adaptive:length_ema=0.5': length_ema"]
    fine = parsed("--strategies", "uniform", "mopps:seed=3", "adaptive:stratify=false", "adaptive:length_prior=true",
                  "--tasks", "3", "--transfer", "0.2", "--feature-r2", "0.5")
    assert idle_settings(fine, prepare(fine)[0]) == []
    # --overlap changes only a row that asks for follow-ups group by group (ar3po, adaptive)
    rounds = parsed("--strategies", "uniform", "dapo", "knapsack", "--overlap")
    assert [line.split(" has no effect")[0] for line in idle_settings(rounds, prepare(rounds)[0])] == ["--overlap"]
    staged = parsed("--strategies", "uniform", "ar3po", "--overlap")
    assert idle_settings(staged, prepare(staged)[0]) == []
    with pytest.raises(ValueError, match="estimator=oracle replaces the estimator, so posterior_decay"):
        prepare(parsed("--strategies", "uniform", "adaptive:estimator=oracle:posterior_decay=0.5"))
    with pytest.raises(ValueError, match="--difficulty-sd 0 leaves none"):
        prepare(parsed("--strategies", "uniform", "adaptive:length_prior=true", "--feature-r2", "0.5",
                       "--difficulty-sd", "0"))
