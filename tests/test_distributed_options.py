"""The distributed options reach Ray and vLLM as written: a stand-in `ray` (and vLLM engine) module
records the calls, so these run without starting a cluster or needing a GPU. That Ray really runs
the workers is tested in test_async.py."""

import sys
import types

import pytest
import ray.exceptions  # the real module: the stand-in `ray` below has no exceptions of its own

from rollwise.config import build_config, load_config, unused_settings
from rollwise.distributed.pool import RolloutPool, init_ray, ray_get
from rollwise.distributed.worker import WorkerSpec
from rollwise.errors import RolloutWorkerError


class _Handle:
    def __init__(self):
        from rollwise.engine.executor import RoundOutput

        self.ping = types.SimpleNamespace(remote=lambda: 0)
        self.generate = types.SimpleNamespace(
            remote=lambda parts, first: (RoundOutput({}, {}), {"tokens": 3, "incarnation": 0}))


def _fake_ray(calls):
    ray = types.ModuleType("ray")
    ray.is_initialized = lambda: False
    ray.init = lambda **kw: calls.append(("init", kw))
    ray.get = lambda refs, timeout=None: calls.append(("get", timeout)) or list(refs)

    def remote(cls):
        def options(**kw):
            calls.append(("options", kw))
            return types.SimpleNamespace(remote=lambda spec, store: calls.append(("actor", spec.seed)) or _Handle())
        return types.SimpleNamespace(options=options)

    ray.remote = remote
    return ray


def test_ray_address_joins_that_cluster_and_no_address_starts_one(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # init_ray sets it when unset: keep it out of later tests
    calls = []
    monkeypatch.setitem(sys.modules, "ray", _fake_ray(calls))
    assert init_ray("ray://head:10001") is True
    assert init_ray(None, num_cpus=6) is True
    assert calls[0] == ("init", {"address": "ray://head:10001", "log_to_driver": False})
    assert calls[1][1]["num_cpus"] == 6 and "address" not in calls[1][1]


def test_worker_threads_and_gpus_are_what_ray_reserves_per_worker(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "ray", _fake_ray(calls))
    cfg = build_config({"distributed": {"backend": "ray", "worker_threads": 3, "worker_gpus": 0.25,
                                        "max_worker_restarts": 5, "rollout_workers": 2, "worker_timeout": 42}})
    spec = WorkerSpec(cfg, "model", [0], 0, {}, seed=11)
    pool = RolloutPool(spec, store=None, backend="ray", num_workers=2)
    options = [kw for what, kw in calls if what == "options"]
    assert options == [{"num_cpus": 3, "num_gpus": 0.25, "max_restarts": 5, "max_task_retries": -1}]
    assert [seed for what, seed in calls if what == "actor"] == [11, 11 + 7919]  # each worker its own seed
    assert len(pool.workers) == 2
    from rollwise.planner.base import Request

    pool.generate([Request("a", 2), Request("b", 2)])
    assert calls[-1] == ("get", 42.0) and pool.step_tokens() == 6  # distributed.worker_timeout bounds a round


def test_a_dead_or_silent_ray_actor_is_an_error_that_says_how_to_resume():
    def dead():
        raise ray.exceptions.ActorDiedError()

    def silent():
        raise ray.exceptions.GetTimeoutError("Get timed out: some object(s) not ready.")

    with pytest.raises(RolloutWorkerError, match=r"^the trainer died \(The actor died unexpectedly.*--resume RUN_DIR"):
        ray_get(dead, "the trainer")
    with pytest.raises(RolloutWorkerError, match=r"did not answer in time.*worker_timeout=30 bounds it\. Resume"):
        ray_get(silent, "a rollout worker", "distributed.worker_timeout=30 bounds it. ")
    assert ray_get(lambda: 5, "x") == 5

    class InitFailed(ray.exceptions.ActorDiedError):
        actor_init_failed = True  # Ray's property: the actor's constructor raised

        def __str__(self):
            return ("The actor died because of an error raised in its creation task, ray::TrainerActor.__init__()\n"
                    "  File ...\nCheckpointError: checkpoint runs/x/step_000004: state.pt cannot be read\n")

    def init_failed():
        raise InitFailed()

    with pytest.raises(RolloutWorkerError, match=r"^the trainer could not start: CheckpointError: .*state.pt") as got:
        ray_get(init_failed, "the trainer")
    assert "--resume" not in str(got.value)  # a resume would fail the same way


def test_worker_options_warn_where_they_do_nothing():
    got = unused_settings(load_config(None, ["distributed.worker_gpus=0.5", "distributed.backend=ray"]))
    assert got == ["distributed.worker_gpus=0.5 has no effect: it is read only with distributed.backend=ray and a GPU "
                   "engine (model.device=cuda or rollout.engine=vllm)"]
    assert unused_settings(load_config(None, ["distributed.worker_gpus=0.5", "distributed.backend=ray",
                                              "model.device=cuda"])) == []
    assert unused_settings(load_config(None, ["distributed.worker_timeout=60"]))[0].startswith(
        "distributed.worker_timeout=60.0 has no effect")


def test_vllm_gets_its_memory_share_and_context_length(monkeypatch):
    from test_context_length import _vllm_args  # the engine's arguments, with a stand-in vLLM

    cfg = {"rollout": {"engine": "vllm", "vllm_gpu_memory_utilization": 0.55, "max_completion_length": 100},
           "data": {"max_prompt_length": 60}}
    assert _vllm_args(monkeypatch, cfg)[-2:] == (0.55, 160)


def test_ray_workers_with_a_gpu_engine_must_reserve_a_gpu():
    """Ray hides the GPUs from an actor that reserves none: the workers would fail to start on cuda."""
    from rollwise.config import ConfigError, build_config

    for gpu in ({"model": {"device": "cuda"}}, {"rollout": {"engine": "vllm"}}):
        with pytest.raises(ConfigError, match="needs distributed.worker_gpus > 0"):
            build_config({"distributed": {"backend": "ray"}, **gpu})
        assert build_config({"distributed": {"backend": "ray", "worker_gpus": 0.5}, **gpu}).distributed.worker_gpus == 0.5
