"""Where in the simulator is issue 3's target within reach? (exploratory)

Issue 3 asks for a strategy that reaches uniform's final held-out accuracy with at most 1/3 of
uniform's rollouts, at an effective ratio of 0.9 or more. In the default simulated world
`adaptive` needs 0.71 and even the true solve rates (`adaptive:estimator=oracle`) need 0.40. So
whether 1/3 is reachable is a property of the world as much as of the planner. This bench runs
uniform, `adaptive` and its oracle over a grid of worlds: the share of prompts no skill solves
(`--unsolvable`) against the spread of difficulty (`--difficulty-sd`), everything else at
`rollwise simulate`'s defaults (1024 prompts, 32 x 8 a step, 150 steps, law `signal`, revisit
decay 0.85 unless --revisit-decay is given). Per cell it prints:

- uniform's zero-gradient share (rollouts in groups of equal rewards), the waste a planner can cut;
- `adaptive`'s and the oracle's share of uniform's rollouts to reach uniform's final accuracy
  (mean over seeds, "never" if a seed never reaches it) and their effective ratios;
- whether the issue's target (share <= 1/3 and effective ratio >= 0.9) holds;
- the oracle's share divided by uniform's effective ratio (1 - its zero-gradient share). Under
  the `signal` law, a planner that wasted nothing and learned from each informative rollout
  what uniform does would score about 1. Below 1 means the oracle also picks better-than-average
  prompts; above 1 means revisits teach less (revisit decay < 1).

    .venv/bin/python bench/sim_reach.py --seeds 20              # 4 x 4 worlds, 160 s on 2 cores
    .venv/bin/python bench/sim_reach.py --revisit-decay 1 --seeds 20 --law saturating

The runs are `rollwise simulate`'s (`run_one`). The shares differ from its table's in one way:
here a cell is "never" when any seed never reaches the target, where simulate's table averages
over the seeds that did (and marks the cell with `*`).
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import time
from dataclasses import replace

import numpy as np

from rollwise.sim.command import parse_strategy
from rollwise.sim.report import first_reach
from rollwise.sim.runner import RunResult, RunSpec, run_one
from rollwise.sim.world import SimParams

PLANNERS = {"adaptive": "adaptive", "oracle": "adaptive:estimator=oracle"}  # label -> strategy, each against uniform
ARMS = ["uniform", *PLANNERS.values()]


def spec_for(unsolvable: float, sd: float, arm: str, seed: int, decay: float, law: str = "signal") -> RunSpec:
    name, over = parse_strategy(arm)
    params = replace(SimParams(), unsolvable=unsolvable, difficulty_sd=sd, revisit_decay=decay, law=law)
    return RunSpec(strategy=name, seed=seed, params=params, planner=over)


def run(job: tuple[float, float, str, int, float, str]) -> tuple[tuple[float, float, str, int], RunResult]:
    u, sd, arm, seed, decay, law = job
    return (u, sd, arm, seed), run_one(spec_for(u, sd, arm, seed, decay, law))


def shares(runs: dict[int, RunResult], base: dict[int, RunResult]) -> np.ndarray:
    """Per seed: rollouts to reach uniform's final accuracy (same seed), as a share of the budget; NaN if never."""
    return np.array([first_reach(r, "rollouts", float(base[s].accuracy[-1])) / r.budget_total for s, r in runs.items()])


def effective(r: RunResult) -> float:
    """Share of the generated rollouts in groups with a gradient."""
    return r.effective / max(r.generated, 1)


def meets_target(share: np.ndarray, effective: float) -> bool:
    """Issue 3's simulator target: every seed reaches uniform's final, at a mean share of at most
    1/3 of uniform's rollouts, with an effective ratio (of the rollouts generated) of at least 0.9."""
    return bool(not np.isnan(share).any() and share.mean() <= 1 / 3 and effective >= 0.9)


def share_text(x: np.ndarray) -> str:
    if np.isnan(x).any():
        return f"never ({int(np.isnan(x).sum())}/{len(x)})"
    return f"{x.mean():.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--unsolvable", type=float, nargs="+", default=[0.0, 0.1, 0.3, 0.5])
    ap.add_argument("--difficulty-sd", type=float, nargs="+", default=[1.0, 2.5, 4.0, 6.0])
    ap.add_argument("--revisit-decay", type=float, default=SimParams().revisit_decay)
    ap.add_argument("--law", choices=["signal", "mean", "saturating"], default="signal")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    jobs = [(u, sd, arm, seed, args.revisit_decay, args.law) for u, sd in itertools.product(args.unsolvable, args.difficulty_sd)
            for arm in ARMS for seed in range(args.seeds)]
    t0 = time.time()
    with mp.get_context("fork").Pool(args.workers) as pool:
        res = dict(pool.imap_unordered(run, jobs, chunksize=4))
    print(f"{len(jobs)} runs in {time.time() - t0:.0f} s; {args.seeds} seeds a cell, revisit decay {args.revisit_decay}, "
          f"1024 prompts, 32 x 8 a step, 150 steps, law {args.law}")
    print("\n| unsolvable | difficulty sd | uniform: start -> final, zero-gradient share | adaptive: share (effective ratio) "
          "| oracle: share (effective ratio) | target (1/3 at >= 0.9) met by | oracle's share / uniform's effective ratio |")
    print("|---|---|---|---|---|---|---|")
    ratios = []
    for u, sd in itertools.product(args.unsolvable, args.difficulty_sd):
        per = {arm: {s: res[(u, sd, arm, s)] for s in range(args.seeds)} for arm in ARMS}
        base = per["uniform"]
        start = np.mean([r.accuracy[0] for r in base.values()])
        final = np.mean([r.accuracy[-1] for r in base.values()])
        waste = 1 - np.mean([effective(r) for r in base.values()])
        cells, met, mean_share = [], [], {}
        for name, arm in PLANNERS.items():
            sh = shares(per[arm], base)
            eff = np.mean([effective(r) for r in per[arm].values()])
            cells.append(f"{share_text(sh)} ({eff:.2f})")
            mean_share[name] = float(sh.mean())
            if meets_target(sh, eff):
                met.append(name)
        oracle = mean_share["oracle"]
        print(f"| {u:g} | {sd:g} | {start:.2f} -> {final:.2f}, {waste:.2f} | {cells[0]} | {cells[1]} | "
              f"{', '.join(met) or 'none'} | {oracle / (1 - waste):.2f} |")
        ratios.append(oracle / (1 - waste))
    print(f"\noracle's share / uniform's effective ratio over the {len(ratios)} worlds: "
          f"{np.nanmin(ratios):.2f} to {np.nanmax(ratios):.2f}")


if __name__ == "__main__":
    main()
