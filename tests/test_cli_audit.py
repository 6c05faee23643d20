"""Bad input met through the real command line: each case a message and an exit status, never a traceback
or a wrong pointer (src/rollwise/cli.py, src/rollwise/config/)."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from rollwise.cli import _split_args, main
from rollwise.config import ConfigError, load_config


@pytest.mark.parametrize(("override", "key"), [("train.save_steps=10", "run.save_every"),
                                               ("algo.num_generations=16", "rollout.num_generations"),
                                               ("rollout.max_prompt_length=128", "data.max_prompt_length"),
                                               ("train.eval_steps=5", "eval.every_n_steps")])
def test_a_trl_name_in_another_section_points_to_its_key_not_to_a_look_alike(override, key):
    # train.save_steps=10 said "Did you mean 'train.max_steps'?": following it trained 10 steps
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert f"TRL's {override.split('=')[0].split('.')[-1]} is {key}" in str(e.value)
    assert "Did you mean" not in str(e.value)


@pytest.mark.parametrize("override", ["train.max_steps=true", "algo.beta=yes", "data.eval_size=false",
                                      "run.seed=on", "algo.epsilon_high=true"])
def test_a_boolean_is_not_taken_for_a_number(override):
    # pydantic read true as 1: train.max_steps=true trained one step, algo.beta=yes loaded a reference at beta 1
    with pytest.raises(ConfigError, match=rf"config key '{override.split('=')[0]}': a number is needed"):
        load_config(None, [override])
    cfg = load_config(None, ["rollout.transpose_weights=true", "run.progress=false", "model.lora.enabled=yes"])
    assert cfg.rollout.transpose_weights is True and cfg.run.progress is False and cfg.model.lora.enabled is True


def test_a_list_as_a_yaml_key_is_a_config_error(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("? [train, algo]\n: 1\n")  # was a TypeError traceback (unhashable type: 'list')
    assert main(["train", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"config file '{bad}' is not valid YAML" in err and "unhashable key" in err


def test_a_config_file_in_a_folder_named_with_an_equals_sign_is_read(tmp_path, capsys):
    # a sweep's run folder (run.name=lr=1e-5): its config.yaml was taken for a KEY=VALUE override, so the
    # command the tool itself gives to start such a run again failed with "unknown config key"
    path = tmp_path / "lr=1e-5" / "config.yaml"
    path.parent.mkdir()
    path.write_text("train: {max_steps: 0}\n")
    assert _split_args([str(path), "train.max_steps=2"]) == (str(path), ["train.max_steps=2"])
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert "config key 'train.max_steps': Input should be greater than 0" in err and "unknown" not in err


def test_ctrl_c_while_rollwise_starts_is_status_130_without_a_traceback(monkeypatch, capsys):
    slow = types.ModuleType("rollwise.models")  # torch loads here for a second or two

    def interrupted(name):
        if name == "ModelError":
            raise KeyboardInterrupt
        raise AttributeError(name)

    slow.__getattr__ = interrupted
    monkeypatch.setitem(sys.modules, "rollwise.models", slow)
    try:
        status = main(["options"])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C while rollwise starts escaped main: a traceback")
    assert status == 130
    assert capsys.readouterr().err == "rollwise: interrupted\n"


@pytest.mark.skipif(sys.platform == "win32", reason="poll() and SIGPIPE are POSIX")
def test_output_piped_into_a_reader_that_left_ends_quietly(monkeypatch):
    read, write = os.pipe()
    os.close(read)  # `rollwise options | head -1` once head has its line
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ROLLWISE_SKIP_RAY": "1"}
    proc = subprocess.run([sys.executable, "-m", "rollwise.cli", "options"], stdout=write, stderr=subprocess.PIPE,
                          text=True, env=env, timeout=120)
    os.close(write)
    assert proc.returncode == 141 and proc.stderr == ""  # was a BrokenPipeError traceback, status 1

    def epipe_elsewhere(args):  # a broken pipe that is not stdout's stays an error
        raise BrokenPipeError(32, "Broken pipe")

    import rollwise.cli as cli

    monkeypatch.setattr(cli, "cmd_options", epipe_elsewhere)
    with pytest.raises(BrokenPipeError):
        main(["options"])


def test_a_plot_path_that_is_a_folder_says_what_to_change(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "rollout/reward_mean": 0.5}\n{"step": 2, "rollout/reward_mean": 0.6}\n')
    folder = tmp_path / "plots.png"
    folder.mkdir()  # was an IsADirectoryError traceback, status 1
    assert main(["report", str(run), "-o", str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"rollwise: error: {folder} is a folder, not a file" in err and "-o PATH" in err


@pytest.mark.parametrize(("command", "says"), [("export", "export on a machine with more"), ("simulate", "--workers")])
def test_out_of_memory_outside_training_gives_advice_that_applies(monkeypatch, capsys, command, says):
    # export and simulate were told to lower train.micro_batch_size and to resume a run: neither reads them
    import argparse

    import rollwise.cli as cli

    def exhausted(args):
        raise MemoryError

    def build():
        p = argparse.ArgumentParser()
        p.add_subparsers(dest="command").add_parser(command).set_defaults(func=exhausted)
        return p

    monkeypatch.setattr(cli, "build_parser", build)
    assert main([command]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rollwise: error: out of memory (MemoryError).") and says in err
    assert "train." not in err and "--resume" not in err


def test_a_key_given_twice_in_an_override_is_an_error_not_a_silent_drop():
    # a config file refused it; an override's YAML value kept the last one without a word
    with pytest.raises(ConfigError, match=r"override 'model.lora=\{r: 4, r: 8\}': .*duplicate key 'r'"):
        load_config(None, ["model.lora={r: 4, r: 8}"])
    with pytest.raises(ConfigError, match="duplicate key 'weight'"):
        load_config(None, ["data.tasks=[{name: chain_sum, weight: 2, weight: 1}]"])
    assert load_config(None, ["model.lora={r: 4, alpha: 8}"]).model.lora.r == 4


def test_overrides_on_both_sides_of_resume_are_all_taken(monkeypatch, capsys):
    # `rollwise train A=1 --resume RUN B=2` said "unrecognized arguments: B=2", a valid override
    import rollwise.cli as cli

    seen = {}

    def train(args):
        seen.update(items=args.items, resume=args.resume)
        return 0

    monkeypatch.setattr(cli, "cmd_train", train)
    assert main(["train", "train.max_steps=4", "--resume", "runs/x", "run.progress=false"]) == 0
    assert seen == {"items": ["train.max_steps=4", "run.progress=false"], "resume": "runs/x"}
    with pytest.raises(SystemExit) as e:  # an unknown option is still refused
        main(["train", "train.max_steps=4", "--bogus", "runs/x"])
    assert e.value.code == 2 and "unrecognized arguments: --bogus runs/x" in capsys.readouterr().err


def test_a_yaml_merge_key_in_a_config_file_is_read(tmp_path):
    # `<<: *anchor` (valid YAML, read by yaml.safe_load) was refused as "not valid YAML" by the duplicate-key check
    path = tmp_path / "c.yaml"
    path.write_text("data:\n  tasks:\n    - {name: chain_sum, params: &p {min_terms: 2, max_terms: 2, max_digits: 1}}\n"
                    "    - {name: products, params: {<<: *p, max_digits: 2}}\n")
    tasks = load_config(path).data.tasks
    assert tasks[1].params == {"min_terms": 2, "max_terms": 2, "max_digits": 2}
    path.write_text("data:\n  tasks:\n    - {name: chain_sum, params: &p {min_terms: 2}}\n"
                    "    - {name: products, params: {<<: *p, max_digits: 2, max_digits: 3}}\n")
    with pytest.raises(ConfigError, match="'max_digits' is given twice"):  # still refused beside a merge
        load_config(path)
