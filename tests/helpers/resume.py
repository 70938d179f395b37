"""One resumability check for everything stateful: stop at batch k, restore, the rest is identical."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

import numpy as np


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
    def __iter__(self) -> Any: ...


def batch_ids(batches: Iterable[dict[str, Any]]) -> list[list[int]]:
    return [np.asarray(b["sample_id"]).tolist() for b in batches]


def assert_resumes_identically(make: Callable[[], Stateful], stop_after: int) -> None:
    """Consume ``stop_after`` batches, save, restore into a fresh object: the rest must match."""
    full = batch_ids(make())
    first = make()
    it = iter(first)
    head = [np.asarray(next(it)["sample_id"]).tolist() for _ in range(stop_after)]
    state = first.state_dict()
    restored = make()
    restored.load_state_dict(state)
    tail = batch_ids(restored)
    # Invariant: the resumed run yields exactly the batches the uninterrupted run had left
    assert head == full[:stop_after]
    assert tail == full[stop_after:]
