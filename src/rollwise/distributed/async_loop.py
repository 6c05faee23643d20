"""The asynchronous loop: rollout workers produce the next batches while the trainer updates.

Two threads in this process, plus the workers and the learner (in this process, or Ray
actors with backend=ray):

* the **producer** plans, generates (through the `RolloutPool`), scores and assembles batch
  k with the same `produce_batch` the synchronous loop uses, then queues it;
* the **trainer** (main thread) takes batch k and has the learner update on it and publish
  version k + 1 to the weight store. Workers pick new weights up between chunks of generation, so sequences in
  flight continue under them with their tokens kept and every token tagged with its version.

Staleness (AReaL): batch k may start only once the trainer is at version v >= k - eta, so
at most (eta + v + 1) batches are accepted or running at version v, and every token of a
batch trained at version k was sampled at version k - eta or later. eta = 0 is the
synchronous loop. At a checkpoint step the producer waits for the checkpoint, so it holds
exactly what was produced for the steps before it and a resumed run continues from there
(with eval.early_stopping_patience it waits at every evaluation step too: the run may stop
and checkpoint there).
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import threading
import time
from typing import Any

from rollwise.config import Config
from rollwise.distributed.learner import Learner, TrainerActor
from rollwise.distributed.pool import RolloutPool, init_ray, ray_get, require_ray
from rollwise.distributed.store import LocalWeightStore, RayWeightStore
from rollwise.distributed.worker import WorkerSpec
from rollwise.engine.factory import engine_dtype
from rollwise.loop import (
    Produced,
    Run,
    RunResult,
    budget_span,
    close_on_failure,
    final_eval,
    final_eval_due,
    finish,
    is_checkpoint_step,
    is_eval_step,
    is_last_step,
    local_path,
    log_setup,
    loop_state,
    produce_batch,
    report_step,
    run_eval,
    setup,
    step_metrics,
    steps_to_train,
    stopped_early,
    token_budget_spent,
)
from rollwise.training.checkpoint import rng_state
from rollwise.ui import StepProgress


class StalenessGate:
    """Lets the producer start batch k once the trainer's version allows it (AReaL's bound)."""

    def __init__(self, version: int, eta: int, cfg: Config) -> None:
        self.version, self.eta, self.cfg = version, eta, cfg
        self.stopped = False
        self._cond = threading.Condition()

    def allows(self, k: int) -> bool:
        if k > self.version + self.eta:
            return False
        # a checkpoint at step c <= k must be written before batch k starts
        return not any(self.holds(c) for c in range(self.version + 1, k + 1))

    def holds(self, step: int) -> bool:
        """Whether the producer waits for the trainer's step `step` to be over: a checkpoint step, and
        with early stopping every evaluation step (the run may stop, and checkpoint, there)."""
        return is_checkpoint_step(self.cfg, step) or (self.cfg.eval.early_stopping_patience > 0
                                                      and is_eval_step(self.cfg, step))

    def wait(self, k: int) -> bool:
        """Block until batch k may start; False when the run is stopping."""
        with self._cond:
            self._cond.wait_for(lambda: self.stopped or self.allows(k))
            return not self.stopped

    def advance(self, version: int) -> None:
        with self._cond:
            self.version = version
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self.stopped = True
            self._cond.notify_all()


def _producer(run: Run, pool: RolloutPool, gate: StalenessGate, out: queue.Queue) -> None:
    spent = run.totals["tokens"]  # the trainer adds each batch's tokens after training it; the producer counts ahead
    try:
        for k in range(run.start_step, run.cfg.train.max_steps):
            if token_budget_spent(run.cfg, spent):  # the batch before was the last: the trainer stops (and
                return  # checkpoints the planner) there, so no batch past the budget may change its state
            tw = time.perf_counter()
            if not gate.wait(k):
                return
            waited = time.perf_counter() - tw
            started = gate.version
            produced = produce_batch(run, k, pool)
            spent += produced.tokens
            produced.executor_metrics.update({"async/producer_wait_s": waited,
                                              "async/started_at_version": float(started)})
            out.put(produced)
    except BaseException as e:  # noqa: BLE001 - handed to the trainer, which raises it
        out.put(e)


def _next_batch(out: queue.Queue, thread: threading.Thread) -> Produced:
    while True:
        try:
            item = out.get(timeout=1.0)
        except queue.Empty:
            if thread.is_alive():
                continue
            try:  # it may have put its last item (a batch or its error) after the wait ran out, then exited
                item = out.get_nowait()
            except queue.Empty:
                raise RuntimeError("the rollout producer stopped without a batch") from None
        if isinstance(item, BaseException):
            raise item
        return item


def staleness(batch: list[Any], version: int) -> list[int]:
    """Per trained sample: the trainer's version minus the oldest version among its tokens."""
    return [version - min(s.versions) for s in batch if not s.stop_gradient and s.versions and min(s.versions) >= 0]


