"""Smoke test of `rollwise train` on a GPU before spending device time on real runs
(bench/gpu_planner.sh setup calls it).

A model with SmolLM2-135M-Instruct's shape and tokenizer but random weights (the tokenizer and
config travel; the weights do not need to) goes through the real CLI: 2 steps of the default job
with `adaptive` on `--device`, a resume to step 3, and `rollwise eval`. Prints each command's
wall time and the run's time per step, then SMOKE OK, or the failing command's output.

    python bench/gpu_smoke.py --tok .gpu/a/tok --device cuda --work /tmp/smoke
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path


def random_model(tok: Path, folder: Path) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tok))
    model.save_pretrained(folder)
    for f in tok.iterdir():
        if f.name != "config.json":
            shutil.copy(f, folder / f.name)
    return folder


def cli(*args: str) -> float:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "rollwise", *args], capture_output=True, text=True)
    took = time.perf_counter() - t0
    print(f"$ rollwise {' '.join(args)}  ({took:.1f} s, rc {res.returncode})", flush=True)
    if res.returncode != 0:
        print(res.stdout[-4000:], res.stderr[-8000:], sep="\n")
        print("SMOKE FAILED")
        sys.exit(1)
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tok", type=Path, required=True, help="folder with the tokenizer and config.json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--work", type=Path, default=Path("/tmp/smoke"))
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    model = random_model(args.tok, args.work / "model")
    run = args.work / "runs" / "smoke"
    common = [f"model.name_or_path={model}", f"model.device={args.device}", "data.eval_size=32",
              "rollout.batch_size=256", "run.progress=false", "run.save_every=1"]
    cli("train", *common, "train.max_steps=2", "eval.every_n_steps=1", f"run.output_dir={run.parent}",
        f"run.name={run.name}", "planner.strategy=adaptive")
    cli("train", "--resume", str(run), "train.max_steps=3")
    cli("eval", str(run), "data.eval_size=32", f"model.device={args.device}")
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    per_step = [(h["step"], round(h["time/step_s"], 2), h.get("rollout/tokens")) for h in steps if "time/step_s" in h]
    print("steps (step, seconds, tokens):", per_step)
    print("SMOKE OK")


if __name__ == "__main__":
    main()
