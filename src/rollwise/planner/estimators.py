"""Estimators: a belief about each prompt's solve rate, updated from the groups it sees.

All estimators index prompts by position in the pool (the planner maps uids to indices) and
keep numpy arrays, so a whole candidate pool is scored in one call.

- `BetaEstimator` (MoPPS): Beta(1,1) prior; after k rollouts with s successes
  alpha <- lam*alpha + (1-lam) + s, beta <- lam*beta + (1-lam) + (k-s).
- `TwoScaleBetaEstimator` (VADE): a fast and a slow decayed Beta, blended.
- `WindowEstimator`: mean of the last `window` rewards.
- `LastVisitEstimator` (Knapsack-RL): mean at the last visit, topped up from earlier rewards
  to `window` when that visit had fewer.
- `RankEstimator` (E3): window mean plus a difficulty rank in [0, 1) (hardest near 1).
- `IRTEstimator` (ours): logistic belief per prompt on a grid plus a learned global level,
  so beliefs formed at old visits follow the policy's progress.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np

from rollwise.planner.base import task_of


class Estimator(ABC):
    """Base: subclasses provide update/mean/count and their state."""

    name = "base"

    def __init__(self, size: int):
        self.size = size

    @abstractmethod
    def update(self, idx: int, successes: int, n: int) -> None:
        """Subclasses implement this."""

    @abstractmethod
    def mean(self, idx: np.ndarray) -> np.ndarray:
        """Subclasses implement this."""

    @abstractmethod
    def count(self, idx: np.ndarray) -> np.ndarray:
        """Rewards observed (after decay, for posteriors) per prompt."""

    def pseudo_counts(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(alpha, beta) of a Beta belief; non-Bayesian estimators use 1 + successes, 1 + failures."""
        m, c = self.mean(idx), self.count(idx)
        return 1.0 + m * c, 1.0 + (1.0 - m) * c

    def sample(self, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """A Thompson draw of each prompt's solve rate."""
        a, b = self.pseudo_counts(idx)
        return rng.beta(a, b)

    def expect(self, idx: np.ndarray, f: Callable[[np.ndarray], np.ndarray], rng: np.random.Generator) -> np.ndarray:
        """E[f(p)] under each prompt's belief (Monte Carlo over 32 draws; grids are exact)."""
        return np.mean([f(self.sample(idx, rng)) for _ in range(32)], axis=0)

    def after_step(self) -> None:  # noqa: B027 - optional hook, most estimators need nothing
        """Called once per step after the step's updates."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Subclasses implement this."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Subclasses implement this."""


class BetaEstimator(Estimator):
    name = "beta"

    def __init__(self, size: int, decay: float = 1.0):
        super().__init__(size)
        self.decay = decay
        self.alpha = np.ones(size)
        self.beta = np.ones(size)

    def update(self, idx: int, successes: int, n: int) -> None:
        lam = self.decay
        self.alpha[idx] = lam * self.alpha[idx] + (1.0 - lam) + successes
        self.beta[idx] = lam * self.beta[idx] + (1.0 - lam) + (n - successes)

    def mean(self, idx: np.ndarray) -> np.ndarray:
        return self.alpha[idx] / (self.alpha[idx] + self.beta[idx])

    def count(self, idx: np.ndarray) -> np.ndarray:
        return self.alpha[idx] + self.beta[idx] - 2.0

    def pseudo_counts(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.alpha[idx], self.beta[idx]

    def state_dict(self) -> dict[str, Any]:
        return {"alpha": self.alpha.tolist(), "beta": self.beta.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.alpha = np.asarray(state["alpha"], dtype=float)
        self.beta = np.asarray(state["beta"], dtype=float)


class TwoScaleBetaEstimator(Estimator):
    """Two decayed Beta posteriors (fast, slow); the belief blends their pseudo-counts."""

    name = "two_scale_beta"

    def __init__(self, size: int, fast: float = 0.5, slow: float = 0.95, fast_weight: float = 0.5):
        super().__init__(size)
        self.fast, self.slow = BetaEstimator(size, fast), BetaEstimator(size, slow)
        self.w = fast_weight

    def update(self, idx: int, successes: int, n: int) -> None:
        self.fast.update(idx, successes, n)
        self.slow.update(idx, successes, n)

    def pseudo_counts(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        w = self.w
        a = w * self.fast.alpha[idx] + (1 - w) * self.slow.alpha[idx]
        b = w * self.fast.beta[idx] + (1 - w) * self.slow.beta[idx]
        return a, b

    def mean(self, idx: np.ndarray) -> np.ndarray:
        a, b = self.pseudo_counts(idx)
        return a / (a + b)

    def count(self, idx: np.ndarray) -> np.ndarray:
        a, b = self.pseudo_counts(idx)
        return a + b - 2.0

    def state_dict(self) -> dict[str, Any]:
        return {"fast": self.fast.state_dict(), "slow": self.slow.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.fast.load_state_dict(state["fast"])
        self.slow.load_state_dict(state["slow"])


class WindowEstimator(Estimator):
    """Mean of the last `window` samples' outcomes of each prompt (a ring buffer; each slot holds its
    visit's success share)."""

    name = "window"

    def __init__(self, size: int, window: int = 16):
        super().__init__(size)
        self.window = window
        self.buf = np.zeros((size, window))
        self.head = np.zeros(size, dtype=np.int64)  # rewards ever written
        self.last_n = np.zeros(size, dtype=np.int64)  # rewards in the last visit
        self.last_s = np.zeros(size, dtype=np.int64)

    def update(self, idx: int, successes: int, n: int) -> None:
        self.last_n[idx], self.last_s[idx] = n, successes
        # each of the visit's slots holds its success share, so that a visit partly overwritten by later
        # ones keeps its share (written as ones then zeros, the oldest visit lost its successes first)
        k = min(n, self.window)
        pos = (self.head[idx] + np.arange(k)) % self.window
        self.buf[idx, pos] = successes / n if n else 0.0
        self.head[idx] += k

    def count(self, idx: np.ndarray) -> np.ndarray:
        return np.minimum(self.head[idx], self.window).astype(float)

    def mean(self, idx: np.ndarray) -> np.ndarray:
        c = self.count(idx)
        s = self.buf[idx].sum(axis=1)
        return np.where(c > 0, s / np.maximum(c, 1), 0.5)

    def state_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k).tolist() for k in ("buf", "head", "last_n", "last_s")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        buf = np.asarray(state["buf"], dtype=float).reshape(self.size, -1)
        for k in ("head", "last_n", "last_s"):
            setattr(self, k, np.asarray(state[k], dtype=np.int64))
        self.buf = buf if buf.shape[1] == self.window else self._refit(buf)

    def _refit(self, buf: np.ndarray) -> np.ndarray:
        """A saved ring buffer of another width (a resume that changes planner.estimator_window): each
        prompt keeps its newest min(old, new) slots, renumbered from 0 so that the count is what is kept."""
        old, out = buf.shape[1], np.zeros((self.size, self.window))
        for i, h in enumerate(self.head):
            kept = int(min(h, old, self.window))
            out[i, :kept] = buf[i, [e % old for e in range(h - kept, h)]]
            self.head[i] = kept
        return out


class LastVisitEstimator(WindowEstimator):
    """Mean of the last visit; a visit with fewer than `window` rewards is topped up with the
    most recent earlier ones (Knapsack-RL's estimator)."""

    name = "last_visit"

    def mean(self, idx: np.ndarray) -> np.ndarray:
        idx = np.atleast_1d(idx)
        full = self.last_n[idx] >= self.window
        last = self.last_s[idx] / np.maximum(self.last_n[idx], 1)
        return np.where(full, last, super().mean(idx))

    def count(self, idx: np.ndarray) -> np.ndarray:
        idx = np.atleast_1d(idx)
        return np.maximum(np.minimum(self.head[idx], self.window), self.last_n[idx]).astype(float)


class RankEstimator(WindowEstimator):
    """Window mean plus a rank r in [0, 1) among seen prompts: 0 for the easiest and for
    unseen prompts, (m-1)/m for the hardest of m seen (E3)."""

    name = "rank"

    def rank(self, idx: np.ndarray) -> np.ndarray:
        return rank_by_mean(self, idx)


def rank_by_mean(est: Estimator, idx: np.ndarray) -> np.ndarray:
    """Difficulty rank of `idx` among all seen prompts of the pool, from estimated means: the i-th easiest
    of m has rank i/m; prompts of equal means share their positions' average (else which of, say, the
    all-wrong prompts got more samples would follow their order in the dataset); unseen prompts 0."""
    pool = np.arange(est.size)
    seen = est.count(pool) > 0
    m = int(seen.sum())
    out = np.zeros(len(idx))
    if m == 0:
        return out
    means = est.mean(pool)[seen]
    order = np.argsort(-means, kind="stable")  # easiest first
    # runs of equal means; equal up to rounding: a window's mean is a float sum of its visits' shares, so the
    # same accuracy reached through visits of other sizes can differ in its last bit (4/4 then 1/6 gives
    # 0.5000000000000001, 5/10 gives 0.5)
    new_run = np.concatenate([[True], np.diff(means[order]) < -1e-12])
    start = np.flatnonzero(new_run)
    size = np.diff(np.append(start, m))
    r = np.zeros(est.size)
    r[pool[seen][order]] = np.repeat(start + (size - 1) / 2, size) / m
    return r[np.asarray(idx, dtype=np.int64)]


def make_estimator(name: str, size: int, cfg: Any, uids: list[str] | None = None,
                   prompt_lengths: list[int] | list[float] | None = None) -> Estimator:
    if name == "beta":
        return BetaEstimator(size, cfg.posterior_decay)
    if name == "two_scale_beta":
        return TwoScaleBetaEstimator(size, cfg.vade_fast_decay, cfg.vade_slow_decay, cfg.vade_fast_weight)
    if name == "window":
        return WindowEstimator(size, cfg.estimator_window)
    if name == "last_visit":
        return LastVisitEstimator(size, cfg.estimator_window)
    if name == "rank":
        return RankEstimator(size, cfg.estimator_window)
    if name == "irt":
        from rollwise.planner.irt import IRTEstimator

        groups = [task_of(u) for u in uids] if uids and cfg.group_prior else None
        if cfg.length_prior and prompt_lengths is None:
            raise ValueError("planner.length_prior=true needs each prompt's token length: the training loop passes "
                             "them, the simulator has none (drop length_prior there)")
        return IRTEstimator(size, cfg.posterior_decay, groups=groups,
                            covariate=prompt_lengths if cfg.length_prior else None)
    raise ValueError(f"unknown estimator '{name}'; allowed: beta, two_scale_beta, window, last_visit, rank, irt")
