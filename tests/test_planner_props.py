"""Planner parts under seeded randomized property checks: many small random instances per part (plain numpy
loops, no property-testing library), plus hand-computed numbers for the estimators' update rules."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from rollwise.config import PlannerConfig
from rollwise.planner import GroupResult, build_planner
from rollwise.planner.estimators import (
    BetaEstimator,
    LastVisitEstimator,
    RankEstimator,
    TwoScaleBetaEstimator,
    WindowEstimator,
)
from rollwise.planner.knapsack import informative_value, needed_samples, solve_mckp
from rollwise.planner.repair import ReplayRepair
from rollwise.planner.selectors import apportion, stratified_top
from rollwise.planner.step import Group, StepState

# ------------------------------------------------------------------ estimators


def _random_estimators(size: int, rng: np.random.Generator) -> list:
    w = int(rng.integers(1, 9))
    return [BetaEstimator(size, float(rng.uniform(0.05, 1.0))),
            TwoScaleBetaEstimator(size, float(rng.uniform(0.05, 1)), float(rng.uniform(0.05, 1)), float(rng.random())),
            WindowEstimator(size, w), LastVisitEstimator(size, w), RankEstimator(size, w)]


def test_estimators_keep_rates_in_unit_interval_and_follow_their_formulas() -> None:
    rng = np.random.default_rng(11)
    for _ in range(60):
        size = int(rng.integers(1, 6))
        ests = _random_estimators(size, rng)
        beta, two, win, last, rank = ests
        # references: Beta pseudo-counts, and per prompt the list of (successes, n) visits
        ref_a, ref_b = np.ones(size), np.ones(size)
        fa, fb, sa, sb = np.ones(size), np.ones(size), np.ones(size), np.ones(size)
        visits: list[list[tuple[int, int]]] = [[] for _ in range(size)]
        for _ in range(int(rng.integers(0, 12))):
            i, n = int(rng.integers(size)), int(rng.integers(1, 12))
            s = int(rng.integers(0, n + 1))
            for e in ests:
                e.update(i, s, n)
            lam = beta.decay
            ref_a[i], ref_b[i] = lam * ref_a[i] + (1 - lam) + s, lam * ref_b[i] + (1 - lam) + (n - s)
            fl, sl = two.fast.decay, two.slow.decay
            fa[i], fb[i] = fl * fa[i] + (1 - fl) + s, fl * fb[i] + (1 - fl) + (n - s)
            sa[i], sb[i] = sl * sa[i] + (1 - sl) + s, sl * sb[i] + (1 - sl) + (n - s)
            visits[i].append((s, n))
        idx = np.arange(size)
        for e in ests:
            m = e.mean(idx)
            assert np.all((m >= 0) & (m <= 1)), (e.name, m)
            assert np.all(e.count(idx) >= 0), e.name
            draws = e.sample(idx, rng)
            assert np.all((draws >= 0) & (draws <= 1)), e.name
        assert beta.mean(idx) == pytest.approx(ref_a / (ref_a + ref_b))
        w = two.w
        a2, b2 = w * fa + (1 - w) * sa, w * fb + (1 - w) * sb
        assert two.mean(idx) == pytest.approx(a2 / (a2 + b2))
        win_w = win.window
        for i in range(size):
            # each visit's min(n, window) newest slots hold its success share; the window keeps the newest slots
            slots = [s / n for s, n in visits[i] for _ in range(min(n, win_w))][-win_w:]
            want = float(np.mean(slots)) if slots else 0.5
            assert win.mean(np.array([i]))[0] == pytest.approx(want)
            lv = visits[i][-1] if visits[i] else None
            want_last = lv[0] / lv[1] if lv and lv[1] >= win_w else want
            assert last.mean(np.array([i]))[0] == pytest.approx(want_last)
        r = rank.rank(idx)
        assert np.all((r >= 0) & (r < 1))
        seen = [i for i in range(size) if visits[i]]
        assert all(r[i] == 0 for i in range(size) if not visits[i])
        for i, j in itertools.permutations(seen, 2):  # harder (lower mean) ranks at least as high
            if rank.mean(np.array([i]))[0] < rank.mean(np.array([j]))[0] - 1e-12:
                assert r[i] > r[j]


def test_estimator_updates_by_hand() -> None:
    # MoPPS, lambda = 0.8: Beta(1, 1), 3 of 5 -> (0.8 + 0.2 + 3, 0.8 + 0.2 + 2) = (4, 3); 0 of 2 -> (3.4, 4.6)
    e = BetaEstimator(1, decay=0.8)
    e.update(0, 3, 5)
    assert (e.alpha[0], e.beta[0]) == pytest.approx((4.0, 3.0))
    e.update(0, 0, 2)
    assert (e.alpha[0], e.beta[0]) == pytest.approx((3.4, 4.6)) and e.mean(np.array([0]))[0] == pytest.approx(0.425)
    # window 4: 1 of 2 (0.5, 0.5), then 3 of 3 (1, 1, 1) -> newest 4 slots 0.5, 1, 1, 1 -> 0.875
    w = WindowEstimator(1, 4)
    w.update(0, 1, 2)
    w.update(0, 3, 3)
    assert w.mean(np.array([0]))[0] == pytest.approx(0.875)
    # last visit, window 4: 1 of 8 is a full visit -> 1/8; then 2 of 2 -> topped up: slots 1/8 x 2 and 1 x 2
    lv = LastVisitEstimator(1, 4)
    lv.update(0, 1, 8)
    assert lv.mean(np.array([0]))[0] == pytest.approx(0.125)
    lv.update(0, 2, 2)
    assert lv.mean(np.array([0]))[0] == pytest.approx((0.125 * 2 + 2) / 4)
    # VADE: fast 0.5, slow 1, weight 0.25; 2 of 2: fast (3, 1), slow (3, 1) -> (3, 1): mean 0.75
    t = TwoScaleBetaEstimator(1, 0.5, 1.0, 0.25)
    t.update(0, 2, 2)
    assert t.mean(np.array([0]))[0] == pytest.approx(0.75)


# ------------------------------------------------------------------ knapsack


def test_knapsack_solver_equals_brute_force_on_random_small_instances() -> None:
    rng = np.random.default_rng(5)
    for _ in range(300):
        m, k = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        values = [rng.random(k) * float(rng.choice([1.0, 1e-3])) for _ in range(m)]
        costs = [rng.integers(0, 7, k) for _ in range(m)]
        lo = sum(int(c.min()) for c in costs)
        cap = int(rng.integers(max(lo - 2, 0), lo + 12))
        feasible = [ch for ch in itertools.product(range(k), repeat=m)
                    if sum(costs[i][c] for i, c in enumerate(ch)) <= cap]
        if not feasible:
            with pytest.raises(ValueError):
                solve_mckp(values, costs, cap)
            continue
        best = max(sum(values[i][c] for i, c in enumerate(ch)) for ch in feasible)
        got = solve_mckp(values, costs, cap)
        assert len(got) == m and all(0 <= c < k for c in got)
        assert sum(costs[i][c] for i, c in enumerate(got)) <= cap
        assert sum(values[i][c] for i, c in enumerate(got)) == pytest.approx(best, rel=1e-12, abs=1e-15)


def test_knapsack_value_formula() -> None:
    rng = np.random.default_rng(6)
    p, n = rng.random(500), rng.integers(1, 130, 500)
    want = [(1 - pi**ni - (1 - pi) ** ni) * pi * (1 - pi) ** 2 for pi, ni in zip(p, n)]
    assert informative_value(p, n) == pytest.approx(want)
    # by hand: p = 1/3, n = 3: (1 - 1/27 - 8/27) * 1/3 * 4/9 = 18/27 * 4/27 = 8/81
    assert informative_value(np.array(1 / 3), 3) == pytest.approx(8 / 81)
    # InfoGain p(1-p)^2 peaks at p = 1/3 (large n)
    grid = np.linspace(0.01, 0.99, 99)
    assert grid[np.argmax(informative_value(grid, 200))] == pytest.approx(1 / 3, abs=0.01)
    for q in rng.random(200):
        k = needed_samples(float(q), 128)
        big = max(q, 1 - q)
        assert 1 <= k <= 128
        if k < 128:  # the fewest samples with a miss chance max(p, 1-p)^k <= 0.1
            assert big**k <= 0.1 + 1e-12 and (k == 1 or big ** (k - 1) > 0.1)


# ------------------------------------------------------------------ planners end to end: allocators' bounds

POOLS = {"plain": [f"q{i}" for i in range(24)], "tasks": [f"{t}:{i}" for t in ("a", "b", "c") for i in range(8)]}


def _random_config(rng: np.random.Generator, strategy: str, n: int) -> dict:
    kw: dict = {}
    if strategy == "knapsack":
        kw["min_observations"] = int(rng.integers(0, 6))
        if rng.random() < 0.5:
            lo = int(rng.integers(1, n + 2))
            kw["min_samples_per_prompt"] = lo
            kw["max_samples_per_prompt"] = lo + int(rng.integers(0, 3 * n))
    if strategy == "e3" and rng.random() < 0.5:
        lo = int(rng.integers(1, n + 1))
        kw["min_samples_per_prompt"] = lo
        kw["max_samples_per_prompt"] = lo + int(rng.integers(0, 2 * n))
    if strategy == "dars":
        kw["dars_schedule"] = str(rng.choice(["et", "hw"]))
        if rng.random() < 0.5:
            kw["max_samples_per_prompt"] = n + int(rng.integers(0, 4 * n))
    if strategy == "ar3po":
        kw["ar3po_stages"] = int(rng.integers(1, 5))
        kw["staged_rule"] = str(rng.choice(["until_correct", "while_informative"]))
        if rng.random() < 0.5:
            kw["ar3po_stage_size"] = int(rng.integers(1, n + 1))
    if strategy == "adaptive":
        kw["screen_growth"] = str(rng.choice(["stages", "eager"]))
        kw["screen_size"] = int(rng.integers(1, max(2, n)))
        if rng.random() < 0.5:
            kw["max_samples_per_prompt"] = n + int(rng.integers(0, 2 * n))
    if strategy == "dapo":
        kw["dapo_max_rounds"] = int(rng.integers(1, 5))
        kw["dapo_oversample"] = float(rng.choice([1.0, 1.5, 3.0]))
    if rng.random() < 0.3:
        kw["budget_rollouts"] = int(rng.integers(1, 6 * n))
    return kw


def _group_bounds(pl) -> tuple[int, int]:
    """(fewest, most) samples a group of this planner may get in a step."""
    a, n = pl.allocator, pl.n
    if a.name == "knapsack":
        return a.min_n, a.max_n
    if a.name == "rank":
        return a.lo, a.hi
    if a.name == "staged":
        return a.k, a.k * a.stages
    if a.name in ("hardness", "screen"):
        return (n if a.name == "hardness" else a.probe), a.max_n
    return n, n


@pytest.mark.parametrize("strategy", ["uniform", "greso", "mopps", "vade", "knapsack", "e3", "dars", "ar3po", "adaptive",
                                      "dapo"])
def test_every_allocation_stays_in_budget_and_bounds_on_random_runs(strategy: str) -> None:
    rng = np.random.default_rng(sum(map(ord, strategy)))
    for case in range(12):
        uids = POOLS["tasks" if case % 2 else "plain"]
        n, pps = int(rng.integers(2, 7)), int(rng.integers(1, 7))
        kw = _random_config(rng, strategy, n)
        if strategy == "adaptive" and kw["screen_size"] >= n:
            kw["screen_size"] = n - 1
        pl = build_planner(PlannerConfig(strategy=strategy, **kw), uids, pps, n, 64, int(rng.integers(1000)))
        rates = {u: float(rng.choice([0.0, 1.0, rng.random()])) for u in uids}
        ever_correct: set[str] = set()
        lo, hi = _group_bounds(pl)
        for step in range(8):
            reqs = pl.begin_step(step)
            st = pl._st
            budget = st.budget
            first = sum(q.n for q in reqs)
            asked: dict[str, int] = {}
            rounds = 0
            while reqs:
                rounds += 1
                names = [q.uid for q in reqs]
                assert len(names) == len(set(names)), (strategy, step, names)  # no uid twice in a round
                for q in reqs:
                    assert q.uid in pl.index and isinstance(q.n, int) and q.n >= 1, (strategy, q)
                    # an allocator's follow-ups are for prompts the step selected; only back-fill adds prompts
                    assert rounds == 1 or strategy == "dapo" or q.uid in asked, (strategy, q)
                    asked[q.uid] = asked.get(q.uid, 0) + q.n
                reqs = pl.observe([GroupResult(q.uid, [float(rng.random() < rates[q.uid]) for _ in range(q.n)],
                                               [10] * q.n) for q in reqs])
            total = sum(asked.values())
            assert set(st.groups) == set(asked)  # samples only for prompts the step selected
            for u, k in asked.items():
                assert k <= hi, (strategy, kw, u, k, hi)
                if strategy not in ("adaptive",):  # a probe is smaller than a group; checked by hi
                    assert k >= min(lo, hi), (strategy, kw, u, k, lo)
            if strategy in ("knapsack", "e3"):
                # one group over the budget only when the budget is below one minimum group
                assert total <= budget or (len(asked) == 1 and total <= max(hi, lo)), (strategy, kw, budget, asked)
            elif strategy in ("uniform", "greso", "mopps", "vade"):
                assert total <= max(budget, n), (strategy, budget, asked)
            elif strategy in ("dars", "ar3po", "adaptive"):  # follow-ups within what the first round left
                assert total <= max(budget, first), (strategy, kw, budget, first, asked)
            out = pl.end_step()
            assert set(out.train) <= set(asked) and len(out.train) == len(set(out.train))
            assert set(out.replay) <= set(out.train)
            for u in out.replay:  # replay only for an all-wrong group of a prompt solved in an earlier step
                assert st.groups[u].all_wrong and u in ever_correct, (strategy, u)
            if strategy in ("dapo", "dars"):
                assert all(st.groups[u].informative or u in out.replay for u in out.train)
            if strategy == "dapo":
                assert len(out.train) <= st.target_prompts and rounds <= pl.cfg.dapo_max_rounds
            ever_correct |= {u for u, g in st.groups.items() if g.successes > 0}


def test_knapsack_allocate_directly_on_random_beliefs() -> None:
    """The allocator alone, on random beliefs and budgets: integer counts within [min_n, max_n], the budget
    held whenever it holds every prompt's cheapest group, p = 0 and p = 1 prompts at the minimum unless the
    surplus fallback tops up the p = 0 ones, and a DP allocation no worse than any other feasible one."""
    rng = np.random.default_rng(8)
    uids = [f"q{i}" for i in range(6)]
    for _ in range(150):
        n = int(rng.integers(2, 6))
        lo = int(rng.integers(1, 4))
        hi = lo + int(rng.integers(1, 6))
        pl = build_planner(PlannerConfig(strategy="knapsack", min_samples_per_prompt=lo, max_samples_per_prompt=hi,
                                         min_observations=4), uids, 4, n, 64, 0)
        m = int(rng.integers(1, 5))
        chosen = [str(u) for u in rng.choice(uids, m, replace=False)]
        for u in chosen:
            if rng.random() < 0.8:
                k = int(rng.integers(4, 9))
                pl.estimator.update(pl.index[u], int(rng.choice([0, k, int(rng.integers(0, k + 1))])), k)
        budget = int(rng.integers(1, 8 * m + 4))
        st = StepState(step=0, budget=budget)
        out = pl.allocator.allocate(pl, chosen, budget, st)
        a = pl.allocator
        assert len(out) == m and all(isinstance(x, int) for x in out)
        assert all(x == 0 or a.min_n <= x <= a.max_n for x in out), (out, a.min_n, a.max_n)
        idx = pl.indices(chosen)
        p, cnt = pl.estimator.mean(idx), pl.estimator.count(idx)
        unseen = cnt < 4
        fixed = int(np.sum(np.where(unseen, a.unseen_n, 0)) + np.sum(~unseen & ((p <= 1e-9) | (p >= 1 - 1e-9))) * a.min_n)
        mixed = ~unseen & (p > 1e-9) & (p < 1 - 1e-9)
        if fixed + a.min_n * int(mixed.sum()) <= budget:
            assert sum(out) <= budget, (out, budget)
        assert all(out[i] > 0 for i in range(m) if not mixed[i])  # unseen / extremes always rolled out
        for i in range(m):
            if not unseen[i] and p[i] >= 1 - 1e-9:
                assert out[i] == a.min_n
        floor = min(a.min_n + 1, a.max_n)
        mi = np.flatnonzero(mixed)
        left = budget - fixed
        zero = ~unseen & (p <= 1e-9)
        need = sum(max(floor, needed_samples(float(p[i]), a.max_n)) for i in mi)
        if len(mi) and left >= floor * len(mi) and not (need <= left and zero.any()):
            # the DP's share: no feasible choice of options in [floor, max_n] is worth more
            opts = range(floor, a.max_n + 1)
            best = max(sum(informative_value(p[i], c) for i, c in zip(mi, ch))
                       for ch in itertools.product(opts, repeat=len(mi)) if sum(ch) <= left)
            got = sum(informative_value(p[i], out[i]) for i in mi)
            assert got == pytest.approx(best, rel=1e-9), (out, p, budget)


# ------------------------------------------------------------------ selectors


def _greso_reference_select(sel, pl, k: int, st: StepState) -> list[str]:
    """GRESO's skip loop as first written (pl.take(1, extra=chosen + passed) per draw): the decisions the
    linear loop must reproduce exactly."""
    chosen: list[str] = []
    passed: list[str] = []
    for _ in range(pl.pool_size):
        if len(chosen) >= k:
            break
        got = pl.take(1, st, extra=chosen + passed)
        if not got:
            break
        uid = got[0]
        if pl.rng.random() < sel.keep_probability(pl.index[uid]):
            chosen.append(uid)
        else:
            passed.append(uid)
            st.skipped += 1
    return chosen


def _greso_pair(rng: np.random.Generator):
    size = int(rng.integers(2, 30))
    uids = [f"u{i}" for i in range(size)]
    cool = int(rng.choice([0, 0, 1, 2]))
    seed = int(rng.integers(1000))
    init = float(rng.random()) * 0.9 + 0.05
    pls = [build_planner(PlannerConfig(strategy="greso", revisit_cooldown=cool, greso_explore_init=init), uids, 4, 2,
                         64, seed) for _ in range(2)]
    z_easy = rng.integers(0, 4, size) * (rng.random(size) < 0.6)
    z_hard = rng.integers(0, 4, size) * (z_easy == 0)
    cursor = int(rng.integers(0, size))
    epoch = int(rng.integers(0, 3))
    trained = {u: int(rng.integers(-3, 3)) for u in uids if rng.random() < 0.5}
    flight = {u for u in uids if rng.random() < 0.15}
    pre = [u for u in uids if rng.random() < 0.15]
    for pl in pls:
        pl.selector.z_easy[:] = z_easy
        pl.selector.z_hard[:] = z_hard
        pl.stream.load_state_dict({"epoch": epoch, "cursor": cursor})
        pl.trained_at = dict(trained)
        pl.in_flight = set(flight)
    return pls, pre, size


@pytest.mark.filterwarnings("ignore:planner.revisit_cooldown")  # small pools with a cooldown, on purpose
def test_greso_linear_skip_loop_makes_the_decisions_of_the_per_draw_take() -> None:
    """The skip loop no longer rebuilds the set of prompts it passed on every draw; on random pools, histories,
    cooldowns, prompts in flight, groups already in the step and stream positions, it keeps and skips the same
    prompts, reads the stream and the random generator as far, and counts the same skips."""
    rng = np.random.default_rng(21)
    for _ in range(300):
        (new, old), pre, size = _greso_pair(rng)
        k = int(rng.integers(0, size + 2))
        sts = [StepState(step=int(rng.integers(0, 4)), budget=8) for _ in range(2)]
        sts[1].step = sts[0].step
        for st, pl in zip(sts, (new, old)):
            for u in pre:
                st.groups[u] = Group(u, pl.index[u])
        got = new.selector.select(new, k, sts[0])
        want = _greso_reference_select(old.selector, old, k, sts[1])
        assert got == want
        assert sts[0].skipped == sts[1].skipped
        assert new.stream.state_dict() == old.stream.state_dict()
        assert new.rng.random() == old.rng.random()


def test_greso_skip_loop_is_linear_in_its_skips() -> None:
    """A pool of 20,000 easy prompts kept with probability 0.01: a step looks at ~all of them to keep 150. The loop
    asked pl.take for one prompt at a time with every prompt looked at so far as `extra`, which take copies: ~1e8
    copied entries (seconds a step). Counted, not timed: the entries handed to take over the whole step stay
    below the pool's size."""
    size = 20000
    pl = build_planner(PlannerConfig(strategy="greso"), [f"u{i}" for i in range(size)], 150, 2, 64, 0)
    pl.selector.z_easy[:] = 50
    st = StepState(step=0, budget=300)
    copied = []
    take = pl.take

    def counting_take(k, st, extra=None, need=None):
        copied.append(len(extra or ()))
        return take(k, st, extra=extra, need=need)

    pl.take = counting_take
    chosen = pl.selector.select(pl, 150, st)
    assert len(chosen) == len(set(chosen)) and st.skipped + len(chosen) > 10000
    assert sum(copied) < size, sum(copied)


