"""Source data that prepare used to take silently wrong: damaged compressed files, lossy casts, huge records.

Each test builds a small input that numpy, tarfile, json or pyarrow accept as
something other than what is written in it (a damaged ``.tar.gz`` read short
of its CRC, ``16777217`` rounded into a float32, ``1e400`` parsed as ``inf``, a
key given twice, ``x`` and ``x.npy`` in one ``.npz``), and checks that prepare
either stores exactly the values written or refuses with an ``InputError``
naming the file, the record and the field.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import random
import tarfile
import warnings
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import shardload
from shardload.prepare.sources import SourceOptions, SourceUnit, read_unit
from shardload.schema.cast import CastError, cast_exact
from shardload.schema.fields import SUPPORTED_DTYPES


def read_all(kind: str, path: Path, **options: Any) -> list[tuple[str, dict[str, np.ndarray]]]:
    """Every sample of one file, read as prepare reads it."""
    return [(w, dict(s)) for w, s in read_unit(SourceUnit(kind, (str(path),)), SourceOptions(**options))]


def refused(call: Callable[[], object], *fragments: str) -> str:
    with pytest.raises(shardload.InputError) as info:
        call()
    msg = str(info.value)
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in {msg!r}"
    return msg


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def tar_bytes(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def tokens(i: int) -> np.ndarray:
    return np.arange(100 * i, 100 * i + 50, dtype=np.int32)


# -- damaged compressed and columnar files --------------------------------------------------------------
COMPRESSORS = {
    ".tar.gz": lambda data: gzip.compress(data, mtime=0),
    ".tar.bz2": bz2.compress,
    ".tar.xz": lzma.compress,
}
DECOMPRESSORS = {".tar.gz": gzip.decompress, ".tar.bz2": bz2.decompress, ".tar.xz": lzma.decompress}


@pytest.mark.parametrize("suffix", sorted(COMPRESSORS))
def test_a_compressed_tar_that_its_codec_rejects_is_refused(tmp_path: Path, suffix: str) -> None:
    # tarfile stops at the archive's end marker and never checks gzip's CRC: a flipped bit gave other values
    good = COMPRESSORS[suffix](tar_bytes([(f"{i:04d}.tok.npy", npy_bytes(tokens(i))) for i in range(20)]))
    rng = random.Random(13)
    path = tmp_path / f"bad{suffix}"
    tried = 0
    for pos in rng.sample(range(len(good) // 3, len(good)), 60):
        bad = bytearray(good)
        bad[pos] ^= 1 << rng.randrange(8)
        try:
            DECOMPRESSORS[suffix](bytes(bad))
            continue  # the codec itself accepts it: not a damaged file
        except (OSError, EOFError, ValueError, lzma.LZMAError, zlib.error):
            pass
        tried += 1
        path.write_bytes(bad)
        refused(lambda: read_all("webdataset", path), str(path))
    assert tried >= 10


def test_a_damaged_gzip_crc_of_a_tar_is_refused(tmp_path: Path) -> None:
    good = gzip.compress(tar_bytes([("0.tok.npy", npy_bytes(tokens(0)))]), mtime=0)
    bad = bytearray(good)
    bad[-8] ^= 1  # the CRC32 of the uncompressed data
    (tmp_path / "a.tar.gz").write_bytes(bytes(bad))
    refused(lambda: read_all("webdataset", tmp_path / "a.tar.gz"), "a.tar.gz", "CRC")


def test_parquet_page_checksums_are_verified(tmp_path: Path) -> None:
    rows = [tokens(i).tolist() for i in range(20)]
    table = pa.table({"tok": pa.array(rows, pa.list_(pa.int32()))})
    path = tmp_path / "crc.parquet"
    pq.write_table(table, path, write_page_checksum=True, compression="none")
    data = bytearray(path.read_bytes())
    at = data.find(np.int32(205).tobytes())
    data[at] ^= 4  # 205 -> 201: still a well-formed file
    path.write_bytes(bytes(data))
    refused(lambda: read_all("parquet", path), "crc.parquet", "CRC checksum")


def test_arrow_ipc_offsets_that_go_backwards_are_refused(tmp_path: Path) -> None:
    table = pa.table({"tok": pa.array([tokens(i).tolist() for i in range(20)], pa.list_(pa.int32()))})
    path = tmp_path / "a.arrow"
    with pa.ipc.new_file(path, table.schema) as writer:
        writer.write_table(table)
    data = bytearray(path.read_bytes())
    at = data.find(np.arange(0, 1001, 50, dtype=np.int32).tobytes())
    data[at + 12 : at + 16] = np.int32(40).tobytes()  # offsets 0, 50, 100, 40, 200: row 2 empty, row 3 160 long
    path.write_bytes(bytes(data))
    refused(lambda: read_all("arrow", path), "a.arrow", "non-monotonic offset")


# -- one exact cast rule --------------------------------------------------------------------------------
LOSSY_CASTS = [
    ("int rounded by float32", np.array([16777217]), "float32", "16777217"),
    ("int to inf in float16", np.array([70000]), "float16", "70000"),
    ("int rounded by float64", np.array([2**53 + 1]), "float64", "9007199254740993"),
    ("uint64 max to inf", np.array([2**64 - 1], np.uint64), "float16", "18446744073709551615"),
    ("float underflow to 0", np.array([1e-50]), "float32", "1e-50"),
    ("float overflow to inf", np.array([1.0, 1e300]), "float32", "1e+300"),
    ("fraction to int", np.array([1.0, 2.5]), "int32", "2.5"),
    ("nan to int", np.array([np.nan]), "int64", "nan"),
    ("2**63 to int64", np.array([2.0**63]), "int64", "9.223372036854776e+18"),
    ("negative to unsigned", np.array([-1]), "uint32", "-1"),
    ("uint64 to int64", np.array([2**63], np.uint64), "int64", "9223372036854775808"),
    ("2 to bool", np.array([0, 1, 2]), "bool", "2"),
]


@pytest.mark.parametrize(("arr", "dtype", "value"), [c[1:] for c in LOSSY_CASTS], ids=[c[0] for c in LOSSY_CASTS])
def test_dtype_casts_that_change_a_value_are_refused_by_value(
    tmp_path: Path, arr: np.ndarray, dtype: str, value: str
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "overflow encountered in cast" was the only sign
        refused(
            lambda: shardload.write([{"t": arr}], tmp_path / "o", dtypes={"t": dtype}),
            "sample 0",
            "'t'",
            dtype,
            value,
            str(arr.dtype),
        )


def test_reject_nonfinite_is_not_blamed_for_an_inf_a_cast_would_make(tmp_path: Path) -> None:
    msg = refused(
        lambda: shardload.write(
            [{"x": np.array([70000])}], tmp_path / "o", dtypes={"x": "float16"}, reject_nonfinite=True
        ),
        "'x'",
        "cannot be cast to float16",
        "70000",
    )
    assert "--reject-nonfinite" not in msg


EXACT_CASTS = [
    (np.array([3.0, -2.0]), "int8"),
    (np.array([2**24, 2**60]), "float32"),
    (np.array([0, 1]), "bool"),
    (np.array([True, False]), "float16"),
    (np.array([0.1, np.inf, np.nan]), "float32"),  # rounding to the nearest float32 is what float32 is for
    (np.array([65504.0]), "float16"),
    (np.array([5], np.uint64), "int8"),
]


def _write_source(kind: str, directory: Path, arr: np.ndarray) -> tuple[Path, dict[str, Any]]:
    """``arr`` as field ``t`` of one sample in a source of ``kind``: ``(path, extra prepare options)``."""
    as_json = json.dumps({"t": arr.tolist()})  # NaN as JSON's NaN literal, bools as true/false
    if kind in ("parquet", "arrow"):
        table = pa.table({"t": pa.array([arr], type=pa.list_(pa.from_numpy_dtype(arr.dtype)))})
        path = directory / f"a.{kind}"
        if kind == "parquet":
            pq.write_table(table, path)
        else:
            with pa.ipc.new_file(path, table.schema) as writer:
                writer.write_table(table)
        return path, {}
    if kind in ("npy", "npz"):
        path = directory / kind
        path.mkdir()
        if kind == "npy":
            np.save(path / "0.npy", arr)
        else:
            np.savez(path / "0.npz", t=arr)
        return path, {"field": "t"} if kind == "npy" else {}
    path = directory / ("a.jsonl" if kind == "jsonl" else "a.tar")
    if kind == "jsonl":
        path.write_text(as_json + "\n")
    elif kind == "webdataset .npy":
        path.write_bytes(tar_bytes([("0.t.npy", npy_bytes(arr))]))
    else:
        path.write_bytes(tar_bytes([("0.t.json", json.dumps(arr.tolist()).encode())]))
    return path, {}


SOURCE_KINDS = ["write", "jsonl", "parquet", "arrow", "npy", "npz", "webdataset .npy", "webdataset .json"]
SAME_OUTCOME_CASTS = [
    ("3.0 to int32", np.array([3.0, -4.0]), "int32", True),
    ("bool to int8", np.array([True, False]), "int8", True),
    ("NaN to float16", np.array([np.nan, 1.5]), "float16", True),
    ("3.5 to int32", np.array([3.0, 3.5]), "int32", False),
    ("300 to int8", np.array([1, 300]), "int8", False),
    ("NaN to int32", np.array([1.0, np.nan]), "int32", False),
    ("2 to bool", np.array([1, 2]), "bool", False),
    ("16777217 to float32", np.array([16777217]), "float32", False),
]


@pytest.mark.parametrize("kind", SOURCE_KINDS)
@pytest.mark.parametrize(
    ("arr", "dtype", "accepted"), [c[1:] for c in SAME_OUTCOME_CASTS], ids=[c[0] for c in SAME_OUTCOME_CASTS]
)
def test_a_dtype_cast_has_the_same_outcome_from_every_source(
    tmp_path: Path, kind: str, arr: np.ndarray, dtype: str, accepted: bool
) -> None:
    # One rule, cast_exact: whole numbers become integers exactly (docs/cli.md, --dtype), whatever the source.
    out = tmp_path / "o"
    options: dict[str, Any] = {"dtypes": {"t": dtype}, "progress": False}
    source, extra = (None, {}) if kind == "write" else _write_source(kind, tmp_path, arr)

    def run() -> None:
        if source is None:
            shardload.write([{"t": arr}], out, **options)
        else:
            shardload.prepare(source, out, **options, **extra)

    if not accepted:
        refused(run, "'t'", dtype)
        return
    run()
    got = shardload.open(out)[0]["t"]
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, arr.astype(dtype))


@pytest.mark.parametrize(("arr", "dtype"), EXACT_CASTS, ids=[f"{a.dtype}->{d}" for a, d in EXACT_CASTS])
def test_casts_that_keep_every_value_are_made(tmp_path: Path, arr: np.ndarray, dtype: str) -> None:
    shardload.write([{"t": arr}], tmp_path / "o", dtypes={"t": dtype})
    got = shardload.open(tmp_path / "o")[0]["t"]
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, arr.astype(dtype))


@settings(max_examples=300, deadline=None)
@given(
    arr=hnp.arrays(
        st.sampled_from([np.dtype(d) for d in SUPPORTED_DTYPES]),
        hnp.array_shapes(min_dims=0, max_dims=2, max_side=4),
        elements={"allow_subnormal": True},
    ),
    dtype=st.sampled_from(SUPPORTED_DTYPES),
)
def test_cast_exact_keeps_every_value_or_refuses(arr: np.ndarray, dtype: str) -> None:
    """The one rule, as a property: each value comes back equal (floats: rounded, never to inf or 0) or CastError."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            out = cast_exact(arr, dtype)
        except CastError as exc:
            assert "index" in str(exc) or "cannot become" in str(exc)
            return
    assert out.dtype == np.dtype(dtype) and out.shape == arr.shape
    for a, b in zip(arr.reshape(-1).tolist(), out.reshape(-1).tolist()):
        if isinstance(a, float) and isinstance(b, float) and arr.dtype.kind == "f" and out.dtype.kind == "f":
            assert (a != a) == (b != b)  # NaN stays NaN
            if a == a:
                assert (a == 0) == (b == 0) and (abs(a) == float("inf")) == (abs(b) == float("inf"))
        else:
            assert a == b, f"{a!r} ({arr.dtype}) became {b!r} ({out.dtype})"


