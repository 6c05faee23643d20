"""Where in its budget does an arm train on prompts it has trained before? (exploratory)

    .venv/bin/python bench/revisits_by_budget.py bench/out/truncated_zero --arm adaptive \\
        --seeds 141 142 143 144 145 146 147 148 149 150

For each seed, the arm's steps are placed by the rollout tokens spent so far as a share of uniform's
run of the same seed (the bench's budget), in fifths. Over the groups trained with a gradient
(both outcomes in the group), it prints per fifth the share of trained samples whose prompt had
been trained with a gradient before (a revisit) and the number of prompts trained for the first
time, summed over seeds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rollwise.tracking import read_metrics

FIFTHS = 5


def by_fifth(history: list[dict], budget: float) -> tuple[list[int], list[int], list[int]]:
    """(revisit samples, trained samples, prompts trained for the first time) per fifth of `budget`,
    over the steps of `history` (records with `rollout/groups` and `rollout/tokens_total`)."""
    revisits, trained, new = [0] * FIFTHS, [0] * FIFTHS, [0] * FIFTHS
    seen: set[str] = set()
    for rec in history:
        if "rollout/groups" not in rec:
            continue
        b = min(int(FIFTHS * rec["rollout/tokens_total"] / budget), FIFTHS - 1)
        for uid, outcomes, _lengths in rec["rollout/groups"]:
            if 0 < outcomes.count("1") < len(outcomes):
                trained[b] += len(outcomes)
                if uid in seen:
                    revisits[b] += len(outcomes)
                else:
                    new[b] += 1
                    seen.add(uid)
    return revisits, trained, new


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--arm", default="adaptive")
    ap.add_argument("--seeds", nargs="+", type=int, required=True)
    args = ap.parse_args(argv)
    rev, tot, new = [0] * FIFTHS, [0] * FIFTHS, [0] * FIFTHS
    for seed in args.seeds:
        uni = [r for r in read_metrics(args.out / f"uniform-seed{seed}") if "rollout/tokens_total" in r]
        got = by_fifth(read_metrics(args.out / f"{args.arm}-seed{seed}"), uni[-1]["rollout/tokens_total"])
        for acc, part in zip((rev, tot, new), got):
            for i in range(FIFTHS):
                acc[i] += part[i]
    print("| share of uniform's tokens | " + " | ".join(f"{i / FIFTHS:.1f}-{(i + 1) / FIFTHS:.1f}" for i in range(FIFTHS))
          + " |")
    print("|---" * (FIFTHS + 1) + "|")
    print("| revisit share of trained samples | " + " | ".join(
        f"{r / t:.2f}" if t else "-" for r, t in zip(rev, tot)) + " |")
    print("| prompts trained for the first time | " + " | ".join(str(n) for n in new) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
