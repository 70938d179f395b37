"""Options of ``prepare``/``write``, grouped in one frozen object.

The format's own options live in ``shard_format`` (a :class:`~shardload.formats.base.FormatOptions`),
so that nothing here depends on which formats exist.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, cast

import numpy as np

from shardload.errors import InputError
from shardload.formats import FORMATS, FormatOptions, ShardFormat, format_of
from shardload.prepare.mapconfig import ConfiguredMap, checked_map_args, map_file_digests
from shardload.prepare.mapping import map_identity
from shardload.prepare.sources.base import field_kept
from shardload.schema.fields import SUPPORTED_DTYPES

DEFAULT_SHARD_SIZE = 256 << 20


@dataclass(frozen=True)
class PrepareOptions:
    """How to lay a dataset out as a shard set.

    Attributes:
        shard_format: the format's name, ``"arrow"`` (memory-mapped,
            zero-copy) or ``"zarr"`` (compressed, decoded chunk by chunk; needs
            ``shardload[zarr]``), for its defaults; or its options, e.g.
            ``ZarrOptions(compression="zstd", chunk_size=1 << 20)``. Once made,
            it always holds the options object (``"zarr"``: ``ZarrOptions()``).
        shard_size: target bytes of sample data per shard (default 256 MB).
        num_shards: exact number of shards; overrides ``shard_size``.
        balance: ``"samples"``: shards differ by at most one sample;
            ``"tokens"``: that, and total length per shard evened out too.
        shuffle: shuffle samples across shards once (seeded), so that each
            rank's contiguous group of shards is an unbiased sample.
        seed: seed of that shuffle.
        workers: parallel processes for reading sources and writing shards.
        resume: finish an interrupted run into the same output.
        overwrite: replace an existing shard set (only once the new one is complete).
        fixed_fields: fields whose shape never varies (stacked, not padded).
        length_field: field whose length is the batching length (default: the
            longest variable field of each sample).
        dtypes: cast these fields on ingest, e.g. ``{"tokens": "int32"}``.
        reject_nonfinite: refuse NaN/inf in float fields.
        progress: show a progress bar (``None``: when stderr is a terminal).
        chunk_bytes: size of the intermediate chunks prepare stages on disk.
        map: a function applied to every sample as it is read, in the worker
            processes (:mod:`shardload.prepare.mapping`): it returns the sample
            mapped, ``None`` to drop it, or a list of samples. With more than one
            worker it must be defined at the top level of a module.
        map_batch: call ``map`` with up to this many records at a time, as a
            dict of column lists (``{"text": [str, ...]}``); it returns a dict
            of columns with one entry per record, or a list with one per-sample
            result per record (:mod:`shardload.prepare.batched`). ``None``: one
            record a call. Recorded with the map: ``resume`` refuses a change.
        fields: keep only these fields of the input (read time; Parquet/Arrow
            read only these columns); a name the input lacks is refused.
        drop_fields: leave these fields of the input out (excludes ``fields``).
        map_factory: instead of ``map``, a function that makes the map:
            called ``map_factory(**map_args, **map_files)`` once in each
            process that maps (each worker, before its first record), it
            returns the function applied to every sample (or batch, with
            ``map_batch``), which need not be picklable
            (:mod:`shardload.prepare.mapconfig`).
        map_args: keyword arguments of ``map`` (``map(sample, **map_args)``)
            or of ``map_factory``; JSON values, recorded: ``resume`` refuses
            other ones.
        map_files: keyword arguments of the map that name files it reads
            (``{"tokenizer": "tokenizer.json"}``): the path is passed as the
            argument, and the file's sha256, taken now, is recorded: ``resume``
            refuses a changed file.

    Raises:
        InputError: an invalid value; or an option of a format given here
            (``compression=``: write ``shard_format=ZarrOptions(compression=...)``).
    """

    shard_format: str | FormatOptions = "arrow"
    shard_size: int = DEFAULT_SHARD_SIZE
    num_shards: int | None = None
    balance: Literal["samples", "tokens"] = "samples"
    shuffle: bool = True
    seed: int = 0
    workers: int = 1
    resume: bool = False
    overwrite: bool = False
    fixed_fields: tuple[str, ...] = ()
    length_field: str | None = None
    dtypes: Mapping[str, str] = field(default_factory=dict)
    reject_nonfinite: bool = False
    progress: bool | None = None
    chunk_bytes: int = 64 << 20
    map: Callable[[dict[str, Any]], Any] | None = None
    map_batch: int | None = None
    fields: tuple[str, ...] | None = None
    drop_fields: tuple[str, ...] = ()
    map_factory: Callable[..., Any] | None = None
    map_args: Mapping[str, Any] = field(default_factory=dict)
    map_files: Mapping[str, str | os.PathLike[str]] = field(default_factory=dict)

    def __new__(cls, *args: Any, **kwargs: Any) -> PrepareOptions:
        # An option of a format given on its own (as in shardload 0.1.0) is refused here, before the
        # constructor's own "unexpected keyword" TypeError, with the spelling that replaces it.
        for fmt in FORMATS.values():
            given = {k: v for k, v in kwargs.items() if k in fmt.option_names()}
            if given:
                raise InputError(misplaced_format_options(fmt, given))
        return super().__new__(cls)

    def __post_init__(self) -> None:
        for name in ("shard_size", "num_shards", "seed", "workers", "chunk_bytes", "map_batch"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))):
                raise InputError(f"{name} must be an integer, got {value!r}")
            if value is not None:
                object.__setattr__(self, name, int(value))  # numpy integers too; the manifest stores plain ints
        for name in ("shuffle", "resume", "overwrite", "reject_nonfinite"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise InputError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if not 0 <= self.seed < 2**64:
            raise InputError(f"seed must be an integer in [0, 2**64), got {self.seed}")
        if not isinstance(self.dtypes, Mapping):
            raise InputError(f"dtypes must map field names to dtype names, got {self.dtypes!r}")
        if self.shard_size <= 0:
            raise InputError(f"shard_size must be positive, got {self.shard_size}")
        if self.num_shards is not None and self.num_shards < 1:
            raise InputError(f"num_shards must be at least 1, got {self.num_shards}")
        if self.balance not in ("samples", "tokens"):
            raise InputError(f"balance must be 'samples' or 'tokens', got {self.balance!r}")
        if self.workers < 1:
            raise InputError(f"workers must be at least 1, got {self.workers}")
        if self.resume and self.overwrite:
            raise InputError("resume and overwrite exclude each other: resume finishes a run, overwrite starts over")
        for name, dtype in self.dtypes.items():
            if dtype not in SUPPORTED_DTYPES:
                raise InputError(f"dtype of {name!r}: {dtype!r} is not one of {', '.join(SUPPORTED_DTYPES)}")
        self._check_map()
        if self.map_batch is not None and self.map_batch < 1:
            raise InputError(f"map_batch (--map-batch) must be at least 1 record, got {self.map_batch}")
        if self.map_batch is not None and self.mapper is None:
            raise InputError(
                f"map_batch={self.map_batch} (--map-batch) sets how many records the map function takes a call, and "
                "no map is given: give map= (--map MODULE:FUNCTION) too, or leave map_batch out"
            )
        for name in ("fields", "drop_fields"):
            value = getattr(self, name)
            if value is None:
                continue
            names = (value,) if isinstance(value, str) else value
            if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) and n for n in names):
                raise InputError(f"{name} must be a list of field names, got {value!r}")
            object.__setattr__(self, name, tuple(names))
        if self.fields is not None and self.drop_fields:
            raise InputError("fields and drop_fields exclude each other: name the fields to keep, or those to drop")
        if self.fields is not None and not self.fields:
            raise InputError("fields is empty: name at least one field to keep (or leave it out to keep all)")
        # a map may make the length field itself
        if (
            self.length_field is not None
            and self.mapper is None
            and not field_kept(self.length_field, self.fields, self.drop_fields)
        ):
            option = "--drop-fields" if self.fields is None else "--fields"
            raise InputError(
                f"length_field {self.length_field!r} is left out by {option}: keep it, or name another length field"
            )
        if self.chunk_bytes <= 0:
            raise InputError(f"chunk_bytes must be positive, got {self.chunk_bytes}")
        if isinstance(self.shard_format, str):
            if self.shard_format not in FORMATS:
                raise InputError(f"unknown shard format {self.shard_format!r}; choose one of {sorted(FORMATS)}")
            object.__setattr__(self, "shard_format", FORMATS[self.shard_format].options())  # its defaults
        format_of(self.shard_format)  # an options object of a registered format, or an InputError

    def _check_map(self) -> None:
        """Check ``map``, ``map_factory``, ``map_args`` and ``map_files``, and make :attr:`mapper` of them."""
        for name in ("map", "map_factory"):
            fn = getattr(self, name)
            if fn is not None and not callable(fn):
                hint = (
                    " (to name it as 'module:function', pass load_map(name), from shardload.prepare.mapping)"
                    if isinstance(fn, str)
                    else ""
                )
                raise InputError(f"{name} must be a function, got {type(fn).__name__} {fn!r}{hint}")
        if self.map is not None and self.map_factory is not None:
            raise InputError(
                "map and map_factory exclude each other (--map, --map-factory): map is the function applied to each "
                "sample, map_factory makes that function once per worker process; give one"
            )
        args = checked_map_args(self.map_args)
        files = map_file_digests(self.map_files)
        fn = self.map if self.map is not None else self.map_factory
        if (args or files) and fn is None:
            raise InputError(
                "map_args and map_files (--map-arg, --map-file) are arguments of the map, and no map is given: give "
                "map= or map_factory= (--map, --map-factory) too, or leave them out"
            )
        both = sorted(set(args) & set(files))
        if both:
            raise InputError(f"{', '.join(map(repr, both))} given both as a map argument and a map file: give it once")
        object.__setattr__(self, "map_args", args)
        object.__setattr__(self, "map_files", {k: f["path"] for k, f in files.items()})
        mapper: Callable[[dict[str, Any]], Any] | None = fn
        if fn is not None and (self.map_factory is not None or args or files):
            kwargs = {**args, **{k: f["path"] for k, f in files.items()}}
            digests = tuple(f["sha256"] for f in files.values())
            mapper = ConfiguredMap(fn, self.map_factory is not None, kwargs, digests)
        object.__setattr__(self, "_mapper", mapper)
        object.__setattr__(self, "_map_file_record", files)

    @property
    def mapper(self) -> Callable[[dict[str, Any]], Any] | None:
        """The map as prepare applies it: ``map``, or ``map``/``map_factory`` with their arguments; None for none."""
        return cast("Callable[[dict[str, Any]], Any] | None", self.__dict__["_mapper"])

    @property
    def format(self) -> ShardFormat:
        """The registered format of the shards (name, writer, reader)."""
        return format_of(self.shard_format)

    @property
    def format_options(self) -> FormatOptions:
        """The format's options object (``shard_format`` once the options are made)."""
        return cast(FormatOptions, self.shard_format)

    def layout_key(self) -> dict[str, Any]:
        """The options that decide the output bytes (compared on ``resume``, recorded in the manifest; the
        format's own options last, defaults resolved)."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in (*_RUN_ONLY, *_MAP)}
        if self.map is not None:  # absent without one: the record of a run made before maps existed still matches
            d["map"] = map_identity(self.map)
        # absent unless given, as map: the record of a run made before they existed still matches
        if self.map_factory is not None:
            d["map_factory"] = map_identity(self.map_factory)
        if self.map_args:
            d["map_args"] = dict(self.map_args)
        if self.map_files:
            d["map_files"] = {k: dict(v) for k, v in self.__dict__["_map_file_record"].items()}
        if self.map_batch is not None:  # absent unless given, as map
            d["map_batch"] = self.map_batch
        d["shard_format"] = self.format.name
        d["fixed_fields"] = list(self.fixed_fields)
        # absent unless given, as map: the record of a run made before they existed still matches
        del d["fields"], d["drop_fields"]
        if self.fields is not None:
            d["fields"] = list(self.fields)
        if self.drop_fields:
            d["drop_fields"] = list(self.drop_fields)
        d["dtypes"] = dict(sorted(self.dtypes.items()))
        d.update(self.format_options.to_json())
        return d


#: options that change how a run goes, not what it writes
_RUN_ONLY = ("workers", "resume", "overwrite", "progress")
#: the map's options, recorded only when given
_MAP = ("map", "map_batch", "map_factory", "map_args", "map_files")


def misplaced_format_options(fmt: ShardFormat, given: Mapping[str, Any]) -> str:
    """What to write instead of ``given``, options of ``fmt`` passed as options of ``prepare`` itself."""
    names = fmt.option_names()
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    spelled = ", ".join(f"{k}={v!r}" for k, v in given.items())
    flags = " ".join(f"{f.flag} {given[f.field]}" for f in fmt.flags if f.field in given)
    return (
        f"{listed} apply to {fmt.name} shards, and are given with the format: write "
        f"shard_format=shardload.{fmt.options.__name__}({spelled}) ({fmt.name!r} alone takes their defaults; "
        f"command line: --format {fmt.name} {flags})"
    )
