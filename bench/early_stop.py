"""What eval.early_stopping_patience would have done to finished runs, replayed from their logs.

    .venv/bin/python bench/early_stop.py bench/out/planner_halfstep bench/out/planner_seeds58 --arm adaptive

For every run folder ARM-seedN (bench/planner.py's names) under the folders, the
run's own evaluations during training are fed, in order, to the same BestTracker the training
loop uses. For each patience it reports over the runs: how many would have stopped, the share of
the run's rollout tokens spent by the stop, the held-out accuracy of the weights at the stop and
of the best weights kept (eval.save_best) minus the run's final accuracy (paired, SE over runs).
The accuracy of the best weights is measured on the items that chose them, so it is optimistic;
the accuracy at the stop is the honest figure.
"""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path

from rollwise.tracking import read_metrics
from rollwise.training.best import METRIC, BestTracker


def replay(run_dir: Path, patience: int, min_delta: float = 0.0) -> dict[str, float] | None:
    """One run under early stopping: the stop step (None: no stop), tokens spent, accuracies."""
    hist = read_metrics(run_dir, warn=False)
    tokens = {h["step"]: h["rollout/tokens_total"] for h in hist if "rollout/tokens_total" in h}
    evals = [(h["step"], h[METRIC]) for h in hist if METRIC in h]
    if len(evals) < 2 or not tokens:
        return None
    last = max(tokens)
    t = BestTracker(patience, min_delta)
    stop, at_stop = last, evals[-1][1]
    for step, acc in evals:
        t.observe(step, acc)
        if 0 < step < last and t.should_stop:  # the loop checks after its evaluations during training
            stop, at_stop = step, acc
            break
    return {"stopped": float(stop < last), "share": tokens[stop] / tokens[last], "at_stop": at_stop,
            "best": float(t.best), "final": evals[-1][1]}


def _mean_se(xs: list[float]) -> str:
    se = statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan")
    return f"{statistics.mean(xs):+.3f} (SE {se:.3f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--arm", default="adaptive", help="the runs to replay: folders named ARM-seedN (bench/planner.py)")
    ap.add_argument("--patience", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--min-delta", type=float, default=0.0)
    args = ap.parse_args(argv)
    pattern = re.compile(re.escape(args.arm) + r"-seed\d+")
    runs = sorted(p.parent for f in args.folders for p in f.glob("*/metrics.jsonl") if pattern.fullmatch(p.parent.name))
    if not runs:
        print(f"no {args.arm}-seedN runs under {' '.join(map(str, args.folders))}")
        return 2
    print(f"{len(runs)} {args.arm} runs; min_delta {args.min_delta:g}\n")
    print("| patience | runs stopped | share of tokens spent (mean) | at the stop - final | best kept - final (optimistic) |")
    print("|---|---|---|---|---|")
    for p in args.patience:
        rows = [r for d in runs if (r := replay(d, p, args.min_delta))]
        print(f"| {p} | {sum(r['stopped'] for r in rows):.0f} of {len(rows)} | "
              f"{statistics.mean(r['share'] for r in rows):.2f} | {_mean_se([r['at_stop'] - r['final'] for r in rows])} | "
              f"{_mean_se([r['best'] - r['final'] for r in rows])} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
