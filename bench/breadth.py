"""Does an arm's lead over uniform go with how many prompts it trained on? (exploratory)

    .venv/bin/python bench/breadth.py bench/out/per_token_cap128:adaptive:score_per_token=true \\
        bench/out/discount_cap128:adaptive:revisit_discount=0.7 bench/out/planner_cap128:adaptive

Each argument is a bench/planner.py output folder and an arm in it (as given to --strategies).
For every seed where both the arm's run and uniform's have finished, it prints the prompts the
arm trained on with a gradient (planner/prompts_trained at its last step) and its final held-out
accuracy minus uniform's (points) and how often its answers hit the length cap (the mean of
rollout/truncated_frac over steps 1-6, eval/truncated_frac at its last evaluation), then per
argument the means over its seeds, and the correlation over all the pairs given. Seeds shared
between folders count once per folder, so the pairs are not independent. Give `OUT:uniform` for
uniform's own prompts trained and cut shares (its lead is 0).
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import numpy as np

from rollwise.tracking import read_metrics

_spec = importlib.util.spec_from_file_location("eval_lengths", Path(__file__).parent / "eval_lengths.py")
eval_lengths = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(eval_lengths)  # type: ignore[union-attr]


def final(run: Path) -> tuple[float, float]:
    """(last eval/accuracy, last planner/prompts_trained) of a finished run."""
    recs = list(read_metrics(run))
    acc = [r["eval/accuracy"] for r in recs if "eval/accuracy" in r]
    trained = [r["planner/prompts_trained"] for r in recs if "planner/prompts_trained" in r]
    return acc[-1], trained[-1] if trained else 0.0


def cuts(run: Path) -> tuple[float, float]:
    """(mean rollout/truncated_frac over steps 1-6, eval/truncated_frac at the last evaluation) of a
    run; nan where the run did not log it."""
    recs = list(read_metrics(run))
    early = [r["rollout/truncated_frac"] for r in recs if "rollout/truncated_frac" in r and 1 <= r.get("step", -1) <= 6]
    held = [r["eval/truncated_frac"] for r in recs if "eval/truncated_frac" in r]
    return float(np.mean(early)) if early else float("nan"), held[-1] if held else float("nan")


def leads(folder: Path, arm: str) -> list[tuple[str, float, float]]:
    """(seed, prompts trained, final - uniform in points) for each seed of `arm` in `folder` where
    both its run and uniform's have finished."""
    uni = eval_lengths.runs(folder, "uniform")
    out = []
    for seed, run in sorted(eval_lengths.runs(folder, eval_lengths.planner.label(arm)).items()):
        if seed in uni:
            acc, trained = final(run)
            out.append((str(seed), trained, 100 * (acc - final(uni[seed])[0])))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("pairs", nargs="+", metavar="OUT:ARM")
    args = ap.parse_args()
    xs, ys = [], []
    for pair in args.pairs:
        folder, arm = pair.split(":", 1)
        runs = eval_lengths.runs(Path(folder), eval_lengths.planner.label(arm))
        rows = [(seed, trained, lead, *cuts(runs[int(seed)])) for seed, trained, lead in leads(Path(folder), arm)]
        for seed, trained, lead, early, held in rows:
            xs.append(trained)
            ys.append(lead)
            print(f"{folder} {arm} seed {seed}: {trained:.0f} prompts trained, final - uniform {lead:+.2f}, "
                  f"training rollouts cut (steps 1-6) {early:.1%}, held-out answers cut at the end {held:.1%}")
        if rows:
            means = np.mean([r[1:] for r in rows], axis=0)
            print(f"{folder} {arm}, mean of {len(rows)} seeds: {means[0]:.1f} prompts trained, final - uniform "
                  f"{means[1]:+.2f}, training rollouts cut (steps 1-6) {means[2]:.1%}, held-out answers cut at the "
                  f"end {means[3]:.1%}")
    if len(xs) > 2:
        print(f"{len(xs)} pairs: correlation of prompts trained with final - uniform r = {np.corrcoef(xs, ys)[0, 1]:.2f}")


if __name__ == "__main__":
    main()
