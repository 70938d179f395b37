"""The batched map (``map_batch=N``, ``--map-batch N``): many records a call, the set of the per-sample map.

A real tokenizer (HF ``tokenizers``, a BPE trained here: nothing is downloaded) maps text with
``encode_batch``; its set holds the samples, lengths and origins of the per-sample ``encode``, for any
batch size and worker count. Errors name the batch's records, or the one record a bad value is of.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from shardload.errors import InputError, OutputError
from shardload.prepare.batched import BatchedSamples

from .conftest import corpus
from .test_map_tokenizer import run_cli

#: the map's module: per-sample and batched functions that make the same samples
MODULE = """
import functools

import numpy as np
from tokenizers import Tokenizer


@functools.cache
def tokenizer():
    return Tokenizer.from_file({path!r})


def encode(sample):
    return {{"input_ids": np.asarray(tokenizer().encode(sample["text"]).ids, dtype=np.int32)}}


def encode_batch(batch):
    return {{"input_ids": [np.asarray(e.ids, dtype=np.int32) for e in tokenizer().encode_batch(batch["text"])]}}


def pieces(sample):
    ids = np.asarray(tokenizer().encode(sample["text"]).ids, dtype=np.int32)
    return [{{"input_ids": ids[i : i + 8]}} for i in range(0, len(ids), 8)] or None


def pieces_batch(batch):
    out = []
    for e in tokenizer().encode_batch(batch["text"]):
        ids = np.asarray(e.ids, dtype=np.int32)
        out.append([{{"input_ids": ids[i : i + 8]}} for i in range(0, len(ids), 8)] or None)
    return out
"""


@pytest.fixture
def job(tmp_path: Path, tokenizer_file: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Any]:
    """The job's directory (its module ``batchtok.py`` importable) and the module; three JSON Lines files in ``src``."""
    d = tmp_path / "job"
    d.mkdir()
    (d / "batchtok.py").write_text(MODULE.format(path=str(tokenizer_file)))
    monkeypatch.setattr(sys, "path", [str(d), *sys.path])
    monkeypatch.delitem(sys.modules, "batchtok", raising=False)
    src = d / "src"
    src.mkdir()
    for k in range(3):
        (src / f"part-{k}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in corpus(70, 20 + k)))
    return d, importlib.import_module("batchtok")


def same_set(a: Path, b: Path) -> None:
    """``a`` and ``b`` hold the same samples in the same places: every file but the manifest and the shards
    (whose bytes carry the run's identity, which names the map) byte for byte, and every sample."""
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for f in files:
        if f.name != "manifest.json" and f.parts[0] != "shards":
            assert (a / f).read_bytes() == (b / f).read_bytes(), f
    da, db = shardload.open(a), shardload.open(b)
    assert len(da) == len(db) > 0
    for i in range(len(da)):
        x, y = da[i], db[i]
        assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) and x[k].dtype == y[k].dtype for k in x)
    ma, mb = (json.loads((p / "manifest.json").read_text()) for p in (a, b))
    assert [s["samples"] for s in ma["shards"]] == [s["samples"] for s in mb["shards"]]


@pytest.mark.parametrize("workers", [1, 2])
def test_encode_batch_makes_the_set_of_encode(tmp_path: Path, job: Any, workers: int) -> None:
    d, mod = job
    common = {"num_shards": 3, "progress": False, "workers": workers, "unit_bytes": 2000, "chunk_bytes": 3000}
    shardload.prepare(d / "src", tmp_path / "one", map=mod.encode, **common)
    for n in (1, 7, 64):
        batched = shardload.prepare(d / "src", tmp_path / f"b{n}", map=mod.encode_batch, map_batch=n, **common)
        same_set(tmp_path / "one", tmp_path / f"b{n}")
        manifest = json.loads((tmp_path / f"b{n}" / "manifest.json").read_text())
        assert (
            manifest["options"]["map_batch"] == n and manifest["options"]["map"]["function"] == "batchtok:encode_batch"
        )
    assert batched.samples == 210


def test_a_list_per_record_drops_and_splits_as_the_per_sample_map(tmp_path: Path, job: Any) -> None:
    d, mod = job
    one = shardload.prepare(d / "src", tmp_path / "one", map=mod.pieces, progress=False)
    many = shardload.prepare(d / "src", tmp_path / "many", map=mod.pieces_batch, map_batch=16, progress=False)
    assert many.dropped == one.dropped > 0 and many.samples == one.samples > 210 - one.dropped
    same_set(tmp_path / "one", tmp_path / "many")


def test_encode_batch_from_the_command_line_with_two_workers(tmp_path: Path, job: Any) -> None:
    d, _ = job
    args = ["src", "--num-shards", "2", "--workers", "2", "--unit-size", "3000"]
    one = run_cli(d, *args, "-o", str(tmp_path / "one"), "--map", "batchtok:encode")
    many = run_cli(d, *args, "-o", str(tmp_path / "many"), "--map", "batchtok:encode_batch", "--map-batch", "32")
    assert one["samples"] == many["samples"] == 210
    same_set(tmp_path / "one", tmp_path / "many")


