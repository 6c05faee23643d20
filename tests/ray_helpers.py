"""Imported inside Ray worker processes by tests/test_async.py (on their PYTHONPATH)."""

import os
from pathlib import Path

from rollwise.distributed.store import RayWeightStore


class DyingStore(RayWeightStore):
    """A weight store whose `die_at`-th poll kills the calling worker process, once per marker file:
    the worker dies between two chunks of generation, with sequences in flight."""

    calls = 0

    def __init__(self, dtype, handle=None, marker="", die_at=3):
        super().__init__(dtype, handle)
        self.marker, self.die_at = marker, die_at

    def latest(self, known):
        DyingStore.calls += 1
        if DyingStore.calls >= self.die_at and not Path(self.marker).exists():
            Path(self.marker).write_text(str(os.getpid()))
            os._exit(1)
        return super().latest(known)

    def __reduce__(self):
        return (DyingStore, (self.dtype, self.handle, self.marker, self.die_at))
