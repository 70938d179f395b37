"""Shards that are not what the manifest says: an edited batching index, shards swapped or copied in
from another set, and shard files rewritten, truncated or replaced under a live loader.

Every outcome is correct data or a named :class:`~shardload.ShardloadError`; never other samples,
never garbage, never a SIGBUS-killed process, never a hang. Scenarios that could kill the process
on a regression run in a forked child under a timeout.
"""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import pickle
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import shardload
from shardload._base.checksum import file_checksum
from shardload.formats.arrow import ArrowOptions, ArrowShardReader, ArrowShardWriter
from shardload.formats.arrow.writer import arrow_schema, to_arrow
from shardload.sets.verify import verify
from shardload.testing import synthetic_samples

from .conftest import read_all, read_manifest, shard_file, write_manifest

LOADER = {"rank": 0, "world_size": 1, "batch_size": 8, "seed": 0}


def other_values(seed: int = 3) -> list[dict[str, np.ndarray]]:
    """The fixture's lengths with other values: every shard of a set of these has the pristine shard's size."""
    return [
        {"tokens": s["tokens"] + 1, "features": s["features"] * 2, "label": s["label"] + 1}
        for s in synthetic_samples(120, seed=seed)
    ]


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("other") / "set"
    shardload.write(other_values(), out, num_shards=4, shuffle=False, progress=False)
    return out


@pytest.fixture(scope="module")
def expected(pristine: Path) -> list[dict[str, np.ndarray]]:
    """Every batch of one epoch of the pristine set (the plan depends only on manifest and index)."""
    return [{k: v.numpy().copy() for k, v in b.items()} for b in shardload.make_loader(pristine, **LOADER)]


def first_sample(path: Path, k: int) -> int:
    return int(read_manifest(path)["shards"][k]["first_sample"])


# -- item: the batching index is checked whatever the number of variable fields ------------------
def edit_index(path: Path, value: int) -> None:
    lengths = np.load(path / "lengths.npy")
    np.save(path / "lengths.npy", np.full_like(lengths, value))


def edit_index_keeping_its_total(path: Path, value: int) -> None:
    """Sample 0 gets ``value``; the last sample takes the difference, so the index still sums to ``total_tokens``."""
    lengths = np.load(path / "lengths.npy")
    lengths[-1] += lengths[0] - value
    lengths[0] = value
    assert lengths[-1] >= 0
    np.save(path / "lengths.npy", lengths)


@pytest.mark.parametrize(
    ("samples", "options", "rule"),
    [
        (lambda: synthetic_samples(120, seed=3), {}, r"the longest of 'tokens', 'features'"),
        (lambda: synthetic_samples(120, seed=3), {"length_field": "features"}, r"the length of 'features'"),
        (
            lambda: [{"x": np.full(3, i), "y": np.int64(i)} for i in range(50)],
            {"fixed_fields": ["x"]},
            "no field varies",
        ),
    ],
    ids=["two variable fields", "length_field of two", "no variable field"],
)
def test_edited_batching_index_is_caught_at_first_open(
    tmp_path: Path, samples: Callable[[], list[dict[str, Any]]], options: dict[str, Any], rule: str
) -> None:
    shardload.write(samples(), tmp_path / "s", num_shards=3, progress=False, **options)
    # The total is kept, so the check of the whole index on open passes and the shard's own check must see it.
    edit_index_keeping_its_total(tmp_path / "s", 2)
    with pytest.raises(shardload.CorruptShardError, match=rf"shard 0 .*lengths\.npy gives sample 0 .*{rule}"):
        shardload.open(tmp_path / "s")[0]
    assert any(p.reason == "lengths_mismatch" for p in verify(tmp_path / "s").problems)


