"""The asynchronous loop: eta = 0 is the synchronous loop, the staleness bound holds, Ray workers
run, resume and survive being killed. vLLM is tested only where CUDA exists."""

import json
import os

import pytest
from test_e2e import _args, _train_lines

from rollwise.cli import main
from rollwise.config import build_config
from rollwise.distributed.async_loop import StalenessGate
from rollwise.distributed.pool import unwrap_remote_error

ASYNC_ONLY = ("async/", "time/", "rollout/tokens_per_s", "rollout/buffered", "rollout/dropped_stale_total",
              "rollout/carried_samples")


def _comparable(run_dir):
    return [{k: v for k, v in r.items() if not k.startswith(ASYNC_ONLY)} for r in _train_lines(run_dir)]


def _rows(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if "rollout/reward_mean" in x]


def test_the_trainer_actors_own_error_reaches_the_cli_with_its_message():
    """A CheckpointError raised in the Ray trainer actor (a full disk) comes back from ray.get as a
    RayTaskError whose text is Ray's remote traceback, escape codes included (measured with Ray
    2.60); the driver raises the actor's own exception, so `rollwise: error:` prints one clean line."""
    from ray.exceptions import ActorDiedError, RayTaskError

    from rollwise.training.checkpoint import CheckpointError

    msg = "could not write the weights to run/ckpt (disk full); free disk space or resume"
    wrapped = RayTaskError("TrainerActor.save", "Traceback ...\n  File learner.py", CheckpointError(msg))

    def fail(err):
        raise err

    with pytest.raises(CheckpointError) as got:
        unwrap_remote_error(lambda: fail(wrapped.as_instanceof_cause()))
    assert str(got.value) == msg and isinstance(got.value.__cause__, RayTaskError)
    with pytest.raises(ActorDiedError):  # Ray's own failures are not the trainer's errors: unchanged
        unwrap_remote_error(lambda: fail(ActorDiedError()))
    assert unwrap_remote_error(lambda: 7) == 7


def test_gate_follows_areal_bound_and_waits_for_checkpoints():
    cfg = build_config({"run": {"save_every": 5}, "train": {"max_steps": 20}})
    gate = StalenessGate(version=0, eta=2, cfg=cfg)
    assert [k for k in range(8) if gate.allows(k)] == [0, 1, 2]  # (eta + v + 1) batches at version 0
    gate.advance(3)
    assert [k for k in range(8) if gate.allows(k)] == [0, 1, 2, 3, 4]  # batch 5 waits for checkpoint 5
    gate.advance(5)
    assert [k for k in range(10) if gate.allows(k)][-1] == 7
    assert [k for k in range(8) if StalenessGate(0, 0, cfg).allows(k)] == [0]  # eta = 0: one batch at a time


def test_eta_zero_reproduces_the_synchronous_loop(tiny_model_dir, tmp_path):
    base = ["eval.at_start=false", "eval.at_end=true", "distributed.weight_sync_tokens=8"]
    # rollout workers run the planner's rounds one by one, so the synchronous loop does too here
    assert main(["train", *_args(tiny_model_dir, tmp_path, "sync", 4, [*base, "rollout.overlap_rounds=false"])]) == 0
    assert main(["train", *_args(tiny_model_dir, tmp_path, "async0", 4,
                                 [*base, "distributed.async_training=true", "distributed.max_staleness=0"])]) == 0
    sync, async0 = _comparable(tmp_path / "sync"), _comparable(tmp_path / "async0")
    assert sync == async0
    rows = _rows(tmp_path / "async0")
    assert all(r["async/staleness_max"] == 0 for r in rows)
    # and a killed asynchronous run resumes to the same metrics (the producer waits at checkpoints)
    assert main(["train", *_args(tiny_model_dir, tmp_path, "half", 2,
                                 [*base, "eval.at_end=false", "distributed.async_training=true",
                                  "distributed.max_staleness=0"])]) == 0
    assert main(["train", "--resume", str(tmp_path / "half"), "train.max_steps=4", "eval.at_end=true"]) == 0
    assert _comparable(tmp_path / "half") == async0


def test_staleness_bound_holds_on_every_trained_sample(tiny_model_dir, tmp_path):
    extra = ["eval.at_start=false", "eval.at_end=false", "distributed.async_training=true",
             "distributed.max_staleness=1", "distributed.weight_sync_tokens=4", "run.save_every=0",
             "algo.offpolicy_correction=decoupled"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "eta1", 6, extra)]) == 0
    rows = _rows(tmp_path / "eta1")
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert max(r["async/staleness_max"] for r in rows) <= 1
    # batches really were started ahead of the trainer (else this test would prove nothing)
    assert any(r["async/started_at_version"] < r["step"] - 1 for r in rows), rows


