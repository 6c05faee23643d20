"""Selectors: which prompts a step rolls out, and (for filter-and-backfill) which it trains on.

- `AllSelector`: the next k prompts of the stream (uniform, TRL).
- `SkipSelector` (GRESO): skip a prompt whose last z visits were all-correct (all-wrong) with
  probability 1 - max(p_easy^z, 0.01) (p_hard^z); p_easy/p_hard adapt each step toward a
  zero-variance target split 1/3 easy, 2/3 hard.
- `PosteriorSelector` (MoPPS / VADE): score a candidate pool of factor*k prompts with a
  Thompson draw from the estimator; keep the top k.
- `FilterSelector` (DAPO): over-sample, drop groups with equal rewards, back-fill with new
  prompts until k informative groups or the round limit; then train on what there is.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from rollwise.planner.base import task_of
from rollwise.planner.knapsack import informative_value
from rollwise.planner.step import StepState

if TYPE_CHECKING:
    from rollwise.planner.core import ComposedPlanner


class Selector:
    name = "all"
    # True when `more` can be asked whenever any group finishes (rollout.overlap_rounds); a
    # subclass that overrides `more` must say so
    per_group = False

    def select(self, pl: ComposedPlanner, k: int, st: StepState) -> list[str]:
        return pl.take(k, st)

    def more(self, pl: ComposedPlanner, st: StepState) -> list[str]:
        """New prompts for another round (back-fill); [] when done."""
        return []

    def finalize(self, pl: ComposedPlanner, st: StepState) -> list[str]:
        """The uids to train on; the rest of the step's groups are discarded."""
        return list(st.groups)

    def after_step(self, pl: ComposedPlanner, st: StepState) -> None:
        """Hook after each step; the plain selector keeps no state."""

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore."""


AllSelector = Selector


class SkipSelector(Selector):
    name = "skip"

    def __init__(self, size: int, cfg: Any):
        self.cfg = cfg
        self.z_easy = np.zeros(size, dtype=np.int64)
        self.z_hard = np.zeros(size, dtype=np.int64)
        self.p_easy = float(cfg.greso_explore_init)
        self.p_hard = float(cfg.greso_explore_init)

    def keep_probability(self, idx: int) -> float:
        """Probability of rolling prompt `idx` out (1 - skip probability)."""
        if self.z_easy[idx] > 0:
            return max(self.p_easy ** int(self.z_easy[idx]), 0.01)
        if self.z_hard[idx] > 0:
            return max(self.p_hard ** int(self.z_hard[idx]), 0.01)
        return 1.0

    def select(self, pl: ComposedPlanner, k: int, st: StepState) -> list[str]:
        chosen: list[str] = []
        # every prompt this step has looked at (kept or skipped: a skipped one is not drawn again when the
        # stream wraps into the next epoch), the step's groups and those still in flight; kept up to date
        # draw by draw, not rebuilt for each (pl.take(1, extra=chosen + skipped) copied it every draw:
        # quadratic in the skips, thousands a step on a large pool of easy prompts)
        looked = set(st.groups) | pl.in_flight
        for _ in range(pl.pool_size):
            if len(chosen) >= k:
                break
            got = pl.take_unused(1, st, looked)
            if not got:
                break
            uid = got[0]
            looked.add(uid)
            if pl.rng.random() < self.keep_probability(pl.index[uid]):
                chosen.append(uid)
            else:
                st.skipped += 1
        return chosen

    def after_step(self, pl: ComposedPlanner, st: StepState) -> None:
        c = self.cfg
        easy = hard = 0
        # a group with no result yet (carried to the next step by partial rollouts) is counted when it comes
        # back; counted now it would look all-wrong, once now and again then
        seen = [g for g in st.groups.values() if g.n > 0]
        for g in seen:
            m = g.successes / g.n
            if m >= c.greso_easy_threshold:
                self.z_easy[g.idx] += 1
                self.z_hard[g.idx] = 0
                easy += 1
            elif m <= c.greso_hard_threshold:
                self.z_hard[g.idx] += 1
                self.z_easy[g.idx] = 0
                hard += 1
            else:
                self.z_easy[g.idx] = self.z_hard[g.idx] = 0
        if pl.stream.epoch < 1 or not seen:
            return
        n = len(seen)
        t_easy, t_hard = c.greso_zero_variance_target / 3, c.greso_zero_variance_target * 2 / 3
        step, lo, hi = c.greso_explore_step, c.greso_explore_min, c.greso_explore_max
        self.p_easy = float(np.clip(self.p_easy + (-step if easy / n >= t_easy else step), lo, hi))
        self.p_hard = float(np.clip(self.p_hard + (-step if hard / n >= t_hard else step), lo, hi))

    def metrics(self) -> dict[str, float]:
        return {"planner/greso_p_easy": self.p_easy, "planner/greso_p_hard": self.p_hard}

    def state_dict(self) -> dict[str, Any]:
        return {"z_easy": self.z_easy.tolist(), "z_hard": self.z_hard.tolist(), "p_easy": self.p_easy,
                "p_hard": self.p_hard, "bounds": [self.cfg.greso_explore_min, self.cfg.greso_explore_max]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.z_easy = np.asarray(state["z_easy"], dtype=np.int64)
        self.z_hard = np.asarray(state["z_hard"], dtype=np.int64)
        lo, hi = self.cfg.greso_explore_min, self.cfg.greso_explore_max  # a resume may narrow them
        p = [float(state[k]) for k in ("p_easy", "p_hard")]
        # kept as saved under unchanged bounds: an explore_init outside them holds until the first adaptation,
        # as in the run not interrupted (older checkpoints, without bounds: clipped)
        if state.get("bounds") != [lo, hi]:
            p = [min(hi, max(lo, v)) for v in p]
        self.p_easy, self.p_hard = p


class PosteriorSelector(Selector):
    """score="target": -(p~ - target)^2 (MoPPS). score="info": the expected GRPO signal
    [1 - p~^n - (1-p~)^n] * p~(1-p~)^2 (our reading of VADE's information-gain score).
    score="expected": expected_signal averaged over the belief. With planner.revisit_discount = d < 1
    a prompt trained on k times scores d^k of its score. With planner.score_per_token the score is
    divided by the prompt's expected response length (ComposedPlanner.length_weights)."""

    name = "posterior"

    def __init__(self, cfg: Any, score: str = "target", stratify: bool = False):
        self.cfg = cfg
        self.score = score
        self.stratify = stratify

    def select(self, pl: ComposedPlanner, k: int, st: StepState) -> list[str]:
        cands = pl.take(math.ceil(self.cfg.candidate_factor * k), st, need=k)
        if len(cands) <= k:
            return cands
        idx = pl.indices(cands)
        if self.score == "expected":
            s = pl.estimator.expect(idx, lambda p: expected_signal(p, pl.n), pl.rng)
        else:
            p = pl.estimator.sample(idx, pl.rng)
            # target: 1 - (p - target)^2 orders as MoPPS's -(p - target)^2 and is >= 0, so a discount lowers it
            s = informative_value(p, pl.n) if self.score == "info" else 1.0 - (p - self.cfg.target_solve_rate) ** 2
        if self.cfg.revisit_discount < 1.0:
            s = s * pl.revisit_weights(cands)
        if self.cfg.score_per_token:
            s = s * pl.length_weights(cands)
        keep = stratified_top(cands, s, k, pl.rng) if self.stratify else np.argsort(-s, kind="stable")[:k]
        st.skipped += len(cands) - k
        return [cands[i] for i in sorted(keep)]


def stratified_top(cands: list[str], score: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """The top-scored k candidates with each task's share of the k equal to its share of the
    candidates, so selection cannot drift away from the data mixture. A task's quota is its exact
    share k * n_task / n_candidates rounded down, plus one with probability the remainder
    (`apportion`): each task's expected quota is its exact share, also when the same candidates
    come back step after step (a pool no larger than the candidates it scores)."""
    tasks = [task_of(u) for u in cands]
    names = sorted(set(tasks))
    members = {t: [i for i, x in enumerate(tasks) if x == t] for t in names}
    quota = apportion(np.array([k * len(members[t]) / len(cands) for t in names]), rng)
    keep: list[int] = []
    for t, q in zip(names, quota):
        idx = np.array(members[t])
        keep.extend(idx[np.argsort(-score[idx], kind="stable")[:q]].tolist())
    return np.array(keep, dtype=np.int64)


def apportion(exact: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Whole quotas summing to round(sum(exact)), each floor(exact) or one more, the one more with
    probability exactly its remainder (systematic sampling over the remainders). Rounding by the
    largest remainders instead breaks ties by task name, and a task whose share is always a little
    below the others' (12 of 64 candidates against 13) would never get its extra prompt: on a pool
    of 64 prompts, five tasks and 8 prompts a step, `adaptive` gave two tasks half the prompts of
    the other three, every step (bench/RESULTS.md)."""
    quota = np.floor(exact).astype(np.int64)
    rem = exact - quota
    extra = int(round(rem.sum()))
    if extra > 0:
        edges = np.cumsum(rem) * (extra / rem.sum())  # the last edge is `extra`, up to rounding
        # one point in each unit interval of [0, extra): a draw within 2^-52 of 1 made j + u round up to j + 1, into
        # the next task's interval (at the last, past every task: an IndexError), so u stops 1e-12 short of 1
        points = min(rng.random(), 1.0 - 1e-12) + np.arange(extra)
        # each remainder < 1 holds at most one point; one past a last edge rounded below `extra` belongs to the
        # last task with a remainder
        last = int(np.flatnonzero(rem > 0)[-1])
        quota[np.minimum(np.searchsorted(edges, points, side="right"), last)] += 1
    return quota


def expected_signal(p: np.ndarray, n: int) -> np.ndarray:
    """Expected share of a group's n samples that carry gradient, weighted by its strength:
    4p(1-p) * [1 - p^n - (1-p)^n] (the simulator's and GRPO's per-sample signal)."""
    return 4.0 * p * (1.0 - p) * (1.0 - p**n - (1.0 - p) ** n)


class FilterSelector(Selector):
    name = "filter"
    per_group = False  # back-fill counts the informative groups of a whole round

    def __init__(self, cfg: Any):
        self.cfg = cfg

    def select(self, pl: ComposedPlanner, k: int, st: StepState) -> list[str]:
        st.target_prompts = k
        return pl.take(math.ceil(self.cfg.dapo_oversample * k), st)

    def more(self, pl: ComposedPlanner, st: StepState) -> list[str]:
        missing = st.target_prompts - len(st.informative_groups())
        if missing <= 0 or st.selector_rounds >= self.cfg.dapo_max_rounds:
            return []
        got = pl.take(math.ceil(self.cfg.dapo_oversample * missing), st)
        st.selector_rounds += bool(got)  # a round that found no prompt is the pool running out, not a round
        return got

    def finalize(self, pl: ComposedPlanner, st: StepState) -> list[str]:
        good = [g.uid for g in st.informative_groups()]
        if len(good) < st.target_prompts:
            from rollwise.planner.core import MAX_ROUNDS

            why = (f"back-fill limit reached ({st.selector_rounds} rounds, planner.dapo_max_rounds="
                   f"{self.cfg.dapo_max_rounds})" if st.selector_rounds >= self.cfg.dapo_max_rounds
                   else f"the planner's limit of {MAX_ROUNDS} rounds a step reached" if st.rounds >= MAX_ROUNDS
                   else "no unused prompts left in the pool this step")
            st.notes.append(f"dapo: {why} with {len(good)}/{st.target_prompts} informative groups; "
                            "training on what there is")
        return good[: st.target_prompts]


SELECTORS: dict[str, type[Selector]] = {"all": AllSelector, "skip": SkipSelector, "posterior": PosteriorSelector,
                                         "filter": FilterSelector}


def make_selector(name: str, size: int, cfg: Any, score: str = "target", stratify: bool = False) -> Selector:
    if name == "all":
        return AllSelector()
    if name == "skip":
        return SkipSelector(size, cfg)
    if name == "posterior":
        return PosteriorSelector(cfg, score, stratify)
    if name == "filter":
        return FilterSelector(cfg)
    raise ValueError(f"unknown selector '{name}'; allowed: all, skip, posterior, filter")
