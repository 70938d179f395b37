"""Round trips through every source kind: what ``shardload.open(out)[i]`` returns is what went in.

With ``shuffle=False`` sample ``i`` of the shard set is source position ``i``
(files in sorted order, rows/lines/members in file order).
"""

from __future__ import annotations

import gzip
import json
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import feather

import shardload
from shardload.prepare.sources import discover
from shardload.prepare.sources.columnar import batch_samples
from shardload.prepare.sources.webdataset import split_member_name

wds = pytest.importorskip("webdataset")

LENGTHS = [3, 0, 5, 1, 7, 2, 4]  # includes an empty sample
ROWS = [2, 1, 0, 3, 1, 4, 2]  # includes a sample with no rows


def make_samples(n: int = len(LENGTHS)) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [
        {
            "tokens": rng.integers(0, 1000, size=LENGTHS[i], dtype=np.int32),
            "features": rng.standard_normal((ROWS[i], 4)).astype(np.float32),
            "label": np.array(i % 3, dtype=np.int64),
        }
        for i in range(n)
    ]


def prepare_and_open(sources: str | Path | Sequence[str | Path], out: Path, **kw: object) -> shardload.ShardSet:
    n_shards = kw.pop("num_shards", 2)
    shardload.prepare(sources, out, shuffle=False, num_shards=n_shards, **kw)
    return shardload.open(out)


def assert_same(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray], where: str = "") -> None:
    assert set(got) == set(want), where
    for name, w in want.items():
        w = np.asarray(w)
        g = got[name]
        assert g.dtype == w.dtype, f"{where} {name}: {g.dtype} != {w.dtype}"
        assert g.shape == w.shape, f"{where} {name}: {g.shape} != {w.shape}"
        np.testing.assert_array_equal(g, w, err_msg=f"{where} {name}")


def assert_set_equals(ds: shardload.ShardSet, want: Sequence[Mapping[str, np.ndarray]]) -> None:
    assert len(ds) == len(want)
    for i, w in enumerate(want):
        assert_same(ds[i], w, where=f"sample {i}")


def expect_input_error(sources: object, out: Path, *fragments: str, **kw: object) -> str:
    with pytest.raises(shardload.InputError) as info:
        shardload.prepare(sources, out, shuffle=False, num_shards=1, **kw)  # type: ignore[arg-type]
    msg = str(info.value)
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"
    assert not (out / "manifest.json").exists()
    return msg


# -- npz -------------------------------------------------------------------------------------------
def test_npz_round_trip(tmp_path: Path) -> None:
    samples = make_samples()
    for i, s in enumerate(samples):
        np.savez(tmp_path / f"s{i:03d}.npz", **s)
    ds = prepare_and_open(tmp_path / "s*.npz", tmp_path / "out")
    assert_set_equals(ds, samples)
    assert list(ds.schema.names) == ["tokens", "features", "label"]  # the order they were saved in


def test_npz_single_sample_and_unnamed_arrays(tmp_path: Path) -> None:
    np.savez_compressed(tmp_path / "only.npz", np.arange(5, dtype=np.uint16))
    ds = prepare_and_open(tmp_path / "only.npz", tmp_path / "out", num_shards=1)
    assert_set_equals(ds, [{"arr_0": np.arange(5, dtype=np.uint16)}])


