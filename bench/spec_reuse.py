"""Speculative reuse (SPEC-RL) against plain generation: multi-epoch training on a small prompt set.

    .venv/bin/python bench/spec_reuse.py                        # seeds 0 1, ~45 min on 2 cores
    .venv/bin/python bench/spec_reuse.py --seeds 0 --steps 12    # quicker look

For each seed, two runs of `rollwise train` that differ only in `rollout.speculative_reuse`
(both engines compute in `--engine-dtype`, float32 by default, which reuse needs):
SmolLM2-135M-Instruct on the default task mixture restricted to `--train-size` prompts, so
that `--steps` steps of `--prompts` prompts x 8 samples revisit every prompt many times
(epochs). Reported per run: rollout time (sum of time/generate_s, verification included),
tokens sampled by the engine, the acceptance rate and the greedy held-out accuracy at the end
(same `--eval-size` items for both). Ratios are measured side by side in one process.
Writes bench/out/spec_reuse/results.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path

from rollwise.config import load_config
from rollwise.loop import train


def run(args, seed: int, spec: bool, out: Path) -> dict:
    name = f"seed{seed}-{'spec' if spec else 'plain'}"
    shutil.rmtree(out / name, ignore_errors=True)  # a benchmark starts from scratch
    overrides = [
        f"data.train_size={args.train_size}", f"data.eval_size={args.eval_size}",
        f"rollout.prompts_per_step={args.prompts}", "rollout.num_generations=8",
        f"rollout.speculative_reuse={str(spec).lower()}", f"rollout.spec_lenience={args.lenience}",
        f"train.max_steps={args.steps}", f"run.seed={seed}", "run.save_every=0", f"run.output_dir={out}",
        f"run.name={name}", "run.progress=false", "eval.at_start=false", "eval.at_end=true",
        f"run.torch_threads={args.threads}", f"rollout.engine_dtype={args.engine_dtype}",
        "planner.strategy=uniform",  # the recorded figures are uniform's; pass planner.strategy=... to change it
    ] + list(args.overrides)
    res = train(load_config(None, overrides), quiet=True)
    h = res.history
    per_epoch = max(1, args.train_size // args.prompts)
    gen = [r["time/generate_s"] for r in h]
    return {
        "name": name,
        "rollout_s": sum(gen),
        "rollout_s_first_epoch": sum(gen[:per_epoch]),
        "rollout_s_later_epochs": sum(gen[per_epoch:]),
        "sampled_tokens": sum(r["rollout/generated_tokens"] for r in h),
        "tokens_reused": sum(r.get("spec/tokens_reused", 0.0) for r in h),
        "acceptance_rate": statistics.mean([r["spec/acceptance_rate"] for r in h[per_epoch:]]) if spec else None,
        "accuracy": res.eval_after.get("eval/accuracy"),
        "step_s": sum(r["time/step_s"] for r in h),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--train-size", type=int, default=24)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step")
    ap.add_argument("--eval-size", type=int, default=200)
    ap.add_argument("--lenience", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--engine-dtype", default="float32", choices=["auto", "float32", "bfloat16"],
                    help="engine dtype of both runs (auto: bf16 plain, fp32 reuse, as rollwise train picks)")
    ap.add_argument("--out", default="bench/out/spec_reuse")
    ap.add_argument("--modes", nargs="+", choices=["plain", "spec"], default=["plain", "spec"],
                    help="runs per seed (the comparison lines need both)")
    ap.add_argument("overrides", nargs="*", help="extra KEY=VALUE config overrides for every run")
    args = ap.parse_args()
    out = Path(args.out)
    if args.engine_dtype != "float32":
        out = out / args.engine_dtype
    rows = []
    for seed in args.seeds:
        for spec in [m == "spec" for m in args.modes]:
            rows.append(run(args, seed, spec, out))
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n{args.steps} steps x {args.prompts} prompts x 8 samples on {args.train_size} prompts "
          f"({args.steps * args.prompts / args.train_size:.0f} epochs), lenience {args.lenience:g}")
    print(f"{'run':<14}{'rollout s':>10}{'tokens':>9}{'reused':>8}{'accept':>8}{'held-out':>10}")
    for r in rows:
        acc = f"{r['acceptance_rate']:.0%}" if r["acceptance_rate"] is not None else "-"
        print(f"{r['name']:<14}{r['rollout_s']:>10.0f}{r['sampled_tokens']:>9.0f}{r['tokens_reused']:>8.0f}{acc:>8}"
              f"{r['accuracy']:>10.1%}")
    for seed in args.seeds if len(args.modes) == 2 else []:
        plain, spec = [r for r in rows if r["name"].startswith(f"seed{seed}-")]
        print(f"seed {seed}: rollout time plain/spec {plain['rollout_s'] / spec['rollout_s']:.2f}x "
              f"(after the first epoch {plain['rollout_s_later_epochs'] / max(spec['rollout_s_later_epochs'], 1e-9):.2f}x), "
              f"held-out {plain['accuracy']:.1%} vs {spec['accuracy']:.1%}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"args": vars(args), "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
