"""Source readers for ``prepare``: find input files, split them into units, read samples.

Each kind (``npy``, ``npz``, ``parquet``, ``arrow``, ``jsonl``, ``webdataset``) registers its reader in
:data:`READERS`, and is detected by its file suffixes unless ``--source-format`` names it. The kinds, and
how each one's values become fields: docs/format.md, "Input sources"; which files are read:
docs/cli.md, "shardload prepare".
"""

from __future__ import annotations

import glob
import itertools
import logging
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import TYPE_CHECKING

from shardload._base.messages import format_bytes
from shardload.errors import InputError
from shardload.formats.manifest import MANIFEST_NAME
from shardload.prepare.sources import columnar as _columnar  # noqa: F401  (registers parquet, arrow)
from shardload.prepare.sources import jsonl as _jsonl  # noqa: F401  (registers the reader)
from shardload.prepare.sources import npy as _npy  # noqa: F401  (registers the reader)
from shardload.prepare.sources import npz as _npz  # noqa: F401  (registers the reader)
from shardload.prepare.sources import webdataset as _webdataset  # noqa: F401  (registers the reader)
from shardload.prepare.sources.base import (
    DEFAULT_UNIT_BYTES,
    MAX_UNITS_PER_FILE,
    READERS,
    Sample,
    SampleBatch,
    SourceOptions,
    SourceReader,
    SourceUnit,
    check_input_file,
)
from shardload.schema.fields import Schema

logger = logging.getLogger("shardload.prepare")

__all__ = [
    "MAX_UNITS_PER_FILE",
    "READERS",
    "Sample",
    "SampleBatch",
    "SourceOptions",
    "SourceReader",
    "SourceUnit",
    "discover",
    "not_data",
    "read_unit",
    "read_unit_batches",
]


