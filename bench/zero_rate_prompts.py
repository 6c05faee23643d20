"""Do the prompts the base model never solves stay unsolved, or are they only hard?

`rollwise simulate --fit` finds that the default mixture's first visits call for a share of
prompts at a zero solve rate (about half, at temperature 1), and the simulator keeps such
prompts unsolvable for good, which flatters the planners that skip them. This bench asks
whether training moves them. It samples `--samples` responses to every held-out prompt of the
default job (never trained on) with the base model and again with a trained checkpoint (the
default job's step 40), counts the correct ones, and prints:

- the histogram of correct answers out of n at both weights, and the simulator's world fitted
  to each (`rollwise.sim.fit`, with and without an unsolvable share);
- how many prompts with none correct at base have at least one at the checkpoint, next to the
  most that could if the zero-rate share the base fit finds stayed at zero:
  1 - u / P(0 of n), the share of all-wrong prompts that the fit does not put in the zero class.

    .venv/bin/python bench/zero_rate_prompts.py --checkpoint runs/epyc-adaptive-s0/checkpoints/step_000040
    # 300 prompts x 8 samples, twice: about 10 min on 2 cores (bf16)
    .venv/bin/python bench/zero_rate_prompts.py --replay   # planners on the measured rates, seconds

Writes bench/out/zero_rate_prompts.json (every prompt's counts). `--replay` plays planners
(the default job's 8 prompts x 8 samples a step, 40 steps) at fixed weights against those
prompts, each with a solve rate drawn per seed from its Beta(c + 1/2, n - c + 1/2) posterior, at
the base weights and at the checkpoint's: the effective ratio (binary rewards) of each, paired
over 50 seeds.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from fixed_weights import count_correct, default_job, finish, replay_planner  # bench/fixed_weights.py

from rollwise.sim.fit import Visit, fit_world, observed_histogram, predicted_histogram


def fits(tasks: list[str], counts: list[int], n: int, label: str) -> float:
    """Print both fits of one measurement; returns the unsolvable share of the free fit."""
    visits = [Visit(t, "1" * c + "0" * (n - c), 1) for t, c in zip(tasks, counts)]
    shares = None
    print(f"\n{label}: observed share of prompts with 0..{n} correct: "
          f"{' '.join(f'{x:.3f}' for x in observed_histogram(visits, n))}")
    u_free = 0.0
    for u in (None, 0.0):
        f = fit_world(visits, unsolvable=u)
        shares = [sum(v.task == t for v in visits) for t in f.tasks]
        kind = "unsolvable share fitted" if u is None else "no unsolvable share"
        lr = f" (likelihood ratio against none {f.lr_unsolvable:.1f})" if f.lr_unsolvable is not None else ""
        print(f"  {kind}: skill0 {f.skill0:.2f}, spread within tasks {f.spread:.2f}, between {f.task_sd:.2f}, "
              f"unsolvable {f.unsolvable:.3f}{lr}, log-likelihood {f.loglik:.1f}")
        print(f"    predicted {' '.join(f'{x:.3f}' for x in predicted_histogram(f, n, task_shares=shares))}")
        if u is None:
            u_free = f.unsolvable
    return u_free


REPLAYED = ["uniform", "adaptive", "adaptive:stratify_rollouts=false", "mopps"]


def replay(seeds: int = 50, steps: int = 40) -> None:
    """Planners against the measured prompts at fixed weights (module docstring)."""
    from rollwise.config import PlannerConfig
    from rollwise.planner import build_planner
    from rollwise.sim.command import parse_strategy

    data = json.loads(Path("bench/out/zero_rate_prompts.json").read_text())
    rows, n = data["per_prompt"], data["samples"]
    uids = [f"{r['task']}:{i}" for i, r in enumerate(rows)]
    for weights in ("base", "trained"):
        c = np.array([r[weights] for r in rows], dtype=float)
        res = {}
        for text in REPLAYED:
            name, over = parse_strategy(text)
            ratios = []
            for seed in range(seeds):
                rng = np.random.default_rng([seed, 11])
                q = dict(zip(uids, rng.beta(c + 0.5, n - c + 0.5)))
                pl = build_planner(PlannerConfig(strategy=name, **over), uids, 8, 8, 48, seed)
                gen, eff, _ = replay_planner(pl, q, rng, steps)
                ratios.append(eff / gen)
            res[text] = np.array(ratios)
        label = "base weights" if weights == "base" else f"checkpoint {data['checkpoint']}"
        print(f"\nreplay at {label}: {len(uids)} measured prompts, 8 x 8 a step, {steps} steps, {seeds} seeds")
        for text, r in res.items():
            d = r - res["uniform"]
            extra = "" if text == "uniform" else f"   minus uniform {d.mean():+.3f} (SE {d.std(ddof=1) / np.sqrt(seeds):.3f})"
            print(f"  {text:34s} effective ratio {r.mean():.3f}{extra}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", help="a checkpoint folder of the default job")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--replay", action="store_true", help="only the planner replay on the saved measurement")
    args = ap.parse_args()
    if args.replay:
        replay()
        return
    if not args.checkpoint:
        ap.error("--checkpoint is required (unless --replay)")
    run, cfg = default_job("zero-rate-", dtype="bfloat16")
    for it, ids in zip(run.eval_items, run.eval_ids):  # count_correct samples from the run's prompt tables
        run.ids_by_uid[it.uid], run.items_by_uid[it.uid] = ids, it
    uids = [it.uid for it in run.eval_items]
    tasks = [it.task for it in run.eval_items]
    base = count_correct(run, cfg, uids, args.samples, progress=True)
    from rollwise.models import merged_state_dict
    from rollwise.training.checkpoint import load_checkpoint_weights

    load_checkpoint_weights(Path(args.checkpoint), run.model)
    run.engine.load_weights(merged_state_dict(run.model), version=1)
    trained = count_correct(run, cfg, uids, args.samples, progress=True)
    n = args.samples
    b = [base[u] for u in uids]
    t = [trained[u] for u in uids]
    u_base = fits(tasks, b, n, f"base model ({len(uids)} held-out prompts x {n})")
    fits(tasks, t, n, f"checkpoint {args.checkpoint}")
    b, t = np.array(b), np.array(t)
    zero = b == 0
    moved = float((t[zero] > 0).mean()) if zero.any() else float("nan")
    bound = 1.0 - u_base / max(float(zero.mean()), 1e-9)
    print(f"\nprompts with 0 of {n} at base: {int(zero.sum())} ({zero.mean():.3f}); with at least one correct at the "
          f"checkpoint: {moved:.3f} of them")
    print(f"if the base fit's zero-rate share ({u_base:.3f}) stayed at zero, at most {max(bound, 0.0):.3f} of them could")
    print(f"prompts with >= 1 at base: {int((~zero).sum())}; still >= 1 at the checkpoint: {(t[~zero] > 0).mean():.3f}")
    print(f"mean solve rate: base {b.mean() / n:.3f}, checkpoint {t.mean() / n:.3f}")
    finish(run, "zero_rate_prompts", "", {"checkpoint": args.checkpoint, "samples": n, "per_prompt": [
        {"uid": u, "task": k, "base": int(x), "trained": int(y)} for u, k, x, y in zip(uids, tasks, b, t)]})


if __name__ == "__main__":
    main()
