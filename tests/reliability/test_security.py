"""Security: nothing is unpickled unless asked, and every ``np.load`` or ``read_array`` says so explicitly."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import shardload

PACKAGE = Path(shardload.__file__).parent


def test_every_np_load_passes_allow_pickle_explicitly() -> None:
    # numpy's default has changed before; each call must state its choice.
    calls = []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        for m in re.finditer(r"np\.load\(|\bread_array\(", text):
            depth, i = 1, m.end()
            while depth and i < len(text):
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                i += 1
            calls.append((path.relative_to(PACKAGE), text[m.start() : i]))
    assert calls
    for where, call in calls:
        assert "allow_pickle=" in call, f"{where}: {call}"
        # on the read path of a shard set (not prepare's user-controlled sources) it is always False
        if not str(where).startswith("prepare"):
            assert "allow_pickle=False" in call, f"{where}: {call}"


def test_no_pickle_loads_outside_the_opt_in_path() -> None:
    hits = [
        (str(p.relative_to(PACKAGE)), line.strip())
        for p in PACKAGE.rglob("*.py")
        for line in p.read_text().splitlines()
        if re.search(r"\bpickle\.loads?\(|\bmarshal\.loads?\(|(?<![.\w])eval\(", line)
        and not line.lstrip().startswith("#")
    ]
    # The one pickle.loads is WebDataset's .pyd/.pickle members, behind allow_pickle.
    assert [h[0] for h in hits] == ["prepare/sources/webdataset.py"], hits


def test_npy_object_array_is_refused_without_allow_pickle(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.array([{"x": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(shardload.InputError, match=r"a\.npy: holds a pickled object array.*--allow-pickle"):
        shardload.prepare(tmp_path / "a.npy", tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_pickled_lengths_index_is_refused(tmp_path: Path) -> None:
    shardload.write([{"t": np.arange(3)}], tmp_path / "s", progress=False)
    np.save(tmp_path / "s" / "lengths.npy", np.array([3], dtype=object), allow_pickle=True)
    with pytest.raises(shardload.ManifestError, match="lengths index is unreadable"):
        _ = shardload.open(tmp_path / "s").lengths
