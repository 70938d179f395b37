"""``shardload export --to webdataset``: the tars hold the set's samples, for WebDataset and for prepare.

Round trips go both ways: ``webdataset.WebDataset`` decodes each sample's
``<key>.<field>.npy`` members into the very arrays of the set, and ``shardload
prepare`` turns the tars back into a set with the same samples and schema.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from shardload.cli import Exit, main
from shardload.integrations import webdataset_export as export_wds
from shardload.integrations.webdataset_export import INDEX_NAME, WebDatasetExport, member_header, to_webdataset

wds = pytest.importorskip("webdataset")

REPO = Path(shardload.__file__).resolve().parent.parent
N = 30


def make_samples(n: int = N) -> Iterator[dict[str, np.ndarray]]:
    """Several fields of every kind; lengths include 0 (empty tokens, a 0-row feature matrix)."""
    rng = np.random.default_rng(7)
    for i in range(n):
        yield {
            "tokens": rng.integers(0, 50_000, size=int(rng.integers(0, 20)), dtype=np.int32),
            "features": rng.standard_normal((int(rng.integers(0, 5)), 4)).astype(np.float32),
            "emb": rng.standard_normal(3).astype(np.float32),  # fixed [3]
            "label": np.array(i % 5, dtype=np.int64),  # fixed []
            "flag": np.array(i % 2 == 0),  # bool
        }


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "set"
    shardload.write(make_samples(), out, num_shards=3, fixed_fields=["emb"], length_field="tokens")
    return out


def assert_same_array(got: Any, want: np.ndarray, where: str) -> None:
    got = np.asarray(got)
    assert got.dtype == want.dtype, f"{where}: {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{where}: {got.shape} != {want.shape}"
    np.testing.assert_array_equal(got, want, err_msg=where)


def tar_members(path: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(path) as tf:
        return tf.getmembers()


def cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- round trips -------------------------------------------------------------------------------------


def test_webdataset_decodes_the_same_samples(shard_set: Path, tmp_path: Path) -> None:
    result = to_webdataset(shard_set, tmp_path / "wds", samples_per_tar=7, progress=False)
    ds = shardload.open(shard_set)
    got = list(wds.WebDataset(result.pattern, shardshuffle=False, empty_check=False).decode())
    assert len(got) == len(ds) == N
    for i, sample in enumerate(got):
        # the key is the sample id; every field is one .npy member, nothing else
        assert sample["__key__"] == f"{i:09d}"
        assert {k for k in sample if not k.startswith("__")} == {f"{name}.npy" for name in ds.schema.names}
        for name, want in ds[i].items():
            assert_same_array(sample[f"{name}.npy"], want, f"sample {i} {name}")


def test_prepare_reads_the_export_back(shard_set: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = to_webdataset(shard_set, tmp_path / "wds", progress=False)
    assert result.prepare_options == ("--no-shuffle", "--fixed-field", "emb", "--length-field", "tokens")
    # the options the export recommends rebuild the same schema and the same samples in the same order
    again = tmp_path / "again"
    code, _, err = cli(capsys, "prepare", result.pattern, "-o", again, "--no-progress", *result.prepare_options)
    assert code == 0, err
    before, after = shardload.open(shard_set), shardload.open(again)
    assert after.schema == before.schema  # names, order, dtypes, shapes (fixed emb), length field
    assert len(after) == len(before)
    for i in range(len(before)):
        for name, want in before[i].items():
            assert_same_array(after[i][name], want, f"sample {i} {name}")
    np.testing.assert_array_equal(after.lengths, before.lengths)


def test_prepare_of_the_export_directory_reads_its_tars(shard_set: Path, tmp_path: Path) -> None:
    """The export's own index beside the tars is not data: preparing the directory reads the tars only."""
    result = to_webdataset(shard_set, tmp_path / "wds", progress=False)
    again = shardload.prepare(tmp_path / "wds", tmp_path / "again", shuffle=False, progress=False)
    assert again.samples == len(shardload.open(shard_set)) and again.skipped == {"marker": 1}, result


