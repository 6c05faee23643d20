"""How each preset spends a token budget (`planner.budget_tokens`) step by step. No model.

    .venv/bin/python bench/token_budgets.py                               # pool 400, 200 steps, seconds
    .venv/bin/python bench/token_budgets.py --pool 2000 --steps 120 --shift 3 --drift 0 dapo uniform  # a hard pool

A made-up world: each prompt has a solve rate (logit normal, sd 1.5, shifted by --shift toward hard)
and a typical response length (lognormal, harder prompts longer); a wrong answer is 2x as long as a
right one, every length is noisy and cut at the 2048-token cap; the policy's skill rises by --drift a
step. Each preset plans 16 prompts of 8 a step under a budget of --budget tokens. Per preset, spending
in units of the budget: the mean over steps 10 on, the worst and the smallest step, the range of the
carry, the carry at the end (kept in full since 2026-12-07 night: what the run owes or is owed; until then
it was capped at one budget either way, and what the cap forgave was a column here), and the share of
steps outside 0.5-1.5 budgets. `bench/token_budget_worlds.py` measures every preset in other worlds.
"""

from __future__ import annotations

import argparse
import os
import warnings

import numpy as np

from rollwise.config import PlannerConfig
from rollwise.planner import STRATEGIES, GroupResult, build_planner

CAP, PPS, N = 2048, 16, 8


def run(strategy: str, args: argparse.Namespace, seed: int) -> dict[str, float]:
    r = np.random.default_rng(0)
    d = r.normal(0, 1.5, args.pool)  # difficulty
    logit = -(d + 0.5 + args.shift)
    base = np.exp(5.2 + 0.45 * d + r.normal(0, 0.6, args.pool))  # lognormal, hard prompts longer
    uids = [f"t{i % 3}:q{i}" for i in range(args.pool)]
    idx = {u: i for i, u in enumerate(uids)}
    pl = build_planner(PlannerConfig(strategy=strategy, budget_tokens=args.budget), uids, PPS, N, CAP, seed)
    rng = np.random.default_rng(seed + 1)
    spent, carry, skill = [], [], 0.0
    for step in range(args.steps):
        reqs, tokens = pl.begin_step(step), 0
        while reqs:
            res = []
            for q in reqs:
                i = idx[q.uid]
                ok = rng.random(q.n) < 1 / (1 + np.exp(-(logit[i] + skill)))
                lengths = base[i] * np.where(ok, 0.7, 1.4) * rng.lognormal(0, 0.3, q.n)
                lengths = np.minimum(np.maximum(lengths, 1).astype(int), CAP)
                tokens += int(lengths.sum())
                res.append(GroupResult(q.uid, ok.astype(float).tolist(), lengths.tolist()))
            reqs = pl.observe(res)
        pl.end_step()
        spent.append(tokens / args.budget)
        carry.append(pl.token_carry / args.budget)
        skill += args.drift
    s = np.array(spent)
    return {"mean": float(s[10:].mean()), "max": float(s.max()), "min": float(s.min()), "carry_min": min(carry),
            "carry_max": max(carry), "carry_end": carry[-1], "outside": float(((s < 0.5) | (s > 1.5)).mean())}


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    warnings.simplefilter("ignore")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("strategies", nargs="*", default=list(STRATEGIES))
    ap.add_argument("--budget", type=int, default=40_000)
    ap.add_argument("--pool", type=int, default=400)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--shift", type=float, default=0.0)
    ap.add_argument("--drift", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"budget {args.budget:,} tokens a step, {args.steps} steps, pool {args.pool}, shift {args.shift}, "
          f"drift {args.drift}, seed {args.seed}; spending in budgets\n")
    print("| preset | mean (steps 10 on) | worst step | smallest step | carry range | carry at the end "
          "| steps outside 0.5-1.5 |")
    print("|---|---|---|---|---|---|---|")
    for strategy in args.strategies:
        m = run(strategy, args, args.seed)
        print(f"| {strategy} | {m['mean']:.3f} | {m['max']:.2f} | {m['min']:.2f} | [{m['carry_min']:.2f}, "
              f"{m['carry_max']:.2f}] | {m['carry_end']:+.2f} | {m['outside']:.0%} |")


if __name__ == "__main__":
    main()
