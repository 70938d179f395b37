"""The map step of prepare/write: drop, split, add and remove fields; errors; worker independence; resume."""

from __future__ import annotations

import importlib
import json
import multiprocessing
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from shardload.errors import InputError, OutputError
from shardload.prepare.mapping import MappedSamples, check_sendable, load_map, map_identity

#: the longest piece the split map makes
PIECE = 5


def split_long(sample: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Drop empty samples, cut long ones into pieces of PIECE tokens, drop field 'junk', add field 'n'."""
    tokens = np.asarray(sample["tokens"], dtype=np.int32)
    if len(tokens) == 0:
        return None
    n = np.int64(len(tokens))
    return [{"tokens": tokens[i : i + PIECE], "n": n} for i in range(0, len(tokens), PIECE)]


def twice(sample: dict[str, Any]) -> list[dict[str, Any]]:
    return [sample, sample]


def keep_even(sample: dict[str, Any]) -> dict[str, Any] | None:
    return sample if len(sample["tokens"]) % 2 == 0 else None


def expected(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What ``split_long`` makes of ``rows``, in input order."""
    return [piece for row in rows for piece in split_long(dict(row)) or []]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps({k: np.asarray(v).tolist() for k, v in r.items()}) + "\n" for r in rows))


@pytest.fixture
def jsonl_dir(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    """Four JSON Lines files (four source units) of token lists, some empty, with a field 'junk'."""
    rng = np.random.default_rng(7)
    d = tmp_path / "src"
    d.mkdir()
    rows_all = []
    for k in range(4):
        rows = [
            {"tokens": rng.integers(0, 1000, size=int(rng.integers(0, 14))), "junk": rng.integers(0, 9, size=2)}
            for _ in range(25)
        ]
        write_jsonl(d / f"part-{k}.jsonl", rows)
        rows_all += rows
    return d, rows_all


def test_write_map_drops_splits_and_changes_fields(tmp_path: Path) -> None:
    rows = [{"tokens": np.arange(n, dtype=np.int32), "junk": np.zeros(3)} for n in (0, 3, 12, 0, 5, 6)]
    result = shardload.write(rows, tmp_path / "s", map=split_long, shuffle=False)
    want = expected(rows)
    assert result.dropped == 2 and result.samples == len(want) == 1 + 3 + 1 + 2
    ds = shardload.open(tmp_path / "s")
    # the reader's field 'junk' is gone, the map's field 'n' is there: the schema is the mapped one
    assert ds.schema.names == ("tokens", "n")
    for i, w in enumerate(want):
        np.testing.assert_array_equal(ds[i]["tokens"], w["tokens"])
        assert ds[i]["n"] == w["n"]
    assert json.loads((tmp_path / "s" / "manifest.json").read_text())["options"]["map"] == map_identity(split_long)


def test_map_dropping_the_first_samples_infers_the_schema_from_the_first_kept(tmp_path: Path) -> None:
    rows = [{"tokens": np.arange(n, dtype=np.int16)} for n in (1, 3, 2, 5, 4)]
    result = shardload.write(rows, tmp_path / "s", map=keep_even, shuffle=False)
    assert (result.samples, result.dropped) == (2, 3)
    ds = shardload.open(tmp_path / "s")
    assert [len(ds[i]["tokens"]) for i in range(2)] == [2, 4] and ds.schema.field("tokens").dtype == "int16"


def test_map_that_drops_everything_is_no_samples(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="hold no samples"):
        shardload.write([{"t": np.arange(3)}], tmp_path / "s", map=lambda s: [])
    assert not (tmp_path / "s").exists()


def test_split_locators_are_unique_and_in_order() -> None:
    located = [("a.jsonl: line 1", {"tokens": np.arange(12)}), ("a.jsonl: line 2", {"tokens": np.arange(0)})]
    mapped = MappedSamples(located, split_long)
    wheres = [w for w, _ in mapped]
    name = "tests.prepare.test_map:split_long"
    assert wheres == [f"a.jsonl: line 1, piece {j} of 3 (mapped by {name})" for j in (1, 2, 3)]
    assert mapped.dropped == 1


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (lambda s: "text", r"sample 1: the map function .*first_fine returned a value of type str; a map returns one"),
        (lambda s: (s,), r"sample 1: .* returned a value of type tuple"),
        (lambda s: [s, 3], r"sample 1: .* returned a list whose item 1 is a value of type int"),
        (lambda s: {"t": [[1], [1, 2]]}, r"sample 1 \(mapped by .*first_fine\): field 't' is a ragged nested list"),
        (lambda s: {"other": s["t"]}, r"sample 1 \(mapped by .*\): fields differ from the first sample"),
    ],
)
def test_map_returning_something_else_names_the_sample(tmp_path: Path, fn: Any, message: str) -> None:
    def first_fine(sample: dict[str, Any]) -> Any:
        return sample if sample["t"][0] == 0 else fn(sample)

    rows = [{"t": np.arange(3)}, {"t": np.arange(1, 4)}]
    with pytest.raises(InputError, match=message):
        shardload.write(rows, tmp_path / "s", map=first_fine)


