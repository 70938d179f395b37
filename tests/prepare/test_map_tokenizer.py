"""A real tokenizer as the map of prepare: HF ``tokenizers``, trained here on a small corpus (nothing is downloaded).

The map turns ``{"text": ...}`` into ``{"input_ids": int32 array}``, drops empty
texts and splits long ones into pieces of at most ``MAX_TOKENS``; it is used
through ``shardload.write`` and through ``shardload prepare --map`` with two
worker processes, run from the directory that holds the map's module.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

import shardload
from tests.distributed.watchdog import python, run_with_watchdog
from tests.helpers.order import in_input_order, in_origin_order

from .conftest import corpus

MAX_TOKENS = 16

#: the map's module, as a user would write it: the tokenizer is loaded once per process, on first use
MODULE = """
import functools

import numpy as np
from tokenizers import Tokenizer

MAX_TOKENS = {max_tokens}


@functools.cache
def tokenizer():
    return Tokenizer.from_file({path!r})


def encode(sample):
    text = sample["text"]
    if not isinstance(text, str):  # JSON Lines of UTF-8 byte values (until readers pass strings through)
        text = np.asarray(text).astype(np.uint8).tobytes().decode("utf-8")
    if not text.strip():
        return None
    ids = np.asarray(tokenizer().encode(text).ids, dtype=np.int32)
    return [{{"input_ids": ids[i : i + MAX_TOKENS]}} for i in range(0, len(ids), MAX_TOKENS)]
"""


@pytest.fixture
def map_dir(tmp_path: Path, tokenizer_file: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory holding the map's module ``tokmap.py``, importable while the test runs."""
    d = tmp_path / "job"
    d.mkdir()
    (d / "tokmap.py").write_text(MODULE.format(path=str(tokenizer_file), max_tokens=MAX_TOKENS))
    monkeypatch.setattr(sys, "path", [str(d), *sys.path])
    monkeypatch.delitem(sys.modules, "tokmap", raising=False)
    return d


def expected(texts: list[str], tokenizer_file: Path) -> list[np.ndarray]:
    """The pieces the map must make of ``texts``, in input order, tokenized here directly."""
    tok = Tokenizer.from_file(str(tokenizer_file))
    out = []
    for text in texts:
        ids = tok.encode(text).ids if text.strip() else []
        out += [np.asarray(ids[i : i + MAX_TOKENS], dtype=np.int32) for i in range(0, len(ids), MAX_TOKENS)]
    return out


def test_tokenize_while_writing(tmp_path: Path, map_dir: Path, tokenizer_file: Path) -> None:
    from tokmap import encode  # type: ignore[import-not-found]

    texts = corpus(60, 1)
    result = shardload.write(({"text": t} for t in texts), tmp_path / "s", map=encode, num_shards=2)
    want = expected(texts, tokenizer_file)
    assert result.dropped == sum(not t.strip() for t in texts) > 0
    assert result.samples == len(want) > len(texts) - result.dropped  # some texts were split
    ds = shardload.open(tmp_path / "s")
    assert ds.schema.names == ("input_ids",) and ds.schema.field("input_ids").dtype == "int32"
    assert int(ds.lengths.max()) == MAX_TOKENS
    got = in_input_order(tmp_path / "s")
    assert all(np.array_equal(g, w) and g.dtype == np.int32 for g, w in zip(got, want, strict=True))
    # the same order from ShardSet.origin alone (record, then piece): no origin.npy read by the user
    assert all(np.array_equal(g, w) for g, w in zip(in_origin_order(tmp_path / "s"), want, strict=True))


def run_cli(cwd: Path, *args: str) -> dict[str, Any]:
    """``shardload prepare ... --json`` in a new process started in ``cwd``, as the console script runs.

    The console script's ``sys.path`` does not hold the current directory: the
    command itself makes it importable for ``--map``.
    """
    script = (
        "import os, sys; os.chdir(sys.argv[1]); sys.path[:] = [p for p in sys.path if p not in ('', sys.argv[1])]; "
        "from shardload.cli import main; sys.exit(main(sys.argv[2:]))"
    )
    outcome = run_with_watchdog(
        python("-c", script, str(cwd), "prepare", *args, "--json", "--no-progress"), timeout=120
    )
    assert outcome.returncode == 0, outcome.output
    return json.loads(outcome.output.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.slow
def test_tokenize_files_with_two_workers_from_the_command_line(
    tmp_path: Path, map_dir: Path, tokenizer_file: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    texts = []
    for k in range(3):  # three files: three units, read by two worker processes
        part = corpus(30, 10 + k)
        texts += part
        lines = [json.dumps({"text": list(t.encode()), "id": [k, i]}) for i, t in enumerate(part)]
        (src / f"part-{k}.jsonl").write_text("\n".join(lines) + "\n")
    runs = {}
    for workers in ("1", "2"):
        out = tmp_path / f"out{workers}"
        runs[workers] = run_cli(map_dir, str(src), "-o", str(out), "--map", "tokmap:encode", "--workers", workers)
    want = expected(texts, tokenizer_file)
    assert runs["2"]["dropped"] == runs["1"]["dropped"] == sum(not t.strip() for t in texts) > 0
    assert runs["2"]["samples"] == len(want)
    got = in_input_order(tmp_path / "out2")
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    assert all(np.array_equal(g, w) for g, w in zip(in_origin_order(tmp_path / "out2"), want, strict=True))
    manifests = [json.loads((tmp_path / f"out{w}" / "manifest.json").read_text()) for w in ("1", "2")]
    assert manifests[0]["shards"] == manifests[1]["shards"]  # the same bytes (checksums) whatever --workers
    assert manifests[1]["options"]["map"]["function"] == "tokmap:encode"
