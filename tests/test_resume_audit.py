"""Resume audit: a planner restored from its checkpointed state continues exactly as the one not interrupted."""

from __future__ import annotations

import json

from rollwise.config import PlannerConfig
from rollwise.planner import GroupResult, build_planner

UIDS = [f"q{i}" for i in range(8)]


def make(**kw):
    return build_planner(PlannerConfig(strategy="greso", seed=4, **kw), UIDS, 4, 4, 64, 0)


def step(pl, s: int) -> tuple[list[tuple[str, int]], list[str]]:
    reqs = pl.begin_step(s)
    pl.observe([GroupResult(q.uid, [1.0] * q.n, [10] * q.n) for q in reqs])  # every group all-correct
    return [(q.uid, q.n) for q in reqs], pl.end_step().train


def test_greso_explore_init_outside_its_bounds_is_kept_by_a_resume_with_unchanged_bounds() -> None:
    """greso_explore_init=1.0 (no skipping until the first adaptation, at the start of epoch 1) is above the
    default greso_explore_max=0.95. Loading the saved state clipped it to 0.95, so a run resumed in epoch 0
    skipped already-easy prompts in the step that wraps into epoch 1, which the uninterrupted run keeps."""
    a = make(greso_explore_init=1.0)
    step(a, 0)
    b = make(greso_explore_init=1.0)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert (b.selector.p_easy, b.selector.p_hard) == (a.selector.p_easy, a.selector.p_hard) == (1.0, 1.0)
    assert [step(b, s) for s in range(1, 6)] == [step(a, s) for s in range(1, 6)]  # (seed 4: differed from step 2)
    assert b.state_dict() == a.state_dict()
    # a resume that narrows the bounds still clips the saved probabilities to them
    narrow = make(greso_explore_init=1.0, greso_explore_max=0.2)
    narrow.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert narrow.selector.p_easy <= 0.2 and narrow.selector.p_hard <= 0.2


def test_a_resume_with_the_same_group_size_keeps_the_cost_per_prompt_exactly():
    # x * 7 / 7 != x for this x: rescaling an unchanged group size planned 76 prompts instead of 77
    from rollwise.config import PlannerConfig
    from rollwise.planner import build_planner
    uids = [f"q{i}" for i in range(200)]

    def make():
        return build_planner(PlannerConfig(strategy="ar3po", budget_rollouts=99), uids, 4, 7, 64, 0)

    a = make()
    a.allocator.cost_per_prompt = 1.2857142857142856
    b = make()
    b.load_state_dict(a.state_dict())
    assert b.allocator.cost_per_prompt == a.allocator.cost_per_prompt
    assert len(b.begin_step(0)) == len(a.begin_step(0))
