"""The synchronous loop, top to bottom: plan -> generate -> reward -> advantages -> update.

Read `train()` in one sitting; everything it calls is a small piece with its own module.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from rollwise.config import Config, build_config, config_to_dict
from rollwise.data import build_items, encode_prompts
from rollwise.engine import HFEngine
from rollwise.engine.continuous import ContinuousEngine
from rollwise.engine.executor import RolloutExecutor
from rollwise.evaluate import evaluate, is_correct
from rollwise.models import DTYPES, apply_lora, load_model, load_tokenizer, merged_state_dict, resolve_model_path
from rollwise.planner import GroupResult, build_planner
from rollwise.rewards import RewardRunner
from rollwise.tracking import Tracker
from rollwise.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint, set_rng_state
from rollwise.training.policy import PolicyTrainer
from rollwise.types import PromptItem, Sample
from rollwise.ui import StepProgress, print_summary


@dataclass
class RunResult:
    run_dir: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    eval_before: dict[str, float] = field(default_factory=dict)
    eval_after: dict[str, float] = field(default_factory=dict)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def set_threads(n: int | None) -> int:
    n = n or os.cpu_count() or 1
    torch.set_num_threads(n)
    return n


def prepare_run_dir(cfg: Config, resume: str | None) -> tuple[Path, Config]:
    if resume:
        run_dir = Path(resume)
        if not (run_dir / "config.yaml").is_file():
            raise FileNotFoundError(f"--resume {resume}: no config.yaml there; not a rollwise run folder")
        return run_dir, cfg
    name = cfg.run.name or datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(cfg.run.output_dir) / name
    if (run_dir / "checkpoints").exists() and any((run_dir / "checkpoints").iterdir()):
        raise FileExistsError(f"run folder {run_dir} already has checkpoints: use --resume {run_dir} or a new run.name")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
    return run_dir, cfg


def load_resumed_config(run_dir: str, overrides: dict[str, Any]) -> Config:
    """The saved config of a run, with command-line overrides (for example a larger max_steps)."""
    from rollwise.config import _merge

    saved = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    return build_config(_merge(saved, overrides))


def train(cfg: Config, resume: str | None = None, quiet: bool = False) -> RunResult:
    # ---- seeding and threads: one seed drives data order, sampling and the planner
    t_start = time.perf_counter()
    set_threads(cfg.run.torch_threads)
    seed_everything(cfg.run.seed)
    run_dir, cfg = prepare_run_dir(cfg, resume)
    if resume:
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))

    # ---- data and rewards (reward functions are imported here: fail before the model loads)
    runner = RewardRunner(cfg.reward)
    primary = cfg.reward.functions[0].name
    train_items, eval_items = build_items(cfg.data, cfg.run.seed)

    # ---- model, tokenizer, engine, trainer
    path = resolve_model_path(cfg.model.name_or_path, cfg.model.cache_dir)
    tokenizer = load_tokenizer(path)
    model = load_model(path, torch.float32)
    eos_ids = sorted({tokenizer.eos_token_id, *_as_list(getattr(model.generation_config, "eos_token_id", None))} - {None})
    ro = cfg.rollout
    # The engine keeps its own copy in the compute dtype, built before LoRA. Speculative reuse runs it in
    # fp32: in bf16, decoding and the one-pass verification round differently and a third of the tokens
    # were rejected with the weights unchanged (bench/spec_same_weights.py).
    engine_dtype = torch.float32 if ro.speculative_reuse else DTYPES[cfg.model.dtype]
    engine_args = (model, eos_ids, tokenizer.pad_token_id, engine_dtype, ro.batch_size, ro.top_p, ro.top_k,
                   cfg.run.seed)
    engine = (ContinuousEngine(*engine_args, num_slots=ro.num_slots, record_topk=ro.spec_topk if ro.speculative_reuse else 0)
              if ro.engine == "continuous" else HFEngine(*engine_args))
    if cfg.model.lora.enabled:
        model = apply_lora(model, cfg.model)
    trainer = PolicyTrainer(cfg, model, tokenizer.pad_token_id)

    train_ids, dropped = encode_prompts(train_items, tokenizer, cfg.data)
    items_by_uid = {it.uid: it for it in train_items}
    ids_by_uid = {it.uid: ids for it, ids in zip(train_items, train_ids) if it.uid not in set(dropped)}
    eval_ids, eval_dropped = encode_prompts(eval_items, tokenizer, cfg.data)
    eval_keep = [i for i, it in enumerate(eval_items) if it.uid not in set(eval_dropped)]
    eval_items = [eval_items[i] for i in eval_keep]
    eval_ids = [eval_ids[i] for i in eval_keep]
    planner = build_planner(cfg.planner, list(ids_by_uid), cfg.rollout.prompts_per_step,
                            cfg.rollout.num_generations, cfg.rollout.max_completion_length, cfg.run.seed)
    replay_bank: dict[str, dict[str, Any]] = {}  # uid -> last correct response (tokens, logprobs)
    executor = RolloutExecutor(engine, ids_by_uid, ro.max_completion_length, ro.temperature, ro.partial_rollouts,
                               ro.retention_limit, ro.speculative_reuse, ro.spec_lenience, ro.partial_stop_fraction,
                               ro.partial_keep_kv)

    # ---- resume
    start_step, totals = 0, {"rollouts": 0, "tokens": 0}
    ckpt = latest_checkpoint(run_dir) if resume else None
    if resume and ckpt is None:
        raise FileNotFoundError(f"--resume {run_dir}: no checkpoint in {run_dir / 'checkpoints'}")
    if ckpt is not None:
        state = load_checkpoint(ckpt, model)
        trainer.optimizer.load_state_dict(state["trainer"]["optimizer"])
        trainer.scheduler.load_state_dict(state["trainer"]["scheduler"])
        planner.load_state_dict(state["extra"]["planner"])
        engine.load_state_dict(state["extra"]["engine"])
        replay_bank = state["extra"]["replay_bank"]
        if "executor" in state["extra"]:
            executor.load_state_dict(state["extra"]["executor"])
        totals = state["extra"]["totals"]
        start_step = state["step"]
        set_rng_state(state["rng"])
    engine.load_weights(merged_state_dict(model), version=start_step)
    tracker = Tracker(run_dir, cfg.run.tensorboard, truncate_after_step=start_step if ckpt else None)
    result = RunResult(run_dir)
    max_eval_tokens = cfg.eval.max_completion_length or cfg.rollout.max_completion_length

    def run_eval(step: int) -> dict[str, float]:
        te = time.perf_counter()
        m = evaluate(engine, eval_items, eval_ids, runner, primary, tokenizer, max_eval_tokens,
                     cfg.eval.pass_k, cfg.rollout.temperature, cfg.run.seed)
        if m:
            m["time/eval_s"] = time.perf_counter() - te
            tracker.log(step, m)
        return m

    tracker.log(start_step, {"time/setup_s": time.perf_counter() - t_start})
    if start_step == 0 and cfg.eval.at_start:
        result.eval_before = run_eval(0)
    if dropped:
        tracker.log(start_step, {"data/dropped_long_prompts": float(len(dropped))})

    # ---- the loop
    progress = StepProgress(cfg.train.max_steps, start_step, enabled=cfg.run.progress and not quiet)
    last_step = start_step
    for step in range(start_step, cfg.train.max_steps):
        t0 = time.perf_counter()
        # plan -> generate -> reward, as many rounds as the planner asks for
        by_uid: dict[str, list[Sample]] = {}
        gen_s = reward_s = 0.0
        rw_errors = rw_timeouts = rw_nans = 0
        requests = planner.begin_step(step)
        first = True
        while requests or (first and executor.carried):
            tg = time.perf_counter()
            out = executor.generate(requests, first_round=first)
            first = False
            gen_s += time.perf_counter() - tg
            owners = [u for grp in (out.groups, out.adopted) for u, outs in grp.items() for _ in outs]
            outs = [o for grp in (out.groups, out.adopted) for os_ in grp.values() for o in os_]
            texts = [tokenizer.decode(o.response_ids, skip_special_tokens=True) for o in outs]
            tr = time.perf_counter()
            scored = runner.score(texts, [items_by_uid[u] for u in owners])
            reward_s += time.perf_counter() - tr
            rw_errors, rw_timeouts, rw_nans = rw_errors + scored.errors, rw_timeouts + scored.timeouts, rw_nans + scored.nans
            fresh: dict[str, list[Sample]] = {}
            for uid, o, text, rew, parts in zip(owners, outs, texts, scored.rewards, scored.parts):
                s = Sample(uid, 0, ids_by_uid[uid], o.response_ids, o.logprobs, o.versions, o.finish_reason,
                           text=text, reward=rew, reward_parts=parts, task=items_by_uid[uid].task)
                fresh.setdefault(uid, []).append(s)
                by_uid.setdefault(uid, []).append(s)
                if is_correct(parts, primary):
                    replay_bank[uid] = {"ids": o.response_ids, "logprobs": o.logprobs, "reward": rew, "parts": parts}
            if out.adopted:
                planner.adopt(_group_results(fresh, out.adopted))
            requests = planner.observe(_group_results(fresh, out.groups)) if requests else []
        outcome = planner.end_step()

        # which samples to train on: the planner's choice, plus stop-gradient replays
        batch: list[Sample] = []
        for g, uid in enumerate(outcome.train):
            for s in by_uid.get(uid, []):
                s.group_id = g
                batch.append(s)
            if uid in outcome.replay and uid in replay_bank:
                rb = replay_bank[uid]
                batch.append(Sample(uid, g, ids_by_uid[uid], rb["ids"], rb["logprobs"], [-1] * len(rb["ids"]), "stop",
                                    reward=rb["reward"], reward_parts=rb["parts"], stop_gradient=True))

        # advantages and the update; then the engine gets the new weights
        tt = time.perf_counter()
        metrics: dict[str, float] = trainer.compute_advantages(batch)
        metrics.update(trainer.update(batch))
        engine.load_weights(merged_state_dict(model), version=step + 1)
        train_s = time.perf_counter() - tt

        # metrics of this step
        generated = [s for ss in by_uid.values() for s in ss]
        n_tok = executor.step_tokens()  # sampled this step: carried prefixes and reused tokens are not counted again
        totals["rollouts"] += len(generated)
        totals["tokens"] += n_tok
        trained = [s for s in batch if not s.stop_gradient]
        metrics.update(planner.metrics())
        metrics.update(executor.metrics())
        metrics.update({
            "rollout/reward_mean": _mean([s.reward for s in trained]),
            "rollout/accuracy": _mean([float(is_correct(s.reward_parts, primary)) for s in trained]),
            "rollout/response_len_mean": _mean([s.num_response_tokens for s in generated]),
            "rollout/truncated_frac": _mean([float(s.finish_reason == "length") for s in generated]),
            "rollout/rollouts": float(len(generated)),
            "rollout/tokens": float(n_tok),
            "rollout/rollouts_total": float(totals["rollouts"]),
            "rollout/tokens_total": float(totals["tokens"]),
            "rollout/tokens_per_s": n_tok / gen_s if gen_s else 0.0,
            "rollout/discarded": float(outcome.discarded_rollouts),
            "reward/errors": float(rw_errors), "reward/timeouts": float(rw_timeouts), "reward/nans": float(rw_nans),
            "time/generate_s": gen_s, "time/reward_s": reward_s, "time/train_s": train_s,
            "time/step_s": time.perf_counter() - t0,
        })
        tracker.log(step + 1, metrics)
        result.history.append({"step": step + 1, **metrics})
        for note in outcome.notes:
            progress.note(f"step {step + 1}: {note}")
        if rw_errors or rw_timeouts or rw_nans:
            progress.note(f"step {step + 1}: reward errors={rw_errors} timeouts={rw_timeouts} nans={rw_nans} (scored 0)")
        progress.update(step + 1, metrics)

        # evaluation and checkpoints
        budget_spent = cfg.train.max_rollout_tokens is not None and totals["tokens"] >= cfg.train.max_rollout_tokens
        done = step + 1 == cfg.train.max_steps or budget_spent
        if cfg.eval.every_n_steps and (step + 1) % cfg.eval.every_n_steps == 0 and not done:
            progress.update(step + 1, {**metrics, **run_eval(step + 1)})
        if done or (cfg.run.save_every and (step + 1) % cfg.run.save_every == 0):
            save_checkpoint(run_dir, step + 1, model,
                            {"optimizer": trainer.optimizer.state_dict(), "scheduler": trainer.scheduler.state_dict()},
                            {"planner": planner.state_dict(), "engine": engine.state_dict(), "replay_bank": replay_bank,
                             "executor": executor.state_dict(), "totals": totals}, cfg.run.keep_checkpoints)
        if done:
            last_step = step + 1
            break
    progress.close()
    if cfg.eval.at_end and last_step > start_step:
        result.eval_after = run_eval(last_step)
    tracker.close()
    runner.close()
    if not quiet:
        print_summary(run_dir)
    return result


def _group_results(samples: dict[str, list[Sample]], uids: Any) -> list[GroupResult]:
    return [GroupResult(u, [s.reward for s in samples[u]], [s.num_response_tokens for s in samples[u]]) for u in uids]


def _mean(xs: list[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else 0.0


def _as_list(x: Any) -> list[Any]:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


__all__ = ["RunResult", "train", "load_resumed_config", "PromptItem"]
