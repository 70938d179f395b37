"""Shards, indexes and manifests are the bytes the release before the faster ingest made.

The digests below were made by the code of that release (commit e0d0d6f), by running this file as a
script: ``PYTHONPATH=<a checkout of it>:tests/prepare python tests/prepare/test_same_bytes.py``.
They cover the paths a change of speed could move: JSON Lines blocks (with and without the
``fast-json`` extra), Parquet batches and ``.npy`` files; 1 and 2 workers; a run killed while staging
and resumed, on the same boot and on another one (the staged chunks then staged again). The manifest's
``created`` (the clock) is left out; everything else of every file counts. A new pyarrow that writes
Arrow IPC otherwise would move all of them at once: make them again from that release, as above.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

import shardload

REPO = Path(__file__).resolve().parents[2]
KINDS = ("jsonl", "parquet", "npy")
#: what each kind is prepared with: several units and several shards, so that workers share the work
OPTIONS: dict[str, dict[str, Any]] = {
    "jsonl": {"unit_bytes": 150_000, "num_shards": 3, "chunk_bytes": 100_000},
    "parquet": {"unit_bytes": 50_000, "num_shards": 3, "chunk_bytes": 100_000},
    "npy": {"field": "tokens", "num_shards": 2, "chunk_bytes": 50_000},
}

#: kind -> sha256 of the set's files (see set_digest), as made by the release before
GOLDEN = {
    "jsonl": "ae5953ef7dad7f3401409ef05b580d47beb7808f18167e883f65d9a52a771680",
    "parquet": "e1b731a21ba759c23494d986ab704502f49e9898e1899475eff183352d8a75a8",
    "npy": "87f79b8d1a6621e59d0395f9f677e8d7b9cade3fbd3546d42686aff693ec44ae",
}


def make_sources(root: Path) -> dict[str, str]:
    """Token lists of lognormal lengths as one JSON Lines file, one Parquet file and a folder of ``.npy`` files,
    by their names in ``root`` (sets record their sources' paths: they are prepared from ``root``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(29)
    lengths = np.clip(rng.lognormal(4.0, 1.0, size=1_500).astype(np.int64), 0, 3_000)
    values = rng.integers(-(2**40), 2**40, size=int(lengths.sum()), dtype=np.int64)
    rows = np.split(values, np.cumsum(lengths)[:-1])
    root.mkdir(parents=True, exist_ok=True)
    jsonl = root / "tokens.jsonl"
    with open(jsonl, "w") as fh:
        for i, row in enumerate(rows):
            fh.write(json.dumps({"tokens": row.tolist(), "label": i % 7}) + "\n")
            if i % 100 == 99:
                fh.write("\n")  # blank lines count in the line numbers, not as samples
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values.astype(np.int32)))
    parquet = root / "tokens.parquet"
    pq.write_table(pa.table({"tokens": tokens}), parquet, row_group_size=200)
    npy = root / "npy"
    npy.mkdir(exist_ok=True)
    for i, row in enumerate(rows[:300]):
        np.save(npy / f"s{i:05d}.npy", row.astype(np.int16))
    return {"jsonl": jsonl.name, "parquet": parquet.name, "npy": npy.name}


def set_digest(out: Path) -> tuple[str, list[str]]:
    """One sha256 of every file of the set at ``out`` (the manifest without ``created``), and the list it hashes."""
    listing = []
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.name == "manifest.json":
            manifest = json.loads(data)
            manifest.pop("created")
            data = json.dumps(manifest, sort_keys=True).encode()
        listing.append(f"{path.relative_to(out).as_posix()} {hashlib.sha256(data).hexdigest()}")
    return hashlib.sha256("\n".join(listing).encode()).hexdigest(), listing


def prepare_killed(src: str, out: Path, kind: str, point: str) -> int:
    """Prepare ``src`` in a child process (in this directory) that SIGKILLs itself at crash point ``point``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path]), "SHARDLOAD_KILL_AT": point}
    script = (
        "import json, sys, shardload; "
        "shardload.prepare(sys.argv[1], sys.argv[2], progress=False, workers=1, **json.loads(sys.argv[3]))"
    )
    args = [sys.executable, "-c", script, str(src), str(out), json.dumps(OPTIONS[kind])]
    return subprocess.run(args, env=env, timeout=300).returncode


def _spy(parse: Any, parsed: list[bool]) -> Any:
    def spied(*args: Any) -> Any:
        result = parse(*args)
        parsed.append(result is not None)
        return result

    return spied


def test_sets_are_the_bytes_of_the_release_before(tmp_path: Path, monkeypatch: Any) -> None:
    from shardload.prepare import bootmark
    from shardload.prepare.sources.jsonl import _simd

    sources = make_sources(tmp_path / "src")
    monkeypatch.chdir(tmp_path / "src")
    for kind in KINDS:
        runs = [("workers=1", 1, False), ("workers=2", 2, False)]
        if kind == "jsonl" and _simd.available():
            runs.append(("workers=2, simdjson absent", 2, True))
        for name, workers, no_simd in runs:
            out = tmp_path / f"{kind}-{workers}-{no_simd}"
            parsed: list[bool] = []
            with monkeypatch.context() as m:
                if no_simd:
                    m.setattr(_simd, "_simdjson", None)
                m.setattr(_simd, "parse_block", _spy(_simd.parse_block, parsed))
                shardload.prepare(sources[kind], out, progress=False, workers=workers, **OPTIONS[kind])
            if kind == "jsonl" and workers == 1 and _simd.available():  # (with 2, blocks are parsed in the workers)
                assert any(parsed), "simdjson parsed no block"
            digest, listing = set_digest(out)
            assert digest == GOLDEN[kind], f"{kind}, {name}: the set's files differ from before:\n" + "\n".join(listing)
        # Killed while staging, then resumed: on this boot (the staged chunks kept), and on another one.
        for boot in ("same boot", "another boot"):
            out = tmp_path / f"{kind}-killed-{boot.replace(' ', '-')}"
            assert prepare_killed(sources[kind], out, kind, "staged:1") == -signal.SIGKILL
            staged = sorted(p.name for p in (out / ".prepare" / "staging").glob("*.arrow"))
            assert staged, "the kill came before any chunk was staged"
            with monkeypatch.context() as m:
                if boot == "another boot":
                    m.setattr(bootmark, "boot_id", lambda: "another-boot")
                shardload.prepare(sources[kind], out, progress=False, workers=2, resume=True, **OPTIONS[kind])
            digest, listing = set_digest(out)
            assert digest == GOLDEN[kind], f"{kind}, resumed on {boot}: the set's files differ:\n" + "\n".join(listing)


if __name__ == "__main__":  # the digests of the shardload on sys.path (see the module's docstring)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        made = make_sources(Path(tmp) / "src")
        os.chdir(Path(tmp) / "src")
        for kind in KINDS:
            shardload.prepare(made[kind], Path(tmp) / kind, progress=False, workers=1, **OPTIONS[kind])
            print(f'    "{kind}": "{set_digest(Path(tmp) / kind)[0]}",')
