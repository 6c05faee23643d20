"""What one step has seen so far: the groups (all rounds together), budget and spending."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Group:
    """All samples of one prompt within a step, across rounds."""

    uid: str
    idx: int
    rewards: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    requested: int = 0
    rounds: int = 0
    successes: int = 0
    adopted: int = 0  # samples carried in from the step that requested them (partial rollouts): charged there

    @property
    def n(self) -> int:
        return len(self.rewards)

    @property
    def outstanding(self) -> int:
        """Samples requested whose results have not come back yet."""
        return self.requested - self.n

    @property
    def tokens(self) -> int:
        return int(sum(self.lengths))

    @property
    def informative(self) -> bool:
        """Non-zero reward variance: GRPO gives these samples a non-zero advantage."""
        return self.n > 1 and max(self.rewards) != min(self.rewards)

    @property
    def all_correct(self) -> bool:
        return self.n > 0 and self.successes == self.n

    @property
    def all_wrong(self) -> bool:
        return self.n > 0 and self.successes == 0


@dataclass
class StepState:
    step: int
    budget: int  # rollouts this step may spend (a target for multi-round strategies)
    groups: dict[str, Group] = field(default_factory=dict)
    rounds: int = 0
    selector_rounds: int = 1
    target_prompts: int = 0
    predicted: dict[str, float] = field(default_factory=dict)  # estimator mean before the step (the prior if unseen)
    seen_before: set[str] = field(default_factory=set)  # prompts with observations before the step
    skipped: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def used_rollouts(self) -> int:
        """Rollouts this step requested (adopted samples were requested, and charged, in an earlier step)."""
        return sum(g.requested - g.adopted for g in self.groups.values())

    @property
    def generated_rollouts(self) -> int:
        return sum(g.n for g in self.groups.values())

    @property
    def generated_tokens(self) -> int:
        return sum(g.tokens for g in self.groups.values())

    def informative_groups(self) -> list[Group]:
        return [g for g in self.groups.values() if g.informative]


def allocation_summary(counts: list[int]) -> dict[str, float]:
    if not counts:
        return {"planner/samples_per_prompt_min": 0.0, "planner/samples_per_prompt_mean": 0.0,
                "planner/samples_per_prompt_max": 0.0}
    a = np.asarray(counts, dtype=float)
    return {"planner/samples_per_prompt_min": float(a.min()), "planner/samples_per_prompt_mean": float(a.mean()),
            "planner/samples_per_prompt_max": float(a.max())}
