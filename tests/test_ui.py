"""The end-of-run summary: why the run stopped, read from its config and metrics."""

from rollwise.ui import stop_reason

CFG = {"train": {"max_steps": 10, "max_rollout_tokens": None}, "eval": {"early_stopping_patience": 0}}


def _steps(n, tokens_per_step=100):
    return [{"step": k, "rollout/reward_mean": 0.5, "rollout/tokens_total": k * tokens_per_step} for k in range(1, n + 1)]


def test_a_run_that_reached_max_steps():
    assert stop_reason(CFG, _steps(10)) == "train.max_steps=10"


def test_a_run_stopped_by_its_token_budget():
    cfg = {**CFG, "train": {"max_steps": 10, "max_rollout_tokens": 450}}
    assert stop_reason(cfg, _steps(5)) == "the rollout-token budget (train.max_rollout_tokens=450) at step 5 of 10"
    # under the budget and short of max_steps: not a budget stop
    assert stop_reason(cfg, _steps(4), "runs/x").startswith("not finished: step 4 of 10")


def test_a_run_stopped_early_by_its_evaluations():
    cfg = {**CFG, "eval": {"early_stopping_patience": 2}}
    evals = [{"step": 2, "eval/accuracy": 0.3, "eval/evals_since_best": 0},
             {"step": 4, "eval/accuracy": 0.2, "eval/evals_since_best": 1},
             {"step": 6, "eval/accuracy": 0.2, "eval/evals_since_best": 2}]
    assert stop_reason(cfg, _steps(6) + evals) == "early stopping (eval.early_stopping_patience=2) at step 6 of 10"
    assert stop_reason(cfg, _steps(6) + evals[:2], "runs/x").startswith("not finished")


def test_an_unfinished_run_says_how_to_continue_it(tmp_path):
    (tmp_path / "r1" / "checkpoints" / "step_000002").mkdir(parents=True)
    run = tmp_path / "r1"
    assert stop_reason(CFG, _steps(3), run) == ("not finished: step 3 of 10 (killed, or still running); "
                                                f"`rollwise train --resume {run}` continues from its last checkpoint")


def test_nothing_to_say_without_a_config_and_a_run_with_no_step_says_it_did_not_finish():
    assert stop_reason({}, _steps(3)) is None
    # a run that failed in its first step had a report of "steps 0" and no word of why (audit, 2026-12-07)
    assert stop_reason(CFG, [{"step": 0, "eval/accuracy": 0.1}], "runs/x") == (
        "not finished: no step trained of 10 (it stopped before its first step, or is still starting; its error is "
        "where it ran); start it again with `rollwise train runs/x/config.yaml run.name=x run.output_dir=runs`")


def test_each_resume_is_named_with_the_settings_it_changed(tmp_path, capsys):
    import json

    from rollwise.ui import print_summary, resumes

    envs = [{"resumed_from_step": None}, {"resumed_from_step": 2, "config_changes": {"train.max_steps": [2, 4]}},
            {"resumed_from_step": 3}]
    assert resumes(envs) == "step 2 (train.max_steps: 2 -> 4); step 3"
    assert resumes(envs[:1]) is None and resumes([]) is None
    from rollwise.environment import describe_environment

    (tmp_path / "environment.json").write_text(json.dumps([{**describe_environment(), **e} for e in envs]))
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({**s, "time/step_s": 1.0, "time/generate_s": 0.5}) + "\n" for s in _steps(3)))
    summary = print_summary(tmp_path)
    assert summary["resumed at"] == "step 2 (train.max_steps: 2 -> 4); step 3"
    assert "resumed at" in capsys.readouterr().out


def test_the_summary_counts_a_step_logged_twice_once_and_survives_missing_keys(tmp_path):
    """A file holding an earlier try's steps and then the same steps again (the later lines win), and steps
    without times or totals (no KeyError, no total read as 0)."""
    import json

    from rollwise.tracking import read_metrics
    from rollwise.ui import summarize

    def step(n, reward, acc=None, **more):
        return {"step": n, "rollout/reward_mean": reward, "rollout/rollouts_total": 16.0 * n,
                "rollout/tokens_total": 100.0 * n, "time/step_s": 10.0, "time/generate_s": 5.0, **more}

    lines = [step(1, 0.1), step(2, 0.2), {"step": 2, "eval/accuracy": 0.9}, step(2, 0.4, **{"time/step_s": 20.0}),
             {"step": 2, "eval/accuracy": 0.3}, {"step": 3, "rollout/reward_mean": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    rows = read_metrics(tmp_path)
    assert [r.get("rollout/reward_mean", r.get("eval/accuracy")) for r in rows] == [0.1, 0.4, 0.3, 0.5]
    s = summarize(rows)
    assert s["eval accuracy (best)"] == "0.300 @ step 2"  # the superseded 0.9 is gone
    assert (s["rollouts generated"], s["rollout tokens"]) == (32, 200)  # step 3 logged no totals: the last ones
    assert s["median step time (s)"] == "15.0" and s["generation share of step time"] == "33%"  # 10/30, step 3 untimed


def test_a_log_file_gets_plain_progress_lines_and_notes_without_the_bar(monkeypatch, capsys):
    from rich.console import Console

    import rollwise.ui as ui

    monkeypatch.setattr(ui, "console", Console(stderr=True, force_terminal=False))  # stderr to a file: no redraws
    clock = iter([0.0, 10.0, 40.0, 50.0, 60.0])
    monkeypatch.setattr(ui.StepProgress, "clock", staticmethod(lambda: next(clock)))
    bar = ui.StepProgress(total=3, start=0)
    for step in (1, 2, 3):  # at 10 s: too soon; at 40 s: a line; at 50 s: the last step's line
        bar.update(step, {"rollout/reward_mean": 0.25})
    bar.close()
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("rollwise: step")]
    assert [ln.split("  ")[0] for ln in lines] == ["rollwise: step 2/3", "rollwise: step 3/3"]
    assert "3/3" not in err.replace("rollwise: step 3/3", "")  # the bar's last frame was printed at the end too
    assert "reward 0.250" in lines[0] and "about 20 s left" in lines[0]
    off = ui.StepProgress(total=3, start=0, enabled=False)  # run.progress=false: warnings are still said
    off.note("step 1: reward errors=0 timeouts=2 nans=0 (scored 0)")
    assert "rollwise: step 1: reward errors=0 timeouts=2" in capsys.readouterr().err


def test_a_run_folder_with_brackets_keeps_its_name_in_the_summary(tmp_path, capsys):
    from rollwise.ui import print_summary

    run = tmp_path / "sweep[lr]"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "rollout/reward_mean": 0.5}\n')
    print_summary(run)
    assert "sweep[lr]" in capsys.readouterr().out.replace("\n", "")


def test_a_run_with_no_held_out_items_is_not_said_to_miss_its_final_evaluation(tmp_path):
    """A file task of 4 rows holds none out: the run finished, but the report said "not finished ... its final
    evaluation (eval.at_end) missing ... --resume makes it", and a resume changed nothing."""
    (tmp_path / "checkpoints" / "step_10").mkdir(parents=True)
    cfg = {**CFG, "eval": {"at_end": True}, "data": {"eval_size": 300}}
    history = [{"step": 0, "time/setup_s": 1.0, "data/eval_items": 0.0}, *_steps(10)]
    assert stop_reason(cfg, history, tmp_path) == "train.max_steps=10"
    history[0]["data/eval_items"] = 30.0  # with held-out items the final evaluation is still due
    assert stop_reason(cfg, history, tmp_path).startswith("not finished: step 10 of 10 trained, its final evaluation")
