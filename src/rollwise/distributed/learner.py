"""The trainer side of the asynchronous loop, in this process or as a Ray actor.

Both forms do the same things: `update(batch, version, budget)` (advantages, the clipped updates,
then the new weights published to the store as `version`), `save(step, extra)` (a checkpoint
with the driver's planner and rollout state in `extra`), `save_best(step, accuracy)` (the
weights of a new best evaluation, eval.save_best) and nothing else:
the driver never touches the weights, it evaluates with what the store holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rollwise.config import Config
from rollwise.models import merged_state_dict
from rollwise.training.best import save_best_weights
from rollwise.training.checkpoint import save_checkpoint
from rollwise.types import Sample


class Learner:
    """The policy, its optimizer and the weight store it publishes to."""

    def __init__(self, cfg: Config, model: torch.nn.Module, trainer: Any, store: Any, run_dir: Path) -> None:
        self.cfg, self.model, self.trainer, self.store, self.run_dir = cfg, model, trainer, store, Path(run_dir)

    def publish(self, version: int) -> None:
        self.store.publish(merged_state_dict(self.model), version)

    def update(self, batch: list[Sample], version: int,
               budget: tuple[float, float] | None = None) -> dict[str, float]:
        metrics: dict[str, float] = self.trainer.compute_advantages(batch)
        metrics.update(self.trainer.update(batch, budget))
        self.publish(version)
        return metrics

    def save(self, step: int, extra: dict[str, Any]) -> None:
        save_checkpoint(self.run_dir, step, self.model, self.trainer.state_dict(), extra, self.cfg.run.keep_checkpoints)

    def save_best(self, step: int, accuracy: float) -> None:
        """The weights just evaluated as a new best (eval.save_best): the loop evaluates only between updates."""
        save_best_weights(self.run_dir, step, accuracy, self.model)


class TrainerActor(Learner):
    """A Learner that builds its own policy: the body of the Ray actor (backend=ray)."""

    def __init__(self, cfg: Config, model_path: str, pad_id: int, store: Any, run_dir: str,
                 ckpt: str | None = None, rng: dict[str, Any] | None = None) -> None:
        from rollwise.loop import load_policy, make_trainer, seed_everything, set_threads
        from rollwise.training.checkpoint import set_rng_state

        set_threads(cfg.run.torch_threads or 1)
        seed_everything(cfg.run.seed)
        model, trainer = make_trainer(cfg, load_policy(cfg, model_path), pad_id, ckpt=Path(ckpt) if ckpt else None)
        if rng is not None:
            set_rng_state(rng)
        super().__init__(cfg, model, trainer, store, Path(run_dir))

    def ready(self) -> bool:
        return True
