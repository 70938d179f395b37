"""Small shard files that would decode to a lot of memory are refused before they are decoded.

Each crafted shard comes with a manifest whose size and checksum match it, as
a hostile or buggy producer would write: the format's own bounds must catch
it, at open and in ``verify``. Memory is measured in a child process (peak RSS,
``VmHWM``, reset to the current RSS after the imports), so the test proves
that nothing close to the decoded size was allocated.
"""

from __future__ import annotations

import json
import signal
import struct
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardload
from shardload._base.checksum import file_checksum
from shardload.formats import get_format
from shardload.formats.arrow.writer import arrow_schema, to_arrow
from shardload.sets.verify import verify
from shardload.testing import synthetic_samples

from .conftest import read_manifest, shard_file, write_manifest

REPO = Path(__file__).resolve().parents[2]
#: what every bomb below decodes to; a reader that decodes it shows at least this much more peak RSS
BOMB_BYTES = 96 << 20
#: the peak RSS growth allowed while a bomb is refused (imports are done before the baseline)
RSS_SLACK = 24 << 20


# -- helpers ------------------------------------------------------------------------------------------
def make_set(root: Path, fmt: str, **format_options: Any) -> Path:
    """40 samples (tokens, features, label) in 2 shards, in format ``fmt`` with ``format_options``."""
    out = root / f"set-{fmt}"
    shard_format = get_format(fmt).options(**format_options)
    shardload.write(
        synthetic_samples(40, seed=5), out, num_shards=2, shuffle=False, progress=False, shard_format=shard_format
    )
    return out


def install_shard(root: Path, k: int, data: bytes) -> Path:
    """Replace shard ``k`` by ``data`` and make the manifest agree with it (size and checksum)."""
    path = shard_file(root, k)
    path.write_bytes(data)
    m = read_manifest(root)
    m["shards"][k]["bytes"] = len(data)
    m["shards"][k]["checksum"] = file_checksum(path)
    write_manifest(root, m)
    return path


def read_everything(root: Path) -> None:
    ds = shardload.open(root)
    for i in range(len(ds)):
        ds[i]


_CHILD = textwrap.dedent(
    """
    import json, sys
    import shardload, shardload.sets.verify, pyarrow, numcodecs
    import zarr  # noqa: F401  imported before the baseline, like everything the readers use

    def status(key):
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(key + ":"))

    # Reset the peak-RSS mark (VmHWM) to the current RSS, so that import-time peaks do not hide growth.
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    base = status("VmRSS")
    out = {"errors": []}
    try:
        ds = shardload.open(sys.argv[1])
        for i in range(len(ds)):
            ds[i]
    except shardload.ShardloadError as exc:
        out["errors"].append(type(exc).__name__ + ": " + str(exc))
    report = shardload.sets.verify.verify(sys.argv[1])
    out["problems"] = [str(p) for p in report.problems]
    out["grown"] = status("VmHWM") - base
    print(json.dumps(out))
    """
)


def open_in_child(root: Path) -> dict[str, Any]:
    """Open ``root``, read every sample, then verify it, in a fresh process; errors and peak RSS growth."""
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(root)], capture_output=True, text=True, timeout=180, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def assert_refused_without_blowup(root: Path, shard: int, *fragments: str) -> None:
    result = open_in_child(root)
    assert result["grown"] < RSS_SLACK, f"peak RSS grew by {result['grown'] / 2**20:.0f} MiB while refusing"
    assert len(result["errors"]) == 1, result
    error = result["errors"][0]
    assert error.startswith("CorruptShardError"), error
    for fragment in (shard_file(root, shard).name, "verify", *fragments):
        assert fragment in error, error
    assert any(p.startswith(f"shard {shard} ") and "unreadable" in p for p in result["problems"]), result["problems"]


# -- Arrow ----------------------------------------------------------------------------------------------
def arrow_bytes(batch: pa.RecordBatch, **write_options: Any) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batch.schema, options=pa.ipc.IpcWriteOptions(**write_options)) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_compressed_arrow_shard_is_refused_at_open_and_by_verify(tmp_path: Path, codec: str) -> None:
    root = make_set(tmp_path, "arrow")
    with pa.memory_map(str(shard_file(root, 1))) as source:
        data = arrow_bytes(pa.ipc.open_file(source).get_batch(0), compression=codec)
    install_shard(root, 1, data)
    ds = shardload.open(root)
    ds[0]  # shard 0 is untouched
    with pytest.raises(shardload.CorruptShardError, match=r"shard-000001\.arrow.*compressed.*uncompressed.*verify"):
        ds[len(ds) - 1]
    problems = [p for p in verify(root).problems if p.shard == 1]
    assert [p.reason for p in problems] == ["unreadable"] and "compressed" in problems[0].detail


