"""`rollwise simulate`: every planner strategy against the simulated world, equal budget.

    rollwise simulate                                   # all strategies, 20 seeds
    rollwise simulate --strategies uniform mopps:candidate_factor=16 --law saturating
    python -m rollwise.sim --unit tokens                # standalone, token budget
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import yaml

from rollwise.config import ConfigError, PlannerConfig, _planner_draws, build_config
from rollwise.planner import STRATEGIES, build_planner
from rollwise.planner.strategies import PART_OPTIONS, belief_unread
from rollwise.sim.fit import (
    LR_CRITICAL,
    PROFILE_GRID,
    Visit,
    WorldFit,
    cut_warning,
    first_visits,
    fit_world,
    fitted_cut_share,
    observed_histogram,
    predicted_histogram,
    run_scale,
)
from rollwise.sim.oracle import split_oracle
from rollwise.sim.report import curve, legend, markdown_table, plot_curves, print_table, spend, summarize
from rollwise.sim.runner import RunSpec, build_row_planner, default_budget, run_many
from rollwise.sim.world import LAWS, POLARISE_LAWS, SimParams, World


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
        if not v.strip():
            raise ValueError(f"strategy '{text}': '{p}' has no value")
        if k in over:
            raise ValueError(f"strategy '{text}': {k} is given twice")
        if k == "strategy":
            raise ValueError(f"strategy '{text}': the strategy is the name before the first ':'; drop strategy=")
        over[k] = yaml.safe_load(v)
    planner, oracle = split_oracle(over)
    # said before the config's own check, which would name the preset's estimator the oracle replaces; prior_counts
    # starts the estimator's belief, which the oracle discards with the estimator
    shaping = [k for k in planner if PART_OPTIONS.get(k, ("",))[0] == "estimator" or k == "prior_counts"]
    if oracle == "oracle" and shaping:
        raise ValueError(f"strategy '{text}': estimator=oracle replaces the estimator, so {shaping[0]} has no "
                         "effect; drop it (oracle_seen and oracle_visit keep the preset's belief for unseen "
                         "prompts and read it)")
    try:
        build_config({"planner": {"strategy": name, **planner}})
    except ConfigError as e:
        raise ValueError(f"strategy '{text}': {e}") from None
    return name, over


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `simulate` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser(
        "simulate", help="compare rollout planners on a simulated RL run (pure numpy, seconds)",
        description="Run planner strategies at an equal total rollout (or token) budget against a simulated "
        "policy (item-response model: global skill + per-prompt offsets, unsolvable prompts, drift, "
        "heavy-tailed lengths with a cap) and print a table with 95% Student-t intervals of the mean over seeds.",
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
                   "last visit); ':budget_rollouts=N' (':budget_tokens=N' with --unit tokens) a step budget of "
                   "the row's own, its total unchanged "
                   f"(default: all: {' '.join(STRATEGIES)}).")
    p.add_argument("--fit", type=Path, nargs="+", default=None, metavar="RUN_DIR",
                   help="Fit the world to training runs' own rollouts: the first visit of each prompt (in steps "
                   "1..--fit-steps) gives, by maximum likelihood, the initial skill, the spread of difficulty, the "
                   "tasks' spread, the unsolvable share, the learning rate and a growth of the spread; several runs "
                   "(seeds of one setup: the same prompts per step and group size) are fitted together. The first "
                   "run's config gives prompts per step, group size, steps and pool unless those flags are given. "
                   "The unsolvable share also gets a 95%% profile-likelihood interval, with skill0 and the spread "
                   "across it. The learning rate is read with revisits discounted by --revisit-decay and each "
                   "task's gain split by --transfer, as the simulation counts them. A run with over 10%% of its fitted samples cut at the length cap is "
                   "warned of. Drift, transfer and the length model stay the simulator's (docs/planner.md).")
    p.add_argument("--fit-steps", type=int, default=None,
                   help="With --fit: fit to the prompts first rolled out in steps 1..K (default: every step).")
    p.add_argument("--seeds", type=int, default=20, help="Seeds per strategy (default 20).")
    p.add_argument("--seed-offset", type=int, default=0, help="First seed (default 0).")
    p.add_argument("--steps", type=int, default=None, help="Total budget = steps * per-step budget (default 150; with --fit the run's train.max_steps).")
    p.add_argument("--prompts-per-step", type=int, default=None, help="Uniform's prompts per step (default 32; with --fit the run's).")
    p.add_argument("--num-generations", type=int, default=None, help="Group size (default 8; with --fit the run's).")
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
    p.add_argument("--pool", type=int, default=None, help=f"Training prompts (default {d.n_train}; with --fit the run's data.train_size).")
    p.add_argument("--eval-size", type=int, default=d.n_eval, help=f"Held-out prompts (default {d.n_eval}).")
    p.add_argument("--unsolvable", type=float, default=None,
                   help=f"Share of prompts no skill solves (default {d.unsolvable}; with --fit fitted, or fixed at this value).")
    p.add_argument("--skill0", type=float, default=None,
                   help=f"Initial skill; lower = harder start (default {d.skill0}; fitted with --fit).")
    p.add_argument("--difficulty-sd", type=float, default=None,
                   help=f"Spread of prompt difficulties (default {d.difficulty_sd}; fitted with --fit).")
    p.add_argument("--lr", type=float, default=None,
                   help=f"Skill gain scale (default {d.lr}; with --fit, laws signal and mean, fitted from how the "
                   "run's first visits improved with the training signal before them).")
    p.add_argument("--local-lr", type=float, default=d.local_lr,
                   help=f"Per-prompt memorisation gain from training on it (default {d.local_lr}).")
    p.add_argument("--drift", type=float, default=d.drift,
                   help=f"Per-step random-walk sd of prompt offsets (default {d.drift}).")
    p.add_argument("--eval-threshold", type=float, default=d.eval_threshold,
                   help="Held-out accuracy as the share of held-out prompts whose solve rate is above this (a "
                        "stand-in for greedy evaluation, which real runs report); 0 = the mean solve rate, what "
                        "sampled answers score (default 0).")
    p.add_argument("--max-len", type=int, default=d.max_len,
                   help=f"Response length cap; truncated responses score 0 (default {d.max_len}).")
    p.add_argument("--tasks", type=int, default=None,
                   help="Split the prompts into this many tasks, each with a difficulty offset and a skill of its own "
                        "(uids 'k<t>:...', so stratify and per-task priors apply); 0 = one pool (default 0; with --fit the run's tasks).")
    p.add_argument("--task-sd", type=float, default=None,
                   help=f"With --tasks: spread of the tasks' difficulty offsets, a part of --difficulty-sd "
                        f"(default {d.task_sd}; fitted with --fit).")
    p.add_argument("--transfer", type=float, default=d.transfer,
                   help=f"With --tasks: share of a step's skill gain that reaches every task; the rest goes to "
                        f"the tasks trained on, in proportion to their effective samples (default {d.transfer}).")
    p.add_argument("--feature-r2", type=float, default=d.feature_r2,
                   help="Give each prompt a feature seen before any rollout (a stand-in for its token length, "
                        "read by the planner's length_prior) that explains this share of the variance of prompt "
                        "difficulty; 0 = none (default 0).")
    p.add_argument("--polarise", type=float, default=None,
                   help="Share of each step's skill gain that widens the spread of difficulty instead of shifting "
                        "every prompt alike; what training did on the default job (bench/learning_shape.py); 0 = "
                        "shift only (default 0; with --fit fitted: the share of the run's gain that widened the spread).")
    p.add_argument("--polarise-law", choices=POLARISE_LAWS, default=None,
                   help="How --polarise widens the spread: scale (easy prompts get easier, hard ones harder: every "
                        "difficulty is scaled) or add (each prompt has a learnability of its own, independent of "
                        "its difficulty: which prompts become easy cannot be told from the start; the form --fit "
                        "fits). Default scale; add where --fit keeps a growing spread.")
    p.add_argument("--revisit-decay", type=float, default=d.revisit_decay,
                   help="How much a prompt trained on again still teaches the held-out prompts: its k-th retraining "
                        "counts this to the power k of its signal toward the skill (its own solve rate still "
                        f"gains in full); 1 = a revisit counts like a new prompt. Default {d.revisit_decay}: what real training "
                        "measured (bench/RESULTS.md). "
                        "Compare planner.revisit_cooldown and planner.revisit_discount under it. With --fit the "
                        "learning rate is fitted under this decay.")
    p.add_argument("--overlap", action="store_true",
                   help="Show the planner each group as it finishes, its follow-ups starting at once (the training "
                        "loop's rollout.overlap_rounds; dapo and dars, which decide from whole rounds, stay round by "
                        "round); default: round by round.")
    p.add_argument("--workers", type=int, default=None,
                   help="Processes to run seeds in (default: one per CPU core, at most --seeds); the results do not "
                        "depend on it.")
    p.add_argument("--out", type=Path, default=Path("runs/simulate"),
                   help="Folder for curves.png, table.md and results.json (default runs/simulate).")
    p.add_argument("--quiet", action="store_true", help="Print only the table (warnings still go to stderr).")


def prepare(args: argparse.Namespace) -> tuple[list[tuple[str, dict[str, Any]]], Any, SimParams]:
    """The strategies, the fit (with --fit) and the world's parameters; a ValueError says what is wrong."""
    rows = [parse_strategy(s) for s in args.strategies]
    twice = next((t for i, t in enumerate(args.strategies) if t in args.strategies[:i]), None)
    if twice is not None:
        raise ValueError(f"--strategies gives '{twice}' twice; give each row once")
    for text, (_, over) in zip(args.strategies, rows):
        if over.get("length_prior") and not args.feature_r2:
            raise ValueError(f"strategy '{text}': length_prior reads a feature of each prompt (its token "
                             "length in training); give the simulated prompts one with --feature-r2 R2")
        other = "budget_tokens" if args.unit == "rollouts" else "budget_rollouts"
        if other in over:
            raise ValueError(f"strategy '{text}': the run's total budget is counted in {args.unit} (--unit), so a "
                             f"strategy's own step budget is budget_{args.unit}=N, not {other}")
    fitted = fit_from_run(args) if args.fit is not None else None
    if args.polarise_law is not None and not args.polarise:
        raise ValueError(f"--polarise-law {args.polarise_law} says how --polarise widens the spread; give --polarise "
                         "P > 0 as well")
    fill_defaults(args)
    why = bad_arguments(args)
    if why:
        raise ValueError(why)
    params = SimParams(n_train=args.pool, n_eval=args.eval_size, unsolvable=args.unsolvable, skill0=args.skill0,
                       difficulty_sd=args.difficulty_sd, law=args.law, lr=args.lr, local_lr=args.local_lr,
                       drift=args.drift, max_len=args.max_len, tasks=args.tasks, task_sd=args.task_sd,
                       transfer=args.transfer, feature_r2=args.feature_r2, polarise=args.polarise,
                       polarise_law=args.polarise_law, eval_threshold=args.eval_threshold,
                       revisit_decay=args.revisit_decay)
    if args.feature_r2 and not args.difficulty_sd:
        raise ValueError("--feature-r2 is the share of the prompts' difficulty spread that a feature explains, and "
                         "--difficulty-sd 0 leaves none (the feature would be NaN); give --difficulty-sd > 0")
    try:
        world = World(params, 0, args.prompts_per_step, args.num_generations)  # its own checks
    except ValueError as e:  # said with the flags' names
        raise ValueError(re.sub(rf"\b({'|'.join(_WORLD_FLAGS)})\b", lambda m: _WORLD_FLAGS[m.group(1)], str(e))) from None
    # what only building a row's planner finds (a group cap below --num-generations, a prior_counts file that is
    # missing or names none of the simulated prompts): said now, not as a traceback once the rows before it have run
    for text, (name, over) in zip(args.strategies, rows):
        spec = RunSpec(name, 0, steps=args.steps, prompts_per_step=args.prompts_per_step,
                       num_generations=args.num_generations, unit=args.unit, params=params, planner=over)
        try:
            with warnings.catch_warnings():  # the runs themselves warn
                warnings.simplefilter("ignore")
                build_row_planner(spec, world, args.budget or args.prompts_per_step * args.num_generations)
        except (ValueError, OSError) as e:
            raise ValueError(f"strategy '{text}': {e}") from None
    return rows, fitted, params


