"""Are correct answers the shorter ones in the groups a run learned from?

    .venv/bin/python bench/length_gap.py bench/out/planner_lengths        # every run folder under it

For each run (a folder with metrics.jsonl whose `rollout/groups` log response lengths, rollwise
from 2026-12-04 on), over the groups with both outcomes: how many there were, the mean tokens
of correct and of wrong answers, and the mean within-group difference (correct - wrong); then,
per strategy, the mean of the runs' differences with its standard error over seeds, and the
held-out answer length at the first and last evaluation. A negative difference in many groups
pushes GRPO's answers shorter.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from rollwise.report import lengths_by_outcome
from rollwise.tracking import read_metrics


def run_gap(run_dir: Path) -> dict | None:
    hist = read_metrics(run_dir)
    groups = [split for h in hist for g in h.get("rollout/groups", []) if (split := lengths_by_outcome(g))]
    if not groups:
        return None
    ok = [n for right, _ in groups for n in right]
    bad = [n for _, wrong in groups for n in wrong]
    diffs = [statistics.mean(right) - statistics.mean(wrong) for right, wrong in groups]
    lengths = [h["eval/response_len_mean"] for h in hist if "eval/response_len_mean" in h]
    return {"groups": len(groups), "correct": statistics.mean(ok), "wrong": statistics.mean(bad),
            "gap": statistics.mean(diffs), "answers": (lengths[0], lengths[-1]) if lengths else None}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    runs = {}
    for metrics in sorted(Path(argv[0]).glob("*/metrics.jsonl")):
        got = run_gap(metrics.parent)
        if got is not None:
            runs[metrics.parent.name] = got
    if not runs:
        print(f"no run under {argv[0]} logs response lengths in rollout/groups")
        return 1
    print("| run | groups with both outcomes | tokens, correct / wrong | correct - wrong | held-out answers |")
    print("|---|---|---|---|---|")
    for name, r in runs.items():
        a = f"{r['answers'][0]:.1f} -> {r['answers'][1]:.1f}" if r["answers"] else "-"
        print(f"| {name} | {r['groups']} | {r['correct']:.1f} / {r['wrong']:.1f} | {r['gap']:+.1f} | {a} |")
    by: dict[str, list[dict]] = {}
    for name, r in runs.items():
        by.setdefault(name.rsplit("-seed", 1)[0], []).append(r)
    print("\n| strategy | runs | groups (mean) | correct - wrong, mean over runs (SE) | held-out answers at the end (mean) |")
    print("|---|---|---|---|---|")
    for strategy, rs in by.items():
        gaps = [r["gap"] for r in rs]
        se = f"{statistics.stdev(gaps) / len(gaps) ** 0.5:.1f}" if len(gaps) > 1 else "-"
        ends = [r["answers"][1] for r in rs if r["answers"]]
        end = f"{statistics.mean(ends):.1f}" if ends else "-"
        print(f"| {strategy} | {len(rs)} | {statistics.mean(r['groups'] for r in rs):.0f} | "
              f"{statistics.mean(gaps):+.1f} ({se}) | {end} |")
    return 0


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))
