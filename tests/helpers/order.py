"""A prepared set's samples back in input order, read through ``origin.npy`` (docs/format.md, "Sample origins")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import shardload


def in_input_order(out: Path, field: str = "input_ids") -> list[Any]:
    """Every sample's ``field``, placed at its position in the input order (a split record's pieces in order)."""
    ds = shardload.open(out)
    origin = np.load(out / "origin.npy")
    found: list[Any] = [None] * len(ds)
    for i in range(len(ds)):
        found[int(origin[i])] = ds[i][field]
    return found
