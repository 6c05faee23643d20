"""Defects found in a third audit of the asynchronous loop and the rollout workers (distributed/)."""

import json
import os
import sys
import time
import types

import pytest

from rollwise.config import build_config
from rollwise.distributed.pool import RolloutPool
from rollwise.distributed.worker import WorkerSpec
from rollwise.engine.executor import RoundOutput
from rollwise.planner.base import Request


class _Worker:
    """A stand-in Ray actor handle: answers from `incarnation`, which the test changes to play a restart."""

    def __init__(self, actor_id):
        self._actor_id = types.SimpleNamespace(hex=lambda: actor_id)
        self.incarnation = "first"
        self.ping = types.SimpleNamespace(remote=lambda: self.incarnation)
        self.state_dict = types.SimpleNamespace(remote=lambda: {"engine": {}, "executor": {}})
        self.generate = types.SimpleNamespace(
            remote=lambda parts, first: (RoundOutput({}, {}), {"tokens": 1, "incarnation": self.incarnation}))


def _fake_ray_pool(monkeypatch, num_workers=1):
    """A backend=ray pool whose actors are `_Worker`s and whose control store holds `restarts` per actor."""
    import ray.exceptions  # noqa: F401 - the real module, which ray_get imports; `ray` itself is a stand-in

    workers, restarts = [], {}
    fake = types.ModuleType("ray")
    fake.get = lambda refs, timeout=None: list(refs)
    fake.kill = lambda handle: None

    def new_actor(spec, store):
        workers.append(_Worker(f"actor{len(workers)}"))
        restarts[workers[-1]._actor_id.hex()] = 0
        return workers[-1]

    fake.remote = lambda cls: types.SimpleNamespace(
        options=lambda **kw: types.SimpleNamespace(remote=new_actor))
    state = types.ModuleType("ray._private.state")
    state.actors = lambda actor_id: {"ActorID": actor_id, "NumRestarts": restarts[actor_id]}
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setitem(sys.modules, "ray._private.state", state)
    cfg = build_config({"distributed": {"backend": "ray", "rollout_workers": num_workers}})
    pool = RolloutPool(WorkerSpec(cfg, "model", [0], 0, {}, seed=0), store=None, backend="ray",
                       num_workers=num_workers)
    return pool, workers, restarts


def test_several_ray_restarts_of_one_worker_within_a_round_all_count(monkeypatch):
    """A worker that dies three times within one round (each retry of the interrupted call dies again) is
    restarted three times by Ray, which counts each against distributed.max_worker_restarts; only the last
    process answers, so the pool saw one new incarnation and counted one restart (async/worker_restarts)."""
    pool, workers, restarts = _fake_ray_pool(monkeypatch, num_workers=2)
    pool.generate([Request("a", 2), Request("b", 2)])
    assert pool.restarts == 0
    workers[0].incarnation, restarts["actor0"] = "fourth", 3  # died three times during this round
    pool.generate([Request("a", 2), Request("b", 2)])
    assert pool.restarts == 3
    workers[0].incarnation, restarts["actor0"] = "fifth", 4  # once more, a later round: one more
    workers[1].incarnation, restarts["actor1"] = "second", 1
    pool.generate([Request("a", 2), Request("b", 2)])
    assert pool.restarts == 5
    pool.generate([Request("a", 2), Request("b", 2)])  # nothing new: nothing counted
    assert pool.metrics()["async/worker_restarts"] == 5.0
    # a worker that died again just after answering: Ray's count already holds that restart when the new
    # incarnation is first seen, and the process that next answers is the one it counted, not one more
    workers[1].incarnation, restarts["actor1"] = "third", 3
    pool.generate([Request("a", 2), Request("b", 2)])
    workers[1].incarnation = "fourth"
    pool.generate([Request("a", 2), Request("b", 2)])
    assert pool.restarts == 7


def test_a_ray_without_the_restart_table_counts_one_per_new_incarnation(monkeypatch):
    pool, workers, restarts = _fake_ray_pool(monkeypatch)

    def unreadable(actor_id):
        raise RuntimeError("no such table")

    sys.modules["ray._private.state"].actors = unreadable
    workers[0].incarnation = "second"
    pool.generate([Request("a", 2)])
    assert pool.restarts == 1


def test_a_restart_noticed_at_the_checkpoint_is_in_the_checkpoints_count(monkeypatch):
    """A worker that died while idle (or while answering for the checkpoint) shows its new incarnation only
    when it next generates; a resume starts new workers, so a restart not counted by the checkpoint was
    never counted in async/worker_restarts, which counts the whole run, resumes included."""
    pool, workers, restarts = _fake_ray_pool(monkeypatch)
    pool.generate([Request("a", 2)])
    workers[0].incarnation, restarts["actor0"] = "second", 1
    assert pool.state_dict()["restarts"] == 1


