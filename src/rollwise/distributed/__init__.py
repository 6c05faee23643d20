"""Rollout workers and the asynchronous loop.

* `store`: where the trainer publishes weights and workers pick them up (in process, or a Ray actor);
* `worker`: one rollout worker (an engine plus the rollout executor), run in process or as a Ray actor;
* `pool`: the workers behind the executor's interface, restarted by Ray when one dies;
* `learner`: the trainer side (update, publish, checkpoint), in process or as a Ray actor;
* `async_loop`: generation and training at once, with AReaL's staleness bound.
"""

from rollwise.distributed.pool import RolloutPool
from rollwise.distributed.store import LocalWeightStore, RayWeightStore
from rollwise.distributed.worker import RolloutWorker, WorkerSpec

__all__ = ["LocalWeightStore", "RayWeightStore", "RolloutPool", "RolloutWorker", "WorkerSpec"]