JSON_LINES = [
    ("int rounded by float32 dtype", '{"a": [16777217]}', {"a": "float32"}, ["'a'", "16777217", "float32"]),
    ("1e400 is not inf", '{"a": [1.5, 1e400]}', {}, ["1e400", "inf"]),
    ("1e-400 is not 0", '{"a": [1e-400]}', {}, ["1e-400", "0"]),
    ("1e-50 underflows float32", '{"a": [1e-50]}', {}, ["'a'", "1e-50", "float32", "--dtype"]),
    ("key twice", '{"a": [1], "a": [2]}', {}, ["'a'", "twice"]),
    ("key twice, spaced", '{"a": [1], "a" : [2]}', {}, ["'a'", "twice"]),
    ("key twice, escaped", '{"a": [1], "\\u0061": [2]}', {}, ["'a'", "twice"]),
    ("1e400 next to Infinity", '{"a": [Infinity, 1e400]}', {}, ["1e400", "inf"]),
    ("1e-400 next to a 0", '{"a": [0.0, 1e-400]}', {}, ["1e-400", "0"]),
    ("300 zeros then a digit", '{"a": [0.' + "0" * 400 + "1]}", {}, ["0.000", "0"]),
    ("bools mixed with numbers", '{"a": [1, true]}', {}, ["'a'", "true/false", "--dtype"]),
    ("int rounded by float32 among fractions", '{"a": [16777217, 0.5]}', {}, ["'a'", "16777217", "float32"]),
    ("same, nested", '{"a": [[0.5, 1], [2, 16777217]]}', {}, ["'a'", "16777217", "index (1, 1)"]),
    (
        "int rounded by float64 among fractions",
        '{"a": [9007199254740993, 0.5]}',
        {"a": "float64"},
        ["9007199254740993"],
    ),
    (
        "int beyond 64 bits among fractions",
        '{"a": [0.5, 18446744073709551621]}',
        {},
        ["18446744073709551621", "64 bits"],
    ),
]


