"""Where the trainer publishes weights (tagged with a version) and rollout workers fetch them.

`latest(known)` returns (version, state dict) when something newer than `known` was
published, else None; workers call it between chunks of generation, so it must be cheap
when nothing changed.
"""

from __future__ import annotations

import threading
from typing import Any

import torch


def _snapshot(state_dict: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A copy in the engine's dtype: the trainer goes on updating its own tensors in place."""
    return {k: v.detach().to(dtype=dtype, copy=True) for k, v in state_dict.items()}


class LocalWeightStore:
    """In-process store for rollout workers that are threads of this process."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        self.dtype = dtype
        self._lock = threading.Lock()
        self._version = -1
        self._weights: dict[str, torch.Tensor] | None = None

    def publish(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        snap = _snapshot(state_dict, self.dtype)
        with self._lock:
            self._version, self._weights = version, snap

    def latest(self, known: int) -> tuple[int, dict[str, torch.Tensor]] | None:
        with self._lock:
            if self._version <= known or self._weights is None:
                return None
            return self._version, self._weights

    @property
    def version(self) -> int:
        return self._version


class _StoreActor:
    """Holds the object-store reference of the newest weights (boxed in a list so Ray does not resolve it)."""

    def __init__(self) -> None:
        self.version, self.boxed = -1, None

    def set(self, boxed: list[Any], version: int) -> None:
        self.version, self.boxed = version, boxed

    def latest(self, known: int) -> tuple[int, list[Any]] | None:
        return None if self.version <= known or self.boxed is None else (self.version, self.boxed)


class RayWeightStore:
    """Weights travel through Ray's object store; a small actor remembers the newest reference.

    The object is shared by every worker on a node (one copy per node, not one per worker).
    Picklable: workers receive the store in their constructor and call `latest`."""

    def __init__(self, dtype: torch.dtype = torch.float32, handle: Any = None) -> None:
        import ray

        self.dtype = dtype
        self.handle = handle if handle is not None else ray.remote(num_cpus=0)(_StoreActor).remote()
        self._version = -1

    def publish(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        import ray

        ref = ray.put(_snapshot(state_dict, self.dtype))
        ray.get(self.handle.set.remote([ref], version))
        self._version = version

    def latest(self, known: int) -> tuple[int, dict[str, torch.Tensor]] | None:
        import ray

        got = ray.get(self.handle.latest.remote(known))
        if got is None:
            return None
        version, (ref,) = got
        return version, ray.get(ref)

    @property
    def version(self) -> int:
        return self._version

    def __reduce__(self) -> tuple[Any, ...]:
        return (RayWeightStore, (self.dtype, self.handle))