def test_greso_keeps_prompts_at_its_documented_rates() -> None:
    """Keep probability max(p^z, 0.01), easy checked first; no history: always kept. Measured over many steps on a
    pool whose prompts have z_easy, z_hard in 0..3."""
    uids = [f"u{i}" for i in range(12)]
    pl = build_planner(PlannerConfig(strategy="greso", greso_explore_init=0.6), uids, 12, 2, 64, 3)
    sel = pl.selector
    rng = np.random.default_rng(3)
    sel.z_easy[:] = rng.integers(0, 4, 12)
    sel.z_hard[:] = rng.integers(0, 4, 12)
    sel.p_hard = 0.3
    kept = np.zeros(12)
    trials = 3000
    for step in range(trials):
        st = StepState(step=step, budget=24)
        for u in sel.select(pl, 12, st):
            kept[pl.index[u]] += 1
        pl.stream.epoch, pl.stream.cursor = pl.stream.epoch, 0  # each step looks at the whole pool once
    for i in range(12):
        want = (max(0.6 ** sel.z_easy[i], 0.01) if sel.z_easy[i] else max(0.3 ** sel.z_hard[i], 0.01)
                if sel.z_hard[i] else 1.0)
        assert sel.keep_probability(i) == pytest.approx(want)
        assert kept[i] / trials == pytest.approx(want, abs=4 * math.sqrt(want * (1 - want) / trials) + 1e-9)


