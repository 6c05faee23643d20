"""What `rollwise report` and `rollwise export` say of a run that did not finish, in tiny run folders
(config.yaml as training writes it, metrics.jsonl, checkpoints/): no model is trained."""

import json
from types import SimpleNamespace

from rollwise.cli import main
from rollwise.config import load_config
from rollwise.loop import final_eval_due, prepare_run_dir, write_config
from rollwise.tracking import read_metrics
from rollwise.ui import print_summary, run_config, stop_reason


def _run(tmp_path, name="r", steps=2, overrides=(), evals=(), checkpoint=None, tokens_per_step=100):
    """A run folder: its config.yaml (written as `rollwise train` writes it), `steps` logged steps, the
    evaluations `evals` ({step: accuracy}) and a checkpoint at step `checkpoint` (None: no checkpoint)."""
    run = tmp_path / name
    run.mkdir()
    cfg = load_config(None, [f"run.name={name}", f"run.output_dir={tmp_path}", *overrides])
    write_config(run, cfg)
    rows = [{"step": k, "rollout/reward_mean": 0.5, "rollout/tokens_total": k * tokens_per_step,
             "time/step_s": 1.0, "time/generate_s": 0.5} for k in range(1, steps + 1)]
    rows += [{"step": s, "eval/accuracy": a} for s, a in dict(evals).items()]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if checkpoint is not None:
        (run / "checkpoints" / f"step_{checkpoint:06d}").mkdir(parents=True)
    return run, cfg


def _reason(run):
    return stop_reason(run_config(run), read_metrics(run, warn=False), run)


def _resume_makes_the_final_eval(run, cfg, step):
    """loop.final_eval_due as a `--resume` that starts at `step` (the last checkpoint) decides it."""
    return final_eval_due(SimpleNamespace(cfg=cfg, run_dir=run, start_step=step), step)


def test_a_run_killed_during_its_final_evaluation_is_not_finished(tmp_path):
    run, cfg = _run(tmp_path, steps=2, overrides=["train.max_steps=2", "eval.at_end=true"], evals={0: 0.2},
                    checkpoint=2)
    reason = _reason(run)
    assert reason.startswith("not finished: step 2 of 2") and "final evaluation (eval.at_end) missing" in reason
    assert f"`rollwise train --resume {run}`" in reason and "train.max_steps=2" not in reason
    assert _resume_makes_the_final_eval(run, cfg, 2)  # the resume the report names does make it
    assert print_summary(run)["stopped by"] == reason


def test_a_run_with_its_final_evaluation_or_none_due_is_finished(tmp_path):
    run, cfg = _run(tmp_path, "done", overrides=["train.max_steps=2"], evals={0: 0.2, 2: 0.3}, checkpoint=2)
    assert _reason(run) == "train.max_steps=2" and not _resume_makes_the_final_eval(run, cfg, 2)
    run, cfg = _run(tmp_path, "noend", overrides=["train.max_steps=2", "eval.at_end=false"], checkpoint=2)
    assert _reason(run) == "train.max_steps=2" and not _resume_makes_the_final_eval(run, cfg, 2)
    # no held-out items: there is no evaluation to make
    run, _ = _run(tmp_path, "noitems", overrides=["train.max_steps=2", "data.eval_size=0"], checkpoint=2)
    assert _reason(run) == "train.max_steps=2"


def test_token_budget_and_early_stops_follow_the_same_rule(tmp_path):
    budget = ["train.max_steps=10", "train.max_rollout_tokens=250"]
    run, cfg = _run(tmp_path, "spent", steps=3, overrides=budget, evals={3: 0.4}, checkpoint=3)
    assert _reason(run) == "the rollout-token budget (train.max_rollout_tokens=250) at step 3 of 10"
    assert not _resume_makes_the_final_eval(run, cfg, 3)
    run, cfg = _run(tmp_path, "spent_killed", steps=3, overrides=budget, checkpoint=3)
    assert _reason(run).startswith("not finished: step 3 of 10") and "final evaluation" in _reason(run)
    assert _resume_makes_the_final_eval(run, cfg, 3)
    # early stopping stops right after an evaluation, which is the final one
    early = ["train.max_steps=10", "eval.every_n_steps=2", "eval.early_stopping_patience=1"]
    run, cfg = _run(tmp_path, "early", steps=4, overrides=early, evals={2: 0.5, 4: 0.4}, checkpoint=4)
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 4, "eval/evals_since_best": 1}) + "\n")
    assert _reason(run) == "early stopping (eval.early_stopping_patience=1) at step 4 of 10"
    assert not _resume_makes_the_final_eval(run, cfg, 4)


def test_a_run_killed_before_its_first_checkpoint_is_started_again_not_resumed(tmp_path):
    run, _ = _run(tmp_path, "early_kill", steps=2, overrides=["train.max_steps=5", "run.save_every=0"])
    reason = _reason(run)
    assert reason.startswith("not finished: step 2 of 5") and f"no checkpoint in {run / 'checkpoints'}" in reason
    assert "--resume" not in reason and "continues from its last checkpoint" not in reason
    command = f"rollwise train {run / 'config.yaml'} run.name=early_kill run.output_dir={tmp_path}"
    assert f"`{command}`" in reason
    # the command starts the run again in the same folder, with the same config
    again = load_config(command.split()[2], command.split()[3:])
    assert prepare_run_dir(again, None, create=False)[0] == run
    assert again == load_config(str(run / "config.yaml"), [])


def test_export_of_a_run_without_a_checkpoint_says_what_to_do(tmp_path, capsys):
    run, _ = _run(tmp_path, "nockpt", steps=1, overrides=["train.max_steps=5"])
    assert main(["export", str(run), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"run folder {run} has no checkpoint to export" in err
    assert "evaluate" not in err and "rollwise eval" not in err
    assert f"`rollwise train {run / 'config.yaml'} run.name=nockpt run.output_dir={tmp_path}`" in err
    assert "best" not in err and not (tmp_path / "out").exists()
    # a best saved before any step checkpoint can be exported instead
    (run / "checkpoints" / "best").mkdir(parents=True)
    (run / "checkpoints" / "best" / "weights.safetensors").write_bytes(b"")
    assert main(["export", str(run), str(tmp_path / "out")]) == 2
    assert f"`rollwise export {run / 'checkpoints' / 'best'} OUT_DIR`" in capsys.readouterr().err
    # eval keeps its own wording
    assert main(["eval", str(run)]) == 2
    assert f"run folder {run} has no checkpoint to evaluate" in capsys.readouterr().err


def test_a_damaged_config_yaml_is_said_once_by_report(tmp_path, capsys):
    """It was read as no settings without a word: no planner, no stop reason, 'the same settings'."""
    from rollwise.ui import run_config

    (tmp_path / "config.yaml").write_text("train: [unclosed\n")
    assert run_config(tmp_path) == {} and run_config(tmp_path) == {}
    err = capsys.readouterr().err
    assert err.count("config.yaml is unreadable") == 1 and "not shown" in err
    assert run_config(tmp_path / "nowhere") == {} and not capsys.readouterr().err  # no file: nothing to say


def test_export_under_a_file_names_the_file(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x")
    assert main(["export", str(tmp_path), str(tmp_path / "notes.txt" / "out")]) == 2  # was "[Errno 17] File exists"
    assert f"{tmp_path / 'notes.txt'} is a file, so OUT_DIR" in capsys.readouterr().err
