"""The default job (`rollwise train`, 40 steps) with two or more planners, paired by seed (by default
the uniform and the adaptive planner; `--variants A B [C ...]` names others, NAME[:KEY=VALUE...] as in
`rollwise simulate`, and a table reports B - A, another C - A). A KEY with a dot is any config key:
`adaptive:train.max_rollout_tokens=33000` is the adaptive planner stopped by a rollout-token budget.

    .venv/bin/python bench/default_planner.py --seeds 0 1 2 3            # 8 runs, two side by side, ~85 min
    .venv/bin/python bench/default_planner.py --seeds 0 1 2 3 --report   # the table from finished runs
    .venv/bin/python bench/default_planner.py --seeds 20 21 30 31 --out bench/out/default_powered \
        --also bench/out/default_today --report                           # pooled with an earlier study's folder
    .venv/bin/python bench/default_planner.py --variants adaptive adaptive:screen_threshold=0.7 --seeds 30 31 \
        --out bench/out/screen_threshold
    .venv/bin/python bench/default_planner.py --variants adaptive adaptive:success_threshold=1.0 --seeds 20 21 \
        --out bench/out/success_exact --also bench/out/default_today   # only the new arm runs
    .venv/bin/python bench/default_planner.py --variants uniform adaptive:train.max_rollout_tokens=33000 \
        uniform:train.max_rollout_tokens=33000 --seeds 60 61 --out bench/out/half_tokens   # 3 arms, 2 tables

Unless a variant sets train.max_rollout_tokens, all run the same number of steps (the default job is
bounded by steps and time, not tokens), one torch thread each, so that two runs share the 2 cores. Each run is
`rollwise train run.seed=N planner.strategy=S run.torch_threads=1`; held-out accuracy is the
job's own greedy evaluation on its 300 items, before and after. A killed run resumes from its last
checkpoint when the command is run again; a finished run's checkpoints are deleted (about 3 GB a
run; `--keep-checkpoints` keeps them).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from rollwise.tracking import read_metrics
from rollwise.ui import final_eval_missing

STRATEGIES = ("uniform", "adaptive")


def run_name(variant: str, seed: int) -> str:
    return f"{variant.replace(':', '_').replace('=', '-')}-seed{seed}"


def train(out: Path, seed: int, variant: str, keep_checkpoints: bool = False, also: list[Path] = ()) -> None:
    name = run_name(variant, seed)
    done = next((d for d in [out / name, *(f / name for f in also)] if (d / "metrics.jsonl").is_file() and result(d)),
                None)
    if done is not None:  # finished here, or in an earlier study's folder (--also): reused, not rerun
        print(f"{name}: done already ({done})", flush=True)
        return
    strategy, *keys = variant.split(":")
    cmd = [sys.executable, "-m", "rollwise", "train", f"run.seed={seed}", f"planner.strategy={strategy}",
           "run.torch_threads=1", f"run.output_dir={out}", f"run.name={name}", "run.progress=false",
           *[k if "." in k.split("=")[0] else f"planner.{k}" for k in keys]]  # train.max_rollout_tokens=N as given
    if (out / name / "checkpoints").is_dir() and any((out / name / "checkpoints").iterdir()):
        cmd[4:] = ["--resume", str(out / name)]  # a killed run continues from its last checkpoint
    with open(out / f"{name}.log", "w") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    if not keep_checkpoints:  # the table reads metrics.jsonl only; two checkpoints of a run are about 3 GB
        shutil.rmtree(out / name / "checkpoints", ignore_errors=True)
    print(f"{name}: finished", flush=True)


def result(run_dir: Path) -> dict | None:
    """The finished run's figures; None for a run that has not finished (a kill may leave a line cut short,
    which read_metrics skips)."""
    rows = read_metrics(run_dir)
    evals = [r for r in rows if "eval/accuracy" in r]
    steps = [r for r in rows if "time/step_s" in r]
    if len(evals) < 2 or not steps or not finished(run_dir, steps[-1], rows):
        return None
    return {"before": evals[0]["eval/accuracy"], "after": evals[-1]["eval/accuracy"],
            "tokens": steps[-1]["rollout/tokens_total"], "rollouts": steps[-1]["rollout/rollouts_total"],
            "len_last": statistics.mean(r["rollout/response_len_mean"] for r in steps[-5:])}


def finished(run_dir: Path, last: dict, rows: list[dict]) -> bool:
    """The run ended: it logged train.max_steps steps, or generated its train.max_rollout_tokens
    (read from the run's config.yaml; a run without one has 40 steps, the default job's), and its final
    evaluation (eval.at_end) is in `rows`: a run killed during it has only a mid-run one as its last."""
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").is_file() else {}
    train_cfg = (cfg or {}).get("train") or {}
    cap = train_cfg.get("max_rollout_tokens")
    ended = last["step"] >= train_cfg.get("max_steps", 40) or (cap is not None and last["rollout/tokens_total"] >= cap)
    return ended and not final_eval_missing(cfg or {}, rows, last["step"])


def find_run(folders: list[Path], name: str) -> Path | None:
    """The first of `folders` holding the run `name` finished (an unfinished one in an earlier folder does
    not hide a finished one in a later)."""
    return next((f / name for f in folders if (f / name / "metrics.jsonl").is_file() and result(f / name)), None)


def report(out: Path, seeds: list[int], variants: tuple[str, str] = STRATEGIES, also: list[Path] = (),
           table_name: str = "table.md") -> int:
    first, second = variants
    seeds = list(dict.fromkeys(seeds))  # a seed given twice is one pair, not two
    found = {(s, st): find_run([out, *also], run_name(st, s)) for s in seeds for st in variants}
    runs = {key: result(d) for key, d in found.items() if d is not None}
    lines = [f"| seed | before | {first} after (gain) | {second} after (gain) | {second} - {first} | rollout tokens "
             f"{first} / {second} | response length, last 5 steps, {first} / {second} |", "|---|---|---|---|---|---|---|"]
    diffs, ratios, gains = [], [], {st: [] for st in variants}
    for s in seeds:
        u, a = runs.get((s, first)), runs.get((s, second))
        if not (u and a):
            continue
        diffs.append(a["after"] - u["after"])
        ratios.append(a["tokens"] / u["tokens"])
        for st, r in ((first, u), (second, a)):
            gains[st].append(r["after"] - r["before"])
        lines.append(f"| {s} | {u['before']:.1%} | {u['after']:.1%} ({100 * (u['after'] - u['before']):+.1f}) "
                     f"| {a['after']:.1%} ({100 * (a['after'] - a['before']):+.1f}) | {100 * diffs[-1]:+.1f} "
                     f"| {u['tokens']:,.0f} / {a['tokens']:,.0f} | {u['len_last']:.1f} / {a['len_last']:.1f} |")
    if not diffs:
        print(f"no finished pairs under {out}")
        return 1
    table = "\n".join(lines)
    mean_gain = {st: 100 * statistics.mean(g) for st, g in gains.items()}
    summary = (f"mean gain: {first} {mean_gain[first]:+.1f}, {second} {mean_gain[second]:+.1f} points; "
               f"{second} - {first} {100 * statistics.mean(diffs):+.1f}")
    if len(diffs) > 1:
        se = 100 * statistics.stdev(diffs) / len(diffs) ** 0.5
        ratio = f"{100 * statistics.mean(diffs) / se:.1f} SE" if se > 1e-9 else "the same difference on every seed"
        summary += (f" (SE {se:.1f}, {ratio}; mean - 2 SE "
                    f"{100 * statistics.mean(diffs) - 2 * se:+.1f}), {second} ahead on "
                    f"{sum(d > 0 for d in diffs)} of {len(diffs)} seeds")
    summed = [sum(runs[(s, st)]["tokens"] for s in seeds if runs.get((s, first)) and runs.get((s, second)))
              for st in (first, second)]
    summary += (f"\nrollout tokens {second} / {first}: mean {statistics.mean(ratios):.2f} ({min(ratios):.2f}-"
                f"{max(ratios):.2f}), fewer on {sum(r < 1 for r in ratios)} of {len(ratios)}; summed over the seeds "
                f"{summed[1] / summed[0]:.2f} ({summed[1]:,.0f} / {summed[0]:,.0f})")
    print(table + "\n\n" + summary)
    (out / table_name).write_text(table + "\n\n" + summary + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--out", default="bench/out/default_planner")
    ap.add_argument("--variants", nargs="+", default=list(STRATEGIES), metavar="A B",
                    help="two or more planners, NAME[:KEY=VALUE...] (default: uniform adaptive); a KEY with a dot is "
                    "any config key (adaptive:train.max_rollout_tokens=33000), one without is a planner key; a table "
                    "for each later variant reports it minus the first (table.md, then table_3.md, ...)")
    ap.add_argument("--report", action="store_true", help="only print the table of finished runs")
    ap.add_argument("--also", type=Path, nargs="+", default=[], metavar="DIR",
                    help="look for the seeds' finished runs in these output folders too: they are reused, not rerun, "
                    "and the table pairs them (a study pooled with an earlier one, or a new arm against an earlier "
                    "study's runs)")
    ap.add_argument("--keep-checkpoints", action="store_true",
                    help="keep each finished run's checkpoints (by default deleted once it finishes: about 3 GB a run)")
    args = ap.parse_args()
    out = Path(args.out)
    variants = tuple(args.variants)
    if len(variants) < 2:
        ap.error("--variants needs at least two planners")
    if not args.report:
        out.mkdir(parents=True, exist_ok=True)
        jobs = [(s, st) for s in args.seeds for st in variants]
        with ThreadPoolExecutor(2) as pool:  # two runs side by side, one thread each
            list(pool.map(lambda job: train(out, *job, keep_checkpoints=args.keep_checkpoints, also=args.also), jobs))
    rcs = [report(out, args.seeds, (variants[0], v), args.also, "table.md" if i == 1 else f"table_{i + 1}.md")
           for i, v in enumerate(variants[1:], 1)]
    return max(rcs)


if __name__ == "__main__":
    sys.exit(main())