def test_index_of_ones_cannot_make_batches_over_max_tokens(damaged: Path) -> None:
    # Two variable fields: lengths.npy is the per-sample max of both, and only it is planned with.
    edit_index(damaged, 1)
    # Caught on open (the index no longer sums to total_tokens) or at the shard's first open: never a batch.
    with pytest.raises(
        shardload.ShardSetError, match=r"lengths\.npy(\) sums to| gives sample \d+ .* batching length of 1)"
    ):
        loader = shardload.make_loader(damaged, rank=0, world_size=1, max_tokens=64)
        for batch in loader:
            assert int(batch["tokens_lengths"].sum()) <= 64  # never reached with the edited index


# -- item: each shard is tied to its set and its position ------------------------------------------
@pytest.mark.parametrize("fmt", ["arrow", "zarr"])
def test_same_size_shard_from_another_set_is_refused(tmp_path: Path, fmt: str) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    opts: dict[str, Any] = {"num_shards": 4, "shuffle": False, "shard_format": fmt, "progress": False}
    if fmt == "zarr":
        opts["shard_format"] = shardload.ZarrOptions(compression="none")  # same lengths, same sizes
    shardload.write(synthetic_samples(120, seed=3), a, **opts)
    shardload.write(other_values(), b, **opts)
    assert shard_file(a, 1).stat().st_size == shard_file(b, 1).stat().st_size  # only the identity tells them apart
    shutil.copyfile(shard_file(b, 1), shard_file(a, 1))
    ids = read_manifest(a)["set_id"], read_manifest(b)["set_id"]
    with pytest.raises(
        shardload.CorruptShardError,
        match=rf"shard 1 .* it is shard 1 \(samples 30-59\) of another shard set \(set id {ids[1]}\), not shard 1 "
        rf"\(samples 30-59\) of this one \(set id {ids[0]}\)",
    ):
        shardload.open(a)[30]
    assert "misplaced" in {p.reason for p in verify(a).problems if p.shard == 1}


def test_swapped_shards_name_both_positions(damaged: Path) -> None:
    one, two = shard_file(damaged, 1), shard_file(damaged, 2)
    one.rename(damaged / "tmp")
    two.rename(one)
    (damaged / "tmp").rename(two)
    for k, there in ((1, 2), (2, 1)):
        with pytest.raises(shardload.CorruptShardError, match=rf"shard {k} .*it is shard {there} .* of this set, not "):
            shardload.open(damaged)[first_sample(damaged, k)]
        assert "misplaced" in {p.reason for p in verify(damaged).problems if p.shard == k}


def test_swapped_shards_of_the_same_size_are_refused(tmp_path: Path) -> None:
    samples = [{"t": np.full(5, i, dtype=np.int32)} for i in range(40)]
    shardload.write(samples, tmp_path / "s", num_shards=4, shuffle=False, progress=False)
    files = [shard_file(tmp_path / "s", k) for k in range(4)]
    assert files[1].stat().st_size == files[2].stat().st_size  # same lengths everywhere: offsets agree too
    data = files[1].read_bytes()
    files[1].write_bytes(files[2].read_bytes())
    files[2].write_bytes(data)
    with pytest.raises(shardload.CorruptShardError, match=r"shard 1 .*it is shard 2 \(samples 20-29\) of this set"):
        shardload.open(tmp_path / "s")[10]


def rewrite_without_identity(path: Path, schema: shardload.Schema) -> None:
    cols = ArrowShardReader(path, schema).columns()
    tmp = path.with_name("rewritten")
    ArrowShardWriter(schema, ArrowOptions()).write(tmp, cols)
    m = read_manifest(path.parents[1])
    for s in m["shards"]:
        if path.name in s["file"]:
            s.update(bytes=tmp.stat().st_size, checksum=file_checksum(tmp))
    tmp.replace(path)
    write_manifest(path.parents[1], m)


def test_shard_without_identity_in_a_set_with_ids_is_refused(damaged: Path) -> None:
    rewrite_without_identity(shard_file(damaged, 1), shardload.open(damaged).schema)
    with pytest.raises(shardload.CorruptShardError, match=r"shard 1 .*carries no identity record"):
        shardload.open(damaged)[30]


