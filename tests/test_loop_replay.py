"""The loop's replay bank follows the planner's rule for a solved prompt, so every replay the
planner asks for (and counts in planner/replayed) reaches the batch."""

from __future__ import annotations

from types import SimpleNamespace

from rollwise.config import PlannerConfig
from rollwise.loop import produce_batch
from rollwise.planner import build_planner


class Executor:
    """Answers every request with `n` one-token responses; the rewarder decides what they score."""

    carried: dict = {}

    def generate(self, requests, first_round=False):
        out = {r.uid: [SimpleNamespace(response_ids=[7], logprobs=[-0.1], versions=[0], finish_reason="stop")
                       for _ in range(r.n)] for r in requests}
        return SimpleNamespace(groups=out, adopted={})

    def step_tokens(self) -> int:
        return 0

    def metrics(self) -> dict:
        return {}


class Scorer:
    """Rewards by step: a partial-credit success (0.6, under the first reward function's 1) on
    the first sample of step 1, nothing right after."""

    def __init__(self) -> None:
        self.step = 1

    def score(self, texts, items):
        rewards = [0.6 if self.step == 1 and i == 0 else 0.0 for i in range(len(texts))]
        return SimpleNamespace(rewards=rewards, parts=[{"r": x} for x in rewards], errors=0, timeouts=0, nans=0)


def test_a_partial_credit_success_is_replayed_into_a_later_all_wrong_group() -> None:
    cfg = PlannerConfig(strategy="uniform", repair="replay")  # success_threshold 0.5
    planner = build_planner(cfg, ["t:0"], 1, 4, 8, 0)
    scorer = Scorer()
    run = SimpleNamespace(planner=planner, tokenizer=SimpleNamespace(decode=lambda ids, **kw: "x"), runner=scorer,
                          items_by_uid={"t:0": SimpleNamespace(task="t")}, ids_by_uid={"t:0": [1, 2]},
                          replay_bank={}, primary="r", cfg=SimpleNamespace(planner=cfg))
    first = produce_batch(run, 0, Executor())
    assert not any(s.stop_gradient for s in first.batch) and run.replay_bank["t:0"]["reward"] == 0.6
    scorer.step = 2
    second = produce_batch(run, 1, Executor())
    assert second.executor_metrics["planner/replayed"] == 1.0
    replays = [s for s in second.batch if s.stop_gradient]
    assert len(replays) == 1 and replays[0].reward == 0.6  # the group now has a gradient
