"""Run planners against the simulated world at an equal total budget.

The loop below is the training loop with the engine and rewarder replaced by `World`: the
planner is built by the same `build_planner` and sees only uids, rewards and lengths, round by
round or (`overlap`, the training loop's rollout.overlap_rounds) one group at a time in the
order the groups finish.

Each step also gets a latency in decode steps, counted as if every sample had a slot of its
own (a GPU engine with room to spare; on a CPU time follows tokens more than latency): round by
round a round lasts as long as its longest response; overlapped, a group's follow-ups start
when its own last response ends, and the step lasts until the last group is done.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from rollwise.config import PlannerConfig
from rollwise.planner import build_planner
from rollwise.sim.oracle import make_oracle, split_oracle
from rollwise.sim.world import SimParams, World


@dataclass
class RunSpec:
    strategy: str
    seed: int
    steps: int = 150  # uniform steps that the total budget buys
    prompts_per_step: int = 32
    num_generations: int = 8
    unit: str = "rollouts"  # rollouts | tokens
    budget: int | None = None  # per step, in `unit`; None = prompts_per_step * num_generations (* mean length)
    params: SimParams = field(default_factory=SimParams)
    planner: dict[str, Any] = field(default_factory=dict)  # extra PlannerConfig fields
    overlap: bool = False  # groups shown to the planner one at a time as they finish


@dataclass
class RunResult:
    strategy: str
    seed: int
    rollouts: np.ndarray  # cumulative generated rollouts after each step (0 first)
    tokens: np.ndarray  # cumulative generated tokens
    accuracy: np.ndarray  # held-out accuracy after each step
    effective: int  # rollouts in groups that gave a gradient
    generated: int
    all_wrong: float  # mean all-wrong share of rolled-out groups
    all_correct: float
    notes: int  # steps that ended with a planner note
    budget_total: float
    latency: np.ndarray | None = None  # cumulative decode steps on the critical path (module docstring)
    trained: int = 0  # rollouts in the groups trained on (the effective ratio: effective / trained)


def default_budget(spec: RunSpec) -> int:
    b = spec.prompts_per_step * spec.num_generations
    if spec.unit == "tokens":
        w = World(spec.params, 0, spec.prompts_per_step, spec.num_generations)
        return int(round(b * w.mean_length()))
    return b


def build_row_planner(spec: RunSpec, world: World, budget: int) -> tuple[Any, int]:
    """The row's planner for `world`, as the training loop builds it, and its step budget (`budget`, the
    common one, unless the row gives its own)."""
    key = "budget_tokens" if spec.unit == "tokens" else "budget_rollouts"
    over, oracle = split_oracle(spec.planner)
    step_budget = over.pop(key, None) or budget  # a strategy's own step budget; the total stays steps * budget
    cfg = PlannerConfig(strategy=spec.strategy, **{key: step_budget}, **over)
    feature = world.feature[: spec.params.n_train].tolist() if spec.params.feature_r2 > 0 else None
    planner = build_planner(cfg, world.train_uids, spec.prompts_per_step, spec.num_generations,
                            spec.params.max_len, spec.seed, prompt_lengths=feature)
    if oracle:  # simulator only: (some of) the true solve rates, as a ceiling for the strategy
        planner.estimator = make_oracle(oracle, world, planner.estimator)
    return planner, step_budget


def run_one(spec: RunSpec) -> RunResult:
    """One strategy, one seed, until the run has spent steps * budget (rollouts or tokens)."""
    world = World(spec.params, spec.seed, spec.prompts_per_step, spec.num_generations)
    budget = spec.budget or default_budget(spec)
    planner, step_budget = build_row_planner(spec, world, budget)
    total = float(spec.steps * budget)
    rollouts, tokens, acc, latency = [0.0], [0.0], [world.eval_accuracy()], [0.0]
    eff = gen = trained = notes = 0
    wrong, correct = [], []
    for step in range(spec.steps * 20 * max(1, -(-budget // step_budget))):
        groups, took = play_step(planner, world, step, spec.overlap)
        latency.append(latency[-1] + took)
        out = planner.end_step()
        world.learn(groups, out.train, out.replay)
        m = planner.metrics()
        gen += int(m["rollout/rollouts"])
        eff += int(round(m["planner/effective_ratio"] * m["rollout/rollouts"]))
        trained += int(m["planner/trained_samples"])
        wrong.append(m["planner/all_wrong_share"])
        correct.append(m["planner/all_correct_share"])
        notes += bool(out.notes)
        rollouts.append(rollouts[-1] + m["rollout/rollouts"])
        tokens.append(tokens[-1] + m["rollout/tokens"])
        acc.append(world.eval_accuracy())
        spent = tokens[-1] if spec.unit == "tokens" else rollouts[-1]
        if spent >= total:
            break
    return RunResult(spec.strategy, spec.seed, np.array(rollouts), np.array(tokens), np.array(acc), eff, gen,
                     float(np.mean(wrong)), float(np.mean(correct)), notes, total, np.array(latency), trained)


def play_step(planner: Any, world: World, step: int, overlap: bool) -> tuple[dict[str, list[float]], int]:
    """One step's conversation with the planner (up to end_step); the rewards per uid and the
    step's latency in decode steps (module docstring). `overlap` needs a planner that `streams`."""
    groups: dict[str, list[float]] = {}

    def generate(r: Any) -> Any:
        res = world.generate(r)
        groups.setdefault(res.uid, []).extend(res.rewards)
        return res

    planner.overlapped = overlap = overlap and planner.streams  # dapo, dars: round by round
    reqs = planner.begin_step(step)
    if overlap:
        order = itertools.count()  # ties: first requested, first observed
        heap = [(max(res.lengths, default=0), next(order), res) for res in map(generate, reqs)]
        heapq.heapify(heap)
        t = 0
        while heap:
            t, _, res = heapq.heappop(heap)
            for r in planner.observe([res]):
                nxt = generate(r)
                heapq.heappush(heap, (t + max(nxt.lengths, default=0), next(order), nxt))
        return groups, t
    t = 0
    while reqs:
        results = [generate(r) for r in reqs]
        t += max(max(res.lengths, default=0) for res in results)
        reqs = planner.observe(results)
    return groups, t


def run_many(base: RunSpec, strategies: list[str], seeds: list[int], workers: int = 1,
             progress: Any = None) -> dict[str, list[RunResult]]:
    """Every strategy over every seed; `progress(done, total)` is called after each run."""
    specs = [replace(base, strategy=s, seed=seed) for s in strategies for seed in seeds]
    out: dict[str, list[RunResult]] = {s: [] for s in strategies}
    if workers > 1:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(workers) as pool:
            for i, res in enumerate(pool.imap(run_one, specs)):
                out[res.strategy].append(res)
                if progress:
                    progress(i + 1, len(specs))
        return out
    for i, spec in enumerate(specs):
        res = run_one(spec)
        out[res.strategy].append(res)
        if progress:
            progress(i + 1, len(specs))
    return out