@pytest.mark.slow
def test_arrow_zstd_bomb_is_refused_without_decompressing(tmp_path: Path) -> None:
    # A 14 KB shard whose one sample decompresses to 96 MiB of zeros.
    root = make_set(tmp_path, "arrow")
    schema = shardload.open(root).schema
    n = read_manifest(root)["shards"][0]["samples"]
    big = np.zeros(BOMB_BYTES // 4, dtype=np.int32)
    offsets = np.zeros(n + 1, dtype=np.int64)
    offsets[1:] = len(big)
    ds = shardload.open(root)
    cols = ds.shard_columns(0)
    arrays = [
        to_arrow(f, big, offsets)
        if f.name == "tokens"
        else to_arrow(f, cols.fields[f.name].values, cols.fields[f.name].offsets)
        for f in schema.fields
    ]
    batch = pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(schema))
    data = arrow_bytes(batch, compression="zstd")
    ds.close()
    assert len(data) < BOMB_BYTES // 1000
    install_shard(root, 0, data)
    assert_refused_without_blowup(root, 0, "compressed")


def test_extra_column_is_refused(tmp_path: Path) -> None:
    root = make_set(tmp_path, "arrow")
    path = shard_file(root, 0)
    with pa.memory_map(str(path)) as source:
        batch = pa.ipc.open_file(source).get_batch(0)
        extra = batch.append_column(pa.field("zzz", pa.int64()), pa.array(np.arange(batch.num_rows)))
        data = arrow_bytes(extra)
    install_shard(root, 0, data)
    with pytest.raises(shardload.CorruptShardError, match=r"shard-000000\.arrow: its columns are .*'zzz'"):
        read_everything(root)


def test_dictionary_encoded_column_is_refused(tmp_path: Path) -> None:
    # Even as an extra column (which was never looked at): pyarrow decodes dictionary batches
    # (compressed or not) into memory of their own while it reads the record batch.
    root = make_set(tmp_path, "arrow")
    path = shard_file(root, 0)
    with pa.memory_map(str(path)) as source:
        batch = pa.ipc.open_file(source).get_batch(0)
        codes = pa.array(np.zeros(batch.num_rows, dtype=np.int32))
        extra = pa.DictionaryArray.from_arrays(codes, pa.array(np.arange(4, dtype=np.int64)))
        data = arrow_bytes(batch.append_column("zzz", extra))
    install_shard(root, 0, data)
    with pytest.raises(shardload.CorruptShardError, match=r"shard-000000\.arrow: it holds 1 dictionary batch"):
        read_everything(root)
    assert {p.reason for p in verify(root).problems if p.shard == 0} == {"unreadable"}


def test_big_endian_shard_is_refused_not_copied(tmp_path: Path) -> None:
    # pyarrow would byte-swap every buffer of a big-endian file into new memory: the flag in the
    # schema's flatbuffer is set here by hand (pyarrow cannot write big-endian files).
    root = make_set(tmp_path, "arrow")
    data = bytearray(shard_file(root, 0).read_bytes())
    size = len(data)
    footer_len = struct.unpack_from("<i", data, size - 10)[0]
    start = size - 10 - footer_len
    footer = start + struct.unpack_from("<I", data, start)[0]
    vtable = footer - struct.unpack_from("<i", data, footer)[0]
    schema_pos = footer + struct.unpack_from("<H", data, vtable + 4 + 2 * 1)[0]
    schema = schema_pos + struct.unpack_from("<I", data, schema_pos)[0]
    svt = schema - struct.unpack_from("<i", data, schema)[0]
    assert struct.unpack_from("<H", data, svt + 4)[0] == 0  # little-endian, the default, is left out
    # Point the endianness slot at a 16-bit 1 inside the footer (the record batch count, for one).
    rel = next(
        r for r in range(4, min(65536, size - 10 - schema), 2) if data[schema + r : schema + r + 2] == b"\x01\x00"
    )
    struct.pack_into("<H", data, svt + 4, rel)
    install_shard(root, 0, bytes(data))
    with pytest.raises(shardload.CorruptShardError, match=r"shard-000000\.arrow: it is big-endian"):
        read_everything(root)