def test_without_the_options_samples_survive_but_emb_becomes_variable(shard_set: Path, tmp_path: Path) -> None:
    result = to_webdataset(shard_set, tmp_path / "wds", progress=False)
    shardload.prepare(result.pattern, tmp_path / "again", shuffle=False)
    before, after = shardload.open(shard_set), shardload.open(tmp_path / "again")
    assert after.schema.field("emb").shape == (None,)  # why the export prints --fixed-field
    for i in range(len(before)):
        for name, want in before[i].items():
            assert_same_array(after[i][name], want, f"sample {i} {name}")


# -- layout ------------------------------------------------------------------------------------------


def test_samples_per_tar_splits_in_id_order(shard_set: Path, tmp_path: Path) -> None:
    result = to_webdataset(shard_set, tmp_path / "wds", samples_per_tar=7, progress=False)
    assert result.tars == tuple(f"shard-{t:06d}.tar" for t in range(5))
    assert result.pattern == str(tmp_path / "wds" / "shard-{000000..000004}.tar")
    fields = shardload.open(shard_set).schema.names
    keys = []
    for t, name in enumerate(result.tars):
        members = [m.name for m in tar_members(tmp_path / "wds" / name)]
        tar_keys = sorted({m.split(".")[0] for m in members})
        assert len(tar_keys) == (7 if t < 4 else 2)
        # each sample's members are adjacent and in schema order
        assert members == [f"{k}.{f}.npy" for k in tar_keys for f in fields]
        keys += tar_keys
    assert keys == [f"{i:09d}" for i in range(N)]
    index = json.loads((tmp_path / "wds" / INDEX_NAME).read_text())
    assert [(r["file"], r["first_sample"], r["samples"]) for r in index["tars"]] == [
        (f"shard-{t:06d}.tar", 7 * t, 7 if t < 4 else 2) for t in range(5)
    ]
    assert index["samples"] == N and index["schema"] == shardload.open(shard_set).schema.to_json()
    for r in index["tars"]:
        path = tmp_path / "wds" / r["file"]
        assert r["bytes"] == path.stat().st_size and r["checksum"].startswith("sha256:")


def test_default_is_one_tar_per_shard(shard_set: Path, tmp_path: Path) -> None:
    result = to_webdataset(shard_set, tmp_path / "wds", progress=False)
    shards = shardload.open(shard_set).shards
    assert len(result.tars) == len(shards)
    for name, shard in zip(result.tars, shards):
        assert len(tar_members(tmp_path / "wds" / name)) == 5 * shard.samples


def test_same_set_exports_identical_bytes(shard_set: Path, tmp_path: Path) -> None:
    a = to_webdataset(shard_set, tmp_path / "a", samples_per_tar=11, progress=False)
    b = to_webdataset(shard_set, tmp_path / "b", samples_per_tar=11, progress=False)
    for name in a.tars:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        for m in tar_members(tmp_path / "a" / name):
            # nothing about the machine or the time of the export is recorded
            assert (m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) == (0, 0, 0, "", "", 0o644)
    assert (tmp_path / "a" / INDEX_NAME).read_bytes() == (tmp_path / "b" / INDEX_NAME).read_bytes()
    assert b.bytes == a.bytes


@pytest.mark.parametrize(
    ("name", "size"),
    [("000000001.tokens.npy", 100), ("k" * 100, 0), ("k" * 101, 5), ("000000001.tökens.npy", 7), ("k.npy", 8**11)],
)
def test_member_header_is_a_valid_tar_header(name: str, size: int) -> None:
    header = member_header(name, size)
    data = b"\x01" * min(size, 512)
    with tarfile.open(fileobj=io.BytesIO(header + data + b"\x00" * 1024 * 10), ignore_zeros=False) as tf:
        info = tf.next()
    assert info is not None
    assert (info.name, info.size, info.mtime, info.uid, info.mode, info.type) == (
        name,
        size,
        0,
        0,
        0o644,
        tarfile.REGTYPE,
    )


