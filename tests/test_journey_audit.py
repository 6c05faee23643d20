"""A new user's journey through the README's workflows: what the command line said that was wrong or missing
(src/rollwise/cli.py, src/rollwise/config/)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_e2e import _args

from rollwise.cli import main
from rollwise.config import describe_fields

TESTS = Path(__file__).parent


@pytest.fixture(autouse=True)
def _tests_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))


def test_options_lists_the_keys_of_a_file_task_and_of_a_reward_function(capsys):
    # `rollwise options` ("every config key") had no row for prompt_column, answer_column, path or a reward's
    # name: a user with a JSONL file could not find how to name its columns
    keys = {k for k, _, _ in describe_fields()}
    for key in ("data.tasks[].path", "data.tasks[].prompt_column", "data.tasks[].answer_column",
                "data.tasks[].params", "data.tasks[].weight", "reward.functions[].name", "reward.functions[].weight"):
        assert key in keys
    assert main(["options"]) == 0
    out = capsys.readouterr().out
    assert "data.tasks[].prompt_column" in out and "[default: 'prompt']" in out
    assert "reward.functions[].name" in out and "[default: required]" in out


_BROKEN = ["reward.functions=[{name: 'rewards_for_tests:always_raises'}]", "eval.at_start=false",
           "eval.at_end=false", "planner.strategy=uniform"]  # 16 calls a step: the 64th in step 4


def test_a_broken_reward_before_the_first_checkpoint_says_how_to_start_again(tiny_model_dir, tmp_path, capsys):
    # the message said "continue from the last checkpoint with `rollwise train --resume RUN_DIR`": a placeholder,
    # and a resume that is refused, since the run stopped before its first checkpoint
    assert main(["train", *_args(tiny_model_dir, tmp_path, "broken", 6, [*_BROKEN, "run.save_every=0"])]) == 2
    err = capsys.readouterr().err
    run = tmp_path / "broken"
    assert "always_raises failed on 64 calls in a row" in err
    assert not (run / "checkpoints").is_dir() or not any((run / "checkpoints").glob("step_*"))
    assert f"{run} has no checkpoint yet, so there is nothing to resume: start it again with " in err
    assert f"`rollwise train {run / 'config.yaml'} run.name=broken run.output_dir={tmp_path}`" in err


def test_a_broken_reward_after_a_checkpoint_names_the_run_folder_to_resume(tiny_model_dir, tmp_path, capsys):
    assert main(["train", *_args(tiny_model_dir, tmp_path, "broken", 6, [*_BROKEN, "run.save_every=2"])]) == 2
    err = capsys.readouterr().err
    run = tmp_path / "broken"
    assert (run / "checkpoints" / "step_000002").is_dir()
    assert f"`rollwise train --resume {run}`" in err and "RUN_DIR" not in err


@pytest.mark.parametrize("name", ["gsm.jsonl", "gsm.csv"])
def test_a_data_file_given_as_the_config_file_says_how_to_train_on_it(tmp_path, monkeypatch, capsys, name):
    # `rollwise train gsm.jsonl` said "config file 'gsm.jsonl' is not valid YAML: expected '<document start>'"
    # (and of a CSV: "must hold a mapping of sections, got str")
    monkeypatch.chdir(tmp_path)
    rows = ('{"q": "1+1?", "a": "2"}\n{"q": "2+2?", "a": "4"}\n' if name.endswith(".jsonl") else "q,a\n1+1?,2\n2+2?,4\n")
    (tmp_path / name).write_text(rows)
    assert main(["train", name]) == 2
    err = capsys.readouterr().err
    assert f"'{name}' is a data file, not a config file" in err and f"path: {name}" in err
    assert "not valid YAML" not in err and "mapping of sections" not in err


def test_a_short_file_says_its_training_rows_are_those_left_after_the_held_out_ones(tmp_path, caplog):
    # "wanted 16 training rows, the file has 10" of a file of 12 rows: 2 of them held out, said nowhere in that line
    import logging

    from rollwise.config import DataConfig, TaskSpec
    from rollwise.data.tasks import build_items

    f = tmp_path / "qa.jsonl"
    f.write_text("".join(f'{{"prompt": "What is {i} + 1?", "answer": "{i + 1}"}}\n' for i in range(12)))
    cfg = DataConfig(tasks=[TaskSpec(name="qa", path=str(f))], train_size=16, eval_size=4)
    with caplog.at_level(logging.WARNING):
        train, evals = build_items(cfg, seed=0)
    assert (len(train), len(evals)) == (10, 2)
    assert "wanted 16 training rows, the file has 10 besides the 2 held out; using all" in caplog.text


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_run_folder_in_the_wrong_place_says_where_it_goes(tmp_path, capsys, command):
    # `rollwise train runs/x` (meaning --resume) and `rollwise eval data.eval_size=2 runs/x` (the target after an
    # override) said "'runs/x' is neither a config file (.yaml) nor a KEY=VALUE override"
    run = tmp_path / "x"
    run.mkdir()
    (run / "config.yaml").write_text("train: {max_steps: 2}\n")
    argv = [command, str(run)] if command == "train" else [command, "data.eval_size=2", str(run)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"'{run}' is a folder" in err
    assert f"`rollwise train --resume {run}`" in err and f"`rollwise eval {run} [KEY=VALUE ...]`" in err


def test_a_group_of_two_under_adaptive_says_what_to_change():
    # rollout.num_generations=2 (the size a quick try picks) stopped with "planner.screen_size (2) must be below
    # rollout.num_generations (2)": an option the user never set, and no word of what to do
    from rollwise.config import ConfigError, load_config

    with pytest.raises(ConfigError) as e:
        load_config(None, ["rollout.num_generations=2"])
    assert "or choose a strategy that does not probe (planner.strategy=uniform)" in str(e.value)
    assert "lower planner.screen_size below 2" in str(e.value)
    load_config(None, ["rollout.num_generations=2", "planner.strategy=uniform"])  # what it points to is valid
    load_config(None, ["rollout.num_generations=2", "planner.screen_size=1"])
    with pytest.raises(ConfigError) as e:
        load_config(None, ["rollout.num_generations=1"])
    assert "raise rollout.num_generations above 2" in str(e.value) and "uniform" not in str(e.value)