@pytest.mark.parametrize("strategy", ["uniform", "greso", "mopps", "vade", "adaptive", "dapo"])
def test_selectors_return_unused_distinct_prompts(strategy: str) -> None:
    rng = np.random.default_rng(sum(map(ord, strategy)) + 1)
    for case in range(25):
        uids = POOLS["tasks" if case % 2 else "plain"][: int(rng.integers(2, 25))]
        pl = build_planner(PlannerConfig(strategy=strategy, revisit_cooldown=int(rng.choice([0, 1]))), uids,
                           int(rng.integers(1, 8)), 4, 64, case)
        for step in range(6):
            pl.in_flight = {u for u in uids if rng.random() < 0.1}
            reqs = pl.begin_step(step)
            st = pl._st
            while reqs:
                names = [q.uid for q in reqs]
                assert len(set(names)) == len(names) and not set(names) & pl.in_flight
                reqs = pl.observe([GroupResult(q.uid, [float(rng.random() < 0.5) for _ in range(q.n)], [5] * q.n)
                                   for q in reqs])
            assert not set(st.groups) & pl.in_flight
            pl.end_step()


def test_stratified_top_and_apportion_on_random_candidates() -> None:
    rng = np.random.default_rng(4)
    for _ in range(300):
        tasks = ["a", "b", "c", "d"][: int(rng.integers(1, 5))]
        cands = [f"{rng.choice(tasks)}:{i}" for i in range(int(rng.integers(2, 30)))]
        k = int(rng.integers(1, len(cands)))
        score = rng.random(len(cands))
        keep = stratified_top(cands, score, k, rng)
        assert len(keep) == k and len(set(keep.tolist())) == k
        by_task: dict[str, list[int]] = {}
        for i, u in enumerate(cands):
            by_task.setdefault(u.split(":")[0], []).append(i)
        for members in by_task.values():
            share = k * len(members) / len(cands)
            mine = [i for i in keep if i in members]
            assert math.floor(share) <= len(mine) <= math.ceil(share)
            if mine:  # the best-scored of the task
                assert min(score[mine]) >= max(score[[i for i in members if i not in mine]], default=-1)
        exact = rng.random(int(rng.integers(1, 7))) * 5
        exact = exact * (round(exact.sum()) / exact.sum()) if round(exact.sum()) else exact
        q = apportion(exact, rng)
        assert q.sum() == round(exact.sum()) and np.all(q >= np.floor(exact)) and np.all(q <= np.floor(exact) + 1)
    # each quota's expectation is its exact share (systematic sampling over the remainders)
    exact = np.array([0.3, 1.7, 2.25, 0.75])
    mean = np.mean([apportion(exact, rng) for _ in range(4000)], axis=0)
    assert mean == pytest.approx(exact, abs=0.03)


