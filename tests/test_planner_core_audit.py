"""Planner core audit: the composed planner's stream scan, reward checks and budget accounting, with
hand-computed numbers."""

from __future__ import annotations

import math

import pytest

from rollwise.config import PlannerConfig
from rollwise.planner import GroupResult, build_planner


def _orders(pl, epochs: int) -> list[list[str]]:
    return [[pl.stream.uids[i] for i in pl.stream._shuffle(e)] for e in range(epochs)]


def _run_step(pl, step: int, reward: float = 0.0) -> tuple[list[list[str]], object]:
    """One step, every sample scored `reward`; the uids requested in each round and the outcome."""
    rounds = []
    reqs = pl.begin_step(step)
    while reqs:
        rounds.append([r.uid for r in reqs])
        reqs = pl.observe([GroupResult(r.uid, [reward] * r.n, [5] * r.n) for r in reqs])
    return rounds, pl.end_step()


def test_a_step_that_starts_inside_an_epoch_still_finds_every_unused_prompt() -> None:
    """Pool a-d, 3 prompts a step, seed 1: epoch orders [a b c d], [c a b d], [d b a c]. Step 0 takes a b c,
    step 1 d then c a (epoch 1, positions 0-1), so step 2 starts at epoch 1 position 2: b d, then epoch 2's
    d b (used this step) and a. The scan stopped after 4 stream positions (b d d b) and rolled out 2
    prompts, not 3, while a was unused: 4 of the step's 6 rollouts."""
    pl = build_planner(PlannerConfig(strategy="uniform"), ["a", "b", "c", "d"], 3, 2, 64, 1)
    assert _orders(pl, 3) == [list("abcd"), list("cabd"), list("dbac")]
    got = [_run_step(pl, s, 1.0)[0] for s in range(3)]
    assert got == [[["a", "b", "c"]], [["d", "c", "a"]], [["b", "d", "a"]]]


def test_dapo_backfills_from_a_prompt_the_next_epoch_holds_late() -> None:
    """Pool u0-u3, seed 2: epoch 0 [u3 u2 u0 u1], epoch 1 [u0 u2 u1 u3]. An earlier step used u3 and u1 is
    still being generated (partial rollouts). DAPO (1 prompt, 2 samples) rolls out u2, then u0, both all
    wrong; the next back-fill scanned u1 (in flight) and epoch 1's u0 u2 u1 and gave up with "no unused
    prompts left in the pool" while u3 (epoch 1's last) was unused."""
    uids = ["u0", "u1", "u2", "u3"]
    pl = build_planner(PlannerConfig(strategy="dapo"), uids, 1, 2, 64, 2)
    assert _orders(pl, 2) == [["u3", "u2", "u0", "u1"], ["u0", "u2", "u1", "u3"]]
    pl.stream.take(1)
    pl.in_flight = {"u1"}
    rounds, out = _run_step(pl, 0)
    assert rounds == [["u2"], ["u0"], ["u3"]]
    # then every prompt is used or in flight: that note is now true
    assert out.notes == ["dapo: no unused prompts left in the pool this step with 0/1 informative groups; "
                         "training on what there is"]
    assert out.discarded_rollouts == 6 and pl.metrics()["rollout/rollouts"] == 6.0


@pytest.mark.parametrize("rewards", [[math.nan, 1.0], [1.0, math.nan], [math.inf, 0.0]])
def test_a_reward_that_is_not_finite_is_refused_whatever_its_place(rewards: list[float]) -> None:
    """max/min with a NaN follow the order: [nan, 1] gave max = min = nan (nan != nan: informative, trained,
    kept by DAPO) and [1, nan] gave 1 == 1 (equal rewards, dropped). The planner now refuses such a group as
    the advantage code does, in observe and in adopt."""
    pl = build_planner(PlannerConfig(strategy="dapo"), ["a", "b"], 1, 2, 64, 0)
    (req,) = pl.begin_step(0)
    with pytest.raises(ValueError, match="finite"):
        pl.observe([GroupResult(req.uid, rewards, [5, 5])])
    other = "b" if req.uid == "a" else "a"
    with pytest.raises(ValueError, match="finite"):
        pl.adopt([GroupResult(other, rewards, [5, 5])])
