"""Audit of `rollwise eval` and `rollwise export` as a user runs them after a run: each test failed before its fix.
Tiny models and hand-built run folders only."""

from __future__ import annotations

import pytest
from test_eval_report_audit2 import _fake_run

from rollwise.cli import main


def test_eval_says_run_name_and_output_dir_do_not_pick_the_run(tiny_model_dir, capsys):
    """`rollwise eval run.output_dir=runs run.name=NAME` evaluated the base model (model.name_or_path) without a word:
    a user who named the run that way read the base model's accuracy as the run's."""
    from rollwise.evalcmd import _target_config

    cfg, ckpt = _target_config(None, [f"model.name_or_path={tiny_model_dir}", "run.output_dir=runs", "run.name=myrun",
                                      "run.tensorboard=false"])
    assert ckpt is None
    err = capsys.readouterr().err
    assert "run.output_dir, run.name has no effect here" in err, err
    assert "rollwise eval RUN_OUTPUT_DIR/RUN_NAME" in err, err
    assert "run.tensorboard has no effect here" in err, err
    _target_config(str(tiny_model_dir), ["run.seed=3", "run.torch_threads=1"])
    assert "warning" not in capsys.readouterr().err  # what `rollwise eval` reads


@pytest.mark.parametrize("command", ["eval", "export"])
def test_a_checkpoint_folder_of_a_run_without_its_config_yaml_names_the_run(tmp_path, capsys, command):
    """A checkpoint folder in its run, whose config.yaml is gone: the error said to put the checkpoint back under its
    run folder, where it is."""
    ckpt = tmp_path / "run" / "checkpoints" / "step_000002"
    ckpt.mkdir(parents=True)
    (ckpt / "weights.safetensors").write_bytes(b"")
    (tmp_path / "run" / "metrics.jsonl").write_text("")
    assert main([command, str(ckpt)] + ([str(tmp_path / "out")] if command == "export" else [])) == 2
    err = capsys.readouterr().err
    assert f"run folder {tmp_path / 'run'} has no config.yaml" in err and "put it back under" not in err, err


@pytest.mark.parametrize("command", ["eval", "export"])
@pytest.mark.parametrize("leftover", ["checkpoints", "metrics.jsonl"])
def test_a_run_folder_without_its_config_yaml_is_named_as_such(tmp_path, capsys, command, leftover):
    """A run folder whose config.yaml is gone was read as a model folder: eval's error told the user to run
    `rollwise eval RUN` (the very command that failed), export's that "a model folder needs no export"."""
    run = tmp_path / "run"
    run.mkdir()
    if leftover == "checkpoints":
        (run / "checkpoints" / "step_000002").mkdir(parents=True)
        (run / "checkpoints" / "step_000002" / "weights.safetensors").write_bytes(b"")
    else:
        (run / leftover).write_text("")
    args = [command, str(run)] + ([str(tmp_path / "out")] if command == "export" else [])
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"run folder {run} has no config.yaml" in err, err
    assert "needs no export" not in err and f"`rollwise eval {run}` evaluates it" not in err, err
    assert not (tmp_path / "out").exists()


def test_the_exported_weights_are_readable_as_the_umask_allows(tiny_model_dir, tmp_path):
    """safetensors wrote model.safetensors 0600 while the tokenizer files took the umask's 0644: an exported model was
    unreadable to a server or colleague under another account."""
    import os
    import stat

    run = _fake_run(tmp_path, tiny_model_dir)
    old = os.umask(0o022)
    try:
        assert main(["export", str(run), str(tmp_path / "out")]) == 0
    finally:
        os.umask(old)
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in (tmp_path / "out").iterdir()}
    assert modes["model.safetensors"] == 0o644, modes
    assert set(modes.values()) == {0o644}, modes