def test_filter_trains_on_informative_groups_and_back_fills_until_the_target() -> None:
    rng = np.random.default_rng(9)
    for case in range(40):
        uids = [f"q{i}" for i in range(int(rng.integers(2, 30)))]
        rates = {u: float(rng.choice([0.0, 1.0, 0.5])) for u in uids}
        pps, rounds_max = int(rng.integers(1, 6)), int(rng.integers(1, 5))
        pl = build_planner(PlannerConfig(strategy="dapo", dapo_max_rounds=rounds_max,
                                         dapo_oversample=float(rng.choice([1.0, 2.0]))), uids, pps, 4, 64, case)
        for step in range(4):
            reqs, rounds, asked = pl.begin_step(step), 0, []
            while reqs:
                rounds += 1
                asked += [q.uid for q in reqs]
                reqs = pl.observe([GroupResult(q.uid, [float(rng.random() < rates[q.uid]) for _ in range(q.n)],
                                               [5] * q.n) for q in reqs])
            st = pl._st
            out = pl.end_step()
            good = [g.uid for g in st.informative_groups()]
            assert len(asked) == len(set(asked)) and rounds <= rounds_max
            assert out.train == good[:pps]
            assert out.discarded_rollouts == sum(g.n for g in st.groups.values() if g.uid not in out.train)
            if len(good) < pps:  # stopped short: the round limit, or no prompt left unused this step
                assert rounds == rounds_max or len(asked) == len(uids), (rounds, asked)
                assert out.notes
            else:
                assert not out.notes


