"""The planner protocol: which prompts to roll out this step, how many samples each, and
which groups to train on. It sees only prompt uids, rewards and lengths, so the same code
runs in real training and in the simulator (which replaces the engine and the rewarder).

One step is a conversation with the loop:

    requests = planner.begin_step(step)
    while requests:
        results = generate_and_score(requests)     # GroupResult per request
        requests = planner.observe(results)        # more rounds (backfill, stages) or []
    outcome = planner.end_step()                   # which uids to train, which to repair

A planner whose `streams` is true may instead be shown each group as soon as it finishes
(`observe([one_group])`, while the rest of the round is still being generated); the requests
it returns then join the running engine round (rollout.overlap_rounds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


@dataclass
class Request:
    """Roll out prompt `uid` `n` times (optionally with its own length cap). No temperature of its own:
    the trainer scores every sample at rollout.temperature, so another one would bias the ratios."""

    uid: str
    n: int
    max_new_tokens: int | None = None


@dataclass
class GroupResult:
    """What one request produced: a reward and a response length per sample."""

    uid: str
    rewards: list[float]
    lengths: list[int]


@dataclass
class StepOutcome:
    """The planner's decision at the end of a step.

    `train`: uids whose samples (all rounds of this step together) are trained on.
    `replay`: uids whose group gets one stored past correct response, gradient stopped.
    `discarded_rollouts`/`discarded_tokens`: generated this step but not trained on.
    `notes`: things the user should hear (for example a backfill limit that was reached).
    """

    train: list[str]
    replay: list[str] = field(default_factory=list)
    discarded_rollouts: int = 0
    discarded_tokens: int = 0
    notes: list[str] = field(default_factory=list)


class Planner(Protocol):
    # True when observe() may be given the groups one by one as they finish, while other groups of
    # the round are still being generated (rollout.overlap_rounds); False when it decides from a
    # whole round at once
    streams: bool
    follows_up: bool  # False when observe() never asks for more (nothing to overlap)
    overlapped: bool  # set by the loop: observe() is being given groups one by one

    def begin_step(self, step: int) -> list[Request]: ...

    def observe(self, results: list[GroupResult]) -> list[Request]: ...

    def end_step(self) -> StepOutcome: ...

    def adopt(self, results: list[GroupResult]) -> None:
        """Groups started in an earlier step that completed in this one (partial rollouts carry
        unfinished groups across steps): count them in this step as if requested now."""
        ...

    def metrics(self) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def follows_up(part: type, base: type) -> bool:
    """Whether a planner part's class (an Allocator or Selector subclass of `base`) can ask for
    extra rounds at all: it overrides `more`."""
    return part.more is not base.more  # type: ignore[attr-defined]


def groupwise(part: type, base: type) -> bool:
    """Whether a planner part's class can be asked group by group (rollout.overlap_rounds): it has
    no `more` of its own, or says `per_group`."""
    return not follows_up(part, base) or bool(part.per_group)  # type: ignore[attr-defined]


def task_of(uid: str) -> str:
    """A prompt's task: its uid's prefix before ':' ("" for uids without one)."""
    return uid.split(":", 1)[0] if ":" in uid else ""


class PromptStream:
    """Shuffled passes over the prompt pool; reshuffled each epoch from the seed.

    Its cursor is the run's data position and is saved in checkpoints.
    """

    def __init__(self, uids: list[str], seed: int):
        if not uids:
            raise ValueError("the training prompt pool is empty")
        self.uids = list(uids)
        self.seed = seed
        self.epoch = 0
        self.cursor = 0
        self._order = self._shuffle(0)

    def _shuffle(self, epoch: int) -> list[int]:
        return list(np.random.default_rng([self.seed, epoch]).permutation(len(self.uids)))

    def take(self, k: int) -> list[str]:
        out = []
        for _ in range(k):
            if self.cursor >= len(self._order):
                self.epoch += 1
                self.cursor = 0
                self._order = self._shuffle(self.epoch)
            out.append(self.uids[self._order[self.cursor]])
            self.cursor += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.cursor = int(state["cursor"])
        self._order = self._shuffle(self.epoch)


class UniformPlanner:
    """What TRL does: every step takes the next `prompts_per_step` prompts, `n` samples each,
    and trains on all of them."""

    def __init__(self, uids: list[str], prompts_per_step: int, num_generations: int, seed: int):
        self.stream = PromptStream(uids, seed)
        self.prompts_per_step = prompts_per_step
        self.n = num_generations
        self._current: list[str] = []
        self.streams = True  # observe() asks for nothing
        self.follows_up = False
        self.overlapped = False

    def begin_step(self, step: int) -> list[Request]:
        self._current = self.stream.take(self.prompts_per_step)
        return [Request(uid, self.n) for uid in self._current]

    def observe(self, results: list[GroupResult]) -> list[Request]:
        return []

    def adopt(self, results: list[GroupResult]) -> None:
        self._current += [r.uid for r in results if r.uid not in self._current]

    def end_step(self) -> StepOutcome:
        return StepOutcome(train=list(self._current))

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"stream": self.stream.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state["stream"])