def _make_learner(run: Run, store: Any) -> tuple[Any, Any]:
    """(learner, call): the trainer in this process, or a Ray actor (backend=ray); `call(method, *args)`."""
    cfg = run.cfg
    if cfg.distributed.backend != "ray":
        learner = Learner(cfg, run.model, run.trainer, store, run.run_dir)
        return learner, lambda method, *args: getattr(learner, method)(*args)
    import ray

    actor = ray.remote(TrainerActor).options(num_cpus=cfg.run.torch_threads or 1,
                                             num_gpus=1 if cfg.model.device == "cuda" else 0)
    handle = actor.remote(cfg, local_path(run.model_path), run.tokenizer.pad_token_id, store, local_path(str(run.run_dir)),
                          local_path(str(run.checkpoint)) if run.checkpoint else None,
                          run.state["rng"] if run.state else None)
    what = "the trainer (a Ray actor: killed by the OS for memory?)"
    try:
        ray_get(lambda: ray.get(handle.ready.remote()), what)
    except BaseException:  # Ctrl-C while it loads: the caller has no handle to kill, and Ray may outlive the run
        _kill_actors(handle)
        raise
    return handle, lambda method, *args: ray_get(lambda: ray.get(getattr(handle, method).remote(*args)), what)


def ray_gpus_needed(cfg: Config) -> tuple[int, int]:
    """(trainer, workers): the GPUs the Ray actors reserve, the trainer a whole one with model.device=cuda,
    the rollout workers distributed.worker_gpus each, packed as Ray packs fractions (on one GPU as many as fit)."""
    d = cfg.distributed
    trainer = 1 if cfg.model.device == "cuda" else 0
    f = d.worker_gpus
    if f <= 0:
        return trainer, 0
    workers = math.ceil(d.rollout_workers / math.floor(1 / f + 1e-9)) if f <= 1 else d.rollout_workers * math.ceil(f)
    return trainer, workers


def check_ray_gpus(cfg: Config) -> None:
    """A Ray started here (no distributed.ray_address: nothing can join it) must hold the GPUs the actors
    reserve: otherwise an actor waits for one forever and the run hangs without a word."""
    import ray

    from rollwise.config import ConfigError

    trainer, workers = ray_gpus_needed(cfg)
    if not trainer + workers:
        return
    have = float(ray.cluster_resources().get("GPU", 0.0))
    if trainer + workers <= have + 1e-9:
        return
    d = cfg.distributed
    raise ConfigError(
        f"distributed.backend=ray needs {trainer + workers} GPU(s) on this machine, Ray found {have:g}: "
        + ("the trainer actor takes a whole one of its own (model.device=cuda) and " if trainer else "")
        + f"distributed.rollout_workers={d.rollout_workers} at distributed.worker_gpus={d.worker_gpus:g} take "
        f"{workers}; started anyway, the actors that get none would wait for one forever. Lower distributed.worker_gpus "
        "or distributed.rollout_workers, or with one GPU use distributed.backend=local (the trainer and its rollout "
        "worker share it)")


def _kill_actors(*handles: Any) -> None:
    import ray

    for h in handles:
        if h is not None:
            with contextlib.suppress(Exception):  # already dead, or Ray already down
                ray.kill(h)


