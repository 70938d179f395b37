"""Text (str/bytes) fields: from every source kind to ds[i] and to batches, and what is refused."""

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
from shardload import Batching, Mixture, make_loader
from shardload.errors import InputError, ManifestError, ShardloadError


def _samples(n: int = 24) -> list[dict]:
    return [
        {
            "tokens": np.arange(i % 7 + 1, dtype=np.int32) + i,
            "caption": f"caption {i} é" * (i % 3 + 1),
            "raw": bytes([i, 0, 255]),
        }
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def text_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("text") / "set"
    shardload.write(_samples(), out, num_shards=3)
    return out


def _by_tokens(samples: list[dict]) -> dict[int, dict]:
    return {int(s["tokens"][0]): s for s in samples}


def test_ds_getitem_gives_str_and_bytes(text_set: Path) -> None:
    ds = shardload.open(text_set)
    want = _by_tokens(_samples())
    assert ds.schema.field("caption").dtype == "str" and ds.schema.field("raw").dtype == "bytes"
    assert [f.name for f in ds.schema.variable_fields] == ["tokens"]  # text never defines a length
    for i in range(len(ds)):
        got = ds[i]
        src = want[int(got["tokens"][0])]
        assert isinstance(got["caption"], str) and got["caption"] == src["caption"]
        assert isinstance(got["raw"], bytes) and got["raw"] == src["raw"]
    assert np.array_equal(ds.lengths, [len(ds[i]["tokens"]) for i in range(len(ds))])
    manifest = json.loads((text_set / "manifest.json").read_text())
    assert manifest["format_version"] == 2


def _check_batches(loader: object, packed: bool = False) -> int:
    want = _by_tokens(_samples())
    seen = 0
    for batch in loader:  # type: ignore[attr-defined]
        assert isinstance(batch["caption"], list) and isinstance(batch["raw"], list)
        assert len(batch["caption"]) == len(batch["sample_id"])
        for k in range(len(batch["sample_id"])):
            if packed:  # documents in the order of the rows: each one's first token is at its place
                continue
            src = want[int(batch["tokens"][k, 0])]
            assert batch["caption"][k] == src["caption"] and batch["raw"][k] == src["raw"]
            seen += 1
        if packed:
            for k, first in enumerate(_packed_firsts(batch)):
                assert batch["caption"][k] == want[first]["caption"]
                seen += 1
    return seen


def _packed_firsts(batch: dict) -> list[int]:
    doc = batch["document_ids"].numpy()
    tokens = batch["tokens"].numpy()
    firsts = []
    for d in range(len(batch["sample_id"])):
        r, p = np.argwhere(doc == d)[0]
        firsts.append(int(tokens[r, p]))
    return firsts


@pytest.mark.parametrize("workers", [0, 2])
def test_padded_batches_carry_text_lists(text_set: Path, workers: int) -> None:
    loader = make_loader(
        text_set, rank=0, world_size=1, stage="val", batching=Batching(batch_size=5), num_workers=workers
    )
    assert _check_batches(loader) == 24


@pytest.mark.parametrize("workers", [0, 2])
def test_packed_batches_carry_text_lists_in_row_order(text_set: Path, workers: int) -> None:
    batching = Batching(packing=True, pack_length=16, rows_per_batch=2)
    loader = make_loader(text_set, rank=0, world_size=1, stage="val", batching=batching, num_workers=workers)
    assert _check_batches(loader, packed=True) == 24


def test_pinned_and_shared_batches_keep_text(text_set: Path) -> None:
    from shardload.load.dataset import BatchArena, BatchKey, ShardBatchDataset

    ds = ShardBatchDataset(text_set)
    arena = BatchArena(shared_from=0)  # force the shared buffer path of a worker
    out = ds.fetch(np.arange(4, dtype=np.int64), np.ones(4, np.float32), arena)
    batch = arena.batch({k: v for k, v in out.items() if isinstance(v, list)}).tensors()
    assert batch["caption"] == [shardload.open(text_set)[i]["caption"] for i in range(4)]
    assert isinstance(BatchKey(0, np.arange(1), np.ones(1, np.float32)), BatchKey)


def test_mixture_batches_carry_text(text_set: Path, tmp_path: Path) -> None:
    shardload.write(_samples(6), tmp_path / "b")
    mix = Mixture({"a": str(text_set), "b": str(tmp_path / "b")})
    loader = make_loader(mix, rank=0, world_size=1, stage="val", batching=Batching(batch_size=4))
    batch = next(iter(loader))
    assert len(batch["caption"]) == len(batch["sample_id"])


def test_text_as_length_field_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"length_field 'caption' is a text field.*never defines"):
        shardload.write(_samples(2), tmp_path / "o", length_field="caption")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("values", "words"),
    [
        (["a", 3], ["sample 1", "'x'", "int", "str"]),
        ([np.arange(2), "a"], ["sample 1", "'x'", "str", "int64"]),
        (["a", b"b"], ["sample 1", "'x'", "bytes", "str"]),
        (["a", "\ud800"], ["sample 1", "'x'", "not valid Unicode"]),
    ],
    ids=["str-then-number", "array-then-str", "str-then-bytes", "lone-surrogate"],
)
def test_mixed_kinds_and_bad_text_are_refused(tmp_path: Path, values: list, words: list[str]) -> None:
    samples = [{"t": np.arange(3), "x": v} for v in values]
    with pytest.raises(InputError) as err:
        shardload.write(samples, tmp_path / "o")
    for w in words:
        assert w in str(err.value)