def test_set_without_set_id_is_read(damaged: Path) -> None:
    m = read_manifest(damaged)
    del m["set_id"]  # as written before shards carried identities: no shard carries a record either
    write_manifest(damaged, m)
    schema = shardload.open(damaged).schema
    for k in range(len(m["shards"])):
        rewrite_without_identity(shard_file(damaged, k), schema)
    assert read_all(damaged) == 120
    assert verify(damaged).ok


@pytest.mark.parametrize("copied", [False, True])
def test_set_id_removed_from_the_manifest_is_refused(damaged: Path, other: Path, copied: bool) -> None:
    # Without its set_id a manifest would turn the cross-set check off: a shard copied in from another set of
    # the same sizes would be served. Shards carry a record only in sets whose manifest has a set_id.
    m = read_manifest(damaged)
    del m["set_id"]
    write_manifest(damaged, m)
    if copied:
        shutil.copyfile(shard_file(other, 1), shard_file(damaged, 1))
        m["shards"][1].update(bytes=shard_file(damaged, 1).stat().st_size)
        write_manifest(damaged, m)
    with pytest.raises(shardload.CorruptShardError, match=r"shard 0 .*but the manifest has no set_id"):
        read_all(damaged)
    assert "misplaced" in {p.reason for p in verify(damaged).problems if p.shard == 1}


def test_malformed_identity_record_is_corruption(damaged: Path) -> None:
    path = shard_file(damaged, 0)
    schema = shardload.open(damaged).schema
    cols = ArrowShardReader(path, schema).columns()
    meta = {**arrow_schema(schema).metadata, b"shardload.shard": b'{"set_id": 7'}
    arrays = [to_arrow(f, cols.fields[f.name].values, cols.fields[f.name].offsets) for f in schema.fields]
    tmp = damaged / "tmp"
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, arrow_schema(schema).with_metadata(meta)) as w:
        w.write_batch(pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(schema).with_metadata(meta)))
    tmp.replace(path)
    m = read_manifest(damaged)
    m["shards"][0]["bytes"] = path.stat().st_size
    write_manifest(damaged, m)
    with pytest.raises(shardload.CorruptShardError, match=r"shard 0 .* malformed identity record"):
        shardload.open(damaged)[0]


def test_set_id_is_the_same_for_the_same_input_and_differs_otherwise(tmp_path: Path) -> None:
    def prepared(name: str, samples: list[dict[str, np.ndarray]], **options: Any) -> tuple[str, list[bytes]]:
        shardload.write(samples, tmp_path / name, num_shards=3, progress=False, **options)
        files = [shard_file(tmp_path / name, k).read_bytes() for k in range(3)]
        return read_manifest(tmp_path / name)["set_id"], files

    a = prepared("a", synthetic_samples(90, seed=3))
    assert a == prepared("b", synthetic_samples(90, seed=3))  # same input and options: same id, same bytes
    assert prepared("c", other_values()[:90])[0] != a[0]  # same lengths, other values
    assert prepared("d", synthetic_samples(90, seed=3), seed=1)[0] != a[0]  # other options


# -- item: a shard changed under a live mapping ------------------------------------------------------
def in_child(fn: Callable[..., str], *args: Any, timeout: float = 90) -> str:
    """``fn(*args)`` in a forked child in its own session; its result, or how it died or hung."""
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)

    def target() -> None:
        os.setsid()
        try:
            send.send(fn(*args))
        except BaseException as exc:  # noqa: BLE001  report it; the parent asserts on the text
            send.send(f"UNCAUGHT {type(exc).__name__}: {exc}")

    proc = ctx.Process(target=target)
    proc.start()
    send.close()
    try:
        result = recv.recv() if recv.poll(timeout) else "HUNG"
    except EOFError:
        result = None
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child and any loader workers it left
    except (ProcessLookupError, PermissionError):
        pass
    proc.join(10)
    return result if result is not None else f"DIED with exit code {proc.exitcode}"