def train_async(cfg: Config, resume: str | None = None, quiet: bool = False) -> RunResult:
    d = cfg.distributed
    eta = d.max_staleness if d.async_training else 0
    if d.backend == "ray":
        require_ray()  # before the model loads
    # with backend=ray the trainer is a Ray actor: this process keeps only the evaluation engine's copy
    # the start's metrics row is written once the learner, the weight store and the workers are up (log_setup below)
    run = setup(cfg, resume, with_trainer=d.backend != "ray", log_start=False)
    started_ray, learner, pool, gate, producer, progress = False, None, None, None, None, None
    store: Any = None
    failed = True  # until training and its final evaluation are over
    try:
        if d.backend == "ray":
            need = d.rollout_workers * d.worker_threads + (cfg.run.torch_threads or 1)
            started_ray = init_ray(d.ray_address, max(os.cpu_count() or 1, need))
            if started_ray and not d.ray_address:  # a cluster may add nodes; Ray running already is the caller's
                check_ray_gpus(cfg)
            store = RayWeightStore(engine_dtype(cfg))
        else:
            store = LocalWeightStore(engine_dtype(cfg))
        learner, call = _make_learner(run, store)
        call("publish", run.start_step)
        spec = WorkerSpec(cfg, local_path(run.model_path), run.eos_ids, run.tokenizer.pad_token_id, run.ids_by_uid,
                          cfg.run.seed)
        pool = RolloutPool(spec, store, d.backend, d.rollout_workers)
        if run.state is not None and "pool" in run.state["extra"]:
            pool.load_state_dict(run.state["extra"]["pool"])
        log_setup(run)
        eval_version = [-1]

        def load_eval_weights() -> None:
            got = store.latest(eval_version[0])  # the evaluation engine takes the store's newest weights when it needs them
            if got is not None:
                run.engine.load_weights(got[1], version=got[0])
                eval_version[0] = got[0]

        def save_best(step: int, accuracy: float) -> None:
            call("save_best", step, accuracy)

        def evaluate_now(step: int) -> dict[str, float]:
            load_eval_weights()
            return run_eval(run, step, save_best)

        if run.start_step == 0 and cfg.eval.at_start:
            run.result.eval_before = evaluate_now(0)

        gate = StalenessGate(run.start_step, eta, cfg)
        batches: queue.Queue = queue.Queue()
        producer = threading.Thread(target=_producer, args=(run, pool, gate, batches), name="rollwise-producer",
                                    daemon=True)
        progress = StepProgress(cfg.train.max_steps, run.start_step, enabled=cfg.run.progress and not quiet)
        last_step = run.start_step
        steps = steps_to_train(run, progress)
        if steps:
            producer.start()
        for step in steps:
            t0 = time.perf_counter()
            produced = _next_batch(batches, producer)
            waited = time.perf_counter() - t0
            stale = staleness(produced.batch, step)
            if stale and max(stale) > eta:  # the gate makes this impossible; never train on it silently
                raise RuntimeError(f"step {step + 1}: a sample is {max(stale)} versions stale, over the bound {eta}")

            tt = time.perf_counter()
            metrics: dict[str, float] = call("update", produced.batch, step + 1, budget_span(run, produced))  # publishes version step + 1
            metrics["time/train_s"] = time.perf_counter() - tt

            step_metrics(run, produced, metrics)
            done = is_last_step(run, step + 1)
            checkpoint = done or is_checkpoint_step(cfg, step + 1)
            hold = checkpoint or gate.holds(step + 1)
            if not hold:
                gate.advance(step + 1)  # the producer may start the next batch while we log and evaluate
            metrics.update({"async/staleness_max": float(max(stale, default=0)),
                            "async/staleness_mean": sum(stale) / len(stale) if stale else 0.0,
                            "async/trainer_wait_s": waited, "async/max_staleness": float(eta)})
            metrics["time/step_s"] = time.perf_counter() - t0
            report_step(run, step + 1, produced, metrics, progress)
            if is_eval_step(cfg, step + 1) and not (done and cfg.eval.at_end):  # at the last step the final one does
                progress.update(step + 1, {**metrics, **evaluate_now(step + 1)})
                if not done and stopped_early(run, step + 1, progress):  # at its last step a run has finished
                    done = checkpoint = True
            if checkpoint:  # the producer is waiting at the gate: planner and workers hold steps <= step only
                call("save", step + 1, loop_state(run, {"pool": pool.state_dict(), "driver_rng": rng_state()}))
            if hold and not done:  # a run that stops here trains no later batch: the producer starts none
                gate.advance(step + 1)
            if done:
                last_step = step + 1
                break
        if final_eval_due(run, last_step):  # while the trainer is still there to save a best
            load_eval_weights()
            run.result.eval_after = final_eval(run, last_step, save_best)
        failed = False
    finally:
        if gate is not None:
            gate.stop()
        if progress is not None:
            progress.close()
        if producer is not None and producer.is_alive():
            pool.cancel()  # a batch in flight is not needed: Ctrl-C or an error returns within a chunk, not a batch
            producer.join(timeout=None if d.backend == "local" else 5.0)
        if pool is not None:
            pool.close()
        if d.backend == "ray":  # the trainer and weight-store actors too, also where Ray outlives the run
            _kill_actors(learner, getattr(store, "handle", None))
        if started_ray:
            import ray

            ray.shutdown()
        if failed:  # Ctrl-C or an error, the producer stopped: TensorBoard's writer thread and the reward worker too
            close_on_failure(run)
    return finish(run, last_step, quiet)
