"""Overlapped planner rounds (rollout.overlap_rounds) against round-by-round generation.

    .venv/bin/python bench/overlap_rounds.py                              # the default job's model, ~6 min
    .venv/bin/python bench/overlap_rounds.py --checkpoint RUN/checkpoints/step_000040   # a trained policy

A multi-round planner (the default `adaptive`: probes, top-ups of surprising probes, growth of
informative groups) asks for follow-up samples after it has seen a group's rewards. Round by
round, each follow-up round starts when the slowest response of the previous round has ended,
and runs as a small batch. Overlapped, a group is scored and shown to the planner as soon as
its last sample ends, and the follow-ups it asks for take free slots of the running round.

The job is the built-in default (`rollwise train` with no arguments: SmolLM2-135M-Instruct, the
reasoning-gym mixture, 8 prompts x 8 samples, 48 new tokens, the continuous engine) with
`--strategy` (default adaptive). No training: each step plans, generates and scores with fixed
weights (the base model, or `--checkpoint`'s), and both modes run the same number of steps, each
with its own planner (same seed), alternating which mode goes first. Measured side by side in
one process: generation seconds (engine plus scoring of the groups), sampled tokens, rollouts,
engine rounds, the most rounds one group took (depth), and the engine's prefill and decode
seconds, prompt tokens prefilled and decode steps. A trained policy's responses end well before the
cap, so its groups finish at different times: that is where overlapping can save time; early in
training most responses run to the cap and every group finishes at about the same time.
Writes bench/out/overlap_rounds/<label>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from rollwise.config import build_config
from rollwise.engine.executor import RolloutExecutor
from rollwise.loop import produce_batch, setup
from rollwise.models import merged_state_dict
from rollwise.planner import build_planner
from rollwise.training.checkpoint import load_checkpoint_weights


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", help="a checkpoint folder (weights.safetensors) of a run of the default job")
    ap.add_argument("--strategy", default="adaptive")
    ap.add_argument("--steps", type=int, default=8, help="planner steps per mode")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label", default=None, help="name of the results file (default: base or the checkpoint's step)")
    args = ap.parse_args()

    out_dir = Path(tempfile.mkdtemp(prefix="overlap-bench-"))
    cfg = build_config({"run": {"output_dir": str(out_dir), "name": "bench", "seed": args.seed, "progress": False,
                                "tensorboard": False},
                        "planner": {"strategy": args.strategy}, "eval": {"at_start": False, "at_end": False}})
    run = setup(cfg)
    if args.checkpoint:
        load_checkpoint_weights(Path(args.checkpoint), run.model)
    ro = cfg.rollout
    run.engine.load_weights(merged_state_dict(run.model), version=0)
    first = next(iter(run.items_by_uid.values()))
    run.runner.score([""], [first])  # start the reward worker before anything is timed
    modes = {"rounds": False, "overlap": True}
    planners = {m: build_planner(cfg.planner, list(run.ids_by_uid), ro.prompts_per_step, ro.num_generations,
                                 ro.max_completion_length, cfg.run.seed) for m in modes}
    executors = {m: RolloutExecutor(run.engine, run.ids_by_uid, ro.max_completion_length, ro.temperature) for m in modes}
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for step in range(args.steps):
        order = list(modes) if step % 2 == 0 else list(modes)[::-1]
        for m in order:
            run.planner = planners[m]
            run.engine._prefix.clear()  # no prompt KV left over from the other mode's step
            st0 = dict(run.engine.stats)
            t0 = time.perf_counter()
            p = produce_batch(run, step, executors[m], stream=modes[m])
            wall = time.perf_counter() - t0
            est = {k: run.engine.stats[k] - st0[k] for k in ("prefill_s", "decode_s", "prefill_tokens", "decode_calls")}
            rows[m].append({"wall_s": wall, "gen_s": p.gen_s, "reward_s": p.reward_s, "tokens": float(p.tokens),
                            "rollouts": float(len(p.generated)),
                            "engine_rounds": p.executor_metrics.get("rollout/engine_rounds", 0.0),
                            "planner_depth": p.executor_metrics.get("planner/depth", 0.0),
                            "truncated": statistics.mean(s.finish_reason == "length" for s in p.generated),
                            **est})
            print(f"step {step} {m:8s} " + " ".join(f"{k}={v:.2f}" for k, v in rows[m][-1].items()), flush=True)
    run.runner.close()

    tot = {m: {k: sum(r[k] for r in rows[m]) for k in rows[m][0]} for m in modes}
    print(f"\n{args.strategy}, {args.steps} steps, weights: {args.checkpoint or 'base model'}")
    print(f"{'mode':8s} {'wall s':>8s} {'tokens':>8s} {'rollouts':>8s} {'tok/s':>7s} {'engine rnds':>11s} "
          f"{'depth':>6s} {'truncated':>9s}")
    for m in modes:
        t = tot[m]
        print(f"{m:8s} {t['wall_s']:8.1f} {t['tokens']:8.0f} {t['rollouts']:8.0f} {t['tokens'] / t['wall_s']:7.1f} "
              f"{t['engine_rounds']:11.0f} {t['planner_depth'] / args.steps:6.2f} {t['truncated'] / args.steps:9.2f}")
    for m in modes:
        t = tot[m]
        print(f"{m:8s} engine: prefill {t['prefill_s']:.1f} s for {t['prefill_tokens']:.0f} prompt tokens, decode "
              f"{t['decode_s']:.1f} s in {t['decode_calls']:.0f} decode steps ({t['tokens'] / max(t['decode_calls'], 1):.1f} "
              f"sequences per step)")
    r, o = tot["rounds"], tot["overlap"]
    ratio_time = o["wall_s"] / r["wall_s"]
    ratio_rate = (o["tokens"] / o["wall_s"]) / (r["tokens"] / r["wall_s"])
    print(f"overlap / rounds: wall time {ratio_time:.2f}x, tokens {o['tokens'] / r['tokens']:.2f}x, "
          f"tokens per second {ratio_rate:.2f}x")
    label = args.label or (Path(args.checkpoint).name if args.checkpoint else "base")
    dest = Path("bench/out/overlap_rounds")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / f"{label}.json").write_text(json.dumps({"args": vars(args), "rows": rows, "totals": tot,
                                                    "wall_ratio": ratio_time, "rate_ratio": ratio_rate}, indent=1))


if __name__ == "__main__":
    main()
