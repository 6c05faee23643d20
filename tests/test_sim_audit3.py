"""Audit of `rollwise simulate`'s table: hand-computed statistics on tiny synthetic runs, equal budgets,
the effective ratio's counts, determinism across worker counts, and the PNG against the table."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rollwise.sim.report import curve, first_reach, mean_interval, plot_curves, summarize, table_rows
from rollwise.sim.runner import RunResult, RunSpec, run_many, run_one
from rollwise.sim.world import SimParams, World

SMALL = SimParams(n_train=64, n_eval=32)


def run(name: str, seed: int, spent: list[float], acc: list[float], total: float, eff: int = 5, gen: int = 10,
        trained: int = 10) -> RunResult:
    x = np.array(spent, dtype=float)
    return RunResult(name, seed, x, x, np.array(acc, dtype=float), eff, gen, 0.2, 0.1, 0, total,
                     latency=x.copy(), trained=trained)


def auc(r: RunResult, unit: str = "rollouts") -> float:
    return summarize({"uniform": [r]}, unit, None)["uniform"]["auc"].mean


def test_auc_is_the_exact_mean_accuracy_over_the_budget_hand_computed() -> None:
    # accuracy 0.0 until the first step ends at 50, then 1.0: over 0..100 the mean is exactly 0.5
    # (the 201-point grid's mean, which the table used before, gave 101/201 = 0.5025)
    half = run("uniform", 0, [0, 50, 100], [0.0, 1.0, 1.0], 100.0)
    assert auc(half) == pytest.approx(0.5, abs=1e-12)
    # a late step: 1.0 only over the last 1 of 100 (grid: 3/201 = 0.0149)
    late = run("uniform", 0, [0, 99, 100], [0.0, 1.0, 1.0], 100.0)
    assert auc(late) == pytest.approx(0.01, abs=1e-12)
    # the step that crosses the total (22) gives no credit: 0.1*10 + 0.2*10 + 0.3*2 over 22
    over = run("uniform", 0, [0, 10, 20, 25], [0.1, 0.2, 0.3, 0.4], 22.0)
    assert auc(over, "tokens") == pytest.approx((1.0 + 2.0 + 0.6) / 22, abs=1e-12)
    # a run that stopped short of the total keeps its last accuracy to the end, as its curve does
    short = run("uniform", 0, [0, 10], [0.2, 0.6], 40.0)
    assert auc(short) == pytest.approx((0.2 * 10 + 0.6 * 30) / 40)
    assert curve(short, "rollouts")[-1] == pytest.approx(0.6)
    # the same x range for every row: a row with bigger steps is integrated over the same 0..total
    big = run("dapo", 0, [0, 60, 120], [0.0, 1.0, 1.0], 100.0)
    s = summarize({"uniform": [half], "dapo": [big]}, "rollouts", None)
    assert s["dapo"]["auc"].mean == pytest.approx(0.4) and s["dapo"]["final"].mean == pytest.approx(1.0)


def test_the_interval_is_the_student_t_interval_of_the_mean_over_seeds_hand_computed() -> None:
    # it was a percentile bootstrap until 2026-12-07 night, which held the mean only 71-83% of the time over 3-5 seeds
    x = np.array([0.1, 0.2, 0.4, 0.7])
    s = mean_interval(x)
    half = 3.182446305 * np.std(x, ddof=1) / 2  # t(0.975, 3) * s / sqrt(4)
    assert s.mean == pytest.approx(0.35) and s.n == 4
    assert s.lo == pytest.approx(0.35 - half, abs=1e-8) and s.hi == pytest.approx(0.35 + half, abs=1e-8)
    assert mean_interval(x).lo == s.lo  # no random stream: the same table for the same runs
    assert mean_interval(np.full(5, 0.3)).lo == mean_interval(np.full(5, 0.3)).hi == pytest.approx(0.3)


def test_a_seed_that_never_reaches_the_target_is_counted_not_averaged_in() -> None:
    uni = [run("uniform", k, [0, 10, 20], [0.1, 0.2, 0.3], 20.0) for k in range(3)]
    # seeds 0 and 1 reach uniform's 0.3 after steps 1 and 2; seed 2 never does
    fast = [run("fast", 0, [0, 10, 20], [0.1, 0.3, 0.4], 20.0), run("fast", 1, [0, 10, 20], [0.1, 0.2, 0.3], 20.0),
            run("fast", 2, [0, 10, 20], [0.1, 0.2, 0.25], 20.0)]
    s = summarize({"uniform": uni, "fast": fast}, "rollouts", None)
    assert s["fast"]["reach"].n == 2 and s["fast"]["reach"].mean == pytest.approx(15.0)
    assert s["fast"]["reach_share"].mean == pytest.approx(0.75)
    assert s["uniform"]["reach_share"].mean == pytest.approx(1.0) and s["uniform"]["reach"].n == 3
    row = dict(zip(["strategy", "reach", "share"], table_rows(s, seeds=3)[1][:3]))
    assert row["reach"] == "0.0 (n=2) *" and row["share"] == "0.75 (n=2) *"  # marked as over fewer seeds
    assert table_rows(s, seeds=3)[1][-1] == "2/3"  # and how many reached
    assert s["fast"]["final"].n == 3  # final accuracy is over every seed
    # a target reached only by the step that crosses the total is never reached within the budget
    crossing = run("x", 0, [0, 10, 25], [0.1, 0.2, 0.9], 20.0)
    assert math.isnan(first_reach(crossing, "rollouts", 0.5))


def test_every_generated_rollout_is_charged_dapos_discards_included(monkeypatch) -> None:
    seen = {"rollouts": 0, "tokens": 0}
    generate = World.generate

    def counting(self, req):
        res = generate(self, req)
        seen["rollouts"] += len(res.rewards)
        seen["tokens"] += sum(res.lengths)
        return res

    monkeypatch.setattr(World, "generate", counting)
    for name in ("uniform", "dapo", "adaptive"):
        for unit in ("rollouts", "tokens"):
            seen.update(rollouts=0, tokens=0)
            r = run_one(RunSpec(name, 1, steps=6, prompts_per_step=4, num_generations=4, unit=unit, params=SMALL))
            assert (r.rollouts[-1], r.tokens[-1]) == (seen["rollouts"], seen["tokens"])
            spent = r.tokens if unit == "tokens" else r.rollouts
            assert spent[-1] >= r.budget_total > spent[-2]  # the same total, stopped at the step that crosses it
            if name == "dapo" and unit == "rollouts":
                assert r.trained < r.generated  # discarded groups are generated, charged, not trained


def test_effective_counts_are_the_planners_trained_groups_with_an_advantage(monkeypatch) -> None:
    """The table's ratios are sums over steps of the training loop's numerator (samples of trained groups
    with unequal rewards, or repaired by a replay) over its denominators (generated; trained)."""
    tally = {"eff": 0, "trained": 0}
    learn = World.learn

    def counting(self, groups, train, replay):
        for u in train:
            rewards = groups[u]
            tally["trained"] += len(rewards)
            if (len(rewards) > 1 and max(rewards) != min(rewards)) or u in replay:
                tally["eff"] += len(rewards)
        return learn(self, groups, train, replay)

    monkeypatch.setattr(World, "learn", counting)
    for name in ("uniform", "dapo", "adaptive"):
        tally.update(eff=0, trained=0)
        r = run_one(RunSpec(name, 2, steps=6, prompts_per_step=4, num_generations=4, params=SMALL))
        assert (r.effective, r.trained) == (tally["eff"], tally["trained"])
        assert r.generated == r.rollouts[-1]


def test_workers_give_the_numbers_of_one_process() -> None:
    base = RunSpec("uniform", 0, steps=4, prompts_per_step=4, num_generations=4, params=SMALL)
    one = run_many(base, ["uniform", "adaptive", "dapo"], [0, 1, 2], workers=1)
    two = run_many(base, ["uniform", "adaptive", "dapo"], [0, 1, 2], workers=2)
    for name in one:
        assert [r.seed for r in one[name]] == [r.seed for r in two[name]]
        for a, b in zip(one[name], two[name]):
            assert np.array_equal(a.accuracy, b.accuracy) and np.array_equal(a.tokens, b.tokens)
            assert (a.effective, a.generated, a.trained) == (b.effective, b.generated, b.trained)
    assert summarize(one, "rollouts", None)["adaptive"]["auc"] == summarize(two, "rollouts", None)["adaptive"]["auc"]


def test_the_png_draws_the_tables_curves(tmp_path, monkeypatch) -> None:
    import matplotlib.pyplot as plt

    figs = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: figs.append(fig))
    res = {"uniform": [run("uniform", k, [0, 10, 20], [0.1, 0.2, 0.3 + k / 10], 20.0) for k in range(2)],
           "fast": [run("fast", k, [0, 10, 20], [0.1, 0.4, 0.5 + k / 10], 20.0) for k in range(2)]}
    path = plot_curves(res, "rollouts", tmp_path / "curves.png", "t")
    assert path.stat().st_size > 0
    s = summarize(res, "rollouts", None)
    lines = {ln.get_label(): ln for ln in figs[0].axes[0].get_lines()}
    for name in res:
        y = lines[name].get_ydata()
        assert y[-1] == pytest.approx(s[name]["final"].mean) and y[0] == pytest.approx(0.1)
        assert np.mean(y) == pytest.approx(s[name]["auc"].mean, abs=0.005)  # the grid's mean, near the exact area
    close(figs[0])
