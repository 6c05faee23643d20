"""eval.save_best and eval.early_stopping_patience: the tracker by hand, then the loop with scripted
evaluations (a tiny model's accuracy cannot be steered), synchronous and asynchronous."""

import json

import pytest
import torch
from safetensors.torch import load_file
from test_e2e import _args, _train_lines

from rollwise.cli import main
from rollwise.config import build_config
from rollwise.distributed.async_loop import StalenessGate
from rollwise.training.best import BestTracker, beats_saved_best, read_best, resume_best, save_best_weights
from rollwise.training.checkpoint import CheckpointError


def test_tracker_counts_evaluations_since_the_best():
    t = BestTracker(patience=2, min_delta=0.05)
    seen = [t.observe(s, a) for s, a in [(0, 0.20), (3, 0.30), (6, 0.33), (9, 0.36), (12, 0.10)]]
    # 0.33 is not 0.05 above 0.30; 0.36 is (0.36 > 0.35)
    assert seen == [True, True, False, True, False]
    assert (t.best, t.best_step, t.since, t.should_stop) == (0.36, 9, 1, False)
    t.observe(15, 0.40)  # 0.40 < 0.36 + 0.05
    assert t.should_stop and "step 9" in t.stop_note() and "0.360" in t.stop_note()
    u = BestTracker(patience=2)
    u.load_state_dict(t.state_dict())
    assert (u.best, u.best_step, u.since) == (0.36, 9, 2)
    assert not BestTracker(patience=0, best=0.5, best_step=1, since=99).should_stop  # 0: never stop


