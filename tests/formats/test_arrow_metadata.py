"""The Arrow shard's schema metadata: the keys docs/format.md names, readable with plain pyarrow."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

import shardload
from shardload.testing import synthetic_samples

ROOT = Path(__file__).resolve().parents[2]


def test_a_shard_carries_exactly_the_metadata_keys_the_format_documents(tmp_path: Path) -> None:
    out = tmp_path / "set"
    shardload.write(synthetic_samples(20, seed=1), out, num_shards=2, progress=False)
    # the on-disk format of 0.1.0, which sets already prepared hold: these names never change with the code
    keys = {b"shardload.schema", b"shardload.shard"}
    text = " ".join((ROOT / "docs" / "format.md").read_text().split())
    assert "The Arrow schema metadata key `shardload.schema` repeats the shardload schema" in text
    for shard in sorted((out / "shards").glob("*.arrow")):
        with pa.memory_map(str(shard)) as source:
            metadata = pa.ipc.open_file(source).schema.metadata
        # Invariant: the key names are part of the on-disk format (plain pyarrow readers look them up)
        assert set(metadata) == keys
        assert json.loads(metadata[b"shardload.schema"])["fields"]
        assert json.loads(metadata[b"shardload.shard"])["set_id"] == shardload.open(out).manifest.set_id
