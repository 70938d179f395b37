"""Offline preparation: turn raw data into a shard set.

``prepare(sources, out)`` reads files (``.npy``, ``.npz``, Parquet, Arrow,
JSON Lines, WebDataset tars); ``write(samples, out)`` takes any Python
iterable of sample dicts. Both run the same resumable pipeline
(:mod:`shardload.prepare.pipeline`); with a URL as ``out`` (``s3://...``), into a
local staging directory first, then uploaded (:mod:`shardload.prepare.remote`).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shardload._base.checks import unknown_keywords
from shardload._base.redact import get_logger
from shardload.errors import InputError
from shardload.formats import FORMATS
from shardload.prepare.fingerprint import fingerprint_units
from shardload.prepare.logged import with_logged_warnings
from shardload.prepare.options import PrepareOptions
from shardload.prepare.parts import parse_part, part_dir, refuse_part_into_single_set, refuse_resume_of_merged
from shardload.prepare.pipeline import PrepareResult, run_prepare
from shardload.prepare.remote import prepare_to_url, refuse_remote_options, refuse_remote_parts, staging_dir
from shardload.prepare.sources import SKIP_REASONS, SourceOptions, discover
from shardload.remote.retry import RetryPolicy
from shardload.remote.url import is_remote, local_path

logger = get_logger("shardload.prepare")

__all__ = ["PrepareOptions", "PrepareResult", "prepare", "write"]


@with_logged_warnings
def prepare(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    source_format: str | None = None,
    field: str | None = None,
    allow_pickle: bool = False,
    max_record_bytes: int | None = None,
    part: str | tuple[int, int] | None = None,
    unit_bytes: int | None = None,
    storage_options: dict[str, Any] | None = None,
    staging: str | os.PathLike[str] | None = None,
    keep_staging: bool = False,
    retry: RetryPolicy | None = None,
    **options: Any,
) -> PrepareResult:
    """Prepare a shard set from files on disk.

    Args:
        sources: files, directories, globs or brace patterns (``data-{000..009}.tar``).
        out: the shard set directory to create, or a URL (``s3://bucket/prefix/set``; the forms of docs/remote.md, "URLs"): the
            set is then prepared in a local staging directory and uploaded, ``manifest.json`` last
            (:mod:`shardload.prepare.remote`).
        source_format: force a source kind instead of detecting it by suffix.
        field: field name for ``.npy`` files (one unnamed array per file;
            default ``data``). Refused when no source is a ``.npy`` file: other
            kinds name their fields themselves.
        allow_pickle: allow pickled data (never do this with untrusted input).
        max_record_bytes: the most bytes one JSON line, tar member or ``.npz``
            array may have once decompressed (default 256 MiB, or the
            ``SHARDLOAD_MAX_RECORD_BYTES`` environment variable).
        part: ``(K, N)`` or ``"K/N"``: prepare only part K (from 0) of N of the
            input, into ``out/parts/KKKKK-of-NNNNN`` (a shard set of its own);
            once every part is done, :func:`shardload.merge` makes ``out`` one
            set of them (see :mod:`shardload.prepare.parts`).
        unit_bytes: split a file larger than this into units of about this many
            bytes that workers read in parallel (default 16 MiB; JSON Lines by
            byte ranges at line boundaries, Parquet by row groups, Arrow IPC
            files by record batches). The samples, their order and the shards
            do not depend on ``workers``.
        storage_options: with a URL ``out``: fsspec's options (credentials, ``client_kwargs={"endpoint_url":
            ...}``); default: the environment's (``AWS_*`` variables, config files).
        staging: with a URL ``out``: the local directory to prepare in (default
            ``<cache dir>/staging/<sha256(url)[:16]>``, the cache dir of remote sets: ``$SHARDLOAD_CACHE_DIR``,
            else ``$XDG_CACHE_HOME/shardload``, else ``~/.cache/shardload``);
            it needs room for the whole set.
        keep_staging: with a URL ``out``: keep the staged set once the upload is complete.
        retry: with a URL ``out``: retries of every call to the store (default :class:`RetryPolicy`).
        **options: see :class:`PrepareOptions` (``num_shards``, ``shuffle``, ``workers``, ...).

    Examples:
        >>> shardload.prepare("data/*.parquet", "out/", workers=4)  # doctest: +SKIP
        >>> shardload.prepare("data/*.parquet", "s3://bucket/sets/v1", workers=4)  # doctest: +SKIP
        >>> shardload.prepare("corpus/*.jsonl", "out/", map=mytok.encode, workers=4)  # doctest: +SKIP
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    remote = is_remote(out)
    if not remote:
        out = local_path(out)  # file:///abs/path is that directory
        refuse_remote_options(
            out, storage_options=storage_options, staging=staging, keep_staging=keep_staging, retry=retry
        )
    opts = _options("prepare()", options, prepare)
    which = None if part is None else parse_part(part)
    if remote and which is not None:
        refuse_remote_parts(os.fsdecode(out))
    if not remote and which is None and opts.resume:
        refuse_resume_of_merged(out)
    if not remote and which is not None:
        refuse_part_into_single_set(out, *which)
    bound: dict[str, Any] = {} if max_record_bytes is None else {"max_record_bytes": max_record_bytes}
    if unit_bytes is not None:
        bound["unit_bytes"] = unit_bytes
    source_options = SourceOptions(
        field=field or "data",
        dtypes=dict(opts.dtypes),
        allow_pickle=allow_pickle,
        fields=opts.fields,
        drop_fields=opts.drop_fields,
        **bound,
    )
    skipped: dict[str, list[str]] = {}
    local = staging_dir(os.fsdecode(out), staging) / "set" if remote else out
    units = discover(list(sources), source_format=source_format, options=source_options, skipped=skipped, output=local)
    if field is not None and not any(u.kind == "npy" for u in units):
        kinds = ", ".join(sorted({u.kind for u in units}))
        raise InputError(
            f"--field {field!r} names the one array of .npy files, but no source is a .npy file ({kinds}: their "
            "fields are named by the data itself); leave --field out"
        )
    for reason, files in skipped.items():
        logger.info("skipped %d %s, not data: %s", len(files), SKIP_REASONS[reason], ", ".join(files[:5]))
    describe = {"source_format": source_format, "field": field or "data", "allow_pickle": allow_pickle}
    if remote:
        result = prepare_to_url(
            os.fsdecode(out),
            lambda target: run_prepare(
                target, options=opts, units=units, source_options=source_options, describe=describe
            ),
            opts,
            sources={"units": [u.describe() for u in units], "inputs": fingerprint_units(units), **describe},
            storage_options=storage_options,
            staging=staging,
            keep_staging=keep_staging,
            retry=retry,
        )
    else:
        target = out if which is None else part_dir(out, *which)
        result = run_prepare(
            target, options=opts, units=units, source_options=source_options, describe=describe, part=which
        )
    return dataclasses.replace(result, skipped={k: len(v) for k, v in skipped.items()})