def test_write_takes_a_batched_map(tmp_path: Path, job: Any) -> None:
    _, mod = job
    texts = corpus(50, 5)
    shardload.write(({"text": t} for t in texts), tmp_path / "one", map=mod.encode, num_shards=2)
    shardload.write(({"text": t} for t in texts), tmp_path / "many", map=mod.encode_batch, map_batch=8, num_shards=2)
    same_set(tmp_path / "one", tmp_path / "many")


# -- what a batch is, and the errors ------------------------------------------------------------------------
def records(*samples: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(f"a.jsonl: line {i + 1}", s) for i, s in enumerate(samples)]


def test_a_batch_holds_records_with_the_same_fields() -> None:
    calls: list[dict[str, list[Any]]] = []

    def fn(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        calls.append(batch)
        return {"x": [np.asarray([len(batch)])] * len(next(iter(batch.values())))}

    got = list(BatchedSamples(records({"a": 1}, {"a": 2}, {"b": 3}, {"a": 4}, {"a": 5}, {"a": 6}), fn, 2))
    assert calls == [{"a": [1, 2]}, {"b": [3]}, {"a": [4, 5]}, {"a": [6]}]
    assert [w for w, _ in got] == [f"a.jsonl: line {i} (mapped by {__name__}:{fn.__qualname__})" for i in range(1, 7)]


def raising(batch: dict[str, list[Any]]) -> Any:
    raise ValueError("no vocabulary")


def short(batch: dict[str, list[Any]]) -> Any:
    return {"x": batch["a"][:-1]}


def none_value(batch: dict[str, list[Any]]) -> Any:
    return {"x": [np.asarray(v) if v != 3 else None for v in batch["a"]]}


def list_of_other(batch: dict[str, list[Any]]) -> Any:
    return [{"x": np.asarray(v)} if v != 2 else "oops" for v in batch["a"]]


def scalar(batch: dict[str, list[Any]]) -> Any:
    return 5


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (raising, r"the batch of 4 records a\.jsonl: line 1 to a\.jsonl: line 4: .* raised ValueError: no vocabulary"),
        (short, r"the batch of 4 records a\.jsonl: line 1 to a\.jsonl: line 4: .* returned 3 entries for field 'x'"),
        (none_value, r"^a\.jsonl: line 3: the map function .*none_value returned field 'x' = None"),
        (list_of_other, r"^a\.jsonl: line 2: the map function .*list_of_other returned a value of type str"),
        (scalar, r"the batch of 4 records .* returned a value of type int for 4 records"),
    ],
)
def test_errors_name_the_batch_or_the_record(fn: Any, message: str) -> None:
    with pytest.raises(InputError, match=message):
        list(BatchedSamples(records(*({"a": i} for i in range(1, 5))), fn, 4))


def test_map_batch_is_checked(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"map_batch=8 \(--map-batch\) .* no map is given"):
        shardload.write([{"x": np.arange(3)}], tmp_path / "s", map_batch=8)
    for bad in (0, -1):
        with pytest.raises(InputError, match="at least 1"):
            shardload.write([{"x": np.arange(3)}], tmp_path / "s", map=raising, map_batch=bad)
    for bad in (True, 2.5, "8"):  # type: ignore[assignment]
        with pytest.raises(InputError, match="map_batch must be an integer"):
            shardload.write([{"x": np.arange(3)}], tmp_path / "s", map=raising, map_batch=bad)


def test_resume_refuses_another_batch_size(tmp_path: Path, job: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    d, mod = job
    out = tmp_path / "s"
    calls = []

    def stop_after_the_first_unit(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args)

    from shardload.prepare import schedule

    real = schedule.ingest_unit
    monkeypatch.setattr(schedule, "ingest_unit", stop_after_the_first_unit)
    with pytest.raises(KeyboardInterrupt):
        shardload.prepare(d / "src", out, map=mod.encode_batch, map_batch=16, progress=False)
    monkeypatch.setattr(schedule, "ingest_unit", real)
    assert list((out / ".prepare" / "staging").glob("*.done"))
    with pytest.raises(OutputError, match=r"options differ.*map_batch was 16, now 8"):
        shardload.prepare(d / "src", out, map=mod.encode_batch, map_batch=8, resume=True, progress=False)
    with pytest.raises(OutputError, match=r"options differ.*map_batch was 16, now None"):
        shardload.prepare(d / "src", out, map=mod.encode, resume=True, progress=False)
    done = shardload.prepare(d / "src", out, map=mod.encode_batch, map_batch=16, resume=True, progress=False)
    assert done.samples == 210
