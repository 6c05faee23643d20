"""Defects found in an audit of the asynchronous loop (distributed/async_loop.py, pool.py, worker.py)."""

import queue
import sys
import threading
import time

import pytest
import ray.exceptions  # the real module: the stand-in `ray` below has no exceptions of its own
from test_distributed_options import _fake_ray
from test_e2e import _args

from rollwise.cli import main
from rollwise.config import build_config
from rollwise.distributed import async_loop
from rollwise.distributed.pool import RolloutPool
from rollwise.distributed.worker import WorkerSpec
from rollwise.errors import RolloutWorkerError


def test_a_batch_put_just_after_a_timed_out_wait_is_not_lost():
    """The producer puts its last batch (or its exception) and exits at once: a trainer whose wait
    timed out just before the put finds the thread dead and the item in the queue. It must take the
    item, not report a producer that "stopped without a batch" (which hides a worker's own error)."""

    class LateQueue(queue.Queue):
        def get(self, block=True, timeout=None):
            if not self.late:
                self.late = True  # the wait runs out; the producer puts its item and exits meanwhile
                self.put(ValueError("the worker's own error"))
                raise queue.Empty
            return super().get(block, timeout)

    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    q = LateQueue()
    q.late = False
    with pytest.raises(ValueError, match="^the worker's own error$"):
        async_loop._next_batch(q, dead)
    q = LateQueue()
    q.late = True
    q.put("batch")
    assert async_loop._next_batch(q, dead) == "batch"


def test_no_batch_is_started_after_the_run_stopped_early(tiny_model_dir, tmp_path, monkeypatch):
    """An early stop ends the run at an evaluation step, where the producer waits for the trainer's
    checkpoint. Released after it, the producer would start the next batch, which nobody trains: with
    Ray it runs on (planner, scoring) until the workers are killed up to 5 s later."""
    started = []
    produce, due = async_loop.produce_batch, async_loop.final_eval_due

    def recording(run, k, pool, *a, **kw):
        started.append(k)
        return produce(run, k, pool, *a, **kw)

    def slow_due(*a, **kw):  # the trainer's work between the last step and shutting down, made long
        time.sleep(1.0)
        return due(*a, **kw)

    monkeypatch.setattr(async_loop, "produce_batch", recording)
    monkeypatch.setattr(async_loop, "final_eval_due", slow_due)
    extra = ["eval.at_start=false", "eval.at_end=true", "eval.every_n_steps=1", "eval.early_stopping_patience=1",
             "eval.early_stopping_min_delta=1.0", "distributed.async_training=true", "distributed.max_staleness=1",
             "run.save_every=0"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "early", 6, extra)]) == 0
    assert (tmp_path / "early" / "checkpoints" / "step_000002").is_dir()  # stopped after its second evaluation
    assert started == [0, 1], started


def test_ray_workers_that_started_are_killed_when_another_fails_to_start(monkeypatch):
    """A rollout worker whose constructor fails (the model folder missing on one node of a cluster)
    stops the run before there is a pool to close: the workers that did start must be killed, not
    left holding their CPUs and GPUs where Ray outlives the run (distributed.ray_address)."""

    class InitFailed(ray.exceptions.ActorDiedError):
        actor_init_failed = True

        def __str__(self):
            return "The actor died because of an error raised in its creation task\nFileNotFoundError: model"

    def get(refs, timeout=None):
        list(refs)
        raise InitFailed()

    fake, killed = _fake_ray([]), []
    fake.get, fake.kill = get, killed.append
    monkeypatch.setitem(sys.modules, "ray", fake)
    cfg = build_config({"distributed": {"backend": "ray", "rollout_workers": 3}})
    with pytest.raises(RolloutWorkerError, match="could not start"):
        RolloutPool(WorkerSpec(cfg, "model", [0], 0, {}, seed=0), store=None, backend="ray", num_workers=3)
    assert len(killed) == 3
