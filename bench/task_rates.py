"""How often the base model solves reasoning-gym tasks at the sampling settings the planner sees.

The planner's savings come from prompts that a group of 8 samples cannot learn from: those the
model never solves and those it always solves. This bench measures, per task configuration,
the base model's solve rate at the default job's sampling settings (temperature 1, 48 new
tokens, bf16, the default prompt) on `--prompts` training prompts x 8 samples, and the
histogram of correct answers out of 8. The configurations are the default mixture's five tasks
and easier and harder variants of them, plus three other procedural tasks.

    .venv/bin/python bench/task_rates.py                  # 15 configurations x 32 prompts x 8, ~5 min on 2 cores

Correct: the first reward function scores 1 (as in evaluation; the planner's success
threshold of 0.5 would also count some partial credit).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import torch
from fixed_weights import count_correct  # bench/fixed_weights.py

from rollwise.config import DEFAULT_TASKS, build_config
from rollwise.loop import setup

_ARITH = {"allow_negation": False, "allow_parentheses": False}
VARIANTS: list[dict] = [
    {"name": "chain_sum", "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}},
    {"name": "basic_arithmetic", "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, **_ARITH}},
    {"name": "products", "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}},
    {"name": "gcd", "params": {"min_value": 1, "max_value": 20}},
    {"name": "lcm", "params": {"min_value": 1, "max_value": 10}},
    {"name": "products", "params": {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 3}},
    {"name": "chain_sum", "params": {"min_terms": 3, "max_terms": 4, "min_digits": 3, "max_digits": 4}},
    {"name": "letter_counting", "params": {}},
    {"name": "spell_backward", "params": {}},
    {"name": "number_sorting", "params": {}},
]


def measure(task: dict, prompts: int, samples: int) -> dict:
    cfg = build_config({"run": {"output_dir": tempfile.mkdtemp(prefix="task-rates-"), "name": "bench", "seed": 0,
                                "progress": False, "tensorboard": False, "torch_threads": 2},
                        "model": {"dtype": "bfloat16"}, "eval": {"at_start": False, "at_end": False},
                        "data": {"tasks": [task], "train_size": prompts, "eval_size": 8}})
    run = setup(cfg)
    try:
        count = count_correct(run, cfg, list(run.ids_by_uid)[:prompts], samples, chunk=prompts)
    finally:
        run.runner.close()
    k = np.array(list(count.values()))
    return {"task": task, "rate": float(k.mean() / samples), "histogram": np.bincount(k, minlength=samples + 1).tolist()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(2)
    rows = []
    print(f"| task | parameters | solve rate | prompts with 0 / 1-{args.samples - 1} / {args.samples} correct |")
    print("|---|---|---|---|")
    for i, task in enumerate(DEFAULT_TASKS + VARIANTS):
        r = measure(task, args.prompts, args.samples)
        r["default_mixture"] = i < len(DEFAULT_TASKS)
        rows.append(r)
        h = r["histogram"]
        params = ", ".join(f"{k}={v}" for k, v in task["params"].items() if k not in _ARITH) or "defaults"
        mark = " (default mixture)" if r["default_mixture"] else ""
        print(f"| {task['name']}{mark} | {params} | {r['rate']:.3f} | {h[0]} / {sum(h[1:-1])} / {h[-1]} |", flush=True)
    Path("bench/out").mkdir(parents=True, exist_ok=True)
    Path("bench/out/task_rates.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
