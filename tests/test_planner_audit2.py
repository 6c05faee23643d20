"""Planner audit 2: estimators, selectors, knapsack, repair, warm start and IRT against their formulas,
with hand-computed numbers."""

from __future__ import annotations

import numpy as np
import pytest

from rollwise.config import PlannerConfig
from rollwise.planner import build_planner
from rollwise.planner.estimators import RankEstimator
from rollwise.planner.selectors import apportion
from rollwise.planner.step import StepState


def test_e3_ranks_prompts_of_equal_accuracy_alike_whatever_the_sizes_of_their_visits() -> None:
    """Docs: prompts of equal accuracy share the average of their ranks. A window's mean is a float sum of its
    visits' shares: 4/4 then 1/6 (5 of 10) came out 0.5000000000000001 and 5/10 came out 0.5, so the first
    ranked strictly easier (0 against 1/3) and E3 gave it fewer samples, by dataset order."""
    e = RankEstimator(3, 16)
    e.update(0, 4, 4)
    e.update(0, 1, 6)  # 5 of 10
    e.update(1, 5, 10)  # 5 of 10
    e.update(2, 0, 8)
    # easiest first: the two at 0.5 share positions 0 and 1 of 3 -> (0 + 1) / 2 / 3; the all-wrong one 2/3
    assert e.rank(np.arange(3)).tolist() == pytest.approx([1 / 6, 1 / 6, 2 / 3])
    # E3's allocation in epoch 2 (window [4, 12] at n = 8), budget 24: spare 24 - 3 * 4 = 12 split by r / sum(r)
    # = 1/6, 1/6, 2/3 -> 4 + 2, 4 + 2, 4 + 8 (the float ranks 0, 1/3, 2/3 gave 4, 8, 12)
    pl = build_planner(PlannerConfig(strategy="e3", budget_rollouts=24), ["a", "b", "c"], 3, 8, 64, 0)
    pl.estimator.update(0, 4, 4)
    pl.estimator.update(0, 1, 6)
    pl.estimator.update(1, 5, 10)
    pl.estimator.update(2, 0, 8)
    pl.stream.epoch = 2
    assert pl.allocator.allocate(pl, ["a", "b", "c"], 24, StepState(step=0, budget=24)) == [6, 6, 12]


def test_greso_looks_at_each_prompt_at_most_once_a_step() -> None:
    """GRESO skips a prompt with probability 1 - max(p^z, 0.01) once a step. A step whose draws ran past the
    end of the stream's epoch drew prompts it had skipped again from the next epoch's order: a second chance
    to be kept, a prompt counted twice in planner/skipped_prompts, and another prompt never looked at."""
    pl = build_planner(PlannerConfig(strategy="greso"), ["a", "b", "c"], 3, 4, 64, 1)
    sel = pl.selector
    sel.z_easy[:] = 1000  # every prompt easy many times over: kept with probability 0.01
    pl.stream.take(2)  # one prompt of epoch 0 left
    looked: list[int] = []
    keep = sel.keep_probability
    sel.keep_probability = lambda i: (looked.append(int(i)), keep(i))[1]
    st = StepState(step=0, budget=12)
    chosen = sel.select(pl, 3, st)
    assert chosen == [] and sorted(looked) == [0, 1, 2] and st.skipped == 3  # was [2, 2, 0]: c twice, b never


def test_apportion_survives_the_largest_draw_the_generator_can_return() -> None:
    """Systematic sampling puts points at u, u + 1, ...; with u = 1 - 2^-53 the last point rounds up to `extra`
    itself, which searchsorted places past the last task (IndexError, a crash of the stratified selector)."""

    class Top:
        def random(self) -> float:
            return float(np.nextafter(1.0, 0.0))

    assert apportion(np.full(6, 0.5), Top()).tolist() == [0, 1, 0, 1, 0, 1]
    # the point past the end goes to the last task that has a remainder, not to one whose share is whole
    assert apportion(np.array([0.5, 0.5, 1.0]), Top()).tolist() == [0, 1, 1]


def test_dapo_says_the_pool_ran_out_when_a_back_fill_round_found_no_prompt() -> None:
    """A back-fill round was counted before the pool was asked: with 2 prompts, 2 a step and dapo_max_rounds=2, the
    one round that found nothing made the count 2, and the note blamed the back-fill limit for the pool running out."""
    from test_planner import make, run_step

    pl = make("dapo", uids=["a", "b"], pps=2, n=2, dapo_max_rounds=2)
    rounds, out = run_step(pl, lambda u, r, k: 0.0)
    assert len(rounds) == 1, rounds
    assert out.notes == ["dapo: no unused prompts left in the pool this step with 0/2 informative groups; "
                         "training on what there is"], out.notes
