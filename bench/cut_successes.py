"""How many of the answers a run counted correct were cut at the length cap? (exploratory)

    .venv/bin/python bench/cut_successes.py bench/out/adaptive_fixed_round [bench/out/truncated_zero ...]

An answer cut at `rollout.max_completion_length` is scored on its last line, so a cut answer that
happens to end on the gold number counts as correct. For every run folder under the folders given
(a metrics.jsonl whose `rollout/groups` log response lengths), over the rollouts it generated: the
share of its correct answers (by the first reward function, as `rollout/groups` records them) that
were cut, in steps 1-3 and over the whole run, and how often a cut answer was correct; then its
final held-out accuracy, the lead over uniform's run of the same seed in the same folder (points),
and its held-out answer tokens at the first and last evaluation. Per arm: the means, and the rank
correlation over seeds of the steps 1-3 share with the lead. With `reward.truncated_reward` set a
cut answer is scored wrong in `rollout/groups`, so its shares are 0 by construction. A response of
exactly the cap's length counts as cut here even when it stopped on its last allowed token.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import yaml

from rollwise.tracking import read_metrics


def cut_shares(history: list[dict], cap: int, early: int = 3) -> dict[str, float]:
    """Shares over the `rollout/groups` of `history` (metric records with a `step`): of correct answers
    cut at `cap` tokens (steps 1..early, and all steps), and of cut answers that were correct. nan
    where there is nothing to count."""
    counts = {"early": [0, 0], "all": [0, 0], "cut": [0, 0]}  # [numerator, denominator]
    for rec in history:
        for _uid, outcomes, lengths in rec.get("rollout/groups", []):
            for ok, n in zip(outcomes, lengths):
                cut = n >= cap
                if ok == "1":
                    counts["all"][0] += cut
                    counts["all"][1] += 1
                    if rec["step"] <= early:
                        counts["early"][0] += cut
                        counts["early"][1] += 1
                if cut:
                    counts["cut"][0] += ok == "1"
                    counts["cut"][1] += 1
    return {k: (a / b if b else float("nan")) for k, (a, b) in counts.items()}


def run_row(run: Path) -> dict:
    hist = read_metrics(run)
    cap = int(yaml.safe_load((run / "config.yaml").read_text())["rollout"]["max_completion_length"])
    evals = [h for h in hist if "eval/accuracy" in h]
    row = cut_shares(hist, cap)
    row.update(final=evals[-1]["eval/accuracy"], answers=(evals[0].get("eval/response_len_mean", float("nan")),
                                                          evals[-1].get("eval/response_len_mean", float("nan"))))
    return row


def _ranks(v: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing their mean rank."""
    order = np.argsort(v, kind="stable")
    r = np.empty(len(v))
    r[order] = np.arange(1, len(v) + 1)
    for val in np.unique(v):
        tied = v == val
        r[tied] = r[tied].mean()
    return r


def _rank_corr(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (ties at their mean rank) over the pairs with neither value NaN;
    NaN for fewer than 3 such pairs or a constant side."""
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = ~(np.isnan(xa) | np.isnan(ya))
    if keep.sum() < 3:
        return float("nan")
    rx, ry = _ranks(xa[keep]), _ranks(ya[keep])
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    missing = [a for a in argv if not Path(a).is_dir()]
    if missing:  # a mistyped folder would print empty tables and exit 0
        print(f"cut_successes.py: no such folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    print("| folder | run | correct answers cut, steps 1-3 / all | cut answers correct | final | lead over uniform "
          "| held-out answer tokens |")
    print("|---|---|---|---|---|---|---|")
    by_arm: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for folder in map(Path, argv):
        rows = {m.parent.name: run_row(m.parent) for m in sorted(folder.glob("*/metrics.jsonl"))
                if (m.parent / "config.yaml").exists()}
        for name, r in rows.items():
            arm, _, seed = name.rpartition("-seed")
            uni = rows.get(f"uniform-seed{seed}")
            lead = 100 * (r["final"] - uni["final"]) if uni else float("nan")
            print(f"| {folder.name} | {name} | {r['early']:.2f} / {r['all']:.2f} | {r['cut']:.2f} | {r['final']:.1%} "
                  f"| {lead:+.1f} | {r['answers'][0]:.1f} -> {r['answers'][1]:.1f} |")
            by_arm.setdefault((folder.name, arm), []).append((r["early"], lead))
    print("\n| folder | arm | runs | correct answers cut, steps 1-3 (mean) | lead (mean) | rank correlation of the two |")
    print("|---|---|---|---|---|---|")
    for (folder, arm), pairs in by_arm.items():
        early, lead = [p[0] for p in pairs], [p[1] for p in pairs]
        corr = _rank_corr(early, lead) if arm != "uniform" else float("nan")
        print(f"| {folder} | {arm} | {len(pairs)} | {np.nanmean(early):.2f} | {np.nanmean(lead):+.1f} | {corr:.2f} |")
    return 0


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))
