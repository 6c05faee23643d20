"""Repair for groups that teach nothing.

`ReplayRepair` (AR3PO's response reuse): when a trained group is all-wrong and the prompt
has had a correct response before, the planner names its uid in `StepOutcome.replay`; the
loop adds that stored correct response to the group with its gradient stopped, so it only
anchors the group mean and std and the on-policy wrong answers get a negative advantage.
The planner keeps only whether a correct response exists; the loop stores the sample.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rollwise.planner.step import StepState


class NoRepair:
    name = "none"

    def choose(self, st: StepState, train: list[str]) -> list[str]:
        return []

    def after_step(self, st: StepState) -> None:
        """Hook after each step; no repair keeps no state."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore."""


class ReplayRepair(NoRepair):
    name = "replay"

    def __init__(self, size: int):
        self.has_correct = np.zeros(size, dtype=bool)

    def choose(self, st: StepState, train: list[str]) -> list[str]:
        """Trained all-wrong groups whose prompt was solved in an earlier step."""
        return [u for u in train if st.groups[u].all_wrong and self.has_correct[st.groups[u].idx]]

    def after_step(self, st: StepState) -> None:
        for g in st.groups.values():
            if g.successes > 0:
                self.has_correct[g.idx] = True

    def state_dict(self) -> dict[str, Any]:
        return {"has_correct": np.flatnonzero(self.has_correct).tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.has_correct[:] = False
        self.has_correct[np.asarray(state["has_correct"], dtype=np.int64)] = True


def make_repair(name: str, size: int) -> NoRepair:
    if name == "none":
        return NoRepair()
    if name == "replay":
        return ReplayRepair(size)
    raise ValueError(f"unknown repair '{name}'; allowed: none, replay")
