"""Synchronous against asynchronous training on this machine, same model, data and seed.

    .venv/bin/python bench/async.py                 # 30 steps each (the default job), ~25 min on 2 cores
    .venv/bin/python bench/async.py --steps 6       # quicker look

* sync: `rollwise train` with both cores for generation, then both for training, in turn;
* async: the same job with distributed.async_training=true, backend=ray, one rollout worker on
  one core and the trainer on the other (run.torch_threads=1), staleness bound eta
  (`--eta`, default 1) and the decoupled PPO objective.

Reported: trained samples per second over the training loop (sum of time/step_s; set-up and
the evaluations before and after are outside it), greedy held-out accuracy after the same
number of steps (so the same number of samples), and the ideal overlap speed-up computed from
the measured times: sync step time / max(async generation + reward time, async training time),
both per step as the async run measured them on one core each. Target: achieved >= 85% of ideal.
Writes bench/out/async/results.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path

from rollwise.config import load_config
from rollwise.loop import train


def run(args, mode: str, out: Path) -> dict:
    name = f"seed{args.seed}-{mode}"
    shutil.rmtree(out / name, ignore_errors=True)  # a benchmark starts from scratch
    overrides = [f"train.max_steps={args.steps}", f"run.seed={args.seed}", "run.save_every=0",
                 f"run.output_dir={out}", f"run.name={name}", "run.progress=false", "eval.at_start=false",
                 f"data.eval_size={args.eval_size}", f"planner.strategy={args.strategy}"]
    if mode == "sync":
        overrides += ["run.torch_threads=2"]
    else:
        overrides += ["run.torch_threads=1", "distributed.async_training=true", "distributed.backend=ray",
                      "distributed.rollout_workers=1", "distributed.worker_threads=1",
                      f"distributed.max_staleness={args.eta}", "algo.offpolicy_correction=decoupled"]
    res = train(load_config(None, overrides), quiet=True)
    h = res.history
    trained = sum(r["train/sequences"] for r in h)
    loop_s = sum(r["time/step_s"] for r in h)
    tail = h[1:] if len(h) > 1 else h  # per-step component times without the first (pipeline fill)
    return {
        "name": name,
        "steps": len(h),
        "trained_samples": trained,
        "loop_s": loop_s,
        "samples_per_s": trained / loop_s,
        "step_s": statistics.mean(r["time/step_s"] for r in tail),
        "generate_s": statistics.mean(r["time/generate_s"] + r["time/reward_s"] for r in tail),
        "train_s": statistics.mean(r["time/train_s"] for r in tail),
        "staleness_max": max((r.get("async/staleness_max", 0.0) for r in h), default=0.0),
        "staleness_mean": statistics.mean(r.get("async/staleness_mean", 0.0) for r in h),
        "accuracy": res.eval_after.get("eval/accuracy"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--eta", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-size", type=int, default=300)
    ap.add_argument("--strategy", default="uniform", help="planner.strategy of both runs (the recorded figures are "
                    "uniform's; rollwise's default is adaptive)")
    ap.add_argument("--out", default="bench/out/async")
    args = ap.parse_args()
    out = Path(args.out)
    sync, asyn = run(args, "sync", out), run(args, "async", out)
    ideal = sync["step_s"] / max(asyn["generate_s"], asyn["train_s"])
    achieved = asyn["samples_per_s"] / sync["samples_per_s"]
    print(f"{'run':<14}{'samples/s':>10}{'step s':>8}{'gen+rew s':>10}{'train s':>8}{'stale max':>10}{'accuracy':>9}")
    for r in (sync, asyn):
        print(f"{r['name']:<14}{r['samples_per_s']:>10.2f}{r['step_s']:>8.2f}{r['generate_s']:>10.2f}"
              f"{r['train_s']:>8.2f}{r['staleness_max']:>10.0f}{r['accuracy']:>9.3f}")
    print(f"speed-up achieved {achieved:.2f}x, ideal overlap {ideal:.2f}x, share of ideal {achieved / ideal:.0%}")
    (out / "results.json").write_text(json.dumps({"sync": sync, "async": asyn, "ideal": ideal, "achieved": achieved},
                                                  indent=2))


if __name__ == "__main__":
    main()
