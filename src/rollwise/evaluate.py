"""Held-out evaluation: greedy accuracy and, when asked, pass@k."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rollwise.engine import GenerationRequest, HFEngine
from rollwise.planner.base import task_of
from rollwise.rewards import RewardRunner
from rollwise.types import PromptItem


def is_correct(parts: dict[str, float], primary: str) -> bool:
    """A sample is correct when the first reward function in the config scores it 1."""
    return parts.get(primary, 0.0) >= 1.0 - 1e-9


def success_not_correct(samples: Sequence[Any], threshold: float, primary: str) -> float:
    """Share of `samples` whose reward reaches `threshold` (planner.success_threshold: a success for the
    planner's belief and the replay bank) that the first reward function does not score correct:
    partial credit counted as solved (reasoning_gym scores "-41" for "-4" 0.67)."""
    if not samples:
        return 0.0
    return sum(s.reward >= threshold and not is_correct(s.reward_parts, primary) for s in samples) / len(samples)


def evaluate(
    engine: HFEngine,
    items: list[PromptItem],
    prompt_ids: list[list[int]],
    runner: RewardRunner,
    primary: str,
    tokenizer,
    max_new_tokens: int,
    pass_k: int = 0,
    temperature: float = 1.0,
    seed: int = 0,
) -> dict[str, float]:
    """Greedy accuracy on `items` (and pass@k with k samples at `temperature` when pass_k > 0)."""
    if not items:
        return {}
    reqs = [GenerationRequest(p, max_new_tokens, greedy=True) for p in prompt_ids]
    outs = engine.generate(reqs)
    texts = [tokenizer.decode(o.response_ids, skip_special_tokens=True) for o in outs]
    res = runner.score(texts, items)
    correct = [is_correct(p, primary) for p in res.parts]
    by_task: dict[str, list[bool]] = {}
    for it, c in zip(items, correct):
        # the entry of data.tasks, as the uid names it ("chain_sum#2" for a generator listed twice), as
        # planner/task_share/<task> does
        by_task.setdefault(task_of(it.uid) or it.task, []).append(c)
    metrics = {
        "eval/accuracy": sum(correct) / len(items),
        **{f"eval/accuracy/{t}": sum(v) / len(v) for t, v in sorted(by_task.items())},
        "eval/reward_mean": sum(res.rewards) / len(items),
        "eval/items": float(len(items)),
        "eval/response_len_mean": sum(len(o.response_ids) for o in outs) / len(items),
        # answers cut at max_new_tokens: a run whose answers get shorter may gain accuracy just by finishing them
        "eval/truncated_frac": sum(o.finish_reason == "length" for o in outs) / len(items),
        # calls that raised, hung or returned no number scored 0: an accuracy of 0 from a broken reward says so
        "eval/reward_failures": float(res.errors + res.timeouts + res.nans),
    }
    if pass_k > 0:
        gen = torch.Generator().manual_seed(seed + 1_000_003)
        reqs = [GenerationRequest(p, max_new_tokens, temperature=temperature) for p in prompt_ids for _ in range(pass_k)]
        outs = engine.generate(reqs, generator=gen)
        texts = [tokenizer.decode(o.response_ids, skip_special_tokens=True) for o in outs]
        rep = [it for it in items for _ in range(pass_k)]
        res = runner.score(texts, rep)
        metrics["eval/reward_failures"] += res.errors + res.timeouts + res.nans
        ok = [is_correct(p, primary) for p in res.parts]
        hits = [any(ok[i * pass_k : (i + 1) * pass_k]) for i in range(len(items))]
        metrics[f"eval/pass@{pass_k}"] = sum(hits) / len(items)
    return metrics