# -- Zarr -----------------------------------------------------------------------------------------------
def zip_members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def zip_bytes(members: dict[str, bytes], deflated: frozenset[str] = frozenset()) -> bytes:
    import io

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name in sorted(members):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED if name in deflated else zipfile.ZIP_STORED
            zf.writestr(info, members[name])
    return buf.getvalue()


def codec_name(root: Path) -> str:
    """The name zarr gives the compressor of ``root``'s Zarr shards: ``zstd`` or ``blosc``."""
    return {"zstd": "zstd", "blosc-lz4": "blosc"}[read_manifest(root)["options"]["compression"]]


def encode(root: Path, data: bytes) -> bytes:
    """``data`` compressed as ``root``'s Zarr shards compress a chunk (what a forged chunk looks like)."""
    import numcodecs

    if codec_name(root) == "zstd":
        return bytes(numcodecs.Zstd(level=19).encode(data))
    return bytes(numcodecs.Blosc(cname="lz4", clevel=9, shuffle=numcodecs.Blosc.SHUFFLE).encode(data))


def encoded_zeros(root: Path, nbytes: int) -> bytes:
    return encode(root, bytes(nbytes))


def lying_frame(root: Path, nbytes: int) -> bytes:
    """A small frame that declares ``nbytes`` decoded: zstd zeros, or a blosc header patched to say so."""
    if codec_name(root) == "zstd":
        return encoded_zeros(root, nbytes)  # zstd compresses zeros ~30,000x: a real bomb
    frame = bytearray(encoded_zeros(root, 248))
    struct.pack_into("<I", frame, 4, nbytes)  # blosc's header: decoded size at byte 4
    return bytes(frame)


@pytest.fixture(scope="module", params=["zstd", "blosc-lz4"])
def zarr_pristine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("zarr")
    return make_set(tmp_path_factory.mktemp("zarr"), "zarr", chunk_size=256, compression=request.param)


@pytest.fixture
def zarr_set(zarr_pristine: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(zarr_pristine, tmp_path / "set"))


@pytest.mark.slow
def test_zarr_chunk_whose_frame_lies_about_its_size_is_not_decoded(zarr_set: Path) -> None:
    # The metadata is honest (chunks of 256 bytes), the zstd or blosc frame in chunk 0 decodes to 96 MiB.
    members = zip_members(shard_file(zarr_set, 0))
    members["tokens/values/c/0"] = lying_frame(zarr_set, BOMB_BYTES)
    install_shard(zarr_set, 0, zip_bytes(members))
    assert_refused_without_blowup(zarr_set, 0, "chunk 0 of array 'tokens/values'", "declares")


@pytest.mark.slow
def test_zarr_chunks_declared_over_the_manifests_chunk_size_are_refused(zarr_set: Path) -> None:
    # zarr.json declares one chunk of 96 MiB, and the chunk holds it: only the bound can refuse it.
    path = shard_file(zarr_set, 0)
    members = zip_members(path)
    meta = json.loads(members["tokens/values/zarr.json"])
    rows = BOMB_BYTES // 4
    meta["shape"] = [rows]
    meta["chunk_grid"]["configuration"]["chunk_shape"] = [rows]
    members["tokens/values/zarr.json"] = json.dumps(meta).encode()
    for name in [m for m in members if m.startswith("tokens/values/c/")]:
        del members[name]
    members["tokens/values/c/0"] = encoded_zeros(zarr_set, BOMB_BYTES)
    offsets_meta = json.loads(members["tokens/offsets/zarr.json"])
    assert offsets_meta["codecs"][-1]["name"] == codec_name(zarr_set)
    n = read_manifest(zarr_set)["shards"][0]["samples"]
    offsets = np.full(n + 1, rows, dtype=np.int64)
    offsets[0] = 0
    members["tokens/offsets/c/0"] = encode(zarr_set, offsets.tobytes())
    install_shard(zarr_set, 0, zip_bytes(members))
    assert_refused_without_blowup(zarr_set, 0, "'tokens/values'", "over the", "chunk_size")


@pytest.mark.slow
def test_zarr_deflated_zip_member_is_refused_before_it_is_inflated(zarr_set: Path) -> None:
    # A zip bomb: a deflated member that inflates to 96 MiB (the format stores members as they are).
    members = zip_members(shard_file(zarr_set, 0))
    members["tokens/values/c/0"] = bytes(BOMB_BYTES)
    data = zip_bytes(members, deflated=frozenset({"tokens/values/c/0"}))
    assert len(data) < BOMB_BYTES // 500
    install_shard(zarr_set, 0, data)
    assert_refused_without_blowup(zarr_set, 0, "'tokens/values/c/0' is compressed")


