"""The versioned manifest of a shard set: schema, shard list, checksums, stats (docs/format.md).

``manifest.json`` is written last, atomically: a directory without one is never a shard set.
Everything read from it is validated before use, so a damaged or hostile manifest cannot steer
reads outside the set or cause giant allocations. A set of many shards keeps its shard list in
``shards.arrow`` (format version 3, :mod:`shardload.formats.shardtable`), named and digested here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from shardload._base.checksum import checksum_text as checksum_text  # this module's own names in 0.1.0
from shardload._base.checksum import file_checksum as file_checksum
from shardload._base.identity import SET_ID_CHARS, is_set_id
from shardload._base.output import OutputLock, atomic_file, atomic_write_text
from shardload._base.setfiles import ENV_MAX_MANIFEST_BYTES, MAX_MANIFEST_BYTES, env_limit, read_small
from shardload._base.setfiles import resolve_inside as resolve_inside  # re-exported: readers import it from here
from shardload._base.setfiles import safe_relative_path as safe_relative_path
from shardload.errors import ManifestError
from shardload.formats.shardtable import (
    SHARD_TABLE_NAME,
    NameRule,
    ShardFiles,
    ShardTable,
    check_rows,
    read_table,
    wants_table,
)
from shardload.formats.shardtable import ShardInfo as ShardInfo  # re-exported: readers import it from here
from shardload.schema.fields import Schema, schema_problems

MANIFEST_NAME = "manifest.json"
LENGTHS_NAME = "lengths.npy"
FORMAT_NAME = "shardload"
#: bump when readers of the previous version could misread a new manifest: the newest version this one reads
FORMAT_VERSION = 3
#: the version a set is written with unless it needs a newer one (readable by every shardload)
BASE_FORMAT_VERSION = 1
#: version 2 holds what a version-1 reader would misread: text fields (``str``/``bytes``) in the schema, and
#: ``parts`` (a set merged from parts, whose shards carry their part's identity)
TEXT_FORMAT_VERSION = PARTS_FORMAT_VERSION = 2
#: version 3 keeps the shard list in a shard table file (``shard_table``) instead of the manifest's ``shards``
TABLE_FORMAT_VERSION = 3
#: sanity bounds for values read from a manifest
MAX_SAMPLES = 1 << 40
MAX_SHARDS = 1 << 24
#: the bound on a shard's samples, bytes, first sample and tokens
_INT_LIMIT = MAX_SAMPLES * 4096


@dataclass(frozen=True)
class PartInfo:
    """One part of a set merged from parts (``shardload merge``): its directory and what it holds.

    Its shards are the set's ``first_shard .. first_shard + shards - 1``, each carrying the identity
    the part's own prepare gave it (``set_id``, its index and first sample inside the part).
    """

    path: str
    set_id: str
    shards: int
    samples: int
    first_shard: int
    first_sample: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Manifest:
    """Everything about a shard set except the samples themselves.

    Attributes:
        shards: shards in global sample-id order; any sequence of ``ShardInfo`` given is made a
            :class:`~shardload.formats.shardtable.ShardTable` (its columns: :attr:`table`).
        total_tokens: sum of the batching lengths.
        field_lengths: per-field lengths index files, for samples with several varying fields.
        set_id: the id every shard carries in its own metadata (:mod:`shardload._base.identity`);
            empty for sets prepared before shards carried one (not checked then). In a merged
            set, a digest of the parts' ids; each shard carries its part's (:meth:`identity_of`).
        parts: the parts of a set merged from parts, in sample-id order; else empty.
        shard_table: the shard table file (format version 3), or ``""`` when the shards are a
            JSON list in the manifest; set by :meth:`with_table_form`.
    """

    schema: Schema
    shard_format: str
    shards: Sequence[ShardInfo]
    total_samples: int
    total_tokens: int
    lengths_file: str = LENGTHS_NAME
    field_lengths: Mapping[str, str] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    stats: Mapping[str, Any] = field(default_factory=dict)
    created: str = ""
    shardload_version: str = ""
    set_id: str = ""
    parts: tuple[PartInfo, ...] = ()
    shard_table: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "shards", ShardTable.from_infos(self.shards))

    @property
    def table(self) -> ShardTable:
        """The shards as columns (``samples``, ``bytes``, ``first_sample``, ``tokens``, ``files``, ``checksums``)."""
        assert isinstance(self.shards, ShardTable)
        return self.shards

    def with_table_form(self) -> Manifest:
        """This manifest, kept with a shard table when its shards call for one (see ``wants_table``)."""
        starts, paths = [p.first_shard for p in self.parts], [p.path for p in self.parts]
        return replace(self, shard_table=SHARD_TABLE_NAME if wants_table(self.table, starts, paths) else "")

    def identity_of(self, shard: int) -> tuple[str, int, int]:
        """``(set id, shard index, first sample)`` that shard ``shard``'s own identity record must hold.

        In a set merged from parts, those inside the part the shard was written for.
        """
        info = self.shards[shard]
        for part in self.parts:
            if part.first_shard <= shard < part.first_shard + part.shards:
                return part.set_id, shard - part.first_shard, info.first_sample - part.first_sample
        return self.set_id, shard, info.first_sample

    @cached_property
    def fingerprint(self) -> str:
        """A short digest that changes whenever any shard's content changes.

        With a shard table, of the table file's sha256 and name rule; else of every shard's file,
        sample count and checksum.
        """
        h = hashlib.sha256(json.dumps(self.schema.to_json(), sort_keys=True).encode())
        if self.shard_table:
            h.update(json.dumps(self._table_json(), sort_keys=True).encode())
            h.update(json.dumps([p.path for p in self.parts]).encode())
            return h.hexdigest()[:16]
        for s in self.shards:
            h.update(f"{s.file}:{s.samples}:{s.checksum};".encode())
        return h.hexdigest()[:16]

    def _table_json(self) -> dict[str, Any]:
        """The manifest's ``shard_table`` entry: the file, its shards, size and sha256, and the name rule."""
        data, digest = self.table.ipc()
        rule = self.table.name_rule([p.first_shard for p in self.parts], [p.path for p in self.parts])
        assert rule is not None, "with_table_form sets shard_table only when the names follow a rule"
        return {
            "file": self.shard_table,
            "shards": len(self.shards),
            "bytes": len(data),
            "sha256": digest,
            "names": rule.to_json(),
        }

    @property
    def format_version(self) -> int:
        """The manifest format version this set needs: 3 with a shard table, 2 with text fields or parts, else 1."""
        if self.shard_table:
            return TABLE_FORMAT_VERSION
        if self.parts:
            return PARTS_FORMAT_VERSION
        return TEXT_FORMAT_VERSION if self.schema.has_text else BASE_FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "shardload_version": self.shardload_version,
            "created": self.created,
            "shard_format": self.shard_format,
            "schema": self.schema.to_json(),
            "total_samples": self.total_samples,
            "total_tokens": self.total_tokens,
            "lengths": {"file": self.lengths_file, "per_field": dict(self.field_lengths)},
            "stats": dict(self.stats),
            "options": dict(self.options),
            "fingerprint": self.fingerprint,
            **({"set_id": self.set_id} if self.set_id else {}),
            **({"parts": [p.to_json() for p in self.parts]} if self.parts else {}),
            **(
                {"shard_table": self._table_json()}
                if self.shard_table
                else {"shards": [s.to_json() for s in self.shards]}
            ),
        }

    @classmethod
    def from_json(cls, obj: Any, *, where: str = MANIFEST_NAME, directory: Path | None = None) -> Manifest:
        """Parse and validate the parsed ``manifest.json`` (``where`` names it in messages).

        ``directory`` is where a version-3 manifest's shard table is read from.
        """
        try:
            return _parse(obj, where, directory)
        except ManifestError:
            raise
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise ManifestError(f"{where}: malformed manifest ({type(exc).__name__}: {exc})") from None

    def write(self, directory: Path) -> Path:
        """Write the shard table (if any), then ``manifest.json``, into ``directory``, each atomically.

        The manifest goes last: until it is in place, the set is the old one (or none).
        """
        if self.shard_table:
            table = Path(directory) / self.shard_table
            with atomic_file(table) as tmp:
                tmp.write_bytes(self.table.ipc()[0])
        path = Path(directory) / MANIFEST_NAME
        atomic_write_text(path, json.dumps(self.to_json(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, directory: Path) -> Manifest:
        path = Path(directory) / MANIFEST_NAME
        hint = ""
        with contextlib.suppress(OSError, ValueError):
            failed = Path(directory) / ".prepare" / "FAILED"  # written by a run that stopped on bad input
            if OutputLock.held_by_another(Path(directory) / ".prepare.lock"):  # prepare's lock (prepare/workdir.py)
                hint = " A prepare is writing it right now: wait for it to finish."
            elif failed.is_file():
                with open(failed, encoding="utf-8", errors="replace") as fh:
                    why = " ".join(fh.read(2000).split())
                hint = (
                    f" A prepare into it stopped on bad input ({why}): fix the input, then rerun it with --resume, "
                    "or with --overwrite to start over."
                )
            elif (Path(directory) / ".prepare").exists():
                hint = " A prepare into it was interrupted: rerun it with --resume to finish it."
            elif (Path(directory) / "parts").is_dir():  # prepare --part's folder (shardload.prepare.parts)
                hint = (
                    " It holds parts (parts/) that are not merged, or a part was prepared again since the last "
                    f"merge: run `shardload merge {directory}` (again)."
                )
        missing = ManifestError(f"{directory} is not a shard set: it has no {MANIFEST_NAME}.{hint}")
        limit = env_limit(ENV_MAX_MANIFEST_BYTES, MAX_MANIFEST_BYTES)
        # Bounded and regular-files-only: a FIFO or a link to /dev/zero must not hang or fill memory.
        raw = read_small(
            path, what="the manifest", limit=limit, env=ENV_MAX_MANIFEST_BYTES, error=ManifestError, missing=missing
        )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ManifestError(f"{path}: cannot be read ({exc})") from None
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ManifestError(f"{path}: not valid JSON ({exc}); the shard set is damaged, re-run prepare") from None
        except RecursionError:
            raise ManifestError(f"{path}: JSON nested too deeply; the shard set is damaged, re-run prepare") from None
        return cls.from_json(obj, where=str(path), directory=Path(directory))


def metadata_files(manifest: Manifest) -> list[str]:
    """The set-level files a reader needs at open besides ``manifest.json``, each once, relative to the set.

    What a remote set's node cache fetches at open (``origins.arrow`` waits for the first ``origin()``).
    """
    files = [manifest.shard_table] if manifest.shard_table else []
    files.append(manifest.lengths_file)
    files += [f for f in sorted(set(manifest.field_lengths.values())) if f != manifest.lengths_file]
    return files


def _parse(obj: Any, where: str, directory: Path | None) -> Manifest:
    if not isinstance(obj, dict) or obj.get("format") != FORMAT_NAME:
        raise ManifestError(f"{where}: not a shardload manifest")
    version = obj.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ManifestError(f"{where}: invalid format_version {version!r}")
    if version > FORMAT_VERSION:
        raise ManifestError(
            f"{where}: written by a newer shardload (format version {version}; this one reads up to "
            f"{FORMAT_VERSION}). Upgrade shardload to read it."
        )
    if not isinstance(obj["schema"], dict) or not isinstance(obj["schema"].get("fields"), list):
        raise ManifestError(f"{where}: 'schema' must be an object with a list of 'fields'")
    schema = Schema.from_json(obj["schema"])
    _check_schema(schema, where)
    if schema.has_text and version < TEXT_FORMAT_VERSION:
        raise ManifestError(
            f"{where}: the schema has text fields ({', '.join(f.name for f in schema.text_fields)}), which format "
            f"version {version} cannot hold (they need version {TEXT_FORMAT_VERSION}); the manifest is damaged, "
            "re-run prepare"
        )
    raw_parts = obj.get("parts", [])
    if not isinstance(raw_parts, list) or len(raw_parts) > MAX_SHARDS:
        raise ManifestError(f"{where}: 'parts' must be a list of at most {MAX_SHARDS} entries")
    tabled = version >= TABLE_FORMAT_VERSION
    if ("shard_table" in obj) != tabled or ("shards" in obj and tabled):
        raise ManifestError(
            f"{where}: format version {version} keeps its shards in "
            f"{'a shard table file (shard_table)' if tabled else 'a shards list'}, but the manifest does not; "
            "the manifest is damaged, re-run prepare"
        )
    table = _table(obj["shard_table"], raw_parts, where, directory) if tabled else _json_shards(obj["shards"], where)
    next_id = check_rows(table, where, limit=_INT_LIMIT)
    total = _bounded_int(obj["total_samples"], f"{where}: total_samples")
    if total != next_id:
        raise ManifestError(f"{where}: total_samples is {total} but the shards hold {next_id} samples")
    lengths = obj.get("lengths", {})
    if not isinstance(lengths, dict) or not isinstance(lengths.get("per_field", {}), dict):
        raise ManifestError(f"{where}: 'lengths' must be an object with a 'per_field' object")
    per_field = {
        str(name): safe_relative_path(file, where=f"{where}: lengths of {name}")
        for name, file in lengths.get("per_field", {}).items()
    }
    _check_field_indexes(schema, per_field, where)
    parts = _parts(raw_parts, table, total, where)
    return Manifest(
        schema=schema,
        shard_format=str(obj["shard_format"]),
        shards=table,
        total_samples=total,
        total_tokens=_bounded_int(obj.get("total_tokens", 0), f"{where}: total_tokens", limit=1 << 62),
        lengths_file=safe_relative_path(lengths.get("file", LENGTHS_NAME), where=f"{where}: lengths"),
        field_lengths=per_field,
        options=dict(obj.get("options", {})),
        stats=dict(obj.get("stats", {})),
        created=str(obj.get("created", "")),
        shardload_version=str(obj.get("shardload_version", "")),
        set_id=_set_id(obj.get("set_id", ""), where),
        parts=parts,
        shard_table=str(obj["shard_table"]["file"]) if tabled else "",
    )


def _json_shards(raw_shards: Any, where: str) -> ShardTable:
    """The ``shards`` list of a manifest of version 1 or 2, each value checked (the rows: ``check_rows``)."""
    if not isinstance(raw_shards, list) or len(raw_shards) > MAX_SHARDS:
        raise ManifestError(f"{where}: 'shards' must be a list of at most {MAX_SHARDS} entries")
    shards = []
    for k, s in enumerate(raw_shards):
        if not isinstance(s, dict):
            raise ManifestError(f"{where}: shard {k} must be an object, got {type(s).__name__}")
        shards.append(
            ShardInfo(
                file=safe_relative_path(s["file"], where=f"{where}: shard {k}"),
                samples=_bounded_int(s["samples"], f"{where}: shard {k} samples"),
                bytes=_bounded_int(s["bytes"], f"{where}: shard {k} bytes"),
                checksum=str(s["checksum"]),
                first_sample=_bounded_int(s["first_sample"], f"{where}: shard {k} first_sample"),
                tokens=_bounded_int(s.get("tokens", 0), f"{where}: shard {k} tokens"),
            )
        )
    return ShardTable.from_infos(shards)


def _table(entry: Any, raw_parts: list[Any], where: str, directory: Path | None) -> ShardTable:
    """The shard table a version-3 manifest names: its entry checked, then the file read and checked.

    Names come from the rule: its longest name (in the longest part folder) is checked as a path,
    and the digits between prefix and suffix never make a ``/`` or ``..``: every name stays inside.
    """
    what = f"{where}: shard_table"
    if not isinstance(entry, dict) or not isinstance(entry.get("names"), dict):
        raise ManifestError(f"{what} must be an object with a 'names' object")
    if directory is None:
        raise ManifestError(f"{what}: the shards are in a table file; open the set's directory to read it")
    file = safe_relative_path(entry["file"], where=what)
    shards = _bounded_int(entry["shards"], f"{what} shards", limit=MAX_SHARDS)
    names = entry["names"]
    if not all(isinstance(names.get(k), str) for k in ("prefix", "suffix")):
        raise ManifestError(f"{what} names: 'prefix' and 'suffix' must be strings")
    rule = NameRule(names["suffix"], names["prefix"], max(1, _bounded_int(names["digits"], f"{what} digits", limit=12)))
    digest = entry["sha256"]
    if not isinstance(digest, str) or len(digest) != 64 or digest.strip("0123456789abcdef"):
        raise ManifestError(f"{what} sha256 must be 64 lowercase hex digits, got {str(digest)[:80]!r}")
    shaped = [p for p in raw_parts if isinstance(p, dict)]  # the others are refused by _parts
    starts = [_bounded_int(p["first_shard"], f"{where}: part first_shard", limit=MAX_SHARDS) for p in shaped]
    paths = [safe_relative_path(p["path"], where=f"{where}: part") for p in shaped]
    longest = max(paths, key=len) + "/" if paths else ""
    safe_relative_path(longest + rule.name(max(shards - 1, 0)), where=f"{what} names")
    if sorted(starts) != starts or starts[:1] not in ([], [0]):
        raise ManifestError(f"{where}: the parts' first_shard must rise from 0; the manifest is damaged")
    path = resolve_inside(directory, file, what="the shard table")
    size = _bounded_int(entry["bytes"], f"{what} bytes")
    return read_table(path, shards=shards, size=size, sha256=digest, files=ShardFiles(rule, shards, starts, paths))


def _parts(raw: list[Any], shards: ShardTable, total: int, where: str) -> tuple[PartInfo, ...]:
    """The ``parts`` of a merged set: they must cover the shards in order, each shard inside its part's folder."""
    bounds = np.append(shards.first_sample, total)  # (S + 1,) sample offsets of the shards, checked contiguous
    named = not isinstance(shards.files, ShardFiles)  # names made by the rule are inside their part already
    parts: list[PartInfo] = []
    next_shard = next_sample = 0
    for k, p in enumerate(raw):
        if not isinstance(p, dict):
            raise ManifestError(f"{where}: part {k} must be an object, got {type(p).__name__}")
        what = f"{where}: part {k}"
        part = PartInfo(
            path=safe_relative_path(p["path"], where=what),
            set_id=_set_id(p["set_id"], what) or "",
            shards=_bounded_int(p["shards"], f"{what} shards", limit=MAX_SHARDS),
            samples=_bounded_int(p["samples"], f"{what} samples"),
            first_shard=_bounded_int(p["first_shard"], f"{what} first_shard", limit=MAX_SHARDS),
            first_sample=_bounded_int(p["first_sample"], f"{what} first_sample"),
        )
        end = next_shard + part.shards
        if (part.first_shard, part.first_sample) != (next_shard, next_sample) or end > len(shards):
            raise ManifestError(f"{what} ({part.path}) does not follow the part before it; the manifest is damaged")
        folder = part.path.rstrip("/") + "/"
        if int(bounds[end] - bounds[next_shard]) != part.samples or (
            named and any(not shards.files[k].startswith(folder) for k in range(next_shard, end))
        ):
            raise ManifestError(f"{what} ({part.path}) does not match its shards; the manifest is damaged")
        next_shard += part.shards
        next_sample += part.samples
        parts.append(part)
    if parts and next_shard != len(shards):
        raise ManifestError(
            f"{where}: the parts hold {next_shard} shards, the set {len(shards)}; the manifest is damaged"
        )
    return tuple(parts)


def _check_field_indexes(schema: Schema, per_field: Mapping[str, str], where: str) -> None:
    """Per-field indexes must be exactly those the loader reads: one per variable field when several vary.

    A manifest that lacks one (or names a field that has none) would be refused at the first shard
    by the loader but not by ``verify``: refused here, for both.
    """
    variable = [f.name for f in schema.variable_fields]
    wrong = sorted(name for name in per_field if name not in variable)
    if wrong:
        raise ManifestError(
            f"{where}: 'lengths.per_field' names {wrong}, which are not variable fields of the schema "
            f"(variable fields: {', '.join(variable) or 'none'}); the manifest is damaged, re-run prepare"
        )
    missing = [name for name in variable if name not in per_field]
    if len(variable) > 1 and missing:
        raise ManifestError(
            f"{where}: fields {missing} vary in length but 'lengths.per_field' gives no lengths index for them "
            "(a set with several variable fields has one per field); the manifest is damaged, re-run prepare"
        )


def _set_id(value: Any, where: str) -> str:
    if value == "" or is_set_id(value):
        return str(value)
    raise ManifestError(f"{where}: set_id must be {SET_ID_CHARS} lowercase hex digits, got {str(value)[:80]!r}")


def _check_schema(schema: Schema, where: str) -> None:
    """Refuse a schema the loader cannot serve (see :func:`shardload.schema.fields.schema_problems`)."""
    problems = schema_problems(schema)
    if problems:
        raise ManifestError(f"{where}: {'; '.join(problems)}. Re-run prepare to make a set this version can load.")


def _bounded_int(value: Any, what: str, limit: int = _INT_LIMIT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise ManifestError(f"{what}: expected an integer in [0, {limit}], got {value!r}")
    return value