@pytest.mark.skipif(os.environ.get("ROLLWISE_SKIP_RAY") == "1", reason="ROLLWISE_SKIP_RAY=1")
@pytest.mark.parametrize("strategy", ["uniform", "adaptive"])
def test_ray_workers_train_and_resume(tiny_model_dir, tmp_path, strategy):
    extra = ["eval.at_start=false", "eval.at_end=false", "distributed.backend=ray",
             "distributed.rollout_workers=2", "distributed.async_training=true", f"planner.strategy={strategy}"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "ray", 2, extra)]) == 0
    # the resumed part keeps its best weights: written by the trainer actor, which holds the weights
    assert main(["train", "--resume", str(tmp_path / "ray"), "train.max_steps=4", "eval.at_end=true",
                 "eval.save_best=true"]) == 0
    assert json.loads((tmp_path / "ray" / "checkpoints" / "best" / "best.json").read_text())["step"] == 4
    rows = _rows(tmp_path / "ray")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    if strategy == "uniform":  # the workers deliver exactly the plan: 4 prompts x 4 samples, every step
        assert all(r["rollout/rollouts"] == 16 for r in rows)
    else:  # adaptive probes some prompts with 2 samples, so a step's count varies
        assert all(0 < r["rollout/rollouts"] for r in rows) and all("planner/effective_ratio" in r for r in rows)
        assert any(r["rollout/rollouts"] != 16 for r in rows), "adaptive planned like uniform: the option was ignored"
    assert (tmp_path / "ray" / "checkpoints" / "step_000004").is_dir()


@pytest.mark.skipif(os.environ.get("ROLLWISE_SKIP_RAY") == "1", reason="ROLLWISE_SKIP_RAY=1")
def test_killed_ray_worker_is_restarted_and_loses_no_samples(tiny_model_dir, tmp_path):
    import ray
    import torch
    from ray_helpers import DyingStore

    from rollwise.distributed import RolloutPool, WorkerSpec
    from rollwise.models import load_model, load_tokenizer
    from rollwise.planner.base import Request

    cfg = build_config({"model": {"name_or_path": str(tiny_model_dir), "dtype": "float32"},
                        "rollout": {"max_completion_length": 48, "batch_size": 8},
                        "distributed": {"backend": "ray", "rollout_workers": 2, "weight_sync_tokens": 16}})
    tok = load_tokenizer(str(tiny_model_dir))
    prompts = {f"p{i}": tok(f"{i} + {i} =")["input_ids"] for i in range(6)}
    spec = WorkerSpec(cfg, str(tiny_model_dir), [tok.eos_token_id], tok.pad_token_id, prompts, seed=0)
    tests_dir = os.path.dirname(__file__)
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": tests_dir}})
    try:
        marker = tmp_path / "died"
        store = DyingStore(torch.float32, marker=str(marker), die_at=4)
        store.publish(load_model(str(tiny_model_dir)).state_dict(), 0)
        pool = RolloutPool(spec, store, "ray", 2)
        out = pool.generate([Request(uid, 4) for uid in prompts])
        assert marker.exists()  # a worker really died mid-round ...
        assert pool.restarts == 1  # ... was restarted ...
        assert sorted(out.groups) == sorted(prompts)  # ... and every requested sample came back
        assert all(len(v) == 4 for v in out.groups.values())
        assert all(o.versions == [0] * len(o.response_ids) for v in out.groups.values() for o in v)
        pool.close()
        # a worker that keeps dying stops the run with a clear error instead of looping forever
        marker2 = tmp_path / "died-again"
        store = DyingStore(torch.float32, marker=str(marker2), die_at=2, times=10)
        store.publish(load_model(str(tiny_model_dir)).state_dict(), 0)
        spec.cfg.distributed.max_worker_restarts = 1
        pool = RolloutPool(spec, store, "ray", 1)
        with pytest.raises(RuntimeError, match="max_worker_restarts=1"):
            pool.generate([Request(uid, 4) for uid in prompts])
        assert int(marker2.read_text()) == 2
        pool.close()
        # an ordinary exception in a worker reaches the caller as itself, not as Ray's remote traceback
        from ray_helpers import RaisingStore

        store = RaisingStore(torch.float32)
        store.publish(load_model(str(tiny_model_dir)).state_dict(), 0)
        pool = RolloutPool(spec, store, "ray", 1)
        with pytest.raises(ValueError, match=r"^weights unreadable \(a test's store\)$"):
            pool.generate([Request(uid, 4) for uid in prompts])
        pool.close()
    finally:
        ray.shutdown()


class _Store:
    """A weight store that publishes version 1 once the worker has asked `after` times."""

    def __init__(self, v0, v1, after):
        self.v0, self.v1, self.after, self.asked = v0, v1, after, 0

    def latest(self, loaded):
        self.asked += 1
        version, weights = (1, self.v1) if self.asked > self.after else (0, self.v0)
        return None if version <= loaded else (version, weights)


