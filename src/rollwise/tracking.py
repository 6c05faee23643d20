"""Metrics go to `metrics.jsonl` (one line per step or evaluation) and to TensorBoard,
under namespaces that say what they are: rollout/, planner/, loss/, offpolicy/, train/, eval/, time/."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class Tracker:
    def __init__(self, run_dir: Path, tensorboard: bool = True, truncate_after_step: int | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        if truncate_after_step is not None and self.path.exists():
            # On resume, forget lines written after the checkpoint we resume from.
            keep = [ln for ln in self.path.read_text().splitlines() if ln.strip()
                    and json.loads(ln).get("step", 0) <= truncate_after_step]
            self.path.write_text("".join(ln + "\n" for ln in keep))
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(Path(run_dir) / "tensorboard"), purge_step=truncate_after_step)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        clean = {k: (float(v) if isinstance(v, (int, float)) else v) for k, v in metrics.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, **clean}) + "\n")
        if self.writer is not None:
            for k, v in clean.items():
                if isinstance(v, float) and math.isfinite(v):
                    self.writer.add_scalar(k, v, step)
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is '{run_dir}' a rollwise run folder?")
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