def test_best_weights_replace_the_old_only_when_complete(tmp_path, monkeypatch):
    model = torch.nn.Linear(2, 2)
    save_best_weights(tmp_path, 3, 0.25, model)
    assert read_best(tmp_path) == {"step": 3, "metric": "eval/accuracy", "accuracy": 0.25}
    with torch.no_grad():
        model.weight.fill_(7.0)
    import rollwise.training.best as best

    def full_disk(*a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(best, "save_file", full_disk)
    with pytest.raises(CheckpointError, match="No space left.*previous best is intact"):
        save_best_weights(tmp_path, 6, 0.5, model)
    assert read_best(tmp_path)["step"] == 3 and not (tmp_path / "checkpoints" / ".tmp_best").exists()
    monkeypatch.undo()
    save_best_weights(tmp_path, 6, 0.5, model)
    w = load_file(str(tmp_path / "checkpoints" / "best" / "weights.safetensors"))
    assert read_best(tmp_path)["step"] == 6 and (w["weight"] == 7.0).all()


def test_a_resume_counts_the_redone_evaluations_as_the_first_time(tmp_path):
    """Checkpoint at step 5 (best 0.5); evaluations 0.6 at step 6 and 0.7 at step 7 (saved as best);
    killed at step 8. The redone steps 6 and 7 must count as new bests again, as they did the first
    time: adopting the saved best into the tracker made them count toward patience 2 and stop at 7."""
    t = BestTracker(patience=2)
    t.observe(5, 0.5)
    saved = t.state_dict()
    save_best_weights(tmp_path, 7, 0.7, torch.nn.Linear(2, 2))
    u = BestTracker(patience=2)
    u.load_state_dict(saved)
    note = resume_best(u, tmp_path, start_step=5, evaluated=0.5)  # step 5's row is the one the tracker counted
    assert "step 7" in note and (u.best, u.best_step, u.since) == (0.5, 5, 0)
    assert u.observe(6, 0.6) and u.observe(7, 0.7) and not u.should_stop
    assert not beats_saved_best(tmp_path, 0.7) and beats_saved_best(tmp_path, 0.71)  # 0.7's weights stay as saved
    assert resume_best(BestTracker(best=0.3, best_step=2, last_step=6), tmp_path, start_step=7, evaluated=None) is None


def test_a_resume_counts_the_final_evaluation_written_after_the_checkpoint(tmp_path):
    t = BestTracker(patience=3)
    t.observe(0, 0.2)
    t.observe(10, 0.4)  # the last evaluation the step-20 checkpoint counted; the final one (0.6) came after it
    assert resume_best(t, tmp_path, start_step=20, evaluated=0.6) is None
    assert (t.best, t.best_step, t.since, t.last_step) == (0.6, 20, 0, 20)
    assert not t.observe(30, 0.55)
    old = BestTracker(patience=3)
    old.load_state_dict({"best": 0.4, "best_step": 10, "since": 0})  # a checkpoint from before last_step was saved
    resume_best(old, tmp_path, start_step=20, evaluated=0.6)
    assert (old.best, old.since) == (0.4, 0)  # cannot tell whether step 20 was counted: left as saved


def test_patience_needs_evaluations_during_training(capsys):
    assert main(["train", "eval.early_stopping_patience=2"]) == 2
    assert "eval.every_n_steps" in capsys.readouterr().err
    with pytest.raises(ValueError):
        build_config({"eval": {"early_stopping_patience": -1}})


def _scripted(monkeypatch, module, accuracies):
    """Replace the held-out evaluation with a list of accuracies, in call order."""
    calls = []

    def fake(*a, **kw):
        calls.append(1)
        return {"eval/accuracy": accuracies[len(calls) - 1], "eval/items": 8.0}

    monkeypatch.setattr(module, "evaluate", fake)
    return calls


def test_early_stop_keeps_the_best_and_a_resume_stays_stopped(tiny_model_dir, tmp_path, monkeypatch, capsys):
    import rollwise.loop as loop

    calls = _scripted(monkeypatch, loop, [0.2, 0.5, 0.4, 0.45, 0.9, 0.9])
    extra = ["eval.every_n_steps=1", "eval.save_best=true", "eval.early_stopping_patience=2",
             "run.save_every=1", "run.keep_checkpoints=10"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "es", 6, extra)]) == 0
    run = tmp_path / "es"
    assert [r["step"] for r in _train_lines(run)] == [1, 2, 3]  # 0.4 and 0.45 do not beat 0.5: stop after step 3
    assert len(calls) == 4  # steps 0-3; the evaluation at the end is the one at step 3, not a fifth
    assert "early stop" in capsys.readouterr().err
    assert read_best(run)["step"] == 1
    best = load_file(str(run / "checkpoints" / "best" / "weights.safetensors"))
    step1 = load_file(str(run / "checkpoints" / "step_000001" / "weights.safetensors"))
    step3 = load_file(str(run / "checkpoints" / "step_000003" / "weights.safetensors"))
    assert best.keys() == step1.keys() and all((best[k] == step1[k]).all() for k in best)
    assert any((best[k] != step3[k]).any() for k in best)  # the weights really moved after the best
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if "eval/accuracy" in x]
    assert [r["eval/evals_since_best"] for r in rows] == [0, 0, 1, 2] and rows[-1]["eval/best_accuracy"] == 0.5
    # resuming a run that stopped early trains nothing and says how to go on
    assert main(["train", "--resume", str(run)]) == 0
    assert [r["step"] for r in _train_lines(run)] == [1, 2, 3] and len(calls) == 4
    assert "early_stopping_patience" in capsys.readouterr().err
    # ... unless the patience is raised: step 4 scores 0.9, a new best
    assert main(["train", "--resume", str(run), "eval.early_stopping_patience=3", "train.max_steps=4"]) == 0
    assert [r["step"] for r in _train_lines(run)] == [1, 2, 3, 4] and read_best(run)["step"] == 4
    # the best folder is a checkpoint folder for rollwise eval
    monkeypatch.undo()
    assert main(["eval", str(run / "checkpoints" / "best"), "run.progress=false"]) == 0
    assert main(["export", str(run / "checkpoints" / "best"), str(tmp_path / "best-hf")]) == 0
    assert (tmp_path / "best-hf" / "config.json").is_file()


def test_resume_after_the_final_evaluation(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """The final evaluation (step 2, 0.6) comes after the step-2 checkpoint. Resumed to 4 steps, the
    run's step-4 evaluation (0.55) is no new best and must not replace step 2's saved weights."""
    import rollwise.loop as loop

    calls = _scripted(monkeypatch, loop, [0.2, 0.6, 0.55])
    extra = ["eval.every_n_steps=2", "eval.save_best=true", "run.save_every=2"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "fin", 2, extra)]) == 0
    run = tmp_path / "fin"
    assert read_best(run)["step"] == 2 and len(calls) == 2
    assert main(["train", "--resume", str(run), "train.max_steps=4"]) == 0
    assert len(calls) == 3 and read_best(run) == {"step": 2, "metric": "eval/accuracy", "accuracy": 0.6}
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if "eval/accuracy" in x]
    assert [(r["step"], r["eval/best_accuracy"]) for r in rows] == [(0, 0.2), (2, 0.6), (4, 0.6)]
    # the checkpoints were written by the synchronous loop: the asynchronous one cannot take them
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "train.max_steps=6", "distributed.async_training=true"]) == 2
    assert "synchronous loop" in capsys.readouterr().err


