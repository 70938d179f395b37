"""`shardload prepare`'s summary: the input records read and what became of them, and the set's size by field.

Every expected figure is computed from the input lines here, by the rule the map in ``pieces.py`` follows.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import shardload
from shardload.cli import Exit

PIECE = 8  # tokens per piece of the map below

MAP = f"""
import os
import numpy as np

def _ids(text):
    return np.frombuffer(text.encode(), dtype=np.uint8).astype(np.int32)

def _pieces(record, text_once):
    if os.path.exists("stop") and record["text"].startswith("z"):
        raise RuntimeError("stopped")
    ids = _ids(record["text"])
    if len(ids) == 0:
        return None
    parts = [ids[i : i + {PIECE}] for i in range(0, len(ids), {PIECE})]
    return [{{"input_ids": p, "text": record["text"] if j == 0 or not text_once else ""}} for j, p in enumerate(parts)]

def every(record):
    return _pieces(record, False)

def once(record):
    return _pieces(record, True)

def every_batch(batch):
    return [every({{"text": t}}) for t in batch["text"]]
"""


@pytest.fixture
def corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two JSON Lines files of texts 0..40 bytes long (some empty) and ``pieces.py``, in the current directory."""
    (tmp_path / "pieces.py").write_text(MAP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "pieces", raising=False)
    for name, letter, n in (("a.jsonl", "a", 70), ("b.jsonl", "z", 50)):
        lines = [json.dumps({"text": letter * ((i * 7) % 41)}) for i in range(n)]
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    return tmp_path


def texts(corpus: Path) -> list[str]:
    return [
        json.loads(line)["text"] for name in ("a.jsonl", "b.jsonl") for line in (corpus / name).read_text().splitlines()
    ]


def expected(corpus: Path, *, text_once: bool = False, shards: int = 1) -> dict[str, object]:
    """The counts and field sizes of the map over the corpus, from the input lines."""
    records = texts(corpus)
    pieces = [-(-len(t) // PIECE) for t in records]  # ceil: pieces of each record
    samples = sum(pieces)
    offsets = 8 * (samples + shards)  # int64 offsets, n + 1 a shard
    text_bytes = sum(len(t) * (1 if text_once else n) for t, n in zip(records, pieces))
    return {
        "records": len(records),
        "samples": samples,
        "dropped": sum(n == 0 for n in pieces),
        "split": sum(n > 1 for n in pieces),
        "field_bytes": {"input_ids": 4 * sum(len(t) for t in records) + offsets, "text": text_bytes + offsets},
    }


RUN = ("prepare", "a.jsonl", "b.jsonl", "--num-shards", "1", "--no-progress")


@pytest.mark.parametrize("how", [(), ("--workers", "2"), ("--map", "pieces:every_batch", "--map-batch", "5")])
def test_summary_counts_records_and_size_by_field(cli, corpus, how) -> None:
    want = expected(corpus)
    r = cli(*RUN, "--map", "pieces:every", *how, "-o", "out", "--json")
    assert r.code == 0, r.err
    got = r.json()
    # Invariant: the records read, dropped and split, and each field's bytes, are those of the input
    assert {k: got[k] for k in want} == want
    assert got["repeated_fields"] == {"text": want["split"]}
    r = cli(*RUN, "--map", "pieces:every", *how, "-o", "out2")
    assert r.code == 0, r.err
    assert (
        f"records:  {want['records']:,} input records became {want['samples']:,} samples: the map split "
        f"{want['split']:,} into several samples; the map dropped {want['dropped']:,} records"
    ) in r.out
    assert "size by field: input_ids " in r.out and ", text " in r.out
    assert f"note: the map repeated field 'text' in every piece of {want['split']:,} records it split" in r.out


def test_without_a_map_each_record_is_a_sample(cli, corpus) -> None:
    r = cli(*RUN, "-o", "out", "--json")
    assert r.code == 0, r.err
    n = len(texts(corpus))
    assert (r.json()["records"], r.json()["samples"], r.json()["split"], r.json()["dropped"]) == (n, n, 0, 0)
    assert r.json()["field_bytes"] == {"text": sum(map(len, texts(corpus))) + 8 * (n + 1)}


def test_the_recipe_keeps_text_once(cli, corpus) -> None:
    """docs/cli.md, "Text beside tokens, kept once": the text on a record's first piece only."""
    want = expected(corpus, text_once=True)
    r = cli(*RUN, "--map", "pieces:once", "-o", "out", "--json")
    assert r.code == 0, r.err
    # Invariant: each record's text is stored once, and the summary has nothing to note
    assert r.json()["field_bytes"] == want["field_bytes"] and r.json()["repeated_fields"] == {}
    ds = shardload.open(corpus / "out")
    by_record: dict[tuple[str | None, int | None], list[str]] = {}
    for i in range(len(ds)):
        origin = ds.origin(i)
        by_record.setdefault((origin.file, origin.position), []).append(str(ds[i]["text"]))
    lines = {
        (name, k + 1): json.loads(line)["text"]
        for name in ("a.jsonl", "b.jsonl")
        for k, line in enumerate((corpus / name).read_text().splitlines())
    }
    # Invariant: the one non-empty text among a record's pieces is the record's text
    assert by_record and all([t for t in got if t] == [lines[key]] for key, got in by_record.items())


def test_counts_of_a_resumed_run_are_those_of_one_run(cli, corpus) -> None:
    (corpus / "stop").write_text("")  # the map raises on the second file's first non-empty record
    r = cli(*RUN, "--map", "pieces:every", "-o", "out", "--json")
    assert r.code == Exit.INPUT and "stopped" in r.err
    (corpus / "stop").unlink()
    r = cli(*RUN, "--map", "pieces:every", "-o", "out", "--json", "--resume")
    assert r.code == 0, r.err
    want = expected(corpus)
    # Invariant: the first file, staged by the stopped run, is counted once, with what the resumed run read
    assert {k: r.json()[k] for k in want} == want


def test_counts_of_parts_add_up_to_those_of_one_run(cli, corpus) -> None:
    got = [cli(*RUN, "--map", "pieces:every", "-o", "out", "--part", f"{k}/2", "--json").json() for k in (0, 1)]
    want = expected(corpus)
    # Invariant: each part counts its own records: together, every record once
    for key in ("records", "samples", "dropped", "split"):
        assert sum(g[key] for g in got) == want[key], key
    merged = cli("merge", "out", "--json").json()
    assert merged["samples"] == want["samples"]


def test_a_run_with_nothing_to_do_counts_no_records(cli, corpus) -> None:
    args = (*RUN, "--map", "pieces:every", "-o", "out", "--part", "0/2")
    assert cli(*args).code == 0
    r = cli(*args, "--resume", "--json")
    assert r.code == 0, r.err
    assert r.json()["records"] is None and r.json()["field_bytes"] == {}
    r = cli(*args, "--resume")
    assert "records:" not in r.out and "size by field" not in r.out
