"""Second audit of the synchronous loop (rollwise.loop): resumes, evaluations and what a run says, on the tiny
model."""

from __future__ import annotations

import json

import pytest
from test_e2e import TESTS, _args, _train_lines

from rollwise.cli import main


@pytest.fixture(autouse=True)
def _tests_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))


QUIET = ["eval.at_start=false", "eval.at_end=false"]


def test_a_resume_given_the_same_model_by_a_relative_path_is_not_refused_as_a_change(tiny_model_dir, tmp_path,
                                                                                    monkeypatch, capsys):
    """config.yaml keeps local paths absolute; a resume that repeats the start's command line from the same folder
    (model.name_or_path=./model) was compared as written and refused: "--resume cannot change
    model.name_or_path (/abs/model -> model)", naming a change that is none."""
    monkeypatch.chdir(tiny_model_dir.parent)
    rel = [f"model.name_or_path={tiny_model_dir.name}"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "relmodel", 1, QUIET), *rel]) == 0
    run = tmp_path / "relmodel"
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "train.max_steps=2", *rel]) == 0, capsys.readouterr().err
    assert [r["step"] for r in _train_lines(run)] == [1, 2]
    assert "model.name_or_path" not in capsys.readouterr().err
    # a really different model is still refused
    assert main(["train", "--resume", str(run), "train.max_steps=3", f"model.name_or_path={tmp_path}"]) == 2
    assert "--resume cannot change model.name_or_path" in capsys.readouterr().err


def test_a_relative_model_cache_dir_is_saved_as_an_absolute_one(tiny_model_dir, tmp_path, monkeypatch):
    """absolute_paths writes the run's local files and folders as absolute paths so that config.yaml works from
    any folder (`rollwise eval RUN`, `--resume`); model.cache_dir, the folder a built-in model is converted into
    and a hub model downloaded to, stayed relative: read from another folder it named another, empty cache."""
    import yaml

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["train", *_args(tiny_model_dir, tmp_path, "cache", 1, QUIET), "model.cache_dir=hf_cache"]) == 0
    saved = yaml.safe_load((tmp_path / "cache" / "config.yaml").read_text())
    assert saved["model"]["cache_dir"] == str(work / "hf_cache")


def test_held_out_items_too_long_for_the_prompt_limit_are_said_not_left_out_silently(tiny_model_dir, tmp_path,
                                                                                     capsys):
    """Held-out prompts longer than data.max_prompt_length were left out of every evaluation without a word
    (`rollwise eval` says so): eval/accuracy was over fewer items than data.eval_size, and with all of them too
    long eval.at_start, at_end, save_best and early stopping did nothing, silently."""
    longer = ["data.tasks=[{name: chain_sum, params: {min_terms: 2, max_terms: 3, max_digits: 2}}]",
              "data.max_prompt_length=88", "eval.at_start=false"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "longeval", 1, longer)]) == 0
    err = capsys.readouterr().err
    evals = [json.loads(x) for x in (tmp_path / "longeval" / "metrics.jsonl").read_text().splitlines()
             if "eval/items" in x]
    n = int(evals[-1]["eval/items"])
    assert n < 8
    assert (f"{8 - n} of 8 held-out items are longer than data.max_prompt_length=88 tokens and are left out of the "
            "run's evaluations") in err, err