def test_jsonl_strings_become_text(tmp_path: Path) -> None:
    src = tmp_path / "a.jsonl"
    src.write_text('{"tokens": [1, 2], "text": "hello"}\n{"tokens": [3], "text": "wörld"}\n')
    shardload.prepare([str(src)], tmp_path / "o", shuffle=False)
    ds = shardload.open(tmp_path / "o")
    assert [ds[i]["text"] for i in range(2)] == ["hello", "wörld"]
    src.write_text('{"tokens": [1, 2], "text": "hello"}\n{"tokens": [3], "text": 5}\n')
    with pytest.raises(InputError, match=r"a.jsonl: line 2.*'text'"):
        shardload.prepare([str(src)], tmp_path / "p")


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_columnar_string_and_binary_columns(tmp_path: Path, kind: str, large: bool) -> None:
    text_type, bin_type = (pa.large_string(), pa.large_binary()) if large else (pa.string(), pa.binary())
    table = pa.table(
        {
            "ids": pa.array([[1, 2], [3]], pa.list_(pa.int32())),
            "s": pa.array(["ab", "ç"], text_type),
            "b": pa.array([b"\x00\xff", b""], bin_type),
        }
    )
    path = tmp_path / f"t.{kind}"
    if kind == "parquet":
        pq.write_table(table, path)
    else:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
    shardload.prepare([str(path)], tmp_path / "o", shuffle=False)
    ds = shardload.open(tmp_path / "o")
    assert [(ds[i]["s"], ds[i]["b"]) for i in range(2)] == [("ab", b"\x00\xff"), ("ç", b"")]


def _tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def test_webdataset_txt_members_are_text(tmp_path: Path) -> None:
    tar = _tar(
        tmp_path / "d.tar",
        {
            "k0.tokens.npy": _npy(np.arange(3)),
            "k0.caption.txt": b"a cat\n",
            "k1.tokens.npy": _npy(np.arange(2)),
            "k1.caption.txt": b"7",
        },
    )
    shardload.prepare([str(tar)], tmp_path / "o", shuffle=False)
    ds = shardload.open(tmp_path / "o")
    assert [ds[i]["caption"] for i in range(2)] == ["a cat\n", "7"]
    bad = _tar(tmp_path / "e.tar", {"k0.tokens.npy": _npy(np.arange(3)), "k0.caption.txt": b"\xff\xfe bad"})
    with pytest.raises(InputError, match=r"k0.caption.txt.*not valid UTF-8"):
        shardload.prepare([str(bad)], tmp_path / "p")


