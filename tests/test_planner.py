"""Planner parts with hand-computed cases, and strategies end to end on scripted rewards."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from rollwise.config import PlannerConfig
from rollwise.planner import STRATEGIES, GroupResult, UniformPlanner, build_planner
from rollwise.planner.allocators import HardnessAllocator
from rollwise.planner.estimators import (
    BetaEstimator,
    LastVisitEstimator,
    RankEstimator,
    TwoScaleBetaEstimator,
    WindowEstimator,
)
from rollwise.planner.irt import IRTEstimator
from rollwise.planner.knapsack import informative_value, needed_samples, solve_mckp
from rollwise.planner.step import StepState

UIDS = [f"q{i}" for i in range(40)]


def make(strategy: str = "uniform", uids: list[str] = UIDS, pps: int = 4, n: int = 4, **kw) -> object:
    return build_planner(PlannerConfig(strategy=strategy, **kw), uids, pps, n, 64, 0)


def run_step(pl, reward_of, length: int = 10) -> tuple[list[list[tuple[str, int]]], object]:
    """One step; reward_of(uid, round, k) -> reward. Returns the requests per round and the outcome."""
    rounds, reqs, r = [], pl.begin_step(0), 0
    while reqs:
        rounds.append([(q.uid, q.n) for q in reqs])
        reqs = pl.observe([GroupResult(q.uid, [reward_of(q.uid, r, k) for k in range(q.n)], [length] * q.n)
                           for q in reqs])
        r += 1
    return rounds, pl.end_step()


def run_stream(pl, reward_of, length: int = 10, first: str | None = None,
               step_budget: int | None = None) -> tuple[list[tuple[str, int]], object]:
    """One step with groups observed one at a time, first requested first (rollout.overlap_rounds),
    except that `first`'s group finishes before all others; reward_of(uid, round of that group, k);
    `step_budget` replaces the step's budget once its prompts are chosen.
    Returns every request in order and the outcome."""
    pl.overlapped = True
    queue, asked, rounds = list(pl.begin_step(0)), [], {}
    if step_budget is not None:
        pl._st.budget = step_budget
    queue.sort(key=lambda q: q.uid != first)
    while queue:
        q = queue.pop(0)
        asked.append((q.uid, q.n))
        r = rounds[q.uid] = rounds.get(q.uid, -1) + 1
        more = pl.observe([GroupResult(q.uid, [reward_of(q.uid, r, k) for k in range(q.n)], [length] * q.n)])
        pending = {p.uid for p in queue}
        assert not pending & {m.uid for m in more}, "a follow-up for a group whose samples are still out"
        queue += more
    return asked, pl.end_step()


# ------------------------------------------------------------------ knapsack


def test_knapsack_matches_brute_force() -> None:
    rng = np.random.default_rng(0)
    for _ in range(60):
        m, k = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        values = [rng.random(k) for _ in range(m)]
        costs = [rng.integers(0, 6, k) for _ in range(m)]
        cap = int(rng.integers(sum(c.min() for c in costs), 15))
        best = max(sum(values[i][c] for i, c in enumerate(ch))
                   for ch in itertools.product(range(k), repeat=m)
                   if sum(costs[i][c] for i, c in enumerate(ch)) <= cap)
        chosen = solve_mckp(values, costs, cap)
        assert sum(costs[i][c] for i, c in enumerate(chosen)) <= cap
        assert sum(values[i][c] for i, c in enumerate(chosen)) == pytest.approx(best)


def test_knapsack_infeasible_and_values() -> None:
    with pytest.raises(ValueError):
        solve_mckp([np.ones(2)], [np.array([3, 4])], 2)
    # p = 1/2, n = 2: (1 - 1/4 - 1/4) * 1/2 * 1/4
    assert informative_value(np.array(0.5), 2) == pytest.approx(0.0625)
    assert informative_value(np.array(0.0), 8) == 0.0
    assert needed_samples(0.5, 128) == 4  # log 0.1 / log 0.5 = 3.32
    assert needed_samples(0.9, 128) == 22  # log 0.1 / log 0.9 = 21.85
    assert needed_samples(0.9, 16) == 16


def test_knapsack_allocator_respects_budget_and_bounds() -> None:
    rates = {u: (i % 5) / 4 for i, u in enumerate(UIDS)}  # 0, .25, .5, .75, 1
    pl = make("knapsack", pps=4, n=4, min_observations=4, max_samples_per_prompt=10)
    for u in UIDS:
        k = round(rates[u] * 4)
        pl.estimator.update(pl.index[u], k, 4)
    reqs = pl.begin_step(0)
    ns = {q.uid: q.n for q in reqs}
    assert sum(ns.values()) <= 16
    for u, n in ns.items():
        if rates[u] in (0.0, 1.0):
            assert n == 2  # extremes get the minimum ...
        assert 2 <= n <= 10
    assert len(ns) == 4


def test_knapsack_gives_a_mixed_prompt_the_minimum_plus_one_and_up_to_16n() -> None:
    """Knapsack RL: p = 0 or 1 prompts get min_n (2); a mixed prompt picks k in 1..(max_n - min_n) extra
    rollouts, so at least 3; max_n = 128 at n = 8."""
    pl = make("knapsack", uids=UIDS[:4], pps=4, n=4, min_observations=4, budget_rollouts=12)
    for u, k in zip(UIDS[:4], (1, 2, 3, 2)):  # p = 1/4, 1/2, 3/4, 1/2: all mixed
        pl.estimator.update(pl.index[u], k, 4)
    pl.allocator.cost_per_prompt = 3.0  # four prompts chosen
    assert [q.n for q in pl.begin_step(0)] == [3, 3, 3, 3]  # the DP alone would give p = 3/4 only 2
    assert make("knapsack", pps=4, n=8).allocator.max_n == 128


def test_per_prompt_bounds_hold_for_unseen_prompts_and_a_short_budget() -> None:
    """planner.min/max_samples_per_prompt bound every rolled-out prompt: an unseen prompt's n is
    clipped into them, and when the budget cannot give every mixed prompt the minimum the most
    valuable get it and the rest are not rolled out (1 sample each made groups that teach nothing)."""
    for strategy in ("knapsack", "e3"):
        ns = [q.n for q in make(strategy, pps=4, n=8, max_samples_per_prompt=4).begin_step(0)]
        assert ns and max(ns) <= 4, (strategy, ns)
    pl = make("knapsack", pps=4, n=4, min_observations=4, min_samples_per_prompt=3, budget_rollouts=7)
    for i, u in enumerate(UIDS):
        pl.estimator.update(pl.index[u], 1 + i % 3, 4)  # all mixed: p = 1/4, 2/4, 3/4
    pl.allocator.cost_per_prompt = 1.0  # a cost estimate far too low: the selector takes too many prompts
    ns = {q.uid: q.n for q in pl.begin_step(0)}
    assert set(ns.values()) == {3} and len(ns) == 2, ns  # 7 // 3 prompts at the minimum, within the budget
    # the value at 3 samples ranks p = 1/2 (0.094) over 1/4 (0.079) over 3/4 (0.026)
    assert all(pl.estimator.mean(np.array([pl.index[u]]))[0] <= 0.5 for u in ns)
    pl = make("e3", uids=["a", "b", "c", "d"], pps=4, n=8, budget_rollouts=12, min_samples_per_prompt=6)
    pl.allocator.cost_per_prompt = 3.0
    reqs = pl.begin_step(0)
    assert [q.n for q in reqs] == [8]  # E3's window starts at [n, n]: one prompt at its minimum, not 8 each over 12
    pl.observe([GroupResult(q.uid, [1.0] * q.n, [10] * q.n) for q in reqs])
    pl.end_step()
    assert pl.metrics()["planner/skipped_prompts"] == 3  # 4 selected, 1 rolled out
    # a budget below one minimum group still rolls one out: with none, a token budget's length estimate never
    # learns and every later step stays as short (an audit's e3 run rolled out nothing in 10 steps)
    for strategy in ("e3", "knapsack"):
        extra = {"min_observations": 1} if strategy == "knapsack" else {}  # knapsack: seen prompts are mixed
        pl = make(strategy, uids=["a", "b", "c", "d"], pps=4, n=8, budget_rollouts=5, **extra)
        for step in range(3):
            reqs = pl.begin_step(step)
            assert reqs and min(q.n for q in reqs) >= 2, (strategy, step, [q.n for q in reqs])
            pl.observe([GroupResult(q.uid, [float(k % 2) for k in range(q.n)], [10] * q.n) for q in reqs])
            pl.end_step()


# ------------------------------------------------------------------ estimators


def test_beta_posterior_with_decay() -> None:
    e = BetaEstimator(2, decay=0.5)
    e.update(0, 3, 4)  # alpha = .5*1 + .5 + 3 = 4, beta = .5*1 + .5 + 1 = 2
    assert (e.alpha[0], e.beta[0]) == (4.0, 2.0)
    e.update(0, 0, 2)  # alpha = 2 + .5 = 2.5, beta = 1 + .5 + 2 = 3.5
    assert (e.alpha[0], e.beta[0]) == (2.5, 3.5)
    assert e.mean(np.array([0, 1])) == pytest.approx([2.5 / 6, 0.5])
    assert e.count(np.array([0]))[0] == pytest.approx(4.0)
    nodecay = BetaEstimator(1, decay=1.0)
    nodecay.update(0, 3, 4)
    nodecay.update(0, 0, 2)
    assert (nodecay.alpha[0], nodecay.beta[0]) == (4.0, 4.0)


def test_two_scale_blends_fast_and_slow() -> None:
    e = TwoScaleBetaEstimator(1, fast=0.0, slow=1.0, fast_weight=0.5)
    e.update(0, 4, 4)
    e.update(0, 0, 4)  # fast forgets: (1 + 0, 1 + 4); slow keeps all: (5, 5)
    a, b = e.pseudo_counts(np.array([0]))
    assert (a[0], b[0]) == (3.0, 5.0)


def test_vade_options_reach_its_two_scale_estimator() -> None:
    # built from planner.vade_*: 4 of 4 right, then 0 of 4. Fast, decay 1/2: (1, 1) -> (5, 1) -> (3, 5);
    # slow, decay 1: (5, 5); blended at 1/4 fast: (0.75 + 3.75, 1.25 + 3.75) = (4.5, 5)
    pl = make("vade", vade_fast_decay=0.5, vade_slow_decay=1.0, vade_fast_weight=0.25)
    pl.estimator.update(0, 4, 4)
    pl.estimator.update(0, 0, 4)
    a, b = pl.estimator.pseudo_counts(np.array([0]))
    assert (a[0], b[0]) == (4.5, 5.0)


def test_a_resume_refits_the_window_to_a_changed_estimator_window() -> None:
    """planner.estimator_window changed at a resume: each prompt keeps its newest rewards (the resume used to
    stop with "cannot reshape")."""
    w = WindowEstimator(2, window=4)
    for successes in (1, 2, 0):  # slots 0-1: 0.5, then 2-3: 1.0, then 0-1 again: 0.0 (6 rewards written)
        w.update(0, successes, 2)
    w.update(1, 2, 2)
    assert w.mean(np.array([0, 1])) == pytest.approx([0.5, 1.0])
    narrow, wide = WindowEstimator(2, window=2), WindowEstimator(2, window=8)
    narrow.load_state_dict(w.state_dict())
    wide.load_state_dict(w.state_dict())
    assert narrow.mean(np.array([0, 1])) == pytest.approx([0.0, 1.0])  # the newest 2 of prompt 0 are failures
    assert wide.mean(np.array([0, 1])) == pytest.approx([0.5, 1.0]) and list(wide.count(np.array([0, 1]))) == [4, 2]
    wide.update(0, 2, 2)  # written after the 4 kept: (1 + 1 + 0 + 0 + 1 + 1) / 6
    assert wide.mean(np.array([0])) == pytest.approx([4 / 6])


def test_window_last_visit_and_rank() -> None:
    w = WindowEstimator(3, window=4)
    w.update(0, 2, 2)
    w.update(0, 0, 4)  # last 4 rewards are the 4 failures
    w.update(1, 1, 2)
    assert w.mean(np.array([0, 1, 2])) == pytest.approx([0.0, 0.5, 0.5])
    # a visit partly overwritten keeps its share: 8 of 16, then 0 of 4, in a window of 16 -> 12 x 0.5 + 4 x 0
    w16 = WindowEstimator(2, window=16)
    w16.update(0, 8, 16)
    w16.update(0, 0, 4)
    w16.update(1, 8, 16)
    w16.update(1, 4, 4)
    assert w16.mean(np.array([0, 1])) == pytest.approx([0.375, 0.625])
    lv = LastVisitEstimator(2, window=4)
    lv.update(0, 4, 4)
    lv.update(0, 1, 8)  # a full visit: its own mean
    lv.update(1, 2, 2)
    lv.update(1, 0, 2)  # short visit: topped up with the earlier one -> 2/4
    assert lv.mean(np.array([0, 1])) == pytest.approx([1 / 8, 0.5])
    r = RankEstimator(4, window=4)
    r.update(0, 4, 4)  # easiest
    r.update(1, 2, 4)
    r.update(2, 0, 4)  # hardest
    assert r.rank(np.array([0, 1, 2, 3])) == pytest.approx([0.0, 1 / 3, 2 / 3, 0.0])
    r.update(3, 0, 4)  # as hard as prompt 2: the two share positions 2 and 3 of 4
    assert r.rank(np.array([0, 1, 2, 3])) == pytest.approx([0.0, 1 / 4, 2.5 / 4, 2.5 / 4])


def test_e3_gives_prompts_of_equal_accuracy_equal_samples() -> None:
    """Ties in E3's ranks (all-wrong prompts are common) are not broken by dataset order."""
    uids = [f"p{i}" for i in range(8)]
    pl = make("e3", uids=uids, pps=8, n=8)
    for u in uids:
        pl.estimator.update(pl.index[u], 0, 8)
    pl.stream.epoch = 2  # window [4, 12]
    assert [q.n for q in pl.begin_step(0)] == [8] * 8


