"""Allocators: how many samples each selected prompt gets, and extra rounds within a step.

- `FixedAllocator`: num_generations each (GRPO).
- `KnapsackAllocator` (Knapsack-RL): exact multiple-choice knapsack over n in [min, max] with
  value [1 - p^n - (1-p)^n] * p(1-p)^2 under the step budget; unseen prompts get the default n;
  p=0 and p=1 prompts get the minimum; if every mixed prompt's "needed" n fits, the surplus is
  spread over p=0 prompts.
- `StagedAllocator` (AR3PO): stages of k samples; a prompt stops once it has a correct one
  (or, with staged_rule=while_informative, continues only while its group is informative).
- `HardnessAllocator` (DARS): a second round adds Delta-n to prompts with accuracy < 0.5
  (equal-treatment or hardness-weighted schedule), scaled to the remaining budget.
- `RankAllocator` (E3): n_i = n_min + (B - P*n_min) * r_i / sum(r), remainder to the hardest.
- `ScreenAllocator` (ours): a prompt whose belief expects an all-equal group gets a small
  probe first and the full group only if the probe surprises the belief; informative groups
  grow by stages of n/2 while they stay informative; with stratify_rollouts a task's growth
  stops at its share of the step budget.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from rollwise.planner.base import Request, task_of
from rollwise.planner.estimators import rank_by_mean
from rollwise.planner.knapsack import informative_value, needed_samples, solve_mckp
from rollwise.planner.step import StepState

if TYPE_CHECKING:
    from rollwise.planner.core import ComposedPlanner


class Allocator:
    name = "fixed"
    # True when `more` decides each group from that group alone (plus the budget left), so it can
    # be asked whenever any group finishes while others still run (rollout.overlap_rounds). A
    # subclass that overrides `more` must say so; one that does not has nothing to decide.
    per_group = False
    asks_more = True  # False when an instance never asks for more (its `more` always returns [])
    ema = 0.2

    def __init__(self, cfg: Any, n: int):
        self.cfg = cfg
        self.n = n
        self.cost_per_prompt = float(n)  # running mean of rollouts spent per selected prompt

    def prompts_for(self, budget: int) -> int:
        return max(1, int(budget // max(self.cost_per_prompt, 1.0)))

    def allocate(self, pl: ComposedPlanner, uids: list[str], budget: int, st: StepState) -> list[int]:
        return [self.n] * len(uids)

    def more(self, pl: ComposedPlanner, st: StepState) -> list[Request]:
        return []

    def carried(self, budget: int) -> list[str]:
        """Prompts this allocator asks to roll out this step, within `budget` rollouts, before the
        selector chooses the rest."""
        return []

    def after_step(self, pl: ComposedPlanner, st: StepState) -> dict[str, float] | None:
        """Hook after each step; fixed allocators keep no state. May return metrics of what it decided
        (added to the step's metrics)."""

    def metrics(self) -> dict[str, float]:
        """The step's allocator metrics (read before after_step)."""
        return {}

    def _track_cost(self, st: StepState, skip: set[str] | None = None, unmet: int = 0) -> None:
        """Move cost_per_prompt toward the rollouts this step requested per prompt it started, leaving out
        the groups in `skip` (next_step's carried ones, charged before the selector plans) and samples
        adopted from an earlier step (partial rollouts: charged there; a group still out counts its
        request, not the nothing it has delivered yet). A follow-up for an adopted group counts in the
        rollouts, but the group is no prompt started this step. `unmet`: rollouts the step's prompts asked for
        and the budget refused (the screen allocator's top-ups): counted, or a step that starts too many
        prompts to top up their surprising probes would plan the next one as cheap again."""
        groups = [g for u, g in st.groups.items() if not (skip and u in skip)]
        started = sum(1 for g in groups if g.adopted == 0 and g.requested > 0)  # an adopted group's top-up starts none
        if started:
            spent = sum(g.requested - g.adopted for g in groups) + unmet
            self.cost_per_prompt = (1 - self.ema) * self.cost_per_prompt + self.ema * spent / started

    def state_dict(self) -> dict[str, Any]:
        return {"cost_per_prompt": self.cost_per_prompt, "n": self.n}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # the cost was measured in the saved group size: a resume that changes rollout.num_generations
        # scales it (a fixed allocator's cost is its group size; it kept the old one for the rest of the run)
        saved_n = state.get("n", self.n)  # older checkpoints: the size unknown, taken as unchanged
        cost = float(state.get("cost_per_prompt", saved_n))
        # unchanged size: the saved value as is (x * n / n can differ from x in its last digit)
        self.cost_per_prompt = cost if saved_n == self.n else cost * self.n / saved_n


FixedAllocator = Allocator


class KnapsackAllocator(Allocator):
    name = "knapsack"

    def __init__(self, cfg: Any, n: int):
        super().__init__(cfg, n)
        self.min_n = cfg.min_samples_per_prompt or min(2, n)
        self.max_n = cfg.max_samples_per_prompt or 16 * n  # Knapsack RL's max_n=128 at n=8
        self.unseen_n = min(max(n, self.min_n), self.max_n)  # what a prompt not yet observed gets
        # prompts are planned at an unseen prompt's size (the DP spreads the budget over the seen ones); planned
        # at n each, a minimum above n overspent every step while prompts were unseen
        self.cost_per_prompt = float(self.unseen_n)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass  # its cost is no running mean: it follows this run's settings (a resume may change the bounds)

    # cost units per rollout of the mean length in the token-budget DP (a sample's cost is quantised to 1/8)
    TOKEN_QUANTUM = 8

    def allocate(self, pl: ComposedPlanner, uids: list[str], budget: int, st: StepState) -> list[int]:
        """Samples per prompt under the step's budget. With a token budget (planner.budget_tokens) a sample
        of prompt i costs its expected length (its mean when last rolled out; the planner's mean length for
        one never rolled out) over the mean length, so the budget (in rollouts of the mean length) is spent
        in tokens: a long prompt's samples cost more than a short one's. With a rollout budget every sample
        costs 1."""
        idx = pl.indices(uids)
        p, cnt = pl.estimator.mean(idx), pl.estimator.count(idx)
        q = self.TOKEN_QUANTUM if pl.budget_tokens is not None else 1  # DP cost units per mean-length rollout
        w = self._sample_costs(pl, uids, q)
        out = np.zeros(len(uids), dtype=np.int64)
        unseen = cnt < self.cfg.min_observations
        out[unseen] = self.unseen_n
        zero, one = ~unseen & (p <= 1e-9), ~unseen & (p >= 1 - 1e-9)
        mixed = np.flatnonzero(~unseen & ~zero & ~one)
        out[zero | one] = self.min_n
        left = budget - float((out * w).sum())
        floor = min(self.min_n + 1, self.max_n)  # a mixed prompt: the minimum plus at least one (Knapsack RL)
        if left < floor * float(w[mixed].sum()) - 1e-9:  # over-committed: the minimum to the most valuable
            # that fit, none to the rest (a group smaller than the minimum, 1 sample, teaches nothing)
            best = mixed[np.argsort(-informative_value(p[mixed], np.full(len(mixed), self.min_n)), kind="stable")]
            for i in best:
                if self.min_n * w[i] <= left + 1e-9:
                    out[i] = self.min_n
                    left -= self.min_n * w[i]
            if not out.any() and len(best):
                out[best[0]] = self.min_n  # a budget below one minimum group still rolls out one (else no step would run)
            return out.tolist()
        need = np.array([max(floor, needed_samples(float(p[i]), self.max_n)) for i in mixed], dtype=np.int64)
        if float((need * w[mixed]).sum()) <= left + 1e-9 and zero.any():
            out[mixed] = need
            surplus = left - float((need * w[mixed]).sum())
            zi = np.flatnonzero(zero)
            extra = min(int(surplus // float(w[zi].sum()) + 1e-9), self.max_n - self.min_n)
            out[zi] += max(extra, 0)
            return out.tolist()
        options = np.arange(floor, self.max_n + 1)
        values = [informative_value(np.full(len(options), p[i]), options) for i in mixed]
        costs = [np.rint(options * w[i] * q).astype(np.int64) for i in mixed]  # w is in 1/q steps already
        chosen = solve_mckp(values, costs, int(left * q + 1e-9))
        out[mixed] = options[chosen]
        return out.tolist()

    @staticmethod
    def _sample_costs(pl: ComposedPlanner, uids: list[str], q: int) -> np.ndarray:
        """A sample's cost per prompt in rollouts of the mean length, rounded up to 1/q (the DP's units, so
        every check uses the same numbers): 1 each under a rollout budget."""
        if pl.budget_tokens is None:
            return np.ones(len(uids))
        mean = max(pl.length_estimate, 1.0)
        w = np.array([max(pl.mean_length.get(u, mean), 1.0) / mean for u in uids])
        return np.ceil(w * q - 1e-9) / q


class StagedAllocator(Allocator):
    name = "staged"
    per_group = True

    def __init__(self, cfg: Any, n: int):
        super().__init__(cfg, n)
        self.k = cfg.ar3po_stage_size or max(1, n // 2)
        self.stages = cfg.ar3po_stages
        self.cost_per_prompt = float(n)

    def allocate(self, pl: ComposedPlanner, uids: list[str], budget: int, st: StepState) -> list[int]:
        return [self.k] * len(uids)

    def more(self, pl: ComposedPlanner, st: StepState) -> list[Request]:
        left = st.budget - st.used_rollouts
        done = [g for g in st.groups.values() if not g.outstanding]
        if self.cfg.staged_rule == "while_informative":
            todo = [g for g in done if g.informative and g.rounds < self.stages]
        else:
            todo = [g for g in done if g.successes == 0 and g.rounds < self.stages]
        todo = todo[: max(0, left // self.k)]
        return [Request(g.uid, self.k) for g in todo]

    def after_step(self, pl: ComposedPlanner, st: StepState) -> None:
        self._track_cost(st)


class HardnessAllocator(Allocator):
    name = "hardness"
    per_group = False  # the second round is scaled to the budget over all groups at once

    def __init__(self, cfg: Any, n: int):
        super().__init__(cfg, n)
        self.schedule = cfg.dars_schedule
        self.max_n = cfg.max_samples_per_prompt or (4 * n if self.schedule == "et" else 8 * n)
        self.cost_per_prompt = 2.0 * n

    def extra(self, successes: int, k: int) -> int:
        """DARS's Delta-n for a group of k samples with `successes` correct."""
        a = successes / k
        if a >= 0.5:
            return 0
        a = max(a, 0.5 / k)
        s, peak = 2 * a * (1 - a), k / 2
        goal = peak if self.schedule == "et" else 2 * (1 - a) * peak
        return int(min(max(0, math.ceil((goal - k * s) / s - 1e-9)), self.max_n - k))

    def more(self, pl: ComposedPlanner, st: StepState) -> list[Request]:
        if st.rounds != 1:
            return []
        groups = list(st.groups.values())
        dn = np.array([self.extra(g.successes, g.n) if g.n else 0 for g in groups], dtype=np.int64)
        left = st.budget - st.used_rollouts
        if dn.sum() > left:  # also when the first round spent past the budget (left < 0) and no group wants more:
            # nothing is asked (0 * 0 / 0 was NaN, cast to an int64 whose value numpy leaves to the platform)
            dn = np.floor(dn * max(left, 0) / max(int(dn.sum()), 1)).astype(np.int64)
        return [Request(g.uid, int(d)) for g, d in zip(groups, dn) if d > 0]

    def after_step(self, pl: ComposedPlanner, st: StepState) -> None:
        self._track_cost(st)


class RankAllocator(Allocator):
    """E3's allocation: n_i = n_min + spare * r_i / sum(r) by difficulty rank r, the remainder to the
    hardest up to n_max. As in E3's code, the window [n_min, n_max] starts at [n, n] and widens by 2
    a side each epoch to its bounds (planner.min/max_samples_per_prompt, default n/2 and 1.5 n), and
    the ranks are computed once an epoch, from the history up to its start."""

    name = "rank"
    WIDEN = 2  # samples per side per epoch

    def __init__(self, cfg: Any, n: int):
        super().__init__(cfg, n)
        self.lo = cfg.min_samples_per_prompt or max(1, n // 2)
        self.hi = cfg.max_samples_per_prompt or n + n // 2
        self.ranks: np.ndarray | None = None  # over the pool, as of the start of epoch `rank_epoch`
        self.rank_epoch = -1

    def window(self, epoch: int) -> tuple[int, int]:
        return max(self.lo, min(self.n, self.hi) - self.WIDEN * epoch), min(self.hi, max(self.n, self.lo) + self.WIDEN * epoch)

    def allocate(self, pl: ComposedPlanner, uids: list[str], budget: int, st: StepState) -> list[int]:
        idx = pl.indices(uids)
        est = pl.estimator
        epoch = pl.stream.epoch
        if self.ranks is None or epoch != self.rank_epoch:
            pool = np.arange(pl.pool_size)
            self.ranks = est.rank(pool) if hasattr(est, "rank") else rank_by_mean(est, pool)
            self.rank_epoch = epoch
        r = self.ranks[idx]
        self.min_n, self.max_n = self.window(epoch)
        m = len(uids)
        if budget < self.min_n * m:  # the minimum to the hardest that fit (at least one: else no step would
            out = np.zeros(m, dtype=np.int64)  # ever run, as its length estimate never learns), none to the rest
            out[np.argsort(-r, kind="stable")[: max(1, budget // self.min_n)]] = self.min_n
            return out.tolist()
        if r.sum() <= 0:  # no ranks yet: n each (within the window and the budget)
            return [min(max(min(self.n, budget // m), self.min_n), self.max_n)] * m
        spare = budget - self.min_n * m
        out = np.minimum(self.min_n + np.floor(spare * r / r.sum()).astype(np.int64), self.max_n)
        left = budget - int(out.sum())
        for i in np.argsort(-r, kind="stable"):  # remainder to the hardest, up to max_n
            if left <= 0:
                break
            add = min(left, self.max_n - int(out[i]))
            out[i] += add
            left -= add
        return out.tolist()

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "rank_epoch": self.rank_epoch,
                "ranks": None if self.ranks is None else self.ranks.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.rank_epoch = int(state.get("rank_epoch", -1))
        self.ranks = None if state.get("ranks") is None else np.asarray(state["ranks"], dtype=float)


class ScreenAllocator(Allocator):
    """Screen before committing (our addition, not from a paper).

    Round 1: a prompt whose belief gives P(all n samples equal) >= screen_threshold gets a
    probe of screen_size samples; the others get n. Round 2: a probe that surprises the
    belief (a correct answer on a prompt believed hard, a wrong one on a prompt believed easy,
    or both) is topped up to n; a probe that agrees ends there, having cost screen_size
    instead of n. Later rounds: an informative group of at least n grows by n/2 while it
    stays informative, up to max_samples_per_prompt (default 2n). Top-ups and growth stay
    within the step budget; round 1 does not check it: the prompts selected per step follow
    the measured mean cost per prompt, so a step in which more prompts than usual get a full
    group spends more than its budget (the budget is a target, as for DAPO). Top-ups come
    before growth. With overlapped rounds a group is decided when its own samples are back,
    and growth leaves aside the budget that probes still out would need for their top-ups.
    """

    name = "screen"
    per_group = True

    def __init__(self, cfg: Any, n: int):
        super().__init__(cfg, n)
        self.probe = min(cfg.screen_size, n)
        self.threshold = cfg.screen_threshold
        self.max_n = cfg.max_samples_per_prompt or 2 * n
        self.stage = max(1, n // 2)
        self.believed_easy: dict[str, bool] = {}
        self.capped: dict[str, int] = {}  # uid -> growth refused this step by stratify_rollouts (once per group)
        self.deferred = cfg.screen_followup == "next_step"
        self.asks_more = not self.deferred
        self.pending: list[str] = []  # next_step: surprising probes, rolled out in full next step
        self.carried_now: list[str] = []
        self.refused: dict[str, int] = {}  # uid -> the top-up this step's budget could not give (counted as cost)

    def allocate(self, pl: ComposedPlanner, uids: list[str], budget: int, st: StepState) -> list[int]:
        idx = pl.indices(uids)
        n = self.n
        same = pl.estimator.expect(idx, lambda p: p**n + (1 - p) ** n, pl.rng)
        means = pl.estimator.mean(idx)
        out = []
        pending = set(self.carried_now)
        for uid, s, m in zip(uids, same, means):
            if s >= self.threshold and self.probe < n and uid not in pending:
                self.believed_easy[uid] = bool(m > 0.5)
                out.append(self.probe)
            else:
                out.append(n)
        return out

    def surprised(self, g: Any) -> bool:
        """A success on a prompt believed hard, a failure on one believed easy (successes by
        planner.success_threshold), or rewards that differ at all: such a group has a gradient (with a reward
        that scores in between, such as a user's continuous one, partial credit or an overlong penalty, a
        difference with no success among the samples is the only signal there is)."""
        easy = self.believed_easy.get(g.uid, False)
        return g.informative or (g.successes < g.n if easy else g.successes > 0)

    def carried(self, budget: int) -> list[str]:
        """next_step: the surprising probes of earlier steps, oldest first, as many full groups as
        the budget holds; the rest wait for a later step. None with same_step (a queue loaded from a
        next_step checkpoint is not replayed)."""
        self.carried_now = self.pending[: budget // self.n] if self.deferred else []
        return list(self.carried_now)

    def more(self, pl: ComposedPlanner, st: StepState) -> list[Request]:
        if self.deferred:
            return []
        left = st.budget - st.used_rollouts
        stratify = self.cfg.stratify_rollouts
        eager = self.cfg.screen_growth == "eager"
        cap, used = self._task_caps(st) if stratify else ({}, {})
        settled = [g for g in st.groups.values() if not g.outstanding]  # samples out: decided when back
        asked: dict[str, int] = {}
        # top-ups first: a surprising probe's one chance comes before growing any group
        for g in settled:
            if g.uid in self.believed_easy and g.n < self.n and g.rounds == 1 and self.surprised(g):
                add = self.n - g.n
                if add <= left:
                    asked[g.uid] = add
                    left -= add
                    self.refused.pop(g.uid, None)
                    if stratify:
                        used[task_of(g.uid)] += add
                else:
                    self.refused[g.uid] = add
        # then growth; with overlapped rounds, probes still out keep the budget their top-ups may need
        reserve = sum(self.n - g.requested for g in st.groups.values()
                      if g.outstanding and g.rounds == 0 and g.uid in self.believed_easy and g.requested < self.n
                      ) if pl.overlapped else 0
        for g in settled:
            # eager: a probe that is already informative grows with its top-up, in the same request
            size = g.n + asked.get(g.uid, 0) if eager else g.n
            if not (size >= self.n and g.informative):
                continue
            add, t = min(self.max_n - g.n if eager else self.stage, self.max_n - size), task_of(g.uid) if stratify else ""
            # growth_capped counts only what the task's share refused and the budget would have given
            if eager:  # as much of the growth as the budget and the task's share allow
                room = int(cap[t] - used[t]) if stratify else add
                affordable = max(0, min(add, left - reserve))
                grant = max(0, min(affordable, room))
                if stratify and affordable > grant:
                    self.capped.setdefault(g.uid, affordable - grant)
            else:
                grant = add if 0 < add <= left - reserve else 0
                if stratify and grant and used[t] + add > cap[t]:  # growth stops at the task's share
                    self.capped.setdefault(g.uid, add)
                    grant = 0
            if grant > 0:
                asked[g.uid] = asked.get(g.uid, 0) + grant
                left -= grant
                if stratify:
                    used[t] += grant
        return [Request(uid, k) for uid, k in asked.items()]

    @staticmethod
    def _task_caps(st: StepState) -> tuple[dict[str, float], dict[str, int]]:
        """Each task's share of the step budget (its share of the step's prompts) and its spending."""
        count: dict[str, int] = {}
        used: dict[str, int] = {}
        for g in st.groups.values():
            t = task_of(g.uid)
            count[t] = count.get(t, 0) + 1
            used[t] = used.get(t, 0) + g.requested
        total = sum(count.values())
        return {t: st.budget * c / total for t, c in count.items()}, used

    def metrics(self) -> dict[str, float]:
        m = {"planner/growth_capped": float(sum(self.capped.values()))} if self.cfg.stratify_rollouts else {}
        if self.deferred:
            m["planner/carried"] = float(len(self.carried_now))
        return m

    def after_step(self, pl: ComposedPlanner, st: StepState) -> dict[str, float] | None:
        out = None
        if self.deferred:
            # a waiting prompt the selector rolled out this step has its new evidence: it leaves the queue
            # (and comes back below if its new probe surprised too)
            waiting = [u for u in self.pending[len(self.carried_now):] if u not in st.groups]
            new = [g.uid for g in st.groups.values()
                   if g.uid in self.believed_easy and g.n < self.n and self.surprised(g)]
            queue = waiting + [u for u in new if u not in set(waiting)]
            # at most one step's full groups wait: older follow-ups are stale, and a step budget below a
            # full group could never serve one
            dropped = max(0, len(queue) - st.budget // self.n)
            self.pending = queue[dropped:]
            self._track_cost(st, skip=set(self.carried_now))
            self.carried_now = []
            out = {"planner/followups_dropped": float(dropped)}
        else:
            self._track_cost(st, unmet=sum(self.refused.values()))
            # surprising probes left at their probe's size: the top-ups the step's budget could not give
            out = {"planner/refused_topups": float(len(self.refused)),
                   "planner/refused_rollouts": float(sum(self.refused.values()))}
        self.refused.clear()
        # a probe still out (partial rollouts) keeps its belief for the step it comes back in (adopt), however
        # many steps that takes
        self.believed_easy = {u: v for u, v in self.believed_easy.items()
                              if (u in st.groups and st.groups[u].outstanding) or (u not in st.groups and u in pl.in_flight)}
        self.capped.clear()
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "pending": list(self.pending), "believed_easy": dict(self.believed_easy)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.pending = list(state.get("pending", [])) if self.deferred else []
        self.believed_easy = {u: bool(v) for u, v in state.get("believed_easy", {}).items()}


ALLOCATORS: dict[str, type[Allocator]] = {
    "fixed": FixedAllocator, "knapsack": KnapsackAllocator, "staged": StagedAllocator, "hardness": HardnessAllocator,
    "rank": RankAllocator, "screen": ScreenAllocator}


def make_allocator(name: str, cfg: Any, n: int) -> Allocator:
    if name not in ALLOCATORS:
        raise ValueError(f"unknown allocator '{name}'; allowed: {', '.join(ALLOCATORS)}")
    return ALLOCATORS[name](cfg, n)