def test_zarr_refuses_text_by_field(tmp_path: Path) -> None:
    pytest.importorskip("zarr")
    with pytest.raises(InputError, match=r"'caption'.*zarr.*--format arrow"):
        shardload.write(_samples(2), tmp_path / "o", shard_format="zarr")
    assert not (tmp_path / "o").exists()


def test_old_readers_refuse_and_new_read_old(text_set: Path, tmp_path: Path) -> None:
    from shardload.formats.manifest import Manifest

    obj = json.loads((text_set / "manifest.json").read_text())
    obj["format_version"] = 1  # a text set claiming the old version is damaged
    with pytest.raises(ManifestError, match="text fields"):
        Manifest.from_json(obj)
    shardload.write([{"t": np.arange(3)}], tmp_path / "num")
    assert json.loads((tmp_path / "num" / "manifest.json").read_text())["format_version"] == 1


def test_inspect_verify_and_export_handle_text(text_set: Path, tmp_path: Path) -> None:
    from shardload.integrations.webdataset_export import to_webdataset
    from shardload.sets.describe import describe, format_description
    from shardload.sets.verify import verify

    info = describe(text_set)
    kinds = {f["name"]: f for f in info["fields"]}
    assert kinds["caption"]["dtype"] == "str" and not kinds["caption"]["variable"]
    assert "caption" in format_description(info)
    assert verify(text_set).ok
    to_webdataset(text_set, tmp_path / "wds")
    tars = sorted((tmp_path / "wds").glob("*.tar"))
    shardload.prepare([str(t) for t in tars], tmp_path / "back", shuffle=False)
    back = shardload.open(tmp_path / "back")
    assert sorted(back[i]["caption"] for i in range(len(back))) == sorted(s["caption"] for s in _samples())


def test_errors_are_shardload_errors() -> None:
    assert issubclass(InputError, ShardloadError)


# -- choosing fields ------------------------------------------------------------------------------------
def test_parquet_fields_reads_only_those_columns(tmp_path: Path) -> None:
    # a column of an unsupported type is never converted when it is not chosen
    table = pa.table({"ids": pa.array([[1, 2], [3]]), "when": pa.array([1, 2], pa.timestamp("s")), "y": [0, 1]})
    pq.write_table(table, tmp_path / "t.parquet")
    shardload.prepare([str(tmp_path / "t.parquet")], tmp_path / "o", fields=["ids", "y"], shuffle=False)
    assert shardload.open(tmp_path / "o").schema.names == ("ids", "y")
    shardload.prepare([str(tmp_path / "t.parquet")], tmp_path / "p", drop_fields=["when"], shuffle=False)
    assert shardload.open(tmp_path / "p").schema.names == ("ids", "y")
    with pytest.raises(InputError, match=r"t.parquet: --fields names \['nope'\].*its fields: ids, when, y"):
        shardload.prepare([str(tmp_path / "t.parquet")], tmp_path / "q", fields=["ids", "nope"])
    with pytest.raises(InputError, match="exclude each other"):
        shardload.prepare([str(tmp_path / "t.parquet")], tmp_path / "r", fields=["ids"], drop_fields=["y"])


def test_jsonl_webdataset_and_write_choose_fields(tmp_path: Path) -> None:
    src = tmp_path / "a.jsonl"
    src.write_text('{"tokens": [1, 2], "meta": {"a": null}, "text": "hi"}\n')
    shardload.prepare([str(src)], tmp_path / "o", drop_fields=["meta"])  # the object is never converted
    assert shardload.open(tmp_path / "o").schema.names == ("tokens", "text")
    with pytest.raises(InputError, match=r"line 1: --drop-fields names \['nope'\]"):
        shardload.prepare([str(src)], tmp_path / "p", drop_fields=["nope"])
    tar = _tar(tmp_path / "d.tar", {"k0.tokens.npy": _npy(np.arange(3)), "k0.caption.txt": b"a"})
    shardload.prepare([str(tar)], tmp_path / "w", fields=["caption"])
    assert shardload.open(tmp_path / "w")[0] == {"caption": "a"}
    shardload.write(_samples(3), tmp_path / "it", fields=["tokens", "raw"])
    assert shardload.open(tmp_path / "it").schema.names == ("tokens", "raw")


