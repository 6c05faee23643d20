"""Does the length of the held-out answers move with `adaptive`'s lead over uniform?

    .venv/bin/python bench/eval_lengths.py bench/out/planner_long24            # seconds
    .venv/bin/python bench/eval_lengths.py bench/out/planner_long24 --arm adaptive

Reads each finished run of a bench/planner.py output folder (metrics.jsonl: held-out accuracy and
the mean length of the greedy held-out answers at each evaluation, cumulative rollout tokens at
each step). At 0, 1/4, 1/2, 3/4 and all of each seed's uniform token total (linear between
evaluations, as bench/planner.py's mean curves), it prints both arms' mean accuracy and answer
length over the seeds both ran, and the correlation over seeds of (arm - uniform) in accuracy
with (arm - uniform) in answer length. The answers are capped at max_completion_length
(48 tokens on the bench) and a cut answer rarely scores, so shorter answers can mean fewer cut
ones. Exploratory: it tells whether the lead and the length go together, not why.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
from pathlib import Path

import numpy as np

from rollwise.tracking import read_metrics

_spec = importlib.util.spec_from_file_location("planner_bench", Path(__file__).parent / "planner.py")
planner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(planner)  # type: ignore[union-attr]

FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)


def evals(run_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cumulative rollout tokens, accuracy, mean answer length) at each evaluation of a run."""
    rows = [r for r in planner.evaluations(read_metrics(run_dir)) if r[2] is not None]
    return tuple(np.array(c, dtype=float) for c in zip(*rows))  # type: ignore[return-value]


def runs(folder: Path, arm: str) -> dict[int, Path]:
    prefix = f"{arm}-seed"
    return {int(d.name[len(prefix):]): d for d in folder.iterdir()
            if d.name.startswith(prefix) and d.name[len(prefix):].isdigit() and (d / "curve.json").exists()}


def table(folder: Path, arm: str) -> list[str]:
    uni, other = runs(folder, "uniform"), runs(folder, planner.label(arm))
    seeds = sorted(set(uni) & set(other))
    if not seeds:
        raise SystemExit(f"{folder}: no seed with both a finished uniform and a finished {arm} run")
    at: dict[str, list[np.ndarray]] = {"ua": [], "ul": [], "aa": [], "al": []}
    for s in seeds:
        ut, uacc, ulen = evals(uni[s])
        total = ut[-1]
        xs = np.array(FRACTIONS) * total
        at["ua"].append(np.interp(xs, ut, uacc))
        at["ul"].append(np.interp(xs, ut, ulen))
        t, acc, length = evals(other[s])
        at["aa"].append(np.interp(xs, t, acc))
        at["al"].append(np.interp(xs, t, length))
    a = {k: np.array(v) for k, v in at.items()}
    lines = [f"{folder}: {arm} against uniform, {len(seeds)} seeds ({', '.join(map(str, seeds))})", "",
             "| share of uniform's tokens | uniform accuracy | uniform answer length | "
             f"{arm} accuracy | {arm} answer length | corr. over seeds of the two differences |",
             "|---|---|---|---|---|---|"]
    for i, x in enumerate(FRACTIONS):
        da, dl = a["aa"][:, i] - a["ua"][:, i], a["al"][:, i] - a["ul"][:, i]
        corr = (float(np.corrcoef(da, dl)[0, 1]) if len(seeds) > 2 and np.std(da) > 0 and np.std(dl) > 0
                else float("nan"))
        lines.append(f"| {x:g} | {statistics.mean(a['ua'][:, i]) * 100:.1f}% | {statistics.mean(a['ul'][:, i]):.1f} | "
                     f"{statistics.mean(a['aa'][:, i]) * 100:.1f}% | {statistics.mean(a['al'][:, i]):.1f} | "
                     f"{'-' if np.isnan(corr) else f'{corr:+.2f}'} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="a bench/planner.py output folder")
    ap.add_argument("--arm", default="adaptive", help="the strategy set against uniform (default adaptive)")
    args = ap.parse_args(argv)
    print("\n".join(table(args.folder, args.arm)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
