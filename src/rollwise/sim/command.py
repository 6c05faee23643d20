"""`rollwise simulate`: every planner strategy against the simulated world, equal budget.

    rollwise simulate                                   # all strategies, 20 seeds
    rollwise simulate --strategies uniform mopps:candidate_factor=16 --law saturating
    python -m rollwise.sim --unit tokens                # standalone, token budget
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from rollwise.config import ConfigError, build_config
from rollwise.planner import STRATEGIES
from rollwise.sim.oracle import split_oracle
from rollwise.sim.report import markdown_table, plot_curves, print_table, summarize
from rollwise.sim.runner import RunSpec, default_budget, run_many
from rollwise.sim.world import LAWS, SimParams, World


def parse_strategy(text: str) -> tuple[str, dict[str, Any]]:
    """'mopps' or 'mopps:candidate_factor=16:estimator=irt' -> (name, PlannerConfig overrides)."""
    name, *parts = text.split(":")
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy '{name}'; allowed: {', '.join(STRATEGIES)}")
    over: dict[str, Any] = {}
    for p in parts:
        if "=" not in p:
            raise ValueError(f"strategy '{text}': '{p}' is not KEY=VALUE (a planner config field)")
        k, v = p.split("=", 1)
        over[k] = yaml.safe_load(v)
    try:
        build_config({"planner": {"strategy": name, **split_oracle(over)[0]}})
    except ConfigError as e:
        raise ValueError(f"strategy '{text}': {e}") from None
    return name, over


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `simulate` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser(
        "simulate", help="compare rollout planners on a simulated RL run (pure numpy, seconds)",
        description="Run planner strategies at an equal total rollout (or token) budget against a simulated "
        "policy (item-response model: global skill + per-prompt offsets, unsolvable prompts, drift, "
        "heavy-tailed lengths with a cap) and print a table with 95% bootstrap intervals over seeds.",
    )
    add_arguments(p)
    p.set_defaults(func=run_command)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = SimParams()
    p.add_argument("--strategies", nargs="+", default=list(STRATEGIES), metavar="NAME[:KEY=VALUE...]",
                   help="Strategies to compare; ':key=value' sets planner config fields for one row; "
                   "':estimator=oracle' (simulator only) gives the preset the true solve rates, a ceiling; "
                   "'oracle_seen' and 'oracle_visit' only those of prompts rolled out before (now, or at their "
                   "last visit) "
                   f"(default: all: {' '.join(STRATEGIES)}).")
    p.add_argument("--seeds", type=int, default=20, help="Seeds per strategy (default 20).")
    p.add_argument("--seed-offset", type=int, default=0, help="First seed (default 0).")
    p.add_argument("--steps", type=int, default=150, help="Total budget = steps * per-step budget (default 150).")
    p.add_argument("--prompts-per-step", type=int, default=32, help="Uniform's prompts per step (default 32).")
    p.add_argument("--num-generations", type=int, default=8, help="Group size (default 8).")
    p.add_argument("--unit", choices=["rollouts", "tokens"], default="rollouts",
                   help="Budget unit: rollouts, or response tokens (default rollouts).")
    p.add_argument("--budget", type=int, default=None,
                   help="Per-step budget in --unit (default prompts-per-step * num-generations, times the "
                   "mean response length for tokens).")
    p.add_argument("--law", choices=LAWS, default=d.law,
                   help="Learning law: signal (gain ~ effective samples), mean (gain ~ mean signal of the "
                   "trained batch), saturating (diminishing returns per effective sample). Default signal.")
    p.add_argument("--target", type=float, default=None,
                   help="Held-out accuracy to reach (default: uniform's final accuracy, per seed).")
    p.add_argument("--pool", type=int, default=d.n_train, help=f"Training prompts (default {d.n_train}).")
    p.add_argument("--eval-size", type=int, default=d.n_eval, help=f"Held-out prompts (default {d.n_eval}).")
    p.add_argument("--unsolvable", type=float, default=d.unsolvable,
                   help=f"Share of prompts no skill solves (default {d.unsolvable}).")
    p.add_argument("--skill0", type=float, default=d.skill0,
                   help=f"Initial skill; lower = harder start (default {d.skill0}).")
    p.add_argument("--difficulty-sd", type=float, default=d.difficulty_sd,
                   help=f"Spread of prompt difficulties (default {d.difficulty_sd}).")
    p.add_argument("--lr", type=float, default=d.lr, help=f"Skill gain scale (default {d.lr}).")
    p.add_argument("--local-lr", type=float, default=d.local_lr,
                   help=f"Per-prompt memorisation gain from training on it (default {d.local_lr}).")
    p.add_argument("--drift", type=float, default=d.drift,
                   help=f"Per-step random-walk sd of prompt offsets (default {d.drift}).")
    p.add_argument("--max-len", type=int, default=d.max_len,
                   help=f"Response length cap; truncated responses score 0 (default {d.max_len}).")
    p.add_argument("--tasks", type=int, default=d.tasks,
                   help="Split the prompts into this many tasks, each with a difficulty offset and a skill of its own "
                        "(uids 'k<t>:...', so stratify and per-task priors apply); 0 = one pool (default 0).")
    p.add_argument("--task-sd", type=float, default=d.task_sd,
                   help=f"With --tasks: spread of the tasks' difficulty offsets, a part of --difficulty-sd "
                        f"(default {d.task_sd}).")
    p.add_argument("--transfer", type=float, default=d.transfer,
                   help=f"With --tasks: share of a step's skill gain that reaches every task; the rest goes to "
                        f"the tasks trained on, in proportion to their effective samples (default {d.transfer}).")
    p.add_argument("--feature-r2", type=float, default=d.feature_r2,
                   help="Give each prompt a feature seen before any rollout (a stand-in for its token length, "
                        "read by the planner's length_prior) that explains this share of the variance of prompt "
                        "difficulty; 0 = none (default 0).")
    p.add_argument("--overlap", action="store_true",
                   help="Show the planner each group as it finishes, its follow-ups starting at once (the training "
                        "loop's rollout.overlap_rounds; dapo and dars, which decide from whole rounds, stay round by "
                        "round); default: round by round.")
    p.add_argument("--workers", type=int, default=1, help="Processes to run seeds in (default 1).")
    p.add_argument("--out", type=Path, default=Path("runs/simulate"),
                   help="Folder for curves.png, table.md and results.json (default runs/simulate).")
    p.add_argument("--quiet", action="store_true", help="Print only the table.")


def run_command(args: argparse.Namespace) -> int:
    try:
        rows = [parse_strategy(s) for s in args.strategies]
        for text, (_, over) in zip(args.strategies, rows):
            if over.get("length_prior") and not args.feature_r2:
                raise ValueError(f"strategy '{text}': length_prior reads a feature of each prompt (its token "
                                 "length in training); give the simulated prompts one with --feature-r2 R2")
    except ValueError as e:
        print(f"error: {e}")
        return 2
    params = SimParams(n_train=args.pool, n_eval=args.eval_size, unsolvable=args.unsolvable, skill0=args.skill0,
                       difficulty_sd=args.difficulty_sd, law=args.law, lr=args.lr, local_lr=args.local_lr,
                       drift=args.drift, max_len=args.max_len, tasks=args.tasks, task_sd=args.task_sd,
                       transfer=args.transfer, feature_r2=args.feature_r2)
    try:
        World(params, 0, args.prompts_per_step, args.num_generations)
    except ValueError as e:
        print(f"error: {e}")
        return 2
    base = RunSpec("uniform", 0, steps=args.steps, prompts_per_step=args.prompts_per_step,
                   num_generations=args.num_generations, unit=args.unit, budget=args.budget, params=params)
    base.budget = args.budget or default_budget(base)
    seeds = list(range(args.seed_offset, args.seed_offset + args.seeds))
    t0 = time.perf_counter()
    results = {}
    from rich.progress import Progress

    with Progress(disable=args.quiet, transient=True) as prog:
        task = prog.add_task("simulating", total=len(rows) * len(seeds))
        for label, (name, over) in zip(args.strategies, rows):
            spec = RunSpec(name, 0, steps=base.steps, prompts_per_step=base.prompts_per_step,
                           num_generations=base.num_generations, unit=base.unit, budget=base.budget,
                           params=params, planner=over, overlap=args.overlap)
            res = run_many(spec, [name], seeds, args.workers)[name]
            for r in res:
                r.strategy = label
            results[label] = res
            prog.advance(task, len(seeds))
    elapsed = time.perf_counter() - t0
    try:
        summary = summarize(results, args.unit, args.target)
    except ValueError as e:
        print(f"error: {e}")
        return 2
    total = base.budget * args.steps
    target = f"{args.target:.3f}" if args.target is not None else "uniform's final accuracy (per seed)"
    title = (f"rollwise simulate: {len(seeds)} seeds, law={args.law}, {'overlapped rounds where the planner allows' if args.overlap else 'round by round'}, "
             f"budget {base.budget} {args.unit}/step x "
             f"{args.steps} = {total:,} {args.unit}; target = {target}; 95% bootstrap CI; {elapsed:.1f}s")
    print_table(summary, args.unit, len(seeds), title)
    args.out.mkdir(parents=True, exist_ok=True)
    png = plot_curves(results, args.unit, args.out / "curves.png", title)
    (args.out / "table.md").write_text(f"{title}\n\n{markdown_table(summary, args.unit, len(seeds))}")
    (args.out / "results.json").write_text(json.dumps({
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "func"},
        "params": asdict(params), "budget_per_step": base.budget, "elapsed_s": elapsed,
        "summary": {s: {k: asdict(v) for k, v in d.items()} for s, d in summary.items()},
    }, indent=1))
    if not args.quiet:
        print(f"curves: {png}\ntable:  {args.out / 'table.md'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rollwise.sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run_command(parser.parse_args(argv))
