"""What task structure does to the planners in the simulator (`rollwise simulate --tasks K`).

The default simulated world is one pool of prompts; real mixtures are tasks of very different
difficulty whose skills transfer to each other only in part. With `--tasks K` each task has
its own difficulty offset and skill, and `transfer` is the share of a step's skill gain that
reaches every task (the rest goes to the tasks trained on). This bench runs uniform, `adaptive`
and `adaptive` without its task-aware parts, paired by seed, for several `transfer` values,
and prints for each variant:

- final held-out accuracy and its paired difference from `adaptive` (mean, standard error);
- the share of uniform's rollouts needed to reach uniform's final accuracy (same seed);
- the largest task's share of the run's rollouts (an even mixture gives 1/K);
- the spread of the tasks' final held-out accuracies (max - min, mean over seeds).

    .venv/bin/python bench/sim_tasks.py                      # 5 tasks, transfer 0 / 0.5 / 1, 20 seeds, ~2 min
    .venv/bin/python bench/sim_tasks.py --transfer 0 --seeds 40

The runs are `rollwise simulate`'s (`run_one`); the world is wrapped only to count.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp

import numpy as np

import rollwise.sim.runner as runner
from rollwise.sim.command import parse_strategy
from rollwise.sim.report import first_reach
from rollwise.sim.runner import RunSpec
from rollwise.sim.world import SimParams, World

VARIANTS = ["uniform", "adaptive", "adaptive:group_prior=false", "adaptive:stratify=false:stratify_rollouts=false",
            "adaptive:estimator=oracle"]


class CountingWorld(World):
    last: CountingWorld | None = None

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        CountingWorld.last = self
        self.rollouts = np.zeros(len(self.phi))

    def generate(self, req):
        self.rollouts[self.task[self.index[req.uid]]] += req.n
        return super().generate(req)


def run(spec: RunSpec) -> tuple[str, int, np.ndarray, float, np.ndarray, np.ndarray]:
    runner.World = CountingWorld
    res = runner.run_one(spec)
    w = CountingWorld.last
    acc = w.solve_rate(w.eval_idx)
    per_task = np.array([acc[w.task[w.eval_idx] == t].mean() for t in range(len(w.phi))])
    return spec.strategy, spec.seed, res.accuracy, res.budget_total, res.rollouts, \
        np.append(per_task, w.rollouts.max() / w.rollouts.sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=5)
    ap.add_argument("--transfer", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=VARIANTS)
    args = ap.parse_args()
    for tr in args.transfer:
        params = SimParams(tasks=args.tasks, transfer=tr)
        specs = []
        for label in args.variants:
            name, over = parse_strategy(label)
            specs += [RunSpec(name, s, params=params, planner=over) for s in range(args.seeds)]
        labels = [lab for lab in args.variants for _ in range(args.seeds)]
        with mp.get_context("fork").Pool(args.workers) as pool:
            out = pool.map(run, specs)
        rows: dict[str, dict[int, tuple]] = {}
        for lab, (_, seed, acc, total, spent, extra) in zip(labels, out):
            rows.setdefault(lab, {})[seed] = (acc, total, extra, spent)
        print(f"\n### {args.tasks} tasks, transfer {tr}, {args.seeds} seeds\n")
        print("| variant | final held-out | minus `adaptive` (SE) | share of uniform's rollouts to its final | "
              "largest task's share of rollouts | spread of task accuracies |")
        print("|---|---|---|---|---|---|")
        base = {s: v[0][-1] for s, v in rows["uniform"].items()}
        ref = {s: v[0][-1] for s, v in rows["adaptive"].items()} if "adaptive" in rows else None
        for lab, by_seed in rows.items():
            seeds = sorted(by_seed)
            final = np.array([by_seed[s][0][-1] for s in seeds])
            diff = ""
            if ref is not None and lab != "adaptive":
                d = final - np.array([ref[s] for s in seeds])
                diff = f"{100 * d.mean():+.1f} ({100 * d.std(ddof=1) / np.sqrt(len(d)):.1f})"
            share = []
            for s in seeds:
                acc, total, _, spent = by_seed[s]
                fake = runner.RunResult(lab, s, spent, np.zeros(len(acc)), acc, 0, 0, 0, 0, 0, total)
                share.append(first_reach(fake, "rollouts", base[s]) / total)
            share = np.array(share)
            reached = np.isfinite(share)
            top = np.mean([by_seed[s][2][-1] for s in seeds])
            spread = np.mean([np.ptp(by_seed[s][2][:-1]) for s in seeds])
            print(f"| {lab} | {100 * final.mean():.1f}% | {diff} | {np.nanmean(share):.2f} ({reached.sum()}/{len(seeds)}) "
                  f"| {top:.2f} | {100 * spread:.1f} pts |")


if __name__ == "__main__":
    main()