@with_logged_warnings
def write(
    samples: Iterable[Mapping[str, Any]],
    out: str | os.PathLike[str],
    *,
    storage_options: dict[str, Any] | None = None,
    staging: str | os.PathLike[str] | None = None,
    keep_staging: bool = False,
    retry: RetryPolicy | None = None,
    **options: Any,
) -> PrepareResult:
    """Write a shard set from an iterable of samples (dicts of numpy arrays).

    ``out`` may be a URL, as for :func:`prepare` (with ``storage_options``,
    ``staging``, ``keep_staging`` and ``retry`` as there).

    With ``resume=True`` the iterable must yield the same samples in the same
    order as in the interrupted run: samples already staged are skipped.
    ``map=fn`` passes every sample through ``fn`` first (it returns the sample,
    ``None`` to drop it, or a list of samples; :mod:`shardload.prepare.mapping`).

    Examples:
        >>> import numpy as np
        >>> samples = ({"tokens": np.arange(n, dtype=np.int32)} for n in range(1, 100))
        >>> shardload.write(samples, "out/", num_shards=4)  # doctest: +SKIP
    """
    if isinstance(samples, Mapping):
        raise InputError(
            f"write() takes an iterable of samples, and got one sample (a {type(samples).__name__} with keys "
            f"{', '.join(map(repr, list(samples)[:5]))}): pass a list of samples, e.g. write([sample], out)"
        )
    if isinstance(samples, (str, bytes, os.PathLike)):
        raise InputError(
            f"write() takes an iterable of samples (dicts of arrays), and got the path {os.fsdecode(samples)!r}: "
            "to read files, use shardload.prepare(sources, out)"
        )
    try:
        iter(samples)
    except TypeError:
        raise InputError(
            f"write() takes an iterable of samples (dicts of arrays), and got {type(samples).__name__} {repr(samples)[:60]}: "
            "pass a list or generator of samples, e.g. write([{'tokens': array}], out)"
        ) from None
    opts = _options("write()", options, write)
    if is_remote(out):
        return prepare_to_url(
            os.fsdecode(out),
            lambda target: run_prepare(target, options=opts, samples=samples),
            opts,
            sources="the samples given to write()",
            storage_options=storage_options,
            staging=staging,
            keep_staging=keep_staging,
            retry=retry,
        )
    out = local_path(out)  # file:///abs/path is that directory
    refuse_remote_options(out, storage_options=storage_options, staging=staging, keep_staging=keep_staging, retry=retry)
    return run_prepare(out, options=opts, samples=samples)


def _options(owner: str, options: dict[str, Any], entry: Any) -> PrepareOptions:
    """The :class:`PrepareOptions` of an entry point's keywords; one it does not take is an :class:`InputError`."""
    # a format's own option (compression=) is PrepareOptions' to refuse, with the spelling that replaces it
    fields = [f.name for f in dataclasses.fields(PrepareOptions)]
    taken = {*fields, *(name for fmt in FORMATS.values() for name in fmt.option_names())}
    if not options.keys() <= taken:
        known = [*inspect.signature(entry).parameters, *fields]
        raise InputError(unknown_keywords(owner, options, known, {}) or "")
    return PrepareOptions(**_tupled(options))


def _tupled(options: dict[str, Any]) -> dict[str, Any]:
    if "fixed_fields" in options:
        fixed = options["fixed_fields"]
        # One name given as a string is one field, not one field per character.
        options = {**options, "fixed_fields": (fixed,) if isinstance(fixed, str) else tuple(fixed)}
    return options
