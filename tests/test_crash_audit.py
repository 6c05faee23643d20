"""Crash audit: a run stopped by a full disk or a kill says what to do, and that advice works; nothing is lost."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from test_e2e import TESTS, _args

from rollwise.cli import main


@pytest.fixture(autouse=True)
def _tests_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))


def _full(*a, **k):
    raise OSError(errno.ENOSPC, "No space left on device")


def _advice_works(err: str, run: Path, monkeypatch) -> None:
    """The error names the command that continues the run, and that command runs (not `--resume`, which a run with
    no checkpoint refuses, and not a promise of an intact previous checkpoint that does not exist)."""
    assert f"--resume {run}" not in err and "previous checkpoint is intact" not in err, err
    cmd = err.split("start the run again with `")[1].split("`")[0].split()
    assert cmd[:2] == ["rollwise", "train"], err
    monkeypatch.undo()
    monkeypatch.syspath_prepend(str(TESTS))
    assert main(cmd[1:]) == 0
    assert (run / "checkpoints" / "step_000002").is_dir()


def test_full_disk_at_the_first_checkpoint_says_to_start_again_not_resume(tiny_model_dir, tmp_path, monkeypatch,
                                                                          capsys):
    """The disk fills while the run's first checkpoint is written: the error said `--resume RUN` ("The previous
    checkpoint is intact"), which then failed with a second error, since there is no checkpoint to resume."""
    import rollwise.training.checkpoint as ck

    monkeypatch.setattr(ck, "save_file", _full)
    quiet = ["eval.at_start=false", "eval.at_end=false", "run.save_every=2"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "first", 2, quiet)]) == 2
    err = capsys.readouterr().err
    assert "disk full" in err and "could not write the checkpoint" in err
    _advice_works(err, tmp_path / "first", monkeypatch)


def test_full_disk_at_metrics_before_any_checkpoint_says_to_start_again_not_resume(tiny_model_dir, tmp_path,
                                                                                   monkeypatch, capsys):
    """The disk is full when the run writes its first metrics line: the error said `--resume RUN` ("it restarts from
    the last checkpoint"), and that resume is refused: the run has no checkpoint."""
    import builtins

    real_open = builtins.open

    def opening(file, mode="r", *a, **k):
        if str(file).endswith("metrics.jsonl") and "a" in mode:
            _full()
        return real_open(file, mode, *a, **k)

    monkeypatch.setattr(builtins, "open", opening)
    quiet = ["eval.at_start=false", "eval.at_end=false", "run.save_every=2"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "m", 2, quiet)]) == 2
    err = capsys.readouterr().err
    assert "could not write the metrics" in err
    _advice_works(err, tmp_path / "m", monkeypatch)


def test_a_start_again_keeps_the_best_an_earlier_start_was_replacing_when_killed(tiny_model_dir, tmp_path, monkeypatch,
                                                                                 capsys):
    """An earlier start (no step checkpoint) killed between save_best's two renames leaves its best as
    checkpoints/.old_best. Starting again set aside only checkpoints/best, so the new run's first save_best
    restored .old_best as its own best and then deleted it: the earlier start's best weights were lost (and with no
    evaluation in the new start, the earlier best passed for this run's)."""
    import rollwise.loop as loop
    from rollwise.training.checkpoint import save_checkpoint

    def killed(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "save_checkpoint", killed)
    best_on = ["eval.save_best=true", "eval.at_end=false", "run.save_every=2"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "b", 2, best_on)]) == 130
    ck = tmp_path / "b" / "checkpoints"
    earlier = json.loads((ck / "best" / "best.json").read_text())
    assert earlier["step"] == 0
    (ck / "best").rename(ck / ".old_best")  # the folder a kill between the renames of save_best_weights leaves
    (ck / ".tmp_best").mkdir()  # and the new best, half-written
    monkeypatch.setattr(loop, "save_checkpoint", save_checkpoint)
    capsys.readouterr()
    assert main(["train", *_args(tiny_model_dir, tmp_path, "b", 2, best_on)]) == 0
    aside = ck / "best_earlier_start"
    assert aside.is_dir() and json.loads((aside / "best.json").read_text()) == earlier
    assert (aside / "weights.safetensors").is_file()
    assert not (ck / ".old_best").exists() and not (ck / ".tmp_best").exists()
    assert "best_earlier_start" in capsys.readouterr().err


def test_full_disk_at_the_best_weights_says_how_to_go_on(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """The disk fills while eval.save_best writes a new best before the first checkpoint: the error said only "free
    disk space, or turn off eval.save_best", not how to go on with the run."""
    import rollwise.training.best as best

    monkeypatch.setattr(best, "save_file", _full)
    on = ["eval.at_start=false", "eval.at_end=false", "eval.every_n_steps=1", "eval.save_best=true",
          "run.save_every=2"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "bestfull", 2, on)]) == 2
    err = capsys.readouterr().err
    assert "could not write the best weights" in err and "turn off eval.save_best" in err, err
    _advice_works(err, tmp_path / "bestfull", monkeypatch)