def mutate(path: Path, other: Path, op: str, k: int, j: int, frac: float) -> None:
    """Change shard ``k`` of the set at ``path`` the way a user or a tool might."""
    target, foreign = shard_file(path, k), shard_file(other, k)
    if op == "cp over":  # cp: O_TRUNC, then write, same inode
        with open(target, "wb") as fh:
            fh.write(foreign.read_bytes())
    elif op == "rsync --inplace":  # write over without truncating, then the source's mtime
        with open(target, "r+b") as fh:
            fh.write(foreign.read_bytes())
            fh.truncate()
        os.utime(target, ns=(foreign.stat().st_atime_ns, foreign.stat().st_mtime_ns))
    elif op == "in place, mtime put back":  # rsync --inplace -t, touch -r: only the ctime tells
        before = target.stat()
        with open(target, "r+b") as fh:
            fh.write(foreign.read_bytes())
            fh.truncate()
        os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    elif op == "lengths in place":  # the batching index rewritten with the same total
        index = path / "lengths.npy"
        lengths = np.load(index)
        with open(index, "r+b") as fh:
            fh.seek(index.stat().st_size - lengths.nbytes)
            fh.write(np.roll(lengths, 1 + k).tobytes())
    elif op == "replace by rename":  # rsync's default, mv: a new inode at the path
        shutil.copyfile(foreign, path / "incoming")
        (path / "incoming").replace(target)
    elif op == "swap":
        other_file = shard_file(path, j if j != k else (k + 1) % len(read_manifest(path)["shards"]))
        target.rename(path / "tmp")
        other_file.rename(target)
        (path / "tmp").rename(other_file)
    elif op == "truncate":
        os.truncate(target, int(target.stat().st_size * frac))
    elif op == "garbage in place":
        size = target.stat().st_size
        start = int(size * frac)
        with open(target, "r+b") as fh:
            fh.seek(start)
            fh.write(np.random.default_rng(k).integers(0, 256, min(512, size - start), dtype=np.uint8).tobytes())
    elif op == "append":
        with open(target, "ab") as fh:
            fh.write(b"\0" * 100)
    else:
        raise AssertionError(op)


OPS = [
    "lengths in place",
    "cp over",
    "rsync --inplace",
    "in place, mtime put back",
    "replace by rename",
    "swap",
    "truncate",
    "garbage in place",
    "append",
]


def run_epoch(
    path: str,
    other: str,
    expected: list[dict[str, np.ndarray]],
    op: str,
    k: int,
    j: int,
    frac: float,
    at: int,
) -> str:
    """One epoch, changing a shard after batch ``at`` (before any, if -1): "OK n", "ERROR ..." or "WRONG ..."."""
    if at < 0:
        mutate(Path(path), Path(other), op, k, j, frac)
    n = 0
    try:
        loader = shardload.make_loader(path, **LOADER)
        for i, batch in enumerate(loader):
            for key, want in expected[i].items():
                if not np.array_equal(batch[key].numpy(), want):
                    return f"WRONG batch {i} key {key} after {op} of shard {k}"
            n += 1
            if i == at:
                mutate(Path(path), Path(other), op, k, j, frac)
    except shardload.ShardloadError as exc:
        return f"ERROR {type(exc).__name__}: {exc}"
    return f"OK {n}"


def check_outcome(outcome: str, n: int) -> None:
    # Invariant: correct batches, then either the end of the epoch or a named error
    assert outcome == f"OK {n}" or outcome.startswith("ERROR "), outcome
    assert "memory is short" not in outcome


