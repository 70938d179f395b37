"""The pieces of a record as ``origins.arrow`` and ``origin.npy`` tell them, where prepare did not record them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from shardload.formats.origin import read_origin, write_set_origins


def test_samples_staged_by_an_older_shardload_have_no_piece(tmp_path: Path) -> None:
    chunk = tmp_path / "chunk.arrow"  # a staged chunk with no .origins beside it, as an older run left it
    table = pa.table({"tokens": pa.array([1, 2, 3])})
    with pa.OSFile(str(chunk), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    order = np.array([2, 0, 1], np.int64)
    write_set_origins(tmp_path, [chunk], order)
    np.save(tmp_path / "origin.npy", order)
    origins = [read_origin(tmp_path, i, 3, mapped=True) for i in range(3)]
    # Invariant: no piece is made up for a sample whose record is not known
    assert {(o.kind, o.piece, o.pieces) for o in origins} == {("other", None, None)}
    assert str(origins[0]).startswith("not recorded (staged by an older shardload: chunk.arrow)")
