"""What docs/quickstart.md says of sample ids and the input order, checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import shardload


@pytest.mark.parametrize("shuffle", [True, False])
def test_sample_ids_follow_the_input_only_without_shuffle(tmp_path: Path, shuffle: bool) -> None:
    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps({"tokens": [i] * (1 + i % 7)}) + "\n" for i in range(300)))
    out = tmp_path / "out"
    shardload.prepare([src], out, num_shards=3, shuffle=shuffle)
    s = shardload.ShardSet(out)
    lines = [s.origin(i).position for i in range(len(s))]
    # whatever the order, origin() names each record once, and the sample holds that record's values
    assert sorted(lines) == list(range(1, 301))  # type: ignore[type-var]
    for i in (0, 17, 299):
        line = lines[i]
        assert line is not None
        assert s[i]["tokens"].tolist() == [line - 1] * (1 + (line - 1) % 7)
    assert (lines == sorted(lines)) is (not shuffle)  # type: ignore[type-var]