def test_map_raising_names_file_line_function_and_exception(tmp_path: Path, jsonl_dir: Any) -> None:
    src, _ = jsonl_dir

    def boom(sample: dict[str, Any]) -> dict[str, Any]:
        if len(sample["tokens"]) == 13:
            raise KeyError("vocab")
        return sample

    with pytest.raises(InputError) as info:
        shardload.prepare(src, tmp_path / "s", map=boom)
    first_13 = next(
        (f.name, i + 1)
        for f in sorted(src.iterdir())
        for i, line in enumerate(f.read_text().splitlines())
        if len(json.loads(line)["tokens"]) == 13
    )
    assert str(info.value).startswith(f"{src / first_13[0]}: line {first_13[1]}: the map function ")
    assert "test_map_raising_names_file_line_function_and_exception.<locals>.boom raised KeyError: 'vocab'" in str(
        info.value
    )
    assert isinstance(info.value.__cause__, KeyError)  # chained: the traceback shows where the function failed


@pytest.mark.parametrize("workers", [2, 3])
def test_output_does_not_depend_on_workers(tmp_path: Path, jsonl_dir: Any, workers: int) -> None:
    src, rows = jsonl_dir
    one = shardload.prepare(src, tmp_path / "one", map=split_long, workers=1, num_shards=3)
    many = shardload.prepare(src, tmp_path / "many", map=split_long, workers=workers, num_shards=3)
    want = expected(rows)
    assert one.samples == many.samples == len(want)
    assert one.dropped == many.dropped == sum(len(r["tokens"]) == 0 for r in rows) > 0
    for name in ("shard-000000.arrow", "shard-000001.arrow", "shard-000002.arrow"):
        assert (tmp_path / "one" / "shards" / name).read_bytes() == (tmp_path / "many" / "shards" / name).read_bytes()
    # sample ids follow input order through the shuffle's record (origin): position k is want[k]
    ds = shardload.open(tmp_path / "many")
    origin = np.load(tmp_path / "many" / "origin.npy")
    for i in range(0, len(ds), 7):
        np.testing.assert_array_equal(ds[i]["tokens"], want[origin[i]]["tokens"])


