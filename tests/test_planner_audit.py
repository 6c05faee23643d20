"""Planner audit: options a strategy accepts but would ignore are warned about or refused."""

from __future__ import annotations

import warnings

import pytest

from rollwise.config import PlannerConfig
from rollwise.planner import GroupResult, build_planner
from rollwise.planner.core import MAX_ROUNDS
from rollwise.planner.strategies import belief_unread, unused_options

UIDS = [f"q{i}" for i in range(40)]


def test_estimator_options_are_unread_when_the_posterior_selector_scores_no_candidates() -> None:
    """With planner.candidate_factor=1 the posterior selector takes its k candidates as they come and
    never reads the belief, so mopps/vade become uniform and an estimator option (or a prior) changes only
    planner/brier: said, as for any other strategy that decides without the belief."""
    for kw in ({"strategy": "mopps", "posterior_decay": 0.7}, {"strategy": "vade", "vade_fast_decay": 0.3}):
        assert belief_unread(PlannerConfig(**kw)) == ""  # the default factor scores 8 candidates a pick
        why = belief_unread(PlannerConfig(candidate_factor=1.0, **kw))
        assert "changes only planner/brier" in why and "candidate_factor=1" in why, why
    assert "prior_counts" in unused_options(PlannerConfig(strategy="mopps", candidate_factor=1.0,
                                                          prior_counts="counts.jsonl"))
    # a belief the allocator reads is still read
    assert belief_unread(PlannerConfig(strategy="adaptive", candidate_factor=1.0, posterior_decay=0.7)) == ""
    # and the selection really ignores it: two very different beliefs pick the same prompts
    picks = []
    for decay in (1.0, 0.1):
        pl = build_planner(PlannerConfig(strategy="mopps", candidate_factor=1.0, posterior_decay=decay), UIDS, 4, 4, 64, 0)
        for i, u in enumerate(UIDS):
            pl.estimator.update(pl.index[u], i % 5, 4)
        picks.append([q.uid for q in pl.begin_step(0)])
    assert picks[0] == picks[1]


@pytest.mark.parametrize(("strategy", "key"), [("dapo", "dapo_max_rounds"), ("ar3po", "ar3po_stages")])
def test_a_round_limit_above_the_planners_own_is_warned_about(strategy: str, key: str) -> None:
    """planner.dapo_max_rounds (ar3po_stages) above MAX_ROUNDS was capped at MAX_ROUNDS without a word, and
    dapo's note then blamed the pool ("no unused prompts left") for a step cut short by the cap."""
    with pytest.warns(UserWarning, match=f"{key}={MAX_ROUNDS + 1} is above the planner's limit of {MAX_ROUNDS}"):
        build_planner(PlannerConfig(strategy=strategy, **{key: MAX_ROUNDS + 1}), UIDS, 4, 4, 64, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_planner(PlannerConfig(strategy=strategy, **{key: MAX_ROUNDS}), UIDS, 4, 4, 64, 0)
    # the cap it warns about: a step of all-wrong groups stops after MAX_ROUNDS rounds
    with pytest.warns(UserWarning):
        pl = build_planner(PlannerConfig(strategy="dapo", dapo_max_rounds=100), [f"u{i}" for i in range(2000)],
                           1, 2, 64, 0)
    reqs, rounds = pl.begin_step(0), 0
    while reqs:
        rounds += 1
        reqs = pl.observe([GroupResult(q.uid, [0.0] * q.n, [5] * q.n) for q in reqs])
    out = pl.end_step()
    assert rounds == MAX_ROUNDS
    notes = " ".join(getattr(out, "notes", []) or [])
    assert f"limit of {MAX_ROUNDS} rounds a step reached" in notes and "no unused prompts" not in notes, notes


def test_knapsack_with_a_minimum_above_the_group_size_keeps_its_budget_on_unseen_prompts():
    # n = 4, min 6, budget 16: planned at 4 a prompt, 4 unseen prompts got 6 each, 24 rollouts a step
    from rollwise.config import PlannerConfig
    from rollwise.planner import build_planner
    uids = [f"q{i}" for i in range(40)]
    pl = build_planner(PlannerConfig(strategy="knapsack", min_samples_per_prompt=6, budget_rollouts=16),
                       uids, 4, 4, 64, 0)
    reqs = pl.begin_step(0)
    assert sum(q.n for q in reqs) <= 16 and {q.n for q in reqs} == {6}, [(q.uid, q.n) for q in reqs]


def test_a_most_samples_below_the_group_size_is_refused_where_the_allocator_gives_the_group_first():
    # dars gave each prompt 4 with max_samples_per_prompt=2, adaptive topped its probes up to 4
    import pytest

    from rollwise.config import PlannerConfig
    from rollwise.planner import build_planner
    uids = [f"q{i}" for i in range(40)]
    for strategy in ("dars", "adaptive"):
        with pytest.raises(ValueError, match=r"max_samples_per_prompt \(2\) is below rollout.num_generations \(4\)"):
            build_planner(PlannerConfig(strategy=strategy, max_samples_per_prompt=2), uids, 4, 4, 64, 0)
    build_planner(PlannerConfig(strategy="knapsack", max_samples_per_prompt=2), uids, 4, 4, 64, 0)  # its bound
