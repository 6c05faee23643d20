"""Rollout throughput: static-batch `generate` vs continuous batching vs partial rollouts.

    .venv/bin/python bench/engine.py                      # SmolLM2-135M-Instruct, ~8 min on 2 cores
    .venv/bin/python bench/engine.py --steps 2 --slots 8 --max-new-tokens 96   # quick look

Workload: what the rollout phase of `--steps` GRPO steps asks for, each step `--prompts-per-step`
prompts x `--group` samples of SmolLM2-135M-Instruct; three prompts in four ask for a bare
number (short answers), one in four for an explanation (long answers, many hit the cap): a
heavy-tailed length distribution. Sampled at T=1.

Measured side by side in one process, same weights (`--dtype`: auto = bf16 where the CPU has it,
fp32 elsewhere), same steps:
  static      transformers `model.generate` on batches of `--slots` rows (TRL's default path:
              every row of a batch runs until its longest row ends), step after step
  continuous  rollwise's ContinuousEngine with `--slots` slots, each step run to completion
  partial     the same engine with partial rollouts (APRIL): each step queues the carried
              samples first, then new requests up to `--over` times its target, and stops
              once the target has finished; unfinished samples are carried, with their
              tokens, log-probs and versions, into the next step, where prompt + prefix is
              prefilled again (what a weight update requires for exact KV)
  partial+kv  the same, with the carried sequences kept in their slots, KV included
              (`run_round(hold=True)`, rollout.partial_keep_kv): no prefill again
  peak        decode tokens/s with every slot busy on a workload prompt (prefill excluded),
              for as many tokens as the mean response length

Useful tokens are response tokens up to and including EOS (the padding a static batch computes
after a row has ended is not useful). For `partial`, tokens still carried at the end count as
useful: they are kept and resumed, not discarded; the table shows how many.
Writes bench/out/engine/results.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from rollwise.engine import GenerationRequest
from rollwise.engine.continuous import ContinuousEngine, peak_decode_throughput
from rollwise.loop import set_threads
from rollwise.models import DTYPES, compute_dtype, load_model, load_tokenizer, resolve_model_path

TOPICS = ["how a rainbow forms", "why the sky is blue", "how vaccines work", "what causes the seasons",
          "how a bicycle stays upright", "how bread rises", "why leaves change colour", "how tides work"]


def build_prompts(tok, n_prompts: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = []
    for i in range(n_prompts):
        if i % 4 == 3:
            text = f"Explain {rng.choice(TOPICS)} in detail, step by step."
        else:
            a, b = rng.randint(2, 99), rng.randint(2, 99)
            text = f"What is {a} {rng.choice('+-*')} {b}? Reply with only the number."
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return prompts


def useful(ids: list[int], eos: set[int]) -> int:
    for i, t in enumerate(ids):
        if t in eos:
            return i + 1
    return len(ids)


def run_static(model, tok, steps, slots: int, eos: set[int], seed: int) -> tuple[int, float]:
    torch.manual_seed(seed)
    n_tok, t0 = 0, time.perf_counter()
    for reqs in steps:
        for s in range(0, len(reqs), slots):
            chunk = reqs[s : s + slots]
            L = max(len(r.prompt_ids) for r in chunk)
            ids = torch.tensor([[tok.pad_token_id] * (L - len(r.prompt_ids)) + r.prompt_ids for r in chunk])
            attn = (torch.arange(L)[None] >= torch.tensor([L - len(r.prompt_ids) for r in chunk])[:, None]).long()
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=1.0, top_p=1.0,
                                     top_k=0, max_new_tokens=chunk[0].max_new_tokens, eos_token_id=sorted(eos),
                                     pad_token_id=tok.pad_token_id)
            n_tok += sum(useful(row[L:].tolist(), eos) for row in out)
    return n_tok, time.perf_counter() - t0


def run_continuous(engine: ContinuousEngine, steps) -> tuple[int, float]:
    n_tok, t0 = 0, time.perf_counter()
    for reqs in steps:
        n_tok += sum(len(o.response_ids) for o in engine.generate([replace(r) for r in reqs]))
    return n_tok, time.perf_counter() - t0


def run_partial(engine: ContinuousEngine, steps, spare, over: float, hold: bool) -> dict:
    """APRIL: each step queues the carried samples first, then new requests up to `over` times its
    target, and stops once `target` samples have finished; the rest is carried to the next step.
    New requests come from the steps' own, then from `spare` (never exhausted within the run)."""
    pool = [replace(r, request_id=i) for i, r in enumerate([r for reqs in steps for r in reqs] + list(spare))]
    buffer: list[GenerationRequest] = []
    finished_tokens = resumed = 0
    t0 = time.perf_counter()
    for reqs in steps:
        target = len(reqs)
        take = max(0, int(over * target) - len(buffer))
        new, pool = pool[:take], pool[take:]
        resumed += sum(len(r.prefix_ids) for r in buffer)
        done, buffer = engine.run_round(buffer + new, stop_when=lambda fin, t=target: len(fin) >= t, hold=hold)
        finished_tokens += sum(len(o.response_ids) for o in done)
    engine._held = None
    return {"finished_tokens": finished_tokens, "carried_tokens": sum(len(r.prefix_ids) for r in buffer),
            "secs": time.perf_counter() - t0, "resumed_prefix_tokens": resumed, "left_in_buffer": len(buffer),
            "never_started": sum(not r.prefix_ids for r in buffer)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=4, help="training steps (rounds) simulated")
    ap.add_argument("--prompts-per-step", type=int, default=8)
    ap.add_argument("--group", type=int, default=8, help="samples per prompt")
    ap.add_argument("--slots", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--over", type=float, default=2.0, help="partial: requests queued per round / its target")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="auto", choices=["auto", *DTYPES], help="compute dtype (model.dtype's values)")
    ap.add_argument("--out", default="bench/out/engine")
    args = ap.parse_args()
    set_threads(args.threads)

    path = resolve_model_path(args.model, None)
    tok = load_tokenizer(path)
    model = load_model(path, torch.float32)
    eos = {tok.eos_token_id}
    n_prompts = args.steps * args.prompts_per_step
    prompts = build_prompts(tok, 2 * n_prompts, args.seed)  # the second half only feeds partial's over-provisioning
    reqs = [GenerationRequest(p, args.max_new_tokens, 1.0) for p in prompts for _ in range(args.group)]
    per_step = args.prompts_per_step * args.group
    steps = [reqs[k * per_step : (k + 1) * per_step] for k in range(args.steps)]
    spare = reqs[args.steps * per_step :]
    dtype = compute_dtype(args.dtype)
    static_model = copy.deepcopy(model).to(dtype).eval()
    engine = ContinuousEngine(model, sorted(eos), tok.pad_token_id, dtype, batch_size=args.slots,
                              seed=args.seed, num_slots=args.slots)
    engine.generate(reqs[:2])  # warm-up (allocator, kernels)

    static_tok, static_s = run_static(static_model, tok, steps, args.slots, eos, args.seed)
    cont_tok, cont_s = run_continuous(engine, steps)
    lengths = [len(o.response_ids) for o in engine.generate([replace(r) for r in steps[0]])]
    part = run_partial(engine, steps, spare, args.over, hold=False)
    part_kv = run_partial(engine, steps, spare, args.over, hold=True)
    mean_len = max(1, round(statistics.mean(lengths)))
    typical = sorted(prompts, key=len)[len(prompts) // 2]
    peak = peak_decode_throughput(engine, typical, args.slots, mean_len)

    rows = {
        "static": static_tok / static_s,
        "continuous": cont_tok / cont_s,
        # every generated token is in exactly one of finished and carried
        "partial": (part["finished_tokens"] + part["carried_tokens"]) / part["secs"],
        "partial+kv": (part_kv["finished_tokens"] + part_kv["carried_tokens"]) / part_kv["secs"],
    }
    q = statistics.quantiles(lengths, n=20)  # lengths of one step's samples
    print(f"\n{str(dtype).removeprefix('torch.')}, {args.steps} steps x {per_step} samples ({args.prompts_per_step} prompts x {args.group}), {args.slots} slots, cap "
          f"{args.max_new_tokens} tokens; response length median {q[9]:.0f}, p95 {q[18]:.0f}, "
          f"at cap {sum(n >= args.max_new_tokens for n in lengths) / len(lengths):.0%}")
    print(f"{'mode':<12}{'useful tok/s':>14}{'vs static':>11}{'of peak':>9}")
    for name, tps in rows.items():
        print(f"{name:<12}{tps:>14.1f}{tps / rows['static']:>10.2f}x{tps / peak:>8.0%}")
    print(f"{'peak':<12}{peak:>14.1f}{peak / rows['static']:>10.2f}x{1:>8.0%}")
    for name, p in (("partial", part), ("partial+kv", part_kv)):
        print(f"{name}: {p['carried_tokens']} tokens in {p['left_in_buffer']} samples carried at the end "
              f"({p['never_started']} not started); {p['resumed_prefix_tokens']} resumed-prefix tokens re-entered steps")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"args": vars(args), "tokens_per_s": rows, "peak": peak,
                                                  "partial": part, "partial_kv": part_kv, "stats": engine.stats,
                                                  "length_quantiles": q}, indent=1))


if __name__ == "__main__":
    main()
