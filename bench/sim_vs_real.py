"""Does the simulator, fitted to real uniform runs, predict how far `adaptive` leads them?

    # real runs: bench/planner.py --report wrote results.json in its folder
    .venv/bin/rollwise simulate --fit bench/out/planner_lowvar/uniform-seed7{1,2,3,4,5,6,7,8} --pool 200 --steps 12 \\
        --eval-size 400 --seeds 40 --strategies uniform adaptive --out bench/out/sim_lowvar_r1 --quiet
    .venv/bin/rollwise simulate ... --revisit-decay 0.7 --out bench/out/sim_lowvar_r0.7 --quiet     # the same, discounted
    .venv/bin/python bench/sim_vs_real.py bench/out/planner_lowvar bench/out/sim_lowvar_r1 bench/out/sim_lowvar_r0.7

Each folder's curves (accuracy against its budget spent as a share of the same seed's uniform run:
rollout tokens for real runs, the simulator's budget unit for simulated ones, which should be
rollouts for a fitted world since `--fit` does not fit response lengths) are averaged over seeds
as in `bench/planner.py --report`. The table gives the arm's lead over
uniform at a quarter, half, three quarters and all of the budget, in units of uniform's mean gain
over the budget, so a simulator whose accuracy scale differs from greedy accuracy can still be
compared, with a standard error over seeds (paired by seed; uniform's gain taken as fixed), and
the share of uniform's tokens at which the arm's mean curve reaches uniform's mean final.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

_spec = importlib.util.spec_from_file_location("planner_bench", Path(__file__).parent / "planner.py")
planner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(planner)  # type: ignore[union-attr]

FRACTIONS = (0.25, 0.5, 0.75, 1.0)


def load(folder: Path, arm: str) -> tuple[dict, dict]:
    """(uniform, arm) runs as {seed: {"points": [(tokens, accuracy), ...]}} from a bench/planner.py
    report's results.json or a `rollwise simulate` results.json."""
    data = json.loads((folder if folder.is_file() else folder / "results.json").read_text())
    if "runs" in data:  # rollwise simulate: its budget unit (a fitted world has the simulator's lengths, not
        unit = data["args"].get("unit", "rollouts")  # the run's, so simulate's own warning says rollouts)

        def conv(rs: list[dict]) -> dict:
            return {r["seed"]: {"points": list(zip(r["curve"][unit], r["curve"]["accuracy"]))} for r in rs}

        return conv(data["runs"]["uniform"]), conv(data["runs"][arm])
    return ({int(k): v for k, v in data["uniform"].items()}, {int(k): v for k, v in data[arm].items()})


def leads(uni: dict, other: dict) -> dict:
    seeds = sorted(set(uni) & set(other))
    mu = planner.mean_curve(uni, uni, seeds)
    gain = float(mu[-1] - mu[0])
    per_seed = [(planner.mean_curve(uni, other, [s]) - planner.mean_curve(uni, uni, [s])) / gain for s in seeds]
    rows = {}
    for x in FRACTIONS:
        i = int(round(x * (len(planner.GRID) - 1)))
        d = [float(c[i]) for c in per_seed]
        rows[x] = planner.mean_se(d)
    return {"seeds": len(seeds), "gain": gain, "leads": rows, "share": planner.mean_curve_share(uni, other, reps=200)[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", type=Path,
                    help="bench/planner.py or rollwise simulate output folders (or their results*.json files)")
    ap.add_argument("--arm", default="adaptive")
    args = ap.parse_args(argv)
    print("| source | seeds | uniform's mean gain | " + " | ".join(f"lead at {x:g}" for x in FRACTIONS)
          + " | share on the mean curve |")
    print("|---|---|---|" + "---|" * len(FRACTIONS) + "---|")
    for folder in args.folders:
        r = leads(*load(folder, args.arm))
        cells = " | ".join(f"{m:+.2f} ({se:.2f})" for m, se in r["leads"].values())
        print(f"| {folder} | {r['seeds']} | {r['gain'] * 100:.1f} points | {cells} | {planner.fmt_share(r['share'])} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