def test_irt_estimator_learns_level_and_hopeless_prompts() -> None:
    e = IRTEstimator(3)
    e.update(0, 4, 8)
    e.update(1, 0, 8)
    e.after_step()
    m0, m1 = e.mean(np.array([0, 1]))
    assert 0.3 < m0 < 0.7 and m1 < 0.2
    e.update(0, 8, 8)  # the revisited prompt did better: the level rises
    e.after_step()
    assert e.level > 0
    m0, m1, m2 = e.mean(np.array([0, 1, 2]))
    assert m1 < m2 < m0  # an unseen prompt looks like the pool


def test_irt_group_prior_makes_unseen_prompts_look_like_their_task() -> None:
    groups = ["gcd"] * 6 + ["sum"] * 6
    e = IRTEstimator(12, groups=groups)
    for i in range(5):
        e.update(i, 0, 8)  # gcd: hopeless so far
        e.update(6 + i, 4, 8)  # sum: mixed
    e.after_step()
    hard, mixed = e.mean(np.array([5, 11]))  # the two unseen prompts
    assert hard < 0.15 < 0.3 < mixed
    pooled = IRTEstimator(12)
    for i in range(5):
        pooled.update(i, 0, 8)
        pooled.update(6 + i, 4, 8)
    pooled.after_step()
    p5, p11 = pooled.mean(np.array([5, 11]))
    assert p5 == pytest.approx(p11) and hard < p5 < mixed
    e2 = IRTEstimator(12, groups=groups)
    e2.load_state_dict({**pooled.state_dict(), "prior": pooled.prior[0].tolist()})  # a 1-D prior (older state)
    assert e2.mean(np.array([5]))[0] == pytest.approx(p5)


def test_planner_group_prior_option_turns_the_task_prior_on_and_off() -> None:
    uids = [f"gcd:{i}" for i in range(6)] + [f"sum:{i}" for i in range(6)]
    means = {}
    for on in (True, False):
        pl = make("adaptive", uids=uids, group_prior=on)
        for i in range(5):
            pl.estimator.update(pl.index[f"gcd:{i}"], 0, 8)
            pl.estimator.update(pl.index[f"sum:{i}"], 4, 8)
        pl.estimator.after_step()
        means[on] = pl.estimator.mean(pl.indices(["gcd:5", "sum:5"]))  # the two unseen prompts
    assert means[True][0] < 0.15 < 0.3 < means[True][1]  # each looks like its task
    assert means[False][0] == pytest.approx(means[False][1])  # both look like the pool


def test_irt_length_prior_learns_that_longer_prompts_are_harder() -> None:
    # one task, 40 prompts of lengths 30..49; the 30 seen ones: solve rate falls with length
    lengths = np.arange(30, 70)[:40]
    e = IRTEstimator(40, covariate=lengths)
    flat = IRTEstimator(40)
    rng = np.random.default_rng(0)
    for _ in range(3):
        for i in range(0, 40, 4):  # every 4th prompt stays unseen: 1, 2, 3 of each 4 are seen
            for j in (1, 2, 3):
                q = 1 / (1 + np.exp(0.25 * (lengths[i + j] - 50)))
                c = int(rng.binomial(8, q))
                e.update(i + j, c, 8)
                flat.update(i + j, c, 8)
        e.after_step()
        flat.after_step()
    assert e.beta[0] < -0.5  # z is in within-task standard deviations: longer = lower offset
    short, long_ = e.mean(np.array([4, 36]))  # unseen, lengths 34 and 66
    f4, f36 = flat.mean(np.array([4, 36]))
    assert f4 == pytest.approx(f36)  # without the covariate both look like the pool
    assert short > f4 + 0.15 and long_ < f36 - 0.15
    # the covariate moves priors, not the evidence: a prompt seen many times keeps its own rate
    e.update(0, 40, 80)
    e.after_step()
    assert e.mean(np.array([0]))[0] == pytest.approx(0.5, abs=0.08)
    again = IRTEstimator(40, covariate=lengths)
    again.load_state_dict(json.loads(json.dumps(e.state_dict())))
    assert again.mean(np.arange(40)) == pytest.approx(e.mean(np.arange(40)))
    old = {k: v for k, v in e.state_dict().items() if k != "beta"}  # a state from before the covariate
    IRTEstimator(40, covariate=lengths).load_state_dict(old)
    with pytest.raises(ValueError, match="one value per prompt"):
        IRTEstimator(40, covariate=lengths[:5])


def test_irt_shift_moves_mass_along_the_grid_and_keeps_it() -> None:
    e = IRTEstimator(2, grid=5, span=2.0)  # finite cells at -2, -1, 0, 1, 2
    rows = np.array([[0.2, 0.0, 0.0, 0.8, 0.0, 0.0]])
    up = e._shift(rows, np.array([1.0]))  # the mass at 0 moves to 1
    assert up[0] == pytest.approx([0.2, 0.0, 0.0, 0.0, 0.8, 0.0])
    half = e._shift(rows, np.array([-0.5]))  # half way to -1: split between -1 and 0
    assert half[0] == pytest.approx([0.2, 0.0, 0.4, 0.4, 0.0, 0.0])


def test_length_prior_needs_prompt_lengths_and_the_irt_estimator() -> None:
    uids = [f"t:{i}" for i in range(12)]
    with pytest.raises(ValueError, match="needs each prompt's token length"):
        build_planner(PlannerConfig(strategy="adaptive", length_prior=True), uids, 4, 4, 64, 0)
    with pytest.raises(ValueError, match="length_prior=True is read only by planner.estimator=irt"):
        build_planner(PlannerConfig(strategy="mopps", length_prior=True), uids, 4, 4, 64, 0, list(range(12)))
    pl = build_planner(PlannerConfig(strategy="adaptive", length_prior=True), uids, 4, 4, 64, 0, list(range(12)))
    assert pl.estimator.uses_covariate and not make("adaptive").estimator.uses_covariate


# ------------------------------------------------------------------ selectors


def test_greso_skip_probabilities_and_adaptation() -> None:
    pl = make("greso")
    sel = pl.selector
    sel.z_easy[0], sel.z_hard[1], sel.z_hard[2] = 2, 3, 10
    assert sel.keep_probability(0) == pytest.approx(0.25)  # 0.5^2
    assert sel.keep_probability(1) == pytest.approx(0.125)  # 0.5^3
    assert sel.keep_probability(2) == pytest.approx(0.01)  # floor
    assert sel.keep_probability(3) == 1.0  # no history
    pl.stream.epoch = 1  # adaptation starts after epoch 0
    run_step(pl, lambda u, r, k: 1.0)  # every group all-correct
    assert sel.p_easy == pytest.approx(0.49) and sel.p_hard == pytest.approx(0.51)
    assert pl.metrics()["planner/all_correct_share"] == 1.0


def test_greso_options_set_its_probabilities_thresholds_and_steps() -> None:
    pl = make("greso", greso_explore_init=0.8, greso_explore_step=0.05, greso_explore_min=0.77, greso_explore_max=0.82,
              greso_hard_threshold=0.25, greso_easy_threshold=0.75, greso_zero_variance_target=0.9)
    sel = pl.selector
    sel.z_easy[0] = 2
    assert sel.keep_probability(0) == pytest.approx(0.64)  # 0.8^2
    pl.stream.epoch = 1
    _, out = run_step(pl, lambda u, r, k: float(k == 0))  # 1 of 4 right: hard at 0.25 (at the default 0.11, neither)
    assert all(sel.z_hard[pl.index[u]] == 1 for u in out.train)
    # all hard: 1 >= 0.9 x 2/3, p_hard 0.8 - 0.05 floored at 0.77; none easy: 0 < 0.9 / 3, p_easy 0.8 + 0.05
    # capped at 0.82
    assert sel.p_hard == pytest.approx(0.77) and sel.p_easy == pytest.approx(0.82)
    pl2 = make("greso", greso_easy_threshold=0.75)
    run_step(pl2, lambda u, r, k: float(k > 0))  # 3 of 4 right: easy at 0.75 (at the default 0.98, neither)
    assert int(pl2.selector.z_easy.sum()) == 4 and int(pl2.selector.z_hard.sum()) == 0