def test_a_final_evaluation_cut_off_is_made_on_resume(tiny_model_dir, tmp_path, monkeypatch):
    import rollwise.loop as loop

    calls = []

    def fake(*a, **kw):
        calls.append(1)
        if len(calls) == 2:  # the final evaluation: killed while it ran
            raise KeyboardInterrupt
        return {"eval/accuracy": 0.25, "eval/items": 8.0}

    monkeypatch.setattr(loop, "evaluate", fake)
    main(["train", *_args(tiny_model_dir, tmp_path, "cut", 2, ["run.save_every=2"])])
    run = tmp_path / "cut"
    assert [r["step"] for r in _train_lines(run)] == [1, 2] and len(calls) == 2
    assert 2 not in [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()
                     if "eval/accuracy" in x]
    assert main(["train", "--resume", str(run)]) == 0  # trains nothing, makes the missing evaluation
    assert len(calls) == 3
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()
            if "eval/accuracy" in x] == [0, 2]
    assert main(["train", "--resume", str(run)]) == 0 and len(calls) == 3  # made once


def test_async_early_stop_checkpoints_where_it_stops(tiny_model_dir, tmp_path, monkeypatch):
    cfg = build_config({"eval": {"every_n_steps": 2, "early_stopping_patience": 1}, "run": {"save_every": 5},
                        "train": {"max_steps": 20}})
    gate = StalenessGate(version=0, eta=2, cfg=cfg)
    # batch 2 (the one step 3 trains on) waits until the run has decided at its evaluation after step 2
    assert [k for k in range(8) if gate.allows(k)] == [0, 1]
    import rollwise.loop as loop

    _scripted(monkeypatch, loop, [0.2, 0.5, 0.1, 0.9])
    extra = ["eval.every_n_steps=2", "eval.save_best=true", "eval.early_stopping_patience=1", "run.save_every=0",
             "distributed.async_training=true", "distributed.max_staleness=1", "distributed.weight_sync_tokens=4",
             "algo.offpolicy_correction=decoupled"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "aes", 8, extra)]) == 0
    run = tmp_path / "aes"
    assert [r["step"] for r in _train_lines(run)] == [1, 2, 3, 4]  # best at step 2, no better at 4: stop
    assert [p.name for p in (run / "checkpoints").glob("step_*")] == ["step_000004"]
    assert read_best(run)["step"] == 2
    assert main(["train", "--resume", str(run)]) == 0  # stays stopped
    assert [r["step"] for r in _train_lines(run)] == [1, 2, 3, 4]


def test_min_delta_reaches_the_loop(tiny_model_dir, tmp_path, monkeypatch):
    import rollwise.loop as loop

    # 0.52 and 0.53 beat 0.5, but not by more than 0.05: with patience 2 the run stops after step 3
    # (with min_delta 0 both would be new bests and it would train all 4 steps)
    calls = _scripted(monkeypatch, loop, [0.2, 0.5, 0.52, 0.53, 0.9])
    extra = ["eval.every_n_steps=1", "eval.save_best=true", "eval.early_stopping_patience=2",
             "eval.early_stopping_min_delta=0.05", "run.save_every=0"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "md", 4, extra)]) == 0
    run = tmp_path / "md"
    assert [r["step"] for r in _train_lines(run)] == [1, 2, 3] and len(calls) == 4
    assert read_best(run) == {"step": 1, "metric": "eval/accuracy", "accuracy": 0.5}


def test_save_best_turned_on_at_a_resume_saves_the_best_evaluation_from_then_on(tiny_model_dir, tmp_path, monkeypatch):
    """The tracker's best came from before eval.save_best was on, so its weights were never saved; only an
    evaluation beating it was saved, and with none nothing was, without a word."""
    import rollwise.loop as loop

    _scripted(monkeypatch, loop, [0.2, 0.5, 0.48, 0.49, 0.47])
    extra = ["eval.every_n_steps=1", "eval.at_start=true", "run.save_every=1"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "late", 1, extra)]) == 0  # evaluations at 0 and 1
    run = tmp_path / "late"
    assert read_best(run) is None
    assert main(["train", "--resume", str(run), "eval.save_best=true", "train.max_steps=4"]) == 0
    best = read_best(run)
    assert best is not None and (best["step"], best["accuracy"]) == (3, 0.49)