# ------------------------------------------------------------------ repair


def test_replay_names_only_trained_all_wrong_groups_of_prompts_solved_in_an_earlier_step() -> None:
    rng = random.Random(2)
    for _ in range(100):
        size = rng.randint(1, 8)
        rep = ReplayRepair(size)
        solved: set[int] = set()
        for step in range(6):
            st = StepState(step=step, budget=8)
            for i in rng.sample(range(size), rng.randint(0, size)):
                g = Group(f"u{i}", i)
                n = rng.randint(1, 4)
                g.rewards = [float(rng.random() < 0.3) for _ in range(n)]
                g.successes = int(sum(r >= 0.5 for r in g.rewards))
                g.requested = n
                st.groups[g.uid] = g
            train = [u for u in st.groups if rng.random() < 0.7]
            got = rep.choose(st, train)
            want = [u for u in train if st.groups[u].successes == 0 and st.groups[u].idx in solved]
            assert got == want
            rep.after_step(st)
            solved |= {g.idx for g in st.groups.values() if g.successes > 0}
            again = ReplayRepair(size)
            again.load_state_dict(rep.state_dict())
            assert again.has_correct.tolist() == rep.has_correct.tolist()


# ------------------------------------------------------------------ allocators' own rules


def test_dars_extra_rollouts_follow_the_formula() -> None:
    """Delta-n = ceil((goal - N S) / S), S = 2a(1-a), a = 0 taken as 0.5/N, goal N/2 (et) or 2(1-a) N/2 (hw), capped at
    N_max - N; none at a >= 1/2. Worked values at N = 8: a = 0 -> 24 / 56, a = 1/8 -> 11 / 24."""
    for schedule, cap in (("et", 32), ("hw", 64)):
        pl = build_planner(PlannerConfig(strategy="dars", dars_schedule=schedule), ["a"], 1, 8, 64, 0)
        al = pl.allocator
        assert al.max_n == cap
        assert (al.extra(0, 8), al.extra(1, 8)) == ((24, 11) if schedule == "et" else (56, 24))
        for k in range(1, 20):
            for s in range(k + 1):
                a = s / k
                if a >= 0.5:
                    assert al.extra(s, k) == 0
                    continue
                a = max(a, 0.5 / k)
                S = 2 * a * (1 - a)
                goal = k / 2 if schedule == "et" else 2 * (1 - a) * k / 2
                want = min(max(0, math.ceil(round((goal - k * S) / S, 9))), max(cap - k, 0))
                assert al.extra(s, k) == want, (schedule, s, k)