@pytest.mark.parametrize(
    "op", ["cp over", "rsync --inplace", "in place, mtime put back", "truncate", "garbage in place", "append"]
)
def test_shard_changed_under_a_live_loader_is_named(
    damaged: Path, other: Path, expected: list[dict[str, np.ndarray]], op: str
) -> None:
    # the first batch that reads shard 0 maps it; it is changed right after, and a later batch reads it again
    in_shard_0 = [bool((batch["sample_id"] < first_sample(damaged, 1)).any()) for batch in expected]
    at = in_shard_0.index(True)
    assert any(in_shard_0[at + 1 :]), "the plan reads shard 0 once only: pick another seed"
    outcome = in_child(run_epoch, str(damaged), str(other), expected, op, 0, 1, 0.5, at)
    # the change is named before the changed shard is read
    assert outcome.startswith("ERROR ShardSetChangedError: shard 0 ") and "changed on disk" in outcome, outcome


def test_chmod_or_link_of_a_live_set_is_not_a_change_but_a_write_with_mtime_put_back_is(
    damaged: Path, other: Path
) -> None:
    ds = shardload.open(damaged)
    first = ds[0]["tokens"].copy()
    lengths = ds.lengths
    for f in (shard_file(damaged, 0), damaged / "lengths.npy"):
        f.chmod(0o600)  # the ctime moves, and the mode with it: not a change of bytes
        os.link(f, damaged / f"{f.name}.link")  # a backup tool's hard link: ctime and link count
    np.testing.assert_array_equal(ds[1]["tokens"], ds[1]["tokens"])
    np.testing.assert_array_equal(ds[0]["tokens"], first)
    assert ds.lengths is lengths
    time.sleep(0.02)  # past a coarse ctime tick (kernels before 6.13 advance it every few ms): the write moves it
    mutate(damaged, other, "in place, mtime put back", 0, 0, 0.0)
    with pytest.raises(shardload.ShardSetChangedError, match=r"shard 0 .*modification time put back"):
        ds[0]


def lengths_changed_under_a_live_loader(path: str, op: str) -> str:
    """Plan epoch 0, change ``lengths.npy`` as ``op`` says, plan epoch 1: "OK", "ERROR ..." or "WRONG ..."."""
    index = Path(path) / "lengths.npy"
    loader = shardload.make_loader(path, rank=0, world_size=1, max_tokens=64)
    before = sum(1 for _ in loader)
    lengths = np.load(index)
    header = index.stat().st_size - lengths.nbytes
    if op == "rewritten in place":  # same total: the sum check on open would pass
        edited = np.ones_like(lengths)
        edited[0] = lengths.sum() - (len(lengths) - 1)
        with open(index, "r+b") as fh:
            fh.seek(header)
            fh.write(edited.tobytes())
    elif op == "mtime put back":
        st = index.stat()
        with open(index, "r+b") as fh:
            fh.seek(header)
            fh.write(lengths[::-1].tobytes())
        os.utime(index, ns=(st.st_atime_ns, st.st_mtime_ns))
    else:
        os.truncate(index, header + 8)  # a read of the rest of the mapping is a SIGBUS
    loader.set_epoch(1)
    try:
        sizes = [int(b["tokens_lengths"].max()) * len(b["tokens_lengths"]) for b in loader]
    except shardload.ShardloadError as exc:
        return f"ERROR {type(exc).__name__}: {exc}"
    return "OK" if max(sizes) <= 64 and len(sizes) == before else f"WRONG {len(sizes)} batches, {max(sizes)} tokens"


@pytest.mark.parametrize("op", ["rewritten in place", "mtime put back", "truncated"])
def test_lengths_index_changed_under_a_live_loader_is_named(damaged: Path, op: str) -> None:
    # Each epoch is planned from the index's current bytes: another plan than other ranks', or a SIGBUS.
    outcome = in_child(lengths_changed_under_a_live_loader, str(damaged), op)
    assert outcome.startswith("ERROR ShardSetChangedError: the lengths index lengths.npy"), outcome
    assert "changed on disk" in outcome, outcome