@pytest.mark.parametrize(("line", "dtypes", "fragments"), [c[1:] for c in JSON_LINES], ids=[c[0] for c in JSON_LINES])
def test_json_values_that_would_change_are_refused(
    tmp_path: Path, line: str, dtypes: dict[str, str], fragments: list[str]
) -> None:
    (tmp_path / "a.jsonl").write_text('{"a": [1]}\n' + line + "\n")
    refused(lambda: read_all("jsonl", tmp_path / "a.jsonl", dtypes=dtypes), "a.jsonl: line 2", *fragments)


def test_json_integers_among_fractions_are_stored_exactly(tmp_path: Path) -> None:
    # numpy puts the integers of a mixed list into float64 first; an integer dtype still gets them exactly.
    (tmp_path / "a.jsonl").write_text('{"a": [9007199254740993, 2.0], "b": [16777216, 0.5, 1e30]}\n')
    [(_, sample)] = read_all("jsonl", tmp_path / "a.jsonl", dtypes={"a": "int64"})
    assert sample["a"].tolist() == [2**53 + 1, 2]
    assert sample["b"].dtype == np.float32 and sample["b"][:2].tolist() == [16777216.0, 0.5]


def test_json_booleans_count_as_numbers_only_with_a_dtype(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"a": [1, true]}\n')
    [(_, sample)] = read_all("jsonl", tmp_path / "a.jsonl", dtypes={"a": "int8"})
    np.testing.assert_array_equal(sample["a"], np.array([1, 1], np.int8))
    # the hint of a bool/int mix (--dtype a=bool) is one that works
    (tmp_path / "b.jsonl").write_text('{"a": true}\n{"a": 1}\n')
    msg = refused(lambda: shardload.prepare(tmp_path / "b.jsonl", tmp_path / "o1"), "--dtype a=bool")
    assert "line 2" in msg
    shardload.prepare(tmp_path / "b.jsonl", tmp_path / "o2", dtypes={"a": "bool"}, shuffle=False)
    assert [bool(s["a"]) for s in shardload.open(tmp_path / "o2")] == [True, True]