def test_cli_fields_flags(tmp_path: Path) -> None:
    from shardload.cli import main

    pq.write_table(pa.table({"ids": pa.array([[1, 2], [3]]), "y": [0, 1]}), tmp_path / "t.parquet")
    assert (
        main(["prepare", str(tmp_path / "t.parquet"), "-o", str(tmp_path / "o"), "--fields", "ids", "--no-progress"])
        == 0
    )
    assert shardload.open(tmp_path / "o").schema.names == ("ids",)
    code = main(
        ["prepare", str(tmp_path / "t.parquet"), "-o", str(tmp_path / "p"), "--drop-fields", "ids", "--no-progress"]
    )
    assert code == 0 and shardload.open(tmp_path / "p").schema.names == ("y",)


# -- where a sample came from ---------------------------------------------------------------------------
def test_origin_of_every_source_kind(tmp_path: Path) -> None:
    from shardload import SampleOrigin

    (tmp_path / "a.jsonl").write_text('{"t": [1]}\n\n{"t": [2, 3]}\n')
    pq.write_table(pa.table({"t": pa.array([[4], [5, 6]])}), tmp_path / "b.parquet")
    _tar(tmp_path / "c.tar", {"k7.t.npy": _npy(np.arange(7, 9))})
    np.save(tmp_path / "d.npy", np.arange(9, 12))
    sources = [str(tmp_path / n) for n in ("a.jsonl", "b.parquet", "c.tar")]
    shardload.prepare(sources, tmp_path / "o", shuffle=True, seed=3)
    ds = shardload.open(tmp_path / "o")
    by_first = {int(ds[i]["t"][0]): ds.origin(i) for i in range(len(ds))}
    a, b, c = sources
    assert by_first == {
        1: SampleOrigin(a, "line", 1),
        2: SampleOrigin(a, "line", 3),
        4: SampleOrigin(b, "row", 0),
        5: SampleOrigin(b, "row", 1),
        7: SampleOrigin(c, "member", key="k7"),
    }
    assert str(by_first[2]) == f"{a}: line 3"
    shardload.prepare([str(tmp_path / "d.npy")], tmp_path / "n", field="t")
    assert shardload.open(tmp_path / "n").origin(0) == SampleOrigin(str(tmp_path / "d.npy"), "file")
    with pytest.raises(IndexError, match="out of range"):
        ds.origin(len(ds))
    with pytest.raises(IndexError, match="out of range"):
        ds.origin(-1)


def test_origin_of_write_is_the_index_in_the_iterable(text_set: Path) -> None:
    ds = shardload.open(text_set)
    for i in range(len(ds)):
        origin = ds.origin(i)
        assert origin.file is None and origin.kind == "index"
        assert origin.position is not None and _samples()[origin.position]["caption"] == ds[i]["caption"]


def test_origin_of_a_set_without_origins_is_a_clear_error(text_set: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "old"
    shutil.copytree(text_set, copy)
    (copy / "origins.arrow").unlink()
    with pytest.raises(shardload.ShardSetError, match="records no sample origins.*re-run prepare"):
        shardload.open(copy).origin(0)


def test_pad_value_for_a_text_field_is_refused(text_set: Path) -> None:
    with pytest.raises(shardload.PlanError, match="'caption' is a text field.*never padded"):
        make_loader(text_set, rank=0, world_size=1, batching=Batching(batch_size=4), pad_values={"caption": 0})