_WORLD_FLAGS = {k: "--" + k.replace("_", "-") for k in ("tasks", "task_sd", "difficulty_sd", "transfer", "feature_r2",
                                                         "polarise", "eval_threshold")}
_TASK_FIELDS = ("group_prior", "stratify", "stratify_rollouts")


def idle_settings(args: argparse.Namespace, rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Flags and row fields given that change nothing in this simulation (what `rollwise train` warns of in
    a config, plus the simulator's own cases): one line each."""
    out, default = [], SimParams()
    if args.transfer != default.transfer and args.tasks < 2:
        out.append(f"--transfer {args.transfer:g} has no effect: it splits skill gains between tasks; give --tasks 2 or more")
    if args.task_sd != default.task_sd and not args.tasks:
        out.append(f"--task-sd {args.task_sd:g} has no effect: it is the spread of the tasks' difficulty; give --tasks")
    if args.feature_r2 and not any(over.get("length_prior") for _, over in rows):
        out.append(f"--feature-r2 {args.feature_r2:g} has no effect: only a row with length_prior=true reads the feature")
    overlaps = False  # a row whose planner asks for follow-ups group by group, which --overlap changes
    for text, (name, over) in zip(args.strategies, rows):
        planner, oracle = split_oracle(over)
        try:
            cfg = PlannerConfig(strategy=name, **planner)
            with warnings.catch_warnings():  # a toy pool: its warnings (revisit_cooldown against 8 prompts) are not the run's
                warnings.simplefilter("ignore")
                # without prior_counts: its file names the run's prompts, not the toy pool's (prepare has read it)
                toy = cfg.model_copy(update={"prior_counts": None})
                built = build_planner(toy, [f"u{i}" for i in range(8)], 4, args.num_generations, 64, 0)
        except Exception:  # noqa: BLE001 - the run says what is wrong with the row
            continue
        overlaps |= built.streams and built.follows_up
        # an oracle replaces the belief: as idle as another estimator where no part reads it
        unread = belief_unread(cfg if oracle is None else cfg.model_copy(update={"estimator": oracle}))
        idle = [(unread.split(" shapes ")[0].removeprefix("planner."), "it shapes a belief no part of the planner "
                 "reads")] if unread else []
        if "seed" in planner and not _planner_draws(SimpleNamespace(planner=cfg)):
            idle.append(("seed", "the planner makes no random choice"))
        if "length_ema" in planner and cfg.budget_tokens is None and args.unit != "tokens":
            idle.append(("length_ema", "it is read with a token budget: --unit tokens"))
        idle += [(k, "it acts between tasks; give --tasks 2 or more") for k in _TASK_FIELDS
                 if k in planner and args.tasks < 2]
        if "success_threshold" in planner:
            idle.append(("success_threshold", "a simulated reward is 0 or 1, so every threshold in (0, 1] is the same"))
        out += [f"strategy '{text}': {key} has no effect ({why})" for key, why in idle]
    if args.overlap and not overlaps:
        out.insert(0, "--overlap has no effect: no strategy here asks for more samples group by group (uniform, mopps, "
                      "vade, greso, knapsack and e3 roll out one round a step; dapo and dars decide from whole rounds)")
    return out


def run_command(args: argparse.Namespace) -> int:
    try:
        rows, fitted, params = prepare(args)
    except ValueError as e:
        print(f"rollwise simulate: error: {e}", file=sys.stderr)
        return 2
    for line in idle_settings(args, rows):
        print(f"rollwise simulate: warning: {line}", file=sys.stderr)
    if fitted is not None and not args.quiet:
        print_fit(args, *fitted)
    cut = cut_warning(fitted[0]) if fitted is not None else None
    if cut:
        print(f"rollwise simulate: warning: {cut}", file=sys.stderr)
    if fitted is not None and args.unit == "tokens":
        print("rollwise simulate: warning: --fit does not fit response lengths (the simulator's own length model is "
              "used); compare strategies in rollouts", file=sys.stderr)
    base = RunSpec("uniform", 0, steps=args.steps, prompts_per_step=args.prompts_per_step,
                   num_generations=args.num_generations, unit=args.unit, budget=args.budget, params=params)
    base.budget = args.budget or default_budget(base)
    total = base.budget * args.steps
    key = f"budget_{args.unit}"
    for text, (_, over) in zip(args.strategies, rows):
        if over.get(key) is not None and over[key] > total:
            print(f"rollwise simulate: error: strategy '{text}': its step budget {over[key]:,} is more than the run's "
                  f"total ({base.budget:,} {args.unit}/step x {args.steps} steps = {total:,}); give a step budget of at "
                  "most the total", file=sys.stderr)
            return 2
    if args.target is None and "uniform" not in args.strategies:
        print("rollwise simulate: error: the target is uniform's final accuracy, so --strategies needs a plain "
              "'uniform' row (no ':key=value'), or give --target", file=sys.stderr)
        return 2
    seeds = list(range(args.seed_offset, args.seed_offset + args.seeds))
    if args.workers is None:
        args.workers = min(os.cpu_count() or 1, len(seeds))
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
        print(f"rollwise simulate: error: {e}", file=sys.stderr)
        return 2
    flat = [r.seed for r in results.get("uniform", []) if curve(r, args.unit)[-1] < r.accuracy[0] + FLAT_GAIN]
    if args.target is None and flat:  # then every run "reaches" uniform's final accuracy at once, or nearly
        print(f"rollwise simulate: warning: uniform gained less than {FLAT_GAIN * 100:.1f} points of held-out accuracy "
              f"on {len(flat)} of {len(seeds)} seed{'' if len(seeds) == 1 else 's'}, so reaching its final accuracy is little or no test there and "
              "the shares say little; raise --steps or --lr" + (
                  " (the fitted learning rate is about 0: fit a longer run or more runs)"
                  if getattr(args, "lr_fitted", False) else ""), file=sys.stderr)
    target = f"{args.target:.3f}" if args.target is not None else "uniform's final accuracy (per seed)"
    small_steps(args, rows, base, results)
    for label in same_as_uniform(results):
        print(f"rollwise simulate: warning: '{label}' made uniform's decisions on every seed (the same rollouts, tokens "
              f"and accuracy after every step): its parts act on what prompts showed before, and in {args.steps} steps "
              f"of {base.prompts_per_step} prompts over a pool of {params.n_train} they had little or nothing to act on "
              "(raise --steps or lower --pool), or its options leave it uniform", file=sys.stderr)
    title = (f"rollwise simulate: {len(seeds)} seed{'' if len(seeds) == 1 else 's'}, law={args.law}, {'overlapped rounds where the planner allows' if args.overlap else 'round by round'}, "
             + f"revisit decay {args.revisit_decay}, "
             + f"budget {base.budget:,} {args.unit}/step x "
             f"{args.steps} = {total:,} {args.unit}; target = {target}; 95% t-interval of the mean over seeds; {elapsed:.1f}s")
    print_table(summary, args.unit, len(seeds), title)
    if not args.quiet:
        print(legend(args.unit))
    args.out.mkdir(parents=True, exist_ok=True)
    png = plot_curves(results, args.unit, args.out / "curves.png", title)
    (args.out / "table.md").write_text(f"{title}\n\n{markdown_table(summary, args.unit, len(seeds))}\n"
                                       f"{legend(args.unit)}\n")
    (args.out / "results.json").write_text(json_nulls({
        "args": {k: str(v) if isinstance(v, Path) else [str(x) for x in v] if k == "fit" and v else v
                 for k, v in vars(args).items() if k != "func"},
        "params": asdict(params), "budget_per_step": base.budget, "elapsed_s": elapsed,
        "fit": None if fitted is None else {**asdict(fitted[0]), "fit_steps": args.fit_steps},
        "summary": {s: {k: asdict(v) for k, v in d.items()} for s, d in summary.items()},
        "runs": {s: [{"seed": r.seed, "steps": len(r.rollouts) - 1, "rollouts": float(r.rollouts[-1]),
                      "tokens": float(r.tokens[-1]),
                      "curve": {"rollouts": r.rollouts.tolist(), "tokens": r.tokens.tolist(),
                                "accuracy": r.accuracy.tolist()}} for r in res] for s, res in results.items()},
    }))
    if not args.quiet:
        print(f"curves: {png}\ntable:  {args.out / 'table.md'}")
    return 0


def same_as_uniform(results: dict[str, list]) -> list[str]:
    """The rows whose every seed has uniform's curves exactly (so the same requests every step: the world draws
    its outcomes from one stream per seed); none without a plain uniform row."""
    base = {r.seed: r for r in results.get("uniform", [])}
    same = []
    for label, res in results.items():
        if label == "uniform" or not base or not res:
            continue
        if all(r.seed in base and all(np.array_equal(getattr(r, k), getattr(base[r.seed], k))
                                      for k in ("rollouts", "tokens", "accuracy")) for r in res):
            same.append(label)
    return same


def small_steps(args: argparse.Namespace, rows: list[tuple[str, dict[str, Any]]], base: RunSpec,
                results: dict[str, list]) -> None:
    """Warn about each row whose step budget is less than one group and whose steps spent more than it
    (by a quarter): a step rolls out at least one prompt, so such a row's steps were bigger, and fewer,
    than asked. (A planner that screens with small groups can keep under such a budget.)"""
    key = f"budget_{args.unit}"
    n = base.num_generations
    if args.unit == "tokens":  # one prompt's group at the world's mean response length
        plain = RunSpec("uniform", 0, steps=1, prompts_per_step=base.prompts_per_step, num_generations=n,
                        unit="tokens", params=base.params)
        group = default_budget(plain) / base.prompts_per_step
    else:
        group = float(n)
    for text, (_, over) in zip(args.strategies, rows):
        asked = over.get(key) or base.budget
        runs = results.get(text, [])
        if asked >= group or not runs:
            continue
        steps = [max(len(r.rollouts) - 1, 1) for r in runs]
        spent = float(np.mean([spend(r, args.unit)[-1] / k for r, k in zip(runs, steps)]))
        if spent <= 1.25 * asked:
            continue
        print(f"rollwise simulate: warning: strategy '{text}': its step budget of {asked:,} {args.unit} is less than one "
              f"group ({n} samples" + (f", about {group:,.0f} tokens" if args.unit == "tokens" else "") + "); a step rolls "
              f"out at least one prompt, and it spent {spent:,.0f} {args.unit} a step on average, more than asked; give {key}={int(round(group))} or more",
              file=sys.stderr)


SCALE = ("steps", "prompts_per_step", "num_generations", "pool")
FLAT_GAIN = 0.005  # uniform's gain in held-out accuracy below which the shares are said to mean little
FITTED = ("skill0", "difficulty_sd", "tasks", "task_sd", "polarise", "polarise_law")


def fit_from_run(args: argparse.Namespace) -> tuple[WorldFit, list[Visit]]:
    """Fill the world's and the scale's arguments from the run in args.fit (flags given win for the
    scale and for --unsolvable; the world's fitted ones cannot be given as well)."""
    given = [f"--{k.replace('_', '-')}" for k in FITTED if getattr(args, k) is not None]
    if given:
        raise ValueError(f"--fit fits {', '.join(given)} from the run; drop {'it' if len(given) == 1 else 'them'} "
                         "or drop --fit")
    if args.fit_steps is not None and args.fit_steps < 1:
        raise ValueError(f"--fit-steps must be >= 1, got {args.fit_steps}")
    runs = list(args.fit)
    seen = [Path(r).resolve() for r in runs]
    if len(set(seen)) < len(seen):
        twice = next(str(r) for r, p in zip(runs, seen) if seen.count(p) > 1)
        raise ValueError(f"--fit: {twice} is given twice; each run's first visits count once")
    scales = [run_scale(r) for r in runs]
    scale = dict(scales[0])
    for other, o in zip(runs[1:], scales[1:]):
        if (o["prompts_per_step"], o["num_generations"]) != (scale["prompts_per_step"], scale["num_generations"]):
            raise ValueError(f"--fit: {other} has {o['prompts_per_step']} prompts x {o['num_generations']} samples per "
                             f"step, {runs[0]} {scale['prompts_per_step']} x {scale['num_generations']}; fit runs of one "
                             "setup together")
    if len(runs) > 1:  # the simulation's scale: the runs' median steps; a pool that differs is said
        scale["steps"] = int(np.median([o["steps"] for o in scales]))
        pools = sorted({o["pool"] for o in scales})
        if len(pools) > 1 and args.pool is None:
            print(f"rollwise simulate: warning: the runs' training pools differ ({', '.join(map(str, pools))} prompts); "
                  f"simulating the first run's {scale['pool']}: give --pool to choose", file=sys.stderr)
    for k in SCALE:
        if getattr(args, k) is None:
            setattr(args, k, scale[k])
    n_ref = scale["prompts_per_step"] * scale["num_generations"]
    if not 0.0 <= args.revisit_decay <= 1.0:  # the fit counts the signal with it (said as bad_arguments says it)
        raise ValueError(f"--revisit-decay is a factor in [0, 1] (1 = a revisit teaches like a new prompt), got "
                         f"{args.revisit_decay}")
    if not 0.0 <= args.transfer <= 1.0:  # the fit reads each task's learning with it
        raise ValueError(f"--transfer is a share in [0, 1], got {args.transfer}")
    # each run's own first visits, the signal before each counted as the simulated world will count it: revisits
    # discounted, and a task's learning split between all the signal and its own as --transfer splits it
    visits = [v for run in runs for v in first_visits(run, args.fit_steps, n_ref, args.revisit_decay)]
    fit = fit_world(visits, SimParams().discrimination, unsolvable=args.unsolvable, transfer=args.transfer)
    fit.truncated, fit.truncated_from = fitted_cut_share(runs, visits, args.fit_steps) or (None, None)
    shift = max(fit.learning, 0.0) if fit.learning is not None else None
    if fit.growth is not None:  # the spread grew: a share of the gain goes to it (polarise, the add law)
        total = shift + fit.growth
        args.polarise, args.polarise_law = (round(fit.growth / total, 3) if total > 0 else 0.0), "add"
        shift = total
    if args.lr is None and shift is not None and args.law != "saturating":
        # the same skill gain per effective sample, whatever uniform batch the simulation uses
        args.lr = round(shift * args.prompts_per_step * args.num_generations / n_ref, 4)
        args.lr_fitted = True
    args.skill0, args.difficulty_sd, args.unsolvable = round(fit.skill0, 3), round(fit.difficulty_sd, 3), round(fit.unsolvable, 4)
    args.tasks = len(fit.tasks) if len(fit.tasks) > 1 else 0
    args.task_sd = round(fit.task_sd, 3) if args.tasks else SimParams().task_sd  # one task: no spread to set (or warn of)
    if args.tasks and args.task_sd >= args.difficulty_sd:  # the world needs some spread within tasks
        args.difficulty_sd = round(args.task_sd + 0.01, 3)
    return fit, visits


def fill_defaults(args: argparse.Namespace) -> None:
    d = SimParams()
    for k, v in {"steps": 150, "prompts_per_step": 32, "num_generations": 8, "pool": d.n_train, "lr": d.lr,
                 "unsolvable": d.unsolvable, "skill0": d.skill0, "difficulty_sd": d.difficulty_sd,
                 "tasks": d.tasks, "task_sd": d.task_sd, "polarise": d.polarise,
                 "polarise_law": d.polarise_law}.items():
        if getattr(args, k) is None:
            setattr(args, k, v)


def json_nulls(data: Any) -> str:
    """JSON with NaN and infinities as null ("never"): json.dumps would write NaN, which strict parsers refuse."""
    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x
    return json.dumps(clean(data), indent=1, allow_nan=False)


def bad_arguments(args: argparse.Namespace) -> str | None:
    """The first argument outside its range, said plainly (None when all are fine)."""
    for k, v in vars(args).items():  # NaN passes every comparison below
        if isinstance(v, float) and not math.isfinite(v):
            return f"--{k.replace('_', '-')} must be a finite number, got {v}"
    at_least_1 = ("seeds", "steps", "prompts_per_step", "num_generations", "pool", "eval_size", "max_len", "workers")
    for k in at_least_1:
        if getattr(args, k) is not None and getattr(args, k) < 1:
            return f"--{k.replace('_', '-')} must be >= 1, got {getattr(args, k)}"
    if not 0 <= args.seed_offset < 2**32 - args.seeds:
        return f"--seed-offset must be in [0, 2**32 - --seeds), got {args.seed_offset}"
    if args.fit_steps is not None and not args.fit:
        return "--fit-steps counts the steps of the --fit runs to fit; give --fit RUN_DIR too"
    out = getattr(args, "out", None)
    if out is not None and any(p.exists() and not p.is_dir() for p in (out, *out.parents)):
        return f"--out {out}: a part of this path is a file, not a folder; give --out DIR where you can write"
    if args.budget is not None and args.budget < 1:
        return f"--budget must be >= 1, got {args.budget} (leave it out for the uniform batch)"
    if not 0.0 <= args.unsolvable < 1.0:
        return f"--unsolvable is a share of prompts in [0, 1), got {args.unsolvable}"
    if args.target is not None and not 0.0 < args.target <= 1.0:
        return f"--target is a held-out accuracy in (0, 1], got {args.target}"
    if not 0.0 <= args.revisit_decay <= 1.0:
        return f"--revisit-decay is a factor in [0, 1] (1 = a revisit teaches like a new prompt), got {args.revisit_decay}"
    for k in ("difficulty_sd", "lr", "local_lr", "drift", "task_sd"):
        if getattr(args, k) < 0:
            return f"--{k.replace('_', '-')} must be >= 0, got {getattr(args, k)}"
    return None


def non_world_defaults() -> dict[str, Any]:
    """Flags that --fit leaves as given; the equivalent command repeats those set away from these."""
    d = SimParams()
    return {"law": d.law, "local_lr": d.local_lr, "drift": d.drift, "transfer": d.transfer, "max_len": d.max_len,
            "eval_size": d.n_eval, "eval_threshold": d.eval_threshold, "revisit_decay": d.revisit_decay,
            "feature_r2": d.feature_r2}


def print_fit(args: argparse.Namespace, fit: WorldFit, visits: list[Visit]) -> None:
    """What was fitted, how well it predicts the groups it was fitted to, and the command for the same world."""
    def se(x: float | None) -> str:
        return f" (SE {x:.2f})" if x is not None else ""

    steps = sorted({v.step for v in visits})
    where = str(args.fit[0]) if len(args.fit) == 1 else f"{len(args.fit)} runs ({', '.join(map(str, args.fit))})"
    print(f"fitted to {where}: first visits of {fit.groups} prompts in steps {steps[0]}-{steps[-1]}, "
          f"{len(fit.tasks)} task(s) ({', '.join(fit.tasks)})")
    print(f"  skill0 {fit.skill0:.2f}{se(fit.se_skill0)}, spread within tasks {fit.spread:.2f}{se(fit.se_spread)}, "
          f"between tasks {fit.task_sd:.2f}, unsolvable {fit.unsolvable:.3f}{' (given)' if fit.unsolvable_given else ''}")
    among = " among the other tasks' prompts" if fit.hopeless else ""
    if fit.hopeless:
        print(f"  never solved in their first visits, so taken as unsolvable: {', '.join(f'{t} ({k} first visits)' for t, k in sorted(fit.hopeless.items()))}; "
              f"their share of the first visits, {fit.hopeless_share:.3f}, is part of the unsolvable share, and the simulated "
              f"world has the other {len(fit.tasks)} task(s)")
    if fit.lr_unsolvable is not None and fit.unsolvable_in_fitted_tasks > 0:
        print(f"  the all-wrong groups{among} call for a share of prompts at a zero rate (likelihood ratio {fit.lr_unsolvable:.2f} "
              f"> {LR_CRITICAL}); the simulator keeps them unsolvable for good, which flatters skipping them: "
              "compare with --unsolvable 0" + (f" (here at least {math.ceil(fit.hopeless_share * 1000) / 1000:g}, the hopeless "
                                                "tasks' share)" if fit.hopeless else ""))
    elif fit.lr_unsolvable is not None:
        print(f"  no unsolvable share{among}: one would not explain the groups better (likelihood ratio "
              f"{fit.lr_unsolvable:.2f} <= {LR_CRITICAL})")
    if fit.unsolvable_interval is not None:
        (lo, hi), (k_lo, k_hi), (s_lo, s_hi) = fit.unsolvable_interval, fit.skill0_range, fit.spread_range
        why = "a zero rate and a hard tail explain all-wrong groups alike: " if hi - lo >= 0.05 else ""
        print(f"  {why}the unsolvable share's 95% profile-likelihood "
              f"interval is [{lo:.3f}, {hi:.3f}{' or more' if hi >= PROFILE_GRID[-1] else ''}], and across it skill0 runs {k_lo:.2f} to {k_hi:.2f} and the spread "
              f"{s_lo:.2f} to {s_hi:.2f}; the SEs above hold only at the share chosen"
              + (f" (to simulate the other end, rerun with --unsolvable {hi if fit.unsolvable - lo < hi - fit.unsolvable else lo:.2f} "
                 "added)" if hi - lo >= 0.05 else ""))
    lr_used = (f"--lr {args.lr}" if args.law != "saturating" else
               f"not used by --law saturating, which keeps --lr {args.lr}")
    if fit.learning is not None and fit.growth is None:
        print(f"  learning: skill {fit.learning:+.3f}{se(fit.se_learning)} per effective sample per uniform batch of the run "
              f"(the signal law's lr) -> {lr_used}")
    elif fit.learning is not None:
        floor = " (taken as 0: the simulator's skill does not fall)" if fit.learning < 0 else ""
        print(f"  learning: the mean skill moved {fit.learning:+.3f}{se(fit.se_learning)} per effective sample per uniform "
              f"batch of the run{floor}")
        print(f"  and the spread grew: sd sqrt(spread^2 + (g X)^2), g {fit.growth:.3f}{se(fit.se_growth)} per effective sample "
              f"per uniform batch (likelihood ratio {fit.lr_growth:.2f} > {LR_CRITICAL} against a fixed spread) -> "
              f"--polarise {args.polarise} --polarise-law add (polarise: growth's share of shift + growth) and "
              + (f"--lr {args.lr} (shift + growth)" if args.law != "saturating" else lr_used))
    if fit.learning is not None:
        print(f"  (the effective samples before each visit count a prompt's k-th signal {args.revisit_decay:g}^k"
              + (f", and a task's skill moved by {args.transfer:g} x all of them + {1 - args.transfer:g} x "
                 f"{len(fit.tasks)} x its own" if len(fit.tasks) > 1 else "")
              + ", as the simulation with these --revisit-decay and --transfer does)")
    if fit.truncated is not None:
        print(f"  cut at the length cap: {fit.truncated:.1%} of the "
              + ("first visits' samples fitted" if fit.truncated_from == "lengths" else "samples in the steps fitted"))
    if fit.lr_growth is not None and fit.growth is None:
        print(f"  the spread did not grow measurably (likelihood ratio {fit.lr_growth:.2f} <= {LR_CRITICAL}): no --polarise")
    m = min(v.n for v in visits)
    obs = observed_histogram(visits, m)
    pred = predicted_histogram(fit, m, SimParams().discrimination, visits=visits)
    print(f"  0..{m} correct among the first {m} samples of each first visit: observed "
          f"{' '.join(f'{x:.2f}' for x in obs)}; fitted world {' '.join(f'{x:.2f}' for x in pred)}")
    world = (f"--skill0 {args.skill0} --difficulty-sd {args.difficulty_sd} --unsolvable {args.unsolvable} "
             f"--tasks {args.tasks}" + (f" --task-sd {args.task_sd}" if args.tasks else "") + f" --lr {args.lr}"
             + (f" --polarise {args.polarise} --polarise-law {args.polarise_law}" if args.polarise else "")
             + "".join(f" --{k.replace('_', '-')} {getattr(args, k)}" for k, default in non_world_defaults().items()
                       if getattr(args, k) != default))
    print(f"  the same world without the run: rollwise simulate {world} --prompts-per-step {args.prompts_per_step} "
          f"--num-generations {args.num_generations} --steps {args.steps} --pool {args.pool}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rollwise.sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run_command(parser.parse_args(argv))
