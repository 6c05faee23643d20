"""Does a world fitted by `rollwise simulate --fit` learn like the run it was fitted to?

For a `uniform` run (every prompt gets a full group, so the step's rollout accuracy is an
unbiased sample of the policy's mean solve rate on the training mixture), this prints the run's
rollout accuracy in blocks of steps next to what the fitted world's uniform run gives over 20
seeds (its mean solve rate on the prompts it rolls out each step), for the fit with a zero-rate
share (when the run calls for one) and with `--unsolvable 0`.

    .venv/bin/python bench/fit_check.py runs/fit-uniform40            # seconds

The run: `rollwise train planner.strategy=uniform eval.at_start=false eval.at_end=false
run.name=fit-uniform40` (the default job's 40 steps, 9 min on 2 cores).

Since 2026-12-07 night the fit counts a prompt's k-th signal at 0.85^k (the simulator's default
--revisit-decay) and splits each task's learning by its transfer; the figures in bench/RESULTS.md
from before then were fitted with revisits counted in full and every task moving alike.
"""

from __future__ import annotations

import argparse

import numpy as np

from rollwise.config import PlannerConfig
from rollwise.planner import build_planner
from rollwise.sim.fit import first_visits, fit_world, run_scale
from rollwise.sim.runner import play_step
from rollwise.sim.world import SimParams, World
from rollwise.tracking import read_metrics


def world_params(fit, pool: int) -> SimParams:
    k = len(fit.tasks) if len(fit.tasks) > 1 else 0
    sd = max(fit.difficulty_sd, fit.task_sd + 0.01)
    return SimParams(n_train=pool, unsolvable=fit.unsolvable, skill0=fit.skill0, difficulty_sd=sd, tasks=k,
                     task_sd=fit.task_sd, lr=max(fit.learning or 0.0, 0.0))


def simulated_accuracy(params: SimParams, pps: int, n: int, steps: int, seeds: int) -> np.ndarray:
    """Mean share correct of the rollouts of each step of a uniform run, per seed."""
    out = np.zeros((seeds, steps))
    for seed in range(seeds):
        w = World(params, seed, pps, n)
        pl = build_planner(PlannerConfig(strategy="uniform"), w.train_uids, pps, n, params.max_len, seed)
        for step in range(steps):
            groups, _ = play_step(pl, w, step, False)
            res = pl.end_step()
            w.learn(groups, res.train, res.replay)
            out[seed, step] = np.mean([x for r in groups.values() for x in r])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--block", type=int, default=5, help="steps per row")
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args()
    scale = run_scale(args.run_dir)
    pps, n, steps = scale["prompts_per_step"], scale["num_generations"], scale["steps"]
    rows = sorted((r for r in read_metrics(args.run_dir) if "rollout/accuracy" in r), key=lambda r: r["step"])
    real = np.array([r["rollout/accuracy"] for r in rows])
    steps = min(steps, len(real))
    visits = first_visits(args.run_dir, None, pps * n)
    fits = {"unsolvable share fitted": fit_world(visits), "--unsolvable 0": fit_world(visits, unsolvable=0.0)}
    sims = {}
    for name, f in fits.items():
        lr = f"{f.learning:.3f}" if f.learning is not None else "-"
        print(f"{name}: skill0 {f.skill0:.2f}, spread {f.spread:.2f}, unsolvable {f.unsolvable:.3f}, lr {lr}")
        sims[name] = simulated_accuracy(world_params(f, scale["pool"]), pps, n, steps, args.seeds)
    print("\n| steps | the run's rollout accuracy | " + " | ".join(f"fitted world: {k} (mean, 10-90%)" for k in sims) + " |")
    print("|---|---|" + "---|" * len(sims))
    for a in range(0, steps, args.block):
        b = min(a + args.block, steps)
        cells = [f"{sims[k][:, a:b].mean():.3f} ({np.percentile(sims[k][:, a:b].mean(1), 10):.3f}-"
                 f"{np.percentile(sims[k][:, a:b].mean(1), 90):.3f})" for k in sims]
        print(f"| {a + 1}-{b} | {real[a:b].mean():.3f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