def test_zarr_deflated_metadata_member_is_refused(zarr_set: Path) -> None:
    members = zip_members(shard_file(zarr_set, 1))
    install_shard(zarr_set, 1, zip_bytes(members, deflated=frozenset({"zarr.json"})))
    with pytest.raises(
        shardload.CorruptShardError, match=r"shard-000001\.zarr\.zip: zip member 'zarr.json' is compressed"
    ):
        read_everything(zarr_set)
    assert {p.reason for p in verify(zarr_set).problems if p.shard == 1} == {"unreadable"}


def test_zarr_zip_member_whose_declared_size_lies_is_refused(zarr_set: Path) -> None:
    path = shard_file(zarr_set, 0)
    data = bytearray(path.read_bytes())
    name = b"tokens/values/c/0"
    cd = data.find(b"PK\x01\x02")  # the first central directory entry
    while cd >= 0 and data[cd + 46 : cd + 46 + len(name)] != name:
        cd = data.find(b"PK\x01\x02", cd + 4)
    assert cd >= 0
    struct.pack_into("<I", data, cd + 24, 1 << 31)  # uncompressed size: 2 GiB
    install_shard(zarr_set, 0, bytes(data))
    with pytest.raises(
        shardload.CorruptShardError, match=r"'tokens/values/c/0' declares 2147483648 bytes uncompressed"
    ):
        read_everything(zarr_set)


def test_zarr_sample_count_is_checked_against_the_manifest_before_offsets_are_read(zarr_set: Path) -> None:
    m = read_manifest(zarr_set)
    m["shards"][0]["samples"] -= 1  # the shard declares one more: its offsets are not decoded
    m["shards"][1]["samples"] += 1
    m["shards"][1]["first_sample"] -= 1
    write_manifest(zarr_set, m)
    with pytest.raises(
        shardload.CorruptShardError, match=r"shard-000000\.zarr\.zip holds \d+ samples, the manifest says"
    ):
        shardload.open(zarr_set)[0]
    reasons = {p.shard: p.reason for p in verify(zarr_set).problems if p.shard is not None}
    assert reasons == {0: "unreadable", 1: "wrong_count"}, reasons  # shard 1 holds fewer: read, then counted


def test_zarr_chunk_shape_across_inner_axes_is_refused(tmp_path: Path) -> None:
    # Chunks that split the inner axis would be read as whole rows of the first column block only.
    pytest.importorskip("zarr")
    root = make_set(tmp_path, "zarr", chunk_size=256)
    path = shard_file(root, 0)
    members = zip_members(path)
    meta = json.loads(members["features/values/zarr.json"])
    rows, channels = meta["shape"]
    meta["chunk_grid"]["configuration"]["chunk_shape"] = [rows, channels // 2]
    members["features/values/zarr.json"] = json.dumps(meta).encode()
    install_shard(root, 0, zip_bytes(members))
    with pytest.raises(shardload.CorruptShardError, match=r"'features/values'.*chunks the first axis only"):
        read_everything(root)


def test_zarr_codec_outside_the_format_is_refused(zarr_set: Path) -> None:
    members = zip_members(shard_file(zarr_set, 0))
    meta = json.loads(members["label/values/zarr.json"])
    meta["codecs"].append({"name": "gzip", "configuration": {"level": 1}})
    members["label/values/zarr.json"] = json.dumps(meta).encode()
    install_shard(zarr_set, 0, zip_bytes(members))
    with pytest.raises(shardload.CorruptShardError, match=r"'label/values' uses codecs .*gzip"):
        read_everything(zarr_set)


def test_zarr_chunk_stored_larger_than_its_codec_can_make_it_is_not_read(zarr_set: Path) -> None:
    # A 248-byte chunk stored as 1 MiB: the member's size is checked before the member is read.
    members = zip_members(shard_file(zarr_set, 0))
    members["tokens/values/c/0"] = encoded_zeros(zarr_set, 248) + bytes(1 << 20)
    install_shard(zarr_set, 0, zip_bytes(members))
    codec = codec_name(zarr_set)
    with pytest.raises(
        shardload.CorruptShardError, match=rf"chunk 0 of array 'tokens/values'.*stores 10\d+ bytes, more than {codec}"
    ):
        read_everything(zarr_set)


def test_verify_decodes_every_zarr_chunk(zarr_set: Path) -> None:
    # A chunk that decodes to the wrong size passes the checksum (the manifest agrees with the file)
    # and the open-time checks (its metadata is honest); verify decodes it and reports it.
    members = zip_members(shard_file(zarr_set, 1))
    last = max((m for m in members if m.startswith("features/values/c/")), key=lambda m: int(m.split("/")[3]))
    members[last] = encode(zarr_set, bytes(7))
    install_shard(zarr_set, 1, zip_bytes(members))
    problems = [p for p in verify(zarr_set).problems if p.shard == 1]
    assert [p.reason for p in problems] == ["unreadable"], problems
    assert "features/values" in problems[0].detail and "declares 7 bytes" in problems[0].detail


# -- fuzz: damaged metadata, only ShardloadErrors ----------------------------------------------------------
def proc_status(key: str) -> int:
    """A size from ``/proc/self/status`` (``VmRSS``, ``VmHWM``), in bytes."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(key + ":"))


def reset_peak_rss() -> int:
    """Reset this process's peak-RSS mark to its current RSS (Linux), and return that RSS."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    return proc_status("VmRSS")


@contextmanager
def watchdog(seconds: int) -> Iterator[None]:
    """Fail (instead of hanging the suite) when the body runs longer than ``seconds``."""

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"no answer within {seconds} s: a hang")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def only_shardload_errors(root: Path) -> bool:
    """Open, read every sample, verify: anything but a ShardloadError (or a clean pass) fails the test.

    Returns whether the damage was found (by the loader or by verify).
    """
    with watchdog(20):
        try:
            read_everything(root)
        except shardload.ShardloadError:
            return True
        return not verify(root).ok


