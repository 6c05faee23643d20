"""bench/revisits_by_budget.py's counts, hand-computed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("revisits_by_budget",
                                              Path(__file__).parents[1] / "bench" / "revisits_by_budget.py")
rb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rb)


def test_revisits_and_first_trainings_per_fifth_of_the_budget():
    history = [
        {"step": 0, "eval/accuracy": 0.2},
        {"step": 1, "rollout/tokens_total": 10, "rollout/groups": [["a", "10", [3, 4]], ["b", "00", [5, 6]]]},
        {"step": 2, "rollout/tokens_total": 50, "rollout/groups": [["a", "1100", [1, 1, 1, 1]], ["c", "01", [2, 2]]]},
        {"step": 3, "rollout/tokens_total": 100, "rollout/groups": [["c", "011", [1, 1, 1]]]},
    ]
    rev, tot, new = rb.by_fifth(history, budget=100)
    assert tot == [2, 0, 6, 0, 3]  # b is all wrong: no gradient; tokens 100 of 100 fall in the last fifth
    assert rev == [0, 0, 4, 0, 3]  # a's second training (4 samples), then c's second (3)
    assert new == [1, 0, 1, 0, 0]
