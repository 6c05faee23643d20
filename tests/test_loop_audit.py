"""Audit of the synchronous loop (rollwise.loop): stop conditions, checkpoints and resumes, evaluations, the
replay bank and the metrics of each step, on the tiny model."""

from __future__ import annotations

import pytest
import torch
from test_e2e import TESTS, _args, _train_lines

from rollwise.cli import main


@pytest.fixture(autouse=True)
def _tests_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))


def _bank(run, step: int) -> dict:
    state = torch.load(run / "checkpoints" / f"step_{step:06d}" / "state.pt", weights_only=False)
    return state["extra"]["replay_bank"]


def resume_killed_then_again(run, change: str, monkeypatch, capsys) -> list[dict]:
    """Resume `run` with `change`, killed at step 3 before its next checkpoint (the change is said), then resume
    it again to the end: the replay banks the second resume fitted."""
    import rollwise.loop as loop
    from rollwise.training.policy import PolicyTrainer

    real = PolicyTrainer.update

    def killed(self, *a, **k):
        raise KeyboardInterrupt  # step 3, before the next checkpoint

    monkeypatch.setattr(PolicyTrainer, "update", killed)
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "train.max_steps=4", change]) == 130
    assert "the reward settings changed" in capsys.readouterr().err
    monkeypatch.setattr(PolicyTrainer, "update", real)
    kept: list[dict] = []
    fit = loop.fit_replay_bank
    monkeypatch.setattr(loop, "fit_replay_bank", lambda *a: kept.append(dict(fit(*a))) or dict(kept[-1]))
    assert main(["train", "--resume", str(run)]) == 0
    return kept


def test_a_replay_bank_scored_under_other_rewards_is_dropped_by_a_second_resume_too(tiny_model_dir, tmp_path,
                                                                                      monkeypatch, capsys):
    """A resume that changes reward.* drops the checkpoint's replay bank, but config.yaml already holds the new
    settings once the checkpoint has loaded: killed before its next checkpoint and resumed again, the run saw no
    change and kept replaying the responses scored under the old rewards as solved anchors."""
    extra = ["eval.at_start=false", "eval.at_end=false", "planner.repair=replay", "planner.success_threshold=0.1"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "rb", 2, extra)]) == 0
    run = tmp_path / "rb"
    assert _bank(run, 2), "no response banked: the test needs one"
    kept = resume_killed_then_again(run, "reward.overlong_buffer=4", monkeypatch, capsys)
    assert kept == [{}], "the bank scored without reward.overlong_buffer came back"
    assert "the reward settings changed" in capsys.readouterr().err
    assert [r["step"] for r in _train_lines(run)] == [1, 2, 3, 4]


def test_a_reward_file_given_by_a_relative_path_at_a_resume_is_saved_as_an_absolute_one(tiny_model_dir, tmp_path,
                                                                                       monkeypatch):
    """A fresh start writes local files as absolute paths so that the run's config.yaml works from any folder;
    a resume wrote its override as given, and `rollwise eval RUN` (or the next --resume) from another folder
    could not find the reward file. The same file given again relatively also counted as a reward change."""
    import yaml

    work = tmp_path / "work"
    work.mkdir()
    (work / "my_rewards.py").write_text("def digits(completion, item):\n"
                                        "    return sum(c.isdigit() for c in completion) / max(1, len(completion))\n")
    monkeypatch.chdir(work)
    rel = ["reward.functions=[{name: 'my_rewards.py:digits'}]", "eval.at_start=false", "eval.at_end=false"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "rel", 1, rel)]) == 0
    run = tmp_path / "rel"
    absolute = f"{work / 'my_rewards.py'}:digits"
    assert yaml.safe_load((run / "config.yaml").read_text())["reward"]["functions"][0]["name"] == absolute
    assert main(["train", "--resume", str(run), "train.max_steps=2", rel[0]]) == 0
    assert yaml.safe_load((run / "config.yaml").read_text())["reward"]["functions"][0]["name"] == absolute
    monkeypatch.chdir(tmp_path)
    assert main(["eval", str(run), "run.progress=false"]) == 0


def test_a_step_that_trains_nothing_does_not_log_its_all_correct_samples_as_reward_0(tiny_model_dir, tmp_path):
    """dapo discards every group whose rewards are all equal: with every answer right, nothing is trained,
    and the step logged rollout/reward_mean and rollout/accuracy 0 (a mean over no samples) beside
    planner/all_correct_share 1, so the summary's train reward read as a model that solved nothing."""
    (tmp_path / "always_right.py").write_text("def one(completion, item):\n    return 1.0\n")
    extra = ["eval.at_start=false", "eval.at_end=false", "planner.strategy=dapo",
             f"reward.functions=[{{name: '{tmp_path / 'always_right.py'}:one'}}]"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "none", 1, extra)]) == 0
    [row] = _train_lines(tmp_path / "none")
    assert row["planner/trained_samples"] == 0 and row["planner/all_correct_share"] == 1.0
    assert row["rollout/reward_mean"] == 1.0 and row["rollout/accuracy"] == 1.0


def test_a_resumed_run_that_reached_max_steps_says_finished_not_early_stop(capsys):
    """A run whose last evaluation, at train.max_steps, also reached eval.early_stopping_patience: resumed, it
    said "early stop ... resume with a larger eval.early_stopping_patience", advice that trains nothing more (it
    had finished its train.max_steps)."""
    from types import SimpleNamespace

    from rollwise.config import Config
    from rollwise.loop import steps_to_train
    from rollwise.training.best import BestTracker
    from rollwise.ui import StepProgress

    cfg = Config.model_validate({"train": {"max_steps": 4}, "eval": {"every_n_steps": 2, "early_stopping_patience": 1}})
    best = BestTracker(patience=1, best=0.5, best_step=2, since=1, last_step=4)
    run = SimpleNamespace(cfg=cfg, start_step=4, best=best, totals={"tokens": 0})
    assert best.should_stop
    assert list(steps_to_train(run, StepProgress(4, 4, enabled=False))) == []
    err = capsys.readouterr().err
    assert "already finished its train.max_steps=4" in err and "early stop" not in err, err
