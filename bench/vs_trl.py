"""rollwise vs TRL's GRPOTrainer: same model, data, budget and hyperparameters, one after the other.

    .venv/bin/pip install -e '.[bench]'            # installs trl
    .venv/bin/python bench/vs_trl.py --steps 10 --seeds 0 1

For each seed both trainers run `--steps` steps of 8 prompts x 8 generations on the default
task mixture; both final models are scored by the same evaluator on the same held-out items
(greedy accuracy). Prints accuracy before/after for each and the ratio of median step times
(TRL / rollwise), and writes bench/out/vs_trl/results.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from rollwise.config import load_config
from rollwise.data import build_items, format_prompt
from rollwise.engine import HFEngine
from rollwise.evaluate import evaluate
from rollwise.loop import set_threads, train
from rollwise.models import compute_dtype, load_model, load_tokenizer, resolve_model_path
from rollwise.rewards import RewardRunner
from rollwise.rewards.verifiers import VERIFIERS


def shared_overrides(args, seed: int, out: Path, name: str) -> list[str]:
    return [
        f"train.max_steps={args.steps}", f"train.learning_rate={args.lr}", "train.warmup_steps=0",
        "train.adam_beta2=0.999", "rollout.prompts_per_step=8", "rollout.num_generations=8",
        f"rollout.max_completion_length={args.max_tokens}", f"run.seed={seed}", "run.save_every=0",
        f"run.output_dir={out}", f"run.name={name}", "run.progress=false", "eval.at_start=false", "eval.at_end=false",
        f"data.eval_size={args.eval_size}",
        f"planner.strategy={args.strategy}",
    ]


def score_model(model_dir_or_model, cfg, items, ids, tok, runner) -> float:
    model = model_dir_or_model if isinstance(model_dir_or_model, torch.nn.Module) else load_model(model_dir_or_model)
    eng = HFEngine(model, [tok.eos_token_id], tok.pad_token_id, compute_dtype(cfg.model.dtype), 64)
    m = evaluate(eng, items, ids, runner, cfg.reward.functions[0].name, tok, cfg.rollout.max_completion_length)
    return m["eval/accuracy"]


def run_trl(args, cfg, train_items, tok, seed: int, out: Path) -> tuple[str, list[float]]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    by_uid = {it.uid: it for it in train_items}
    rows = [{"prompt": format_prompt(it, tok, cfg.data), "uid": it.uid} for it in train_items]
    fn = VERIFIERS[cfg.reward.functions[0].name]

    def reward(prompts, completions, uid, **kw):
        return [fn(c if isinstance(c, str) else c[-1]["content"], by_uid[u]) for c, u in zip(completions, uid)]

    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, a, s, c, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, a, s, c, **kw):
            times.append(time.perf_counter() - self.t)

    gcfg = GRPOConfig(
        output_dir=str(out / f"trl-seed{seed}"), max_steps=args.steps, learning_rate=args.lr, warmup_steps=0,
        lr_scheduler_type="constant", per_device_train_batch_size=64, gradient_accumulation_steps=1,
        num_generations=8, max_completion_length=args.max_tokens, temperature=1.0, beta=0.0, epsilon=0.2,
        loss_type="dapo", scale_rewards="group", max_grad_norm=1.0, bf16=compute_dtype(cfg.model.dtype) == torch.bfloat16,
        gradient_checkpointing=False, use_cpu=True, seed=seed, logging_steps=1, save_strategy="no", report_to=[],
        disable_tqdm=True,
    )
    path = resolve_model_path(cfg.model.name_or_path)
    trainer = GRPOTrainer(model=path, reward_funcs=reward, args=gcfg, train_dataset=Dataset.from_list(rows),
                          processing_class=tok, callbacks=[Timer()])
    trainer.train()
    final = out / f"trl-seed{seed}" / "final"
    trainer.model.save_pretrained(final)
    return str(final), times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--eval-size", type=int, default=300)
    ap.add_argument("--strategy", default="uniform", help="rollwise's planner.strategy (default uniform: TRL's fixed "
                    "group per prompt, so the comparison is of the loop; rollwise's own default is adaptive)")
    ap.add_argument("--out", default="bench/out/vs_trl")
    args = ap.parse_args()
    set_threads(None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"args": vars(args), "seeds": {}}
    cfg0 = load_config(None, shared_overrides(args, args.seeds[0], out, "probe"))
    tok = load_tokenizer(resolve_model_path(cfg0.model.name_or_path))
    runner = RewardRunner(cfg0.reward)
    _, eval_items = build_items(cfg0.data, cfg0.run.seed)
    eval_ids = [tok(format_prompt(it, tok, cfg0.data), add_special_tokens=False)["input_ids"] for it in eval_items]
    base = score_model(resolve_model_path(cfg0.model.name_or_path), cfg0, eval_items, eval_ids, tok, runner)
    print(f"base model held-out accuracy: {base:.3f} on {len(eval_items)} items", flush=True)
    for seed in args.seeds:
        cfg = load_config(None, shared_overrides(args, seed, out, f"rollwise-seed{seed}"))
        train_items, ev = build_items(cfg.data, seed)
        assert [e.uid for e in ev] == [e.uid for e in eval_items] or seed != args.seeds[0]
        t0 = time.perf_counter()
        trl_dir, trl_times = run_trl(args, cfg, train_items, tok, seed, out)
        trl_wall = time.perf_counter() - t0
        trl_acc = score_model(trl_dir, cfg, eval_items, eval_ids, tok, runner)
        t0 = time.perf_counter()
        res = train(cfg, quiet=True)
        rw_wall = time.perf_counter() - t0
        rw_times = [h["time/step_s"] for h in res.history]
        from rollwise.training.checkpoint import latest_checkpoint, load_checkpoint_weights

        m = load_model(resolve_model_path(cfg.model.name_or_path))
        load_checkpoint_weights(latest_checkpoint(res.run_dir), m)
        rw_acc = score_model(m, cfg, eval_items, eval_ids, tok, runner)
        r = {
            "rollwise_acc": rw_acc, "trl_acc": trl_acc,
            "rollwise_median_step_s": statistics.median(rw_times), "trl_median_step_s": statistics.median(trl_times),
            "rollwise_wall_s": rw_wall, "trl_wall_s": trl_wall,
        }
        r["step_time_ratio_trl_over_rollwise"] = r["trl_median_step_s"] / r["rollwise_median_step_s"]
        results["seeds"][seed] = r
        print(json.dumps({"seed": seed, **r}), flush=True)
    results["base_acc"] = base
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"\n{'seed':>4} {'base':>6} {'rollwise':>9} {'TRL':>6} {'rw step s':>10} {'TRL step s':>11} {'TRL/rw':>7}")
    for seed, r in results["seeds"].items():
        print(f"{seed:>4} {base:>6.3f} {r['rollwise_acc']:>9.3f} {r['trl_acc']:>6.3f} {r['rollwise_median_step_s']:>10.1f}"
              f" {r['trl_median_step_s']:>11.1f} {r['step_time_ratio_trl_over_rollwise']:>7.2f}")
    runner.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
