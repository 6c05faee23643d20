"""Dependent rounds of a planner step on a CPU: the same planner with its follow-ups asked in
more or fewer rounds, side by side at fixed weights.

    .venv/bin/python bench/planner_rounds.py                       # base model, 10 steps, ~4 min
    .venv/bin/python bench/planner_rounds.py --checkpoint RUN/checkpoints/step_000040
    .venv/bin/python bench/planner_rounds.py --variants adaptive adaptive:screen_growth=eager uniform

A follow-up round (a probe's top-up, a group's growth) can only start when the samples it
depends on are back, and with a 48-token cap each round on the critical path costs about 47
decode steps however few sequences it carries; on a CPU a decode step with few sequences
costs nearly as much as a full one (the weights are read once per step). So the number of
dependent rounds, not the number of tokens, sets much of `adaptive`'s generation time.

The default job (`rollwise train` with no arguments) in bf16 on 2 threads, with the weights of
the base model or of `--checkpoint`; each variant (a strategy name with `:key=value` planner
overrides, as in `rollwise simulate`) has its own planner and engine built from the same seed,
and the variants take turns going first. Weights do not change, so beliefs evolve but the
policy does not; after the first step the variants' samples differ. Prints, per variant,
generation seconds, rollouts, tokens, decode steps, sequences per decode step, tokens per
second, the most rounds of one group (planner/depth), the effective ratio (rollouts in groups with
reward variance) and "eff ok", the share of rollouts in groups with both correct and wrong
responses (the default reward's partial credit makes the first larger). Writes
bench/out/planner_rounds[_LABEL].json.
"""

from __future__ import annotations

import argparse
import copy
import time

from fixed_weights import default_job, finish  # bench/fixed_weights.py

from rollwise.engine.executor import RolloutExecutor
from rollwise.engine.factory import build_engine
from rollwise.evaluate import is_correct
from rollwise.loop import overlap_rounds, produce_batch
from rollwise.planner import build_planner
from rollwise.sim.command import parse_strategy
from rollwise.training.policy import PolicyTrainer


def mixed_correct_share(samples: list, primary: str) -> float:
    """Share of the step's rollouts in groups with both correct and wrong responses (correct: the
    first reward function scores 1, as in evaluation). The effective ratio counts any reward
    variance, so it also counts groups whose only signal is the default reward's partial credit."""
    by_uid: dict[str, list[bool]] = {}
    for s in samples:
        by_uid.setdefault(s.prompt_uid, []).append(is_correct(s.reward_parts, primary))
    mixed = sum(len(v) for v in by_uid.values() if any(v) and not all(v))
    return mixed / max(len(samples), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", nargs="+", default=["adaptive", "adaptive:screen_growth=eager",
                                                        "adaptive:screen_followup=next_step", "uniform"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--checkpoint", help="a checkpoint folder of a run of the default job (default: the base model)")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--train", action="store_true",
                    help="also time one training update on each batch (one trainer for all variants, after an "
                         "untimed warm-up update; the time depends on the batch's shapes, not on the weights)")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    run, cfg = default_job("planner-rounds-", args.checkpoint, dtype=args.dtype)
    ro = cfg.rollout
    first = next(iter(run.items_by_uid.values()))
    run.runner.score([""], [first])  # start the reward worker before anything is timed
    setups = {}
    for v in args.variants:
        name, overrides = parse_strategy(v)
        pcfg = cfg.planner.model_copy(update={"strategy": name, **overrides})
        engine = build_engine(cfg, run.model, run.eos_ids, run.tokenizer.pad_token_id, cfg.run.seed)
        planner = build_planner(pcfg, list(run.ids_by_uid), ro.prompts_per_step, ro.num_generations,
                                ro.max_completion_length, cfg.run.seed,
                                prompt_lengths=[len(ids) for ids in run.ids_by_uid.values()])
        setups[v] = (engine, planner, RolloutExecutor(engine, run.ids_by_uid, ro.max_completion_length, ro.temperature))
    trainer = PolicyTrainer(cfg, copy.deepcopy(run.model), run.tokenizer.pad_token_id) if args.train else None
    warm = trainer is None
    keys = ("gen_s", "rollouts", "tokens", "decode_calls", "decode_tokens", "depth", "effective", "effective_correct",
            "train_s", "trained")
    tot = {v: dict.fromkeys(keys, 0.0) for v in args.variants}
    for step in range(args.steps):
        for v in (args.variants if step % 2 == 0 else args.variants[::-1]):
            engine, planner, executor = setups[v]
            run.planner, run.engine = planner, engine
            s0 = dict(engine.stats)
            p = produce_batch(run, step, executor, stream=overlap_rounds(cfg, executor, planner))
            m = planner.metrics()
            t = tot[v]
            t["gen_s"] += p.gen_s
            t["rollouts"] += len(p.generated)
            t["tokens"] += p.tokens
            t["decode_calls"] += engine.stats["decode_calls"] - s0["decode_calls"]
            t["decode_tokens"] += engine.stats["decode_tokens"] - s0["decode_tokens"]
            t["depth"] += m.get("planner/depth", 1.0) / args.steps
            t["effective"] += m.get("planner/effective_ratio", 0.0) / args.steps
            t["effective_correct"] += mixed_correct_share(p.generated, run.primary) / args.steps
            if trainer is not None:
                b = copy.deepcopy(p.batch)
                trainer.compute_advantages(b)
                if not warm:  # untimed warm-up: the optimizer's state, the allocator's first growth
                    trainer.update(copy.deepcopy(b))
                    warm = True
                t0 = time.perf_counter()
                out = trainer.update(b)
                t["train_s"] += time.perf_counter() - t0
                t["trained"] += out.get("train/forwarded_sequences", 0.0)
            print(f"step {step} {v}: generation {p.gen_s:.1f} s, {len(p.generated)} rollouts, {p.tokens} tokens, "
                  f"{engine.stats['decode_calls'] - s0['decode_calls']:.0f} decode steps", flush=True)
    weights = args.checkpoint or "base model"
    print(f"\n{args.steps} steps, weights: {weights}, {args.dtype}")
    print(f"{'variant':40s} {'gen s':>6s} {'rollouts':>8s} {'tokens':>7s} {'decode':>6s} {'seq/dec':>7s} "
          f"{'tok/s':>6s} {'depth':>5s} {'eff':>5s} {'eff ok':>6s}" + (f" {'train s':>7s} {'fwd seq':>7s}" if trainer else ""))
    for v, t in tot.items():
        t["tokens_per_s"] = t["tokens"] / t["gen_s"]
        print(f"{v:40s} {t['gen_s']:6.1f} {t['rollouts']:8.0f} {t['tokens']:7.0f} {t['decode_calls']:6.0f} "
              f"{t['decode_tokens'] / max(t['decode_calls'], 1):7.1f} {t['tokens_per_s']:6.0f} {t['depth']:5.2f} "
              f"{t['effective']:5.2f} {t['effective_correct']:6.2f}" + (f" {t['train_s']:7.1f} {t['trained']:7.0f}" if trainer else ""))
    finish(run, "planner_rounds", args.label, {"args": vars(args), "totals": tot})


if __name__ == "__main__":
    main()
