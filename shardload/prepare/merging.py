"""Merge the parts of a prepare run into one shard set, without copying a shard.

After ``prepare --part K/N`` has written every part under ``OUT/parts/``, :func:`merge` writes
into ``OUT`` only what one set needs beyond the parts' shards (docs/format.md, "Sets merged from
parts"): sample ids follow part order; the manifest goes last, so a stopped merge is simply run
again, and a merge run again writes the same bytes. Every part must be committed, from the same
run and with the same schema and options; otherwise :class:`~shardload.errors.MergeError` names
the part, and nothing in ``OUT`` is changed.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from shardload._base.output import OutputLock, atomic_file, withdraw_index
from shardload._base.setfiles import open_index
from shardload.errors import MergeError, ShardloadError, ShardSetError
from shardload.formats.manifest import MANIFEST_NAME, Manifest, PartInfo
from shardload.formats.origin import ORIGINS_NAME, read_origins, write_merged_origins
from shardload.formats.shardtable import ShardTable
from shardload.prepare.index import length_stats
from shardload.prepare.parts import PART_NAME, PARTS_DIR, part_name
from shardload.prepare.remote import refuse_remote_parts
from shardload.prepare.workdir import LOCK, WORK, recorded_failure
from shardload.remote.url import is_remote, local_path

__all__ = ["MergeResult", "merge"]

#: options a part records for itself alone: not compared between parts, left out of the merged manifest
PART_ONLY_OPTIONS = ("part",)


@dataclass(frozen=True)
class MergeResult:
    """What :func:`merge` made (also ``shardload merge --json``).

    Attributes:
        path: the merged set.
        parts: how many parts it holds.
        shards: shards in all.
        samples: samples in all.
        tokens: the sum of the batching lengths.
        changed: False when ``OUT`` already was this merged set (nothing written).
        seconds: wall time.
    """

    path: str
    parts: int
    shards: int
    samples: int
    tokens: int
    changed: bool
    seconds: float

    def to_json(self) -> dict[str, Any]:
        """The result as a plain dict (what ``shardload merge --json`` prints)."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class _Part:
    name: str
    path: Path
    manifest: Manifest


def merge(out: str | os.PathLike[str]) -> MergeResult:
    """Make ``out`` one shard set from the parts in ``out/parts/`` (see the module docstring).

    Raises:
        MergeError: a part is missing, not committed, from another run, a copy
            of another, or differs in schema or options (naming it); or ``out``
            holds something a merge would replace (a set prepared in one run).
        OutputLockedError: a prepare or another merge is writing into ``out``.
        OutputError: ``out`` is a URL (parts are merged on a file system; see :mod:`shardload.prepare.remote`).
    """
    started = time.perf_counter()
    if is_remote(out):
        refuse_remote_parts(os.fsdecode(out))
    root = Path(local_path(out))
    if not (root / PARTS_DIR).is_dir():
        raise MergeError(
            f"{root}: has no {PARTS_DIR}/ folder, so there is nothing to merge; prepare the parts first "
            f"(`shardload prepare SRC... -o {root} --part K/N`, for each K of N)"
        )
    lock = OutputLock(root / LOCK, busy=f"{root}: a prepare or a merge is writing into it right now; wait for it")
    try:
        lock.acquire()
    except ShardloadError:
        raise
    except OSError as exc:
        raise MergeError(f"{root}: cannot write into it ({exc.strerror or exc}); fix its permissions") from None
    try:
        _check_root(root)
        parts = [_load_part(root, name, k, n) for k, n, name in _part_names(root)]
        _check_same_run(parts)
        manifest, arrays = _merged(parts)
        changed = _write(root, manifest, arrays, [p.path for p in parts])
    finally:
        lock.release()
    return MergeResult(
        path=str(root),
        parts=len(parts),
        shards=len(manifest.shards),
        samples=manifest.total_samples,
        tokens=manifest.total_tokens,
        changed=changed,
        seconds=round(time.perf_counter() - started, 3),
    )


# -- finding and checking the parts --------------------------------------------------------------------
def _check_root(root: Path) -> None:
    """Refuse an ``OUT`` whose own set a merge would replace: one prepared in one run, or a run in progress."""
    if (root / WORK).exists():
        raise MergeError(
            f"{root}: holds an unfinished prepare of its own ({WORK}/); a merged set would mix with it. Finish "
            "or remove that run, or keep the parts in a directory of their own."
        )
    if (root / MANIFEST_NAME).exists():
        try:
            current = Manifest.load(root)
        except ShardSetError:
            return  # damaged: the merge replaces it
        if not current.parts:
            raise MergeError(
                f"{root}: already holds a shard set prepared in one run; merging its parts would replace it. "
                "Remove it (its manifest.json, shards/ and lengths*.npy) or keep the parts elsewhere."
            )