def test_npz_refuses_pickled_arrays_and_garbage(tmp_path: Path) -> None:
    np.savez(tmp_path / "obj.npz", x=np.array([{"a": 1}], dtype=object))
    expect_input_error(tmp_path / "obj.npz", tmp_path / "o1", "obj.npz", "'x'", "pickled", "--allow-pickle")
    (tmp_path / "bad.npz").write_bytes(b"not a zip at all")
    expect_input_error(tmp_path / "bad.npz", tmp_path / "o2", "bad.npz", "not an .npz")
    np.savez(tmp_path / "trunc.npz", x=np.arange(1000))
    data = (tmp_path / "trunc.npz").read_bytes()
    (tmp_path / "trunc.npz").write_bytes(data[: len(data) // 2])
    expect_input_error(tmp_path / "trunc.npz", tmp_path / "o3", "trunc.npz", "re-create")


# -- parquet / arrow ---------------------------------------------------------------------------------
def samples_table(samples: Sequence[Mapping[str, np.ndarray]]) -> pa.Table:
    """tokens list<int32>, features list<fixed_size_list<float32, 4>>, label int64."""
    tokens = pa.array([s["tokens"] for s in samples], type=pa.list_(pa.int32()))
    feats = pa.ListArray.from_arrays(
        pa.array(np.cumsum([0] + [len(s["features"]) for s in samples]), type=pa.int32()),
        pa.FixedSizeListArray.from_arrays(pa.array(np.concatenate([s["features"].ravel() for s in samples])), 4),
    )
    labels = pa.array([int(s["label"]) for s in samples], type=pa.int64())
    return pa.table({"tokens": tokens, "features": feats, "label": labels})


def test_parquet_round_trip_across_row_groups(tmp_path: Path) -> None:
    samples = make_samples()
    pq.write_table(samples_table(samples[:5]), tmp_path / "a.parquet", row_group_size=2)
    pq.write_table(samples_table(samples[5:]), tmp_path / "b.pq")
    ds = prepare_and_open(tmp_path, tmp_path / "out")
    assert_set_equals(ds, samples)
    assert ds.schema.field("features").shape == (None, 4)
    assert ds.schema.field("label").shape == ()


def test_parquet_column_types(tmp_path: Path) -> None:
    # list<list<float>> with equal inner lengths per row -> [rows, C]; fixed_size_list -> fixed [C];
    # large_list, bool, float16, uint8 scalars, and a dictionary-encoded column.
    mats = [np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros((0, 3), np.float32), np.ones((1, 3), np.float32)]
    table = pa.table(
        {
            "mat": pa.array([m.tolist() for m in mats], type=pa.list_(pa.list_(pa.float32()))),
            "emb": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(6, dtype=np.float16)), 2),
            "big": pa.array([[1, 2], [], [3]], type=pa.large_list(pa.int64())),
            "flag": pa.array([True, False, True]),
            "small": pa.array([1, 2, 255], type=pa.uint8()),
            "cat": pa.array([7, 7, 9], type=pa.int16()).dictionary_encode(),
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    ds = prepare_and_open(tmp_path / "t.parquet", tmp_path / "out")
    want = [
        {
            "mat": mats[i],
            "emb": np.arange(6, dtype=np.float16).reshape(3, 2)[i],
            "big": np.array([[1, 2], [], [3]][i], dtype=np.int64),
            "flag": np.array([True, False, True][i]),
            "small": np.array([1, 2, 255][i], dtype=np.uint8),
            "cat": np.array([7, 7, 9][i], dtype=np.int16),
        }
        for i in range(3)
    ]
    assert_set_equals(ds, want)


def test_list_of_lists_empty_rows_take_width_across_batches(tmp_path: Path) -> None:
    typ = pa.list_(pa.list_(pa.int32()))
    schema = pa.schema([("m", typ)])
    b1 = pa.record_batch([pa.array([[[1, 2, 3]], []], type=typ)], schema=schema)
    b2 = pa.record_batch([pa.array([[], [[4, 5, 6], [7, 8, 9]]], type=typ)], schema=schema)
    rows = list(batch_samples(iter([b1, b2]), "x.parquet", schema))
    assert [r["m"].shape for _, r in rows] == [(1, 3), (0, 3), (0, 3), (2, 3)]
    assert [where for where, _ in rows] == [f"x.parquet: row {i}" for i in range(4)]


def test_sliced_batches_convert_correctly() -> None:
    samples = make_samples()
    table = samples_table(samples)
    batch = table.combine_chunks().to_batches()[0].slice(2, 4)
    rows = [s for _, s in batch_samples(iter([batch]), "t.arrow", table.schema)]
    for got, want in zip(rows, samples[2:6]):
        assert_same(got, want)


def test_arrow_file_feather_and_stream_round_trip(tmp_path: Path) -> None:
    samples = make_samples()
    feather.write_feather(samples_table(samples[:3]), tmp_path / "a.feather", compression="zstd")
    table = samples_table(samples[3:])
    with pa.OSFile(str(tmp_path / "b.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        for batch in table.to_batches(max_chunksize=2):
            w.write_batch(batch)
    with pa.OSFile(str(tmp_path / "c.ipc"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table.slice(0, 1))
    ds = prepare_and_open(
        [tmp_path / "a.feather", tmp_path / "b.arrow", tmp_path / "c.ipc"], tmp_path / "out", num_shards=3
    )
    assert_set_equals(ds, samples + samples[3:4])


def test_parquet_single_row(tmp_path: Path) -> None:
    samples = make_samples(1)
    pq.write_table(samples_table(samples), tmp_path / "one.parquet")
    assert_set_equals(prepare_and_open(tmp_path / "one.parquet", tmp_path / "out", num_shards=1), samples)


def test_parquet_nulls_name_row_and_column(tmp_path: Path) -> None:
    pq.write_table(pa.table({"x": pa.array([[1], [2], None], type=pa.list_(pa.int64()))}), tmp_path / "a.parquet")
    expect_input_error(tmp_path / "a.parquet", tmp_path / "o1", "a.parquet", "row 2", "'x'", "null")
    pq.write_table(pa.table({"x": pa.array([[1], [2, None]], type=pa.list_(pa.int64()))}), tmp_path / "b.parquet")
    expect_input_error(tmp_path / "b.parquet", tmp_path / "o2", "b.parquet", "row 1", "'x'", "null")
    pq.write_table(pa.table({"y": pa.array([1.0, None, 3.0])}), tmp_path / "c.parquet")
    expect_input_error(tmp_path / "c.parquet", tmp_path / "o3", "c.parquet", "row 1", "'y'", "null")


def test_parquet_refuses_strings_ragged_and_odd_types(tmp_path: Path) -> None:
    # string columns are text fields; lists of strings are neither numbers nor text
    words = pa.array([["hi", "there"]], pa.list_(pa.string()))
    pq.write_table(pa.table({"ids": pa.array([[1]]), "text": words}), tmp_path / "s.parquet")
    expect_input_error(tmp_path / "s.parquet", tmp_path / "o1", "s.parquet", "'text'", "not numeric", "drop")
    ragged = pa.array([[[1.0, 2.0]], [[1.0, 2.0], [3.0]]], type=pa.list_(pa.list_(pa.float32())))
    pq.write_table(pa.table({"m": ragged}), tmp_path / "r.parquet")
    expect_input_error(tmp_path / "r.parquet", tmp_path / "o2", "r.parquet", "row 1", "'m'", "equally long")
    pq.write_table(pa.table({"t": pa.array([1, 2], type=pa.timestamp("s"))}), tmp_path / "t.parquet")
    expect_input_error(tmp_path / "t.parquet", tmp_path / "o3", "t.parquet", "'t'", "not supported")


def test_corrupt_parquet_and_arrow(tmp_path: Path) -> None:
    pq.write_table(samples_table(make_samples()), tmp_path / "ok.parquet")
    data = (tmp_path / "ok.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) - 20])
    expect_input_error(tmp_path / "cut.parquet", tmp_path / "o1", "cut.parquet", "Parquet")
    # a corrupt page in the middle (snappy-compressed, so decoding fails)
    big = pa.table({"x": pa.array([np.arange(i % 50) for i in range(3000)])})
    pq.write_table(big, tmp_path / "mid.parquet", row_group_size=500)
    mid = bytearray((tmp_path / "mid.parquet").read_bytes())
    for k in range(len(mid) // 3, len(mid) // 3 + 200):
        mid[k] ^= 0x5A
    (tmp_path / "mid.parquet").write_bytes(bytes(mid))
    expect_input_error(tmp_path / "mid.parquet", tmp_path / "o3", "mid.parquet", "corrupt")
    (tmp_path / "junk.arrow").write_bytes(b"\x00" * 64)
    expect_input_error(tmp_path / "junk.arrow", tmp_path / "o2", "junk.arrow", "Arrow IPC")


# -- jsonl -------------------------------------------------------------------------------------------
def jsonl_line(s: Mapping[str, np.ndarray]) -> str:
    return json.dumps({k: np.asarray(v).tolist() for k, v in s.items()})


def test_jsonl_round_trip_default_dtypes(tmp_path: Path) -> None:
    samples = make_samples()
    lines = [jsonl_line(s) for s in samples]
    lines.insert(2, "")  # blank lines are skipped
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n\n")
    ds = prepare_and_open(tmp_path / "a.jsonl", tmp_path / "out")
    # JSON has no dtypes: integers are int64, floats float32 (values survive: they were float32)
    want = [{**s, "tokens": s["tokens"].astype(np.int64)} for s in samples]
    assert_set_equals(ds, want)


def test_jsonl_gz_ndjson_and_single_line(tmp_path: Path) -> None:
    with gzip.open(tmp_path / "a.jsonl.gz", "wt") as fh:
        fh.write('{"x": [1, 2.5], "ok": true}\n')
    (tmp_path / "b.ndjson").write_text('{"x": [3.5], "ok": false}\n')
    ds = prepare_and_open([tmp_path / "a.jsonl.gz", tmp_path / "b.ndjson"], tmp_path / "out")
    # a list mixing ints and floats is float32; booleans are bool
    assert_set_equals(
        ds,
        [
            {"x": np.array([1, 2.5], np.float32), "ok": np.array(True)},
            {"x": np.array([3.5], np.float32), "ok": np.array(False)},
        ],
    )
    one = prepare_and_open(tmp_path / "a.jsonl.gz", tmp_path / "one", num_shards=1)
    assert_set_equals(one, [{"x": np.array([1, 2.5], np.float32), "ok": np.array(True)}])


def test_jsonl_dtype_override(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"t": [1, 2], "f": [0.1, 0.2]}\n{"t": [], "f": [3]}\n')
    ds = prepare_and_open(tmp_path / "a.jsonl", tmp_path / "out", dtypes={"t": "int32", "f": "float64"})
    # float64 is decoded directly, never rounded through float32
    assert_set_equals(
        ds,
        [
            {"t": np.array([1, 2], np.int32), "f": np.array([0.1, 0.2], np.float64)},
            {"t": np.zeros(0, np.int32), "f": np.array([3.0])},
        ],
    )
    (tmp_path / "b.jsonl").write_text('{"t": [1, 2.5]}\n')
    expect_input_error(
        tmp_path / "b.jsonl", tmp_path / "o2", "b.jsonl", "line 1", "'t'", "int32", dtypes={"t": "int32"}
    )


def test_jsonl_empty_2d_rows_keep_width(tmp_path: Path) -> None:
    # [] takes dtype and inner shape from the field's last non-empty line in the file
    (tmp_path / "a.jsonl").write_text('{"m": [[1.5, 2.5]]}\n{"m": []}\n{"m": [[0.5, 1], [2, 3]]}\n')
    ds = prepare_and_open(tmp_path / "a.jsonl", tmp_path / "out")
    assert_set_equals(
        ds,
        [
            {"m": np.array([[1.5, 2.5]], np.float32)},
            {"m": np.zeros((0, 2), np.float32)},
            {"m": np.array([[0.5, 1], [2, 3]], np.float32)},
        ],
    )


@pytest.mark.parametrize(
    ("content", "line", "fragments"),
    [
        ('{"x": [1]}\n{"x": [1,\n', 2, ["invalid JSON"]),
        ('{"x": [1]}\n\n[1, 2]\n', 3, ["JSON object"]),
        ('{"x": [1]}\n{"x": "abc"}\n', 2, ["'x'", "str", "earlier samples have int64"]),
        ('{"x": [1]}\n{"x": ["abc"]}\n', 2, ["'x'", "not numeric"]),
        ('{"x": [1]}\n{"x": [1, null]}\n', 2, ["'x'", "null"]),
        ('{"x": [[1, 2], [3]]}\n', 1, ["'x'", "ragged"]),
        ('{"x": [1]}\n{"x": {"a": 1}}\n', 2, ["'x'", "object"]),
    ],
)
def test_jsonl_bad_lines(tmp_path: Path, content: str, line: int, fragments: list[str]) -> None:
    (tmp_path / "bad.jsonl").write_text(content)
    expect_input_error(tmp_path / "bad.jsonl", tmp_path / "out", "bad.jsonl", f"line {line}", *fragments)


def test_jsonl_non_utf8(tmp_path: Path) -> None:
    (tmp_path / "latin.jsonl").write_bytes(b'{"x": [1]}\n{"x\xe9": [2]}\n')
    expect_input_error(tmp_path / "latin.jsonl", tmp_path / "out", "latin.jsonl", "line 2", "UTF-8")


def test_jsonl_truncated_gzip(tmp_path: Path) -> None:
    data = gzip.compress(("\n".join(f'{{"x": [{i}]}}' for i in range(2000)) + "\n").encode())
    (tmp_path / "cut.jsonl.gz").write_bytes(data[: len(data) // 2])
    expect_input_error(tmp_path / "cut.jsonl.gz", tmp_path / "out", "cut.jsonl.gz", "gzip")


# -- webdataset --------------------------------------------------------------------------------------
def test_member_names_follow_webdataset() -> None:
    assert split_member_name("dir/abc.tokens.npy") == ("dir/abc", "tokens", "npy", False)
    assert split_member_name("abc.npy") == ("abc", "npy", "npy", False)
    assert split_member_name("a.b/abc.X.Y.NPY.gz") == ("a.b/abc", "x.y", "npy", True)
    assert split_member_name("noext") is None


def write_wds(path: Path, samples: Sequence[Mapping[str, object]]) -> None:
    with wds.TarWriter(str(path)) as sink:
        for s in samples:
            sink.write(dict(s))


def test_webdataset_round_trip_shards_and_braces(tmp_path: Path) -> None:
    samples = make_samples()
    pattern = str(tmp_path / "shard-%03d.tar")
    with wds.ShardWriter(pattern, maxcount=3, verbose=0) as sink:
        for i, s in enumerate(samples):
            member = {"tokens.npy": s["tokens"], "features.npy": s["features"], "cls": int(s["label"])}
            sink.write({"__key__": f"s{i:04d}", **member})
    assert len(list(tmp_path.glob("shard-*.tar"))) == 3
    ds = prepare_and_open(str(tmp_path / "shard-{000..002}.tar"), tmp_path / "out")
    # abc.tokens.npy -> field "tokens"; abc.cls -> field "cls" (an int64 scalar)
    want = [{"tokens": s["tokens"], "features": s["features"], "cls": s["label"]} for s in samples]
    assert_set_equals(ds, want)


def test_webdataset_json_txt_gz_members(tmp_path: Path) -> None:
    rows = [
        {
            "__key__": f"d/k{i}",
            "json": {"ids": list(range(i)), "score": i / 2},
            "pos.json": [[i, i + 1]] * i,
            "n.txt": str(i),
            "x.npy.gz": np.full(i, i, np.int16),
        }
        for i in range(1, 4)
    ]
    write_wds(tmp_path / "a.tar.gz", rows)
    ds = prepare_and_open(tmp_path / "a.tar.gz", tmp_path / "out", dtypes={"pos": "int32", "n": "int64"})
    want = [
        {
            "ids": np.arange(i, dtype=np.int64),
            "score": np.array(i / 2, np.float32),
            "pos": np.array([[i, i + 1]] * i, np.int32).reshape(i, 2),
            "n": np.array(i, np.int64),
            "x": np.full(i, i, np.int16),
        }
        for i in range(1, 4)
    ]
    assert_set_equals(ds, want)


def test_webdataset_single_sample(tmp_path: Path) -> None:
    write_wds(tmp_path / "one.tar", [{"__key__": "only", "npy": np.arange(4.0, dtype=np.float32)}])
    ds = prepare_and_open(tmp_path / "one.tar", tmp_path / "out", num_shards=1)
    assert_set_equals(ds, [{"npy": np.arange(4.0, dtype=np.float32)}])


def test_webdataset_pickle_needs_allow_pickle(tmp_path: Path) -> None:
    write_wds(tmp_path / "p.tar", [{"__key__": "k0", "pyd": {"a": np.arange(3, dtype=np.int32)}}])
    expect_input_error(tmp_path / "p.tar", tmp_path / "o1", "p.tar", "k0.pyd", "pickled", "--allow-pickle")
    ds = prepare_and_open(tmp_path / "p.tar", tmp_path / "o2", num_shards=1, allow_pickle=True)
    assert_set_equals(ds, [{"a": np.arange(3, dtype=np.int32)}])


def _tar_bytes(tmp_path: Path, n: int = 20) -> bytes:
    write_wds(tmp_path / "full.tar", [{"__key__": f"k{i:03d}", "t.npy": np.arange(100 + i)} for i in range(n)])
    return (tmp_path / "full.tar").read_bytes()


def test_truncated_tar_mid_member(tmp_path: Path) -> None:
    data = _tar_bytes(tmp_path)
    with tarfile.open(tmp_path / "full.tar") as tf:
        members = tf.getmembers()
    m = members[len(members) // 2]
    (tmp_path / "cut.tar").write_bytes(data[: m.offset_data + 10])
    expect_input_error(tmp_path / "cut.tar", tmp_path / "out", "cut.tar", "truncated")
    (tmp_path / "cut2.tar").write_bytes(data[: m.offset_data - 100])  # inside a header
    expect_input_error(tmp_path / "cut2.tar", tmp_path / "o2", "cut2.tar", "truncated")


def test_truncated_tar_at_member_boundary(tmp_path: Path) -> None:
    # Cut right after a member's data: tarfile alone would see a shorter, valid-looking tar.
    data = _tar_bytes(tmp_path)
    with tarfile.open(tmp_path / "full.tar") as tf:
        members = tf.getmembers()
    m = members[len(members) // 2]
    end = m.offset_data + ((m.size + 511) // 512) * 512
    (tmp_path / "cut.tar").write_bytes(data[:end])
    expect_input_error(tmp_path / "cut.tar", tmp_path / "out", "cut.tar", m.name, "end-of-archive")
    (tmp_path / "junk.tar").write_bytes(data[:end] + b"\x07" * 512 + b"\x00" * 1024)
    expect_input_error(tmp_path / "junk.tar", tmp_path / "o2", "junk.tar", m.name, "end-of-archive")


def _raw_tar(path: Path, members: Sequence[tuple[str, bytes]], link: str | None = None) -> None:
    import io

    with tarfile.open(path, "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        if link is not None:
            info = tarfile.TarInfo(link)
            info.type = tarfile.SYMTYPE
            info.linkname = "/etc/passwd"
            tf.addfile(info)


def _npy(arr: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("members", "link", "fragments"),
    [
        ([("../evil.npy", b"")], None, ["'../evil.npy'", "unsafe"]),
        ([("/abs/k.npy", b"")], None, ["'/abs/k.npy'", "unsafe"]),
        ([("k0.npy", _npy(np.arange(3)))], "k1.npy", ["'k1.npy'", "link"]),
        (
            [("k0.t.npy", _npy(np.arange(3))), ("k1.t.npy", _npy(np.arange(2))), ("k0.u.npy", _npy(np.arange(1)))],
            None,
            ["'k0.u.npy'", "adjacent"],
        ),
        ([("k0.t.npy", _npy(np.arange(3))), ("k0.text.txt", b"\xffbad")], None, ["'k0.text.txt'", "UTF-8"]),
        ([("k0.img.jpg", b"\xff\xd8")], None, ["'k0.img.jpg'", ".jpg is not supported"]),
        ([("README", b"hi")], None, ["'README'", "no extension"]),
        ([("k0.json", b'{"x": [1, "a"]}')], None, ["'k0.json'", "'x'", "not numeric"]),
        ([("k0.json", b'{"x": \xff}')], None, ["'k0.json'", "UTF-8"]),
        ([("k0.cls", b"three")], None, ["'k0.cls'", "integer"]),
        ([("k0.json", b'{"x": 1}'), ("k0.x.npy", _npy(np.arange(2)))], None, ["'k0.x.npy'", "twice"]),
    ],
)
def test_webdataset_bad_members(
    tmp_path: Path, members: list[tuple[str, bytes]], link: str | None, fragments: list[str]
) -> None:
    _raw_tar(tmp_path / "bad.tar", members, link)
    expect_input_error(tmp_path / "bad.tar", tmp_path / "out", "bad.tar", *fragments)


def test_webdataset_skips_metadata_and_directories(tmp_path: Path) -> None:
    import io

    with tarfile.open(tmp_path / "m.tar", "w") as tf:
        d = tarfile.TarInfo("sub")
        d.type = tarfile.DIRTYPE
        tf.addfile(d)
        for name, data in [("__index__", b"{}"), ("__meta__/x.json", b"{}"), ("sub/k0.t.npy", _npy(np.arange(2)))]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    ds = prepare_and_open(tmp_path / "m.tar", tmp_path / "out", num_shards=1)
    assert_set_equals(ds, [{"t": np.arange(2)}])


def test_not_a_tar(tmp_path: Path) -> None:
    (tmp_path / "x.tar").write_bytes(b"hello" * 300)
    expect_input_error(tmp_path / "x.tar", tmp_path / "out", "x.tar")


# -- all kinds ---------------------------------------------------------------------------------------
def test_discover_detects_every_kind(tmp_path: Path) -> None:
    names = ["a.npy", "b.npz", "c.parquet", "d.feather", "e.jsonl", "f.tar", "g.tgz", "h.ndjson.gz"]
    for n in names:
        (tmp_path / n).write_bytes(b"")
    kinds = [u.kind for n in names for u in discover([tmp_path / n])]
    assert kinds == ["npy", "npz", "parquet", "arrow", "jsonl", "webdataset", "webdataset", "jsonl"]


def test_bad_input_leaves_outputs_alone(tmp_path: Path) -> None:
    samples = make_samples()
    good = tmp_path / "good.jsonl"
    good.write_text("\n".join(jsonl_line(s) for s in samples) + "\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(jsonl_line(samples[0]) + "\n{oops\n")
    out = tmp_path / "out"
    shardload.prepare(good, out, shuffle=False, num_shards=2)
    before = (out / "manifest.json").read_bytes()
    # a failing run into a fresh directory leaves no manifest: it never looks like a shard set
    expect_input_error(bad, tmp_path / "fresh", "bad.jsonl", "line 2")
    # a failing --overwrite leaves the existing set as it was
    with pytest.raises(shardload.InputError):
        shardload.prepare(bad, out, shuffle=False, num_shards=2, overwrite=True)
    assert (out / "manifest.json").read_bytes() == before
    ds = shardload.open(out)
    assert len(ds) == len(samples)
    assert_same(ds[3], {**samples[3], "tokens": samples[3]["tokens"].astype(np.int64)})


# -- webdataset shards written by webdataset's own ShardWriter ----------------------------------------
def write_shards(directory: Path, samples: Sequence[Mapping[str, object]], maxcount: int = 2) -> str:
    """Write ``samples`` with ``webdataset.ShardWriter``; returns the brace pattern of the tars."""
    with wds.ShardWriter(str(directory / "data-%03d.tar"), maxcount=maxcount, verbose=0) as sink:
        for s in samples:
            sink.write(dict(s))
    count = len(list(directory.glob("data-*.tar")))
    return str(directory / f"data-{{000..{count - 1:03d}}}.tar")


def _without(ds: shardload.ShardSet, name: str) -> list[dict]:
    return [{k: v for k, v in ds[i].items() if k != name} for i in range(len(ds))]


def test_shardwriter_member_types_grouped_by_key(tmp_path: Path) -> None:
    from shardload.cli import main

    samples = make_samples(5)
    rows = [
        {
            "__key__": f"train/s{i:04d}",  # keys may hold directories
            "tokens.npy": s["tokens"],  # -> field "tokens", dtype and shape kept
            "json": {"pos": [[i, i + 1]] * (i % 3 + 1), "score": i + 0.5},  # -> one field per entry
            "cls": i % 3,  # -> field "cls", an int64 scalar
            "len.txt": str(len(s["tokens"])),  # with --dtype len=int64 -> field "len", an int64 scalar
            "prob.txt": f"{i / 4:.2f}\n",  # with --dtype prob=float32 -> a float32 scalar (newline ignored)
            "caption.txt": f"sample {i}\n",  # -> field "caption", text (str) as it is
        }
        for i, s in enumerate(samples)
    ]
    pattern = write_shards(tmp_path, rows)
    assert pattern.endswith("data-{000..002}.tar")
    out = tmp_path / "out"
    dtypes = ["--dtype", "pos=int32", "--dtype", "len=int64", "--dtype", "prob=float32"]
    code = main(["prepare", pattern, "-o", str(out), "--no-shuffle", "--no-progress", *dtypes])
    assert code == 0
    ds = shardload.open(out)
    # Invariant: one sample per key, however many members it has and across tar boundaries
    assert len(ds) == 5
    want = [
        {
            "tokens": s["tokens"],
            "pos": np.array([[i, i + 1]] * (i % 3 + 1), np.int32),
            "score": np.array(i + 0.5, np.float32),
            "cls": np.array(i % 3, np.int64),
            "len": np.array(len(s["tokens"]), np.int64),
            "prob": np.array(float(f"{i / 4:.2f}"), np.float32),
        }
        for i, s in enumerate(samples)
    ]
    assert [ds[i]["caption"] for i in range(len(ds))] == [f"sample {i}\n" for i in range(5)]
    assert_set_equals(_without(ds, "caption"), want)


@pytest.mark.parametrize("ext", ["pyd", "pickle", "pkl"])
def test_shardwriter_pickled_members_need_allow_pickle(tmp_path: Path, ext: str) -> None:
    import pickle

    from shardload.cli import main

    value = {"a": np.arange(3, dtype=np.int32)}
    # webdataset pickles .pyd/.pickle itself; it has no encoder for .pkl, so that one is given as bytes
    rows = [{"__key__": f"k{i}", ext: pickle.dumps(value) if ext == "pkl" else value} for i in range(3)]
    pattern = write_shards(tmp_path, rows)
    msg = expect_input_error(pattern, tmp_path / "o1", "data-000.tar", f"'k0.{ext}'", "pickled", "--allow-pickle")
    assert "refusing to unpickle" in msg
    assert main(["prepare", pattern, "-o", str(tmp_path / "o2"), "--no-progress"]) == 3  # bad input
    ds = prepare_and_open(pattern, tmp_path / "o3", num_shards=1, allow_pickle=True)
    assert_set_equals(ds, [value] * 3)


def test_shardwriter_pickled_npy_needs_allow_pickle(tmp_path: Path) -> None:
    rows = [{"__key__": "k0", "x.npy": np.array([{"a": 1}], dtype=object)}]  # np.save pickles object arrays
    expect_input_error(write_shards(tmp_path, rows), tmp_path / "out", "data-000.tar", "'k0.x.npy'", "pickled")


def test_shardwriter_txt_members(tmp_path: Path) -> None:
    mixed = write_shards(tmp_path, [{"__key__": f"k{i}", "n.txt": t} for i, t in enumerate(["3", "\ufeff4", "4.5"])])
    # a .txt member is text (the byte-order mark dropped), unless --dtype makes it one number
    ds = prepare_and_open(mixed, tmp_path / "o1")
    assert [ds[i]["n"] for i in range(3)] == ["3", "4", "4.5"]
    ds = prepare_and_open(mixed, tmp_path / "o2", dtypes={"n": "float32"})
    assert_set_equals(ds, [{"n": np.array(v, np.float32)} for v in (3, 4, 4.5)])
    (tmp_path / "t").mkdir()
    words = write_shards(tmp_path / "t", [{"__key__": "k0", "caption.txt": "a cat on a mat"}])
    expect_input_error(
        words,
        tmp_path / "o3",
        "data-000.tar",
        "'k0.caption.txt'",
        "one number",
        "keep it as text",
        dtypes={"caption": "int64"},
    )


def test_shardwriter_sample_missing_a_field_names_tar_and_key(tmp_path: Path) -> None:
    rows = [{"__key__": f"k{i}", "t.npy": np.arange(3), **({"cls": 1} if i != 3 else {})} for i in range(4)]
    expect_input_error(write_shards(tmp_path, rows), tmp_path / "out", "data-001.tar", "'k3'", "missing", "cls")
