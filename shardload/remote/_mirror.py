"""What the node cache wrote into a remote set's mirror, and how anything else found there is told and removed.

The mirror (``<cache>/sets/<hash>/<fingerprint>/``) holds only what :mod:`shardload.remote.cache` put there:
regular files, in real directories. Its metadata (``manifest.json``, the lengths indexes, the shard table) has no
checksum in the manifest, so the cache records each file as it wrote it (``.files.json``: size, sha256, inode and
mtime) and checks that record at every open: a few ``lstat`` calls, and a hash only of a file whose ``stat``
changed. Anything else (a file truncated, rewritten or deleted, a directory or a link where a file belongs, a
file where a directory belongs) is cache damage, fetched again once. Removal never follows a link and never leaves
the mirror.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
from pathlib import Path

from shardload._base.checksum import file_checksum
from shardload._base.output import atomic_write_text
from shardload._base.setfiles import check_index_values, open_index, safe_relative_path
from shardload.errors import ManifestError, ShardSetError
from shardload.formats.manifest import MANIFEST_NAME, Manifest, metadata_files
from shardload.remote.url import join_url

__all__ = [
    "check_fetched_indexes",
    "clear_way",
    "current_mirror",
    "install_mirror",
    "shard_table_file",
    "sound",
]

#: the cache's record of the metadata files it wrote into a mirror
RECORD_NAME = ".files.json"
#: in the set's folder: the stamp of the manifest in storage, and the fingerprint of its mirror
CURRENT_NAME = "current.json"


def sound(mirror: Path, rel: str) -> bool:
    """Whether every folder on the way to ``rel`` is a real directory, and ``rel`` a regular file or absent.

    One ``lstat`` per path component: cheap enough for each shard a process acquires.
    """
    path = mirror
    parts = Path(rel).parts
    for k, part in enumerate(parts):
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return True
        except NotADirectoryError:
            return False
        if not (stat.S_ISREG(mode) if k == len(parts) - 1 else stat.S_ISDIR(mode)):
            return False
    return True


def clear_way(mirror: Path, rel: str) -> list[str]:
    """Remove, inside ``mirror``, what stands where ``rel`` or a folder on its way belongs; what was removed.

    A link or a file is unlinked (a link's target is never touched); a directory where a file belongs is removed
    with its contents, by ``shutil.rmtree``, which does not follow the links inside it. A regular file at ``rel``
    is left alone: it is what the cache wrote.
    """
    removed: list[str] = []
    path = mirror
    parts = Path(rel).parts
    for k, part in enumerate(parts):
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            break
        leaf = k == len(parts) - 1
        if stat.S_ISREG(mode) if leaf else stat.S_ISDIR(mode):
            continue
        with contextlib.suppress(FileNotFoundError):  # another process cleared it first
            if stat.S_ISDIR(mode):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        removed.append(f"{path.relative_to(mirror)} ({_kind(mode)})")
        break
    return removed


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "a file" if stat.S_ISREG(mode) else "not a regular file"


def install(source: Path, mirror: Path, rel: str) -> None:
    """Put the checked file ``source`` at ``rel`` in ``mirror``, atomically; a byte-identical file there is kept.

    Kept, not replaced: a process that has it mapped sees no change (its stamp is checked by path).
    """
    dest = mirror / rel
    clear_way(mirror, rel)
    with contextlib.suppress(OSError):
        if stat.S_ISREG(os.lstat(dest).st_mode) and file_checksum(dest) == file_checksum(source):
            source.unlink()
            return
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(source, dest)


def current_mirror(set_dir: Path, stamp: str, *, full: bool = False) -> tuple[Path | None, Manifest | None, str]:
    """The mirror fetched from a manifest with this ``stamp`` and its manifest, if complete and as the cache wrote it.

    Else ``None``, and what is damaged (``""``: no such mirror yet). The mirror must be the one ``current.json``
    names, its record intact (:func:`record_problem`), and its manifest the one of that fingerprint.
    """
    try:
        known = json.loads((set_dir / CURRENT_NAME).read_text())
    except (OSError, ValueError):
        return None, None, ""
    if not isinstance(known, dict) or known.get("stamp") != stamp:
        return None, None, ""
    fingerprint = str(known.get("fingerprint"))
    mirror = set_dir / fingerprint
    try:
        damage = record_problem(mirror, fingerprint, full=full)
        if damage is None:
            manifest = Manifest.load(mirror)
            if manifest.fingerprint == fingerprint:
                return mirror, manifest, ""
            damage = f"{MANIFEST_NAME} is another set's (fingerprint {manifest.fingerprint}, not {fingerprint})"
    except FileNotFoundError:  # no record: not complete, or written by an older shardload
        return None, None, ""
    except ShardSetError as exc:
        damage = str(exc)
    return None, None, damage


def install_mirror(set_dir: Path, incoming: Path, manifest: Manifest, stamp: str) -> Path:
    """Install the checked metadata in ``incoming`` as the mirror of ``manifest``, then make it current."""
    files = [*metadata_files(manifest), MANIFEST_NAME]  # the manifest last
    mirror = set_dir / manifest.fingerprint
    clear_way(set_dir, f"{manifest.fingerprint}/{MANIFEST_NAME}")  # a file or a link where the mirror belongs
    mirror.mkdir(exist_ok=True)
    for rel in files:
        install(incoming / rel, mirror, rel)
    write_record(mirror, manifest.fingerprint, files)
    atomic_write_text(set_dir / CURRENT_NAME, json.dumps({"stamp": stamp, "fingerprint": manifest.fingerprint}))
    return mirror


def write_record(mirror: Path, fingerprint: str, files: list[str]) -> None:
    """Record ``files`` of ``mirror`` as the cache wrote them (after they are in place)."""
    entries = {}
    for rel in files:
        st = os.lstat(mirror / rel)
        entries[rel] = [st.st_size, file_checksum(mirror / rel), st.st_ino, st.st_mtime_ns]
    atomic_write_text(mirror / RECORD_NAME, json.dumps({"fingerprint": fingerprint, "files": entries}))


def record_problem(mirror: Path, fingerprint: str, *, full: bool = False) -> str | None:
    """What is wrong with ``mirror``'s metadata against the cache's record; ``None``: as written.

    Raises:
        FileNotFoundError: there is no record (a mirror not complete, or written by an older shardload).
    """
    try:
        record = json.loads((mirror / RECORD_NAME).read_text())
        files = record["files"]
        assert isinstance(files, dict) and MANIFEST_NAME in files
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        return f"the cache's own record of it, {RECORD_NAME}, is unreadable"
    if record.get("fingerprint") != fingerprint:
        return f"{RECORD_NAME} is of the set with fingerprint {record.get('fingerprint')}, not {fingerprint}"
    for rel, (size, digest, ino, mtime) in files.items():
        try:
            st = os.lstat(mirror / rel)
        except OSError:
            return f"{rel} is missing"
        if not stat.S_ISREG(st.st_mode):
            return f"{rel} is {_kind(st.st_mode)}, not the file the cache wrote"
        if st.st_size != size:
            return f"{rel} has {st.st_size} bytes, the cache wrote {size}"
        if (full or (st.st_ino, st.st_mtime_ns) != (ino, mtime)) and file_checksum(mirror / rel) != digest:
            return f"{rel} is not the file the cache wrote (its sha256 differs)"
    return None


def check_fetched_indexes(incoming: Path, manifest: Manifest, url: str) -> None:
    """The lengths indexes just downloaded into ``incoming``, checked as a reader checks them, before they are used.

    A fresh download that fails is the stored object's fault, named by its URL.

    Raises:
        ManifestError: naming the object's URL and what to do.
    """
    for rel in metadata_files(manifest):
        if rel == manifest.shard_table:
            continue  # checked by its sha256 when the manifest was loaded
        path = incoming / rel
        try:
            index = open_index(path, what="the lengths index", samples=manifest.total_samples, error=ManifestError)
            total = manifest.total_tokens if rel == manifest.lengths_file else None
            check_index_values(index, path, what="the lengths index", total=total, error=ManifestError)
        except ShardSetError as exc:
            why = str(exc).replace(f" ({path})", "").replace(f"{path}: ", "").replace("; re-run prepare", "")
            raise ManifestError(
                f"{join_url(url, rel)}: {why}. The object in storage is damaged (a fresh download): upload the set "
                "again (shardload upload SET URL --force, or prepare -o URL --overwrite)."
            ) from None


def shard_table_file(raw: bytes, where: str) -> str:
    """The shard table file a manifest names (format version 3), checked to stay inside the set; "" if none.

    Raises:
        ManifestError: the manifest is not JSON, or names a table outside the set.
    """
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        raise ManifestError(f"{where}: not valid JSON; the remote set is damaged, re-run prepare") from None
    entry = obj.get("shard_table") if isinstance(obj, dict) else None
    if not isinstance(entry, dict) or "file" not in entry:
        return ""
    return safe_relative_path(entry["file"], where=f"{where}: shard_table")
