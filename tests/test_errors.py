"""Bad input and broken surroundings end in one `rollwise: error:` line that names what was wrong and
what to do, with exit status 2, and lose nothing: each case as a user meets it."""

import errno
import sys

import pytest
import torch
from safetensors.torch import save_file
from test_e2e import _args

import rollwise.cli as cli
from rollwise.cli import main
from rollwise.config import ConfigError, load_config, read_run_config
from rollwise.loop import write_config


def test_a_full_disk_while_rewriting_config_yaml_leaves_the_old_one(tmp_path, monkeypatch):
    cfg = load_config(None, ["train.max_steps=7"])
    write_config(tmp_path, cfg)
    before = (tmp_path / "config.yaml").read_text()
    import pathlib

    real = pathlib.Path.write_text

    def half_then_full(self, text, *a, **k):
        real(self, text[: len(text) // 2])
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(pathlib.Path, "write_text", half_then_full)
    with pytest.raises(OSError):
        write_config(tmp_path, load_config(None, ["train.max_steps=9"]))
    monkeypatch.undo()
    assert (tmp_path / "config.yaml").read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]  # no temporary file left


@pytest.mark.parametrize(("text", "why"), [("", "it is empty"), ("train: {max_steps: [1\n", "not valid YAML"),
                                           ("- 1\n", "it holds no settings")])
def test_a_damaged_config_yaml_is_named_on_resume_and_eval(tmp_path, capsys, text, why):
    (tmp_path / "config.yaml").write_text(text)
    with pytest.raises(ConfigError, match=why):
        read_run_config(tmp_path)
    assert main(["train", "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'config.yaml'} cannot be read ({why}" in err and "start a new run" in err
    assert main(["eval", str(tmp_path)]) == 2
    assert "cannot be read" in capsys.readouterr().err


def test_every_prompt_too_long_says_which_setting(tiny_model_dir, tmp_path, capsys):
    assert main(["train", *_args(tiny_model_dir, tmp_path, "long", 1, ["data.max_prompt_length=3"])]) == 2
    err = capsys.readouterr().err
    assert "no training prompts left" in err and "data.max_prompt_length=3" in err
    assert not (tmp_path / "long").exists()  # said before the run folder is made


def test_a_fresh_start_replaces_the_metrics_of_an_earlier_start_without_checkpoints(tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "again"
    (run / "checkpoints" / ".tmp_step_000002").mkdir(parents=True)  # killed while writing its first checkpoint
    (run / "checkpoints" / "best").mkdir()  # after saving a best at an evaluation
    (run / "checkpoints" / "best" / "best.json").write_text('{"step": 1, "accuracy": 0.9}')
    (run / "metrics.jsonl").write_text('{"step": 0, "time/setup_s": 1.0}\n{"step": 1, "rollout/reward_mean": 0.9}\n')
    extra = ["eval.at_start=false", "eval.at_end=false"]
    write_config(run, load_config(None, _args(tiny_model_dir, tmp_path, "again", 1, extra)))
    assert main(["train", "--resume", str(run)]) == 2  # nothing to resume: the message gives the command that starts it
    err = capsys.readouterr().err
    assert f"rollwise train {run / 'config.yaml'} run.name=again run.output_dir={tmp_path}" in err
    assert "Loading weights" not in err  # said before the model is loaded
    assert main(["train", str(run / "config.yaml"), "run.name=again", f"run.output_dir={tmp_path}"]) == 0
    err = capsys.readouterr().err
    assert "earlier start that wrote no checkpoint" in err and "best_earlier_start" in err
    assert not (run / "checkpoints" / ".tmp_step_000002").exists() and not (run / "checkpoints" / "best").exists()
    assert (run / "checkpoints" / "best_earlier_start" / "best.json").is_file()  # kept aside, not lost
    rows = (run / "metrics.jsonl").read_text().splitlines()
    assert sum('"rollout/reward_mean"' in r for r in rows) == 1 and '"rollout/reward_mean": 0.9' not in "".join(rows)


def test_a_third_start_keeps_the_first_starts_best_aside(tmp_path, capsys):
    from rollwise.loop import set_aside_earlier_best

    ck = tmp_path / "checkpoints"
    for step in (1, 2):  # two starts that each saved a best and crashed before a step checkpoint
        (ck / "best").mkdir(parents=True)
        (ck / "best" / "best.json").write_text(f'{{"step": {step}}}')
        set_aside_earlier_best(tmp_path)
    assert (ck / "best_earlier_start" / "best.json").read_text() == '{"step": 1}'
    assert (ck / "best_earlier_start_2" / "best.json").read_text() == '{"step": 2}'


def test_checkpoint_folders_set_aside_under_another_name_are_neither_resumed_nor_removed(tmp_path):
    from rollwise.training.checkpoint import latest_checkpoint, save_checkpoint

    ck = tmp_path / "checkpoints"
    for name in ("step_000002", "step_000010.bad", "step_000020_keep"):
        (ck / name).mkdir(parents=True)
    assert latest_checkpoint(tmp_path).name == "step_000002"
    save_checkpoint(tmp_path, 4, torch.nn.Linear(2, 2), {}, {}, keep=1)
    assert sorted(p.name for p in ck.iterdir()) == ["step_000004", "step_000010.bad", "step_000020_keep"]


def test_a_checkpoint_of_another_shape_names_the_fix(tmp_path):
    from rollwise.training.checkpoint import CheckpointError, load_checkpoint_weights

    save_file({"weight": torch.zeros(3, 3), "bias": torch.zeros(3)}, str(tmp_path / "weights.safetensors"))
    with pytest.raises(CheckpointError, match="size mismatch.*model.\\* settings"):
        load_checkpoint_weights(tmp_path, torch.nn.Linear(2, 2))
    save_file({"other.weight": torch.zeros(2, 2)}, str(tmp_path / "weights.safetensors"))
    with pytest.raises(CheckpointError, match="unknown tensors such as other.weight.*model.\\* settings"):
        load_checkpoint_weights(tmp_path, torch.nn.Linear(2, 2))


def test_a_damaged_checkpoint_is_named_on_resume_eval_and_export(tiny_model_dir, tmp_path, capsys):
    extra = ["eval.at_start=false", "eval.at_end=false"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "torn", 1, extra)]) == 0
    ckpt = tmp_path / "torn" / "checkpoints" / "step_000001"
    state = (ckpt / "state.pt").read_bytes()
    (ckpt / "state.pt").write_bytes(state[: len(state) // 2])  # a partial copy
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "torn"), "train.max_steps=2"]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint {ckpt}: state.pt cannot be read" in err and "damaged or incomplete" in err
    (ckpt / "state.pt").write_bytes(state)
    weights = ckpt / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    for argv in (["eval", str(tmp_path / "torn")], ["export", str(tmp_path / "torn"), str(tmp_path / "out")]):
        assert main(argv) == 2
        assert f"checkpoint {ckpt}: weights.safetensors cannot be read" in capsys.readouterr().err


def test_a_run_folder_given_as_the_model_points_to_export(tmp_path):
    from rollwise.models import ModelError, resolve_model_path

    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(ModelError, match="rollwise export .*run OUT_DIR"):
        resolve_model_path(str(tmp_path / "run"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(ModelError, match="not a Hugging Face model folder$"):
        resolve_model_path(str(tmp_path / "plain"))


def test_vllm_missing_is_a_clean_error(tiny_model_dir, tmp_path, capsys):
    from rollwise.engine.vllm import vllm_available

    if vllm_available():
        pytest.skip("vLLM and a GPU are here")
    assert main(["train", *_args(tiny_model_dir, tmp_path, "vllm", 1, ["rollout.engine=vllm"])]) == 2
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("rollwise: error:")]
    assert len(errors) == 1 and "rollout.engine=vllm needs" in errors[0] and "Traceback" not in err
    assert "Loading" not in err and not (tmp_path / "vllm").exists()  # said before the model loads or a folder is made


def test_cuda_without_a_gpu_is_said_before_a_run_folder_is_made(tiny_model_dir, tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["train", *_args(tiny_model_dir, tmp_path, "cuda", 1, ["model.device=cuda"])]) == 2
    err = capsys.readouterr().err
    assert "model.device=cuda but torch sees no CUDA device" in err and not (tmp_path / "cuda").exists()


def test_a_reward_worker_that_cannot_start_names_the_functions(tmp_path, monkeypatch):
    from rollwise.config import RewardConfig
    from rollwise.rewards import RewardRunner

    (tmp_path / "child_fails.py").write_text(
        "import multiprocessing\n"
        "if multiprocessing.current_process().name == 'rollwise-reward-worker':\n"
        "    raise RuntimeError('no GPU for the judge in the worker')\n"
        "def score(completion, item):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    runner = RewardRunner(RewardConfig(functions=[{"name": "child_fails:score"}]))
    with pytest.raises(ConfigError, match="reward.functions child_fails:score failed to start.*no GPU.*import MODULE"):
        runner._start()


@pytest.mark.parametrize(("command", "says"), [("train", "run.output_dir"), ("export", "OUT_DIR"),
                                               ("eval", "model.cache_dir"), ("report", "-o PATH"),
                                               ("simulate", "--out DIR")])
def test_a_folder_that_cannot_be_written_says_what_to_change(monkeypatch, capsys, command, says):
    def denied(args):
        raise PermissionError(errno.EACCES, "Permission denied", "/runs/x")

    monkeypatch.setattr(cli, "build_parser", _parser_running(denied))
    assert main([command]) == 2
    err = capsys.readouterr().err
    assert "permission denied for /runs/x (Permission denied)" in err and says in err


def _parser_running(fn):
    import argparse

    def build():
        p = argparse.ArgumentParser()
        sub = p.add_subparsers(dest="command")
        for name in ("train", "export", "eval", "report", "simulate"):
            sub.add_parser(name).set_defaults(func=fn)
        return p

    return build


def test_an_output_path_under_a_file_says_what_to_change(monkeypatch, capsys):
    def under_a_file(args):  # run.output_dir=some_file: mkdir raised NotADirectoryError, a traceback
        raise NotADirectoryError(errno.ENOTDIR, "Not a directory", "/tmp/afile.txt/run")

    monkeypatch.setattr(cli, "build_parser", _parser_running(under_a_file))
    assert main(["train"]) == 2
    err = capsys.readouterr().err
    assert "/tmp/afile.txt/run: a part of this path is a file, not a folder" in err and "run.output_dir" in err


def test_ctrl_c_says_resume_only_for_a_run_with_a_checkpoint(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", _parser_running(interrupted))
    assert main(["train"]) == 130
    assert capsys.readouterr().err == "rollwise: interrupted\n"  # no run folder made yet: nothing to resume


def test_the_disk_full_hint_fits_the_command(monkeypatch, capsys):
    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", "/out/model.safetensors")

    monkeypatch.setattr(cli, "build_parser", _parser_running(full))
    assert main(["export"]) == 2
    err = capsys.readouterr().err
    assert "disk full writing /out/model.safetensors" in err and "OUT_DIR" in err and "--resume" not in err
    assert main(["train"]) == 2
    assert "--resume" in capsys.readouterr().err


@pytest.mark.parametrize(("error", "says"), [
    ("RolloutWorkerError", "a rollout worker died more than distributed.max_worker_restarts=3 times; resume"),
    ("TrainingDivergedError", "the gradient is not finite"),  # a diverged update says what to lower
])
def test_a_run_error_is_one_line(monkeypatch, capsys, error, says):
    import rollwise.errors

    def fails(args):
        raise getattr(rollwise.errors, error)(says)

    monkeypatch.setattr(cli, "build_parser", _parser_running(fails))
    assert main(["train"]) == 2
    assert f"rollwise: error: {says}" in capsys.readouterr().err


def test_a_checkpoint_folder_moved_out_of_its_run_says_to_put_it_back(tmp_path, capsys):
    from rollwise.models import ModelError, resolve_model_path

    moved = tmp_path / "step_000004"
    moved.mkdir()
    (moved / "weights.safetensors").write_bytes(b"")
    with pytest.raises(ModelError, match="moved out of its run.*put it back"):
        resolve_model_path(str(moved))
    assert main(["export", str(moved), str(tmp_path / "out")]) == 2
    assert "put it back under its run folder" in capsys.readouterr().err
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    with pytest.raises(ModelError, match="`rollwise eval .*` evaluates it"):
        resolve_model_path(str(run))


def test_a_misspelt_built_in_model_name_is_said_at_once(monkeypatch):
    """smollm2-135M was taken for a hub id: about a minute of network retries, offline, before the error."""
    from rollwise import models

    monkeypatch.setattr(models, "_convert_builtin", lambda *a: pytest.fail("not the built-in name"))
    for name in ("smollm2-135M", "SmolLM2-135m", "smollm2-135"):
        with pytest.raises(models.ModelError, match=f"'{name}'.*did you mean 'smollm2-135m'"):
            models.resolve_model_path(name)
    assert models.resolve_model_path("gpt2") == "gpt2"  # a hub id is left to the hub
    assert models.resolve_model_path("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"


def test_an_unknown_key_in_a_runs_saved_config_names_that_file(tmp_path):
    from rollwise.config import ConfigError
    from rollwise.loop import load_resumed_config

    (tmp_path / "config.yaml").write_text("train:\n  old_key: 1\n")  # written by another version of rollwise
    with pytest.raises(ConfigError, match=r"config.yaml, the run's saved settings: (.|\n)*unknown config key 'train.old_key'"
                                          r"(.|\n)*Edit that file"):
        load_resumed_config(str(tmp_path), {})
    with pytest.raises(ConfigError) as e:  # an override's own mistake is said as before
        (tmp_path / "config.yaml").write_text("train:\n  max_steps: 3\n")
        load_resumed_config(str(tmp_path), {"train": {"max_stepz": 4}})
    assert "saved settings" not in str(e.value) and "max_stepz" in str(e.value)


def test_a_context_the_model_cannot_hold_is_named_before_the_run_starts(tiny_model_dir, tmp_path, capsys):
    # the tiny model holds 512 positions (rotary): 256 + 300 past it generates off its training, said at the start
    extra = ["data.max_prompt_length=256", "rollout.max_completion_length=300", "eval.at_start=false",
             "eval.at_end=false"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "ctx", 1, extra)]) == 0
    err = capsys.readouterr().err
    assert "= 556 tokens exceeds the model's context length (512" in err and "rollwise: warning" in err


def test_a_reward_function_that_always_fails_stops_the_run_and_keeps_its_checkpoint(tiny_model_dir, tmp_path, capsys):
    extra = ["reward.functions=[{name: 'rewards_for_tests:always_raises'}]", "eval.at_start=false",
             "eval.at_end=false", "planner.strategy=uniform"]  # 16 calls a step: the 64th in step 4
    assert main(["train", *_args(tiny_model_dir, tmp_path, "broken", 6, extra)]) == 2
    err = capsys.readouterr().err
    assert "always_raises failed on 64 calls in a row" in err and "KeyError" in err and "Traceback" not in err
    assert (tmp_path / "broken" / "checkpoints" / "step_000002").is_dir()


def test_the_ray_backend_without_ray_installed_names_the_install(tiny_model_dir, tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    monkeypatch.delitem(sys.modules, "ray", raising=False)  # an earlier test may have imported it
    assert main(["train", *_args(tiny_model_dir, tmp_path, "noray", 1, ["distributed.backend=ray"])]) == 2
    err = capsys.readouterr().err
    assert "needs Ray, which is not installed: pip install 'ray>=2.40'" in err and "Loading weights" not in err


def test_ctrl_c_names_the_command_that_continues_the_run(tiny_model_dir, tmp_path, capsys, monkeypatch):
    import rollwise.loop as loop

    real = loop.report_step

    def interrupted(run, step, *a, **k):
        if step == 3:  # after the checkpoint of step 2
            raise KeyboardInterrupt
        return real(run, step, *a, **k)

    monkeypatch.setattr(loop, "report_step", interrupted)
    assert main(["train", *_args(tiny_model_dir, tmp_path, "ctrlc", 4, ["eval.at_start=false"])]) == 130
    assert f"continue from its last checkpoint with `rollwise train --resume {tmp_path / 'ctrlc'}`" in \
        capsys.readouterr().err