@pytest.mark.skipif(os.environ.get("ROLLWISE_SKIP_RAY") == "1", reason="ROLLWISE_SKIP_RAY=1")
def test_a_ray_worker_that_dies_three_times_in_one_round_counts_three_restarts(tiny_model_dir, tmp_path):
    import ray
    import torch
    from ray_helpers import DyingStore

    from rollwise.models import load_model, load_tokenizer

    cfg = build_config({"model": {"name_or_path": str(tiny_model_dir), "dtype": "float32"},
                        "rollout": {"max_completion_length": 8, "batch_size": 4},
                        "distributed": {"backend": "ray", "rollout_workers": 1, "max_worker_restarts": 3}})
    tok = load_tokenizer(str(tiny_model_dir))
    prompts = {f"p{i}": tok(f"{i} + {i} =")["input_ids"] for i in range(2)}
    spec = WorkerSpec(cfg, str(tiny_model_dir), [tok.eos_token_id], tok.pad_token_id, prompts, seed=0)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.path.dirname(__file__)}})
    try:
        marker = tmp_path / "died"
        # each process polls the store at its start (1) and at the round's start (2), where it dies, 3 times in all
        store = DyingStore(torch.float32, marker=str(marker), die_at=2, times=3)
        store.publish(load_model(str(tiny_model_dir)).state_dict(), 0)
        pool = RolloutPool(spec, store, "ray", 1)
        out = pool.generate([Request(uid, 2) for uid in prompts])
        assert int(marker.read_text()) == 3  # three deaths, all within this one round ...
        assert pool.restarts == 3  # ... are three restarts of the three distributed.max_worker_restarts
        assert all(len(out.groups[uid]) == 2 for uid in prompts)  # and nothing was lost
        state = pool.state_dict()  # the checkpoint's count: the same three, not counted again
        assert state["restarts"] == 3 and len(state["workers"]) == 1
        pool.close()
    finally:
        ray.shutdown()


def hangs(completion: str, item) -> float:
    """A reward function that never returns (loaded by the reward worker as test_distributed_audit3:hangs)."""
    time.sleep(600)
    return 0.0


def _async_args(tiny_model_dir, tmp_path, name, steps, extra=()):
    from test_e2e import _args

    return _args(tiny_model_dir, tmp_path, name, steps, ["eval.at_start=false", "eval.at_end=false",
                                                         "distributed.async_training=true", *extra])


def test_an_error_in_a_rollout_worker_stops_the_async_run_with_that_error(tiny_model_dir, tmp_path, monkeypatch):
    """An in-process worker whose engine fails on the producer's second batch: the trainer raises that error
    (not "the producer stopped", not a hang) after training the first batch."""
    from rollwise.cli import main
    from rollwise.engine.executor import RolloutExecutor

    calls, generate = [], RolloutExecutor.generate

    def breaks(self, *a, **kw):
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("the engine broke (a test's)")
        return generate(self, *a, **kw)

    monkeypatch.setattr(RolloutExecutor, "generate", breaks)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"^the engine broke \(a test's\)$"):
        main(["train", *_async_args(tiny_model_dir, tmp_path, "broken", 4, ["distributed.max_staleness=1"])])
    assert time.monotonic() - t0 < 120


def test_a_hanging_reward_function_stops_the_async_run_with_a_message(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """The producer thread scores; a reward function that hangs times out call after call (reward.timeout), and
    the run stops with the reward worker's error instead of waiting on it or training on its zeros."""
    from rollwise.cli import main
    from rollwise.rewards import runner as runner_mod

    monkeypatch.setattr(runner_mod, "FAILING_IN_A_ROW", 2)
    args = _async_args(tiny_model_dir, tmp_path, "hang", 4, ["distributed.max_staleness=1", "reward.timeout=0.2"])
    args = [a for a in args if not a.startswith("reward.functions=")]
    assert main(["train", *args, "reward.functions=[{name: 'test_distributed_audit3:hangs'}]"]) == 2
    err = capsys.readouterr().err
    assert "hangs failed on 2 calls in a row" in err and "reward.timeout=0.2" in err, err
    assert not (tmp_path / "hang" / "checkpoints" / "step_000002").exists()


def test_every_batch_is_trained_once_and_the_counts_add_up_across_a_resume(tiny_model_dir, tmp_path):
    """Batches run two versions ahead of the trainer (max_staleness=2), a checkpoint every 2 steps, the run
    stopped at step 3 and resumed to 6: each step is trained once, in order, within the bound, and the totals
    are the sums of the steps' rollouts and tokens."""
    from rollwise.cli import main

    # dapo discards groups whose samples all score alike and asks for more: a round's samples are not all trained
    extra = ["distributed.max_staleness=2", "distributed.weight_sync_tokens=4", "algo.offpolicy_correction=decoupled",
             "planner.strategy=dapo"]
    args = [a for a in _async_args(tiny_model_dir, tmp_path, "eta2", 3, extra) if not a.startswith("reward.functions=")]
    assert main(["train", *args, "reward.functions=[{name: 'rewards_for_tests:has_digit'}]"]) == 0
    assert main(["train", "--resume", str(tmp_path / "eta2"), "train.max_steps=6"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "eta2" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "rollout/reward_mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert all(r["async/staleness_max"] <= 2 for r in rows)
    assert sum(r["rollout/rollouts"] for r in rows) == rows[-1]["rollout/rollouts_total"]
    assert all(r["rollout/rollouts"] == r["planner/trained_samples"] + r["rollout/discarded_rollouts"] for r in rows)
    assert sum(r["rollout/tokens"] for r in rows) == rows[-1]["rollout/tokens_total"]
    assert all(r["rollout/tokens"] == r["rollout/generated_tokens"] for r in rows)
