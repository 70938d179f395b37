"""The shard table (format version 3): many shards open from columns, and a damaged table is refused."""

from __future__ import annotations

import hashlib
import json
import pickle
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import shardload
import shardload.formats.shardtable as shardtable
from shardload.errors import ManifestError
from shardload.formats.manifest import BASE_FORMAT_VERSION, TABLE_FORMAT_VERSION, Manifest, ShardInfo
from shardload.formats.shardtable import SHARD_TABLE_NAME, TABLE_SCHEMA
from shardload.schema.fields import Schema
from shardload.sets.describe import describe
from shardload.sets.verify import verify

SCHEMA = Schema.from_json({"fields": [{"name": "tokens", "dtype": "int32", "shape": [None]}]})


def many_shards(n: int, *, samples: int = 1) -> Manifest:
    """A manifest of ``n`` shards of ``samples`` samples each, every checksum distinct (no shard file exists)."""
    infos = tuple(
        ShardInfo(
            f"shards/shard-{k:06d}.arrow",
            samples,
            100 + k,
            "sha256:" + hashlib.sha256(str(k).encode()).hexdigest(),
            k * samples,
            3 * k,
        )
        for k in range(n)
    )
    tokens = sum(s.tokens for s in infos)
    m = Manifest(SCHEMA, "arrow", infos, total_samples=n * samples, total_tokens=tokens)
    return m.with_table_form()


@pytest.fixture(scope="module")
def big_set(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest]:
    """20,000 one-sample shards, written with a shard table."""
    path = tmp_path_factory.mktemp("many")
    m = many_shards(20_000)
    m.write(path)
    return path, m


def test_many_shards_round_trip(big_set: tuple[Path, Manifest]) -> None:
    path, written = big_set
    header = json.loads((path / "manifest.json").read_text())
    assert header["format_version"] == TABLE_FORMAT_VERSION and "shards" not in header
    assert header["shard_table"]["file"] == SHARD_TABLE_NAME and header["shard_table"]["shards"] == 20_000
    loaded = Manifest.load(path)
    assert loaded.shard_table == SHARD_TABLE_NAME
    assert loaded.fingerprint == written.fingerprint
    assert loaded.table == written.table
    for k in (0, 1, 12_345, 19_999, -1):
        assert loaded.shards[k] == written.shards[k]
    assert loaded.shards[-1].file == "shards/shard-019999.arrow"
    assert [s.first_sample for s in loaded.shards[5:8]] == [5, 6, 7]
    with pytest.raises(IndexError):
        loaded.shards[20_000]
    # readable with plain pyarrow
    with pa.memory_map(str(path / SHARD_TABLE_NAME)) as source:
        batch = pa.ipc.open_file(source).get_batch(0)
    assert batch.schema.equals(TABLE_SCHEMA)
    assert batch.column("samples").to_pylist()[:3] == [1, 1, 1]
    assert "sha256:" + batch.column("checksum")[7].as_py().hex() == written.shards[7].checksum
    # the table survives pickling (workers get the manifest), without the file's bytes
    again = pickle.loads(pickle.dumps(loaded))
    assert again.table == loaded.table and again.fingerprint == loaded.fingerprint


def test_open_builds_no_shard_info(big_set: tuple[Path, Manifest], monkeypatch: pytest.MonkeyPatch) -> None:
    path, _ = big_set
    np.save(path / "lengths.npy", np.ones(20_000, dtype=np.int32))
    built = []
    original = shardtable.ShardTable.item

    def counting(self: Any, k: Any) -> Any:
        built.append(k)
        return original(self, k)

    monkeypatch.setattr(shardtable.ShardTable, "item", counting)
    ss = shardload.open(path)
    assert len(ss) == 20_000 and ss.index.num_shards == 20_000 and ss.fingerprint
    assert built == []  # opening touches the columns, never a per-shard object


def test_small_sets_keep_the_json_list(tmp_path: Path) -> None:
    m = many_shards(shardtable.SHARD_TABLE_MIN_SHARDS - 1)
    assert m.shard_table == "" and m.format_version == BASE_FORMAT_VERSION
    m.write(tmp_path)
    assert not (tmp_path / SHARD_TABLE_NAME).exists()
    assert len(json.loads((tmp_path / "manifest.json").read_text())["shards"]) == len(m.shards)


