"""Rollout workers behind the rollout executor's interface (`generate`, `step_tokens`, `metrics`).

A round's requests are dealt to the workers in turn (a request's samples on one worker; a
prompt's follow-up request in a later round may go to another) and generated in parallel. With
backend=ray each worker is an actor with distributed.max_worker_restarts restarts and unlimited
task retries: if its process dies mid-round, Ray starts a new one (which loads the newest weights)
and runs the interrupted call again, so every requested sample still comes back. The pool notices
the new incarnation and counts the restarts (Ray's own count: a worker may die and restart several
times within one round); a death past the restarts is a RolloutWorkerError.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from dataclasses import replace
from typing import Any

from rollwise.distributed.worker import RolloutWorker, WorkerSpec
from rollwise.engine.executor import RoundOutput
from rollwise.errors import RolloutWorkerError
from rollwise.planner.base import Request

RAY_MISSING = ("distributed.backend=ray needs Ray, which is not installed: pip install 'ray>=2.40' (or install "
               "rollwise with its ray extra, pip install '/path/to/rollwise[ray]'), or set distributed.backend=local")


def require_ray() -> None:
    """A ConfigError naming the install command when Ray is not installed (it is an optional dependency)."""
    import importlib.util

    from rollwise.config import ConfigError

    if "ray" not in sys.modules and importlib.util.find_spec("ray") is None:  # imported already: there
        raise ConfigError(RAY_MISSING)


def init_ray(address: str | None, num_cpus: int | None = None) -> bool:
    """Start (or join) Ray; True when this call started it (so we shut it down)."""
    require_ray()
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # no token written under the home folder
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False, log_to_driver=False)
    return True


def unwrap_remote_error(get: Any) -> Any:
    """get(); when a Ray actor raised one of its own exceptions (the trainer's CheckpointError on a
    full disk, an engine error in a rollout worker), raise that exception, so the CLI prints its
    message rather than Ray's remote traceback (kept as the chained cause). Ray's own failures (a
    dead actor) pass through as they are."""
    from ray.exceptions import RayError, RayTaskError

    try:
        return get()
    except RayTaskError as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, Exception) and not isinstance(cause, RayError):
            raise cause from e
        raise


RAY_LOGS = "Ray's logs are under /tmp/ray/session_latest/logs"


def ray_restarts(handle: Any) -> int | None:
    """How many times Ray has restarted the actor `handle` (its control store's count); None where that
    cannot be read (not a Ray actor, or a Ray without this table: the caller then counts incarnations)."""
    try:
        state = importlib.import_module("ray._private.state")
        return int(state.actors(actor_id=handle._actor_id.hex())["NumRestarts"])
    except Exception:  # noqa: BLE001 - a private table: any failure means "unknown"
        return None


def ray_get(get: Any, what: str, hint: str = "") -> Any:
    """`unwrap_remote_error(get)`, with a dead Ray actor (killed by the OS for memory, or dead past its
    restarts) or a call past its timeout turned into a RolloutWorkerError that names `what` and says
    how to go on (`hint` first, then the resume); an actor whose constructor raised, with that error."""
    from ray.exceptions import GetTimeoutError, RayActorError

    try:
        return unwrap_remote_error(get)
    except (RayActorError, GetTimeoutError) as e:
        lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()] or [type(e).__name__]
        if getattr(e, "actor_init_failed", False):  # its constructor raised: the cause is the last line, a resume would fail again
            raise RolloutWorkerError(f"{what} could not start: {lines[-1][:500]} ({RAY_LOGS})") from e
        why = "did not answer in time" if isinstance(e, GetTimeoutError) else "died"
        raise RolloutWorkerError(f"{what} {why} ({lines[0][:300]}). {hint}Resume from the last checkpoint (rollwise "
                                 f"train --resume RUN_DIR); {RAY_LOGS}") from None


class RolloutPool:
    def __init__(self, spec: WorkerSpec, store: Any, backend: str = "local", num_workers: int = 1) -> None:
        self.backend = backend
        self.store = store
        self.carried: dict[str, Any] = {}  # workers carry nothing across steps (no partial rollouts yet)
        self.restarts = 0  # this run's and, after a resume, the earlier runs' (async/worker_restarts)
        self.workers_restarts_allowed = spec.cfg.distributed.max_worker_restarts
        self.round_timeout = spec.cfg.distributed.worker_timeout
        self._tokens = 0
        self._rounds = 0  # rounds this batch (the workers run each round in parallel)
        self._stats: list[dict[str, Any]] = []
        specs = [replace(spec, seed=spec.seed + 7919 * i) for i in range(num_workers)]
        if backend == "ray":
            import ray

            d = spec.cfg.distributed
            actor = ray.remote(RolloutWorker).options(num_cpus=d.worker_threads, num_gpus=d.worker_gpus,
                                                      max_restarts=d.max_worker_restarts, max_task_retries=-1)
            self.workers = [actor.remote(s, store) for s in specs]
            try:
                self._incarnations = ray_get(lambda: ray.get([w.ping.remote() for w in self.workers]),
                                             "a rollout worker, starting,")
            except BaseException:  # no pool to close: the workers that did start would outlive the run
                self.close()
                raise
        else:
            self.workers = [RolloutWorker(replace(s, set_threads=False), store) for s in specs]
            self._incarnations = [w.incarnation for w in self.workers]
        self._ray_restarts = [0] * len(self.workers)  # Ray's count per worker when last read (new actors: 0)
        # the async loop's checkpoint (state_dict) may read incarnations while its producer thread generates
        self._count_lock = threading.Lock()

    # ------------------------------------------------------------------ the executor's interface
    def generate(self, requests: list[Request], first_round: bool = True) -> RoundOutput:
        self._rounds += 1
        n = len(self.workers)
        parts: list[list[Request]] = [[] for _ in range(n)]
        for i, r in enumerate(requests):
            parts[i % n].append(r)
        busy = [i for i in range(n) if parts[i]]
        if self.backend == "ray":
            import ray

            timeout = self.round_timeout
            results = ray_get(
                lambda: ray.get([self.workers[i].generate.remote(parts[i], first_round) for i in busy], timeout=timeout),
                "a rollout worker", f"(Ray restarts a worker up to distributed.max_worker_restarts="
                f"{self.workers_restarts_allowed} times; distributed.worker_timeout={timeout} bounds a round.) ")
        else:
            results = [self.workers[i].generate(parts[i], first_round) for i in busy]
        out = RoundOutput({}, {})
        for i, (o, stats) in zip(busy, results):
            for uid, outs in o.groups.items():
                out.groups.setdefault(uid, []).extend(outs)
            for uid, outs in o.adopted.items():
                out.adopted.setdefault(uid, []).extend(outs)
            self._tokens += int(stats["tokens"])
            self._note_incarnation(i, stats["incarnation"])
            self._stats.append(stats)
        return out

    def _note_incarnation(self, i: int, incarnation: Any) -> None:
        """Worker i answered from `incarnation`: a new one means Ray restarted it, perhaps several times
        since it last answered (each death within a retried call starts another process, and only the
        last one answers), so Ray's own count says how many (those it has made since it was last read:
        a restart right after an answer is counted once, when read); without that count, one."""
        with self._count_lock:
            if incarnation == self._incarnations[i]:
                return
            self._incarnations[i] = incarnation
            count = ray_restarts(self.workers[i])
            if count is None:
                self.restarts += 1
            else:
                # Ray counts a restart before the new process answers, so its count never lags a new incarnation; it may
                # be ahead (a death right after an answer, counted now, whose process answers next time: then 0)
                self.restarts += max(0, count - self._ray_restarts[i])
                self._ray_restarts[i] = max(count, self._ray_restarts[i])

    def step_tokens(self) -> int:
        return self._tokens

    def metrics(self) -> dict[str, float]:
        """This batch's pool metrics (reset on read)."""
        m = {"rollout/generated_tokens": float(self._tokens), "rollout/engine_rounds": float(self._rounds),
             "async/worker_restarts": float(self.restarts)}
        self._tokens, self._rounds, self._stats = 0, 0, []
        return m

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        if self.backend == "ray":
            import ray

            what = "a rollout worker, asked for its state for the checkpoint,"
            states = ray_get(lambda: ray.get([w.state_dict.remote() for w in self.workers]), what)
            # a worker restarted since it last generated (or while answering this) counts in the checkpoint's
            # total: after a resume the new workers' incarnations would no longer show it
            for i, inc in enumerate(ray_get(lambda: ray.get([w.ping.remote() for w in self.workers]), what)):
                self._note_incarnation(i, inc)
            return {"workers": states, "restarts": self.restarts}
        return {"workers": [w.state_dict() for w in self.workers], "restarts": self.restarts}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.restarts = int(state.get("restarts", 0))  # async/worker_restarts counts the whole run
        states = state.get("workers", [])
        if len(states) != len(self.workers):
            return  # a different number of workers: they start with fresh sampling streams
        if self.backend == "ray":
            import ray

            ray_get(lambda: ray.get([w.load_state_dict.remote(s) for w, s in zip(self.workers, states)]),
                    "a rollout worker, loading the checkpoint's state,")
        else:
            for w, s in zip(self.workers, states):
                w.load_state_dict(s)

    def cancel(self) -> None:
        """In-process workers stop at their next chunk boundary (the run is stopping; Ray's are killed
        by `close`)."""
        if self.backend != "ray":
            for w in self.workers:
                w.cancel()

    def close(self) -> None:
        if self.backend == "ray":
            import ray

            for w in self.workers:
                ray.kill(w)
        self.workers = []
