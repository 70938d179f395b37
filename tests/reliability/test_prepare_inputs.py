"""Inputs that got past prepare and then were lost, replaced or refused later: each is refused up front.

One area per section: files of a source directory skipped without a word, field
names the loader uses for its own batch keys, schemas the loader refuses (checked
on the first sample, and the new set checked before the commit), ``--resume``
over changed input, and misused options.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardload
from shardload.cli import main
from shardload.load.collate import PadSpec, collate_batch
from shardload.prepare import guards


def tok(n: int, dtype: Any = np.int32) -> np.ndarray:
    return np.arange(n, dtype=dtype)


def samples(n: int = 6, **extra: Any) -> list[dict[str, Any]]:
    return [{"t": tok(i + 1), **extra} for i in range(n)]


def read_all(path: Path) -> list[dict[str, np.ndarray]]:
    ds = shardload.open(path)
    return [ds[i] for i in range(len(ds))]


# -- files skipped without a word ------------------------------------------------------------------
def test_directory_keeps_underscore_files_and_reports_what_it_skips(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src"
    (src / ".ipynb_checkpoints").mkdir(parents=True)
    (src / "sub").mkdir()
    for name, n in [("a.npy", 1), ("__init__.npy", 2), ("_utils.npy", 3), ("sub/_part.npy", 4)]:
        np.save(src / name, tok(n))
    np.save(src / ".hidden.npy", tok(50))
    np.save(src / ".ipynb_checkpoints" / "a-checkpoint.npy", tok(60))
    (src / "_SUCCESS").write_bytes(b"")
    (src / "_metadata").write_bytes(b"parquet footer")
    (src / "a.npy.crc").write_bytes(b"crc")
    result = shardload.prepare(src, tmp_path / "out", shuffle=False, progress=False)
    # Every data file is read, '_' names included; only what is certainly not data is left out.
    assert sorted(len(s["data"]) for s in read_all(tmp_path / "out")) == [1, 2, 3, 4]
    assert result.skipped == {"hidden": 2, "marker": 2, "checksum": 1}
    assert result.to_json()["skipped_files"] == 5
    # The command line says so, in its summary and in --json.
    args = ["prepare", str(src), "-o", str(tmp_path / "cli"), "--no-progress"]
    assert main(args) == 0
    assert "skipped 5 files" in capsys.readouterr().out
    assert main([*args[:3], str(tmp_path / "cli-json"), "--no-progress", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["skipped_files"] == 5 and summary["skipped"]["marker"] == 2


def test_glob_skips_marker_files_and_says_so(tmp_path: Path) -> None:
    for k in range(2):
        np.save(tmp_path / f"part-{k}.npy", tok(k + 1))
    (tmp_path / "_SUCCESS").write_bytes(b"")
    result = shardload.prepare(str(tmp_path / "*"), tmp_path / "out", source_format="npy", progress=False)
    assert result.samples == 2 and result.skipped == {"marker": 1}


# -- field names that the loader's batch keys would replace ---------------------------------------
@pytest.mark.parametrize(
    ("extra", "name"),
    [
        ({"weight": np.float32(2.0)}, "weight"),
        ({"sample_id": np.int64(7)}, "sample_id"),
        ({"t_lengths": tok(2)}, "t_lengths"),
    ],
    ids=["weight", "sample_id", "lengths-of-a-field"],
)
def test_batch_key_names_are_refused_at_prepare(tmp_path: Path, extra: dict[str, Any], name: str) -> None:
    with pytest.raises(shardload.InputError) as info:
        shardload.write(samples(**extra), tmp_path / "out", progress=False)
    msg = str(info.value)
    assert f"{name!r}" in msg and "every batch" in msg and "Rename the field in the source" in msg
    assert not (tmp_path / "out").exists()  # refused before anything was created


def test_set_with_a_batch_key_name_is_refused_at_open(tmp_path: Path) -> None:
    # A set written by an older shardload, which accepted a field called "weight".
    out = tmp_path / "set"
    shardload.write(samples(y=np.float32(0.5)), out, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["schema"]["fields"][1]["name"] = "weight"
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(shardload.ManifestError, match="field 'weight' has the name of a key the loader adds"):
        shardload.open(out)


def test_batch_keys_are_the_keys_the_collate_adds(tmp_path: Path) -> None:
    out = tmp_path / "set"
    shardload.write(
        [{"t": tok(i + 1), "f": np.ones((i, 2), np.float32), "y": np.int64(i)} for i in range(4)], out, progress=False
    )
    ds = shardload.open(out)
    rows = np.arange(2, dtype=np.int64)
    batch = collate_batch(
        ds.schema, ds.shard_columns, np.zeros(2, np.int64), rows, rows, np.ones(2, np.float32), PadSpec()
    )
    # One list of the added keys: the check that refuses field names uses exactly what the collate adds.
    assert set(batch) - set(ds.schema.names) == set(ds.schema.batch_keys())


# -- schemas the loader refuses: refused on the first sample, never after an overwrite ---------------
HOSTILE_SCHEMAS: list[tuple[str, list[dict[str, Any]], dict[str, Any], str]] = [
    ("more than 8 axes", [{"t": np.zeros((2,) + (1,) * 8, np.int8)}], {}, "at most 8 axes"),
    ("slash in a name", [{"a/b": tok(3)}], {}, "'a/b'"),
    ("name of 300 bytes", [{"n" * 300: tok(3)}], {}, "300 bytes"),
    ("lone surrogate in a name", [{"\udcff": tok(3)}], {}, "not valid Unicode"),
    ("NUL in a name", [{"a\0b": tok(3)}], {}, "NUL"),
    ("non-string name", [{1: tok(3)}], {}, "field names must be strings"),
    ("shape [L, 0]", [{"t": np.zeros((3, 0), np.float32)}], {}, "[L, 0]"),
    ("fixed shape (0,)", [{"t": tok(2), "e": np.zeros(0)}], {"fixed_fields": ["e"]}, "axis of size 0"),
    ("fixed length field", [{"t": tok(2), "y": np.int64(1)}], {"length_field": "y"}, "'y' is fixed-shape"),
    ("batch key name", [{"t": tok(2), "weight": np.float32(1)}], {}, "'weight'"),
]


@pytest.mark.parametrize(
    ("new", "options", "fragment"), [r[1:] for r in HOSTILE_SCHEMAS], ids=[r[0] for r in HOSTILE_SCHEMAS]
)
def test_overwrite_with_a_schema_the_loader_refuses_keeps_the_old_set(
    tmp_path: Path, new: list[dict[str, Any]], options: dict[str, Any], fragment: str
) -> None:
    out = tmp_path / "set"
    shardload.write(samples(), out, progress=False)
    before = read_all(out)
    with pytest.raises(shardload.InputError) as info:
        shardload.write(new * 3, out, overwrite=True, progress=False, **options)
    assert fragment in str(info.value) and "sample 0" in str(info.value)
    # Refused on the first sample: the old set is whole, and nothing blocks the next run.
    after = read_all(out)
    assert len(after) == len(before) and all(np.array_equal(a["t"], b["t"]) for a, b in zip(after, before))
    assert not (out / ".prepare").exists()


def test_new_set_is_opened_as_the_loader_will_before_the_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "set"
    shardload.write(samples(), out, progress=False)
    old = (out / "manifest.json").read_bytes()
    # Whatever slips past the first-sample check (here: the check is switched off) is caught before the commit.
    monkeypatch.setattr(guards, "prepare_problems", lambda schema: [])
    with pytest.raises(shardload.InputError, match="would not open, so it was not committed.*at most 8 axes"):
        shardload.write([{"t": np.zeros((2,) + (1,) * 8, np.int8)}], out, overwrite=True, progress=False)
    assert (out / "manifest.json").read_bytes() == old
    assert len(read_all(out)) == 6
    assert not (out / ".prepare").exists()  # a resume could only end the same way


# -- resume over changed input -----------------------------------------------------------------------
def jsonl(path: Path, lengths: list[int], tail: str = "") -> None:
    path.write_text("".join(json.dumps({"t": list(range(n))}) + "\n" for n in lengths) + tail)


def interrupted_run(tmp_path: Path, first: list[int] | None = None) -> tuple[list[Path], Path]:
    """Sources a (``first`` lengths), b, c; the run stops on a bad line in c, after a and b are staged. Then c is fixed."""
    files = [tmp_path / f"{k}.jsonl" for k in "abc"]
    jsonl(files[0], first or [3, 4, 5])
    jsonl(files[1], [6, 7])
    jsonl(files[2], [8], tail='{"t": "oops"}\n')
    out = tmp_path / "out"
    with pytest.raises(shardload.InputError, match="c.jsonl"):
        shardload.prepare([str(f) for f in files], out, progress=False)
    jsonl(files[2], [8])
    return files, out


def rewrite_same_size_and_time(path: Path) -> None:
    st = path.stat()
    path.write_text(path.read_text().replace("[0, 1, 2]", "[9, 9, 9]"))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


CHANGES = {
    "appended": lambda p: p.write_text(p.read_text() + json.dumps({"t": [1]}) + "\n"),
    "same size, new time": lambda p: p.write_text(p.read_text().replace("[0, 1, 2]", "[9, 9, 9]")),
    "same size and time": rewrite_same_size_and_time,
    "replaced by a copy": lambda p: (
        p.with_suffix(".tmp").write_bytes(p.read_bytes()),
        p.with_suffix(".tmp").replace(p),
    ),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_resume_over_a_changed_source_is_refused_by_name(tmp_path: Path, change: str) -> None:
    files, out = interrupted_run(tmp_path)
    CHANGES[change](files[0])
    with pytest.raises(shardload.OutputError, match=r"a\.jsonl changed since the interrupted run.*--overwrite"):
        shardload.prepare([str(f) for f in files], out, resume=True, progress=False)
    # Starting over reads the new content.
    shardload.prepare([str(f) for f in files], out, overwrite=True, progress=False)
    assert len(shardload.open(out)) >= 6


def test_resume_over_unchanged_sources_finishes(tmp_path: Path) -> None:
    files, out = interrupted_run(tmp_path)
    assert shardload.prepare([str(f) for f in files], out, resume=True, progress=False).samples == 6


def failing_after(items: list[dict[str, Any]], n: int) -> Iterator[dict[str, Any]]:
    yield from items[:n]
    raise RuntimeError("interrupted")


def test_resume_of_write_with_other_samples_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = samples(40)
    with pytest.raises(RuntimeError, match="interrupted"):
        shardload.write(failing_after(first, 30), out, chunk_bytes=64, progress=False)
    other = [{"t": s["t"] + 1} for s in first]
    with pytest.raises(shardload.OutputError, match="sample 0 differs from the sample the interrupted run staged"):
        shardload.write(other, out, resume=True, chunk_bytes=64, progress=False)
    with pytest.raises(shardload.OutputError, match="ends before sample"):
        shardload.write(first[:3], out, resume=True, chunk_bytes=64, progress=False)
    assert shardload.write(first, out, resume=True, chunk_bytes=64, progress=False).samples == 40


# -- misused options ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"dtypes": {"nosuch": "int32"}}, "'nosuch'"),
        ({"seed": -1}, "seed must be an integer in [0, 2**64)"),
        ({"seed": 2**64}, "seed must be"),
        ({"seed": 1.5}, "seed must be an integer"),
        ({"num_shards": 2.5}, "num_shards must be an integer"),
        ({"shard_size": "1GB"}, "shard_size must be an integer"),
        ({"shuffle": "no"}, "shuffle must be True or False"),
    ],
    ids=[
        "dtype-of-no-field",
        "seed-1",
        "seed-2**64",
        "seed-float",
        "num_shards-float",
        "shard_size-str",
        "shuffle-str",
    ],
)
def test_misused_options_are_refused_before_anything_is_created(
    tmp_path: Path, options: dict[str, Any], fragment: str
) -> None:
    out = tmp_path / "out"
    with pytest.raises(shardload.InputError) as info:
        shardload.write(samples(), out, progress=False, **options)
    assert fragment in str(info.value)
    if "dtypes" in options:
        assert "fields of sample 0: 't'" in str(info.value)
    assert not out.exists()
    # The corrected run needs no --resume or --overwrite.
    shardload.write(samples(), out, progress=False)


def test_cli_dtype_of_no_field_and_negative_seed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    src.mkdir()
    np.save(src / "a.npy", tok(3))
    out = tmp_path / "out"
    assert main(["prepare", str(src), "-o", str(out), "--dtype", "nosuch=int32", "--no-progress"]) == 3
    err = capsys.readouterr().err
    assert "'nosuch'" in err and "'data'" in err and "Traceback" not in err
    assert main(["prepare", str(src), "-o", str(out), "--seed", "-1", "--no-progress"]) == 2
    assert "--seed" in capsys.readouterr().err
    assert not out.exists()
    assert main(["prepare", str(src), "-o", str(out), "--no-progress"]) == 0


def test_leftover_work_dir_without_work_does_not_block_a_fresh_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / ".prepare" / "staging").mkdir(parents=True)
    (out / ".prepare" / "state.json").write_text("{}")
    assert shardload.write(samples(), out, progress=False).samples == 6


def test_non_utf8_output_path_is_refused_up_front(tmp_path: Path) -> None:
    out = Path(os.fsdecode(os.fsencode(tmp_path) + b"/\xff-out"))
    with pytest.raises(shardload.OutputError, match="not valid UTF-8"):
        shardload.write(samples(), out, progress=False)
    assert not out.exists()


# -- more values in one field than an Arrow array holds (2**31 - 1; lowered here to try it small) -----
def test_sample_with_more_values_than_an_arrow_array_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guards, "MAX_FIELD_VALUES", 100)
    with pytest.raises(shardload.InputError, match=r"sample 1: field 'f' holds 102 values.*split the sample"):
        shardload.write([{"f": np.ones((3, 2))}, {"f": np.ones((51, 2))}], tmp_path / "out", progress=False)


def test_chunks_and_shards_stay_within_an_arrow_array(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guards, "MAX_FIELD_VALUES", 100)
    items = [{"t": np.full(30 + i % 7, i, np.uint8), "y": np.int64(i)} for i in range(40)]
    out = tmp_path / "out"
    # One shard by size, but ~1,300 values of 't' do not fit one Arrow array: more shards, chosen by prepare.
    shardload.write(items, out, shard_size=1 << 40, progress=False)
    ds = shardload.open(out)
    assert (
        len(ds.shards) >= 14
        and sum(int(ds.lengths[s.first_sample : s.first_sample + s.samples].sum()) > 100 for s in ds.shards) == 0
    )
    got = sorted((int(ds[i]["y"]), ds[i]["t"].tolist()) for i in range(len(ds)))
    assert got == [(i, [i] * (30 + i % 7)) for i in range(40)]
    with pytest.raises(shardload.InputError, match=r"would hold \d+ values of field 't'.*--num-shards"):
        shardload.write(items, tmp_path / "fixed", num_shards=2, progress=False)


# -- property: whatever prepare accepts, the loader serves unchanged -----------------------------------
NAMES = ["t", "x", "weight", "sample_id", "t_lengths", "x_lengths", "a/b", "", ".", "n" * 250, "é", "\udcff", "a\\b"]
DTYPES = ["int8", "uint16", "int32", "int64", "float16", "float32", "bool", "complex64", ">i4", "datetime64[s]"]


@st.composite
def sample_lists(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[str]]:
    names = draw(st.lists(st.sampled_from(NAMES) | st.text(max_size=6), min_size=1, max_size=3, unique=True))
    specs = [(draw(st.sampled_from(DTYPES)), draw(st.lists(st.integers(0, 2), max_size=9))) for _ in names]
    fixed = [n for n in names if draw(st.booleans())]
    items = []
    for k in range(3):
        sample = {}
        for name, (dtype, shape) in zip(names, specs):
            dims = list(shape)
            if dims and name not in fixed:
                dims[0] = (k * 2 + len(name)) % 4  # the first axis varies between samples
            sample[name] = np.arange(int(np.prod(dims, dtype=np.int64))).reshape(dims).astype(dtype)
        items.append(sample)
    return items, fixed


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=sample_lists())
def test_prepare_refuses_up_front_or_the_loader_serves_every_field_unchanged(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[list[dict[str, Any]], list[str]]
) -> None:
    items, fixed = case
    out = tmp_path_factory.mktemp("prop") / "out"
    try:
        shardload.write(items, out, shuffle=False, fixed_fields=fixed, progress=False)
    except shardload.InputError:
        assert not out.exists()  # refused before anything was created
        return
    ds = shardload.open(out)
    for i, want in enumerate(items):
        got = ds[i]
        assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)
    for batch in shardload.make_loader(out, batch_size=2, rank=0, world_size=1, seed=1):
        for row, sid in enumerate(batch["sample_id"].tolist()):
            for name, value in items[sid].items():
                f = ds.schema.field(name)
                arr = batch[name][row].numpy()
                if f.variable:
                    assert int(batch[name + "_lengths"][row]) == len(value)
                    arr = arr[: len(value)]
                assert np.array_equal(arr, value.astype(arr.dtype)), name


def test_parquet_source_with_a_non_utf8_name_is_refused_by_name(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "src"
    src.mkdir()
    good = src / "good.parquet"
    pq.write_table(pa.table({"t": pa.array([np.arange(i + 1) for i in range(3)])}), good)
    good.rename(os.fsdecode(os.fsencode(src) + b"/\xff.parquet"))
    with pytest.raises(shardload.InputError, match="not valid UTF-8.*rename the file"):
        shardload.prepare(src, tmp_path / "out", progress=False)


def test_one_fixed_field_given_as_a_string_is_that_field(tmp_path: Path) -> None:
    items = [{"t": tok(i + 1), "emb": np.ones(3, np.float32)} for i in range(4)]
    shardload.write(items, tmp_path / "out", fixed_fields="emb", progress=False)
    assert not shardload.open(tmp_path / "out").schema.field("emb").variable


def test_zarr_field_name_rule_is_checked_on_the_first_sample(tmp_path: Path) -> None:
    pytest.importorskip("zarr")
    out = tmp_path / "out"
    with pytest.raises(shardload.InputError, match="'__x' cannot name a Zarr group"):
        shardload.write([{"__x": tok(3)}], out, shard_format="zarr", progress=False)
    assert not out.exists()


def test_resume_with_a_damaged_fingerprint_record_is_refused(tmp_path: Path) -> None:
    files, out = interrupted_run(tmp_path)
    (out / ".prepare" / "inputs.json").write_text("{not json")
    with pytest.raises(shardload.OutputError, match="recorded no fingerprint.*--overwrite"):
        shardload.prepare([str(f) for f in files], out, resume=True, progress=False)


@pytest.mark.parametrize(
    "record", ["{not json", "[1, 2]", "\udcff", ""], ids=["not JSON", "a list", "not UTF-8", "empty"]
)
def test_resume_with_a_damaged_run_record_is_refused(tmp_path: Path, record: str) -> None:
    files, out = interrupted_run(tmp_path)
    (out / ".prepare" / "state.json").write_bytes(record.encode("utf-8", "surrogateescape"))
    # Invariant: a damaged record of the interrupted run is an OutputError naming it (was exit 70)
    with pytest.raises(shardload.OutputError, match=r"state\.json\) is damaged.*--overwrite"):
        shardload.prepare([str(f) for f in files], out, resume=True, progress=False)


def test_resume_with_other_sources_names_the_first_that_differs(tmp_path: Path) -> None:
    files, out = interrupted_run(tmp_path)
    other = tmp_path / "z.jsonl"
    jsonl(other, [6, 7])
    with pytest.raises(
        shardload.OutputError,
        match=r"units differ: source unit 1 was .*b\.jsonl' in the interrupted run, .*z\.jsonl' now",
    ):
        shardload.prepare([str(files[0]), str(other), str(files[2])], out, resume=True, progress=False)


def test_resume_over_a_large_source_rewritten_with_its_stamp_put_back_is_refused(tmp_path: Path) -> None:
    # Above the size whose content is hashed: only the file's stamp can tell. `cp -p` over the file or
    # `rsync --inplace -t` keep its inode, size and modification time; its change time still moves.
    files, out = interrupted_run(tmp_path, first=[3] + [200] * 2000)
    big = files[0]
    assert big.stat().st_size > (1 << 20)
    rewrite_same_size_and_time(big)
    with pytest.raises(shardload.OutputError, match=r"a\.jsonl changed since the interrupted run.*modification time"):
        shardload.prepare([str(f) for f in files], out, resume=True, progress=False)


def test_resume_after_a_chmod_of_a_source_finishes(tmp_path: Path) -> None:
    files, out = interrupted_run(tmp_path)
    files[0].chmod(0o600)  # the change time moves with the mode: the bytes are the same
    assert shardload.prepare([str(f) for f in files], out, resume=True, progress=False).samples == 6


@pytest.mark.parametrize(
    "record",
    [
        [[1], [1], [1]],
        [[[1]], [[1]], [[1]]],
        [[None], [None], [None]],
        [[["a.jsonl", 1, 2, 3, None]]] * 3,
        [[["a.jsonl", [1, 2, 3, 4, 5, [1, 2, 3]], None]]] * 3,
        [[["a.jsonl", [1, 2, "x", 4, 5, [1, 2, 3, 4]], None]]] * 3,
        [[["a.jsonl", [1, 2, 3, 4, 5, [1, 2, 3, 4]], 7]]] * 3,
    ],
)
def test_resume_with_a_fingerprint_record_of_the_wrong_shape_is_refused(tmp_path: Path, record: Any) -> None:
    files, out = interrupted_run(tmp_path)
    (out / ".prepare" / "inputs.json").write_text(json.dumps(record))
    with pytest.raises(shardload.OutputError, match="recorded no fingerprint.*--overwrite"):
        shardload.prepare([str(f) for f in files], out, resume=True, progress=False)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("name", ["data.jsonl", "data.json"])
def test_a_gzipped_jsonl_file_without_gz_in_its_name_is_named_as_gzip(tmp_path: Path, name: str, workers: int) -> None:
    import gzip

    src = tmp_path / name
    with gzip.open(src, "wt", compresslevel=1) as fh:
        fh.writelines(json.dumps({"x": list(range(i % 7 + 1)), "t": str(i) * 50}) + "\n" for i in range(30000))
    assert src.stat().st_size > 200_000  # read in several byte ranges: whichever fails first says the same
    with pytest.raises(shardload.InputError, match=r"data\.jsonl?: the file is gzip-compressed .*\.jsonl\.gz"):
        shardload.prepare(
            src, tmp_path / "out", source_format="jsonl", workers=workers, unit_bytes=100_000, progress=False
        )
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize("kind", ["bzip2", "xz", "zstd", "gzip twice"])
def test_a_jsonl_file_compressed_another_way_is_named_with_what_undoes_it(tmp_path: Path, kind: str) -> None:
    import bz2
    import gzip
    import lzma

    text = "".join(json.dumps({"x": list(range(i % 7 + 1))}) + "\n" for i in range(200)).encode()
    name, data, undo = {
        "bzip2": ("data.jsonl", bz2.compress(text), "bunzip2 it"),
        "xz": ("data.jsonl", lzma.compress(text), "unxz it"),
        "zstd": ("data.jsonl", b"\x28\xb5\x2f\xfd" + bytes(range(200, 256)) * 4, "unzstd it"),  # its magic: enough
        "gzip twice": ("data.jsonl.gz", gzip.compress(gzip.compress(text)), "gunzip it, then gunzip what that gives"),
    }[kind]
    (tmp_path / name).write_bytes(data)
    with pytest.raises(shardload.InputError) as info:
        shardload.prepare(tmp_path / name, tmp_path / "out", source_format="jsonl", progress=False)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / name}: the file is") and undo in message, message
    assert ("twice" in message) == (kind == "gzip twice") and "UTF-8" not in message


def test_a_control_character_in_a_json_line_is_named_once_with_its_column(tmp_path: Path) -> None:
    src = tmp_path / "data.jsonl"
    src.write_bytes(b'{"x": [1, 2]}\n{"x": [1], "t": "a\x00b"}\n')
    with pytest.raises(shardload.InputError) as info:
        shardload.prepare(src, tmp_path / "out", progress=False)
    assert "line 2: invalid JSON (Invalid control character at column 19)" in str(info.value), str(info.value)


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"], ids=["empty", "blank lines"])
def test_sources_with_no_samples_are_named(tmp_path: Path, content: bytes) -> None:
    for name in ("a.jsonl", "b.jsonl"):
        (tmp_path / name).write_bytes(content)
    with pytest.raises(shardload.InputError, match="the sources hold no samples") as info:
        shardload.prepare([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], tmp_path / "out", progress=False)
    assert f"read from {tmp_path / 'a.jsonl'}, {tmp_path / 'b.jsonl'}: empty" in str(info.value), str(info.value)
