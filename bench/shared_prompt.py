"""The training forward with each group's prompt run once (train.share_prompt_forward) against
one prompt+response sequence per sample, side by side on the default job's batches.

    .venv/bin/python bench/shared_prompt.py                      # base model, 6 steps each of adaptive and uniform, ~12 min
    .venv/bin/python bench/shared_prompt.py --checkpoint RUN/checkpoints/step_000040 --label step40
    .venv/bin/python bench/shared_prompt.py --dtype bfloat16 --label bf16

The default job (`rollwise train` with no arguments) at fixed weights (the base model's, or
`--checkpoint`'s) generates `--steps` batches per strategy. Two trainers start from the same
weights, one per layout, and train on the same batches in turn (the first to go alternates by
step) after one untimed warm-up update each on the largest batch; both hold 2 threads and run
one after the other, never at once. Reported: seconds of `update` (forward, backward,
optimizer step) per layout, the ratio, the decoder positions each layout runs (micro-batch
rows x padded length, or distinct prompts x prompt length + rows x response length), and how
far the two trainers' losses and gradient norms part. With a --dtype other than float32, each
layout's gradient on the largest batch is also compared with the per-sample layout's in float32.
Writes bench/out/shared_prompt[_LABEL].json.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from fixed_weights import default_job, finish  # bench/fixed_weights.py

from rollwise.engine.executor import RolloutExecutor
from rollwise.loop import overlap_rounds, produce_batch
from rollwise.planner import build_planner
from rollwise.training.policy import PolicyTrainer

LAYOUTS = {"per-sample": False, "shared": True}


def batches(run, cfg, strategy: str, steps: int) -> list:
    ro = cfg.rollout
    run.planner = build_planner(cfg.planner.model_copy(update={"strategy": strategy}), list(run.ids_by_uid),
                                ro.prompts_per_step, ro.num_generations, ro.max_completion_length, cfg.run.seed)
    ex = RolloutExecutor(run.engine, run.ids_by_uid, ro.max_completion_length, ro.temperature)
    out = []
    for step in range(steps):
        p = produce_batch(run, step, ex, stream=overlap_rounds(cfg, ex, run.planner))
        out.append(p.batch)
        print(f"{strategy} batch {step}: {len(p.batch)} samples, {p.tokens} tokens, {p.gen_s:.1f} s", flush=True)
    return out


def positions(trainer: PolicyTrainer, batch: list, shared: bool) -> int:
    """Decoder positions one update runs (rows the trainer forwards, in its micro-batches)."""
    from rollwise.training.policy import _length, _order, _Row

    rows = [_Row(s, s.num_response_tokens, []) for s in batch if not s.stop_gradient and s.num_response_tokens]
    active = [r for r in rows if r.sample.advantage != 0.0]
    active = _order(active) if shared else sorted(active, key=_length)  # as the trainer orders them
    mb = trainer.cfg.train.micro_batch_size
    total = 0
    for i in range(0, len(active), mb):
        rws = active[i : i + mb]
        prompts = {tuple(r.sample.prompt_ids) for r in rws}
        R = max(r.sample.num_response_tokens for r in rws)
        if shared and len(prompts) < len(rws):
            total += len(prompts) * max(len(p) for p in prompts) + len(rws) * R
        else:
            total += len(rws) * (max(len(r.sample.prompt_ids) for r in rws) + R)
    return total


def compare(run, cfg, strategy: str, data: list) -> dict:
    trainers = {}
    for name, on in LAYOUTS.items():
        c = cfg.model_copy(update={"train": cfg.train.model_copy(update={"share_prompt_forward": on})})
        trainers[name] = PolicyTrainer(c, copy.deepcopy(run.model), run.tokenizer.pad_token_id)
    assert [t.share_prompts for t in trainers.values()] == [False, True]
    for tr in trainers.values():  # untimed warm-up: the optimizer's state, the allocator's first growth
        b = copy.deepcopy(max(data, key=len))
        tr.compute_advantages(b)
        tr.update(b)
    tot = {n: {"update_s": 0.0, "positions": 0} for n in LAYOUTS}
    parted = {"loss": 0.0, "grad_norm": 0.0}
    rows, trained = [], []
    for step, batch in enumerate(data):
        order = list(LAYOUTS) if step % 2 == 0 else list(LAYOUTS)[::-1]
        got = {}
        for n in order:
            b = copy.deepcopy(batch)
            tr = trainers[n]
            tr.compute_advantages(b)
            t0 = time.perf_counter()
            got[n] = tr.update(b)
            dt = time.perf_counter() - t0
            tot[n]["update_s"] += dt
            tot[n]["positions"] += positions(tr, b, LAYOUTS[n])
            got[n]["s"] = dt
            if n == "shared":
                trained.append(b)
        a, s = got["per-sample"], got["shared"]
        parted["loss"] = max(parted["loss"], abs(a["loss/policy"] - s["loss/policy"]))
        parted["grad_norm"] = max(parted["grad_norm"], abs(a["train/grad_norm"] - s["train/grad_norm"]) /
                                  max(a["train/grad_norm"], 1e-12))
        fwd = [x for x in trained[-1] if x.advantage != 0.0 and not x.stop_gradient]
        rows.append({"step": step, "forwarded": a["train/forwarded_sequences"],
                     "prompts": len({tuple(x.prompt_ids) for x in fwd}),
                     "per_sample_s": a["s"], "shared_s": s["s"]})
        print(f"{strategy} step {step}: {a['train/forwarded_sequences']:.0f} rows of {rows[-1]['prompts']} prompts, "
              f"per-sample {a['s']:.1f} s, shared {s['s']:.1f} s", flush=True)
    a, s = tot["per-sample"], tot["shared"]
    fwd = [x for b in trained for x in b if x.advantage != 0.0 and not x.stop_gradient]
    plen = sum(len(x.prompt_ids) for x in fwd) / max(len(fwd), 1)
    rlen = sum(x.num_response_tokens for x in fwd) / max(len(fwd), 1)
    print(f"\n{strategy}, {len(data)} steps: forwarded rows: prompt {plen:.1f} tokens, response {rlen:.1f} tokens (means)")
    for n in LAYOUTS:
        print(f"{n:10s} update {tot[n]['update_s']:6.1f} s, decoder positions {tot[n]['positions']}")
    print(f"shared / per-sample: update {a['update_s'] / s['update_s']:.2f}x faster, positions "
          f"{s['positions'] / max(a['positions'], 1):.2f} of per-sample; largest loss difference "
          f"{parted['loss']:.2e}, largest relative grad-norm difference {parted['grad_norm']:.2e}")
    return {"strategy": strategy, "steps": rows, "totals": tot, "parted": parted, "prompt_len": plen,
            "response_len": rlen}


def rounding(run, cfg, strategy: str, data: list) -> dict:
    """On the largest batch, each layout's gradient in cfg's dtype against the per-sample layout's in
    float32 (taken where the optimizer would step): relative error ||g - g32|| / ||g32||."""
    batch = max(data, key=len)

    def grad(dtype: str, shared: bool) -> torch.Tensor:
        c = cfg.model_copy(update={"train": cfg.train.model_copy(update={"share_prompt_forward": shared}),
                                   "model": cfg.model.model_copy(update={"dtype": dtype})})
        model = copy.deepcopy(run.model)  # float32 master weights; the dtype is the trainer's autocast
        tr = PolicyTrainer(c, model, run.tokenizer.pad_token_id)
        got = []
        tr.optimizer.step = lambda: got.append(torch.cat([p.grad.float().flatten() for p in model.parameters()
                                                          if p.grad is not None]))
        b = copy.deepcopy(batch)
        tr.compute_advantages(b)
        tr.update(b)
        return got[0]

    ref = grad("float32", False)
    err = {n: float((grad(str(cfg.model.dtype), on) - ref).norm() / ref.norm()) for n, on in LAYOUTS.items()}
    print(f"{strategy}: gradient relative error against per-sample float32: " +
          ", ".join(f"{n} {e:.2e}" for n, e in err.items()), flush=True)
    return err


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6, help="batches per strategy")
    ap.add_argument("--strategies", nargs="+", default=["adaptive", "uniform"])
    ap.add_argument("--checkpoint", help="a checkpoint folder of a run of the default job (default: the base model)")
    ap.add_argument("--label", default="", help="suffix of the results file")
    ap.add_argument("--dtype", default="float32", help="model.dtype of both trainers and the engine (auto: the "
                    "default job's, bfloat16 on a CPU with bf16 instructions)")
    args = ap.parse_args()
    run, cfg = default_job("shared-prompt-bench-", args.checkpoint, args.dtype)
    data = {s: batches(run, cfg, s, args.steps) for s in args.strategies}
    result = {"args": vars(args), "weights": args.checkpoint or "base model", "dtype": str(cfg.model.dtype),
              "results": [compare(run, cfg, s, d) for s, d in data.items()]}
    if cfg.model.dtype != "float32":
        for r in result["results"]:
            r["grad_error_vs_float32"] = rounding(run, cfg, r["strategy"], data[r["strategy"]])
    finish(run, "shared_prompt", args.label, result)


if __name__ == "__main__":
    main()