def _part_names(root: Path) -> list[tuple[int, int, str]]:
    """``(K, N, folder name)`` of every part, in part order; refusing strays, duplicates and missing parts."""
    found: dict[int, list[tuple[int, str]]] = {}
    for entry in sorted(os.listdir(root / PARTS_DIR)):
        if entry.startswith("."):
            continue  # a part being written by a Ray task, or hidden files
        m = PART_NAME.fullmatch(entry)
        if m is None:
            raise MergeError(
                f"{root / PARTS_DIR / entry}: is not a part (a part's folder is named KKKKK-of-NNNNN, e.g. "
                f"{part_name(3, 8)}); remove it from {PARTS_DIR}/"
            )
        found.setdefault(int(m.group(2)), []).append((int(m.group(1)), entry))
    if not found:
        raise MergeError(f"{root / PARTS_DIR}: holds no part; prepare the parts first (--part K/N)")
    if len(found) > 1:
        n = max(found, key=lambda c: (len(found[c]), c))  # the run most parts belong to
        other = next(name for c, items in found.items() if c != n for _, name in items)
        raise MergeError(
            f"{PARTS_DIR}/{other} is a part of a run in {int(PART_NAME.fullmatch(other).group(2))} parts "  # type: ignore[union-attr]
            f"(foreign: left from another run?), the others of {n}; remove the leftovers, then merge again"
        )
    ((n, items),) = found.items()
    by_k: dict[int, list[str]] = {}
    for k, name in items:
        by_k.setdefault(k, []).append(name)
    for k, names in sorted(by_k.items()):
        if k >= n:
            raise MergeError(f"{PARTS_DIR}/{names[0]}: part {k} of {n} cannot exist (parts count from 0); remove it")
        if len(names) > 1:
            raise MergeError(f"{PARTS_DIR}: part {k}/{n} is there twice ({', '.join(names)}); keep one")
    missing = [k for k in range(n) if k not in by_k]
    if missing:
        k = missing[0]
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise MergeError(
            f"{PARTS_DIR}/{part_name(k, n)} is missing{more}: prepare it (`shardload prepare SRC... -o {root} "
            f"--part {k}/{n}`), then merge again"
        )
    return [(k, n, by_k[k][0]) for k in range(n)]


def _load_part(root: Path, name: str, k: int, n: int) -> _Part:
    path = root / PARTS_DIR / name
    where = f"{PARTS_DIR}/{name}"
    redo = f"rerun `shardload prepare SRC... -o {root} --part {k}/{n} --resume`"
    if OutputLock.held_by_another(path / LOCK):
        raise MergeError(f"{where}: is being written by a prepare right now; wait for it, then merge again")
    if not (path / MANIFEST_NAME).exists():
        failure = recorded_failure(path / WORK)
        if failure:
            raise MergeError(f"{where}: stopped on bad input ({failure}); fix the input, then {redo}, then merge again")
        what = "was interrupted (not committed)" if (path / WORK).exists() else "holds no shard set"
        raise MergeError(f"{where}: {what}; {redo} to finish it, then merge again")
    try:
        manifest = Manifest.load(path)
    except ShardSetError as exc:
        raise MergeError(f"{where}: cannot be read ({exc}); {redo.replace('--resume', '--overwrite')}") from None
    if manifest.parts:
        raise MergeError(f"{where}: is itself a merged set; a part is the output of one prepare --part")
    record = manifest.options.get("part")
    if record != [k, n]:
        held = f"part {record[0]}/{record[1]}" if isinstance(record, list) and len(record) == 2 else f"part {record!r}"
        raise MergeError(
            f"{where}: holds {'no part' if record is None else held} according to its "
            f"manifest, not part {k}/{n}: it was copied or renamed. Put the right part there "
            f"({redo.replace('--resume', '--overwrite')}: it replaces the copy)."
        )
    return _Part(name, path, manifest)


def _check_same_run(parts: Sequence[_Part]) -> None:
    """Every part must come from the one run of part 0: same run id, schema, format and options."""
    first = parts[0].manifest
    seen: dict[str, str] = {}
    for part in parts:
        m, where = part.manifest, f"{PARTS_DIR}/{part.name}"
        if m.options.get("run") != first.options.get("run"):
            raise MergeError(
                f"{where}: is from another run than {PARTS_DIR}/{parts[0].name} (other input, options or number of "
                "parts: its run id differs); prepare it again with the same command as the others, then merge"
            )
        if m.schema != first.schema or m.shard_format != first.shard_format:
            what = "schema" if m.schema != first.schema else "shard format"
            raise MergeError(
                f"{where}: its {what} differs from that of {PARTS_DIR}/{parts[0].name}; every part needs the same "
                "(prepare it again with the same options)"
            )
        mine, theirs = _common_options(m), _common_options(first)
        if mine != theirs:
            keys = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
            raise MergeError(
                f"{where}: was prepared with other options than {PARTS_DIR}/{parts[0].name} ({', '.join(keys)} "
                "differ); prepare it again with the same options"
            )
        if m.set_id and m.total_samples and m.set_id in seen:
            raise MergeError(
                f"{where}: is a copy of {PARTS_DIR}/{seen[m.set_id]} (duplicated: the same set id); prepare the "
                "right part into it"
            )
        seen.setdefault(m.set_id, part.name)


def _common_options(m: Manifest) -> dict[str, Any]:
    return {k: v for k, v in m.options.items() if k not in PART_ONLY_OPTIONS}


