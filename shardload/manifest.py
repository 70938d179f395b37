"""The versioned manifest of a shard set: schema, shard list, checksums, stats.

``manifest.json`` is written last, atomically, by ``prepare``: a directory
without one is never a shard set. Everything read from it is validated before
use, so a damaged or hostile manifest cannot steer reads outside the shard set
or cause giant allocations.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from shardload.errors import ManifestError, ShardSetError
from shardload.identity import SET_ID_CHARS, is_set_id
from shardload.messages import one_line
from shardload.output import atomic_write_text
from shardload.schema import Schema, schema_problems
from shardload.setfiles import ENV_MAX_MANIFEST_BYTES, MAX_MANIFEST_BYTES, env_limit, read_small, tagged

MANIFEST_NAME = "manifest.json"
LENGTHS_NAME = "lengths.npy"
FORMAT_NAME = "shardload"
#: bump when readers of the previous version could misread a new manifest: the newest version this one reads
FORMAT_VERSION = 2
#: the version a set is written with unless it needs a newer one (readable by every shardload)
BASE_FORMAT_VERSION = 1
#: version 2 holds what a version-1 reader would misread: text fields (``str``/``bytes``) in the schema, and
#: ``parts`` (a set merged from parts, whose shards carry their part's identity)
TEXT_FORMAT_VERSION = PARTS_FORMAT_VERSION = 2
#: sanity bounds for values read from a manifest
MAX_SAMPLES = 1 << 40
MAX_SHARDS = 1 << 24
#: bounds on a file name in the manifest (bytes): of one path component, and of the whole relative path
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 1024


@dataclass(frozen=True)
class ShardInfo:
    """One shard of a set: its file (relative to the set) and what it must contain."""

    file: str
    samples: int
    bytes: int
    checksum: str
    first_sample: int
    tokens: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)  # the manifest's keys, in field order


@dataclass(frozen=True)
class PartInfo:
    """One part of a set merged from parts (``shardload merge``): its directory and what it holds.

    The part's shards are the set's shards ``first_shard .. first_shard + shards - 1``;
    each carries the identity the part's own prepare gave it (set ``set_id``,
    its index and first sample inside the part).
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
        schema: fields of a sample.
        shard_format: registry name of the shard format (``"arrow"``).
        shards: shards in global sample-id order.
        total_samples: sum of ``shard.samples``.
        total_tokens: sum of the batching lengths.
        lengths_file: the lengths index (``.npy``, one int per sample).
        field_lengths: per-field lengths index files, for samples with several
            independently varying fields.
        options: the options prepare was run with.
        stats: summary length statistics (min, max, mean, quantiles).
        set_id: the id every shard of this set carries in its own metadata
            (see :mod:`shardload.identity`); empty for sets prepared before
            shards carried one, whose shards are then not checked. In a set
            merged from parts, a digest of the parts' ids; each shard carries
            its part's (see :meth:`identity_of`).
        parts: the parts of a set merged from parts, in sample-id order;
            empty for a set prepared in one run.
    """

    schema: Schema
    shard_format: str
    shards: tuple[ShardInfo, ...]
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

    def identity_of(self, shard: int) -> tuple[str, int, int]:
        """``(set id, shard index, first sample)`` that shard ``shard``'s own identity record must hold.

        Those of the set itself, or, in a set merged from parts, those inside
        the part the shard was written for.
        """
        info = self.shards[shard]
        for part in self.parts:
            if part.first_shard <= shard < part.first_shard + part.shards:
                return part.set_id, shard - part.first_shard, info.first_sample - part.first_sample
        return self.set_id, shard, info.first_sample

    @property
    def fingerprint(self) -> str:
        """A short digest that changes whenever any shard's content changes."""
        h = hashlib.sha256(json.dumps(self.schema.to_json(), sort_keys=True).encode())
        for s in self.shards:
            h.update(f"{s.file}:{s.samples}:{s.checksum};".encode())
        return h.hexdigest()[:16]

    @property
    def format_version(self) -> int:
        """The manifest format version this set needs: 2 with text fields or parts, else 1."""
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
            "shards": [s.to_json() for s in self.shards],
        }

    @classmethod
    def from_json(cls, obj: Any, *, where: str = MANIFEST_NAME) -> Manifest:
        """Parse and validate a manifest object."""
        try:
            return _parse(obj, where)
        except ManifestError:
            raise
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise ManifestError(f"{where}: malformed manifest ({type(exc).__name__}: {exc})") from None

    def write(self, directory: Path) -> Path:
        """Write ``manifest.json`` into ``directory`` atomically (temp file, fsync, rename)."""
        path = Path(directory) / MANIFEST_NAME
        atomic_write_text(path, json.dumps(self.to_json(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, directory: Path) -> Manifest:
        path = Path(directory) / MANIFEST_NAME
        hint = ""
        with contextlib.suppress(OSError, ValueError):
            failed = Path(directory) / ".prepare" / "FAILED"  # written by a run that stopped on bad input
            if failed.is_file():
                with open(failed, encoding="utf-8", errors="replace") as fh:
                    why = " ".join(fh.read(2000).split())
                hint = (
                    f" A prepare into it stopped on bad input ({why}): fix the input, then rerun it with --resume, "
                    "or with --overwrite to start over."
                )
            elif (Path(directory) / ".prepare").exists():
                hint = " A prepare into it was interrupted: rerun it with --resume to finish it."
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
        return cls.from_json(obj, where=str(path))


def metadata_files(manifest: Manifest) -> list[str]:
    """The set-level files a reader needs at open, besides ``manifest.json``: the lengths indexes.

    The batching index, then each per-field index (relative paths, each once). A
    remote set's node cache fetches exactly these at open (``origins.arrow`` waits
    for the first ``origin()`` call).
    """
    files = [manifest.lengths_file]
    files += [f for f in sorted(set(manifest.field_lengths.values())) if f != manifest.lengths_file]
    return files


def _parse(obj: Any, where: str) -> Manifest:
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
    raw_shards = obj["shards"]
    if not isinstance(raw_shards, list) or len(raw_shards) > MAX_SHARDS:
        raise ManifestError(f"{where}: 'shards' must be a list of at most {MAX_SHARDS} entries")
    shards = []
    next_id = 0
    for k, s in enumerate(raw_shards):
        if not isinstance(s, dict):
            raise ManifestError(f"{where}: shard {k} must be an object, got {type(s).__name__}")
        info = ShardInfo(
            file=safe_relative_path(s["file"], where=f"{where}: shard {k}"),
            samples=_bounded_int(s["samples"], f"{where}: shard {k} samples"),
            bytes=_bounded_int(s["bytes"], f"{where}: shard {k} bytes"),
            checksum=str(s["checksum"]),
            first_sample=_bounded_int(s["first_sample"], f"{where}: shard {k} first_sample"),
            tokens=_bounded_int(s.get("tokens", 0), f"{where}: shard {k} tokens"),
        )
        if info.first_sample != next_id:
            raise ManifestError(
                f"{where}: shard {k} ({info.file}) starts at sample {info.first_sample}, expected {next_id}"
            )
        next_id += info.samples
        shards.append(info)
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
    parts = _parts(obj.get("parts", []), shards, where)
    return Manifest(
        schema=schema,
        shard_format=str(obj["shard_format"]),
        shards=tuple(shards),
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
    )


def _parts(raw: Any, shards: list[ShardInfo], where: str) -> tuple[PartInfo, ...]:
    """The ``parts`` of a merged set: they must cover the shards in order, each shard inside its part's folder."""
    if not isinstance(raw, list) or len(raw) > MAX_SHARDS:
        raise ManifestError(f"{where}: 'parts' must be a list of at most {MAX_SHARDS} entries")
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
        mine = shards[next_shard : next_shard + part.shards]
        if (part.first_shard, part.first_sample) != (next_shard, next_sample) or len(mine) != part.shards:
            raise ManifestError(f"{what} ({part.path}) does not follow the part before it; the manifest is damaged")
        if sum(s.samples for s in mine) != part.samples or any(
            not s.file.startswith(part.path.rstrip("/") + "/") for s in mine
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

    With one variable field the main index is its lengths; with several, each
    one's lengths are in its own index, which the loader checks every shard's
    offsets against. A manifest that lacks one (or names a field that has none)
    would be refused at the first shard by the loader and not by ``verify``:
    refused here, for both.
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
    """Refuse a schema the loader cannot serve (see :func:`shardload.schema.schema_problems`)."""
    problems = schema_problems(schema)
    if problems:
        raise ManifestError(f"{where}: {'; '.join(problems)}. Re-run prepare to make a set this version can load.")


def _bounded_int(value: Any, what: str, limit: int = MAX_SAMPLES * 4096) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise ManifestError(f"{what}: expected an integer in [0, {limit}], got {value!r}")
    return value


def safe_relative_path(value: Any, *, where: str) -> str:
    """Accept only a relative POSIX path that stays inside the shard set."""
    if not isinstance(value, str) or not value or "\0" in value:
        raise ManifestError(f"{where}: expected a file name, got {value!r}")
    p = PurePosixPath(value)
    if p.is_absolute() or ".." in p.parts or "\\" in value or value.startswith("~"):
        raise ManifestError(f"{where}: path {value!r} points outside the shard set; refusing to read it")
    try:
        encoded = value.encode("utf-8")  # prepare writes UTF-8 names; a lone surrogate is damage
    except UnicodeEncodeError:
        raise ManifestError(f"{where}: path {value!r} is not a valid file name; refusing to read it") from None
    # prepare writes short names: a longer one is damage, better named here than as ENAMETOOLONG later
    if len(encoded) > MAX_PATH_BYTES or any(len(part.encode("utf-8")) > MAX_NAME_BYTES for part in p.parts):
        raise ManifestError(
            f"{where}: path {value[:80]!r}... is too long (at most {MAX_NAME_BYTES} bytes per name, "
            f"{MAX_PATH_BYTES} in all); the manifest is damaged, re-run prepare"
        )
    return value


def resolve_inside(root: Path, relative: str, *, what: str) -> Path:
    """``root / relative``, refusing a path that a symbolic link leads out of ``root``.

    ``relative`` has passed :func:`safe_relative_path`; this catches the other way
    out, a link (the file itself or a directory on the way) that points elsewhere.

    Raises:
        ShardSetError: naming ``what`` (e.g. ``"shard 3"``) and where the link leads.
    """
    path = root / relative
    try:
        real_root = root.resolve()
        target = path.resolve()
    except (OSError, RuntimeError, UnicodeError) as exc:  # RuntimeError: a loop of links (Python < 3.13)
        raise tagged(
            ShardSetError,
            f"{what} ({path}): its path cannot be resolved ({one_line(exc)}); fix the links on its way or move "
            "the shard set to a shorter path",
            "unreadable",
        ) from None
    if target != real_root and real_root not in target.parents:
        raise tagged(
            ShardSetError,
            f"{what} ({path}) is a symbolic link to {target}, outside the shard set {root}; refusing to read it. "
            "Copy the file into the shard set, or re-run prepare.",
            "outside_set",
        )
    return path


def file_checksum(file: Path | BinaryIO, chunk: int = 8 << 20) -> str:
    """``"sha256:<hex>"`` of a file's bytes: a path, or a file already open for reading (read to its end)."""
    if not isinstance(file, (str, os.PathLike)):
        return _sha256_of(file, chunk)
    with open(file, "rb") as fh:
        return _sha256_of(fh, chunk)


def _sha256_of(fh: BinaryIO, chunk: int) -> str:
    h = hashlib.sha256()
    while block := fh.read(chunk):
        h.update(block)
    return "sha256:" + h.hexdigest()
