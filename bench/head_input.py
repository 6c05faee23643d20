"""The LM head on a strided view (what `logits_to_keep=1` hands it after a prefill) against the
same rows copied contiguous first (what the engines now do, `contiguous_head_input`).

    .venv/bin/python bench/head_input.py            # ~2 min

Part 1: torch's linear with SmolLM2-135M's head shape ([49152, 576] weight), input the last
position of [64, 53, 576] hidden states, as a view and as a copy, in bf16 and fp32: seconds and
the process's peak resident memory during the call. Part 2: the default job's held-out
evaluation (the first `--items` prompts, greedy) with the engine's contiguous-input hook on and
off, alternating after a warm-up, prefix cache emptied before each, in the default job's dtype: seconds, peak memory above the start, accuracy.
Writes bench/out/head_input.json.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from fixed_weights import default_job  # bench/fixed_weights.py

from rollwise.loop import run_eval


def rss_mb() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
    return 0


class Peak:
    """Peak resident memory (MB) above the start while the block runs, sampled every 2 ms."""

    def __enter__(self):
        self.base = self.peak = rss_mb()
        self.stop = False
        self.th = threading.Thread(target=self._run)
        self.th.start()
        self.t0 = time.perf_counter()
        return self

    def _run(self):
        while not self.stop:
            self.peak = max(self.peak, rss_mb())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self.s = time.perf_counter() - self.t0
        self.stop = True
        self.th.join()
        self.extra = self.peak - self.base


def part1() -> list[dict]:
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        w = torch.randn(49152, 576).to(dtype)
        h = torch.randn(64, 53, 576).to(dtype)
        for name, x in (("view", h[:, -1:, :]), ("contiguous", h[:, -1:, :].contiguous())):
            F.linear(x, w)  # warm-up
            with Peak() as p:
                F.linear(x, w)
            rows.append({"dtype": str(dtype), "input": name, "s": p.s, "peak_extra_mb": p.extra})
            print(f"{str(dtype):15s} {name:10s} {p.s * 1000:8.1f} ms  +{p.extra} MB", flush=True)
    return rows


def part2(items: int, reps: int) -> list[dict]:
    run, cfg = default_job("head-input-bench-", dtype="auto")
    run.eval_items, run.eval_ids = run.eval_items[:items], run.eval_ids[:items]
    head = run.engine.model.get_output_embeddings()
    hooks = dict(head._forward_pre_hooks)
    run_eval(run, 0)  # warm-up
    rows = []
    for rep in range(reps):
        for on in ((True, False) if rep % 2 == 0 else (False, True)):
            head._forward_pre_hooks.clear()
            if on:
                head._forward_pre_hooks.update(hooks)
            run.engine._prefix.clear()  # every evaluation prefills its prompts
            with Peak() as p:
                m = run_eval(run, 0)
            rows.append({"hook": on, "s": p.s, "peak_extra_mb": p.extra, "accuracy": m["eval/accuracy"]})
            print(f"eval of {items} items, contiguous head input {'on ' if on else 'off'}: {p.s:5.1f} s, "
                  f"+{p.extra} MB, accuracy {m['eval/accuracy']:.3f}", flush=True)
    run.runner.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(2)
    result = {"linear": part1(), "eval": part2(args.items, args.reps)}
    Path("bench/out").mkdir(parents=True, exist_ok=True)
    Path("bench/out/head_input.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