def test_lengths_index_changed_before_a_worker_maps_it_is_named(damaged: Path) -> None:
    # The stamp travels with the shard set into a worker process, which maps the index afresh.
    ds = shardload.open(damaged)
    assert len(ds.lengths) == 120  # mapped and stamped
    index = damaged / "lengths.npy"
    lengths = np.load(index)
    with open(index, "r+b") as fh:
        fh.seek(index.stat().st_size - lengths.nbytes)
        fh.write(lengths[::-1].tobytes())
    worker_copy = pickle.loads(pickle.dumps(ds))
    with pytest.raises(shardload.ShardSetChangedError, match=r"lengths index lengths\.npy .*rewritten in place"):
        worker_copy[0]


def test_truncated_shard_under_a_direct_reader_is_an_error_not_sigbus(damaged: Path) -> None:
    def body(path: str) -> str:
        ds = shardload.open(path)
        ds[0]
        os.truncate(shard_file(Path(path), 0), 100)
        try:
            ds[1]
        except shardload.ShardSetChangedError as exc:
            return str(exc)
        return "READ"

    assert "was truncated from" in in_child(body, str(damaged))


def test_replaced_shard_keeps_the_mapped_file_and_a_new_open_refuses_it(damaged: Path, other: Path) -> None:
    ds = shardload.open(damaged)
    before = ds[0]["tokens"].copy()
    mutate(damaged, other, "replace by rename", 0, 0, 0.0)
    ds[1]
    np.testing.assert_array_equal(ds[0]["tokens"], before)  # still the mapped file: consistent, not mixed
    with pytest.raises(shardload.CorruptShardError, match=r"shard 0 .*of another shard set"):
        shardload.open(damaged)[0]


@pytest.mark.slow
@pytest.mark.parametrize("op", ["truncate", "cp over", "rsync --inplace"])
def test_shard_changed_under_two_workers_is_named(
    damaged: Path, other: Path, expected: list[dict[str, np.ndarray]], op: str
) -> None:
    # every shard changes, so a batch planned after the change must fail in whichever worker reads it
    def every_shard(path: str) -> str:
        loader = shardload.make_loader(
            path, loader_options=shardload.LoaderOptions(num_workers=2, prefetch_factor=1), **LOADER
        )
        n = 0
        try:
            for i, batch in enumerate(loader):
                for key, want in expected[i].items():
                    if not np.array_equal(batch[key].numpy(), want):
                        return f"WRONG batch {i} key {key}"
                n += 1
                if i == 1:
                    time.sleep(1.5)  # the workers finish their prefetched batches and wait
                    for k in range(4):
                        mutate(Path(path), other, op, k, k, 0.5)
        except shardload.ShardloadError as exc:
            return f"ERROR {type(exc).__name__}: {exc}"
        except RuntimeError as exc:
            return f"RUNTIME {exc}"
        return f"OK {n}"

    outcome = in_child(every_shard, str(damaged), timeout=120)
    assert outcome.startswith("ERROR "), outcome  # not "DataLoader worker ... died ... memory is short"
    assert "changed on disk" in outcome or "of another shard set" in outcome or "the manifest says" in outcome, outcome


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    op=st.sampled_from(OPS),
    k=st.integers(0, 3),
    j=st.integers(0, 3),
    frac=st.floats(0.0, 1.0),
    at=st.integers(-1, 14),  # -1: before the loader opens anything
)
def test_fuzz_shards_changed_under_a_live_loader(
    pristine: Path, other: Path, expected: list[dict[str, np.ndarray]], op: str, k: int, j: int, frac: float, at: int
) -> None:
    # Bytes changed at rest inside sample values are verify's to find (see docs/reliability.md), not a live change:
    # garbage written into shard k counts as live only if a batch up to `at` mapped shard k before the write.
    manifest = read_manifest(pristine)["shards"]
    lo, hi = manifest[k]["first_sample"], manifest[k]["first_sample"] + manifest[k]["samples"]
    mapped = any(((b["sample_id"] >= lo) & (b["sample_id"] < hi)).any() for b in expected[: max(at + 1, 0)])
    assume(not (op == "garbage in place" and not mapped))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(shutil.copytree(pristine, Path(tmp) / "set"))
        outcome = in_child(run_epoch, str(path), str(other), expected, op, k, j, frac, at)
        check_outcome(outcome, len(expected))


