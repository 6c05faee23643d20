"""The best held-out accuracy of a run: a copy of its weights, and early stopping.

Every evaluation (before, during and after training) is compared with the best `eval/accuracy`
seen so far. With `eval.save_best` the weights of a new best are written to
`checkpoints/best/` (the checkpoint layout, so `rollwise eval` and `rollwise export` take the
folder), with `best.json` naming its step and accuracy. With `eval.early_stopping_patience=N`
training stops once N evaluations in a row have not beaten the best by more than
`eval.early_stopping_min_delta`. The counters travel in every checkpoint, so a resumed run
stops where the uninterrupted one would have.

The best is chosen on the held-out items, so its accuracy there is an optimistic estimate of
what it scores on new items.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from rollwise.training.checkpoint import go_on, trainable_state, write_folder

METRIC = "eval/accuracy"


@dataclass
class BestTracker:
    """Best accuracy so far, its step, and evaluations since it (what early stopping counts)."""

    patience: int = 0
    min_delta: float = 0.0
    best: float | None = None
    best_step: int | None = None
    since: int = 0
    last_step: int | None = None  # the step of the last evaluation counted

    def observe(self, step: int, accuracy: float) -> bool:
        """Count one evaluation; True when it is a new best (the first one always is)."""
        self.last_step = step
        if self.best is None or accuracy > self.best + self.min_delta:
            self.best, self.best_step, self.since = accuracy, step, 0
            return True
        self.since += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.patience > 0 and self.since >= self.patience

    def stop_note(self) -> str:
        return (f"early stop: {METRIC} has not beaten {self.best:.3f} (step {self.best_step}) by more than "
                f"{self.min_delta:g} in {self.since} evaluations (eval.early_stopping_patience={self.patience})")

    def metrics(self) -> dict[str, float]:
        return {"eval/best_accuracy": float(self.best or 0.0), "eval/evals_since_best": float(self.since)}

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_step": self.best_step, "since": self.since, "last_step": self.last_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_step, self.since = state["best"], state["best_step"], state["since"]
        self.last_step = state.get("last_step", -1)  # -1: a checkpoint from before last_step was saved


def best_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints" / "best"


def read_best(run_dir: Path) -> dict[str, Any] | None:
    """`best.json` of a run's saved best ({"step", "accuracy"}), None when there is none."""
    try:
        return json.loads((best_dir(run_dir) / "best.json").read_text())
    except (OSError, ValueError):
        return None


def save_best_weights(run_dir: Path, step: int, accuracy: float, model: torch.nn.Module) -> Path:
    """Write the trainable weights as `checkpoints/best/`, replacing the previous best only once
    the new one is complete (a run killed while writing keeps the old one)."""
    ckdir = Path(run_dir) / "checkpoints"
    final, tmp, old = ckdir / "best", ckdir / ".tmp_best", ckdir / ".old_best"
    restore_interrupted_best(run_dir)
    shutil.rmtree(old, ignore_errors=True)

    def write(folder: Path) -> None:
        save_file(trainable_state(model), str(folder / "weights.safetensors"))
        (folder / "best.json").write_text(json.dumps({"step": step, "metric": METRIC, "accuracy": accuracy}) + "\n")

    write_folder(tmp, write, "best weights", f"free disk space (or turn off eval.save_best), then {go_on(run_dir)}. "
                 "The previous best is intact.")
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def saved_best_lags(run_dir: Path, best: float | None) -> bool:
    """Whether the weights saved as best (none, or a lower accuracy) are not those of the tracker's best:
    eval.save_best was turned on by a resume, after that best. Then every evaluation that beats what is
    saved is saved, not only those that beat the tracker's best."""
    saved = read_best(run_dir)
    return best is not None and (saved is None or float(saved["accuracy"]) < best)


def beats_saved_best(run_dir: Path, accuracy: float) -> bool:
    """Whether `accuracy` beats the best saved on disk (or none is saved). A resumed run redoes the
    steps after its checkpoint; a best saved in them before the interruption holds weights that were
    really evaluated, so only a better evaluation replaces it."""
    saved = read_best(run_dir)
    return saved is None or accuracy > float(saved["accuracy"])


def resume_best(tracker: BestTracker, run_dir: Path, start_step: int, evaluated: float | None) -> str | None:
    """On resume, bring the checkpoint's tracker to where the run stood at `start_step`: the final
    evaluation runs after the last checkpoint is written, so an evaluation the metrics hold at
    `start_step` (`evaluated`) that the tracker has not counted is counted now. The tracker is
    otherwise kept as saved, so the evaluations of the redone steps count as they did the first time
    (early stopping stops where the uninterrupted run would have). Returns a note when a best saved
    after the checkpoint is kept."""
    if evaluated is not None and tracker.last_step not in (start_step, -1):
        tracker.observe(start_step, evaluated)
    saved = read_best(run_dir)
    if not saved or saved["step"] <= start_step:
        return None
    return (f"keeping {best_dir(run_dir)} (step {saved['step']}, {METRIC} {saved['accuracy']:.3f}), evaluated "
            f"before the run was interrupted; only a better evaluation replaces it")


def restore_interrupted_best(run_dir: Path) -> None:
    """A run killed between the two renames of `save_best_weights` has only `.old_best`, which is whole:
    it becomes the best again."""
    ckdir = Path(run_dir) / "checkpoints"
    if (ckdir / ".old_best").is_dir() and not (ckdir / "best").exists():
        os.replace(ckdir / ".old_best", ckdir / "best")