def expand_braces(pattern: str) -> list[str]:
    """Expand ``data-{000..099}.tar`` and ``{a,b}`` patterns (WebDataset style)."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    head, body, tail = pattern[: m.start()], m.group(1), pattern[m.end() :]
    rng = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if rng:
        lo, hi = rng.group(1), rng.group(2)
        width = len(lo) if lo.startswith("0") else 0
        items = [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
    else:
        items = body.split(",")
    return [out for item in items for out in expand_braces(head + item + tail)]


def _detect(path: str) -> str | None:
    low = path.lower()
    for kind, reader in READERS.items():
        if any(low.endswith(s) for s in reader.suffixes):
            return kind
    return None


#: what ``shardload export`` writes beside its tars (schema, tars, counts, checksums)
EXPORT_INDEX_NAME = "_shardload_export.json"
#: file names that are never data: markers that Spark, Hadoop and Parquet tools write next to the data, and
#: the index of an export (so that ``prepare EXPORT_DIR`` reads the exported tars)
MARKER_FILES = frozenset({"_SUCCESS", "_metadata", "_common_metadata", EXPORT_INDEX_NAME})


def not_data(path: Path, root: Path) -> str | None:
    """Why a file found under directory ``root`` is certainly not data, or None if it may be.

    Only hidden entries (the file or a directory on the way), :data:`MARKER_FILES` and ``.crc`` files
    are skipped; anything else is read or refused by name: a skipped data file would be lost without a word.
    """
    parts = path.relative_to(root).parts
    if any(p.startswith(".") for p in parts):
        return "hidden"
    if path.name in MARKER_FILES:
        return "marker"
    if path.name.lower().endswith(".crc"):
        return "checksum"
    return None


#: what each reason of :func:`not_data` (and ``output``) means, for messages
SKIP_REASONS = {
    "hidden": "hidden (name starts with '.')",
    "marker": f"marker files ({', '.join(sorted(MARKER_FILES))})",
    "checksum": "checksum files (.crc)",
    "output": "files of the output directory (the shard set this run replaces)",
}

#: (st_dev, st_ino): what tells two paths to one file or directory apart
FileKey = tuple[int, int]


@dataclass
class _Listing:
    """The state of one :func:`discover` call: what was skipped, what was seen, where the output is."""

    skipped: dict[str, list[str]]
    #: the real path of the output directory, when it exists: never a source of its own run
    output: str | None = None
    #: every file listed so far, by identity: a file read twice would double its samples
    files: dict[FileKey, str] = dc_field(default_factory=dict)

    def skip(self, reason: str, path: str) -> None:
        self.skipped.setdefault(reason, []).append(path)

    def in_output(self, path: str) -> bool:
        """Whether ``path`` (a file, or a directory) is the output directory or lies inside it."""
        if self.output is None:
            return False
        real = os.path.realpath(path)
        return real == self.output or real.startswith(self.output.rstrip(os.sep) + os.sep)

    def see(self, path: str) -> None:
        """Refuse a file listed a second time (named twice, or reached again through a link)."""
        key = _key(os.stat(path))
        first = self.files.get(key)
        if first is not None:
            same = "named twice" if os.path.abspath(first) == os.path.abspath(path) else "reached again through a link"
            raise InputError(
                f"{path}: is the same file as {first} ({same}), so its samples would be read twice. Name each "
                "file once."
            )
        self.files[key] = path


def _key(st: os.stat_result) -> FileKey:
    return (st.st_dev, st.st_ino)


def _count_files(top: str, reason: str, listing: _Listing) -> None:
    """Skip every file under ``top`` for ``reason`` (symbolic links to folders are not followed: no loop)."""
    for dirpath, _dirs, names in os.walk(top):
        for name in sorted(names):
            listing.skip(reason, os.path.join(dirpath, name))


def _walk(root: Path, listing: _Listing, collect: bool = True) -> list[str]:
    """Every file under directory ``root`` in sorted order, following symbolic links to folders.

    Hidden folders and the output directory are only entered to count their files.

    Raises:
        InputError: a link loop, or a second path to a folder already listed (its files would be read twice).
    """
    found: list[str] = []
    seen: dict[FileKey, str] = {}
    top = os.path.realpath(root)

    def visit(d: str, up: tuple[FileKey, ...]) -> None:
        if up and os.path.islink(d):
            target = os.path.realpath(d)
            if top == target or top.startswith(target.rstrip(os.sep) + os.sep):  # e.g. a link to '..' or '/'
                raise InputError(
                    f"{d}: a symbolic link loop: it leads to {target}, which holds {root}, so listing it would "
                    "never end. Remove the link, or name the folders to read instead of their parent."
                )
        key = _key(os.stat(d))
        if key in up:
            raise InputError(
                f"{d}: a symbolic link loop: it leads back to {seen[key]}, a folder that holds it, so listing it "
                "would never end. Remove the link, or name the folders to read instead of their parent."
            )
        if key in seen:
            raise InputError(
                f"{d}: leads to the folder {seen[key]} a second time (through a symbolic link), so its files would "
                "be read twice. Remove one of the two paths, or name the folders to read instead of their parent."
            )
        seen[key] = d
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError as exc:
            raise InputError(f"{d}: cannot list the folder ({exc.strerror or exc})") from None
        for e in entries:
            path = os.path.join(d, e.name)
            try:
                is_dir = e.is_dir()  # follows links: a linked folder is listed like any other
            except OSError:
                is_dir = False  # a link loop or an unreadable entry: listed, and refused by name when checked
            hidden = e.name.startswith(".")
            if is_dir and (hidden or listing.in_output(path)):
                if not (hidden and e.is_symlink()):
                    _count_files(path, "hidden" if hidden else "output", listing)
            elif is_dir:
                visit(path, (*up, key))
            elif hidden:
                listing.skip("hidden", path)
            elif collect:
                reason = not_data(Path(path), Path(d))
                if reason is None:
                    found.append(path)
                else:
                    listing.skip(reason, path)

    try:
        visit(str(root), ())
    except RecursionError:
        raise InputError(f"{root}: folders nested too deeply to list (hundreds of levels)") from None
    return found


def _glob_root(pattern: str) -> str:
    """The folder a recursive glob starts from: its longest leading part without wildcards."""
    parts = Path(pattern).parts
    head = list(itertools.takewhile(lambda p: not glob.has_magic(p), parts))
    return str(Path(*head)) if head else "."


def _list_files(source: str, listing: _Listing) -> list[str]:
    if source == "":
        raise InputError("an empty source name ('') was given; name a file, directory or glob")
    files: list[str] = []
    for pattern in expand_braces(str(source)):
        p = Path(pattern)
        if p.is_dir():
            if listing.in_output(pattern):
                raise InputError(
                    f"{p}: this source is the output directory or lies inside it; prepare would read the set it "
                    "replaces. Write the shard set somewhere else."
                )
            if (p / MANIFEST_NAME).is_file():
                raise InputError(
                    f"{p}: is already a shard set (it holds {MANIFEST_NAME}), not input for prepare. Load it as it "
                    f"is: shardload.open({str(p)!r}). To lay it out again (another shard size, format or options), "
                    f"prepare its source files again, or run `shardload export {p} DEST` and prepare DEST's tars."
                )
            before = sum(map(len, listing.skipped.values()))
            found = _walk(p, listing)
            if not found:
                note = _skipped_note(listing.skipped) if sum(map(len, listing.skipped.values())) > before else ""
                raise InputError(f"{p}: the directory holds no data files{note}")
            files.extend(found)
        elif glob.has_magic(pattern):
            if "**" in pattern and Path(_glob_root(pattern)).is_dir():
                # Python's glob follows linked folders without noticing a loop (it would list the same files
                # dozens of times): check the tree first, which refuses loops and folders reached twice.
                _walk(Path(_glob_root(pattern)), _Listing({}, listing.output), collect=False)
            found = []
            for name in sorted(glob.glob(pattern, recursive=True)):
                # A glob names hidden files only when asked to; markers match `data/*` though.
                reason = None if Path(name).name.startswith(".") else not_data(Path(name), Path(name).parent)
                if reason is None and listing.in_output(name):
                    reason = "output"
                if reason is None:
                    found.append(name)
                else:
                    listing.skip(reason, name)
            if not found:
                raise InputError(f"{pattern}: the pattern matches no data file{_skipped_note(listing.skipped)}")
            files.extend(found)
        elif p.exists() or p.is_symlink():  # not only regular files: discover() says what else it is
            if listing.in_output(pattern) and not p.is_dir():
                raise InputError(
                    f"{p}: this source lies inside the output directory; prepare would read the set it replaces. "
                    "Move the file out, or write the shard set somewhere else."
                )
            files.append(str(p))
        else:
            raise InputError(f"{pattern}: no such file or directory")
    return files


def _skipped_note(skipped: dict[str, list[str]]) -> str:
    if not skipped:
        return ""
    return " (skipped, as not data: " + "; ".join(f"{len(v)} {SKIP_REASONS[k]}" for k, v in skipped.items()) + ")"


def discover(
    sources: Sequence[str | os.PathLike[str]],
    *,
    source_format: str | None = None,
    options: SourceOptions | None = None,
    skipped: dict[str, list[str]] | None = None,
    output: str | os.PathLike[str] | None = None,
) -> list[SourceUnit]:
    """Find the input files of ``sources`` (files, directories, globs, brace patterns) and group them into units.

    ``skipped`` is filled with the files left out as not data, by reason (:func:`not_data`; ``output``).
    A directory or glob that covers ``output`` (the run's output directory) leaves it out; a source
    that is, or lies inside, it is refused.

    Raises:
        InputError: a path that does not exist or is not a regular file (a FIFO, a device, a broken link),
            an empty name, a pattern that matches nothing, a file of no known kind, an unknown
            ``source_format``, the same file twice, a symbolic link loop, or a folder reached twice.
    """
    options = options or SourceOptions()
    if source_format is not None and source_format not in READERS:
        raise InputError(f"unknown --source-format {source_format!r}; choose one of {', '.join(sorted(READERS))}")
    if not sources:
        raise InputError("no source given: name at least one file, directory or glob")
    listing = _Listing(skipped if skipped is not None else {})
    if output is not None and os.path.isdir(output):
        listing.output = os.path.realpath(output)
    by_kind: list[tuple[str, list[str]]] = []
    for source in sources:
        for f in _list_files(os.fspath(source), listing):
            check_input_file(f)
            listing.see(f)
            kind = source_format or _detect(f)
            if kind is None:
                known = sorted(s for r in READERS.values() for s in r.suffixes)
                raise InputError(
                    f"{f}: cannot tell the source format from the name (known: {', '.join(known)}); "
                    "pass --source-format"
                )
            if by_kind and by_kind[-1][0] == kind:
                by_kind[-1][1].append(f)
            else:
                by_kind.append((kind, [f]))
    units: list[SourceUnit] = []
    for kind, files in by_kind:
        units.extend(READERS[kind].make_units(files, options))
    _warn_of_raised_units(units, options)
    return units


def _warn_of_raised_units(units: Sequence[SourceUnit], options: SourceOptions) -> None:
    """One warning when a unit size chosen below the default was raised for some file (:data:`MAX_UNITS_PER_FILE`).

    The default itself is raised quietly on files over 4 GiB: nobody asked for 16 MiB units there.
    """
    if options.unit_bytes >= DEFAULT_UNIT_BYTES:
        return
    sizes: dict[str, int] = {}
    for unit in units:
        if unit.part is not None:
            sizes[unit.paths[0]] = sizes.get(unit.paths[0], 0) + unit.nbytes
    raised = {path: options.unit_bytes_for(size) for path, size in sizes.items()}
    raised = {path: bytes_ for path, bytes_ in raised.items() if bytes_ > options.unit_bytes}
    if not raised:
        return
    path, raised_unit = next(iter(raised.items()))
    more = f" (and {len(raised) - 1} more files)" if len(raised) > 1 else ""
    logger.warning(
        "%s%s: --unit-size %s would cut this %s file into up to %s units; a file is cut into at most %d units (each costs "
        "a few milliseconds to hand out, stage and record), so its units are about %s instead. Pass --unit-size "
        "%d or more to not see this.",
        path,
        more,
        format_bytes(options.unit_bytes),
        format_bytes(sizes[path]),
        f"{sizes[path] // options.unit_bytes:,}",
        MAX_UNITS_PER_FILE,
        format_bytes(raised_unit),
        max(raised.values()),
    )


def read_unit(unit: SourceUnit, options: SourceOptions) -> Iterator[tuple[str, Sample]]:
    """Yield ``(locator, sample)`` for every sample of ``unit``, with only the fields ``options`` selects."""
    reader = READERS[unit.kind]
    if reader.selects_fields:
        yield from reader.read(unit, options)
        return
    for where, sample in reader.read(unit, options):
        yield where, options.selected(sample, where)


def read_unit_batches(unit: SourceUnit, options: SourceOptions, schema: Schema) -> Iterator[SampleBatch] | None:
    """The samples of ``unit`` as column batches, or None if it is read per sample (always, with a field
    choice, for a kind that does not select fields itself)."""
    reader = READERS[unit.kind]
    if not reader.selects_fields and (options.fields is not None or options.drop_fields):
        return None
    return reader.read_batches(unit, options, schema)


if not TYPE_CHECKING:  # hidden from type checkers, which would take any attribute as this one's

    def __getattr__(name: str) -> object:
        """A submodule of 0.1.0 that moved (``shardload.prepare.sources.jsonblocks``), as before an attribute of this package."""
        from shardload._compat import moved_attribute

        return moved_attribute(__name__, name)