def test_dars_second_round_asks_nothing_when_the_first_spent_past_the_budget() -> None:
    """A first round over the budget (left < 0) with no group below accuracy 1/2: the scaling divided 0 by 0, a NaN
    cast to int64 (a RuntimeWarning, and a count numpy leaves to the platform: INT64_MIN on x86)."""
    import warnings

    pl = build_planner(PlannerConfig(strategy="dars", budget_rollouts=3), ["a", "b"], 1, 4, 64, 0)
    reqs = pl.begin_step(0)
    assert sum(q.n for q in reqs) == 4  # one group of 4 on a budget of 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        more = pl.observe([GroupResult(q.uid, [1.0] * q.n, [5] * q.n) for q in reqs])
    assert more == []


def test_e3_allocation_on_random_ranks() -> None:
    """n_i within the epoch's window [n_min, n_max], the budget spent up to what the window allows, and a harder
    prompt never given fewer samples than an easier one."""
    rng = np.random.default_rng(13)
    uids = [f"q{i}" for i in range(10)]
    for _ in range(300):
        n = int(rng.integers(2, 10))
        pl = build_planner(PlannerConfig(strategy="e3"), uids, 4, n, 64, 0)
        for u in uids:
            if rng.random() < 0.7:
                k = int(rng.integers(1, 9))
                pl.estimator.update(pl.index[u], int(rng.integers(0, k + 1)), k)
        pl.stream.epoch = int(rng.integers(0, 5))
        m = int(rng.integers(1, 8))
        chosen = [str(u) for u in rng.choice(uids, m, replace=False)]
        budget = int(rng.integers(1, 3 * n * m))
        out = pl.allocator.allocate(pl, chosen, budget, StepState(step=0, budget=budget))
        lo, hi = pl.allocator.window(pl.stream.epoch)
        assert (lo, hi) == (max(pl.allocator.lo, min(n, pl.allocator.hi) - 2 * pl.stream.epoch),
                            min(pl.allocator.hi, max(n, pl.allocator.lo) + 2 * pl.stream.epoch))
        assert all(isinstance(x, int) for x in out) and len(out) == m
        if budget < lo * m:
            assert sorted(set(out)) in ([lo], [0, lo]) and sum(out) <= max(budget, lo)
            continue
        assert all(lo <= x <= hi for x in out) and sum(out) <= budget, (out, lo, hi, budget)
        r = pl.allocator.ranks[pl.indices(chosen)]
        if r.sum() > 0:
            assert sum(out) == min(budget, hi * m) or all(x == hi for x in out if x) or sum(out) == budget
            for i, j in itertools.permutations(range(m), 2):
                if r[i] > r[j]:
                    assert out[i] >= out[j], (out, r)