def test_a_resume_that_names_the_runs_own_output_dir_another_way_is_not_refused_as_a_move(tiny_model_dir, tmp_path,
                                                                                         monkeypatch, capsys):
    """run.output_dir is saved expanded (~ and all); a resume given the start's own `run.output_dir=~/out` (or the
    folder relative to the current one) was compared as written and refused: "run.output_dir cannot move it"."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert main(["train", *_args(tiny_model_dir, tmp_path / "out", "here", 1, QUIET)]) == 0
    run = tmp_path / "out" / "here"
    capsys.readouterr()
    for same in ("~/out", "out", "./out/"):
        assert main(["train", "--resume", str(run), "train.max_steps=1", f"run.output_dir={same}"]) == 0, \
            capsys.readouterr().err
    assert main(["train", "--resume", str(run), "train.max_steps=1", "run.output_dir=~/elsewhere"]) == 2
    assert "run.output_dir cannot move it" in capsys.readouterr().err


def test_a_run_whose_patience_runs_out_at_its_last_step_says_it_finished_not_that_it_stopped_early(
        tiny_model_dir, tmp_path, capsys):
    """The evaluation at train.max_steps (eval.at_end off) that reached eval.early_stopping_patience made the run say
    "step 3: early stop ...", for a run that trained every step it was asked for: the summary says train.max_steps,
    and a resume says finished, not stopped early (the tiny model's accuracy stays 0: every evaluation after the
    first counts toward the patience)."""
    extra = ["eval.at_start=false", "eval.at_end=false", "eval.every_n_steps=1", "eval.early_stopping_patience=2"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "lastpatience", 3, extra)]) == 0
    run = tmp_path / "lastpatience"
    assert [r["step"] for r in _train_lines(run)] == [1, 2, 3]
    evals = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if "eval/accuracy" in x]
    assert [e["eval/evals_since_best"] for e in evals] == [0, 1, 2]  # the patience did run out at step 3
    out = capsys.readouterr()
    assert "early stop" not in out.err, out.err
    assert "stopped by" in out.out and "train.max_steps=3" in out.out
    # the asynchronous loop said it too
    assert main(["train", *_args(tiny_model_dir, tmp_path, "lastpatience_async", 3,
                                 [*extra, "distributed.async_training=true"])]) == 0
    assert "early stop" not in capsys.readouterr().err


def _refused(run, capsys, overrides, *said):
    """`--resume run overrides` is refused (exit 2) saying each of `said`, and changes neither config.yaml nor
    environment.json."""
    config, env = (run / "config.yaml").read_text(), (run / "environment.json").read_text()
    capsys.readouterr()
    assert main(["train", "--resume", str(run), *overrides]) == 2
    err = capsys.readouterr().err
    assert all(s in err for s in said), err
    assert (run / "config.yaml").read_text() == config and (run / "environment.json").read_text() == env


def test_a_resume_that_trains_nothing_records_no_setting_change(tiny_model_dir, tmp_path, capsys):
    """`--resume RUN reward.functions=[...]` on a run at its train.max_steps said "nothing to train" but rewrote
    config.yaml and added an environment.json entry: the summary and `rollwise eval RUN` then used a reward no step
    had trained with."""
    assert main(["train", *_args(tiny_model_dir, tmp_path, "done", 2, ["eval.at_start=false"])]) == 0
    run = tmp_path / "done"
    _refused(run, capsys, ["reward.functions=[{name: exact_match}]"],
             "the run has finished its train.max_steps=2, so no step would train with the change to reward.functions")
    # with a larger train.max_steps the change trains, and is recorded
    assert main(["train", "--resume", str(run), "reward.functions=[{name: exact_match}]", "train.max_steps=3"]) == 0
    assert "exact_match" in (run / "config.yaml").read_text()


def test_resuming_an_older_run_with_a_relative_cache_dir_reports_no_change(tiny_model_dir, tmp_path, monkeypatch,
                                                                            capsys):
    """config.yaml now keeps model.cache_dir absolute; an older run's relative one was reported (and recorded) as a
    change the resume made, and a finished run's plain --resume was refused over it (found in review)."""
    import yaml

    monkeypatch.chdir(tmp_path)
    assert main(["train", *_args(tiny_model_dir, tmp_path, "older", 2, ["eval.at_start=false", "model.cache_dir=cache"])]) == 0
    run = tmp_path / "older"
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["model"]["cache_dir"] == str(tmp_path / "cache")
    saved["model"]["cache_dir"] = "cache"  # as runs before 2026-12-07 kept it
    (run / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    capsys.readouterr()
    assert main(["train", "--resume", str(run)]) == 0  # finished: nothing to train, and no change refused
    assert "the resume changes model.cache_dir" not in capsys.readouterr().err


def test_a_resume_of_a_run_stopped_by_its_token_budget_or_early_records_no_setting_change(tiny_model_dir, tmp_path,
                                                                                          capsys, monkeypatch):
    """As at train.max_steps: a run that stopped on its train.max_rollout_tokens or its patience trains no step on a
    plain resume, so a changed setting was recorded in config.yaml and environment.json that no step ran with."""
    from test_async_audit2 import _scripted

    assert main(["train", *_args(tiny_model_dir, tmp_path, "budget", 8, ["eval.at_start=false", "eval.at_end=false",
                                                                         "train.max_rollout_tokens=100"])]) == 0
    run = tmp_path / "budget"
    _refused(run, capsys, ["reward.functions=[{name: exact_match}]"], "has spent its train.max_rollout_tokens=100",
             "the change to reward.functions")
    assert main(["train", "--resume", str(run), "reward.functions=[{name: exact_match}]",
                 "train.max_rollout_tokens=200"]) == 0  # a larger budget trains with the change, which is recorded
    assert "exact_match" in (run / "config.yaml").read_text()

    _scripted(monkeypatch, {0: 0.5, 1: 0.4, 2: 0.3, 3: 0.3, 4: 0.6, 5: 0.6, 6: 0.6})
    stop = ["eval.at_start=true", "eval.at_end=true", "eval.every_n_steps=1", "eval.early_stopping_patience=2"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "early", 6, stop)]) == 0
    run = tmp_path / "early"
    assert [r["step"] for r in _train_lines(run)] == [1, 2]
    _refused(run, capsys, ["train.learning_rate=0.01"], "stopped early at step 2", "the change to train.learning_rate")
    # the setting that stops it may change alone (a lower patience is still reached): recorded, nothing trains
    assert main(["train", "--resume", str(run), "eval.early_stopping_patience=1"]) == 0
    assert "early_stopping_patience: 1" in (run / "config.yaml").read_text()
    assert main(["train", "--resume", str(run), "train.max_steps=2"]) == 0  # to the step it stopped at, as well
    assert main(["train", "--resume", str(run), "train.learning_rate=0.01", "eval.early_stopping_patience=0",
                 "train.max_steps=6"]) == 0
    assert [r["step"] for r in _train_lines(run)] == [1, 2, 3, 4, 5, 6]
