"""Rollout planners: which prompts to roll out, how many samples each, what to train on."""

from rollwise.planner.base import GroupResult, Planner, PromptStream, Request, StepOutcome, UniformPlanner

__all__ = ["GroupResult", "Planner", "PromptStream", "Request", "StepOutcome", "UniformPlanner", "build_planner"]


def build_planner(strategy: str, uids: list[str], prompts_per_step: int, num_generations: int, seed: int) -> Planner:
    """Build a planner by strategy name."""
    if strategy == "uniform":
        return UniformPlanner(uids, prompts_per_step, num_generations, seed)
    raise ValueError(f"unknown planner strategy '{strategy}'; allowed: uniform")
