"""Text fields, field choice, sample origins and big-file splitting used carelessly: each mistake is named."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardload
from shardload.errors import InputError
from shardload.prepare.sources.base import SourceOptions
from shardload.prepare.sources.jsonl import JsonlSource


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_number_after_text_is_named_as_a_number_not_an_ndarray(tmp_path: Path) -> None:
    src = _jsonl(tmp_path / "a.jsonl", [{"tokens": [1], "t": "a"}, {"tokens": [2], "t": 5}])
    with pytest.raises(InputError) as err:
        shardload.prepare([str(src)], tmp_path / "out", progress=False)
    msg = str(err.value)
    assert "a.jsonl: line 2: field 't' holds a number (int64)" in msg, msg
    assert "ndarray" not in msg


def test_none_after_text_in_write_is_named_as_missing(tmp_path: Path) -> None:
    samples = [{"x": np.arange(2), "t": "a"}, {"x": np.arange(2), "t": None}]
    with pytest.raises(InputError, match=r"sample 1: field 't' holds None \(no value\)") as err:
        shardload.write(samples, tmp_path / "out")
    assert "NoneType" not in str(err.value)


def test_a_dtype_for_a_text_field_is_named_as_such(tmp_path: Path) -> None:
    src = _jsonl(tmp_path / "a.jsonl", [{"tokens": [1], "t": "ab"}])
    with pytest.raises(InputError, match=r"a\.jsonl: line 1: --dtype t=int32 names a text field \(str\)") as err:
        shardload.prepare([str(src)], tmp_path / "out", dtypes={"t": "int32"}, progress=False)
    assert "<U2" not in str(err.value)


def test_a_list_of_strings_is_told_apart_from_a_text_field(tmp_path: Path) -> None:
    src = _jsonl(tmp_path / "a.jsonl", [{"tokens": [1], "t": ["a", "b"]}])
    with pytest.raises(
        InputError, match=r"line 1: field 't' holds text \('[ab]'\) inside a list.*one string per sample"
    ):
        shardload.prepare([str(src)], tmp_path / "out", progress=False)


@pytest.mark.parametrize(
    ("array", "value"),
    [
        (pa.array(["ab", "c"], pa.string_view()), "ab"),
        (pa.array([b"\xffb", b"c"], pa.binary_view()), b"\xffb"),
        (pa.array([b"ab", b"cd"], pa.binary(2)), b"ab"),
    ],
    ids=["string_view", "binary_view", "fixed_size_binary"],
)
def test_other_arrow_string_and_binary_types_are_text(tmp_path: Path, array: pa.Array, value: object) -> None:
    pq.write_table(pa.table({"tokens": pa.array([[1, 2], [3]], pa.list_(pa.int32())), "t": array}), tmp_path / "a.pq")
    shardload.prepare([str(tmp_path / "a.pq")], tmp_path / "out", progress=False, shuffle=False)
    ds = shardload.open(tmp_path / "out")
    assert ds[0]["t"] == value
    assert ds.schema.field("t").dtype == ("str" if isinstance(value, str) else "bytes")


def test_a_list_of_strings_column_says_a_text_field_is_one_string_per_row(tmp_path: Path) -> None:
    pq.write_table(
        pa.table({"tokens": pa.array([[1]], pa.list_(pa.int32())), "t": pa.array([["a"]])}), tmp_path / "a.pq"
    )
    with pytest.raises(InputError, match=r"a\.pq: column 't' \(list<element: string>\).*one string per row") as err:
        shardload.prepare([str(tmp_path / "a.pq")], tmp_path / "out", progress=False)
    assert "every field must hold numbers" not in str(err.value)


def test_drop_fields_of_every_field_says_so(tmp_path: Path) -> None:
    src = _jsonl(tmp_path / "a.jsonl", [{"tokens": [1], "t": "a"}])
    with pytest.raises(InputError, match=r"a\.jsonl: line 1: --drop-fields leaves no field \(its fields: tokens, t\)"):
        shardload.prepare([str(src)], tmp_path / "out", drop_fields=["tokens", "t"], progress=False)
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize(
    "choice", [{"fields": ["t"]}, {"drop_fields": ["tokens"]}], ids=["fields-without-it", "drop-fields-with-it"]
)
def test_a_length_field_left_out_by_field_choice_is_refused_up_front(tmp_path: Path, choice: dict) -> None:
    src = _jsonl(tmp_path / "a.jsonl", [{"tokens": [1], "t": "a"}])
    with pytest.raises(InputError, match=r"length_field 'tokens' is left out by --(drop-)?fields") as err:
        shardload.prepare([str(src)], tmp_path / "out", length_field="tokens", progress=False, **choice)
    assert "is not a field of the samples" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_a_length_field_a_map_makes_may_be_outside_the_chosen_fields(tmp_path: Path) -> None:
    src = _jsonl(tmp_path / "a.jsonl", [{"tokens": [1], "t": "abc"}])

    def encode(sample: dict) -> dict:
        return {"ids": np.frombuffer(sample["t"].encode(), dtype=np.uint8)}

    shardload.prepare([str(src)], tmp_path / "out", fields=["t"], map=encode, length_field="ids", progress=False)
    assert shardload.open(tmp_path / "out")[0]["ids"].tolist() == list(b"abc")


def test_a_webdataset_text_member_that_is_not_utf8_says_what_to_do(tmp_path: Path) -> None:
    with tarfile.open(tmp_path / "a.tar", "w") as tf:
        for name, data in (("k1.txt", b"ok"), ("k2.txt", b"\xff bad")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    with pytest.raises(InputError, match=r"a\.tar: member 'k2\.txt': not valid UTF-8 \(byte 1\).*\.bin"):
        shardload.prepare([str(tmp_path / "a.tar")], tmp_path / "out", progress=False)


def _units(path: Path, unit_bytes: int) -> list:
    options = SourceOptions(unit_bytes=unit_bytes)
    return JsonlSource.make_units([str(path)], options), options


@pytest.mark.parametrize("cut", ["mid-line", "at-a-newline"])
def test_a_jsonl_file_truncated_after_its_units_were_cut_is_a_changed_file(tmp_path: Path, cut: str) -> None:
    src = _jsonl(tmp_path / "a.jsonl", [{"tokens": [i], "t": f"line {i}"} for i in range(200)])
    units, options = _units(src, 400)
    assert len(units) > 2
    middle = units[1]
    start, stop = middle.part
    data = src.read_bytes()
    end = (start + stop) // 2 if cut == "mid-line" else data.rindex(b"\n", start, stop - 1) + 1
    src.write_bytes(data[:end])
    with pytest.raises(InputError, match=r"a\.jsonl: line \d+: the file changed while prepare read it"):
        list(JsonlSource.read(middle, options))


@pytest.mark.parametrize("bad", [True, 3.0, "3", None], ids=repr)
def test_origin_of_a_non_integer_is_a_type_error(tmp_path: Path, bad: object) -> None:
    shardload.write([{"x": np.arange(3)} for _ in range(5)], tmp_path / "out")
    ds = shardload.open(tmp_path / "out")
    with pytest.raises(TypeError, match=r"sample id must be an integer"):
        ds.origin(bad)  # type: ignore[arg-type]
    assert ds.origin(np.int64(4)).position in range(5)
    with pytest.raises(IndexError, match="out of range"):
        ds.origin(5)


@pytest.mark.parametrize("damage", ["garbage", "too-few-rows", "unknown-kind"])
def test_verify_reports_damaged_sample_origins(tmp_path: Path, damage: str) -> None:
    from shardload.sets.verify import verify

    shardload.write([{"x": np.arange(3), "t": "a"} for _ in range(5)], tmp_path / "out")
    path = tmp_path / "out" / "origins.arrow"
    assert verify(tmp_path / "out").ok
    if damage == "garbage":
        path.write_bytes(b"garbage")
    else:
        table = pa.ipc.open_file(pa.py_buffer(path.read_bytes())).read_all()
        if damage == "too-few-rows":
            table = table.slice(0, 4)
        else:
            kinds = pa.array(["index"] * 4 + ["bogus"]).dictionary_encode()
            table = table.set_column(1, "kind", kinds)
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    report = verify(tmp_path / "out")
    assert [(p.file, p.reason) for p in report.problems] == [("origins.arrow", "unreadable")], report.problems
    want = {"garbage": "cannot be read", "too-few-rows": "4 entries for 5 samples", "unknown-kind": "'bogus'"}[damage]
    assert want in report.problems[0].detail
    assert shardload.open(tmp_path / "out")[0]["t"] == "a"  # the samples are not affected


@pytest.mark.parametrize("damage", ["garbage", "truncated", "too-few", "duplicate", "out-of-range"])
def test_verify_reports_a_damaged_sample_order_index(tmp_path: Path, damage: str) -> None:
    from shardload.sets.verify import verify

    # origin(i) reads origin.npy to find the pieces of a split record: a damage there must not pass verify
    shardload.write([{"x": np.arange(3)} for _ in range(6)], tmp_path / "out")
    path = tmp_path / "out" / "origin.npy"
    assert verify(tmp_path / "out").ok
    order = np.load(path)
    if damage == "garbage":
        path.write_bytes(b"garbage")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:-8])
    elif damage == "too-few":
        np.save(path, order[:5])
    elif damage == "duplicate":
        order[1] = order[0]
        np.save(path, order)
    else:
        order[2] = 6
        np.save(path, order)
    report = verify(tmp_path / "out")
    assert [(p.file, p.reason) for p in report.problems] == [("origin.npy", "unreadable")], report.problems
    want = {
        "garbage": "not a valid .npy",
        "truncated": "truncated",
        "too-few": "expected 6 integers",
        "duplicate": "source position",
        "out-of-range": "outside [0, 6)",
    }[damage]
    assert want in report.problems[0].detail
    (tmp_path / "out" / "origin.npy").unlink()
    # a set copied without origin.npy is valid: origin(i) says its pieces are not recorded
    assert verify(tmp_path / "out").ok