def _sequences(pl, rng: np.random.Generator, rates: dict, steps: int = 6):
    """Run steps; per step, per uid, the sizes of its requests in order and its rewards per request."""
    for step in range(steps):
        reqs = pl.begin_step(step)
        seq: dict[str, list[int]] = {}
        rew: dict[str, list[list[float]]] = {}
        while reqs:
            results = []
            for q in reqs:
                seq.setdefault(q.uid, []).append(q.n)
                r = [float(rng.random() < rates[q.uid]) for _ in range(q.n)]
                rew.setdefault(q.uid, []).append(r)
                results.append(GroupResult(q.uid, r, [5] * q.n))
            reqs = pl.observe(results)
        st = pl._st
        yield st, seq, rew
        pl.end_step()


def test_staged_allocator_continues_only_by_its_rule() -> None:
    rng = np.random.default_rng(17)
    uids = [f"q{i}" for i in range(16)]
    for case in range(60):
        n = int(rng.integers(2, 8))
        rule = str(rng.choice(["until_correct", "while_informative"]))
        stages = int(rng.integers(1, 5))
        pl = build_planner(PlannerConfig(strategy="ar3po", ar3po_stages=stages, staged_rule=rule), uids,
                           int(rng.integers(1, 6)), n, 64, case)
        k = pl.allocator.k
        rates = {u: float(rng.choice([0.0, 1.0, rng.random()])) for u in uids}
        for st, seq, rew in _sequences(pl, rng, rates):
            assert sum(map(sum, seq.values())) <= max(st.budget, k * len(seq))
            for u, sizes in seq.items():
                assert all(s == k for s in sizes) and len(sizes) <= stages
                for j in range(1, len(sizes)):  # asked again: the rule held after the earlier stages
                    so_far = [x for part in rew[u][:j] for x in part]
                    if rule == "until_correct":
                        assert sum(so_far) == 0, (u, rew[u])
                    else:
                        assert len(so_far) > 1 and max(so_far) != min(so_far), (u, rew[u])