def test_old_json_set_of_many_shards_still_opens(tmp_path: Path) -> None:
    """A version-1 set keeps its JSON list and the fingerprint it always had, whatever its size."""
    m = replace(many_shards(2000), shard_table="")
    m.write(tmp_path)
    loaded = Manifest.load(tmp_path)
    assert loaded.format_version == BASE_FORMAT_VERSION and loaded.shard_table == ""
    assert loaded.table == m.table
    h = hashlib.sha256(json.dumps(SCHEMA.to_json(), sort_keys=True).encode())
    for s in m.shards:
        h.update(f"{s.file}:{s.samples}:{s.checksum};".encode())
    assert loaded.fingerprint == h.hexdigest()[:16]
    assert loaded.fingerprint != many_shards(2000).fingerprint  # the same shards in a table: another form


def test_fingerprint_changes_with_a_checksum(big_set: tuple[Path, Manifest], tmp_path: Path) -> None:
    _, m = big_set
    infos = list(m.shards)
    infos[777] = replace(infos[777], checksum="sha256:" + "ab" * 32)
    other = replace(m, shards=infos).with_table_form()
    assert other.shard_table and other.fingerprint != m.fingerprint
    other.write(tmp_path)
    assert Manifest.load(tmp_path).fingerprint == other.fingerprint


# -- damage ----------------------------------------------------------------------------------------------
def rewrite_table(path: Path, columns: dict[str, Any], *, header: dict[str, Any] | None = None) -> None:
    """Write other columns as the table, and record their size and digest in the manifest (a consistent lie)."""
    batch = pa.record_batch([pa.array(columns[f.name], type=f.type) for f in TABLE_SCHEMA], schema=TABLE_SCHEMA)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, TABLE_SCHEMA) as writer:
        writer.write_batch(batch)
    data = sink.getvalue().to_pybytes()
    (path / SHARD_TABLE_NAME).write_bytes(data)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["shard_table"].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest(), **(header or {}))
    (path / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture
def small_table_set(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    m = many_shards(1500, samples=2)
    m.write(tmp_path)
    with pa.memory_map(str(tmp_path / SHARD_TABLE_NAME)) as source:
        columns = pa.ipc.open_file(source).get_batch(0).to_pydict()
    return tmp_path, columns


def test_truncated_table_is_refused(small_table_set: tuple[Path, dict[str, Any]]) -> None:
    path, _ = small_table_set
    data = (path / SHARD_TABLE_NAME).read_bytes()
    (path / SHARD_TABLE_NAME).write_bytes(data[: len(data) // 2])
    with pytest.raises(ManifestError, match=r"shards\.arrow is [\d,]+ bytes, the manifest says"):
        Manifest.load(path)


def test_flipped_byte_is_refused(small_table_set: tuple[Path, dict[str, Any]]) -> None:
    path, _ = small_table_set
    data = bytearray((path / SHARD_TABLE_NAME).read_bytes())
    data[len(data) // 2] ^= 1
    (path / SHARD_TABLE_NAME).write_bytes(bytes(data))
    with pytest.raises(ManifestError, match=r"shards\.arrow does not match the sha256"):
        Manifest.load(path)


def test_missing_table_is_refused(small_table_set: tuple[Path, dict[str, Any]]) -> None:
    path, _ = small_table_set
    (path / SHARD_TABLE_NAME).unlink()
    with pytest.raises(ManifestError, match=r"shards\.arrow is missing"):
        Manifest.load(path)


def test_wrong_length_is_refused(small_table_set: tuple[Path, dict[str, Any]]) -> None:
    path, columns = small_table_set
    rewrite_table(path, {k: v[:-1] for k, v in columns.items()})
    with pytest.raises(ManifestError, match=r"shards\.arrow holds 1,499 shards, the manifest says 1,500"):
        Manifest.load(path)


def test_non_monotonic_first_sample_is_refused(small_table_set: tuple[Path, dict[str, Any]]) -> None:
    path, columns = small_table_set
    first = columns["first_sample"]
    first[10], first[11] = first[11], first[10]
    rewrite_table(path, columns)
    with pytest.raises(
        ManifestError, match=r"manifest\.json: shard 10 \(shards/shard-000010\.arrow\) starts at sample"
    ):
        Manifest.load(path)


def test_negative_count_is_refused(small_table_set: tuple[Path, dict[str, Any]]) -> None:
    path, columns = small_table_set
    columns["tokens"][3] = -5
    rewrite_table(path, columns)
    with pytest.raises(ManifestError, match=r"shard 3 tokens: expected an integer in \[0, \d+\], got -5"):
        Manifest.load(path)


def test_other_columns_are_refused(small_table_set: tuple[Path, dict[str, Any]]) -> None:
    path, _ = small_table_set
    data = json.dumps({"tokens": [1, 2]}).encode()
    (path / SHARD_TABLE_NAME).write_bytes(data)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["shard_table"].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match=r"shards\.arrow cannot be read \(not an Arrow IPC file"):
        Manifest.load(path)


@pytest.mark.parametrize(
    "names",
    [
        {"prefix": "../shard-"},
        {"prefix": "/etc/shard-"},
        {"suffix": "/../../../x"},
        {"prefix": "shards/" + "x" * 300},
    ],
)
def test_names_escaping_the_set_are_refused(
    small_table_set: tuple[Path, dict[str, Any]], names: dict[str, str]
) -> None:
    path, _ = small_table_set
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["shard_table"]["names"].update(names)
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match=r"manifest\.json: shard_table names: path .*(outside|too long)"):
        Manifest.load(path)


def test_table_file_outside_the_set_is_refused(small_table_set: tuple[Path, dict[str, Any]]) -> None:
    path, _ = small_table_set
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["shard_table"]["file"] = "../shards.arrow"
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match=r"shard_table: path '\.\./shards\.arrow' points outside the shard set"):
        Manifest.load(path)


@pytest.mark.parametrize("version", [1, 2])
def test_table_in_an_older_version_is_refused(small_table_set: tuple[Path, dict[str, Any]], version: int) -> None:
    """An older reader would not see the table: a manifest claiming an older version with one is damage."""
    path, _ = small_table_set
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["format_version"] = version
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match=r"keeps its shards in a shards list, but the manifest does not"):
        Manifest.load(path)


def test_a_newer_format_is_refused(small_table_set: tuple[Path, dict[str, Any]]) -> None:
    path, _ = small_table_set
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["format_version"] = TABLE_FORMAT_VERSION + 1
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match="written by a newer shardload"):
        Manifest.load(path)


