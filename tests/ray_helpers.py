"""Imported inside Ray worker processes by tests/test_async.py (on their PYTHONPATH)."""

import os
from pathlib import Path

from rollwise.distributed.store import RayWeightStore


class DyingStore(RayWeightStore):
    """A weight store whose `die_at`-th poll in a worker process kills that process, `times` times
    in all (counted in the marker file): the worker dies between two chunks of generation, with
    sequences in flight."""

    calls = 0

    def __init__(self, dtype, handle=None, marker="", die_at=3, times=1):
        super().__init__(dtype, handle)
        self.marker, self.die_at, self.times = marker, die_at, times

    def latest(self, known):
        DyingStore.calls += 1
        deaths = int(Path(self.marker).read_text()) if Path(self.marker).exists() else 0
        if DyingStore.calls >= self.die_at and deaths < self.times:
            Path(self.marker).write_text(str(deaths + 1))
            os._exit(1)
        return super().latest(known)

    def __reduce__(self):
        return (DyingStore, (self.dtype, self.handle, self.marker, self.die_at, self.times))
