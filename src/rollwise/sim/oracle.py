"""An estimator that reads the simulated world's true solve rates: a ceiling, not a strategy.

`rollwise simulate --strategies mopps:estimator=oracle` runs a preset with perfect knowledge of
every prompt's current solve rate. The gap between a strategy and its oracle row is what a
better estimator could still win; the oracle row's own figure is the most that selection and
allocation can win in that world.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rollwise.planner.estimators import Estimator
from rollwise.sim.world import World


def split_oracle(over: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Planner overrides without `estimator=oracle` (not a config value), and whether it was there."""
    oracle = over.get("estimator") == "oracle"
    return {k: v for k, v in over.items() if not (oracle and k == "estimator")}, oracle


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
