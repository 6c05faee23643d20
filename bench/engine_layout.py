"""The engine's weight layout (rollout.transpose_weights): input-major against the standard layout.

    .venv/bin/python bench/engine_layout.py                  # decode steps by batch size, ~3 min
    .venv/bin/python bench/engine_layout.py --steps 4        # + the default job's planner steps, ~8 min more
    .venv/bin/python bench/engine_layout.py --steps 6 --no-decode --checkpoint RUN/checkpoints/step_000040
    .venv/bin/python bench/engine_layout.py --dtype bfloat16 --label bf16   # part 1 in bf16

A linear layer computes y = x @ W.T with W stored [out, in]. Stored input-major (the transpose of
a contiguous [in, out] tensor: same values, same shape), the product multiplies by a contiguous
matrix, which on a CPU in fp32 takes MKL's faster path when x has few rows, as in decoding.

Part 1 (always): the SmolLM2-135M-Instruct engine copy in both layouts, side by side in one
process: milliseconds per decode step of the continuous engine at 1 to 64 sequences (32 new
tokens, EOS ignored, 3 repetitions alternating the layouts, medians), the seconds of one weight
sync (`load_weights`), and whether both layouts sampled the same tokens.

Part 2 (`--steps N`): the default job (`rollwise train` with no arguments) with fixed weights (the
base model's, or `--checkpoint`'s),
N planner steps of `--strategy` (default adaptive; also uniform) per layout, each layout with its
own planner and engine built from the same seed, alternating which goes first. Same layout-free
results mean both sample the same tokens, so only the time may differ: generation seconds and
tokens per second. Writes bench/out/engine_layout[_LABEL].json.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from fixed_weights import default_job, finish  # bench/fixed_weights.py

from rollwise.engine import GenerationRequest
from rollwise.engine.continuous import ContinuousEngine
from rollwise.engine.executor import RolloutExecutor
from rollwise.engine.factory import build_engine
from rollwise.engine.hf import input_major
from rollwise.loop import overlap_rounds, produce_batch
from rollwise.models import merged_state_dict
from rollwise.planner import build_planner

LAYOUTS = {"standard": False, "input-major": True}


def decode_steps(run, sizes: list[int], reps: int, dtype: torch.dtype) -> dict:
    eos = run.eos_ids
    engines = {name: ContinuousEngine(run.model, eos, run.tokenizer.pad_token_id, dtype=dtype, batch_size=64,
                                      transpose_weights=t) for name, t in LAYOUTS.items()}
    assert [input_major(e.model) for e in engines.values()] == [False, True]
    prompt = list(next(iter(run.ids_by_uid.values())))
    for e in engines.values():
        e.eos = set()  # every sequence runs its 32 tokens
        e.generate([GenerationRequest(prompt, 4)])  # warm-up
    ms: dict[tuple[int, str], list[float]] = {}
    same = True
    for rep in range(reps):
        for B in sizes:
            names = list(engines) if (rep + B) % 2 == 0 else list(engines)[::-1]
            outs = {}
            for name in names:
                e = engines[name]
                s0 = dict(e.stats)
                outs[name] = e.generate([GenerationRequest(prompt, 32) for _ in range(B)],
                                        generator=torch.Generator().manual_seed(rep * 100 + B))
                calls = e.stats["decode_calls"] - s0["decode_calls"]
                ms.setdefault((B, name), []).append((e.stats["decode_s"] - s0["decode_s"]) / calls * 1000)
            a, b = (outs[n] for n in LAYOUTS)
            same &= [o.response_ids for o in a] == [o.response_ids for o in b]
    sd = merged_state_dict(run.model)
    sync = {}
    for name, e in engines.items():
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            e.load_weights(sd, version=1)
            times.append(time.perf_counter() - t0)
        sync[name] = statistics.median(times)
    print(f"decode step (continuous engine, {dtype}, 2 threads), median ms:")
    print(f"{'sequences':>9s} {'standard':>9s} {'input-major':>11s} {'speed-up':>8s}")
    rows = []
    for B in sizes:
        s, t = statistics.median(ms[(B, "standard")]), statistics.median(ms[(B, "input-major")])
        rows.append({"sequences": B, "standard_ms": s, "input_major_ms": t, "speedup": s / t})
        print(f"{B:9d} {s:9.1f} {t:11.1f} {s / t:7.2f}x")
    print(f"weight sync (load_weights): standard {sync['standard']:.3f} s, input-major {sync['input-major']:.3f} s")
    print(f"same sampled tokens in both layouts: {'yes' if same else 'NO'}")
    return {"decode": rows, "sync_s": sync, "same_tokens": same}


def planner_steps(run, cfg, steps: int, strategy: str, weights: str) -> dict:
    ro = cfg.rollout
    engines = {name: build_engine(cfg.model_copy(update={"rollout": ro.model_copy(update={"transpose_weights": t})}),
                                  run.model, run.eos_ids, run.tokenizer.pad_token_id, cfg.run.seed)
               for name, t in LAYOUTS.items()}
    planners = {n: build_planner(cfg.planner.model_copy(update={"strategy": strategy}), list(run.ids_by_uid),
                                 ro.prompts_per_step, ro.num_generations, ro.max_completion_length, cfg.run.seed)
                for n in LAYOUTS}
    executors = {n: RolloutExecutor(engines[n], run.ids_by_uid, ro.max_completion_length, ro.temperature)
                 for n in LAYOUTS}
    first = next(iter(run.items_by_uid.values()))
    run.runner.score([""], [first])  # start the reward worker before anything is timed
    tot = {n: {"gen_s": 0.0, "tokens": 0.0, "decode_s": 0.0, "decode_calls": 0.0} for n in LAYOUTS}
    same = True
    for step in range(steps):
        order = list(LAYOUTS) if step % 2 == 0 else list(LAYOUTS)[::-1]
        got = {}
        for n in order:
            run.planner, run.engine = planners[n], engines[n]
            s0 = dict(engines[n].stats)
            p = produce_batch(run, step, executors[n], stream=overlap_rounds(cfg, executors[n], planners[n]))
            got[n] = [tuple(s.response_ids) for s in p.generated]
            tot[n]["gen_s"] += p.gen_s
            tot[n]["tokens"] += p.tokens
            for k in ("decode_s", "decode_calls"):
                tot[n][k] += engines[n].stats[k] - s0[k]
            print(f"step {step} {n:11s} gen {p.gen_s:6.1f} s, {p.tokens} tokens, {len(p.generated)} rollouts", flush=True)
        same &= got["standard"] == got["input-major"]
    s, t = tot["standard"], tot["input-major"]
    print(f"\n{strategy}, {steps} steps, weights: {weights}:")
    for n in LAYOUTS:
        x = tot[n]
        print(f"{n:11s} generation {x['gen_s']:6.1f} s, {x['tokens']:.0f} tokens, {x['tokens'] / x['gen_s']:6.1f} tokens/s, "
              f"{x['tokens'] / max(x['decode_calls'], 1):.1f} sequences per decode step")
    print(f"input-major / standard: tokens per second {(t['tokens'] / t['gen_s']) / (s['tokens'] / s['gen_s']):.2f}x; "
          f"same samples: {'yes' if same else 'NO'}")
    return {"strategy": strategy, "steps": steps, "totals": tot, "same_samples": same}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 9, 16, 32, 64])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=0, help="default-job planner steps per layout (0: part 1 only)")
    ap.add_argument("--strategies", nargs="+", default=["adaptive", "uniform"])
    ap.add_argument("--checkpoint", help="a checkpoint folder of a run of the default job (default: the base model)")
    ap.add_argument("--no-decode", action="store_true", help="skip part 1")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="part 1's engine dtype")
    ap.add_argument("--label", default="", help="suffix of the results file")
    args = ap.parse_args()
    run, cfg = default_job("layout-bench-", args.checkpoint)
    result: dict = {"args": vars(args)}
    if not args.no_decode:
        result["part1"] = decode_steps(run, args.sizes, args.reps, getattr(torch, args.dtype))
    if args.steps:
        weights = args.checkpoint or "base model"
        result["part2"] = [planner_steps(run, cfg, args.steps, s, weights) for s in args.strategies]
    finish(run, "engine_layout", args.label, result)


if __name__ == "__main__":
    main()
