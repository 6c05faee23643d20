"""How well each preset holds a token budget (planner.budget_tokens): scripted outcomes, no model.

Per preset and world, over 3 seeds: the run's tokens as a share of steps x budget ("mean"), the
largest single step in budgets ("worst-step"), and the share of steps that spent under a quarter of
a budget ("starved"). Worlds:

- lognormal: 160 prompts, 8 a step of 8 samples, per-prompt response lengths log-normal (median 55,
  sd 0.9, capped at 512), a budget of 3,000 tokens, 200 steps;
- twolen: 400 prompts, 200 answered in 20 tokens and seen before the run, 200 unseen answered in 400
  (the step's count is converted with the seen mean, 20), 3,000 tokens, 200 steps;
- sim / simwide: the simulator's default world (32 prompts x 8, 150 steps, a budget of 256 mean-length
  rollouts), and one with lengths spread wider (length_difficulty 0.5, length_sigma 0.9).

    .venv/bin/python bench/token_budget_worlds.py lognormal twolen sim simwide
"""
import sys

import numpy as np

from rollwise.config import PlannerConfig
from rollwise.planner import STRATEGIES, GroupResult, build_planner
from rollwise.sim.world import SimParams, World

N, PPS, MCL = 8, 8, 512

def lognormal_world(seed=0, npool=160):
    rng = np.random.default_rng(seed)
    uids = [f"t{i % 3}:q{i}" for i in range(npool)]
    kind = rng.random(npool)
    p = np.where(kind < 0.3, 0.0, np.where(kind < 0.45, 1.0, rng.uniform(0.05, 0.95, npool)))
    length = np.clip(rng.lognormal(4.0, 0.9, npool), 5, MCL)
    return uids, dict(zip(uids, p)), dict(zip(uids, length)), []

def two_length_world(seed=0):
    rng = np.random.default_rng(seed)
    uids = [f"t{i % 2}:q{i}" for i in range(400)]
    p = dict(zip(uids, rng.uniform(0.1, 0.9, 400)))
    length = {u: (20.0 if i < 200 else 400.0) for i, u in enumerate(uids)}
    return uids, p, length, uids[:200]

def drive(strategy, world, steps=200, budget=3000, seed=0):
    uids, p, length, seen = world
    pl = build_planner(PlannerConfig(strategy=strategy, seed=seed, budget_tokens=budget), uids, PPS, N, MCL, seed)
    for u in seen:  # seen before the run: short prompts, 12 samples each
        pl.estimator.update(pl.index[u], int(round(12 * p[u])), 12)
        pl.mean_length[u] = length[u]
    if seen:
        pl.length_estimate, pl.length_steps = float(np.mean([length[u] for u in seen])), 10
    rng = np.random.default_rng(seed + 1)
    spent = []
    for step in range(steps):
        reqs, tok = pl.begin_step(step), 0
        while reqs:
            res = []
            for q in reqs:
                rewards = (rng.random(q.n) < p[q.uid]).astype(float).tolist()
                lens = np.clip(rng.normal(length[q.uid], 0.1 * length[q.uid], q.n), 1, MCL).astype(int).tolist()
                tok += sum(lens)
                res.append(GroupResult(q.uid, rewards, lens))
            reqs = pl.observe(res)
        pl.end_step()
        spent.append(tok / budget)
    s = np.array(spent)
    return s.mean(), s.max(), (s < 0.25).mean()

def sim_drive(strategy, steps=150, seed=0, params=None):
    params = params or SimParams()
    w = World(params, seed, 32, 8)
    B = int(round(256 * w.mean_length()))
    pl = build_planner(PlannerConfig(strategy=strategy, seed=seed, budget_tokens=B), w.train_uids, 32, 8, params.max_len, seed)
    from rollwise.sim.runner import play_step
    spent = []
    for step in range(steps):
        groups, _ = play_step(pl, w, step, False)
        out = pl.end_step()
        w.learn(groups, out.train, out.replay)
        spent.append(pl.metrics()["rollout/tokens"] / B)
    s = np.array(spent)
    return s.mean(), s.max(), (s < 0.25).mean()

def table(which: str) -> None:
    for strat in STRATEGIES:
        rows = []
        for seed in range(3):
            if which == "sim":
                rows.append(sim_drive(strat, seed=seed))
            elif which == "simwide":
                rows.append(sim_drive(strat, seed=seed, params=SimParams(length_difficulty=0.5, length_sigma=0.9)))
            else:
                w = lognormal_world(seed) if which == "lognormal" else two_length_world(seed)
                rows.append(drive(strat, w, seed=seed))
        r = np.array(rows)
        print(f"{which:10s} {strat:10s} mean {r[:,0].mean():.3f} worst-step {r[:,1].max():.2f} starved {r[:,2].mean():.3f}", flush=True)


if __name__ == "__main__":
    for w in sys.argv[1:] or ["lognormal", "twolen", "sim", "simwide"]:
        table(w)
