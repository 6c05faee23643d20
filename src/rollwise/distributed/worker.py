"""One rollout worker: an engine and the rollout executor, fed with the trainer's weights.

The same class runs in process (backend=local) and as a Ray actor (backend=ray). Between
chunks of `distributed.weight_sync_tokens` sampled tokens it asks the weight store for
newer weights; sequences in flight keep their tokens (and per-token versions) and
continue under the new weights. A worker that Ray restarts after a crash runs this
constructor again and so starts from the newest published weights, with a fresh random stream
(its seed's would draw the same numbers as its first start did).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Any

import torch

from rollwise.config import Config
from rollwise.engine.executor import RolloutExecutor, RoundOutput
from rollwise.engine.factory import build_engine
from rollwise.models import load_model
from rollwise.planner.base import Request


@dataclass
class WorkerSpec:
    cfg: Config
    model_path: str
    eos_ids: list[int]
    pad_id: int
    prompt_ids: dict[str, list[int]]
    seed: int
    set_threads: bool = True  # False for in-process workers: the trainer owns this process's torch threads


def restarted_by_ray() -> bool:
    """Whether this process is a Ray actor that Ray restarted after it died (False outside Ray)."""
    try:
        import ray

        return bool(ray.is_initialized() and ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # noqa: BLE001 - no Ray, or not inside an actor (the property asserts there)
        return False


class GenerationCancelled(Exception):
    """Raised at a chunk boundary in a worker the run has cancelled (it is stopping: Ctrl-C, an error)."""


class RolloutWorker:
    def __init__(self, spec: WorkerSpec, store: Any) -> None:
        if spec.set_threads:
            torch.set_num_threads(spec.cfg.distributed.worker_threads)
        cfg = spec.cfg
        model = None if cfg.rollout.engine == "vllm" else load_model(spec.model_path, torch.float32)
        if model is not None and cfg.model.device == "cuda":
            model = model.to("cuda")
        seed = int.from_bytes(os.urandom(4), "little") >> 1 if restarted_by_ray() else spec.seed
        self.engine = build_engine(cfg, model, spec.eos_ids, spec.pad_id, seed, spec.model_path)  # type: ignore[arg-type]
        ro = cfg.rollout
        self.executor = RolloutExecutor(self.engine, spec.prompt_ids, ro.max_completion_length, ro.temperature,
                                        keep_kv=ro.partial_keep_kv, sync_tokens=cfg.distributed.weight_sync_tokens,
                                        between=self.sync)
        self.store = store
        self.loaded = -1
        self.weight_updates = 0
        self.incarnation = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.cancelled = False
        self.sync()

    def cancel(self) -> None:
        """Stop generating at the next chunk of `distributed.weight_sync_tokens` tokens (an in-process
        worker, when the run stops: its batch would be thrown away, and Ctrl-C would wait for it)."""
        self.cancelled = True

    def sync(self) -> bool:
        """Load the newest published weights, if newer than ours; True when it did."""
        if self.cancelled:
            raise GenerationCancelled("the run is stopping")
        got = self.store.latest(self.loaded)
        if got is None:
            return False
        version, weights = got
        self.engine.load_weights(weights, version)
        self.loaded = version
        self.weight_updates += 1
        return True

    def generate(self, requests: list[Request], first_round: bool = True) -> tuple[RoundOutput, dict[str, Any]]:
        self.sync()
        out = self.executor.generate(requests, first_round)
        stats = {"tokens": self.executor.step_tokens(), "weight_updates": self.weight_updates,
                 "incarnation": self.incarnation, "version": self.loaded}
        self.executor.metrics()  # reset the executor's per-call counters
        return out, stats

    def ping(self) -> str:
        return self.incarnation

    def state_dict(self) -> dict[str, Any]:
        return {"engine": self.engine.state_dict(), "executor": self.executor.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        version = self.engine.version
        self.engine.load_state_dict(state["engine"])
        self.engine.version = version  # the weights loaded are what they are; the store says which version
        self.executor.load_state_dict(state["executor"])
