"""Source readers for ``prepare``: find input files, split them into units, read samples.

Kinds and how they are detected (``--source-format`` overrides detection):

==============  =========================================  ======================================
kind            files                                      one sample is
==============  =========================================  ======================================
``npy``         ``*.npy`` (a directory or a glob)          one file (field ``--field``)
``npz``         ``*.npz``                                  one file (one field per array)
``parquet``     ``*.parquet``, ``*.pq``                    one row (one field per column)
``arrow``       ``*.arrow``, ``*.feather``, ``*.ipc``      one row (one field per column)
``jsonl``       ``*.jsonl``, ``*.ndjson`` (also ``.gz``)   one line (one field per entry)
``webdataset``  ``*.tar``, ``*.tar.gz``, ``*.tgz``, ...    the members sharing a key
==============  =========================================  ======================================

Each kind's module says how its values become fields: :mod:`.npz`, :mod:`.columnar`
(Parquet and Arrow), :mod:`.jsonl` (JSON dtypes), :mod:`.webdataset` (field naming).
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from shardload.errors import InputError
from shardload.prepare.sources import columnar as _columnar  # noqa: F401  (registers parquet, arrow)
from shardload.prepare.sources import jsonl as _jsonl  # noqa: F401  (registers the reader)
from shardload.prepare.sources import npy as _npy  # noqa: F401  (registers the reader)
from shardload.prepare.sources import npz as _npz  # noqa: F401  (registers the reader)
from shardload.prepare.sources import webdataset as _webdataset  # noqa: F401  (registers the reader)
from shardload.prepare.sources.base import (
    READERS,
    Sample,
    SourceOptions,
    SourceReader,
    SourceUnit,
    check_input_file,
)

__all__ = ["READERS", "Sample", "SourceOptions", "SourceReader", "SourceUnit", "discover", "not_data", "read_unit"]


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


#: file names that are never data: markers that Spark, Hadoop and Parquet tools write next to the data
MARKER_FILES = frozenset({"_SUCCESS", "_metadata", "_common_metadata"})


def not_data(path: Path, root: Path) -> str | None:
    """Why a file found under directory ``root`` is certainly not data, or None if it may be.

    Only hidden entries (a name starting with ``.`` for the file or a directory
    on the way, e.g. ``.git``, ``.ipynb_checkpoints``), the marker files of
    :data:`MARKER_FILES` and ``.crc`` checksum files are skipped. Anything else,
    ``_utils.npy`` or ``__init__.npy`` included, is read (or refused by name when
    its kind is unknown): a skipped data file would be lost without a word.
    """
    parts = path.relative_to(root).parts
    if any(p.startswith(".") for p in parts):
        return "hidden"
    if path.name in MARKER_FILES:
        return "marker"
    if path.name.lower().endswith(".crc"):
        return "checksum"
    return None


#: what each reason of :func:`not_data` means, for messages
SKIP_REASONS = {
    "hidden": "hidden (name starts with '.')",
    "marker": f"marker files ({', '.join(sorted(MARKER_FILES))})",
    "checksum": "checksum files (.crc)",
}


def _list_files(source: str, skipped: dict[str, list[str]]) -> list[str]:
    files: list[str] = []
    for pattern in expand_braces(str(source)):
        p = Path(pattern)
        if p.is_dir():
            found = []
            for f in sorted(p.rglob("*")):
                if f.is_dir():  # anything else is listed: a pipe or a broken link is refused, not skipped
                    continue
                reason = not_data(f, p)
                if reason is None:
                    found.append(str(f))
                else:
                    skipped.setdefault(reason, []).append(str(f))
            if not found:
                raise InputError(f"{p}: the directory holds no data files{_skipped_note(skipped)}")
            files.extend(found)
        elif glob.has_magic(pattern):
            found = []
            for name in sorted(glob.glob(pattern, recursive=True)):
                # A glob names hidden files only when asked to; markers match `data/*` though.
                reason = None if Path(name).name.startswith(".") else not_data(Path(name), Path(name).parent)
                if reason is None:
                    found.append(name)
                else:
                    skipped.setdefault(reason, []).append(name)
            if not found:
                raise InputError(f"{pattern}: the pattern matches no data file{_skipped_note(skipped)}")
            files.extend(found)
        elif p.exists() or p.is_symlink():  # not only regular files: discover() says what else it is
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
) -> list[SourceUnit]:
    """Find the input files of ``sources`` and group them into units.

    Args:
        sources: files, directories, globs or brace patterns.
        source_format: read every file as this kind instead of detecting it.
        options: how sources are read.
        skipped: filled with the files left out as certainly not data, by
            reason (see :func:`not_data`), for the caller to report.

    Raises:
        InputError: a path that does not exist or is not a regular file (a FIFO,
            a device, a broken link), a pattern that matches nothing,
            a file of no known kind, or an unknown ``source_format``.
    """
    options = options or SourceOptions()
    if source_format is not None and source_format not in READERS:
        raise InputError(f"unknown --source-format {source_format!r}; choose one of {', '.join(sorted(READERS))}")
    if not sources:
        raise InputError("no source given: name at least one file, directory or glob")
    by_kind: list[tuple[str, list[str]]] = []
    for source in sources:
        for f in _list_files(os.fspath(source), skipped if skipped is not None else {}):
            check_input_file(f)
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
    return units


def read_unit(unit: SourceUnit, options: SourceOptions) -> Iterator[tuple[str, Sample]]:
    """Yield ``(locator, sample)`` for every sample of ``unit``."""
    return READERS[unit.kind].read(unit, options)
