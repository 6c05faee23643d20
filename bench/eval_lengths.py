"""Does the length of the held-out answers move with `adaptive`'s lead over uniform?

    .venv/bin/python bench/eval_lengths.py bench/out/planner_long24            # seconds
    .venv/bin/python bench/eval_lengths.py bench/out/planner_long24 --arm adaptive
    .venv/bin/python bench/eval_lengths.py bench/out/discount_long24 --arm adaptive:revisit_discount=0.7 \
        --against adaptive

Reads each finished run of a bench/planner.py output folder (metrics.jsonl: held-out accuracy,
the mean length of the greedy held-out answers and, in runs since 2026-12-05, the share of them
cut at the length cap, at each evaluation; cumulative rollout tokens at each step). At 0, 1/4,
1/2, 3/4 and all of each seed's token total of the `--against` arm (uniform unless given; linear
between evaluations, as bench/planner.py's mean curves), it prints both arms' mean accuracy,
answer length and cut share over the seeds both ran, and the correlation over seeds of
(arm - against) in accuracy with (arm - against) in answer length. The answers are capped at
max_completion_length (48 tokens by default; 128 in the studies since
bench/preregistered/planner_cap128.txt) and a cut answer rarely scores, so shorter
answers can mean fewer cut ones. Exploratory: it tells whether the lead and the length go
together, not why.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
from pathlib import Path

import numpy as np

from rollwise.compare import evaluations
from rollwise.tracking import read_metrics

_spec = importlib.util.spec_from_file_location("planner_bench", Path(__file__).parent / "planner.py")
planner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(planner)  # type: ignore[union-attr]

FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)


def evals(run_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(cumulative rollout tokens, accuracy, mean answer length, share of answers cut at the cap:
    NaN where the run did not log it) at each evaluation of a run."""
    hist = read_metrics(run_dir)
    cut = [h.get("eval/truncated_frac", float("nan")) for h in hist if "eval/accuracy" in h]
    rows = [(*r, c) for r, c in zip(evaluations(hist), cut) if r[2] is not None]
    return tuple(np.array(c, dtype=float) for c in zip(*rows))  # type: ignore[return-value]


def runs(folder: Path, arm: str) -> dict[int, Path]:
    prefix = f"{arm}-seed"
    return {int(d.name[len(prefix):]): d for d in folder.iterdir()
            if d.name.startswith(prefix) and d.name[len(prefix):].isdigit() and (d / "curve.json").exists()}


def table(folder: Path, arm: str, against: str = "uniform") -> list[str]:
    uni, other = runs(folder, planner.label(against)), runs(folder, planner.label(arm))
    seeds = sorted(set(uni) & set(other))
    if not seeds:
        raise SystemExit(f"{folder}: no seed with both a finished {against} and a finished {arm} run")
    at: dict[str, list[np.ndarray]] = {k: [] for k in ("ua", "ul", "uc", "aa", "al", "ac")}
    for s in seeds:
        ut, uacc, ulen, ucut = evals(uni[s])
        xs = np.array(FRACTIONS) * ut[-1]
        t, acc, length, cut = evals(other[s])
        for key, (x, y) in {"ua": (ut, uacc), "ul": (ut, ulen), "uc": (ut, ucut),
                            "aa": (t, acc), "al": (t, length), "ac": (t, cut)}.items():
            at[key].append(np.interp(xs, x, y))
    a = {k: np.array(v) for k, v in at.items()}

    def cut(key: str, i: int) -> str:
        col = a[key][:, i]
        return "-" if np.isnan(col).any() else f"{col.mean() * 100:.1f}%"

    lines = [f"{folder}: {arm} against {against}, {len(seeds)} seeds ({', '.join(map(str, seeds))})", "",
             f"| share of {against}'s tokens | {against} accuracy | answer length | cut at the cap | "
             f"{arm} accuracy | answer length | cut at the cap | corr. over seeds of the two differences |",
             "|---|---|---|---|---|---|---|---|"]
    for i, x in enumerate(FRACTIONS):
        da, dl = a["aa"][:, i] - a["ua"][:, i], a["al"][:, i] - a["ul"][:, i]
        corr = (float(np.corrcoef(da, dl)[0, 1]) if len(seeds) > 2 and np.std(da) > 0 and np.std(dl) > 0
                else float("nan"))
        lines.append(f"| {x:g} | {statistics.mean(a['ua'][:, i]) * 100:.1f}% | {statistics.mean(a['ul'][:, i]):.1f} | "
                     f"{cut('uc', i)} | {statistics.mean(a['aa'][:, i]) * 100:.1f}% | "
                     f"{statistics.mean(a['al'][:, i]):.1f} | {cut('ac', i)} | "
                     f"{'-' if np.isnan(corr) else f'{corr:+.2f}'} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="a bench/planner.py output folder")
    ap.add_argument("--arm", default="adaptive", help="the strategy compared (default adaptive)")
    ap.add_argument("--against", default="uniform",
                    help="the strategy it is set against, whose token total per seed is the scale (default uniform)")
    args = ap.parse_args(argv)
    print("\n".join(table(args.folder, args.arm, args.against)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
