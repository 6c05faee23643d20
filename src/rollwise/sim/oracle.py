"""Estimators that read the simulated world's true solve rates: ceilings, not strategies.

`rollwise simulate --strategies adaptive:estimator=oracle` runs a preset with perfect knowledge
of every prompt's current solve rate. The gap between a strategy and its oracle row is what a
better estimator could still win; the oracle row's own figure is the most that selection and
allocation can win in that world.

Two partial oracles split that gap. Both keep the preset's own belief for prompts never rolled
out (nothing distinguishes them before a first visit in the default world) and know the truth
about the others:

- `oracle_seen`: the true *current* solve rate of every prompt rolled out at least once, as
  if each visit measured the prompt exactly and the belief then followed the policy perfectly;
- `oracle_visit`: the true solve rate *at the prompt's last visit*, kept until the next one,
  as if each visit measured exactly but nothing followed the policy's progress since.

A learned belief without features of the prompt (length, task) can know at most what
`oracle_seen` knows, so its row bounds every such estimator for the preset's selection and
allocation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rollwise.planner.estimators import Estimator
from rollwise.sim.world import World

ORACLES = ("oracle", "oracle_seen", "oracle_visit")


def split_oracle(over: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """Planner overrides without an oracle `estimator=...` (not a config value), and which oracle
    was asked for (None if none)."""
    kind = over.get("estimator")
    if kind not in ORACLES:
        return dict(over), None
    return {k: v for k, v in over.items() if k != "estimator"}, kind


def make_oracle(kind: str, world: World, belief: Estimator) -> Estimator:
    """The oracle `kind` for `world`; the partial ones fall back on `belief` for unseen prompts."""
    if kind == "oracle":
        return OracleEstimator(world)
    if kind in ("oracle_seen", "oracle_visit"):
        return SeenOracleEstimator(world, belief, current=kind == "oracle_seen")
    raise ValueError(f"unknown oracle '{kind}'; allowed: {', '.join(ORACLES)}")


class OracleEstimator(Estimator):
    name = "oracle"

    def __init__(self, world: World):
        super().__init__(world.p.n_train)
        self.world = world

    def update(self, idx: int, successes: int, n: int) -> None:
        """Nothing to learn: the truth is read from the world."""

    def mean(self, idx: np.ndarray) -> np.ndarray:
        return self.world.solve_rate(np.atleast_1d(idx))

    def count(self, idx: np.ndarray) -> np.ndarray:
        return np.full(len(np.atleast_1d(idx)), 1e6)

    def sample(self, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return self.mean(idx)

    def expect(self, idx: np.ndarray, f: Callable[[np.ndarray], np.ndarray], rng: np.random.Generator) -> np.ndarray:
        return f(self.mean(idx))

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore."""


class SeenOracleEstimator(Estimator):
    """The truth about prompts rolled out before (now, or at their last visit); `belief` for the rest."""

    name = "oracle_seen"

    def __init__(self, world: World, belief: Estimator, current: bool):
        super().__init__(world.p.n_train)
        self.world, self.belief, self.current = world, belief, current
        self.seen = np.zeros(self.size, dtype=bool)
        self.at_visit = np.zeros(self.size)

    def update(self, idx: int, successes: int, n: int) -> None:
        self.belief.update(idx, successes, n)
        self.seen[idx] = True
        self.at_visit[idx] = float(self.world.solve_rate(np.array([idx]))[0])

    def after_step(self) -> None:
        self.belief.after_step()

    def _overlay(self, idx: np.ndarray, of_belief: np.ndarray, f: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """`of_belief` (the belief's values for idx) with f(truth) in place for the seen prompts."""
        known = self.seen[idx]
        truth = self.world.solve_rate(idx[known]) if self.current else self.at_visit[idx[known]]
        out = np.asarray(of_belief, dtype=float).copy()
        out[known] = f(truth)
        return out

    def mean(self, idx: np.ndarray) -> np.ndarray:
        idx = np.atleast_1d(idx)
        return self._overlay(idx, self.belief.mean(idx), lambda p: p)

    def count(self, idx: np.ndarray) -> np.ndarray:
        idx = np.atleast_1d(idx)
        return np.where(self.seen[idx], 1e6, self.belief.count(idx))

    def sample(self, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        idx = np.atleast_1d(idx)
        return self._overlay(idx, self.belief.sample(idx, rng), lambda p: p)

    def expect(self, idx: np.ndarray, f: Callable[[np.ndarray], np.ndarray], rng: np.random.Generator) -> np.ndarray:
        idx = np.atleast_1d(idx)
        return self._overlay(idx, self.belief.expect(idx, f, rng), f)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore: the simulator does not checkpoint."""
