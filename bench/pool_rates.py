"""Each training prompt's solve count under the base model, for `planner.prior_counts`.

    .venv/bin/python bench/pool_rates.py --seed 141 --train-size 64 --samples 16 --threads 1 \
        --out bench/out/pool_rates/seed141.jsonl [KEY=VALUE overrides of bench/planner.py's runs]

Sets up the run that `bench/planner.py --seeds SEED --train-size N` would train (the same
data.* settings and run.seed, so the same pool of prompts), samples `--samples` responses to every
prompt of its pool with the base model at the config's sampling settings, and counts as correct
those whose reward is at least planner.success_threshold, the planner's own rule. Writes one JSONL
row per prompt, {"uid", "successes", "samples", "tokens"}, and prints the pool's mean solve rate,
the shares of prompts never and always solved, and the tokens generated: the cost of the
knowledge that `planner.prior_counts` then gives a run for free.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from rollwise.config import load_config
from rollwise.engine.executor import RolloutExecutor
from rollwise.loop import set_threads, setup
from rollwise.planner.base import Request


def count(run, cfg, samples: int, chunk: int) -> list[dict]:
    ex = RolloutExecutor(run.engine, run.ids_by_uid, cfg.rollout.max_completion_length, cfg.rollout.temperature)
    threshold = float(cfg.planner.success_threshold)
    uids = list(run.ids_by_uid)
    rows = []
    for i in range(0, len(uids), chunk):
        out = ex.generate([Request(u, samples) for u in uids[i:i + chunk]], first_round=True)
        for uid, outs in out.groups.items():
            texts = [run.tokenizer.decode(o.response_ids, skip_special_tokens=True) for o in outs]
            rewards = run.runner.score(texts, [run.items_by_uid[uid]] * len(outs)).rewards
            rows.append({"uid": uid, "successes": sum(r >= threshold for r in rewards), "samples": len(outs),
                         "tokens": sum(len(o.response_ids) for o in outs)})
        print(f"{min(i + chunk, len(uids))}/{len(uids)} prompts", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, required=True, help="run.seed of the runs the counts are for")
    ap.add_argument("--train-size", type=int, default=200, help="data.train_size (bench/planner.py's --train-size)")
    ap.add_argument("--eval-size", type=int, default=400, help="data.eval_size (bench/planner.py's --eval-size)")
    ap.add_argument("--samples", type=int, default=16, help="responses per prompt")
    ap.add_argument("--chunk", type=int, default=8, help="prompts per engine call")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--out", type=Path, required=True, help="the JSONL file to write")
    ap.add_argument("overrides", nargs="*", help="extra KEY=VALUE config overrides, as given to bench/planner.py")
    args = ap.parse_args()
    cfg = load_config(None, [
        f"run.seed={args.seed}", f"data.train_size={args.train_size}", f"data.eval_size={args.eval_size}",
        f"run.torch_threads={args.threads}", f"run.output_dir={tempfile.mkdtemp(prefix='pool_rates')}",
        "run.name=pool_rates", "run.progress=false", "run.tensorboard=false",
        "eval.at_start=false", "eval.at_end=false", *args.overrides])
    set_threads(cfg.run.torch_threads)
    run = setup(cfg)
    t0 = time.time()
    try:
        rows = count(run, cfg, args.samples, args.chunk)
    finally:
        run.runner.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rates = [r["successes"] / r["samples"] for r in rows]
    print(json.dumps({"prompts": len(rows), "samples": args.samples, "mean_rate": sum(rates) / len(rates),
                      "never": sum(x == 0 for x in rates) / len(rates), "always": sum(x == 1 for x in rates) / len(rates),
                      "tokens": sum(r["tokens"] for r in rows), "seconds": round(time.time() - t0, 1),
                      "out": str(args.out)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
