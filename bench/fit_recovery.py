"""Does `rollwise simulate --fit` recover the world a run was simulated in? (src/rollwise/sim/fit.py)

Simulated runs are written as rollwise run directories (config.yaml, and metrics.jsonl with every
step's `rollout/groups` -- uid, outcomes, response lengths -- and `rollout/truncated_frac`), then
fitted with `first_visits` + `fit_world`, as `simulate --fit` does. Three tables:

(a) lr: true lr 0.3, skill0 -1.5, difficulty_sd 1, no unsolvable share, drift 0, 400-prompt pool,
    16 prompts x 8 samples, 40 steps; uniform and adaptive; mean fitted lr, its SE over seeds, bias.
(b) tasks: the same world in 4 tasks (task_sd 0.5, transfer 0.5): fitted task_sd minus the sd of
    the task levels the seed realised (skill0 minus each task's mean difficulty).
(c) truncation: uniform, 2,000 prompts, 20 steps, a length cap that cuts about half the samples (250)
    against an uncut one (1024), in a narrow world (spread 1, no unsolvable) and a wide one
    (spread 2.5, 10% unsolvable): fitted skill0, spread, unsolvable share, lr, and the share cut.

Every fit gets the simulator's revisit_decay and transfer where the fit module takes them (the
code before f24119d had neither). `--fit-module` loads another fit.py; the simulator is always this
checkout's, so both fits see the very same runs:

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/fit_recovery.py          # this checkout's fit
    git worktree add --detach /tmp/fitold_wt 299d7aa                             # the fit before f24119d
    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/fit_recovery.py \
        --fit-module /tmp/fitold_wt/src/rollwise/sim/fit.py
    git worktree remove /tmp/fitold_wt

About 4-5 minutes each on 2 shared cores (4m10s of CPU; the fits are torch's L-BFGS, on one thread).

`--only lr,tasks,cut` picks tables; `--seeds` (8) and `--wide-seeds` (4) set the seeds.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from rollwise.config import PlannerConfig
from rollwise.planner import build_planner
from rollwise.sim.runner import play_step
from rollwise.sim.world import SimParams, World

PPS, N = 16, 8  # prompts per step, samples per prompt
BASE = {"skill0": -1.5, "difficulty_sd": 1.0, "unsolvable": 0.0, "lr": 0.3, "drift": 0.0}


def simulate(d: Path, strategy: str, seed: int, p: SimParams, steps: int) -> tuple[World, float]:
    """One run written as a rollwise run dir; the world and the share of all its samples cut at the cap."""
    w = World(p, seed, PPS, N)
    planner = build_planner(PlannerConfig(strategy=strategy), w.train_uids, PPS, N, p.max_len, seed)
    lengths: dict[str, list[int]] = {}
    generate = w.generate

    def logged(req):  # keep each group's response lengths, as a real run logs them
        res = generate(req)
        lengths.setdefault(res.uid, []).extend(res.lengths)
        return res

    w.generate = logged
    rows, cut, total = [{"step": 0, "eval/accuracy": w.eval_accuracy()}], 0, 0
    for step in range(steps):
        lengths.clear()
        groups, _ = play_step(planner, w, step, False)
        out = planner.end_step()
        w.learn(groups, out.train, out.replay)
        gs = [[uid if p.tasks else "k0:" + uid, "".join("1" if x else "0" for x in r), lengths[uid]]
              for uid, r in groups.items()]
        c, n = sum(x >= p.max_len for g in gs for x in g[2]), sum(len(g[2]) for g in gs)
        cut, total = cut + c, total + n
        rows.append({"step": step + 1, "rollout/rollouts": float(n), "rollout/truncated_frac": c / max(n, 1),
                     "rollout/groups": gs})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "config.yaml").write_text(yaml.safe_dump({
        "rollout": {"prompts_per_step": PPS, "num_generations": N, "max_completion_length": p.max_len},
        "train": {"max_steps": steps}, "data": {"train_size": p.n_train}}))
    return w, cut / max(total, 1)


def call(f, *args, **kwargs):
    """f with only the keyword arguments it accepts (the old fit has no revisit_decay, no transfer)."""
    accepted = inspect.signature(f).parameters
    return f(*args, **{k: v for k, v in kwargs.items() if k in accepted})


def fit_run(fm, strategy: str, seed: int, p: SimParams, steps: int, **fit_kw):
    with tempfile.TemporaryDirectory() as tmp:
        w, cut = simulate(Path(tmp), strategy, seed, p, steps)
        visits = call(fm.first_visits, tmp, None, PPS * N, revisit_decay=p.revisit_decay)
        f = call(fm.fit_world, visits, transfer=p.transfer, **fit_kw)
    fitted_cut = fm.cut_share(visits)[0] if hasattr(fm, "cut_share") else float("nan")
    return w, f, cut, fitted_cut


def table_lr(fm, seeds: int) -> None:
    print("\n(a) lr recovery: true lr 0.3, skill0 -1.5, sd 1, 400 prompts, 16x8, 40 steps; "
          f"{seeds} seeds, u fixed at 0, no growth\n")
    print("| planner | fitted lr (mean) | SE | bias | fitted skill0 (mean) |\n|---|---|---|---|---|")
    p = SimParams(n_train=400, **BASE)
    for strategy in ("uniform", "adaptive"):
        fits = [fit_run(fm, strategy, s, p, 40, unsolvable=0.0, growth=False)[1] for s in range(seeds)]
        lr = np.array([f.learning for f in fits])
        print(f"| {strategy} | {lr.mean():.3f} | {lr.std(ddof=1) / np.sqrt(seeds):.3f} | "
              f"{100 * (lr.mean() / p.lr - 1):+.1f}% | {np.mean([f.skill0 for f in fits]):.3f} |", flush=True)


def table_tasks(fm, seeds: int) -> None:
    print(f"\n(b) 4 tasks, task_sd 0.5, transfer 0.5 (otherwise as (a)); {seeds} seeds, u fixed at 0\n")
    print("| planner | fitted task_sd | realised task_sd | fitted - realised (mean) | SE | fitted lr |\n"
          "|---|---|---|---|---|---|")
    p = SimParams(n_train=400, tasks=4, task_sd=0.5, transfer=0.5, **BASE)
    for strategy in ("uniform", "adaptive"):
        got = []
        for s in range(seeds):
            w, f, _, _ = fit_run(fm, strategy, s, p, 40, unsolvable=0.0)
            task, b = w.task[:p.n_train], w.b[:p.n_train]
            realised = np.std([p.skill0 - b[task == t].mean() for t in range(p.tasks)], ddof=1)
            got.append((f.task_sd, realised, f.learning))
        r = np.array(got)
        err = r[:, 0] - r[:, 1]
        print(f"| {strategy} | {r[:, 0].mean():.3f} | {r[:, 1].mean():.3f} | {err.mean():+.3f} | "
              f"{err.std(ddof=1) / np.sqrt(seeds):.3f} | {r[:, 2].mean():.3f} |", flush=True)


def table_cut(fm, seeds: int, wide_seeds: int, narrow_cap: int, wide_cap: int) -> None:
    print("\n(c) truncation: uniform, 2,000 prompts, skill0 -1.5, lr 0.3, 16x8, 20 steps; u and growth fitted\n")
    print("| world | cap | seeds | skill0 | spread | unsolvable | lr | cut (all samples) | cut (fit's first visits) |\n"
          "|---|---|---|---|---|---|---|---|---|")
    worlds = [("spread 1, u 0", 1.0, 0.0, seeds, narrow_cap), ("spread 2.5, u 0.1", 2.5, 0.1, wide_seeds, wide_cap)]
    for name, sd, u, n, cap in worlds:
        for max_len in (1024, cap):
            p = SimParams(**{**BASE, "n_train": 2000, "difficulty_sd": sd, "unsolvable": u, "max_len": max_len})
            got = []
            for s in range(n):
                _, f, cut, fitted_cut = fit_run(fm, "uniform", s, p, 20)
                got.append((f.skill0, f.spread, f.unsolvable, f.learning, cut, fitted_cut))
            m = np.array(got).mean(axis=0)
            print(f"| {name} | {max_len} | {n} | {m[0]:.2f} | {m[1]:.2f} | {m[2]:.3f} | {m[3]:.3f} | {m[4]:.3f} | "
                  + ("-" if np.isnan(m[5]) else f"{m[5]:.3f}") + " |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fit-module", help="path of a fit.py to measure instead of rollwise.sim.fit")
    ap.add_argument("--only", default="lr,tasks,cut", help="tables to run: lr, tasks, cut")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--wide-seeds", type=int, default=4, help="seeds of (c)'s wide world")
    ap.add_argument("--narrow-cap", type=int, default=250, help="(c)'s cut cap in the narrow world")
    ap.add_argument("--wide-cap", type=int, default=250, help="(c)'s cut cap in the wide world")
    a = ap.parse_args()
    import torch  # the fit's L-BFGS; one thread, as the machine is shared

    torch.set_num_threads(1)
    if a.fit_module:
        spec = importlib.util.spec_from_file_location("fit_under_test", a.fit_module)
        fm = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = fm  # dataclasses look their module up here
        spec.loader.exec_module(fm)
    else:
        import rollwise.sim.fit as fm
    print(f"fit module: {fm.__file__}")
    t0 = time.time()
    only = a.only.split(",")
    if "lr" in only:
        table_lr(fm, a.seeds)
    if "tasks" in only:
        table_tasks(fm, a.seeds)
    if "cut" in only:
        table_cut(fm, a.seeds, a.wide_seeds, a.narrow_cap, a.wide_cap)
    print(f"\nwall time {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