def test_screen_allocator_probes_tops_up_and_grows_by_its_rules() -> None:
    rng = np.random.default_rng(19)
    uids = [f"t{i % 3}:{i}" for i in range(18)]
    for case in range(60):
        n = int(rng.integers(3, 9))
        probe = int(rng.integers(1, n))
        eager = bool(rng.random() < 0.5)
        hi = n + int(rng.integers(0, 2 * n))
        pl = build_planner(PlannerConfig(strategy="adaptive", screen_size=probe, max_samples_per_prompt=hi,
                                         screen_growth="eager" if eager else "stages"), uids,
                           int(rng.integers(1, 7)), n, 64, case)
        rates = {u: float(rng.choice([0.0, 1.0, rng.random()])) for u in uids}
        for st, seq, rew in _sequences(pl, rng, rates, steps=8):
            first = sum(s[0] for s in seq.values())
            assert sum(map(sum, seq.values())) <= max(st.budget, first)
            for u, sizes in seq.items():
                assert sizes[0] in (probe, n) and sum(sizes) <= hi
                flat = [x for part in rew[u] for x in part]
                if sizes[0] == probe < n:  # a probe: topped up to n only if it surprised the belief
                    p, easy = rew[u][0], pl.allocator.believed_easy[u]
                    surprised = len(set(p)) > 1 or (min(p) < 0.5 if easy else max(p) >= 0.5)
                    if len(sizes) > 1:
                        assert surprised, (u, easy, p)
                        assert sizes[1] == n - probe if not eager else sizes[1] >= n - probe
                    else:  # a surprise left at its probe only when the budget refused the top-up
                        assert not surprised or u in pl.allocator.refused, (u, easy, p)
                if not eager:
                    for j in range(1 if sizes[0] == n else 2, len(sizes)):  # growth: by n/2 while informative
                        so_far = [x for part in rew[u][:j] for x in part]
                        assert sizes[j] <= max(1, n // 2) and max(so_far) != min(so_far), (u, sizes, rew[u])
                assert len(flat) == sum(sizes)


def test_estimator_state_round_trips_and_window_refits_keep_the_newest() -> None:
    rng = np.random.default_rng(23)
    for _ in range(80):
        size = int(rng.integers(1, 5))
        ests = _random_estimators(size, rng)
        slots: list[list[float]] = [[] for _ in range(size)]
        for _ in range(int(rng.integers(0, 10))):
            i, n = int(rng.integers(size)), int(rng.integers(1, 10))
            s = int(rng.integers(0, n + 1))
            for e in ests:
                e.update(i, s, n)
            slots[i] += [s / n] * min(n, ests[2].window)
        idx = np.arange(size)
        for e in ests:
            again = type(e)(size, *([e.window] if hasattr(e, "window") else []))
            if isinstance(e, BetaEstimator):
                again = BetaEstimator(size, e.decay)
            if isinstance(e, TwoScaleBetaEstimator):
                again = TwoScaleBetaEstimator(size, e.fast.decay, e.slow.decay, e.w)
            again.load_state_dict(e.state_dict())
            assert again.mean(idx) == pytest.approx(e.mean(idx)) and again.count(idx) == pytest.approx(e.count(idx))
        old = ests[2]
        for w2 in range(1, 10):
            new = WindowEstimator(size, w2)
            new.load_state_dict(old.state_dict())
            for i in range(size):
                kept = slots[i][-old.window:][-w2:]
                assert new.mean(np.array([i]))[0] == pytest.approx(float(np.mean(kept)) if kept else 0.5)
                assert new.count(np.array([i]))[0] == len(kept)
