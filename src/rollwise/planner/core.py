"""The composed planner: estimator + selector + allocator + repair behind the Planner protocol.

    requests = planner.begin_step(step)     # select prompts, allocate samples
    while requests:
        requests = planner.observe(results)  # extra stages (AR3PO, DARS) or back-fill (DAPO)
    outcome = planner.end_step()             # train / replay / discard; beliefs updated

Budget: `budget_rollouts` per step, or `budget_tokens` per step converted to rollouts with a
running mean response length; the tokens over- or under-spent are carried to later steps in full,
so the budget holds over the run: a step spends at most one budget of credit on top of its own and
repays at most half a budget of debt, so a step after a long one is still planned at least half a budget
(converted with the mean length: one that draws short prompts can still spend far less). Multi-round strategies treat the budget as their
target: DAPO may generate more than it (every rollout is counted), AR3PO may spend less. Each round's
allocation is planned on what the step has left; a DAPO back-fill round on at least num_generations x
its prompts (its documented over-sampling), which the allocator divides among them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rollwise.planner.allocators import Allocator
from rollwise.planner.base import GroupResult, PromptStream, Request, StepOutcome, follows_up, groupwise, task_of
from rollwise.planner.estimators import Estimator
from rollwise.planner.repair import NoRepair
from rollwise.planner.selectors import Selector
from rollwise.planner.step import Group, StepState, allocation_summary

REPAY_SHARE = 0.5  # a token budget's debt is repaid at most this share of a budget a step
MAX_ROUNDS = 64  # safety net: rounds in a step (round by round) and of one group; real strategies stop long before


def _check_rewards(res: GroupResult) -> None:
    """A group's rewards must be finite numbers, one length per reward: a NaN compares false with
    everything, so whether its group counted as informative (trained, kept by DAPO) followed the
    order of its rewards, and it counted as a failure in the belief."""
    if len(res.lengths) != len(res.rewards):
        raise ValueError(f"planner got {len(res.rewards)} rewards and {len(res.lengths)} lengths for uid '{res.uid}'")
    if not all(math.isfinite(float(r)) for r in res.rewards):
        raise ValueError(f"planner got a reward that is not a finite number for uid '{res.uid}': {list(res.rewards)}")


class ComposedPlanner:
    def __init__(
        self,
        name: str,
        uids: list[str],
        num_generations: int,
        estimator: Estimator,
        selector: Selector,
        allocator: Allocator,
        repair: NoRepair,
        *,
        budget_rollouts: int,
        budget_tokens: int | None,
        max_completion_length: int,
        seed: int,
        cfg: Any,
        filter_zero_variance: bool = False,
    ):
        self.name = name
        self.stream = PromptStream(uids, seed)
        self.index = {u: i for i, u in enumerate(self.stream.uids)}
        if len(self.index) != len(self.stream.uids):
            raise ValueError("prompt uids must be unique")
        self.pool_size = len(self.index)
        self.n = num_generations
        self.estimator, self.selector, self.allocator, self.repair = estimator, selector, allocator, repair
        self.budget_rollouts = budget_rollouts
        self.budget_tokens = budget_tokens
        self.cfg = cfg
        self.filter_zero_variance = filter_zero_variance
        self.success_threshold = float(cfg.success_threshold)
        # planner.seed: the decisions' random stream apart from the data order (run.seed's)
        self.rng = np.random.default_rng([seed if cfg.seed is None else cfg.seed, 7919])
        self.length_estimate = max_completion_length / 2  # a guess until responses are seen
        self.length_steps = 0  # steps whose lengths the estimate holds
        self.token_carry = 0.0
        self.small_budget_said = False  # the once-a-run note that the budget is below one group (kept in checkpoints)
        self.cooldown = int(cfg.revisit_cooldown)
        self.trained_at: dict[str, int] = {}  # uid -> last step it was trained on with a gradient
        self.trained_times: dict[str, int] = {}  # uid -> steps in which it was trained on with a gradient
        self.mean_length: dict[str, float] = {}  # uid -> mean response length when last rolled out
        self._st: StepState | None = None
        self._metrics: dict[str, Any] = {}
        # set by whoever drives the step: True when observe() is given groups one by one as they
        # finish while others are still out (rollout.overlap_rounds)
        self.overlapped = False
        # set by whoever drives the step: uids whose groups are still being generated from an earlier step
        # (partial rollouts carry them); not requested again until they come back
        self.in_flight: set[str] = set()
        # uid -> (the estimator's mean when the group was requested, whether it had been seen): for groups
        # that partial rollouts carry into a later step, where they are scored (planner/brier)
        self.carried_predictions: dict[str, tuple[float, bool]] = {}

    # ------------------------------------------------------------------ helpers for parts
    def indices(self, uids: list[str]) -> np.ndarray:
        return np.fromiter((self.index[u] for u in uids), dtype=np.int64, count=len(uids))

    def take(self, k: int, st: StepState, extra: list[str] | None = None, need: int | None = None) -> list[str]:
        """The next k stream prompts not yet used in this step (fewer if the pool runs out). Prompts
        still cooling (planner.revisit_cooldown) are passed over; if that leaves fewer than `need`
        (default k; a selector that scores k candidates for fewer picks says how many it needs),
        the prompts cooled longest make up the difference."""
        return self.take_unused(k, st, set(st.groups) | set(extra or ()) | self.in_flight, need)

    def take_unused(self, k: int, st: StepState, used: set[str], need: int | None = None) -> list[str]:
        """`take`, with the prompts not to take given as a set that is read, neither copied nor changed:
        it must hold the step's groups and those in flight. A selector that draws one prompt at a time
        keeps that set up to date itself (greso's skip loop: copying it per draw was quadratic)."""
        out: list[str] = []
        cooling: list[str] = []  # trained on too recently (planner.revisit_cooldown)
        scanned: set[str] = set()  # prompts met in this call
        # two epochs' worth of the stream hold every prompt at least once, so a cooldown that skips
        # prompts still finds every one that is free. Without one, a scan of one pool's worth is enough
        # only when it has looked at every prompt: begun inside an epoch, it spans the end of this
        # epoch's order and the start of the next one's, which can hold the same prompts and miss one
        # that is free (a step short of prompts, DAPO's "no unused prompts left"); it goes on until it has
        for i in range(2 * self.pool_size):
            if len(out) >= k:
                break
            if not self.cooldown and i >= self.pool_size and len(used) + len(scanned) >= self.pool_size:
                break
            uid = self.stream.take(1)[0]
            if uid in used or uid in scanned:
                continue
            scanned.add(uid)
            if self.cooldown and st.step - self.trained_at.get(uid, -10**9) <= self.cooldown:
                cooling.append(uid)
            else:
                out.append(uid)
        want = k if need is None else min(k, need)
        if len(out) < want and cooling:  # a pool too small for the cooldown: those cooled longest first
            cooling.sort(key=lambda u: self.trained_at[u])
            out += cooling[: want - len(out)]
        return out

    def revisit_weights(self, uids: list[str]) -> np.ndarray:
        """planner.revisit_discount^k for each uid, k = the steps it was trained on with a gradient."""
        d = float(self.cfg.revisit_discount)
        k = np.fromiter((self.trained_times.get(u, 0) for u in uids), dtype=np.float64, count=len(uids))
        return d**k

    def length_weights(self, uids: list[str]) -> np.ndarray:
        """1 / expected response length for each uid (planner.score_per_token): its mean length when
        last rolled out; a uid never rolled out gets the mean of the others' (all 1 when none was)."""
        known = [self.mean_length[u] for u in uids if u in self.mean_length]
        if not known:
            return np.ones(len(uids))
        fill = float(np.mean(known))
        lengths = np.fromiter((self.mean_length.get(u, fill) for u in uids), dtype=np.float64, count=len(uids))
        return 1.0 / np.maximum(lengths, 1.0)

    def step_budget(self) -> int:
        """Rollouts this step may spend."""
        if self.budget_tokens is None:
            return self.budget_rollouts
        # the carry in full (module docstring): at most one budget of credit spent, REPAY_SHARE of one repaid
        b = self.budget_tokens
        tokens = b + min(max(self.token_carry, -REPAY_SHARE * b), b)
        return max(1, int(round(tokens / max(self.length_estimate, 1.0))))

    # ------------------------------------------------------------------ protocol
    @property
    def streams(self) -> bool:
        """Whether `observe` may be called group by group as groups finish (rollout.overlap_rounds):
        true unless a part decides from a whole round (DAPO's back-fill, DARS's second round)."""
        return groupwise(type(self.allocator), Allocator) and groupwise(type(self.selector), Selector)

    @property
    def follows_up(self) -> bool:
        """Whether `observe` can ask for more at all (an allocator or selector with extra rounds)."""
        return ((follows_up(type(self.allocator), Allocator) and self.allocator.asks_more)
                or follows_up(type(self.selector), Selector))

    def begin_step(self, step: int) -> list[Request]:
        # predictions kept for groups still in flight; one dropped as stale will not be adopted
        self.carried_predictions = {u: v for u, v in self.carried_predictions.items() if u in self.in_flight}
        budget = self.step_budget()
        st = StepState(step=step, budget=budget)
        self._st = st
        if (self.budget_tokens is None and self.budget_rollouts < self.n and not self.small_budget_said):
            self.small_budget_said = True
            st.notes.append(f"planner.budget_rollouts={self.budget_rollouts} is below one group of {self.n}, so every "
                            "step a prompt rolled out in full spends more than it; raise planner.budget_rollouts or "
                            "lower rollout.num_generations")
        if (self.budget_tokens is not None and self.length_steps and not self.small_budget_said
                and self.budget_tokens < self.n * self.length_estimate):
            self.small_budget_said = True
            st.notes.append(f"planner.budget_tokens={self.budget_tokens} is below one group of {self.n} at the mean "
                            f"response length so far ({self.length_estimate:.0f} tokens: {self.n * self.length_estimate:.0f} "
                            "a group), so every step spends more than it; raise planner.budget_tokens or lower "
                            "rollout.num_generations")
        # groups an allocator carries from an earlier step (screen_followup=next_step) come first and are
        # charged to the budget; the selector's prompts are planned on what they leave
        first = self._request([u for u in self.allocator.carried(budget) if u in self.index], st, budget)
        left = budget - st.used_rollouts
        k = self.allocator.prompts_for(left) if left > 0 else 0
        uids = self.selector.select(self, k, st) if k > 0 else []
        return first + self._request(uids, st, left)

    def _request(self, uids: list[str], st: StepState, budget: int) -> list[Request]:
        """Requests for `uids`, the allocator sharing `budget` rollouts among them: what the step has left
        for them, not the whole step's budget (that was given again to every back-fill round, so an
        allocator that spreads its budget, knapsack or rank, planned each round as if nothing were spent)."""
        if not uids:
            return []
        counts = self.allocator.allocate(self, uids, budget, st)
        idx = self.indices(uids)
        seen = self.estimator.count(idx) > 0
        means = self.estimator.mean(idx)
        reqs = []
        for uid, i, n, s, m in zip(uids, idx, counts, seen, means):
            if n <= 0:  # selected, but the allocator had no samples for it: skipped this time
                st.skipped += 1
                continue
            st.groups[uid] = Group(uid, int(i))
            if uid not in st.predicted:  # a follow-up round's request keeps the step's first prediction
                st.predicted[uid] = float(m)
                if s:
                    st.seen_before.add(uid)
            reqs.append(Request(uid, int(n)))
        for r in reqs:
            st.groups[r.uid].requested += r.n
        return reqs

    def observe(self, results: list[GroupResult]) -> list[Request]:
        st = self._require_step()
        for res in results:
            g = st.groups.get(res.uid)
            if g is None:
                raise ValueError(f"planner got results for uid '{res.uid}', which it did not request this step")
            _check_rewards(res)
            g.rewards.extend(float(r) for r in res.rewards)
            g.lengths.extend(int(n) for n in res.lengths)
            g.successes += sum(r >= self.success_threshold for r in res.rewards)
            g.rounds += 1
        st.rounds += 1
        if st.rounds >= MAX_ROUNDS and not self.overlapped:
            return []
        extra = [r for r in self.allocator.more(self, st) if st.groups[r.uid].rounds < MAX_ROUNDS]
        for r in extra:
            st.groups[r.uid].requested += r.n
        if extra:
            return extra
        backfill = self.selector.more(self, st)
        # a back-fill round (DAPO's filter selector) gets what the step has left, and at least a group of
        # num_generations for each of its prompts: DAPO's own over-sampling (what the fixed allocator spends
        # on them, counted in discarded_rollouts when not trained), not the whole budget again each round
        return self._request(backfill, st, max(st.budget - st.used_rollouts, self.n * len(backfill)))

    def adopt(self, results: list[GroupResult]) -> None:
        """Carried-over groups completed this step (partial rollouts): recorded like this step's own and
        trained if the selector keeps them; the allocator may plan more for them as for its own (a
        surprising probe's top-up, growth). Their samples were requested, and charged to the budget, in
        the step that started them, and the Brier score compares them with that step's prediction."""
        st = self._require_step()
        for res in results:
            _check_rewards(res)
            g = st.groups.get(res.uid)
            if g is None:
                g = st.groups[res.uid] = Group(res.uid, int(self.index[res.uid]))
            g.requested += len(res.rewards)
            g.adopted += len(res.rewards)
            if res.uid in self.carried_predictions and res.uid not in st.predicted:
                pred, seen = self.carried_predictions.pop(res.uid)
                st.predicted[res.uid] = pred
                if seen:
                    st.seen_before.add(res.uid)
            g.rewards.extend(float(r) for r in res.rewards)
            g.lengths.extend(int(n) for n in res.lengths)
            g.successes += sum(r >= self.success_threshold for r in res.rewards)
            g.rounds += 1

    def end_step(self) -> StepOutcome:
        st = self._require_step()
        train = self.selector.finalize(self, st)
        replay = self.repair.choose(st, train)
        if self.filter_zero_variance:
            keep = set(replay)
            train = [u for u in train if st.groups[u].informative or u in keep]
        trained = set(train)
        dropped = [g for g in st.groups.values() if g.uid not in trained]
        outcome = StepOutcome(
            train=train,
            replay=replay,
            discarded_rollouts=sum(g.n for g in dropped),
            discarded_tokens=sum(g.tokens for g in dropped),
            notes=list(st.notes),
        )
        self._metrics = self._step_metrics(st, train, set(replay), outcome)
        for g in st.groups.values():  # still generating (partial rollouts): scored when adopted
            if g.outstanding and g.uid in st.predicted:
                self.carried_predictions[g.uid] = (st.predicted[g.uid], g.uid in st.seen_before)
        taught = [u for u in train if st.groups[u].informative or u in replay]  # trained with a gradient
        # a next_step follow-up is part of its probe's visit: not a new one when the probe was trained (taken as
        # trained when the prompt was; a prompt trained in an earlier epoch whose probe was not is counted once less)
        followups = set(getattr(self.allocator, "carried_now", ()))
        visits = [u for u in taught if not (u in followups and u in self.trained_at)]
        again = sum(u in self.trained_at for u in visits)
        for u in taught:
            self.trained_at[u] = st.step
        for u in visits:
            self.trained_times[u] = self.trained_times.get(u, 0) + 1
        self._metrics["planner/revisit_share"] = again / len(taught) if taught else 0.0
        self._metrics["planner/prompts_trained"] = float(len(self.trained_at))
        for g in st.groups.values():
            if g.n:
                self.estimator.update(g.idx, g.successes, g.n)
                self.mean_length[g.uid] = g.tokens / g.n
        self.estimator.after_step()
        self.selector.after_step(self, st)
        self._metrics.update(self.allocator.after_step(self, st) or {})  # metrics of its own bookkeeping
        self.repair.after_step(st)
        tokens, rollouts = st.generated_tokens, st.generated_rollouts
        if rollouts:  # a plain mean of the steps seen until 1/k < length_ema, then the EMA: the guess is
            self.length_steps += 1  # replaced by the first step's lengths, not forgotten at 10% a step
            a = max(float(self.cfg.length_ema), 1.0 / self.length_steps)
            self.length_estimate = (1 - a) * self.length_estimate + a * tokens / rollouts
        if self.budget_tokens is not None:
            self.charge_tokens(tokens - self.budget_tokens)  # this step's budget in, its tokens out
        self._st = None
        return outcome

    def charge_tokens(self, tokens: float) -> None:
        """Charge `tokens` to a token budget's carry (planner.budget_tokens; kept in full, spent and repaid
        at a bounded rate by `step_budget`): a step's own at its end, and tokens generated that no group will deliver (partial
        rollouts' samples dropped as too stale), so the budget holds over the run."""
        if self.budget_tokens is not None and tokens:
            self.token_carry -= tokens

    def _require_step(self) -> StepState:
        if self._st is None:
            raise RuntimeError("planner: call begin_step() before observe()/end_step()")
        return self._st

    # ------------------------------------------------------------------ metrics and state
    def _step_metrics(self, st: StepState, train: list[str], replay: set[str], out: StepOutcome) -> dict[str, Any]:
        groups = [g for g in st.groups.values() if g.n]
        generated = sum(g.n for g in groups)
        trained = [st.groups[u] for u in train]
        effective = sum(g.n for g in trained if g.informative or g.uid in replay)
        n_trained = sum(g.n for g in trained)
        counts = [g.n for g in groups]
        m: dict[str, Any] = {
            "rollout/rollouts": float(generated),
            "rollout/tokens": float(st.generated_tokens),
            "rollout/discarded_rollouts": float(out.discarded_rollouts),
            "rollout/discarded_tokens": float(out.discarded_tokens),
            "rollout/rounds": float(st.rounds),  # observe() calls: rounds, or batches of finished groups
            "planner/depth": float(max((g.rounds for g in groups), default=0)),  # one group's rounds, at most
            "planner/budget_rollouts": float(st.budget),
            "planner/prompts": float(len(groups)),
            "planner/skipped_prompts": float(st.skipped),
            "planner/trained_samples": float(n_trained),
            "planner/effective_ratio": effective / generated if generated else 0.0,
            "planner/effective_ratio_trained": effective / n_trained if n_trained else 0.0,
            "planner/all_correct_share": sum(g.all_correct for g in groups) / max(len(groups), 1),
            "planner/all_wrong_share": sum(g.all_wrong for g in groups) / max(len(groups), 1),
            "planner/replayed": float(len(replay)),
            "planner/samples_per_prompt": sorted(counts),
        }
        m.update(allocation_summary(counts))
        tasks: dict[str, int] = {}
        for g in groups:
            t = task_of(g.uid)
            tasks[t] = tasks.get(t, 0) + g.n
        if len(tasks) > 1 or "" not in tasks:  # prompts with tasks (uids "<task>:...")
            m.update({f"planner/task_share/{t}": v / max(generated, 1) for t, v in sorted(tasks.items())})
        # the estimator's mean before the step against the solve rate the step saw: every prompt rolled
        # out (an unseen one is predicted by its prior), and those it had observed before
        scored = [(st.predicted[g.uid] - g.successes / g.n, g.uid in st.seen_before) for g in groups
                  if g.uid in st.predicted]
        if scored:
            err, seen = (np.array(c) for c in zip(*scored))
            m["planner/brier"] = float(np.mean(err ** 2))
            m["planner/prediction_bias"] = float(np.mean(err))  # a belief that lags the policy shows here, noise does not
            if seen.any():
                m["planner/brier_seen"] = float(np.mean(err[seen] ** 2))
        m.update(self.selector.metrics())
        m.update(self.allocator.metrics())
        return m

    def metrics(self) -> dict[str, Any]:
        """Last step's metrics. All values are floats except `planner/samples_per_prompt`,
        the list of per-prompt sample counts (for a histogram)."""
        return dict(self._metrics)

    def state_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.name,
            "pool_size": self.pool_size,
            "stream": self.stream.state_dict(),
            "rng": self.rng.bit_generator.state,
            "seed": self.cfg.seed,
            "estimator": self.estimator.state_dict(),
            "selector": self.selector.state_dict(),
            "allocator": self.allocator.state_dict(),
            "repair": self.repair.state_dict(),
            "length_estimate": self.length_estimate,
            "length_steps": self.length_steps,
            "token_carry": self.token_carry,
            "budget_tokens": self.budget_tokens,  # a resume that changes it bounds the credit (load_state_dict)
            "small_budget_said": self.small_budget_said,  # said once a run: not again after a resume
            "carried_predictions": {u: list(v) for u, v in self.carried_predictions.items()},
            "trained_at": dict(self.trained_at),
            "trained_times": dict(self.trained_times),
            "mean_length": dict(self.mean_length),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("strategy") != self.name or state.get("pool_size") != self.pool_size:
            raise ValueError(
                f"planner state is for strategy '{state.get('strategy')}' with {state.get('pool_size')} prompts; "
                f"this run uses '{self.name}' with {self.pool_size}"
            )
        self.stream.load_state_dict(state["stream"])
        if state.get("seed", self.cfg.seed) == self.cfg.seed:  # a resume that changes planner.seed draws anew
            self.rng.bit_generator.state = state["rng"]
        self.estimator.load_state_dict(state["estimator"])
        self.selector.load_state_dict(state["selector"])
        self.allocator.load_state_dict(state["allocator"])
        self.repair.load_state_dict(state["repair"])
        self.length_estimate = float(state["length_estimate"])
        self.length_steps = int(state.get("length_steps", 10**6))  # older checkpoints: the plain EMA
        self.token_carry = float(state["token_carry"])
        if self.budget_tokens is not None and state.get("budget_tokens") != self.budget_tokens:
            # a resume that changes planner.budget_tokens: a credit saved under the old one is at most one new
            # budget (a debt is kept in full); older checkpoints' carries were within one budget already
            self.token_carry = min(float(self.budget_tokens), self.token_carry)
        self.small_budget_said = bool(state.get("small_budget_said", False))  # older checkpoints: said again
        self.carried_predictions = {u: (float(p), bool(seen)) for u, (p, seen) in
                                    state.get("carried_predictions", {}).items()}
        self.trained_at = {str(u): int(s) for u, s in state.get("trained_at", {}).items()}  # older checkpoints: none
        # older checkpoints: each prompt trained on counts once
        self.trained_times = {str(u): int(s) for u, s in state.get("trained_times", dict.fromkeys(self.trained_at, 1)).items()}
        self.mean_length = {str(u): float(v) for u, v in state.get("mean_length", {}).items()}  # older: none