# -- the merged set ------------------------------------------------------------------------------------
def _merged(parts: Sequence[_Part]) -> tuple[Manifest, dict[str, NDArray[np.integer]]]:
    """The merged manifest, and the arrays of the files beside it (by file name)."""
    first = parts[0].manifest
    files: list[str] = []
    infos: list[PartInfo] = []
    sample = 0
    index_files = {"": first.lengths_file, **first.field_lengths}
    pieces: dict[str, list[NDArray[np.integer]]] = {file: [] for file in [*index_files.values(), "origin.npy"]}
    for part in parts:
        m = part.manifest
        prefix = f"{PARTS_DIR}/{part.name}/"
        infos.append(PartInfo(prefix.rstrip("/"), m.set_id, len(m.shards), m.total_samples, len(files), sample))
        files += [prefix + f for f in m.table.files]
        for key, file in index_files.items():
            own = m.lengths_file if key == "" else m.field_lengths.get(key, "")
            pieces[file].append(_index(part, own, m.total_samples))
        _check_origins(part)
        origin = _index(part, "origin.npy", m.total_samples)
        pieces["origin.npy"].append(origin.astype(np.int64) + sample)
        sample += m.total_samples
    arrays = {file: _concatenate(chunks) for file, chunks in pieces.items()}
    arrays["origin.npy"] = arrays["origin.npy"].astype(np.int64)
    lengths = arrays[first.lengths_file]
    digest = hashlib.sha256(";".join(p.set_id for p in infos).encode()).hexdigest()[:32]
    tables = [p.manifest.table for p in parts]
    shards = ShardTable(
        [
            np.concatenate([t.samples for t in tables]),
            np.concatenate([t.bytes for t in tables]),
            np.concatenate([t.first_sample + p.first_sample for t, p in zip(tables, infos, strict=True)]),
            np.concatenate([t.tokens for t in tables]),
        ],
        files=files,
        checksums=[c for t in tables for c in t.checksums],
    )
    manifest = replace(
        first,
        shards=shards,
        total_samples=sample,
        total_tokens=sum(p.manifest.total_tokens for p in parts),
        options={**_common_options(first), "parts": len(parts)},
        stats=length_stats(lengths),
        created=max(p.manifest.created for p in parts),  # the same bytes whenever the same parts are merged
        set_id=digest,
        parts=tuple(infos),
    ).with_table_form()
    if int(lengths.sum(dtype=np.int64)) != manifest.total_tokens:
        raise MergeError(
            f"the parts' lengths indexes sum to {int(lengths.sum(dtype=np.int64))} tokens, their manifests to "
            f"{manifest.total_tokens}; run `shardload verify` on each part and prepare the damaged one again"
        )
    return manifest, arrays


def _index(part: _Part, file: str, samples: int) -> NDArray[np.integer]:
    """One ``.npy`` index of a part, checked as the loader checks it (a plain 1-D integer array of ``samples``)."""
    if not file:
        raise MergeError(f"{PARTS_DIR}/{part.name}: has no lengths index for a field the others have one for")
    try:
        return open_index(part.path / file, what=f"{file} of {PARTS_DIR}/{part.name}", samples=samples)
    except ShardSetError as exc:
        raise MergeError(f"{exc}; prepare that part again (--overwrite), then merge again") from None


def _check_origins(part: _Part) -> None:
    """A part's ``origins.arrow``, if it has one, must be readable before anything of the merge is written."""
    if not (part.path / ORIGINS_NAME).is_file():
        return  # a part without origins: the merged set records none (see write_merged_origins)
    try:
        read_origins(part.path, part.manifest.total_samples)
    except ShardSetError as exc:
        raise MergeError(f"{exc} for that part (--overwrite), then merge again") from None


def _concatenate(chunks: Sequence[NDArray[np.integer]]) -> NDArray[np.integer]:
    joined = np.concatenate([np.asarray(c) for c in chunks]) if chunks else np.zeros(0, dtype=np.int64)
    top = int(joined.max(initial=0))
    return joined.astype(np.int32 if top < 2**31 else np.int64, copy=False)


def _write(root: Path, manifest: Manifest, arrays: dict[str, NDArray[np.integer]], parts: Sequence[Path]) -> bool:
    """Write the index files and origins, then the manifest; nothing when ``root`` already holds exactly this set."""
    try:
        current: Manifest | None = Manifest.load(root)
    except ShardSetError:
        current = None
    if current is not None and _same(current, manifest) and all((root / f).is_file() for f in arrays):
        return False
    withdraw_index(root / MANIFEST_NAME)  # the old merged set (if any) is no set from here on
    for file, arr in arrays.items():
        path = root / file
        with atomic_file(path, tmp=path.with_name(f".{file}.tmp")) as tmp, open(tmp, "wb") as fh:
            np.save(fh, arr, allow_pickle=False)
    write_merged_origins(root, parts)
    manifest.write(root)  # last, atomically: from here OUT is the merged set
    return True


def _same(a: Manifest, b: Manifest) -> bool:
    return a.to_json() == b.to_json()
