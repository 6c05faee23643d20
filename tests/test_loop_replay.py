"""The loop's replay bank follows the planner's rule for a solved prompt, so every replay the
planner asks for (and counts in planner/replayed) reaches the batch; reward.truncated_reward
rescores the samples cut at the length cap before anything sees them."""

from __future__ import annotations

from types import SimpleNamespace

from rollwise.config import PlannerConfig, RewardConfig
from rollwise.loop import overlong_punishment, produce_batch
from rollwise.planner import build_planner


class Executor:
    """Answers every request with `n` one-token responses; the rewarder decides what they score.
    The responses listed in `cut` (by their place in the group) end at the length cap."""

    carried: dict = {}

    def __init__(self, cut: tuple[int, ...] = (), lengths: tuple[int, ...] = ()) -> None:
        self.cut, self.lengths = cut, lengths

    def generate(self, requests, first_round=False):
        def length(i: int) -> int:
            return self.lengths[i] if i < len(self.lengths) else 1

        out = {r.uid: [SimpleNamespace(response_ids=[7] * length(i), logprobs=[-0.1] * length(i),
                                       versions=[0] * length(i), finish_reason="length" if i in self.cut else "stop")
                       for i in range(r.n)] for r in requests}
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
                          replay_bank={}, primary="r", cfg=SimpleNamespace(planner=cfg, reward=RewardConfig()))
    first = produce_batch(run, 0, Executor())
    assert not any(s.stop_gradient for s in first.batch) and run.replay_bank["t:0"]["reward"] == 0.6
    scorer.step = 2
    second = produce_batch(run, 1, Executor())
    assert second.executor_metrics["planner/replayed"] == 1.0
    replays = [s for s in second.batch if s.stop_gradient]
    assert len(replays) == 1 and replays[0].reward == 0.6  # the group now has a gradient


def _run(planner_cfg: PlannerConfig, reward_cfg: RewardConfig, scorer) -> SimpleNamespace:
    return SimpleNamespace(planner=build_planner(planner_cfg, ["t:0"], 1, 4, 8, 0),
                           tokenizer=SimpleNamespace(decode=lambda ids, **kw: "x"), runner=scorer,
                           items_by_uid={"t:0": SimpleNamespace(task="t")}, ids_by_uid={"t:0": [1, 2]},
                           replay_bank={}, primary="r", cfg=SimpleNamespace(planner=planner_cfg, reward=reward_cfg))


class AllRight:
    def score(self, texts, items):
        return SimpleNamespace(rewards=[1.0] * len(texts), parts=[{"r": 1.0} for _ in texts], errors=0, timeouts=0,
                               nans=0)


def test_truncated_reward_rescores_cut_samples_for_the_batch_the_planner_and_the_replay_bank() -> None:
    planner_cfg = PlannerConfig(strategy="uniform", repair="replay")
    run = _run(planner_cfg, RewardConfig(truncated_reward=0.0), AllRight())
    out = produce_batch(run, 0, Executor(cut=(0, 1)))  # 2 of 4 cut: every answer "right" as written
    rewards = [s.reward for s in out.batch]
    assert rewards == [0.0, 0.0, 1.0, 1.0]
    assert [s.reward_parts["r"] for s in out.batch] == [0.0, 0.0, 1.0, 1.0]  # counted wrong in rollout/accuracy
    # the planner saw the rescored rewards: a group with a gradient, where all four scored 1 as written
    assert out.executor_metrics["planner/all_correct_share"] == 0.0
    assert out.executor_metrics["planner/effective_ratio"] == 1.0
    # the bank keeps only an uncut success
    assert run.replay_bank["t:0"]["reward"] == 1.0


def test_truncated_reward_unset_scores_cut_samples_as_written() -> None:
    run = _run(PlannerConfig(strategy="uniform"), RewardConfig(), AllRight())
    out = produce_batch(run, 0, Executor(cut=(0, 1)))
    assert [s.reward for s in out.batch] == [1.0] * 4


def test_a_cut_only_success_is_not_banked_under_truncated_reward() -> None:
    run = _run(PlannerConfig(strategy="uniform", repair="replay"), RewardConfig(truncated_reward=0.0), AllRight())
    produce_batch(run, 0, Executor(cut=(0, 1, 2, 3)))
    assert "t:0" not in run.replay_bank


def test_overlong_punishment_is_dapos_linear_ramp_over_the_buffer():
    # cap 48, buffer 8: nothing up to 40 tokens, then 1/8 of the penalty per token, all of it at 48
    assert [overlong_punishment(n, 48, 8, 1.0) for n in (10, 40, 41, 44, 48)] == [0.0, 0.0, 0.125, 0.5, 1.0]
    assert overlong_punishment(44, 48, 8, 0.5) == 0.25


def test_overlong_buffer_lowers_the_reward_of_long_samples_but_not_their_correctness():
    from rollwise.config import RolloutConfig

    run = _run(PlannerConfig(strategy="uniform"), RewardConfig(overlong_buffer=4), AllRight())
    run.cfg.rollout = RolloutConfig(max_completion_length=8)
    out = produce_batch(run, 0, Executor(cut=(3,), lengths=(2, 4, 6, 8)))  # punished from 5 tokens on
    assert [s.reward for s in out.batch] == [1.0, 1.0, 0.5, 0.0]  # 6 tokens: 2 of the buffer's 4
    assert [s.reward_parts["r"] for s in out.batch] == [1.0] * 4


def test_tokens_of_samples_dropped_as_stale_are_charged_to_a_token_budget() -> None:
    class Dropping(Executor):
        def step_dropped_tokens(self) -> int:
            return 30  # partial rollouts dropped samples this long as too stale: generated, never delivered

    cfg = PlannerConfig(strategy="uniform", budget_tokens=100)
    for executor, carry in ((Executor(lengths=(5, 5, 5, 5)), 100 - 20), (Dropping(lengths=(5, 5, 5, 5)), 100 - 20 - 30)):
        run = _run(cfg, RewardConfig(), Scorer())
        run.planner.length_estimate = 5.0
        produce_batch(run, 0, executor)
        assert run.planner.token_carry == carry


def test_a_resume_that_changes_the_rewards_or_raises_the_success_bar_refits_the_replay_bank(capsys):
    """The bank was restored as saved: a response under the old bar (or old reward settings) kept being
    replayed as the solved anchor of an all-wrong group."""
    import numpy as np

    from rollwise.config import load_config
    from rollwise.loop import fit_replay_bank

    bank = {"a": {"reward": 1.0}, "b": {"reward": 0.6}}
    planner = SimpleNamespace(repair=SimpleNamespace(has_correct=np.array([True, True, False])),
                              index={"a": 0, "b": 1, "c": 2})
    same = fit_replay_bank(dict(bank), planner, load_config(None, ["planner.success_threshold=0.5"]), {})
    assert same == bank and planner.repair.has_correct.tolist() == [True, True, False]
    raised = fit_replay_bank(dict(bank), planner, load_config(None, ["planner.success_threshold=1.0"]),
                             {"planner.success_threshold": [0.5, 1.0]})
    assert list(raised) == ["a"] and planner.repair.has_correct.tolist() == [True, False, False]
    assert "drops 1 of the replay bank's 2" in capsys.readouterr().err
    rescored = fit_replay_bank(dict(bank), planner, load_config(None, []), {"reward.overlong_buffer": [0, 16]})
    assert rescored == {} and not planner.repair.has_correct.any()
    assert "the reward settings changed" in capsys.readouterr().err