def test_field_names_that_webdataset_would_change_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    samples = [{"inputIds": np.arange(3, dtype=np.int32)}]
    shardload.write(samples, tmp_path / "set", num_shards=1)
    # a property of the set being exported (its input), not of the destination
    with pytest.raises(shardload.InputError, match="'inputIds'.*lower case"):
        to_webdataset(tmp_path / "set", tmp_path / "wds", progress=False)
    assert not (tmp_path / "wds").exists()
    code, _, err = cli(capsys, "export", tmp_path / "set", "--to", "webdataset", tmp_path / "wds")
    assert code == Exit.INPUT and "'inputIds'" in err, err
    assert not (tmp_path / "wds").exists()


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_samples_per_tar_that_is_not_a_positive_integer_is_refused(shard_set: Path, tmp_path: Path, bad: Any) -> None:
    with pytest.raises(shardload.InputError, match=r"samples_per_tar must be a positive integer.*None for one tar"):
        to_webdataset(shard_set, tmp_path / "wds", samples_per_tar=bad, progress=False)
    assert not (tmp_path / "wds").exists()


# -- the destination ---------------------------------------------------------------------------------


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_non_empty_destination_is_refused(shard_set: Path, tmp_path: Path) -> None:
    dest = tmp_path / "wds"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    with pytest.raises(shardload.OutputExistsError, match="not empty.*--overwrite"):
        to_webdataset(shard_set, dest, progress=False)
    # --overwrite replaces an earlier export only, never other files
    with pytest.raises(shardload.OutputExistsError, match="notes.txt"):
        to_webdataset(shard_set, dest, overwrite=True, progress=False)
    assert snapshot(dest) == {"notes.txt": b"mine"}  # not even a lock file was left
    (dest / "f").write_text("")
    with pytest.raises(shardload.OutputError, match="not a directory"):
        to_webdataset(shard_set, dest / "f", progress=False)


def test_earlier_export_needs_overwrite(shard_set: Path, tmp_path: Path) -> None:
    dest = tmp_path / "wds"
    to_webdataset(shard_set, dest, samples_per_tar=4, progress=False)
    before = snapshot(dest)
    assert ".export.lock" not in before  # a finished export leaves only tars and the index
    with pytest.raises(shardload.OutputExistsError):
        to_webdataset(shard_set, dest, samples_per_tar=10, progress=False)
    assert snapshot(dest) == before
    result = to_webdataset(shard_set, dest, samples_per_tar=10, overwrite=True, progress=False)
    # the old export's extra tars are gone: the directory holds exactly the new export
    assert sorted(snapshot(dest)) == sorted([*result.tars, INDEX_NAME])
    assert len(result.tars) == 3


