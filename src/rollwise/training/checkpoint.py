"""Checkpoints written atomically: a run killed while writing keeps its previous one.

A checkpoint is a folder `checkpoints/step_000012/` with the trainable weights
(safetensors), optimizer and scheduler state, RNG states, planner and engine state and the
loop's own counters. It is written to a temporary folder and renamed into place.
"""

from __future__ import annotations

import errno
import os
import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or does not match the model; the message says why."""


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    sd = model.state_dict()
    # Tied weights share storage; safetensors wants each tensor once and contiguous.
    return {k: v.detach().contiguous().clone() for k, v in sd.items() if k in names}


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # LoRA dropout on a GPU draws from it
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def save_checkpoint(run_dir: Path, step: int, model: torch.nn.Module, trainer_state: dict[str, Any],
                    extra: dict[str, Any], keep: int) -> Path:
    ckdir = Path(run_dir) / "checkpoints"
    final = ckdir / f"step_{step:06d}"
    tmp = ckdir / f".tmp_step_{step:06d}"

    def write(folder: Path) -> None:
        save_file(trainable_state(model), str(folder / "weights.safetensors"))
        torch.save({"trainer": trainer_state, "extra": extra, "rng": rng_state(), "step": step}, folder / "state.pt")

    write_folder(tmp, write, "checkpoint", "free disk space, then " + go_on(
        run_dir, " (or copy the run folder to a disk with room and resume the copy). The previous checkpoint is intact."))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in step_folders(ckdir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def write_folder(tmp: Path, write: Any, what: str, hint: str) -> None:
    """Write a fresh folder `tmp` with `write(tmp)` and flush its files to disk; when a write
    fails (a full disk) remove it and raise a CheckpointError that says what to do (`hint`, for a full disk).

    A full disk is an OSError only where Python writes: safetensors raises a SafetensorError
    ("I/O error: No space left on device") and torch.save a RuntimeError ("unexpected pos ...")."""
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        write(tmp)
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    except (OSError, SafetensorError, RuntimeError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        why = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"
        full = (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)) or any(
            s in str(e) for s in ("No space left", "unexpected pos", "os error 28", "Disk quota"))
        raise CheckpointError(f"could not write the {what} to {tmp} ({'disk full: ' if full else ''}{why}); "
                              f"{hint}") from None


def go_on(run_dir: Path, after_resume: str = "") -> str:
    """How a run stopped by an error goes on: `--resume` from its last checkpoint (`after_resume` said after the
    command), or, before its first checkpoint, `start_again` (--resume would find nothing)."""
    if latest_checkpoint(run_dir) is None:
        return start_again(run_dir)
    return f"continue with `rollwise train --resume {run_dir}`{after_resume}"


def start_again(run_dir: Path) -> str:
    """What to do with a run stopped before its first checkpoint: `--resume` has nothing to continue from."""
    from rollwise.ui import start_again_command

    return (f"start the run again with {start_again_command(Path(run_dir).resolve())}: it has no checkpoint yet, so "
            "`--resume` has nothing to continue from")


def checkpoint_step(path: Path) -> int:
    """The step of a checkpoint folder step_NNNNNN (0 for any other folder, such as best)."""
    digits = Path(path).name.removeprefix("step_")
    return int(digits) if digits.isdigit() else 0


def step_folders(ckdir: Path) -> list[Path]:
    """The checkpoint folders step_NNNNNN, oldest first; a folder set aside under another name (step_000010.bad,
    step_000020_keep) is neither resumed from nor removed."""
    return sorted((p for p in Path(ckdir).glob("step_*") if p.name.removeprefix("step_").isdigit()), key=checkpoint_step)


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = step_folders(Path(run_dir) / "checkpoints")
    return found[-1] if found else None


def remove_partial_writes(run_dir: Path) -> None:
    """Remove the half-written folders (`.tmp_*`, a full copy of the weights each) that a run killed
    while saving leaves behind."""
    for tmp in (Path(run_dir) / "checkpoints").glob(".tmp_*"):
        shutil.rmtree(tmp, ignore_errors=True)


def _damaged(path: Path, name: str, e: BaseException) -> CheckpointError:
    """A checkpoint file that cannot be read (a partial copy, a damaged disk): what to do about it."""
    first = (str(e).strip().splitlines() or [type(e).__name__])[0].split(". ")[0][:200]
    return CheckpointError(f"checkpoint {path}: {name} cannot be read ({type(e).__name__}: {first}); it is damaged or "
                           "incomplete. Put back a good copy of the folder, or move it away so that --resume takes "
                           "the checkpoint before it (run.keep_checkpoints keeps more than one)")


def load_checkpoint_weights(path: Path, model: torch.nn.Module) -> None:
    try:
        weights = load_file(str(path / "weights.safetensors"))
    except (FileNotFoundError, SafetensorError) as e:  # other OSErrors (disk, permission) are said as such
        raise _damaged(path, "weights.safetensors", e) from None
    missing = [k for k in weights if k not in model.state_dict()]
    fix = ("it was saved with another model or LoRA setting; load it with the run's own model.* settings (drop "
           "model.* overrides)")
    if missing:
        raise CheckpointError(f"checkpoint {path} does not match the model (unknown tensors such as {missing[0]}): {fix}")
    try:
        model.load_state_dict(weights, strict=False)
    except RuntimeError as e:  # same names, other shapes: a different model size or LoRA rank
        if "size mismatch" not in str(e):
            raise
        first = next((ln.strip() for ln in str(e).splitlines() if "size mismatch" in ln), str(e).splitlines()[0])
        raise CheckpointError(f"checkpoint {path} does not match the model ({first}): {fix}") from None


def load_checkpoint_state(path: Path) -> dict[str, Any]:
    """Optimizer, scheduler, RNG, planner and loop state (everything but the weights)."""
    try:
        return torch.load(Path(path) / "state.pt", map_location=None if torch.cuda.is_available() else "cpu",
                          weights_only=False)
    except FileNotFoundError as e:
        raise _damaged(Path(path), "state.pt", e) from None
    except (RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as e:
        raise _damaged(Path(path), "state.pt", e) from None
