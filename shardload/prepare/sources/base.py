"""What every source reader provides: units of work that yield samples.

A *unit* is the smallest piece of input one worker reads on its own (a tar, a group of ``.npy``
files, or a part of one big file): a small picklable description made from the file sizes and
layout alone, never from ``--workers``, so the output does not depend on it (docs/design.md,
"Prepare in stages"). Each sample comes with a *locator* (``"data/a.jsonl: line 17"``), exact
also in a part of a file, used in every error message about it.
"""

from __future__ import annotations

import os
import stat
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import TYPE_CHECKING, Any, ClassVar

from shardload._base import envvars
from shardload._base.envvars import env_int
from shardload._base.setfiles import file_kind
from shardload.errors import InputError

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from shardload.formats.base import Columns
    from shardload.formats.origin import OriginKind
    from shardload.schema.fields import Schema

Sample = Mapping[str, Any]

#: the most bytes one record may have once decompressed: a line of a JSON Lines file, a member of a tar, an
#: array of an .npz. A small compressed file can expand to any size, and decoding a record takes several
#: times its size in memory, so a record beyond this is refused by name. Raise it with the environment
#: variable below or ``prepare(..., max_record_bytes=...)``.
MAX_RECORD_BYTES = 256 << 20
MAX_RECORD_BYTES_ENV = envvars.MAX_RECORD_BYTES
#: the largest bound that may be set (readers pass it to calls that take a C size)
LARGEST_RECORD_BYTES = 1 << 48


def max_record_bytes_from_env() -> int:
    """:data:`MAX_RECORD_BYTES`, or the value of ``SHARDLOAD_MAX_RECORD_BYTES`` (``4GiB``, ``500MB``, bytes)."""
    return env_int(MAX_RECORD_BYTES_ENV, MAX_RECORD_BYTES, maximum=LARGEST_RECORD_BYTES, size=True, error=InputError)


def record_too_large(where: str, what: str, size: int | None, limit: int) -> InputError:
    """The error for a record over ``limit`` bytes (``size`` if known): names it, the bound and how to raise it."""
    how_big = f"is {size:,} bytes, more than" if size is not None else "is longer than"
    return InputError(
        f"{where}: {what} {how_big} the {limit:,} bytes one record may have (a guard against files that "
        f"decompress to huge sizes). If the data is right, raise the bound: {MAX_RECORD_BYTES_ENV}=4GiB "
        "(or prepare(..., max_record_bytes=...))."
    )


#: the default of :attr:`SourceOptions.unit_bytes`: small enough that a file of a few hundred MB keeps two to
#: eight workers busy to the end (a 166 MB file makes 10 units, 5 per worker of 2), large enough that a unit's
#: fixed costs (a process hand-off, a staged chunk, an entry in the run's state) stay below 1% of its work
DEFAULT_UNIT_BYTES = 16 << 20
#: the most units one file is cut into: a unit has a fixed cost of a few milliseconds (a hand-off to a worker,
#: a staged chunk, an entry in the run's state), so ``--unit-size 1`` once cut a 1.6 MB file into a unit per
#: line (20,000, minutes of overhead instead of a second of reading). A file this many times the unit size or
#: larger gets units of ``size / MAX_UNITS_PER_FILE`` instead: still 256 pieces to spread over the workers.
MAX_UNITS_PER_FILE = 256


def field_kept(name: str, fields: Sequence[str] | None, drop_fields: Sequence[str]) -> bool:
    """The rule of ``fields`` / ``drop_fields``: whether field ``name`` is read."""
    return name not in drop_fields if fields is None else name in fields