def test_resume_rewrites_shards_finished_without_this_identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A run interrupted after its shards were written, by a shardload whose shards carried no identity:
    # the resumed set must not mix shards without identity into a set that has a set id.
    pipeline = importlib.import_module("shardload.prepare.pipeline")
    out = tmp_path / "s"

    def stop(name: str) -> None:
        if name == "index":
            raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "crash_point", stop)
    samples = synthetic_samples(60, seed=3)
    with pytest.raises(KeyboardInterrupt):
        shardload.write(samples, out, num_shards=3, progress=False)
    work = out / ".prepare"
    schema = shardload.Schema.from_json(json.loads((work / "state.json").read_text())["schema"])
    for done in sorted((work / "done").glob("*.json")):
        record = json.loads(done.read_text())
        del record["set_id"]
        shard = work / record["file"]
        ArrowShardWriter(schema, ArrowOptions()).write(work / "old", ArrowShardReader(shard, schema).columns())
        (work / "old").replace(shard)
        record.update(bytes=shard.stat().st_size, checksum=file_checksum(shard))
        done.write_text(json.dumps(record))
    monkeypatch.undo()
    shardload.write(samples, out, num_shards=3, resume=True, progress=False)
    assert read_all(out) == 60


def test_zarr_shard_rewritten_in_place_while_open_is_named(tmp_path: Path) -> None:
    # Zarr shards are read through a mapping of the zip file and a cache of decoded chunks (a chunk stored
    # raw is a view of the mapping); a rewrite must not be answered from either.
    shardload.write(synthetic_samples(60, seed=3), tmp_path / "s", num_shards=2, shard_format="zarr", progress=False)
    ds = shardload.open(tmp_path / "s")
    ds[0]
    path = shard_file(tmp_path / "s", 0)
    with open(path, "r+b") as fh:
        fh.seek(path.stat().st_size // 2)
        fh.write(b"\xff" * 64)
    with pytest.raises(shardload.ShardSetChangedError, match=r"shard 0 .*rewritten in place"):
        ds[0]


@pytest.mark.parametrize("fmt", ["arrow", "zarr"])
def test_shard_of_the_wrong_size_is_read_for_its_identity_within_the_manifests_bounds(tmp_path: Path, fmt: str) -> None:
    """The file that explains a wrong size is untrusted: its reader gets the manifest's samples and options."""
    out = tmp_path / "s"
    shardload.write(synthetic_samples(60, seed=3), out, num_shards=2, shuffle=False, shard_format=fmt, progress=False)
    with shard_file(out, 1).open("ab") as f:
        f.write(b"\0" * 16)
    ss = shardload.open(out)
    calls: list[dict[str, Any]] = []
    real = ss._checks.reader_cls

    def spy(path: Path, schema: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(path, schema, **kwargs)

    ss._checks.reader_cls = spy  # type: ignore[assignment]
    with pytest.raises(shardload.CorruptShardError, match=r"shard 1 .* has \d+ bytes, the manifest says"):
        ss[first_sample(out, 1)]
    info = read_manifest(out)
    assert calls == [{"samples": info["shards"][1]["samples"], "options": info["options"]}]


def test_a_shard_open_checks_each_lengths_index_once(damaged: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each index file is stat'ed once per shard open (its arrays are then used as they are), not per use."""
    ss = shardload.open(damaged)
    assert len(ss.lengths) == len(ss)  # mapped when the set is planned; the shard's open only checks them
    for name in ("tokens", "features"):
        ss.field_lengths(name)
    checked: list[str] = []
    real = type(ss._checks).check_index_unchanged

    def spy(self: Any, file: str) -> None:
        checked.append(file)
        real(self, file)

    monkeypatch.setattr(type(ss._checks), "check_index_unchanged", spy)
    ss[0]
    assert sorted(checked) == sorted(set(checked)) and len(checked) == 3, checked