def test_webdataset_text_and_json_members_use_the_same_rule(tmp_path: Path) -> None:
    for name, data, fragments in [
        ("k.n.txt", b"1e400", ["'k.n.txt'", "inf"]),
        ("k.n.txt", b"1e-50", ["'k.n.txt'", "'n'", "float32"]),
        ("k.n.txt", b"16777217", ["'k.n.txt'", "'n'", "16777217"]),
        ("k.json", b'{"n": [1], "n": [2]}', ["'k.json'", "twice"]),
        ("k.json", b'{"n": [16777217, 0.5]}', ["'k.json'", "'n'", "16777217", "float32"]),
    ]:
        path = tmp_path / "a.tar"
        path.write_bytes(tar_bytes([(name, data)]))
        dtypes = {"n": "float32"}  # a .txt member is one number only with a dtype (else it is text)
        refused(lambda p=path, d=dtypes: read_all("webdataset", p, dtypes=d), "a.tar", *fragments)


# -- bounded records ----------------------------------------------------------------------------------
def test_a_json_line_beyond_the_bound_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl.gz"
    with gzip.open(path, "wt") as fh:  # a small file: one line padded with spaces
        fh.write('{"a": [1]}\n{"a": [2' + " " * 200_000 + "]}\n")
    refused(lambda: read_all("jsonl", path, max_record_bytes=10_000), "a.jsonl.gz: line 2", "10,000 bytes", "RECORD")
    assert len(read_all("jsonl", path, max_record_bytes=300_000)) == 2
    exactly = tmp_path / "b.jsonl"
    exactly.write_text('{"a": [1]}\n')  # 11 bytes with its newline
    assert len(read_all("jsonl", exactly, max_record_bytes=10)) == 1