@dataclass(frozen=True)
class SourceOptions:
    """Options that sources interpret.

    Attributes:
        field: field name for sources whose files hold one unnamed array (``.npy``).
        dtypes: dtype per field, applied while decoding (JSON has no dtypes).
        files_per_unit: how many one-sample files (``.npy``/``.npz``) one unit reads.
        unit_bytes: a file larger than this is split into units of about this many bytes.
        max_record_bytes: see :data:`MAX_RECORD_BYTES`.
    """

    field: str = "data"
    dtypes: Mapping[str, str] = dc_field(default_factory=dict)
    allow_pickle: bool = False
    files_per_unit: int = 1024
    unit_bytes: int = DEFAULT_UNIT_BYTES
    max_record_bytes: int = dc_field(default_factory=max_record_bytes_from_env)
    fields: tuple[str, ...] | None = None
    drop_fields: tuple[str, ...] = ()

    def unit_bytes_for(self, size: int) -> int:
        """The unit size of a file of ``size`` bytes: ``unit_bytes``, raised so that it makes at most
        :data:`MAX_UNITS_PER_FILE` units."""
        return max(self.unit_bytes, -(-size // MAX_UNITS_PER_FILE))

    def keeps(self, name: str) -> bool:
        """Whether field ``name`` is read (the rule of ``fields`` / ``drop_fields``); a reader skips it otherwise."""
        return field_kept(name, self.fields, self.drop_fields)

    def select(self, names: Sequence[str], where: str) -> list[str]:
        """The names of ``names`` that are read, in their order.

        Raises:
            InputError: a field named by the options is missing, or no field is left.
        """
        named = self.drop_fields if self.fields is None else self.fields
        missing = [n for n in named if n not in names]
        if missing:
            option = "--fields" if self.fields is not None else "--drop-fields"
            raise InputError(
                f"{where}: {option} names {missing}, which the input does not have (its fields: "
                f"{', '.join(map(str, names)) or 'none'}); check the spelling"
            )
        kept = [n for n in names if self.keeps(n)]
        if names and not kept:
            raise InputError(
                f"{where}: --drop-fields leaves no field (its fields: {', '.join(map(str, names))}); "
                "keep at least one field"
            )
        return kept

    def selected(self, sample: Sample, where: str) -> Sample:
        """``sample`` with only the fields that are read; the same object when every field is."""
        if self.fields is None and not self.drop_fields:
            return sample
        if not isinstance(sample, Mapping):
            return sample  # the schema check names what it is
        return {name: sample[name] for name in self.select(list(sample), where)}

    def __post_init__(self) -> None:
        if self.fields is not None and self.drop_fields:
            raise InputError("fields and drop_fields exclude each other: name the fields to keep, or those to drop")
        value = self.max_record_bytes
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= LARGEST_RECORD_BYTES:
            raise InputError(
                f"max_record_bytes must be a positive integer (bytes) of at most {LARGEST_RECORD_BYTES:,}, got {value!r}"
            )
        unit = self.unit_bytes
        if isinstance(unit, bool) or not isinstance(unit, int) or unit <= 0:
            raise InputError(f"unit_bytes (--unit-size) must be a positive integer (bytes), got {unit!r}")


@dataclass(frozen=True)
class SourceUnit:
    """One unit of input: a kind and the files it reads, in order, or a part of one file.

    Attributes:
        part: ``(start, stop)`` of a part of ``paths[0]``: bytes for JSON Lines,
            row groups for Parquet, record batches for Arrow IPC; None for whole files.
        first: the lines or rows of the file before the part, which locators count from.
        nbytes: the input bytes of a part (what balances ``--part K/N``); 0 for whole files.
    """

    kind: str
    paths: tuple[str, ...]
    part: tuple[int, int] | None = None
    first: int = 0
    nbytes: int = 0

    def files(self) -> Iterator[str]:
        """The unit's paths in order, each checked by :func:`check_input_file` just before it is read."""
        for path in self.paths:
            check_input_file(path)
            yield path

    def describe(self) -> str:
        """The unit in words (in the run's state and messages): ``jsonl:a.jsonl [0:16777216]`` for a part."""
        if self.part is not None:
            return f"{self.kind}:{self.paths[0]} [{self.part[0]}:{self.part[1]}]"
        if len(self.paths) == 1:
            return f"{self.kind}:{self.paths[0]}"
        return f"{self.kind}:{self.paths[0]}..{self.paths[-1]} ({len(self.paths)} files)"


@dataclass(frozen=True)
class SampleBatch:
    """A run of consecutive samples of a unit, whole columns at once (the columnar ingest path).

    ``samples`` gives the same samples one by one, exactly as :meth:`SourceReader.read` would; ingest
    reads them so whenever the columns are in any doubt, so that what is staged and every message stay
    those of the per-sample path.

    Attributes:
        columns: the samples' fields, or None where only ``samples`` can read them. A field with
            offsets holds sample ``i`` in ``values[offsets[i]:offsets[i + 1]]``, one without in ``values[i]``.
        where: with ``columns``, for :func:`shardload.formats.origin.run_origins`: the file, ``"row"``
            or ``"line"``, and each sample's row or line number, as its locator names it.
    """

    columns: Columns | None
    samples: Callable[[], Iterator[tuple[str, Sample]]]
    where: tuple[str, OriginKind, NDArray[np.int64]] | None = None


class SourceReader(ABC):
    """Reads the units of one source kind. Subclasses register in ``READERS``."""

    #: the ``--source-format`` name
    kind: ClassVar[str]
    #: file suffixes detected as this kind (lower case, with the dot)
    suffixes: ClassVar[tuple[str, ...]]

    #: True for kinds whose files hold one sample each: many such files make one unit
    one_sample_per_file: ClassVar[bool] = False
    #: True for kinds that read only the fields :class:`SourceOptions` selects (column projection); the
    #: others' samples are filtered by :func:`~shardload.prepare.sources.read_unit`
    selects_fields: ClassVar[bool] = False

    @classmethod
    def make_units(cls, files: Sequence[str], options: SourceOptions) -> list[SourceUnit]:
        """Group files into units: ``files_per_unit`` one-sample files, or one file each."""
        k = max(1, options.files_per_unit) if cls.one_sample_per_file else 1
        return [SourceUnit(cls.kind, tuple(files[i : i + k])) for i in range(0, len(files), k)]

    @classmethod
    @abstractmethod
    def read(cls, unit: SourceUnit, options: SourceOptions) -> Iterator[tuple[str, Sample]]:
        """Yield ``(locator, sample)`` for every sample of ``unit``, in a fixed order.

        Raises:
            InputError: naming the file and the sample, for unreadable or malformed input.
        """

    @classmethod
    def read_batches(cls, unit: SourceUnit, options: SourceOptions, schema: Schema) -> Iterator[SampleBatch] | None:
        """The samples of ``unit`` as :class:`SampleBatch` runs, in :meth:`read`'s order; None for a kind
        (or a unit) that is read sample by sample only. ``schema`` is the one the samples are checked against."""
        return None


class OneSamplePerFileReader(SourceReader):
    """A kind whose every file holds one sample (``.npy``, ``.npz``): a subclass says how to load one file."""

    one_sample_per_file: ClassVar[bool] = True

    @classmethod
    def read(cls, unit: SourceUnit, options: SourceOptions) -> Iterator[tuple[str, Sample]]:
        """Yield ``(path, sample)`` for every file of ``unit``, in order."""
        for path in unit.files():
            yield path, cls.load(path, options)

    @classmethod
    @abstractmethod
    def load(cls, path: str, options: SourceOptions) -> Sample:
        """The sample in the file at ``path``.

        Raises:
            InputError: naming the file, for an unreadable or malformed one.
        """


READERS: dict[str, type[SourceReader]] = {}


def check_input_file(path: str) -> None:
    """Refuse anything but a regular file, without opening it (a FIFO or a device would hang prepare).

    Raises:
        InputError: naming the file and what it is instead.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            raise InputError(
                f"{path}: a symbolic link to {os.readlink(path)!r}, which does not exist; fix or remove the link"
            ) from None
        raise InputError(f"{path}: file not found (was it deleted while prepare ran?)") from None
    except OSError as exc:  # a symbolic link loop, a name too long, a directory that may not be searched
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(mode):
        what = file_kind(mode)
        raise InputError(
            f"{path}: is {what}, not a regular file; prepare reads regular files only (a pipe or a device "
            "would block it or never end). Remove it from the sources, or copy its data into a file."
        )


def register(reader: type[SourceReader]) -> type[SourceReader]:
    """Class decorator: make a reader available under its ``kind``."""
    READERS[reader.kind] = reader
    return reader


def numpy_load_error(where: str, what: str, exc: BaseException, *, hint: str = "") -> InputError:
    """The error for an ``np.load`` of ``where`` (a ``what``, ``".npy file"``) that failed: a refused pickle,
    or damaged data (any exception: numpy parses a header as a Python literal), with ``hint`` appended."""
    if isinstance(exc, ValueError) and "allow_pickle" in str(exc):
        return InputError(
            f"{where}: holds a pickled object array; refusing to unpickle untrusted data. "
            "Save plain numeric arrays, or pass --allow-pickle if you trust the data."
        )
    return InputError(f"{where}: not a readable {what} ({type(exc).__name__}: {exc}){hint}")