def test_failed_overwrite_leaves_the_earlier_export_intact(
    shard_set: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "wds"
    to_webdataset(shard_set, dest, samples_per_tar=4, progress=False)
    before = snapshot(dest)
    real = export_wds._npy_bytes
    calls = {"n": 0}

    def failing(value: np.ndarray) -> bytes:
        calls["n"] += 1
        if calls["n"] > 5 * 12:  # in the middle of the second tar
            raise OSError(28, "No space left on device")
        return real(value)

    monkeypatch.setattr(export_wds, "_npy_bytes", failing)
    with pytest.raises(OSError, match="No space"):
        to_webdataset(shard_set, dest, samples_per_tar=10, overwrite=True, progress=False)
    # Invariant: the earlier export is untouched and nothing half-written is left
    assert snapshot(dest) == before
    monkeypatch.setattr(export_wds, "_npy_bytes", real)
    assert to_webdataset(shard_set, dest, samples_per_tar=10, overwrite=True, progress=False).samples == N


def test_overwrite_cleans_up_after_an_interrupted_export(shard_set: Path, tmp_path: Path) -> None:
    dest = tmp_path / "wds"
    dest.mkdir()
    (dest / ".shard-000007.tar.new").write_bytes(b"half")
    (dest / "shard-000009.tar").write_bytes(b"old")
    result = to_webdataset(shard_set, dest, overwrite=True, progress=False)
    assert sorted(snapshot(dest)) == sorted([*result.tars, INDEX_NAME])


def test_a_running_export_locks_the_destination(shard_set: Path, tmp_path: Path) -> None:
    import fcntl

    dest = tmp_path / "wds"
    dest.mkdir()
    with open(dest / ".export.lock", "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(shardload.OutputLockedError, match="another export"):
            to_webdataset(shard_set, dest, progress=False)
    assert not any(dest.glob("*.tar*"))


@pytest.mark.slow
def test_a_forked_child_does_not_keep_the_export_lock(shard_set: Path, tmp_path: Path) -> None:
    # A child forked while an export holds DEST (by a user's code, say) lets go of the lock:
    # once the export's process is gone, the next export is not refused.
    dest = tmp_path / "wds"
    script = f"""
import os, signal
from pathlib import Path
from shardload.integrations.webdataset_export import _DestLock
with _DestLock(Path({str(dest)!r}), overwrite=False):
    if os.fork() == 0:
        import time
        time.sleep(60)
        os._exit(0)
    print("forked", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"forked"
        assert proc.wait(timeout=30) < 0
        assert (dest / ".export.lock").exists()  # left by the killed export, still open in the child
        assert to_webdataset(shard_set, dest, progress=False).samples == N  # not OutputLockedError
    finally:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass


# -- command line ------------------------------------------------------------------------------------


def test_cli_json_and_human_output(shard_set: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dest = tmp_path / "wds"
    code, out, err = cli(
        capsys, "export", shard_set, "--to", "webdataset", dest, "--samples-per-tar", "8", "--json", "--no-progress"
    )
    assert code == 0, err
    assert out.count("\n") == 1  # one JSON object on one line
    obj = json.loads(out)
    assert obj["samples"] == N and obj["tars"] == [f"shard-{t:06d}.tar" for t in range(4)]
    assert obj["pattern"] == str(dest / "shard-{000000..000003}.tar") and obj["format"] == "webdataset"
    assert obj["bytes"] == sum((dest / t).stat().st_size for t in obj["tars"])
    code, out, err = cli(capsys, "export", shard_set, "--to", "webdataset", dest, "--overwrite", "--no-progress")
    assert code == 0, err
    assert out.startswith(f"exported {shard_set} to {dest}: 30 samples in 3 tars")
    assert f"shardload prepare '{dest}/shard-{{000000..000002}}.tar' -o OUT --no-shuffle --fixed-field emb" in out


def test_cli_exit_codes(shard_set: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dest = tmp_path / "wds"
    dest.mkdir()
    (dest / "x").write_text("")
    code, _, err = cli(capsys, "export", shard_set, "--to", "webdataset", dest)
    assert code == Exit.OUTPUT and err.startswith("shardload: error: ") and "--overwrite" in err
    code, _, err = cli(capsys, "export", tmp_path / "nowhere", "--to", "webdataset", tmp_path / "w2")
    assert code == Exit.SHARD_SET and "not a shard set" in err
    assert cli(capsys, "export", shard_set, "--to", "zarr", tmp_path / "w3")[0] == Exit.USAGE
    assert cli(capsys, "export", shard_set, tmp_path / "w3")[0] == Exit.USAGE  # --to is required
    assert cli(capsys, "export", shard_set, "--to", "webdataset", tmp_path / "w3", "--samples-per-tar", "0")[0] == 2
    assert not (tmp_path / "w2").exists() and not (tmp_path / "w3").exists()


@pytest.mark.slow
def test_export_subprocess_without_torch(shard_set: Path, tmp_path: Path) -> None:
    dest = tmp_path / "wds"
    code = f"""
import sys
from shardload.cli import main
assert main(["export", {str(shard_set)!r}, "--to", "webdataset", {str(dest)!r}, "--json"]) == 0
print("torch" in sys.modules, "lightning" in sys.modules, file=sys.stderr)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    p = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["samples"] == N
    # export stays as light as the other data commands
    assert p.stderr.splitlines()[-1] == "False False"


def test_result_to_json_round_trips_through_json() -> None:
    r = WebDatasetExport(
        path="s",
        dest="d",
        tars=("shard-000000.tar",),
        samples=3,
        bytes=10,
        seconds=0.1234,
        prepare_options=("--no-shuffle",),
    )
    assert json.loads(json.dumps(r.to_json())) == {
        "path": "s",
        "dest": "d",
        "format": "webdataset",
        "tars": ["shard-000000.tar"],
        "pattern": os.path.join("d", "shard-000000.tar"),
        "samples": 3,
        "bytes": 10,
        "seconds": 0.123,
        "prepare_options": ["--no-shuffle"],
    }