def test_greso_does_not_count_a_group_carried_to_the_next_step_as_all_wrong() -> None:
    """With partial rollouts, groups unfinished at the end of a step come back next step (adopt); in
    the step they started they have no result and must not count as hard prompts."""
    pl = make("greso")
    pl.stream.epoch = 1
    reqs = pl.begin_step(0)
    done, carried = reqs[: len(reqs) // 2], reqs[len(reqs) // 2:]
    pl.observe([GroupResult(q.uid, [1.0] * q.n, [5] * q.n) for q in done])
    pl.end_step()
    sel = pl.selector
    assert all(sel.z_hard[pl.index[q.uid]] == 0 and sel.z_easy[pl.index[q.uid]] == 0 for q in carried)
    assert all(sel.z_easy[pl.index[q.uid]] == 1 for q in done)
    # every group with a result was all-correct: easy share 1 (p_easy down), hard share 0 (p_hard up)
    assert sel.p_easy == pytest.approx(0.49) and sel.p_hard == pytest.approx(0.51)


def test_a_prompt_still_carried_from_an_earlier_step_is_not_requested_again() -> None:
    for strategy in ("uniform", "adaptive", "ar3po"):
        pl = make(strategy, pps=len(UIDS) - 2)
        pl.in_flight = {UIDS[0], UIDS[5]}  # partial rollouts still generating these two
        asked = {q.uid for q in pl.begin_step(0)}
        assert not asked & pl.in_flight and len(asked) == len(UIDS) - 2, (strategy, asked)


def test_a_carried_group_is_charged_once_and_not_counted_in_the_cost_per_prompt() -> None:
    # uniform, step 0: four full groups of 4; one does not come back (partial rollouts carry it)
    pl = make("uniform", uids=["a", "b", "c", "d", "e", "f", "g", "h"], pps=4, n=4, budget_rollouts=16)
    reqs = pl.begin_step(0)
    carried = reqs[1].uid
    pl.observe([GroupResult(q.uid, [float(k % 2) for k in range(q.n)], [10] * q.n) for q in reqs if q.uid != carried])
    pl.end_step()
    # step 1: it comes back; its samples were requested (and charged) in step 0, not again now
    pl.in_flight = {carried}
    reqs = pl.begin_step(1)
    assert sum(q.n for q in reqs) == 16 and carried not in {q.uid for q in reqs}
    pl.adopt([GroupResult(carried, [1.0, 0.0, 1.0, 0.0], [10] * 4)])
    assert pl._st.used_rollouts == 16
    pl.observe([GroupResult(q.uid, [float(k % 2) for k in range(q.n)], [10] * q.n) for q in reqs])
    pl.end_step()
    assert pl.metrics()["rollout/rollouts"] == 20.0  # delivered this step: its own 16 and the adopted 4
    # screen: a (probe 2, agrees), b (full 4, carried), c (probe 2, surprises: topped up by 2), d (probe 2).
    # The step requested 2 + 4 + 4 + 2 = 12 for 4 prompts: the cost per prompt moves from 4 toward 3,
    # not toward the 2 that b's empty group would make it
    sc = screen_variant(100)
    reqs = sc.begin_step(0)
    assert sorted((q.uid, q.n) for q in reqs) == [("a", 2), ("b", 4), ("c", 2), ("d", 2)]
    more = sc.observe([GroupResult(q.uid, [0.0] * q.n, [10] * q.n) for q in reqs if q.uid != "b"])
    assert [(q.uid, q.n) for q in more] == [("c", 2)]
    sc.observe([GroupResult(q.uid, [0.0] * q.n, [10] * q.n) for q in more])
    sc.end_step()
    assert sc.allocator.cost_per_prompt == pytest.approx(0.8 * 4 + 0.2 * 3)
    # an adopted probe's top-up is spent this step, but the probe was started in an earlier one: a
    # (believed hopeless) comes back [1, 0] and is topped up by 2; the step's rollouts, that top-up
    # included, are divided by the prompts it started (a is not one)
    sc = screen_variant(100)
    reqs = sc.begin_step(0)
    sc.observe([GroupResult(q.uid, [float(k % 2) for k in range(q.n)], [10] * q.n) for q in reqs if q.uid != "a"])
    sc.end_step()
    cost = sc.allocator.cost_per_prompt
    sc.in_flight = {"a"}
    reqs = sc.begin_step(1)
    sc.adopt([GroupResult("a", [1.0, 0.0], [10, 10])])
    more = sc.observe([GroupResult(q.uid, [0.0] * q.n, [10] * q.n) for q in reqs])
    assert ("a", 2) in [(q.uid, q.n) for q in more]
    spent = sum(q.n for q in reqs)
    while more:
        spent += sum(q.n for q in more)
        more = sc.observe([GroupResult(q.uid, [0.0] * q.n, [10] * q.n) for q in more])
    sc.end_step()
    assert sc.allocator.cost_per_prompt == pytest.approx(0.8 * cost + 0.2 * spent / len(reqs))


@pytest.mark.parametrize("followup", ["same_step", "next_step"])
@pytest.mark.parametrize("steps_out", [1, 2])
def test_a_carried_probe_keeps_its_belief_so_a_surprise_is_topped_up_when_it_comes_back(followup, steps_out) -> None:
    # a is believed hopeless: probed with 2; the probe does not come back in step 0 (nor in step 1)
    pl = screen_variant(100, screen_followup=followup)
    reqs = pl.begin_step(0)
    assert ("a", 2) in [(q.uid, q.n) for q in reqs]
    pl.observe([GroupResult(q.uid, [0.0] * q.n, [10] * q.n) for q in reqs if q.uid != "a"])
    pl.end_step()
    for step in range(1, steps_out):  # still out
        pl.in_flight = {"a"}
        more = pl.observe([GroupResult(q.uid, [0.0] * q.n, [10] * q.n) for q in pl.begin_step(step)])
        while more:
            more = pl.observe([GroupResult(q.uid, [0.0] * q.n, [10] * q.n) for q in more])
        pl.end_step()
    state = json.loads(json.dumps(pl.state_dict()))  # a checkpoint between the steps keeps it too
    for p in (pl, screen_variant(100, screen_followup=followup)):
        if p is not pl:
            p.load_state_dict(state)
        p.in_flight = {"a"}
        reqs = p.begin_step(steps_out)
        p.adopt([GroupResult("a", [1.0, 0.0], [10, 10])])  # a surprise: a correct answer
        more = p.observe([GroupResult(q.uid, [0.0] * q.n, [10] * q.n) for q in reqs])
        if followup == "same_step":
            assert ("a", 2) in [(q.uid, q.n) for q in more]  # topped up to a full group
            p.observe([GroupResult(q.uid, [0.0] * q.n, [10] * q.n) for q in more])
            p.end_step()
        else:
            assert more == []
            p.end_step()
            assert "a" in p.allocator.pending  # rolled out in full next step


def test_a_carried_group_is_scored_in_the_brier_score_against_the_prediction_of_the_step_it_started() -> None:
    pl = make("uniform", uids=["a", "b", "c", "d"], pps=4, n=4, estimator="beta")
    pl.estimator.update(pl.index["b"], 30, 40)  # b believed at 31/42
    reqs = pl.begin_step(0)
    pl.observe([GroupResult(q.uid, [0.0] * q.n, [10] * q.n) for q in reqs if q.uid != "b"])
    pl.end_step()
    pl.estimator.update(pl.index["b"], 0, 40)  # what step 0's other evidence might have moved: not b's prediction
    pl.in_flight = {"b"}
    reqs = pl.begin_step(1)
    pl.adopt([GroupResult("b", [1.0, 1.0, 1.0, 1.0], [10] * 4)])
    pl.observe([GroupResult(q.uid, [1.0] * q.n, [10] * q.n) for q in reqs])
    pl.end_step()
    m = pl.metrics()
    others = [q.uid for q in reqs]
    preds = {u: 1 / 6 for u in others}  # a, c, d: their step-0 all-wrong groups of 4 put them at 1/6
    errs = [(preds[u] - 1.0) ** 2 for u in others] + [(31 / 42 - 1.0) ** 2]
    assert m["planner/brier"] == pytest.approx(sum(errs) / len(errs))
    assert m["planner/brier_seen"] == pytest.approx(sum(errs) / len(errs))


def test_knapsack_under_a_token_budget_prices_each_prompts_samples_by_its_own_length() -> None:
    # four prompts believed at 0.25; a and b answer in 50 tokens, c and d in 1000. 8,400 tokens at a mean
    # length of 525 are 16 rollouts: in rollouts every prompt would get 4 (8,400 tokens' worth only at the
    # mean length: 4 x 2 x 50 + 4 x 2 x 1000 = 8,400), in tokens the short prompts' samples are cheap
    lengths = {"a": 50.0, "b": 50.0, "c": 1000.0, "d": 1000.0}
    for budget_tokens in (None, 8400):
        pl = make("knapsack", uids=list(lengths), pps=4, n=4, budget_tokens=budget_tokens,
                  **({} if budget_tokens else {"budget_rollouts": 16}))
        for u in lengths:
            pl.estimator.update(pl.index[u], 10, 40)
        pl.mean_length.update(lengths)
        pl.length_estimate = 525.0
        st = StepState(step=0, budget=16)
        out = dict(zip(lengths, pl.allocator.allocate(pl, list(lengths), 16, st)))
        if budget_tokens is None:
            assert sum(out.values()) <= 16 and out["a"] == out["c"], out  # every sample costs one rollout
        else:
            assert sum(out[u] * lengths[u] for u in out) <= 8400, out
            assert min(out["a"], out["b"]) > max(out["c"], out["d"]) and min(out["c"], out["d"]) >= 2, out


def test_knapsack_under_a_token_budget_does_not_fail_where_rounded_costs_just_miss() -> None:
    # five prompts at 0.25, each 1.09 mean lengths long: 11 rollouts hold their minimum groups (10.9) in
    # exact costs, but not in costs rounded up to 1/8 rollout (5 x 2.25 = 11.25): the check and the DP
    # must use the same numbers (the DP raised "cheapest options exceed the capacity")
    uids = [f"q{i}" for i in range(5)]
    pl = make("knapsack", uids=uids, pps=5, n=4, budget_tokens=1100)
    for u in uids:
        pl.estimator.update(pl.index[u], 10, 40)
        pl.mean_length[u] = 109.0
    pl.length_estimate = 100.0
    out = pl.allocator.allocate(pl, uids, 11, StepState(step=0, budget=11))
    assert sorted(out) == [0, 2, 2, 2, 2] and sum(n * 109 for n in out) <= 1100, out


def test_a_rollout_budget_below_one_group_is_said_once() -> None:
    pl = make("uniform", pps=2, n=8, budget_rollouts=4)
    notes = [run_step(pl, lambda u, r, k: 0.0)[1].notes for _ in range(2)]
    assert ["below one group of 8" in x for x in notes[0]] == [True] and notes[1] == []


def test_a_token_budget_below_one_group_is_said_once() -> None:
    pl = make("uniform", pps=2, n=4, budget_tokens=100)
    for step in range(3):
        reqs = pl.begin_step(step)
        pl.observe([GroupResult(q.uid, [float(k % 2) for k in range(q.n)], [50] * q.n) for q in reqs])
        notes = pl.end_step().notes
        # the first step only knows the guess (max_completion_length / 2); from the second on, 4 x 50 > 100
        assert [("below one group of 4" in x) for x in notes] == ([True] if step == 1 else []), (step, notes)


def test_greso_history_counts() -> None:
    pl = make("greso")
    _, out = run_step(pl, lambda u, r, k: 0.0)
    for u in out.train:
        assert pl.selector.z_hard[pl.index[u]] == 1 and pl.selector.z_easy[pl.index[u]] == 0


def test_stratify_options_override_the_preset() -> None:
    assert make("adaptive").selector.stratify and not make("adaptive", stratify=False).selector.stratify
    assert not make("mopps").selector.stratify and make("mopps", stratify=True).selector.stratify
    assert make("adaptive").allocator.cfg.stratify_rollouts is True
    assert make("adaptive", stratify_rollouts=False).allocator.cfg.stratify_rollouts is False


def test_posterior_selector_prefers_informative_prompts() -> None:
    pl = make("mopps", pps=4, candidate_factor=10)  # all 40 prompts are candidates
    for u in UIDS:
        pl.estimator.update(pl.index[u], 0 if u not in ("q3", "q7", "q11", "q19") else 10, 20)
    assert {q.uid for q in pl.begin_step(0)} == {"q3", "q7", "q11", "q19"}


def test_stratified_selection_keeps_the_mixture() -> None:
    from rollwise.planner.selectors import stratified_top

    cands = ["a:0", "a:1", "a:2", "a:3", "a:4", "a:5", "b:0", "b:1", "c:0", "c:1"]
    score = np.array([9, 8, 7, 6, 5, 4, 1, 0, 3, 2], dtype=float)
    rng = np.random.default_rng(0)
    # k=5 over shares 6:2:2 -> quotas 3, 1, 1 exactly; the best of each task
    assert sorted(stratified_top(cands, score, 5, rng).tolist()) == [0, 1, 2, 6, 8]
    # unstratified top-5 would take five prompts of task a
    assert sorted(np.argsort(-score)[:5].tolist()) == [0, 1, 2, 3, 4]
    # k=3: exact 1.8, .6, .6 -> floors 1, 0, 0, and two more to share: a's second prompt with
    # probability .8, b's and c's first with .6 each; always the best prompts of the task
    seen = [sorted(stratified_top(cands, score, 3, rng).tolist()) for _ in range(4000)]
    assert {tuple(x) for x in seen} == {(0, 1, 6), (0, 1, 8), (0, 6, 8)}
    assert np.mean([1 in x for x in seen]) == pytest.approx(0.8, abs=0.03)
    assert np.mean([6 in x for x in seen]) == pytest.approx(0.6, abs=0.03)


def test_apportion_gives_each_task_its_exact_share_on_average() -> None:
    from rollwise.planner.selectors import apportion

    rng = np.random.default_rng(1)
    # a pool of 64 prompts scored whole every step: 13, 13, 13, 13 and 12 candidates, 8 picks.
    # Largest remainders gave the 12-candidate task 1 prompt every step (12.5%) and three of the
    # others 2 by name; its share is 8 * 12 / 64 = 1.5 prompts
    exact = np.array([13, 13, 13, 13, 12]) * 8 / 64
    quotas = np.array([apportion(exact, rng) for _ in range(8000)])
    assert (quotas.sum(axis=1) == 8).all()
    assert set(np.unique(quotas)) == {1, 2}  # floor or one more
    assert quotas.mean(axis=0) == pytest.approx(exact, abs=0.03)
    assert apportion(np.array([3.0, 1.0, 1.0]), rng).tolist() == [3, 1, 1]  # whole shares: no draw


def test_adaptive_stratifies_by_task_and_mopps_does_not() -> None:
    uids = [f"easy:train:{i}" for i in range(20)] + [f"hard:train:{i}" for i in range(20)]
    for strategy, expect_hard in (("adaptive", 2), ("mopps", 0)):
        pl = make(strategy, uids=uids, pps=4, n=8, selection_score="expected", candidate_factor=10,
                  estimator="irt")
        for i in range(20):
            pl.estimator.update(pl.index[f"easy:train:{i}"], 4, 8)  # every easy prompt looks ideal
            pl.estimator.update(pl.index[f"hard:train:{i}"], 0, 8)
        pl.estimator.after_step()
        reqs = pl.begin_step(0)
        picked = [q.uid for q in reqs]
        assert sum(u.startswith("hard") for u in picked) == expect_hard, (strategy, picked)
        pl.observe([GroupResult(q.uid, [1.0] * q.n, [5] * q.n) for q in reqs])
        pl.end_step()
        shares = pl.metrics()
        hard_rollouts = sum(q.n for q in reqs if q.uid.startswith("hard"))
        assert shares.get("planner/task_share/hard", 0.0) == pytest.approx(hard_rollouts / sum(q.n for q in reqs))
        assert shares["planner/task_share/easy"] == pytest.approx(1 - hard_rollouts / sum(q.n for q in reqs))


def test_dapo_backfill_accounting_and_limit_note() -> None:
    informative = {"q1", "q2"}
    pl = make("dapo", pps=3, n=4, dapo_max_rounds=2)
    rounds, out = run_step(pl, lambda u, r, k: float(u in informative and k == 0))
    assert len(rounds) == 2 and all(n == 4 for rr in rounds for _, n in rr)
    generated = sum(len(rr) for rr in rounds) * 4
    got = [u for rr in rounds for u, _ in rr if u in informative]
    assert out.train == got
    assert out.discarded_rollouts == generated - 4 * len(got)
    assert out.discarded_tokens == out.discarded_rollouts * 10
    assert len(out.notes) == 1 and "dapo_max_rounds=2" in out.notes[0]
    m = pl.metrics()
    assert m["rollout/rollouts"] == generated and m["rollout/discarded_rollouts"] == out.discarded_rollouts


def test_dapo_stops_when_full_and_drops_extras() -> None:
    pl = make("dapo", pps=2, n=2, dapo_oversample=2.0)
    rounds, out = run_step(pl, lambda u, r, k: float(k == 0))  # every group informative
    assert len(rounds) == 1 and len(rounds[0]) == 4
    assert len(out.train) == 2 and out.discarded_rollouts == 4 and not out.notes


# ------------------------------------------------------------------ allocators


def test_staged_early_exit() -> None:
    pl = make("ar3po", uids=["a", "b", "c"], pps=3, n=4, ar3po_stages=3, ar3po_stage_size=2,
              budget_rollouts=100)
    first_correct = {"a": 0, "b": 1, "c": 99}  # a: solved at stage 1, b at stage 2, c never
    rounds, out = run_step(pl, lambda u, r, k: float(r >= first_correct[u]))
    assert [sorted(rr) for rr in rounds] == [[("a", 2), ("b", 2), ("c", 2)], [("b", 2), ("c", 2)], [("c", 2)]]
    assert sorted(out.train) == ["a", "b", "c"]
    assert pl.metrics()["planner/samples_per_prompt"] == [2, 4, 6]


def test_staged_while_informative_grows_only_mixed_groups() -> None:
    # staged_rule=while_informative: a group goes on while it holds both a right and a wrong answer
    pl = make("ar3po", uids=["a", "b", "c"], pps=3, n=4, ar3po_stages=3, ar3po_stage_size=2,
              budget_rollouts=100, staged_rule="while_informative")
    rounds, out = run_step(pl, lambda u, r, k: {"a": 1.0, "b": float(k % 2), "c": 0.0}[u])
    # a (all right) and c (all wrong) stop after stage 1; b (mixed) runs all 3 stages
    assert [sorted(rr) for rr in rounds] == [[("a", 2), ("b", 2), ("c", 2)], [("b", 2)], [("b", 2)]]
    assert pl.metrics()["planner/samples_per_prompt"] == [2, 2, 6]


def test_staged_respects_budget() -> None:
    pl = make("ar3po", uids=["a", "b", "c"], pps=3, n=4, ar3po_stages=4, ar3po_stage_size=2, budget_rollouts=10)
    rounds, _ = run_step(pl, lambda u, r, k: 0.0)
    assert sum(n for rr in rounds for _, n in rr) <= 10


def screen_planner(budget: int, **kw) -> object:
    pl = make("uniform", uids=["a", "b", "c", "d"], pps=4, n=4, estimator="beta", allocator="screen",
              budget_rollouts=budget, **kw)
    for uid, s in (("a", 0), ("b", 20), ("c", 40)):  # believed hopeless, mixed, solved; d unseen
        pl.estimator.update(pl.index[uid], s, 40)
    return pl


def test_screen_probes_confident_extremes_and_grows_informative_groups() -> None:
    # a: believed hard, its probe finds a correct answer (surprise) -> topped up to 4, then
    #    grows by 2 while mixed, up to 2n = 8; b: believed mixed -> full 4, grows to 8;
    # c: believed solved, probe all correct (agrees) -> stops at 2;
    # d: unseen, Beta(1,1) gives P(4 equal) = 0.4 >= 0.3 -> probe; all wrong -> stops at 2
    def reward(u: str, r: int, k: int) -> float:
        return {"a": float(r == 0 and k == 0), "b": float(k % 2), "c": 1.0, "d": 0.0}[u]

    rounds, out = run_step(screen_planner(100), reward)
    assert [sorted(rr) for rr in rounds] == [
        [("a", 2), ("b", 4), ("c", 2), ("d", 2)], [("a", 2), ("b", 2)], [("a", 2), ("b", 2)], [("a", 2)]]
    assert sorted(out.train) == ["a", "b", "c", "d"]


def test_screen_threshold_decides_which_beliefs_get_a_probe() -> None:
    # d is unseen: Beta(1, 1) gives P(4 equal) = 0.4, a probe at the default 0.3, a full group at 0.5;
    # a and c, believed hopeless and solved (P(4 equal) near 0.9), are probed at either threshold
    for threshold, d in ((0.3, 2), (0.5, 4)):
        pl = screen_planner(100, screen_threshold=threshold)
        assert sorted((q.uid, q.n) for q in pl.begin_step(0)) == [("a", 2), ("b", 4), ("c", 2), ("d", d)]


def test_screen_stops_agreeing_probes_and_keeps_the_budget() -> None:
    rounds, _ = run_step(screen_planner(12), lambda u, r, k: {"a": 1.0, "b": float(k % 2), "c": 1.0, "d": 0.0}[u])
    assert sum(n for rr in rounds for _, n in rr) <= 12
    # a's probe is all correct on a prompt believed hopeless (a surprise): topped up
    assert ("a", 2) in rounds[1]
    assert all(u != "c" and u != "d" for rr in rounds[1:] for u, _ in rr)


def test_a_probe_whose_rewards_differ_without_a_success_is_topped_up() -> None:
    # a (believed hopeless) answers 0 and 0.2: no success, but a gradient (a continuous reward's only signal)
    rounds, _ = run_step(screen_planner(100), lambda u, r, k: {"a": 0.2 * k, "b": float(k % 2), "c": 1.0, "d": 0.0}[u])
    assert ("a", 2) in rounds[1], rounds


def test_top_ups_the_budget_refused_count_in_the_cost_that_sizes_the_next_step() -> None:
    """After a run of agreeing probes the cost per prompt falls to the probe's size; a step then starts so many
    prompts that their probes take the whole budget. Counting only what was requested kept the cost there, step
    after step, and surprising probes were trained as 2-sample groups."""
    uids = [f"p{i}" for i in range(400)]
    pl = make("uniform", uids=uids, pps=8, n=8, estimator="beta", allocator="screen", budget_rollouts=64)
    for u in uids:
        pl.estimator.update(pl.index[u], 0, 16)  # believed hopeless: every prompt gets a probe of 2
    pl.allocator.cost_per_prompt = 2.2
    topped, refused = [], []
    for _ in range(4):  # now each probe finds a correct answer: every one is a surprise
        rounds, _ = run_step(pl, lambda u, r, k: float(k == 0))
        topped.append(len(rounds[1]) if len(rounds) > 1 else 0)
        m = pl.metrics()
        refused.append((m["planner/refused_topups"], m["planner/refused_rollouts"]))
        # every probe surprised: each one not topped up is a refused top-up of 8 - 2 rollouts
        assert refused[-1] == (len(rounds[0]) - topped[-1], 6.0 * (len(rounds[0]) - topped[-1])), (rounds, refused)
    assert refused[0][0] >= 20 and refused[-1][0] < refused[0][0], refused  # the next steps start fewer prompts
    assert len(pl.begin_step(4)) <= 16  # the selector now plans for full groups (was 29 probes of 2, step after step)
    assert topped[0] == 1 and topped[-1] >= 3, topped


def test_screen_stratify_rollouts_caps_each_tasks_growth_at_its_share() -> None:
    # two prompts of task x (mixed groups) and two of task y (all wrong), budget 32, growth by 2
    # up to 16 per prompt. Uncapped, x's groups grow until the budget is gone: x takes 24 of
    # the 32 rollouts. Capped, x stops at its share of the selected prompts (2 of 4 -> 16).
    uids = ["x:1", "x:2", "y:1", "y:2"]

    def per_task(cap: bool) -> dict[str, int]:
        pl = make("uniform", uids=uids, pps=4, n=4, estimator="beta", allocator="screen", budget_rollouts=32,
                  max_samples_per_prompt=16, stratify_rollouts=cap)
        for u in uids:
            pl.estimator.update(pl.index[u], 20, 40)  # believed mixed: full groups, no probes
        rounds, out = run_step(pl, lambda u, r, k: float(u.startswith("x") and k % 2 == 1))
        assert sorted(rounds[0]) == [(u, 4) for u in uids] and sorted(out.train) == uids
        used = {"x": 0, "y": 0}
        for rr in rounds:
            for u, n in rr:
                used[u[0]] += n
        assert pl.metrics().get("planner/growth_capped", 0.0) == (4.0 if cap else 0.0)  # x's next 2 + 2
        return used

    assert per_task(False) == {"x": 24, "y": 8}
    assert per_task(True) == {"x": 16, "y": 8}


def test_adaptive_caps_growth_by_task_unless_told_not_to() -> None:
    assert make("adaptive").cfg.stratify_rollouts is True
    assert make("adaptive", stratify_rollouts=False).cfg.stratify_rollouts is False
    assert make("mopps", allocator="screen").cfg.stratify_rollouts is False


def test_dars_schedules_worked_values() -> None:
    et = HardnessAllocator(PlannerConfig(dars_schedule="et"), 8)
    hw = HardnessAllocator(PlannerConfig(dars_schedule="hw"), 8)
    # Delta-n = ceil((goal - k s) / s), s = 2a(1-a), a = max(successes / k, 0.5 / k), peak k / 2;
    # et: goal = peak; hw: goal = 2 (1 - a) peak; capped at max_samples_per_prompt - k (4n et, 8n hw)
    # 0 of 8: a = 1/16, s = 0.1171875, k s = 0.9375: et (4 - 0.9375) / s = 26.13 -> 27, capped at 32 - 8 = 24;
    # hw goal 7.5: (7.5 - 0.9375) / s = 56, which is also its cap 64 - 8
    assert (et.extra(0, 8), hw.extra(0, 8)) == (24, 56)
    assert HardnessAllocator(PlannerConfig(dars_schedule="et", max_samples_per_prompt=64), 8).extra(0, 8) == 27
    # 1 of 8: a = 1/8, s = 0.21875, k s = 1.75: et (4 - 1.75) / s = 10.29 -> 11; hw goal 7: 5.25 / s = 24
    assert (et.extra(1, 8), hw.extra(1, 8)) == (11, 24)
    # 0 of 4: a = 1/8 (the floor 0.5 / k), k s = 0.875, peak 2: et 1.125 / s = 5.14 -> 6; hw goal 3.5: 2.625 / s = 12
    assert (et.extra(0, 4), hw.extra(0, 4)) == (6, 12)
    assert et.extra(4, 8) == 0 and hw.extra(6, 8) == 0  # solve rate 1/2 or more: nothing extra


def test_rank_allocation_hand_computed() -> None:
    def plan(epoch):
        pl = make("e3", uids=["a", "b", "c", "d"], pps=4, n=8)
        for u, s in zip("abcd", (8, 6, 4, 2)):  # ranks 0, 1/4, 2/4, 3/4
            pl.estimator.update(pl.index[u], s, 8)
        pl.stream.epoch = epoch
        return pl, {q.uid: q.n for q in pl.begin_step(0)}

    # E3's window: [8, 8] in epoch 0, widening by 2 a side each epoch to [4, 12]
    assert plan(0)[1] == dict.fromkeys("abcd", 8)
    # epoch 1: n_min 6, n_max 10, spare 32 - 24 = 8: 6 + floor(8 * r / 1.5) = 6, 7, 8, 10; remainder 1 -> c
    assert plan(1)[1] == {"a": 6, "b": 7, "c": 9, "d": 10}
    # epoch 2 on: n_min 4, n_max 12, spare 16: 4 + floor(16 * r / 1.5) = 4, 6, 9, 12; remainder 1 -> c
    pl, ns = plan(2)
    assert ns == {"a": 4, "b": 6, "c": 10, "d": 12} and sum(ns.values()) == 32
    # ranks are those of the epoch's start: results later in the epoch do not move them (and resume with them)
    ranks = pl.allocator.ranks.tolist()
    pl.observe([GroupResult(u, [1.0] * n, [5] * n) for u, n in ns.items()])
    pl.end_step()
    assert pl.allocator.ranks.tolist() == ranks
    again = make("e3", uids=["a", "b", "c", "d"], pps=4, n=8)
    again.load_state_dict(pl.state_dict())
    assert again.allocator.ranks.tolist() == ranks and again.allocator.rank_epoch == 2


# ------------------------------------------------------------------ repair, metrics, budgets


def test_replay_only_for_all_wrong_groups_with_a_past_correct() -> None:
    pl = make("ar3po", uids=["a", "b"], pps=2, n=2, ar3po_stages=1, ar3po_stage_size=2)
    _, out = run_step(pl, lambda u, r, k: float(u == "a" and k == 0))
    assert out.replay == []
    _, out = run_step(pl, lambda u, r, k: 0.0)
    assert out.replay == ["a"]
    assert pl.metrics()["planner/replayed"] == 1.0


def test_metrics_effective_ratio_and_brier() -> None:
    pl = make("uniform", uids=["a", "b"], pps=2, n=4)
    run_step(pl, lambda u, r, k: float(u == "a"))  # a all-correct, b all-wrong
    run_step(pl, lambda u, r, k: float(u == "a" and k < 2))  # a 2/4, b 0/4
    m = pl.metrics()
    assert m["planner/effective_ratio"] == 0.5 and m["planner/all_wrong_share"] == 0.5
    # window means before the step: a = 1, b = 0; observed .5 and 0
    assert m["planner/brier"] == m["planner/brier_seen"] == pytest.approx((0.25 + 0.0) / 2)
    assert m["rollout/rollouts"] == 8 and m["rollout/tokens"] == 80
    assert m["planner/samples_per_prompt"] == [4, 4] and m["planner/samples_per_prompt_mean"] == 4


def test_brier_scores_unseen_prompts_by_their_prior() -> None:
    """The default job visits each prompt about once: a Brier score over revisited prompts alone was
    never logged there. Unseen prompts are predicted by the estimator's prior mean (0.5 for a window)."""
    pl = make("uniform", uids=["a", "b", "c"], pps=2, n=4)
    run_step(pl, lambda u, r, k: float(u == "a"))  # first visits: a 4/4 (0.5 vs 1), b 0/4 (0.5 vs 0)
    m = pl.metrics()
    assert m["planner/brier"] == pytest.approx(0.25) and "planner/brier_seen" not in m
    assert m["planner/prediction_bias"] == pytest.approx(((0.5 - 1) + (0.5 - 0)) / 2)
    run_step(pl, lambda u, r, k: float(k < 2))  # c unseen (0.5 vs 0.5) and a seen (1 vs 0.5), or b
    m = pl.metrics()
    assert m["planner/brier"] == pytest.approx((0.0 + 0.25) / 2) and m["planner/brier_seen"] == pytest.approx(0.25)
    assert abs(m["planner/prediction_bias"]) == pytest.approx(0.25)  # c: 0, the seen one: +-0.5


def test_token_budget_converts_and_carries() -> None:
    pl = make("uniform", pps=4, n=4, budget_tokens=320)  # length estimate starts at 64 / 2 = 32
    assert pl.step_budget() == 10
    rounds, _ = run_step(pl, lambda u, r, k: 0.0, length=40)
    assert sum(n for rr in rounds for _, n in rr) == 8  # 10 rollouts -> 2 prompts of 4
    assert pl.token_carry == pytest.approx(0.0)  # spent 320 = budget
    assert pl.length_estimate == pytest.approx(40)  # the first step's mean replaces the guess
    run_step(pl, lambda u, r, k: 0.0, length=20)
    assert pl.length_estimate == pytest.approx((40 + 20) / 2)  # a plain mean until it weighs less than length_ema
    for _ in range(20):
        run_step(pl, lambda u, r, k: 0.0, length=20)
    assert pl.length_estimate == pytest.approx(20, abs=1)  # then the EMA: weight 0.1


def test_a_token_budget_holds_over_the_run_when_the_first_guess_is_far_off() -> None:
    """The guess before any response is max_completion_length / 2; with 4096 and responses of 200
    tokens a slow EMA from it kept each step's rollouts low for tens of steps, and the carry (at most
    one budget) could not make up the difference: 30 steps spent 63% of their tokens."""
    pl = build_planner(PlannerConfig(strategy="uniform", budget_tokens=12_800), [f"u{i}" for i in range(4000)],
                       16, 8, 4096, 0)
    spent = 0
    for _ in range(30):
        rounds, _ = run_step(pl, lambda u, r, k: 0.0, length=200)
        spent += 200 * sum(n for rr in rounds for _, n in rr)
    assert spent >= 0.95 * 30 * 12_800, spent / (30 * 12_800)


def test_uniform_matches_the_original_planner() -> None:
    new, old = make("uniform", pps=5, n=3), UniformPlanner(UIDS, 5, 3, 0)
    for step in range(10):
        assert [(q.uid, q.n) for q in new.begin_step(step)] == [(q.uid, q.n) for q in old.begin_step(step)]
        new.observe([])
        assert new.end_step().train == old.end_step().train


def test_unknown_parts_fail_clearly() -> None:
    with pytest.raises(RuntimeError, match="begin_step"):
        make("uniform").observe([GroupResult("nope", [1.0], [1])])
    with pytest.raises(ValueError, match="allowed"):
        build_planner(PlannerConfig.model_construct(strategy="nope"), UIDS, 4, 4, 64, 0)
    pl = make("uniform")
    pl.begin_step(0)
    with pytest.raises(ValueError, match="did not request"):
        pl.observe([GroupResult("nope", [1.0], [1])])


@pytest.mark.parametrize("budget_tokens", [None, 150])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_state_round_trip_continues_identically(strategy: str, budget_tokens: int | None) -> None:
    rates = {u: (i * 7 % 11) / 10 for i, u in enumerate(UIDS)}

    def reward(step: int):
        rng = np.random.default_rng(step)
        draws = {u: rng.random(64) for u in UIDS}
        return lambda u, r, k: float(draws[u][(8 * r + k) % 64] < rates[u])

    def steps(pl, start: int, count: int) -> list:
        trace = []
        for s in range(start, start + count):
            rounds, out = run_step(pl, reward(s))
            trace.append((rounds, out.train, out.replay))
        return trace

    a = make(strategy, pps=4, n=4, budget_tokens=budget_tokens)
    steps(a, 0, 6)
    state = json.loads(json.dumps(a.state_dict()))
    b = make(strategy, pps=4, n=4, budget_tokens=budget_tokens)
    b.load_state_dict(state)
    assert steps(a, 6, 6) == steps(b, 6, 6)
    assert (a.token_carry, a.length_estimate, a.length_steps) == (b.token_carry, b.length_estimate, b.length_steps)
    with pytest.raises(ValueError, match="strategy"):
        make("uniform" if strategy != "uniform" else "dapo").load_state_dict(state)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_accepts_a_token_budget(strategy: str) -> None:
    pl = make(strategy, pps=4, n=4, budget_tokens=500)
    budgets = []
    for _ in range(4):
        budgets.append(pl.step_budget())
        rounds, out = run_step(pl, lambda u, r, k: float(k % 2), length=20)
        # every group is mixed here, so even DAPO has nothing to back-fill: no step spends over its budget
        assert 0 < sum(n for rr in rounds for _, n in rr) <= budgets[-1] and out.train
    # the rollouts follow the tokens: 16 at the first guess of 32 tokens a response (500 / 32), then
    # about 500 / 20 = 25 or more (the carry of what earlier steps left) once responses are seen to be 20 long
    assert budgets[0] == 16 and pl.step_budget() >= 25


# ------------------------------------------------------------------ overlapped (streamed) rounds
def test_which_planners_decide_group_by_group() -> None:
    streams = {name: make(name).streams for name in STRATEGIES}
    assert not streams["dapo"] and not streams["dars"]  # they decide from a whole round
    assert all(v for k, v in streams.items() if k not in ("dapo", "dars"))
    assert UniformPlanner(UIDS, 2, 4, 0).streams
    follow = {name for name in STRATEGIES if make(name).follows_up}
    assert follow == {"adaptive", "ar3po", "dapo", "dars"}  # the others never ask for more in a step


def test_round_by_round_top_ups_come_before_growth() -> None:
    # round 1: b (full group, mixed) and a's probe (surprising) both finish; the 2 rollouts left
    # go to a's top-up, not to b's growth, though b comes first in the step's groups
    pl = screen_planner(12)
    reqs = pl.begin_step(0)
    pl._st.budget = 10
    assert [(q.uid, q.n) for q in reqs] == [("c", 2), ("a", 2), ("b", 4)]
    pl._st.groups = {u: pl._st.groups[u] for u in ("b", "a", "c")}  # b ahead of a
    order = {"b": [0.0, 1.0, 0.0, 1.0], "a": [1.0, 0.0], "c": [1.0, 1.0]}
    more = pl.observe([GroupResult(u, order[u], [10] * len(order[u])) for u in ("b", "a", "c")])
    assert [(q.uid, q.n) for q in more] == [("a", 2)]


def test_max_rounds_caps_a_step_round_by_round() -> None:
    from rollwise.planner.core import MAX_ROUNDS

    pl = make("dapo", uids=[f"u{i}" for i in range(2000)], pps=1, n=2, dapo_max_rounds=10_000, dapo_oversample=1.0)
    rounds, _ = run_step(pl, lambda u, r, k: 0.0)  # nothing is ever informative: back-fill forever
    assert len(rounds) == MAX_ROUNDS


def test_streamed_screen_and_staged_allocate_like_round_by_round() -> None:
    def screen_reward(u: str, r: int, k: int) -> float:
        return {"a": float(r == 0 and k == 0), "b": float(k % 2), "c": 1.0, "d": 0.0}[u]

    batch, streamed = screen_planner(100), screen_planner(100)
    rounds, _ = run_step(batch, screen_reward)
    asked, out = run_stream(streamed, screen_reward)
    assert streamed.metrics()["planner/samples_per_prompt"] == batch.metrics()["planner/samples_per_prompt"] == [2, 2, 8, 8]
    assert sorted(out.train) == ["a", "b", "c", "d"]
    assert len(asked) == sum(len(r) for r in rounds)  # the same requests, in another order

    first_correct = {"a": 0, "b": 1, "c": 99}
    pl = make("ar3po", uids=["a", "b", "c"], pps=3, n=4, ar3po_stages=3, ar3po_stage_size=2, budget_rollouts=100)
    run_stream(pl, lambda u, r, k: float(r >= first_correct[u]))
    assert pl.metrics()["planner/samples_per_prompt"] == [2, 4, 6]


def test_streamed_screen_keeps_the_budget() -> None:
    asked, _ = run_stream(screen_planner(12), lambda u, r, k: {"a": 1.0, "b": float(k % 2), "c": 1.0, "d": 0.0}[u])
    assert sum(n for _, n in asked) <= 12


def test_streamed_growth_leaves_the_budget_that_probes_still_out_may_need() -> None:
    # the step takes b (a full group of 4) and probes a and c (2 each): 8 of a budget of 10. b
    # finishes first, mixed, and would grow by 2, all the budget left; a's probe, still out, then
    # surprises and needs those 2 for its top-up
    reward = {"a": lambda r, k: float(k == 0), "b": lambda r, k: float(k % 2), "c": lambda r, k: 1.0}
    asked, _ = run_stream(screen_planner(12), lambda u, r, k: reward[u](r, k), first="b", step_budget=10)
    assert asked[:3] == [("b", 4), ("c", 2), ("a", 2)]
    assert asked[3:] == [("a", 2)]  # a's top-up; b did not grow
    # round by round (partial rollouts: a probe still out may never come back this step) nothing
    # is held back for it
    pl = screen_planner(12)
    pl.begin_step(0)
    pl._st.budget = 10
    assert [(q.uid, q.n) for q in pl.observe([GroupResult("b", [0.0, 1.0, 0.0, 1.0], [10] * 4)])] == [("b", 2)]


def screen_variant(budget: int, **kw) -> object:
    pl = make("uniform", uids=["a", "b", "c", "d"], pps=4, n=4, estimator="beta", allocator="screen",
              budget_rollouts=budget, **kw)
    for uid, s in (("a", 0), ("b", 20), ("c", 40)):  # as screen_planner: hopeless, mixed, solved; d unseen
        pl.estimator.update(pl.index[uid], s, 40)
    return pl


def screen_reward(u: str, r: int, k: int) -> float:
    return {"a": float(r == 0 and k == 0), "b": float(k % 2), "c": 1.0, "d": 0.0}[u]


def test_screen_eager_growth_asks_in_one_request_what_stages_ask_in_two_rounds() -> None:
    # a's probe [1, 0] is already informative: its top-up (2) and its growth to 2n = 8 (4 more)
    # come in one request; b's mixed full group grows from 4 to 8 at once. Same allocation as
    # the staged rounds of test_screen_probes_confident_extremes_and_grows_informative_groups.
    pl = screen_variant(100, screen_growth="eager")
    rounds, out = run_step(pl, screen_reward)
    assert [sorted(rr) for rr in rounds] == [[("a", 2), ("b", 4), ("c", 2), ("d", 2)], [("a", 6), ("b", 4)]]
    assert sorted(out.train) == ["a", "b", "c", "d"]
    assert pl.metrics()["planner/samples_per_prompt"] == [2, 2, 8, 8]


def test_screen_eager_growth_takes_what_the_budget_leaves() -> None:
    # budget 15: three prompts (15 // 4) spend 8; a's top-up (2) and growth (4) come first, then
    # b gets the 1 rollout left of its 4 of growth; no round after that has budget left
    rounds, _ = run_step(screen_variant(15, screen_growth="eager"), screen_reward)
    assert rounds[1:] == [[("a", 6), ("b", 1)]]
    assert sum(n for rr in rounds for _, n in rr) == 15


def test_screen_eager_growth_stops_at_the_tasks_share() -> None:
    # as test_screen_stratify_rollouts_caps_each_tasks_growth_at_its_share: x's share is 16 of
    # 32; x:1 grows by the 8 left of it (of the 12 it could), x:2 by none (of 12)
    uids = ["x:1", "x:2", "y:1", "y:2"]
    pl = make("uniform", uids=uids, pps=4, n=4, estimator="beta", allocator="screen", budget_rollouts=32,
              max_samples_per_prompt=16, stratify_rollouts=True, screen_growth="eager")
    for u in uids:
        pl.estimator.update(pl.index[u], 20, 40)
    rounds, _ = run_step(pl, lambda u, r, k: float(u.startswith("x") and k % 2 == 1))
    assert rounds[1:] == [[("x:1", 8)]]
    # refused by the share: x:1's other 4, and of x:2's 12 the 8 the budget had left (the rest the budget refused)
    assert pl.metrics()["planner/growth_capped"] == 4.0 + 8.0


def test_growth_the_budget_refuses_is_not_counted_as_capped_by_the_task_share() -> None:
    """With one task its share is the whole budget, so whatever growth is refused, the budget refused:
    planner/growth_capped stays 0 (it counted 20 rollouts here, the allocation being the same with
    stratify_rollouts off)."""
    uids = [f"q{i}" for i in range(200)]
    mixed = set(uids[::3])
    pl = build_planner(PlannerConfig(strategy="adaptive", stratify_rollouts=True), uids, 6, 8, 64, 0)
    rounds, _ = run_step(pl, lambda u, r, k: float(u in mixed and k % 2 == 0))
    assert len(rounds) > 1 and pl.metrics()["planner/growth_capped"] == 0.0


def test_screen_next_step_rolls_a_surprising_probe_out_in_full_next_step() -> None:
    pl = screen_variant(100, screen_followup="next_step")
    assert not pl.follows_up  # nothing to overlap: every step is one round
    rounds, out = run_step(pl, screen_reward)
    assert [sorted(rr) for rr in rounds] == [[("a", 2), ("b", 4), ("c", 2), ("d", 2)]]  # one round
    assert sorted(out.train) == ["a", "b", "c", "d"]
    # a surprised its belief (a correct answer on a prompt believed hopeless); c and d agreed
    state = json.loads(json.dumps(pl.state_dict()))
    resumed = screen_variant(100, screen_followup="next_step")
    resumed.load_state_dict(state)
    for p in (pl, resumed):
        reqs = p.begin_step(1)
        assert (reqs[0].uid, reqs[0].n) == ("a", 4)  # first, and a full group despite its belief
        assert [q.uid for q in reqs].count("a") == 1
        p.observe([GroupResult(q.uid, [0.0] * q.n, [10] * q.n) for q in reqs])
        p.end_step()
        assert p.metrics()["planner/carried"] == 1.0
    assert pl.state_dict() == resumed.state_dict()


def test_screen_options_with_another_allocator_are_an_error() -> None:
    with pytest.raises(ValueError, match="screen_followup=next_step is read only by planner.allocator=screen"):
        make("uniform", screen_followup="next_step")
    with pytest.raises(ValueError, match="screen_growth=eager is read only by planner.allocator=screen"):
        make("mopps", screen_growth="eager")


def test_screen_next_step_carries_only_what_the_budget_holds() -> None:
    pl = screen_variant(8, screen_followup="next_step")  # 2 full groups of 4
    pl.allocator.pending = ["c", "a", "d"]
    reqs = pl.begin_step(0)
    assert [(q.uid, q.n) for q in reqs] == [("c", 4), ("a", 4)]  # oldest first; d waits
    pl.observe([GroupResult(q.uid, [1.0] * q.n, [10] * q.n) for q in reqs])
    pl.end_step()
    assert pl.metrics()["planner/carried"] == 2.0
    assert [(q.uid, q.n) for q in pl.begin_step(1)][0] == ("d", 4)


def test_screen_next_step_charges_carried_groups_to_the_step_budget() -> None:
    # budget 8 with probes costing 2 a prompt: the carried full group (4) leaves 4 rollouts, so 2
    # fresh prompts, not the 3 more that the whole budget's 4 prompts would have left room for
    pl = screen_variant(8, screen_followup="next_step")
    pl.allocator.cost_per_prompt = 2.0
    pl.allocator.pending = ["a"]
    reqs = pl.begin_step(0)
    assert (reqs[0].uid, reqs[0].n) == ("a", 4) and len(reqs) == 3, reqs
    # the cost a fresh prompt is planned at leaves the carried groups out: two 2-sample probes keep it at 2
    fresh = {q.uid: q.n for q in reqs[1:]}
    pl.observe([GroupResult(q.uid, [0.0] * q.n, [10] * q.n) for q in reqs])
    pl.end_step()
    assert pl.allocator.cost_per_prompt == pytest.approx(0.8 * 2.0 + 0.2 * sum(fresh.values()) / len(fresh))


def test_screen_next_step_does_not_roll_a_waiting_prompt_out_twice() -> None:
    # b waits for budget while a is carried; the selector then rolls b out fresh this step (a probe that
    # agrees with its belief), so b leaves the queue instead of getting a full group next step as well
    pl = make("uniform", uids=["a", "b"], pps=2, n=4, estimator="beta", allocator="screen", budget_rollouts=6,
              screen_followup="next_step")
    pl.allocator.pending = ["a", "b"]
    reqs = pl.begin_step(0)
    assert [(q.uid, q.n) for q in reqs] == [("a", 4), ("b", 2)]
    pl.observe([GroupResult(q.uid, [0.0] * q.n, [10] * q.n) for q in reqs])
    pl.end_step()
    assert pl.allocator.pending == []


def test_screen_next_step_queue_holds_at_most_one_steps_full_groups() -> None:
    # budget 8, n 4: two full groups a step. c and a are carried (they fill the budget) and d waits
    pl = screen_variant(8, screen_followup="next_step")
    pl.allocator.pending = ["c", "a", "d"]
    rounds, _ = run_step(pl, lambda u, r, k: 0.0)
    assert rounds[0] == [("c", 4), ("a", 4)]
    assert pl.allocator.pending == ["d"] and pl.metrics()["planner/followups_dropped"] == 0.0
    # five waiting: two are carried, and of the three left one step holds two: the oldest (d) is dropped,
    # and counted in the step that dropped it
    pl.allocator.pending = ["c", "a", "d", "b", "a2"]
    rounds, _ = run_step(pl, lambda u, r, k: 0.0)
    assert rounds[0] == [("c", 4), ("a", 4)]
    assert pl.allocator.pending == ["b", "a2"] and pl.metrics()["planner/followups_dropped"] == 1.0
    # a step budget below one full group can serve no follow-up: nothing waits for good
    small = screen_variant(3, screen_followup="next_step")
    small.allocator.pending = ["zz"]
    small.begin_step(0)
    small.end_step()
    assert small.allocator.pending == [] and small.metrics()["planner/followups_dropped"] == 1.0


def test_a_next_step_queue_is_not_replayed_after_resuming_with_same_step() -> None:
    pl = screen_variant(100, screen_followup="next_step")
    pl.allocator.pending = ["a", "d"]
    same = screen_variant(100)  # screen_followup=same_step, resumed from that checkpoint
    same.load_state_dict(json.loads(json.dumps(pl.state_dict())))
    for _ in range(2):
        rounds, _ = run_step(same, screen_reward)
        assert ("a", 4) not in rounds[0] and ("d", 4) not in rounds[0], rounds  # a and d are probed as usual
    assert same.allocator.pending == [] and "planner/carried" not in same.metrics()


def steps_with_mixed_rewards(pl, steps: int, length_of=lambda uid: 10) -> list[tuple[set[str], set[str]]]:
    """Run `steps` steps in which every group is informative (rewards alternate 1, 0, ...) and uid u's
    samples are length_of(u) tokens long; per step the prompts requested and the prompts trained on."""
    out = []
    for step in range(steps):
        reqs, asked = pl.begin_step(step), set()
        while reqs:
            asked |= {q.uid for q in reqs}
            reqs = pl.observe([GroupResult(q.uid, [float(k % 2 == 0) for k in range(q.n)], [length_of(q.uid)] * q.n)
                               for q in reqs])
        out.append((asked, set(pl.end_step().train)))
    return out


@pytest.mark.parametrize("strategy", ["adaptive", "uniform"])
def test_revisit_cooldown_keeps_trained_prompts_out_for_that_many_steps(strategy) -> None:
    uids = UIDS[:20]
    hist = steps_with_mixed_rewards(make(strategy, uids=uids, pps=2, n=4, revisit_cooldown=4), 30)
    if strategy == "adaptive":  # and back once they are over: 1 keeps a prompt out of the next step only
        one = steps_with_mixed_rewards(make(strategy, uids=uids, pps=2, n=4, revisit_cooldown=1), 30)
        assert not any(one[t][1] & one[t + 1][0] for t in range(29))
        assert any(one[t][1] & one[t + 2][0] for t in range(28))
    for t, (_, trained) in enumerate(hist):
        for later in hist[t + 1: t + 5]:
            assert not trained & later[0]  # not asked again in the 4 steps after it was trained
    if strategy == "adaptive":  # without the cooldown it returns to its informative prompts at once
        pl = make(strategy, uids=uids, pps=2, n=4)
        free = steps_with_mixed_rewards(pl, 30)
        assert any(free[t][1] & free[t + 1][0] for t in range(29))
        trained = set().union(*(t for _, t in free))
        assert pl.metrics()["planner/prompts_trained"] == len(trained) < 20
        again = free[-1][1] & set().union(*(t for _, t in free[:-1]))  # the last step's prompts trained before
        assert pl.metrics()["planner/revisit_share"] == pytest.approx(len(again) / len(free[-1][1]))


def test_revisit_cooldown_gives_back_the_prompts_cooled_longest_when_the_pool_runs_short() -> None:
    with pytest.warns(UserWarning, match="revisit_cooldown=5"):  # deliberately longer than the pool
        pl = make("uniform", uids=["a", "b", "c"], pps=2, n=4, revisit_cooldown=5)
    hist = steps_with_mixed_rewards(pl, 3)
    assert [len(asked) for asked, _ in hist] == [2, 2, 2]  # never fewer prompts than asked for
    first, second = hist[0][1], hist[1][1]
    assert second - first == {"a", "b", "c"} - first and len(second) == 2  # the free one, and one cooled
    assert hist[2][0] & first  # step 2: all three cool; those trained at step 0 come back first
    state = json.loads(json.dumps(pl.state_dict()))
    with pytest.warns(UserWarning):
        again = make("uniform", uids=["a", "b", "c"], pps=2, n=4, revisit_cooldown=5)
    again.load_state_dict(state)
    assert again.trained_at == pl.trained_at and set(pl.trained_at) == {"a", "b", "c"}


def test_a_cooldown_as_long_as_the_pool_is_warned_about() -> None:
    with pytest.warns(UserWarning, match="revisit_cooldown=2 can keep 2 x 4 prompts a step = 8 out at once"):
        make("uniform", uids=UIDS[:8], pps=4, n=4, revisit_cooldown=2)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make("uniform", uids=UIDS[:8], pps=4, n=4, revisit_cooldown=1)


def test_revisit_discount_scores_a_prompt_trained_k_times_at_d_to_the_k() -> None:
    pl = make("adaptive", uids=UIDS[:20], pps=2, n=4, revisit_discount=0.5)
    hist = steps_with_mixed_rewards(pl, 6)
    counts: dict[str, int] = {}
    for _, trained in hist:
        for u in trained:
            counts[u] = counts.get(u, 0) + 1
    assert pl.trained_times == counts  # every group was informative, so every trained prompt counts
    uids = sorted(counts) + [u for u in UIDS[:20] if u not in counts][:1]
    assert pl.revisit_weights(uids).tolist() == [0.5 ** counts[u] for u in uids[:-1]] + [1.0]
    again = make("adaptive", uids=UIDS[:20], pps=2, n=4, revisit_discount=0.5)
    again.load_state_dict(json.loads(json.dumps(pl.state_dict())))
    assert again.trained_times == pl.trained_times
    old = {k: v for k, v in pl.state_dict().items() if k != "trained_times"}  # a checkpoint from before the option
    again.load_state_dict(json.loads(json.dumps(old)))
    assert again.trained_times == dict.fromkeys(pl.trained_at, 1)


def test_revisit_discount_spreads_adaptive_over_more_prompts() -> None:
    plain = make("adaptive", uids=UIDS[:20], pps=2, n=4)
    steps_with_mixed_rewards(plain, 30)
    discounted = make("adaptive", uids=UIDS[:20], pps=2, n=4, revisit_discount=0.1)
    steps_with_mixed_rewards(discounted, 30)
    assert max(discounted.trained_times.values()) < max(plain.trained_times.values())
    assert len(discounted.trained_times) > len(plain.trained_times)


def test_revisit_discount_is_refused_where_no_part_reads_it() -> None:
    with pytest.raises(ValueError, match="revisit_discount=0.5 is read only by planner.selector=posterior"):
        make("uniform", revisit_discount=0.5)
    with pytest.raises(ValueError):
        PlannerConfig(revisit_discount=0)


def test_length_weights_are_one_over_the_last_mean_length_and_the_mean_for_new_prompts() -> None:
    pl = make("adaptive", uids=UIDS[:20], pps=2, n=4, score_per_token=True)
    assert pl.length_weights(["q0", "q1"]).tolist() == [1.0, 1.0]  # nothing rolled out yet
    reqs = pl.begin_step(0)
    a, b = reqs[0].uid, reqs[1].uid  # probes of two samples each: all-wrong, so no further round
    assert [q.n for q in reqs] == [2, 2]
    assert pl.observe([GroupResult(a, [0.0, 0.0], [10, 30]), GroupResult(b, [0.0, 0.0], [40, 40])]) == []
    pl.end_step()
    assert pl.mean_length == {a: 20.0, b: 40.0}
    new = next(u for u in UIDS[:20] if u not in (a, b))
    assert pl.length_weights([a, b, new]).tolist() == [1 / 20, 1 / 40, 1 / 30]
    again = make("adaptive", uids=UIDS[:20], pps=2, n=4, score_per_token=True)
    again.load_state_dict(json.loads(json.dumps(pl.state_dict())))
    assert again.mean_length == pl.mean_length
    old = {k: v for k, v in pl.state_dict().items() if k != "mean_length"}  # a checkpoint from before the option
    again.load_state_dict(json.loads(json.dumps(old)))
    assert again.mean_length == {}


def test_score_per_token_trains_adaptive_on_the_prompts_answered_briefly() -> None:
    def length_of(u: str) -> int:
        return 10 if int(u[1:]) % 2 == 0 else 80

    def short_share(pl) -> float:
        trained = [u for _, s in steps_with_mixed_rewards(pl, 30, length_of)[5:] for u in s]
        return sum(length_of(u) == 10 for u in trained) / len(trained)

    plain = short_share(make("adaptive", uids=UIDS[:20], pps=2, n=4))
    per_token = short_share(make("adaptive", uids=UIDS[:20], pps=2, n=4, score_per_token=True))
    assert per_token > 0.8 and per_token > plain + 0.2, (plain, per_token)


def test_score_per_token_is_refused_where_no_part_reads_it() -> None:
    with pytest.raises(ValueError, match="score_per_token=True is read only by planner.selector=posterior"):
        make("uniform", score_per_token=True)


def test_planner_seed_changes_the_planners_draws_and_nothing_else():
    base, same, other = make("adaptive"), make("adaptive", seed=0), make("adaptive", seed=1)
    state = lambda pl: pl.rng.bit_generator.state["state"]["state"]  # noqa: E731
    assert state(base) == state(same)  # planner.seed unset means run.seed (0 here)
    assert state(other) != state(base)
    assert other.stream.take(len(UIDS)) == base.stream.take(len(UIDS))  # the data order stays run.seed's


@pytest.mark.parametrize(("threshold", "solved"), [(0.5, 1), (1.0, 0)])
def test_success_threshold_decides_what_the_belief_counts_as_solved(threshold, solved) -> None:
    """A partial-credit reward of 0.6 is a success at planner.success_threshold=0.5 and not at 1.0:
    in the belief's counts, and in the group's successes that replay needs."""
    pl = make("mopps", uids=UIDS, pps=len(UIDS), n=4, success_threshold=threshold)
    reqs = pl.begin_step(0)
    pl.observe([GroupResult(q.uid, [0.6, 0.0, 0.0, 0.0][: q.n], [5] * q.n) for q in reqs])
    groups = {u: g.successes for u, g in pl._require_step().groups.items()}
    pl.end_step()
    assert set(groups.values()) == {solved}
    prior_s, _ = make("mopps", uids=UIDS, pps=len(UIDS), n=4).estimator.pseudo_counts(np.arange(len(UIDS)))
    got_s, got_f = pl.estimator.pseudo_counts(np.array([pl.index[q.uid] for q in reqs]))
    assert got_s - prior_s[: len(reqs)] == pytest.approx([solved] * len(reqs), abs=0.05)  # decay aside


# ------------------------------------------------------------------ settings changed on resume


def test_settings_a_resume_changes_are_in_effect_after_the_saved_state_loads() -> None:
    """An audit found saved planner state overriding settings a resume changed, each said as changed."""
    # rollout.num_generations 4 -> 8: the cost per prompt is in the new group size (it kept 4, and every
    # fixed-size preset took twice the prompts its budget allows, for the rest of the run)
    for strategy in ("uniform", "knapsack", "e3", "adaptive"):
        old = make(strategy, pps=8, n=4)
        new = make(strategy, pps=4, n=8)
        new.load_state_dict(json.loads(json.dumps(old.state_dict())))
        assert new.allocator.cost_per_prompt == pytest.approx(8.0), strategy
        assert new.allocator.prompts_for(32) == 4
    # planner.budget_tokens lowered: the saved carry is bounded by the new budget
    old = make("adaptive", budget_tokens=4000)
    old.token_carry = 3500.0
    new = make("adaptive", budget_tokens=400)
    new.load_state_dict(old.state_dict())
    assert new.token_carry == 400.0
    # planner.greso_explore_max lowered: the saved exploration probabilities are within the new bounds
    old = make("greso")
    new = make("greso", greso_explore_max=0.2)
    new.load_state_dict(old.state_dict())
    assert new.selector.p_easy <= 0.2 and new.selector.p_hard <= 0.2
    # planner.group_prior false -> true with the length prior: each task starts from the pooled length slope
    # (an IndexError a step later); the other way is refused
    uids = [f"gcd:{i}" for i in range(6)] + [f"sum:{i}" for i in range(6)]
    lengths = list(range(12))
    kw = dict(estimator="irt", length_prior=True)
    pooled = build_planner(PlannerConfig(strategy="adaptive", group_prior=False, **kw), uids, 4, 4, 64, 0, lengths)
    pooled.estimator.beta[:] = -0.7
    grouped = build_planner(PlannerConfig(strategy="adaptive", group_prior=True, **kw), uids, 4, 4, 64, 0, lengths)
    grouped.load_state_dict(pooled.state_dict())
    assert grouped.estimator.beta.tolist() == [-0.7, -0.7] and len(grouped.estimator.mean(np.arange(12))) == 12
    with pytest.raises(ValueError):
        pooled.load_state_dict(grouped.state_dict())
    # planner.seed changed: the decisions draw from the new seed (the saved stream overrode it)
    old = make("mopps", seed=1)
    same, other = make("mopps", seed=1), make("mopps", seed=12345)
    for pl in (same, other):
        pl.load_state_dict(old.state_dict())
    assert same.rng.random() == old.rng.random() != other.rng.random()


def test_a_next_step_follow_up_is_part_of_its_probes_visit() -> None:
    pl = make("uniform", uids=["a"], pps=1, n=4, estimator="beta", allocator="screen", budget_rollouts=4,
              screen_followup="next_step")
    pl.estimator.update(0, 0, 40)  # believed hopeless: a probe of 2
    _, out = run_step(pl, lambda u, r, k: float(k == 0))  # [1, 0]: trained, and a surprise carried to the next step
    assert out.train == ["a"] and pl.allocator.pending == ["a"]
    rounds, out = run_step(pl, lambda u, r, k: float(k == 0))
    assert rounds[0] == [("a", 4)] and out.train == ["a"]
    assert pl.trained_times["a"] == 1 and pl.metrics()["planner/revisit_share"] == 0.0


def test_irt_level_does_not_move_the_full_clip_on_a_revisit_its_belief_predicted() -> None:
    """A revisit that scores what its belief expected (0 of 8 on a prompt believed near 0) moved the level by the
    full clip (-0.25), since the clipped ratio g/h ignored how little a small curvature says: biased toward the
    likelier outcome. With the curvature's floor h0 = 1/(4 max_step^2) the step is linear in the outcome."""
    e = IRTEstimator(2)
    for _ in range(3):
        e.update(0, 0, 8)  # believed near hopeless
    e.after_step()
    level = e.level
    p = float(e.mean(np.array([0]))[0])
    e.update(0, 0, 8)  # scores as believed
    e.after_step()
    g, h = -8 * p, 8 * p * (1 - p)
    assert e.level - level == pytest.approx(g / (h + 4.0)) and abs(e.level - level) < 0.1