def test_tar_members_beyond_the_bound_are_refused(tmp_path: Path) -> None:
    big = npy_bytes(np.zeros(100_000, np.uint8))
    (tmp_path / "a.tar").write_bytes(tar_bytes([("k.x.npy", big)]))
    refused(lambda: read_all("webdataset", tmp_path / "a.tar", max_record_bytes=10_000), "'k.x.npy'", "10,000")
    (tmp_path / "b.tar").write_bytes(tar_bytes([("k.x.npy.gz", gzip.compress(big))]))  # 100 KB in ~200 bytes
    refused(lambda: read_all("webdataset", tmp_path / "b.tar", max_record_bytes=10_000), "gunzipped", "10,000")
    (tmp_path / "c.tar").write_bytes(tar_bytes([("k.npz", _npz({"x": np.zeros(100_000, np.uint8)}))]))
    refused(lambda: read_all("webdataset", tmp_path / "c.tar", max_record_bytes=10_000), "'x'", "10,000")
    assert len(read_all("webdataset", tmp_path / "b.tar")) == 1


def test_the_bound_is_raised_by_environment_or_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDLOAD_MAX_RECORD_BYTES", "1k")
    assert SourceOptions().max_record_bytes == 1024
    monkeypatch.setenv("SHARDLOAD_MAX_RECORD_BYTES", "lots")
    refused(SourceOptions, "SHARDLOAD_MAX_RECORD_BYTES", "lots")
    monkeypatch.delenv("SHARDLOAD_MAX_RECORD_BYTES")
    (tmp_path / "a.jsonl").write_text('{"a": [' + ",".join(["1"] * 1000) + "]}\n")
    refused(lambda: shardload.prepare(tmp_path / "a.jsonl", tmp_path / "o", max_record_bytes=100), "line 1")
    refused(lambda: SourceOptions(max_record_bytes=0), "max_record_bytes")


