"""The default job (`rollwise train` with no arguments) set up at fixed weights, for benchmarks
that compare two ways of doing one thing side by side in one process."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from rollwise.config import build_config
from rollwise.loop import setup
from rollwise.models import merged_state_dict
from rollwise.training.checkpoint import load_checkpoint_weights


def default_job(prefix: str, checkpoint: str | None = None, dtype: str = "float32"):
    """(run, cfg) of the default job in `dtype` (a `model.dtype` name) on 2 threads, seed 0, no
    evaluation, in a temporary folder; the weights are the base model's or `checkpoint`'s, in the
    trainer and the engine."""
    torch.set_num_threads(2)
    out_dir = Path(tempfile.mkdtemp(prefix=prefix))
    cfg = build_config({"run": {"output_dir": str(out_dir), "name": "bench", "seed": 0, "progress": False,
                                "tensorboard": False, "torch_threads": 2},
                        "model": {"dtype": dtype}, "eval": {"at_start": False, "at_end": False}})
    run = setup(cfg)
    if checkpoint:
        load_checkpoint_weights(Path(checkpoint), run.model)
        run.engine.load_weights(merged_state_dict(run.model), version=0)
    return run, cfg


def count_correct(run, cfg, uids: list[str], samples: int, chunk: int = 32, progress: bool = False) -> dict[str, int]:
    """Correct answers (the first reward function scores 1, as in evaluation) out of `samples`
    sampled responses to each prompt of `uids`, at the config's sampling settings, `chunk`
    prompts per engine call."""
    from rollwise.engine.executor import RolloutExecutor
    from rollwise.evaluate import is_correct
    from rollwise.planner.base import Request

    ex = RolloutExecutor(run.engine, run.ids_by_uid, cfg.rollout.max_completion_length, cfg.rollout.temperature)
    correct = dict.fromkeys(uids, 0)
    for i in range(0, len(uids), chunk):
        out = ex.generate([Request(u, samples) for u in uids[i:i + chunk]], first_round=True)
        owners = [u for u, outs in out.groups.items() for _ in outs]
        texts = [run.tokenizer.decode(o.response_ids, skip_special_tokens=True)
                 for outs in out.groups.values() for o in outs]
        scored = run.runner.score(texts, [run.items_by_uid[u] for u in owners])
        for u, parts in zip(owners, scored.parts):
            correct[u] += int(is_correct(parts, run.primary))
        if progress:
            print(f"{min(i + chunk, len(uids))}/{len(uids)} prompts", flush=True)
    return correct


def finish(run, name: str, label: str, result: dict) -> None:
    """Stop the reward worker and write bench/out/NAME[_LABEL].json."""
    run.runner.close()
    dest = Path("bench/out")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / f"{name}{'_' + label if label else ''}.json").write_text(json.dumps(result, indent=1))


def replay_planner(pl, q: dict[str, float], rng, steps: int) -> tuple[float, float, list[float]]:
    """Play planner `pl` for `steps` steps at fixed weights against prompts solved with rates `q`
    (binary rewards drawn from `rng`, every response 20 tokens): rollouts generated, rollouts in
    informative groups, and the rate of every prompt requested."""
    from rollwise.planner import GroupResult

    gen = eff = 0.0
    chosen: list[float] = []
    for step in range(steps):
        reqs = pl.begin_step(step)
        while reqs:
            chosen += [q[r.uid] for r in reqs]
            reqs = pl.observe([GroupResult(r.uid, (rng.random(r.n) < q[r.uid]).astype(float).tolist(), [20] * r.n)
                               for r in reqs])
        pl.end_step()
        m = pl.metrics()
        gen += m["rollout/rollouts"]
        eff += m["planner/effective_ratio"] * m["rollout/rollouts"]
    return gen, eff, chosen


def replay_with_prior(uids: list[str], q: dict[str, float], covariate: list[float] | None, seeds: int,
                      steps: int) -> np.ndarray:
    """`adaptive` (with `length_prior` on `covariate`, if given) replayed at fixed weights against
    prompts solved with rates `q`, one row per seed: effective ratio, rollouts in informative
    groups, mean solve rate of the prompts requested."""
    from rollwise.config import PlannerConfig
    from rollwise.planner import build_planner

    out = []
    for seed in range(seeds):
        rng = np.random.default_rng([seed, 7])
        pl = build_planner(PlannerConfig(strategy="adaptive", length_prior=covariate is not None), uids, 8, 8, 48,
                           seed, covariate)
        gen, eff, chosen = replay_planner(pl, q, rng, steps)
        out.append((eff / gen, eff, float(np.mean(chosen))))
    return np.array(out)
