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
        if DyingStore.calls >= self.die_at and self._claim_death():
            os._exit(1)
        return super().latest(known)

    def _claim_death(self):
        """Take one of the `times` deaths atomically: two workers polling at the same moment must
        not both read "no death yet" and both die (CI once saw two restarts for `times=1`)."""
        for i in range(self.times):
            try:
                os.close(os.open(f"{self.marker}.{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                continue
            Path(self.marker).write_text(str(i + 1))
            return True
        return False

    def __reduce__(self):
        return (DyingStore, (self.dtype, self.handle, self.marker, self.die_at, self.times))


class RaisingStore(RayWeightStore):
    """A weight store that raises an ordinary exception on a worker's second poll (the first is
    the worker's start): an error of the worker's own, not a dead process."""

    calls = 0

    def latest(self, known):
        RaisingStore.calls += 1
        if RaisingStore.calls >= 2:
            raise ValueError("weights unreadable (a test's store)")
        return super().latest(known)

    def __reduce__(self):
        return (RaisingStore, (self.dtype, self.handle))
