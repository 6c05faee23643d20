"""Runs of bench/planner.py that a deadline stopped before their last evaluation, compared with
uniform at equal rollout tokens. bench/planner.py --report reads finished runs only; this reads
every run's metrics.jsonl, so it is exploratory wherever the study's rule counts only finished runs.

    .venv/bin/python bench/planner_partial.py bench/out/gpu/bench/out/planner_gpu --strategy adaptive

Per seed: uniform's final accuracy and tokens; the strategy's tokens spent and its last
evaluation; the first evaluation at or above uniform's final (its tokens as a share of
uniform's, or "not by X" with X its last evaluation's tokens as a share of uniform's); and the strategy's
accuracy at its last evaluation minus uniform's at the same tokens (linear between uniform's
evaluations); and uniform's samples with a gradient per generated token over the strategy's, the
share of tokens it would need if held-out skill followed those samples alone. Then the median
share ("not by" counts as above every share), the mean difference with its standard error over
seeds, and the median of that last ratio.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from rollwise.tracking import read_metrics


def read_curve(run_dir: Path) -> tuple[list[tuple[float, float]], float]:
    """[(cumulative rollout tokens, held-out accuracy)] at each evaluation, and the tokens spent."""
    hist = read_metrics(run_dir)  # a line cut short by the deadline's kill is skipped
    tokens_at = {0: 0.0}
    for h in hist:
        if "rollout/tokens_total" in h:
            tokens_at[h["step"]] = h["rollout/tokens_total"]
    points = [(tokens_at.get(h["step"], 0.0), h["eval/accuracy"]) for h in hist if "eval/accuracy" in h]
    return points, max(tokens_at.values())


def effective_per_token(run_dir: Path) -> float | None:
    """Samples in groups with a gradient per generated token over the run (None where not logged)."""
    eff = tok = 0.0
    for h in read_metrics(run_dir, warn=False):
        if "planner/trained_samples" in h and "planner/effective_ratio_trained" in h and "rollout/generated_tokens" in h:
            eff += h["planner/trained_samples"] * h["planner/effective_ratio_trained"]
            tok += h["rollout/generated_tokens"]
    return eff / tok if tok else None


def at_tokens(points: list[tuple[float, float]], t: float) -> float:
    """Accuracy at `t` tokens, linear between evaluations (the last one beyond them)."""
    for (t0, a0), (t1, a1) in zip(points, points[1:]):
        if t0 <= t <= t1:
            return a0 + (a1 - a0) * (t - t0) / (t1 - t0) if t1 > t0 else a1
    return points[-1][1]


def compare(folder: Path, strategy: str) -> list[str]:
    label = strategy.replace(":", "+").replace("=", "-")
    rows = ["| seed | uniform final (tokens) | strategy tokens spent | its last evaluation | share to reach uniform's final "
            "| last evaluation - uniform at equal tokens | uniform's token share at equal effective samples |",
            "|---|---|---|---|---|---|---|"]
    shares, diffs, equal_eff = [], [], []
    for uni_dir in sorted(folder.glob("uniform-seed*")):
        seed = uni_dir.name.removeprefix("uniform-seed")
        other = folder / f"{label}-seed{seed}"
        if not other.is_dir():
            continue
        uni, uni_spent = read_curve(uni_dir)
        pts, spent = read_curve(other)
        if len(pts) < 2:
            continue
        target, total = uni[-1][1], uni[-1][0]
        reach = next((t for t, a in pts if a >= target - 1e-9), None)
        share = reach / total if reach is not None else float("inf")
        shares.append(share)
        t_last, a_last = pts[-1]
        diff = a_last - at_tokens(uni, t_last)
        diffs.append(diff)
        eu, eo = effective_per_token(uni_dir), effective_per_token(other)
        ratio = eu / eo if eu and eo else None  # tokens it needs for uniform's effective samples, as a share
        if ratio is not None:
            equal_eff.append(ratio)
        rows.append(f"| {seed} | {target:.1%} ({total:,.0f}) | {spent:,.0f} | {a_last:.1%} at {t_last:,.0f} "
                    f"| {f'{share:.2f}' if reach is not None else f'not by {pts[-1][0] / total:.2f}'} | {diff * 100:+.1f} "
                    f"| {'-' if ratio is None else f'{ratio:.2f}'} |")
    if not diffs:
        return [f"no seed has both uniform and {strategy} under {folder}"]
    se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
    med = statistics.median(shares)
    rows += ["", f"{strategy}: {len(diffs)} seeds; share median {'above every share' if med == float('inf') else f'{med:.2f}'}, "
             f"at most 0.5 on {sum(s <= 0.5 for s in shares)} of {len(shares)}; last evaluation - uniform at equal tokens "
             f"{statistics.mean(diffs) * 100:+.1f} points (SE {se * 100:.1f}), ahead on {sum(d > 0 for d in diffs)} of {len(diffs)}"]
    if equal_eff:  # what the share would be if held-out skill followed effective samples alone
        rows.append(f"uniform's token share at equal effective samples: median {statistics.median(equal_eff):.2f} "
                    f"over {len(equal_eff)} seeds")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="a bench/planner.py --out folder")
    ap.add_argument("--strategy", default="adaptive")
    args = ap.parse_args()
    print("\n".join(compare(args.folder, args.strategy)))


if __name__ == "__main__":
    main()
