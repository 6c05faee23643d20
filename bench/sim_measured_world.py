"""The simulator in a world fitted to the default mixture's measured solve rates.

The simulator's default world (skill -2.5, difficulty sd 2.5, a tenth of prompts unsolvable,
one pool) puts prompts near 0 and 1, where probing before committing pays most. This bench
fits the world to what `bench/prior_features.py` measured with the base model on the default
mixture (the mean and the spread of per-prompt solve rates beyond binomial noise, from
bench/out/prior_features.json), with five tasks of similar difficulty as in the default
mixture, and runs the planners in it:

1. the fit: a grid over the initial skill and the difficulty spread (no unsolvable prompts),
   matching the mean and the sd of the true solve rates; the histogram of correct answers out
   of 8 that the fitted world predicts, next to the measured one;
2. fixed weights (no learning), the default job's scale (8 prompts x 8 samples, 4,000
   prompts, 20 steps): effective ratios, to set against bench/planner_rounds.py's in real
   generation;
3. learning, at the default job's scale (40 steps) and at the simulator's default scale
   (32 x 8, 1,024 prompts, 150 steps): the share of uniform's rollouts to reach its final
   accuracy, final accuracy, effective ratio.

    .venv/bin/python bench/sim_measured_world.py            # about 1 min on 2 cores

Every run is `rollwise simulate`'s (`run_many`, `summarize`); printed tables are its markdown.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from rollwise.sim.command import parse_strategy
from rollwise.sim.report import markdown_table, summarize
from rollwise.sim.runner import RunSpec, run_many
from rollwise.sim.world import SimParams

VARIANTS = ["uniform", "mopps", "adaptive", "adaptive:stratify_rollouts=false", "adaptive:estimator=oracle"]


def true_rates(skill0: float, sd: float, discrimination: float, size: int, seed: int) -> np.ndarray:
    """Solve rates of `size` prompts of the simulator's item-response model (no unsolvable share)."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal(size)
    a = np.exp(rng.normal(np.log(discrimination), 0.25, size))
    return 1.0 / (1.0 + np.exp(-a * (skill0 - sd * z)))


def fit(mean: float, sd_true: float, discrimination: float) -> tuple[float, float]:
    """(skill0, difficulty_sd) whose true solve rates have this mean and sd (grid, 0.05 steps)."""
    best = (np.inf, 0.0, 0.0)
    for s0 in np.arange(-4.5, -0.95, 0.05):
        for sd in np.arange(0.0, 2.01, 0.05):
            q = true_rates(s0, sd, discrimination, 100_000, 0)
            best = min(best, ((q.mean() - mean) ** 2 + (q.std() - sd_true) ** 2, round(float(s0), 2), round(float(sd), 2)))
    return best[1], best[2]


def histogram(skill0: float, sd: float, discrimination: float, n: int) -> np.ndarray:
    q = true_rates(skill0, sd, discrimination, 200_000, 1)
    return np.bincount(np.random.default_rng(2).binomial(n, q), minlength=n + 1) / q.size


def columns(md: str, keep: list[str]) -> str:
    """The markdown table `md` with only the columns whose headers are in `keep`."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in md.strip().splitlines()]
    idx = [i for i, h in enumerate(rows[0]) if h in keep]
    return "\n".join("| " + " | ".join(r[i] for i in idx) + " |" for r in rows) + "\n"


def table(base: RunSpec, variants: list[str], seeds: int, workers: int, target: float | None) -> str:
    runs: dict[str, list] = {}
    for label in variants:
        name, over = parse_strategy(label)
        res = run_many(replace(base, strategy=name, planner=over), [name], list(range(seeds)), workers)[name]
        runs[label] = [replace(r, strategy=label) for r in res]
    return markdown_table(summarize(runs, "rollouts", target), "rollouts", seeds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measured", type=Path, default=Path("bench/out/prior_features.json"),
                    help="bench/prior_features.py's output (default: bench/out/prior_features.json)")
    ap.add_argument("--tasks", type=int, default=5)
    ap.add_argument("--task-sd", type=float, default=0.3,
                    help="sd of the tasks' difficulty offsets (default 0.3: the five tasks solve 6-12%%)")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=VARIANTS)
    args = ap.parse_args()
    data = json.loads(args.measured.read_text())
    n = int(data["samples"])
    mean, sd_true = data["mean_solve_rate"], float(np.sqrt(data["var_observed"] - data["var_binomial_noise"]))
    d = SimParams()
    skill0, sd = fit(mean, sd_true, d.discrimination)
    print(f"measured ({data['prompts']} prompts x {n}): mean solve rate {mean:.3f}, sd of true rates {sd_true:.3f}")
    print(f"fitted world: --skill0 {skill0} --difficulty-sd {sd} --unsolvable 0 --tasks {args.tasks} "
          f"--task-sd {args.task_sd}")
    counts = np.bincount([p["correct"] for p in data["per_prompt"]], minlength=n + 1) / len(data["per_prompt"])
    print("\n| correct of 8 | " + " | ".join(str(k) for k in range(n + 1)) + " |")
    print("|---" * (n + 2) + "|")
    print("| measured | " + " | ".join(f"{c:.3f}" for c in counts) + " |")
    print("| fitted world | " + " | ".join(f"{c:.3f}" for c in histogram(skill0, sd, d.discrimination, n)) + " |")
    world = SimParams(skill0=skill0, difficulty_sd=sd, unsolvable=0.0, tasks=args.tasks, task_sd=args.task_sd)
    fixed = replace(world, lr=0.0, local_lr=0.0, drift=0.0, n_train=4000)
    print("\n**Fixed weights, 8 x 8, 4,000 prompts, 20 steps**\n")
    print(columns(table(RunSpec("uniform", 0, steps=20, prompts_per_step=8, params=fixed), args.variants,
                        args.seeds, args.workers, 0.0), ["strategy", "effective ratio", "all-wrong share"]))
    print("**Learning, the default job's scale: 8 x 8, 4,000 prompts, 40 steps**\n")
    print(table(RunSpec("uniform", 0, steps=40, prompts_per_step=8, params=replace(world, n_train=4000)),
                args.variants, args.seeds, args.workers, None))
    print("**Learning, the simulator's default scale: 32 x 8, 1,024 prompts, 150 steps**\n")
    print(table(RunSpec("uniform", 0, params=world), args.variants, args.seeds, args.workers, None))


if __name__ == "__main__":
    main()