@st.composite
def damage(draw: st.DrawFn, metadata: Callable[[bytes], list[tuple[int, int]]], original: bytes) -> bytearray:
    """Byte flips, 8-byte words set to extreme values, or a truncation, inside the metadata regions."""
    data = bytearray(original)
    regions = metadata(original)
    for _ in range(draw(st.integers(1, 4))):
        lo, hi = draw(st.sampled_from(regions))
        pos = draw(st.integers(lo, max(lo, hi - 1)))
        kind = draw(st.sampled_from(["flip", "word", "truncate"]))
        if kind == "flip":
            data[pos] ^= draw(st.integers(1, 255))
        elif kind == "word":
            value = draw(st.sampled_from([2**31 - 1, 2**32 - 1, 2**62, -1, -(2**31), 0]))
            data[pos : pos + 8] = struct.pack("<q", value)[: len(data[pos : pos + 8])]
        else:
            del data[pos:]
            break
    return data


def arrow_metadata(data: bytes) -> list[tuple[int, int]]:
    """The footer and the metadata of both messages (everything before the first body and after the last)."""
    size = len(data)
    footer_len = struct.unpack_from("<i", data, size - 10)[0]
    return [(0, min(size, 600)), (max(0, size - 10 - footer_len), size)]


def zarr_metadata(data: bytes) -> list[tuple[int, int]]:
    """Every zarr.json member, every chunk's first 32 bytes (frame headers), and the zip's directory."""
    import io

    regions = []
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for info in zf.infolist():
            start = info.header_offset + 30 + len(info.orig_filename)
            end = start + (info.compress_size if info.filename.endswith("zarr.json") else min(32, info.compress_size))
            regions.append((info.header_offset, max(end, info.header_offset + 1)))
        regions.append((zf.start_dir, len(data)))
    return regions


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["arrow", "zarr"])
def test_fuzzed_shard_metadata_gives_only_shardload_errors(tmp_path: Path, fmt: str) -> None:
    if fmt == "zarr":
        pytest.importorskip("zarr")
    root = make_set(tmp_path, fmt, **({"chunk_size": 256} if fmt == "zarr" else {}))
    path = shard_file(root, 0)
    original = path.read_bytes()
    manifest = read_manifest(root)
    metadata = arrow_metadata if fmt == "arrow" else zarr_metadata
    base = reset_peak_rss()

    refused = []

    @settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(data=damage(metadata, original))
    def check(data: bytearray) -> None:
        write_manifest(root, manifest)
        install_shard(root, 0, bytes(data))  # the manifest agrees, so the format's checks are what is tested
        refused.append(only_shardload_errors(root))

    check()
    assert sum(refused) > len(refused) // 2, "the damage should be found most of the time"
    grown = proc_status("VmHWM") - base
    assert grown < 256 << 20, f"peak RSS grew by {grown / 2**20:.0f} MiB over the fuzz run"