# -- numpy files ----------------------------------------------------------------------------------------
def _npz(arrays: dict[str, np.ndarray], extra: list[tuple[str, bytes]] = ()) -> bytes:  # type: ignore[assignment]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, arr in arrays.items():
            zf.writestr(name + ".npy", npy_bytes(arr))
        for name, data in extra:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # zipfile warns about a duplicate name: that is the point
                zf.writestr(name, data)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        ([("x", npy_bytes(np.array([9])))], ["'x'", "not an .npy"]),
        ([("x.npy", npy_bytes(np.array([9])))], ["'x'", "two members"]),
        ([("readme.txt", b"hello")], ["'readme.txt'", "not an .npy"]),
    ],
    ids=["x and x.npy", "one name twice", "a text member"],
)
def test_npz_members_that_numpy_would_merge_or_mistake_are_refused(
    tmp_path: Path, extra: list[tuple[str, bytes]], fragments: list[str]
) -> None:
    path = tmp_path / "a.npz"
    path.write_bytes(_npz({"x": np.array([1, 2])}, extra))
    refused(lambda: read_all("npz", path), "a.npz", *fragments)
    (tmp_path / "a.tar").write_bytes(tar_bytes([("k.npz", path.read_bytes())]))
    refused(lambda: read_all("webdataset", tmp_path / "a.tar"), "'k.npz'", *fragments)


