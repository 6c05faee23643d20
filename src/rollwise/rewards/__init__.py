"""Reward functions and the process-isolated runner that applies them."""

from rollwise.rewards.runner import RewardResult, RewardRunner
from rollwise.rewards.verifiers import (
    VERIFIERS,
    exact_match,
    extract_answer,
    format_reward,
    load_user_function,
    math_verify,
    reasoning_gym,
)

__all__ = [
    "VERIFIERS",
    "RewardResult",
    "RewardRunner",
    "exact_match",
    "extract_answer",
    "format_reward",
    "load_user_function",
    "math_verify",
    "reasoning_gym",
]
