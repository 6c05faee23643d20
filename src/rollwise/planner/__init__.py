"""Rollout planners: which prompts to roll out, how many samples each, what to train on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollwise.planner.base import GroupResult, Planner, PromptStream, Request, StepOutcome, UniformPlanner
from rollwise.planner.core import ComposedPlanner
from rollwise.planner.strategies import PRESETS, STRATEGIES, make_planner

if TYPE_CHECKING:
    from rollwise.config import PlannerConfig

__all__ = [
    "PRESETS",
    "STRATEGIES",
    "ComposedPlanner",
    "GroupResult",
    "Planner",
    "PromptStream",
    "Request",
    "StepOutcome",
    "UniformPlanner",
    "build_planner",
]


def build_planner(
    cfg: PlannerConfig,
    uids: list[str],
    prompts_per_step: int,
    num_generations: int,
    max_completion_length: int,
    seed: int,
    prompt_lengths: list[int] | list[float] | None = None,
) -> Planner:
    """Build the planner named by `cfg.strategy` (parts overridable in `cfg`).

    The step budget is `cfg.budget_rollouts` (default prompts_per_step * num_generations) or
    `cfg.budget_tokens`; `max_completion_length` seeds the response-length estimate that
    converts a token budget into rollouts. `prompt_lengths` (tokens, one per uid) feed the
    `irt` estimator's `length_prior`.
    """
    return make_planner(cfg, uids, prompts_per_step, num_generations, max_completion_length, seed, prompt_lengths)
