"""Audit of the reuse of earlier responses (speculative reuse and the replay repair): each test here
failed on the code before its fix."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_e2e import TESTS, _args
from test_loop_audit import resume_killed_then_again

from rollwise.cli import main
from rollwise.config import load_config
from rollwise.loop import fit_replay_bank


@pytest.fixture(autouse=True)
def _tests_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))


def _planner() -> SimpleNamespace:
    return SimpleNamespace(repair=SimpleNamespace(has_correct=np.array([True, True])), index={"a": 0, "b": 1})


def test_a_resume_that_changes_the_length_cap_refits_a_replay_bank_scored_with_it(capsys):
    """Under reward.overlong_buffer (or reward.truncated_reward) the cap is part of the reward: a response
    banked at 1.0 under cap 48 scores 1 - (40 - 24) / 8 < 0 under cap 32 with an 8-token buffer (and is cut
    there, scoring truncated_reward). The bank kept it and replayed it as the solved anchor of a group."""
    bank = {"a": {"ids": [7] * 40, "reward": 1.0}, "b": {"ids": [7] * 10, "reward": 1.0}}
    change = {"rollout.max_completion_length": [48, 32]}
    for override in ("reward.overlong_buffer=8", "reward.truncated_reward=0.0"):
        planner = _planner()
        cfg = load_config(None, [override, "rollout.max_completion_length=32"])
        assert fit_replay_bank(dict(bank), planner, cfg, change) == {}
        assert not planner.repair.has_correct.any()
        assert "the reward settings changed" in capsys.readouterr().err
    # a reward that does not read the cap: the bank stays whole
    planner = _planner()
    kept = fit_replay_bank(dict(bank), planner, load_config(None, ["rollout.max_completion_length=32"]), change)
    assert kept == bank and planner.repair.has_correct.all()


def test_a_replay_bank_scored_under_another_length_cap_is_dropped_by_a_second_resume_too(tiny_model_dir, tmp_path,
                                                                                         monkeypatch, capsys):
    """config.yaml holds the new cap once the checkpoint has loaded: a run killed before its next checkpoint
    and resumed again saw no change and kept the responses scored (overlong punishment) under the old cap."""
    extra = ["eval.at_start=false", "eval.at_end=false", "planner.repair=replay", "planner.success_threshold=0.1",
             "reward.overlong_buffer=2", "reward.overlong_penalty=0.05"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "cap", 2, extra)]) == 0
    run = tmp_path / "cap"
    state = torch.load(run / "checkpoints" / "step_000002" / "state.pt", weights_only=False)
    assert state["extra"]["replay_bank"], "no response banked: the test needs one"
    kept = resume_killed_then_again(run, "rollout.max_completion_length=6", monkeypatch, capsys)
    assert kept == [{}], "the bank scored under rollout.max_completion_length=8 came back"
