"""Which tasks did each run spend its rollouts on? (exploratory)

    .venv/bin/python bench/task_shares.py bench/out/hopeless_mix --group spell_backward number_sorting chain_sum#2

For every finished run folder in OUT (a bench/planner.py output folder), prints each task's share
of the run's training rollouts (`planner/task_share/<task>` weighted by the step's
`rollout/rollouts`) and, with --group, the summed share of the tasks named there. Then it prints
the mean of each row over the seeds of each arm.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np

from rollwise.tracking import read_metrics

PREFIX = "planner/task_share/"


def task_shares(run: Path) -> dict[str, float]:
    """Each task's share of the run's rollouts, weighted by the rollouts of each step."""
    recs = [r for r in read_metrics(run) if "rollout/rollouts" in r]
    total = sum(r["rollout/rollouts"] for r in recs)
    tasks = sorted({k[len(PREFIX):] for r in recs for k in r if k.startswith(PREFIX)})
    return {t: sum(r.get(PREFIX + t, 0.0) * r["rollout/rollouts"] for r in recs) / max(total, 1) for t in tasks}


def arm_of(run: Path) -> str:
    return run.name.rsplit("-seed", 1)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--group", nargs="*", default=[], help="tasks whose shares are also summed")
    args = ap.parse_args()
    rows: dict[str, list[dict[str, float]]] = defaultdict(list)
    for run in sorted(p for p in args.out.iterdir() if (p / "curve.json").exists()):
        sh = task_shares(run)
        if args.group:
            sh["(group)"] = sum(sh.get(t, 0.0) for t in args.group)
        rows[arm_of(run)].append(sh)
        print(run.name, " ".join(f"{t} {v:.2f}" for t, v in sh.items()))
    for arm, shs in rows.items():
        keys = sorted({k for s in shs for k in s})
        print(f"{arm}, mean of {len(shs)}:", " ".join(f"{k} {np.mean([s.get(k, 0.0) for s in shs]):.2f}" for k in keys))


if __name__ == "__main__":
    main()