# -- prepare, verify, inspect, merge with a table -------------------------------------------------------
@pytest.fixture
def table_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every set written from here keeps a shard table, however few shards it has."""
    monkeypatch.setattr(shardtable, "SHARD_TABLE_MIN_SHARDS", 1)


def token_samples(n: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    return [{"tokens": rng.integers(0, 100, int(rng.integers(1, 30))).astype(np.int32)} for _ in range(n)]


@pytest.mark.usefixtures("table_everywhere")
def test_prepared_set_with_table_loads_verifies_and_inspects(tmp_path: Path) -> None:
    samples = token_samples(200)
    out = tmp_path / "out"
    shardload.write(samples, out, num_shards=7, shuffle=False, progress=False)
    assert (out / SHARD_TABLE_NAME).is_file()
    ss = shardload.open(out)
    assert ss.manifest.format_version == TABLE_FORMAT_VERSION and len(ss.shards) == 7
    assert all(np.array_equal(ss[i]["tokens"], s["tokens"]) for i, s in enumerate(samples))
    assert verify(out).ok
    info = describe(out)
    assert info["shards"] == 7 and info["bytes"] == sum(s.bytes for s in ss.shards)
    assert info["shard_balance"]["samples"] == {"min": 28, "max": 29}
    # a damaged shard is still found by its checksum in the table
    shard = out / ss.shards[2].file
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0xFF
    shard.write_bytes(bytes(data))
    report = verify(out)
    assert not report.ok and report.damaged_shards == [2]


@pytest.mark.usefixtures("table_everywhere")
def test_merge_of_parts_writes_the_table(tmp_path: Path) -> None:
    samples = token_samples(120)
    out = tmp_path / "out"
    src = tmp_path / "src"
    src.mkdir()
    paths = []
    for i in range(3):
        p = src / f"data-{i}.jsonl"
        p.write_text(
            "".join(json.dumps({"tokens": s["tokens"].tolist()}) + "\n" for s in samples[i * 40 : i * 40 + 40])
        )
        paths.append(str(p))
    for k in range(3):
        shardload.prepare(paths, out, part=(k, 3), num_shards=2, shuffle=False, dtypes={"tokens": "int32"})
    assert (out / "parts" / "00000-of-00003" / SHARD_TABLE_NAME).is_file()  # a part is a set of its own
    result = shardload.merge(out)
    assert result.changed and (out / SHARD_TABLE_NAME).is_file()
    header = json.loads((out / "manifest.json").read_text())
    assert header["format_version"] == TABLE_FORMAT_VERSION and "shards" not in header
    ss = shardload.open(out)
    assert [s.file for s in ss.shards][:3] == [
        "parts/00000-of-00003/shards/shard-000000.arrow",
        "parts/00000-of-00003/shards/shard-000001.arrow",
        "parts/00001-of-00003/shards/shard-000000.arrow",
    ]
    assert [ss[i]["tokens"].tolist() for i in range(len(ss))] == [s["tokens"].tolist() for s in samples]
    assert verify(out).ok
    assert shardload.merge(out).changed is False  # the same parts again: the same bytes, nothing written
