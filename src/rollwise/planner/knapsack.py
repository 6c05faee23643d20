"""Exact multiple-choice knapsack: pick one option per item, maximise value under a budget.

Knapsack-RL's allocation problem: item = prompt, option = number of samples n with cost n
(rollouts, or quantised tokens) and value [1 - p^n - (1-p)^n] * p(1-p)^2.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def solve_mckp(values: Sequence[np.ndarray], costs: Sequence[np.ndarray], capacity: int) -> list[int]:
    """Choose one option per item maximising total value with total cost <= capacity.

    `values[i][k]`, `costs[i][k]` (non-negative ints): option k of item i. Returns the chosen
    option index per item. Exact dynamic programme, O(items * capacity * options). Raises
    ValueError when even the cheapest options do not fit.
    """
    m = len(values)
    if m == 0:
        return []
    capacity = int(capacity)
    if sum(int(np.min(c)) for c in costs) > capacity:
        raise ValueError("knapsack: the cheapest options of all items exceed the capacity")
    caps = np.arange(capacity + 1)
    dp = np.zeros(capacity + 1)  # dp[c]: best value of the items so far with total cost <= c
    choice = np.zeros((m, capacity + 1), dtype=np.int64)
    for i in range(m):
        v = np.asarray(values[i], dtype=float)
        c = np.asarray(costs[i], dtype=np.int64)
        rest = caps[:, None] - c[None, :]  # [C+1, K]
        cand = np.where(rest >= 0, dp[np.clip(rest, 0, None)] + v[None, :], -np.inf)
        # dp is -inf where an earlier item could not fit; that propagates through cand
        k = np.argmax(cand, axis=1)
        choice[i] = k
        dp = cand[caps, k]
    out = [0] * m
    c_left = capacity
    for i in range(m - 1, -1, -1):
        k = int(choice[i, c_left])
        out[i] = k
        c_left -= int(costs[i][k])
    return out


def informative_value(p: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Knapsack-RL value of giving a prompt with solve rate p n samples:
    P(group informative) * p(1-p)^2, with P(informative) = 1 - p^n - (1-p)^n."""
    p = np.asarray(p, dtype=float)
    return (1.0 - p**n - (1.0 - p) ** n) * p * (1.0 - p) ** 2


def needed_samples(p: float, max_n: int, miss: float = 0.1) -> int:
    """Samples for a 1-miss chance of an informative group: log(miss)/log(max(p, 1-p))."""
    q = max(p, 1.0 - p)
    if q >= 1.0:
        return max_n
    return int(min(max_n, np.ceil(np.log(miss) / np.log(q))))
