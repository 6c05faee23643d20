"""The same arm and seeds in two bench folders: how far apart are their final accuracies?

    .venv/bin/python bench/paired_finals.py bench/out/truncated_zero bench/out/adaptive_fixed_round \\
        --arms uniform adaptive --seeds 141 142 143 144 145 146 147 148 149 150

For each arm (a run folder ARM-seedN in both), per seed the final held-out accuracy in the first
folder minus that in the second (points), then the mean with its standard error over seeds and
how many seeds the first folder is ahead on; last, the difference of those differences between
the first two arms, paired by seed (e.g. whether a setting helps adaptive more than uniform).
With `--against ARM` every arm of the first folder is compared with ARM in the second instead
(e.g. adaptive with a setting against uniform without it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import yaml

from rollwise.tracking import read_metrics
from rollwise.ui import stop_reason


def final_accuracy(run: Path) -> float:
    return [r["eval/accuracy"] for r in read_metrics(run) if "eval/accuracy" in r][-1]


def finished(run: Path) -> bool:
    """The run ended, so its last evaluation is its final one: bench/planner.py wrote its curve.json, or
    `rollwise report`'s rule finds a reason it stopped (train.max_steps, the token budget, early
    stopping). A killed run's last evaluation is a mid-run one."""
    if (run / "curve.json").is_file():
        return True
    if not (run / "config.yaml").is_file():
        return False
    reason = stop_reason(yaml.safe_load((run / "config.yaml").read_text()) or {}, read_metrics(run, warn=False))
    return reason is not None and not reason.startswith("not finished")


def paired(diffs: list[float]) -> tuple[float, float]:
    """(mean, standard error) of paired differences; SE nan for fewer than 2."""
    se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
    return statistics.mean(diffs), se


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("first", type=Path)
    ap.add_argument("second", type=Path)
    ap.add_argument("--arms", nargs="+", required=True)
    ap.add_argument("--seeds", nargs="+", type=int, required=True)
    ap.add_argument("--against", help="compare with this arm of the second folder, not the same arm")
    args = ap.parse_args(argv)
    by_arm: dict[str, dict[int, float]] = {}
    other = f" ({args.against})" if args.against else ""
    print(f"| arm | seed | {args.first.name} | {args.second.name}{other} | difference |")
    print("|---|---|---|---|---|")
    for arm in args.arms:
        for seed in args.seeds:
            a = args.first / f"{arm}-seed{seed}"
            b = args.second / f"{args.against or arm}-seed{seed}"
            if not ((a / "metrics.jsonl").exists() and (b / "metrics.jsonl").exists()):
                continue
            if not (finished(a) and finished(b)):
                print(f"(seed {seed} of {arm} left out: {' and '.join(str(d) for d in (a, b) if not finished(d))} "
                      "did not finish)", file=sys.stderr)
                continue
            fa, fb = final_accuracy(a), final_accuracy(b)
            by_arm.setdefault(arm, {})[seed] = 100 * (fa - fb)
            print(f"| {arm} | {seed} | {fa:.1%} | {fb:.1%} | {100 * (fa - fb):+.1f} |")
    print(f"\n| arm | seeds | {args.first.name} - {args.second.name}, points (SE) | ahead on |")
    print("|---|---|---|---|")
    for arm, d in by_arm.items():
        mean, se = paired(list(d.values()))
        print(f"| {arm} | {len(d)} | {mean:+.1f} ({se:.1f}) | {sum(x > 0 for x in d.values())} of {len(d)} |")
    if not args.against and len(args.arms) >= 2 and all(a in by_arm for a in args.arms[:2]):
        x, y = (by_arm[a] for a in args.arms[:2])
        common = sorted(set(x) & set(y))
        if common:
            mean, se = paired([y[s] - x[s] for s in common])
            print(f"\n{args.arms[1]}'s difference minus {args.arms[0]}'s, paired by seed ({len(common)} seeds): "
                  f"{mean:+.1f} points (SE {se:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
