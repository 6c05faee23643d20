"""Defects found in a second audit of the asynchronous loop and the rollout workers (distributed/)."""

import sys
import types

import pytest
import torch

from rollwise.config import ConfigError, build_config
from rollwise.distributed import async_loop


def _gpu_cfg(workers, gpus, device="cuda"):
    return build_config({"model": {"device": device}, "rollout": {"engine": "continuous"},
                         "distributed": {"backend": "ray", "async_training": True, "rollout_workers": workers,
                                         "worker_gpus": gpus}})


def test_a_ray_run_whose_actors_cannot_all_get_a_gpu_stops_with_a_message(monkeypatch):
    """On a machine with one GPU, model.device=cuda with distributed.backend=ray: the trainer actor takes the
    whole GPU, so the rollout workers (distributed.worker_gpus=0.5 each) never get one and the run waited forever
    for them to start, without a word. A Ray this run started itself cannot grow: say so before any actor starts."""
    fake = types.ModuleType("ray")
    fake.cluster_resources = lambda: {"CPU": 16.0, "GPU": 1.0}
    fake.shutdown = fake.kill = lambda *a, **k: None

    def remote(*a, **k):
        raise AssertionError("an actor was created that cannot be scheduled with the others: the run would hang")

    fake.remote = remote
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setattr(async_loop, "require_ray", lambda: None)
    monkeypatch.setattr(async_loop, "init_ray", lambda address, num_cpus=None: True)
    monkeypatch.setattr(async_loop, "setup", lambda cfg, resume=None, with_trainer=True, log_start=True:
                        types.SimpleNamespace(cfg=cfg))
    with pytest.raises(ConfigError, match=r"needs 2 GPU\(s\) on this machine, Ray found 1.*backend=local"):
        async_loop.train_async(_gpu_cfg(2, 0.5))
    # what fits is let through; fractions pack as Ray packs them (three workers at 0.4 need two GPUs)
    assert async_loop.ray_gpus_needed(_gpu_cfg(2, 0.5)) == (1, 1)
    assert async_loop.ray_gpus_needed(_gpu_cfg(3, 0.4)) == (1, 2)
    assert async_loop.ray_gpus_needed(_gpu_cfg(2, 2)) == (1, 4)
    assert async_loop.ray_gpus_needed(_gpu_cfg(2, 0.0, device="cpu")) == (0, 0)
    fake.cluster_resources = lambda: {"CPU": 16.0, "GPU": 2.0}
    async_loop.check_ray_gpus(_gpu_cfg(2, 0.5))


def test_the_trainer_actor_is_killed_when_its_start_is_interrupted(monkeypatch, tmp_path):
    """Ctrl-C while the Ray trainer actor loads its model (or any error while waiting for it): the loop has no
    handle yet to kill in its `finally`, so the actor lived on with its CPUs and GPU where Ray outlives the run
    (distributed.ray_address), as the rollout workers once did."""
    import ray.exceptions  # noqa: F401 - the real module, which ray_get imports; `ray` itself is a stand-in

    handle, killed = types.SimpleNamespace(ready=types.SimpleNamespace(remote=lambda: "ref")), []
    fake = types.ModuleType("ray")
    fake.remote = lambda cls: types.SimpleNamespace(options=lambda **kw: types.SimpleNamespace(remote=lambda *a: handle))
    fake.kill = killed.append

    def get(ref, timeout=None):
        raise KeyboardInterrupt

    fake.get = get
    monkeypatch.setitem(sys.modules, "ray", fake)
    cfg = build_config({"distributed": {"backend": "ray"}})
    run = types.SimpleNamespace(cfg=cfg, model_path=str(tmp_path), tokenizer=types.SimpleNamespace(pad_token_id=0),
                                run_dir=tmp_path, checkpoint=None, state=None)
    with pytest.raises(KeyboardInterrupt):
        async_loop._make_learner(run, store=None)
    assert killed == [handle]


def test_a_worker_ray_restarted_draws_a_fresh_random_stream(monkeypatch, tiny_model_dir):
    """A rollout worker that Ray restarted after a crash was built from its spec's seed again: it drew the same random
    numbers as its first start, so its samples repeated the start's draws."""
    from rollwise.config import load_config
    from rollwise.distributed import worker as worker_mod
    from rollwise.distributed.store import LocalWeightStore

    cfg = load_config(None, [f"model.name_or_path={tiny_model_dir}", "model.dtype=float32"])
    spec = worker_mod.WorkerSpec(cfg, str(tiny_model_dir), [1], 0, {}, seed=7, set_threads=False)

    def first_draws(restarted: bool):
        monkeypatch.setattr(worker_mod, "restarted_by_ray", lambda: restarted)
        w = worker_mod.RolloutWorker(spec, LocalWeightStore(torch.float32))
        return torch.rand(4, generator=w.engine.generator)

    assert torch.equal(first_draws(False), first_draws(False))  # a first start follows its seed
    assert not torch.equal(first_draws(False), first_draws(True))
    monkeypatch.undo()
    assert worker_mod.restarted_by_ray() is False  # outside a Ray actor