def test_a_worker_loads_weights_published_mid_round_and_tokens_carry_their_versions(tiny_model_dir):
    """Between chunks of distributed.weight_sync_tokens a worker takes newer weights: a response
    started under version 0 goes on under version 1, each token recording the version that drew it.
    rollout.partial_keep_kv keeps the earlier tokens' cache (computed under version 0) rather than
    computing it again under version 1, so what follows differs."""
    import torch

    from rollwise.distributed.worker import RolloutWorker, WorkerSpec
    from rollwise.models import load_model
    from rollwise.planner.base import Request

    v0 = load_model(str(tiny_model_dir)).state_dict()
    torch.manual_seed(0)
    v1 = {k: v + 0.3 * torch.randn_like(v) for k, v in v0.items()}
    logprobs = {}
    for keep_kv in (False, True):
        cfg = build_config({"model": {"dtype": "float32"},
                            "rollout": {"engine": "continuous", "max_completion_length": 12, "partial_keep_kv": keep_kv},
                            "distributed": {"async_training": True, "weight_sync_tokens": 4}})
        spec = WorkerSpec(cfg, str(tiny_model_dir), [10**6], 0, {"a": [5, 6, 7], "b": [9, 10]}, seed=0,
                          set_threads=False)
        worker = RolloutWorker(spec, _Store(v0, v1, after=2))  # asked at start and before the round
        out, stats = worker.generate([Request("a", 2), Request("b", 2)])
        outs = [o for grp in out.groups.values() for o in grp]
        # no end token: each runs to the cap; the first chunk is 4 sampled tokens in all, one per sequence
        assert len(outs) == 4 and all(o.versions == [0] + [1] * 11 for o in outs), [o.versions for o in outs]
        assert stats["version"] == 1 and stats["weight_updates"] == 2
        logprobs[keep_kv] = [o.logprobs for o in outs]
    assert logprobs[False] != logprobs[True]


class _CancellingStore(_Store):
    """Publishes nothing new; on its `at`-th question it cancels the worker (the run is stopping)."""

    def __init__(self, v0, at):
        super().__init__(v0, v0, after=10**9)
        self.at, self.worker = at, None

    def latest(self, loaded):
        got = super().latest(loaded)
        if self.asked == self.at:
            self.worker.cancel()
        return got


def test_a_cancelled_in_process_worker_stops_at_its_next_chunk(tiny_model_dir):
    """Ctrl-C (or an error) in the trainer of an asynchronous run with in-process workers cancels the
    pool: the producer's batch in flight stops within distributed.weight_sync_tokens tokens instead
    of running to its end while the user waits."""
    from rollwise.distributed.pool import RolloutPool
    from rollwise.distributed.worker import GenerationCancelled, WorkerSpec
    from rollwise.models import load_model
    from rollwise.planner.base import Request

    v0 = load_model(str(tiny_model_dir)).state_dict()
    cfg = build_config({"model": {"dtype": "float32"}, "rollout": {"engine": "continuous", "max_completion_length": 40},
                        "distributed": {"async_training": True, "weight_sync_tokens": 4}})
    spec = WorkerSpec(cfg, str(tiny_model_dir), [10**6], 0, {"a": [5, 6, 7]}, seed=0, set_threads=False)
    store = _CancellingStore(v0, at=3)  # asked at start, before the round, then after the first chunk
    pool = RolloutPool(spec, store)
    store.worker = pool.workers[0]
    with pytest.raises(GenerationCancelled):
        pool.generate([Request("a", 2)])
    assert store.asked == 3 and pool.step_tokens() == 0  # stopped after one chunk of the 80 tokens asked
    store.worker.cancelled = False
    out = pool.generate([Request("a", 2)])  # without the cancel the same round runs to its end
    assert sum(len(o.response_ids) for o in out.groups["a"]) == 80
    # a resume keeps counting worker restarts (async/worker_restarts) from where the run was
    pool.restarts = 2
    again = RolloutPool(spec, store)
    again.load_state_dict(pool.state_dict())
    assert again.restarts == 2


def test_the_async_loop_cancels_its_pool_when_the_trainer_fails(tiny_model_dir, tmp_path, monkeypatch):
    from rollwise.distributed import async_loop
    from rollwise.distributed.pool import RolloutPool

    cancelled = []
    monkeypatch.setattr(RolloutPool, "cancel", lambda self: cancelled.append(True))

    def fail(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(async_loop.Learner, "update", fail)
    extra = ["eval.at_start=false", "eval.at_end=false", "distributed.async_training=true",
             "distributed.max_staleness=1"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "stop", 4, extra)]) == 130  # Ctrl-C's code
    assert cancelled  # the producer was working on batch 2 when the trainer failed on batch 1