def test_npz_arrays_named_like_npy_files_keep_their_own_data(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", **{"x": np.arange(3), "x.npy": np.arange(5)})
    [(_, sample)] = read_all("npz", tmp_path / "a.npz")
    np.testing.assert_array_equal(sample["x"], np.arange(3))
    np.testing.assert_array_equal(sample["x.npy"], np.arange(5))


def test_npy_file_with_two_arrays_or_a_short_body_is_refused(tmp_path: Path) -> None:
    with open(tmp_path / "two.npy", "wb") as fh:
        np.save(fh, np.arange(3))
        np.save(fh, np.arange(4))  # the second array was silently dropped
    refused(lambda: read_all("npy", tmp_path / "two.npy"), "two.npy", "more than one array")
    data = npy_bytes(np.arange(100))
    (tmp_path / "short.npy").write_bytes(data[:-8])
    refused(lambda: read_all("npy", tmp_path / "short.npy"), "short.npy", "truncated")


def test_npy_format_on_a_file_that_is_not_npy_says_what_it_is(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_text("hello world\n")
    msg = refused(lambda: read_all("npy", tmp_path / "t.txt"), "t.txt", "not an .npy")
    assert "pickle" not in msg
    np.savez(tmp_path / "z.npz", x=np.arange(3))
    refused(lambda: read_all("npy", tmp_path / "z.npz"), "z.npz", "--source-format npz")


# -- write(): what Python objects arrive as ------------------------------------------------------------
def test_torch_tensors_that_require_grad_are_stored_as_their_values(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    t = torch.arange(5.0, requires_grad=True) * 2  # a non-leaf with a grad_fn
    shardload.write([{"t": t}], tmp_path / "o")
    np.testing.assert_array_equal(shardload.open(tmp_path / "o")[0]["t"], np.arange(5.0, dtype=np.float32) * 2)
    refused(
        lambda: shardload.write([{"t": torch.ones(3, dtype=torch.bfloat16)}], tmp_path / "o2"),
        "sample 0",
        "'t'",
        "bfloat16",
    )


def test_masked_arrays_are_refused_unless_nothing_is_masked(tmp_path: Path) -> None:
    masked = np.ma.masked_array([1, 2, 3], mask=[0, 1, 0])
    refused(lambda: shardload.write([{"t": masked}], tmp_path / "o"), "sample 0", "'t'", "masked", "filled")
    shardload.write([{"t": np.ma.masked_array([1, 2, 3])}], tmp_path / "o2")
    np.testing.assert_array_equal(shardload.open(tmp_path / "o2")[0]["t"], [1, 2, 3])


def test_write_of_one_dict_or_a_path_says_what_it_takes(tmp_path: Path) -> None:
    sample = {"t": np.arange(3)}
    refused(lambda: shardload.write(sample, tmp_path / "o"), "one sample", "'t'", "[sample]")
    refused(lambda: shardload.write(str(tmp_path / "x.jsonl"), tmp_path / "o"), "x.jsonl", "prepare")  # type: ignore[arg-type]
    assert not (tmp_path / "o").exists()


def test_write_of_something_not_iterable_says_what_it_takes(tmp_path: Path) -> None:
    refused(lambda: shardload.write(5, tmp_path / "o"), "write() takes an iterable of samples", "int")  # type: ignore[arg-type]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "value",
    [bytearray(b"abcd"), memoryview(b"abcd"), memoryview(bytearray(b"abcd"))],
    ids=["bytearray", "memoryview", "memoryview of a bytearray"],
)
def test_raw_bytes_in_a_field_are_refused_alike(tmp_path: Path, value: Any) -> None:
    # Raw bytes carry no dtype: a bytearray or memoryview was stored as uint8 while bytes was refused.
    # (A bytes value is a text field of bytes: tests/test_text_fields.py.)
    samples = [{"t": np.arange(3), "x": np.arange(4, dtype=np.uint8)}, {"t": np.arange(2), "x": value}]
    refused(lambda: shardload.write(samples, tmp_path / "o"), "sample 1", "'x'", "raw bytes", "np.frombuffer")
    refused(lambda: shardload.write(samples[1:], tmp_path / "p"), "sample 0", "'x'", "raw bytes")
    assert not (tmp_path / "p").exists()  # refused on the first sample: nothing created


def test_a_memoryview_of_typed_values_is_stored_as_them(tmp_path: Path) -> None:
    shardload.write([{"t": memoryview(np.arange(5, dtype=np.int32))}], tmp_path / "o", progress=False)
    got = shardload.open(tmp_path / "o")[0]["t"]
    assert got.dtype == np.int32 and got.tolist() == [0, 1, 2, 3, 4]


def test_json_round_trip_of_exact_values(tmp_path: Path) -> None:
    """What is accepted is stored exactly: extreme but representable values, NaN and Infinity survive JSON."""
    line = {"i": [2**62, -(2**63)], "f": [1e-300, 1.5e300, 0.0], "h": [65504.0, 6e-8], "x": [float("inf"), 0.5]}
    (tmp_path / "a.jsonl").write_text(json.dumps(line) + "\n" + '{"i": [1, 2], "f": [0.0], "h": [0], "x": [NaN]}\n')
    [(_, s), (_, t)] = read_all("jsonl", tmp_path / "a.jsonl", dtypes={"f": "float64", "h": "float16"})
    assert s["i"].tolist() == line["i"]
    assert s["f"].tolist() == line["f"]
    assert s["h"].dtype == np.float16 and s["h"][0] == 65504.0 and s["h"][1] != 0
    assert s["x"].tolist() == [float("inf"), 0.5] and np.isnan(t["x"]).all()