@pytest.mark.slow
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_module_map_works_in_workers_not_forked(
    tmp_path: Path, jsonl_dir: Any, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    """Workers started afresh (the default from Python 3.14 is forkserver) import the map by its module and name."""
    src, _ = jsonl_dir
    forked = shardload.prepare(src, tmp_path / "fork", map=split_long, workers=2, num_shards=2)
    real = multiprocessing.get_context
    monkeypatch.setattr(multiprocessing, "get_context", lambda m=None: real(m or method))
    fresh = shardload.prepare(src, tmp_path / method, map=split_long, workers=2, num_shards=2)
    assert fresh.samples == forked.samples and fresh.dropped == forked.dropped > 0
    for name in ("shard-000000.arrow", "shard-000001.arrow"):
        assert (tmp_path / "fork" / "shards" / name).read_bytes() == (tmp_path / method / "shards" / name).read_bytes()


def test_lambda_runs_in_process_and_is_refused_for_workers(tmp_path: Path, jsonl_dir: Any) -> None:
    src, rows = jsonl_dir
    result = shardload.prepare(src, tmp_path / "s", map=lambda s: {"tokens": s["tokens"]}, workers=1)
    assert result.samples == len(rows)
    with pytest.raises(InputError, match=r"cannot be sent to the 2 worker processes .* top level of a module"):
        shardload.prepare(src, tmp_path / "t", map=lambda s: s, workers=2)
    assert not (tmp_path / "t").exists()  # refused before anything was staged... and nothing left behind


def test_map_must_be_callable(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"map must be a function, got str 'mod:fn' \(to name it .*load_map"):
        shardload.write([{"t": np.arange(3)}], tmp_path / "s", map="mod:fn")


# -- naming the function: load_map and map_identity ------------------------------------------------------------
@pytest.fixture
def module_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory on sys.path (restored after the test) for modules written by the test."""
    d = tmp_path / "mods"
    d.mkdir()
    monkeypatch.setattr(sys, "path", [str(d), *sys.path])
    return d


def test_load_map_finds_a_dotted_attribute(module_dir: Path) -> None:
    (module_dir / "lm_ok.py").write_text("class Tok:\n    @staticmethod\n    def encode(s):\n        return s\n")
    fn = load_map("lm_ok:Tok.encode")
    assert fn({"a": 1}) == {"a": 1}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("lm_bad", r"name the function as MODULE:FUNCTION"),
        ("lm_bad:", r"name the function as MODULE:FUNCTION"),
        ("lm_missing:f", r"no module named 'lm_missing'"),
        ("lm_bad:nope", r"lm_bad has no attribute 'nope'"),
        ("lm_bad:VALUE", r"lm_bad:VALUE is a int, not a function"),
        ("lm_broken:f", r"importing 'lm_broken' failed: ModuleNotFoundError: No module named 'not_installed_dep'"),
        ("lm_raises:f", r"importing 'lm_raises' failed: RuntimeError: no GPU"),
    ],
)
def test_load_map_errors(module_dir: Path, spec: str, message: str) -> None:
    (module_dir / "lm_bad.py").write_text("VALUE = 3\n")
    (module_dir / "lm_broken.py").write_text("import not_installed_dep\n")
    (module_dir / "lm_raises.py").write_text("raise RuntimeError('no GPU')\n")
    with pytest.raises(InputError, match=message):
        load_map(spec)


def test_identity_changes_with_the_code_not_the_place(module_dir: Path) -> None:
    path = module_dir / "lm_versions.py"
    path.write_text("def f(s):\n    return s\n")
    v1 = map_identity(importlib.import_module("lm_versions").f)
    path.write_text("\n\n# moved down\ndef f(s):\n    return s\n")
    moved = map_identity(importlib.reload(importlib.import_module("lm_versions")).f)
    path.write_text("def f(s):\n    return None\n")
    v2 = map_identity(importlib.reload(importlib.import_module("lm_versions")).f)
    assert v1["function"] == v2["function"] == "lm_versions:f"
    assert v1 == moved and v1["code"] != v2["code"] and str(v1["code"]).startswith("sha256:")


def test_check_sendable_accepts_a_module_function() -> None:
    check_sendable(split_long, 2)  # no error: pickled by name
    with pytest.raises(InputError, match="<lambda>"):
        check_sendable(lambda s: s, 2)


# -- resume ------------------------------------------------------------------------------------------------------
def test_resume_refuses_a_changed_map_and_finishes_with_the_same(
    tmp_path: Path, jsonl_dir: Any, module_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, rows = jsonl_dir
    mod = module_dir / "lm_resume.py"
    # fails on a record of the third file (the first files are staged by then) while LM_FAIL is set
    bad = next(int(r["tokens"][0]) for r in rows[60:] if len(r["tokens"]))
    mod.write_text(
        f"import os\n\ndef f(s):\n    if os.environ.get('LM_FAIL') and len(s['tokens']) and s['tokens'][0] == {bad}:\n"
        "        raise ValueError('bad record')\n    return {'tokens': s['tokens']}\n"
    )
    fn = importlib.import_module("lm_resume").f
    out = tmp_path / "s"
    monkeypatch.setenv("LM_FAIL", "1")
    with pytest.raises(InputError, match="bad record"):
        shardload.prepare(src, out, map=fn, chunk_bytes=64)
    monkeypatch.delenv("LM_FAIL")
    assert list((out / ".prepare" / "staging").glob("*.done"))  # the interrupted run's work is kept for --resume
    for other in ({"map": keep_even}, {}):
        with pytest.raises(OutputError, match=r"used different sources or options \(options(, schema)? differ"):
            shardload.prepare(src, out, resume=True, **other)
    mod.write_text(mod.read_text().replace("bad record", "still bad"))
    changed = importlib.reload(importlib.import_module("lm_resume")).f
    with pytest.raises(OutputError, match=r"options differ"):
        shardload.prepare(src, out, map=changed, resume=True)
    mod.write_text(mod.read_text().replace("still bad", "bad record"))
    same = importlib.reload(importlib.import_module("lm_resume")).f
    done = shardload.prepare(src, out, map=same, resume=True, chunk_bytes=64)
    fresh = shardload.prepare(src, tmp_path / "fresh", map=same, chunk_bytes=64)
    assert done.samples == fresh.samples == len(rows)
    assert (
        json.loads((out / "manifest.json").read_text())["set_id"]
        == json.loads((tmp_path / "fresh" / "manifest.json").read_text())["set_id"]
    )


def test_a_mapped_sample_has_the_origin_of_its_record(tmp_path: Path) -> None:
    """Every piece of a split, and a sample mapped whole, is located at the source line it was made from."""
    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps({"tokens": list(range(n))}) + "\n" for n in (2, 5, 1)))
    out = tmp_path / "out"
    shardload.prepare(str(src), out, map=twice, shuffle=False)
    ds = shardload.open(out)
    lines = [(o.file, o.kind, o.position) for o in (ds.origin(i) for i in range(len(ds)))]
    assert lines == [(str(src), "line", 1)] * 2 + [(str(src), "line", 2)] * 2 + [(str(src), "line", 3)] * 2


# -- the pieces of a split record: ShardSet.origin(i).piece / .pieces ----------------------------------
def pieces_by_origin(out: Path, rows_of: dict[str, list[dict[str, Any]]]) -> list[tuple[str, int, int, int]]:
    """Check every sample of ``out`` against the piece its origin names; ``(file, line, piece, pieces)`` of each.

    ``rows_of``: each source file's rows, by path (line ``k`` is ``rows_of[file][k - 1]``).
    """
    ds = shardload.open(out)
    seen = []
    for i in range(len(ds)):
        o = ds.origin(i)
        assert o.file is not None and o.position is not None and o.piece is not None and o.pieces is not None
        want = split_long(dict(rows_of[o.file][o.position - 1]))
        assert want is not None and o.pieces == len(want)
        # Invariant: sample i is piece o.piece of what the map made of its record
        np.testing.assert_array_equal(ds[i]["tokens"], want[o.piece]["tokens"], err_msg=str(o))
        assert str(o).endswith(f"line {o.position}" + (f", piece {o.piece + 1} of {o.pieces}" if o.pieces > 1 else ""))
        seen.append((o.file, o.position, o.piece, o.pieces))
    return seen


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("shuffle", [True, False])
def test_origin_names_each_piece_of_a_split_record(tmp_path: Path, jsonl_dir: Any, workers: int, shuffle: bool) -> None:
    src, _ = jsonl_dir
    rows_of = {str(p): [json.loads(line) for line in p.read_text().splitlines()] for p in sorted(src.iterdir())}
    shardload.prepare(src, tmp_path / "out", map=split_long, workers=workers, num_shards=3, shuffle=shuffle)
    seen = pieces_by_origin(tmp_path / "out", rows_of)
    # Invariant: every piece of every kept record once, pieces numbered 0 .. pieces - 1
    want = [
        (f, k + 1, j, len(pieces))
        for f, rows in rows_of.items()
        for k, row in enumerate(rows)
        for pieces in [split_long(dict(row)) or []]
        for j in range(len(pieces))
    ]
    assert sorted(seen) == want
    assert max(p for *_, p in seen) > 1  # records were split


def test_a_merged_set_tells_each_pieces_place(tmp_path: Path, jsonl_dir: Any) -> None:
    src, _ = jsonl_dir
    files = [str(p) for p in sorted(src.iterdir())]
    rows_of = {f: [json.loads(line) for line in Path(f).read_text().splitlines()] for f in files}
    for k in range(3):
        shardload.prepare(files, tmp_path / "out", part=(k, 3), map=split_long, num_shards=2)
    shardload.merge(tmp_path / "out")
    shardload.prepare(files, tmp_path / "one", map=split_long, num_shards=2)
    seen = pieces_by_origin(tmp_path / "out", rows_of)
    # Invariant: the merged set names the same pieces as one prepare of the same sources
    assert sorted(seen) == sorted(pieces_by_origin(tmp_path / "one", rows_of))
    assert len(shardload.open(tmp_path / "out").manifest.parts) == 3 and max(p for *_, p in seen) > 1


def test_pieces_not_recorded_are_none_and_a_set_without_a_map_has_one_piece_per_record(
    tmp_path: Path, jsonl_dir: Any
) -> None:
    src, _ = jsonl_dir
    shardload.prepare(src, tmp_path / "plain", num_shards=2, fields=["tokens"])
    plain = shardload.open(tmp_path / "plain")
    assert {(plain.origin(i).piece, plain.origin(i).pieces) for i in range(len(plain))} == {(0, 1)}
    shardload.prepare(src, tmp_path / "mapped", map=split_long, num_shards=2)
    (tmp_path / "mapped" / "origin.npy").unlink()  # a set copied without it: its pieces are not recorded
    mapped = shardload.open(tmp_path / "mapped")
    o = mapped.origin(0)
    assert (o.piece, o.pieces) == (None, None) and o.kind == "line" and str(o) == f"{o.file}: line {o.position}"


def test_a_damaged_sample_order_is_named(tmp_path: Path, jsonl_dir: Any) -> None:
    src, _ = jsonl_dir
    shardload.prepare(src, tmp_path / "out", map=split_long, num_shards=2)
    order = np.load(tmp_path / "out" / "origin.npy")
    order[1] = order[0]  # two samples at one source position, none at another
    np.save(tmp_path / "out" / "origin.npy", order)
    ds = shardload.open(tmp_path / "out")
    with pytest.raises(shardload.errors.ShardSetError, match=r"origin\.npy: no sample is at source position"):
        for i in range(len(ds)):
            ds.origin(i)
