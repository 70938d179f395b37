"""A prepared set's samples back in input order, read through ``origin.npy`` (docs/format.md, "Sample origins")."""

from __future__ import annotations

from collections import Counter
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


def in_origin_order(out: Path, field: str = "input_ids") -> list[Any]:
    """The samples ordered by what ``ShardSet.origin`` says of each: its record, then its piece of it."""
    ds = shardload.open(out)
    origins = [ds.origin(i) for i in range(len(ds))]
    records = Counter((o.file or "", o.position) for o in origins)
    # Invariant: a record's pieces are numbered 0 .. pieces - 1, and it has that many samples
    for o in origins:
        assert o.piece is not None and o.pieces is not None and 0 <= o.piece < o.pieces, o
        assert records[(o.file or "", o.position)] == o.pieces, (o, records[(o.file or "", o.position)])
    place = {i: (o.file or "", o.position, o.piece) for i, o in enumerate(origins)}
    return [ds[i][field] for i in sorted(place, key=place.__getitem__)]
