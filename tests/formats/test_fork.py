"""A shard reader closed in a process forked from the one that opened it leaves nothing mapped.

Loader workers are forked from a process that may have just opened shards; a worker closes its copies
(see ``ReaderPool.forget_inherited`` in shardload/sets/_readers.py) so that a shard the node cache
deletes frees its space. pyarrow
reads an IPC file's footer through its I/O threads, which hold the file's map for a moment after the
open returns: a process forked in that moment inherits the hold from a thread it does not have, and
can never unmap the file. The race is short, so the test forks right after each of many opens.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import shardload
from shardload.formats import get_format
from shardload.formats.zarr import ZarrOptions

FORKS = 150  # at ~5% of forks leaking (pyarrow 26, reading from the map), a leak shows up in all but ~1e-3 of runs


def _mapped(path: Path) -> bool:
    with open("/proc/self/maps") as fh:
        return any(str(path) in line for line in fh)


@pytest.mark.skipif(not Path("/proc/self/maps").exists() or not hasattr(os, "fork"), reason="needs Linux /proc")
@pytest.mark.parametrize("shard_format", ["arrow", "zarr"])
def test_a_reader_closed_in_a_forked_child_unmaps_its_shard(tmp_path: Path, shard_format: str) -> None:
    samples = ({"tokens": np.arange(i % 50 + 1, dtype=np.int32)} for i in range(300))
    fmt = ZarrOptions() if shard_format == "zarr" else "arrow"
    shardload.write(samples, tmp_path / "set", num_shards=1, shard_format=fmt)
    ss = shardload.open(tmp_path / "set")
    path = ss.path / ss.manifest.shards[0].file
    reader_cls = get_format(ss.manifest.shard_format).reader
    leaked = 0
    for _ in range(FORKS):
        reader = reader_cls(path, ss.schema, samples=len(ss), options=ss.manifest.options)
        assert reader.columns().num_samples == len(ss)
        pid = os.fork()
        if pid == 0:  # the child: close its copy, as a worker does, and say whether the file is still mapped
            code = 1
            try:
                reader.close()
                code = 3 if _mapped(path) else 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        assert code in (0, 3), f"the forked child failed (exit {code})"
        leaked += code == 3
        reader.close()
    assert leaked == 0, f"{leaked} of {FORKS} forked children could not unmap {path}"
