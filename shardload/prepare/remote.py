"""``prepare``/``write`` into object storage: prepare in a local staging directory, then upload.

Around the pipeline when the output is a URL: the URL is checked before any work, the set is
prepared and committed in ``STAGING/set``, uploaded with ``manifest.json`` last, and ``STAGING``
removed. Steps and ``--resume``: docs/remote.md, "Preparing into object storage".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from shardload._base.output import OutputLock, atomic_write_text
from shardload._base.redact import redact
from shardload.errors import InputError, OutputError, OutputExistsError
from shardload.formats.manifest import MANIFEST_NAME
from shardload.prepare.options import PrepareOptions
from shardload.prepare.pipeline import PrepareResult, result_of
from shardload.prepare.workdir import WORK
from shardload.remote.options import RemoteOptions
from shardload.remote.retry import RetryPolicy
from shardload.remote.upload import SetUploader, UploadRecord
from shardload.remote.url import normalize_url

__all__ = ["prepare_to_url", "refuse_remote_options", "refuse_remote_parts", "staging_dir"]

_RUN, _RECORD, _LOCK, _SET = "run.json", "uploaded.log", ".upload.lock", "set"


def staging_dir(url: str, staging: str | os.PathLike[str] | None = None) -> Path:
    """Where a run into ``url`` stages its set: ``staging`` if given, else one folder per URL in the cache.

    Raises:
        InputError: the node cache directory (``$SHARDLOAD_CACHE_DIR``, ...) is a file or cannot be written.
    """
    if staging is not None:
        return Path(staging)
    cache = RemoteOptions()  # the node cache's own settings, and its check of them
    path = cache.directory / "staging" / hashlib.sha256(normalize_url(url).encode()).hexdigest()[:16]
    cache.make_directory(path)  # a cache directory that is a file is named by its setting, as for reading
    return path


def refuse_remote_parts(url: str, what: str = "parts (--part K/N, shardload merge)") -> None:
    """Refuse ``--part K/N``, a merge or a Ray sink with a URL output: a merge needs the parts' files at hand.

    Raises:
        OutputError: always.
    """
    raise OutputError(
        f"{url}: {what} need an output directory every machine can write, not a URL: "
        "prepare the parts into a shared file system, merge them there and put the merged set into storage with "
        f"`shardload upload OUT {url}`, or prepare the whole set in one run with -o {url}"
    )


def refuse_remote_options(out: str | os.PathLike[str], **given: object) -> None:
    """Refuse options of a URL output (``given`` by name; ``None``, ``False``, ``{}``: not given) with a local ``out``.

    Raises:
        InputError: naming the options given.
    """
    flags = {"staging": " (--staging)", "keep_staging": " (--keep-staging)"}  # the command line's spelling
    named = [name for name, value in given.items() if value is not None and value is not False and value != {}]
    if named:
        listed = ", ".join(f"{name}={flags.get(name, '')}" for name in named)
        raise InputError(
            f"{listed} {'applies' if len(named) == 1 else 'apply'} only to a URL "
            f"output (s3://..., gs://...), and {os.fsdecode(out)!r} is a local directory: leave "
            f"{'it' if len(named) == 1 else 'them'} out, or give a URL as the output"
        )


def prepare_to_url(
    url: str,
    stage: Callable[[Path], PrepareResult],
    options: PrepareOptions,
    *,
    sources: Any,
    storage_options: Mapping[str, Any] | None = None,
    staging: str | os.PathLike[str] | None = None,
    keep_staging: bool = False,
    retry: RetryPolicy | None = None,
) -> PrepareResult:
    """Prepare into a staging directory with ``stage(local_out)``, then upload the set to ``url``.

    ``options.resume``, ``overwrite`` and ``progress`` apply to the upload too; ``sources`` (JSON) is
    compared on ``--resume`` with the staged set's. Returns the staged run's result, with ``path`` the
    URL and ``uploaded_bytes`` what this run uploaded.

    Raises:
        OutputExistsError: the URL holds a set (without ``overwrite``), an unfinished upload (without
            ``resume`` or ``overwrite``) or objects of something else.
        OutputError: the store refused the credentials, has no such bucket, or the staged set is of another run.
        RemoteError: a call kept failing after every retry (a rerun with ``resume`` goes on).
    """
    url = normalize_url(url)
    uploader = SetUploader(url, storage_options=storage_options, policy=retry, progress=options.progress)
    root = staging_dir(url, staging)
    _refuse_foreign_staging(root)
    local = root / _SET
    # a run into this URL was staged (whole or in part): --resume finishes it, even over an old set that an
    # interrupted --overwrite had not yet replaced
    staged = _staged_url(root) == redact(url) and ((local / WORK).exists() or (local / MANIFEST_NAME).exists())
    objects = uploader.listing()
    if MANIFEST_NAME in objects and options.resume and not staged:
        raise OutputExistsError(
            f"{url}: already holds a shard set and no staged run to resume in {root}: the run finished. Pass "
            "--overwrite to replace it, or choose another URL."
        )
    uploader.check_target(objects, resume=options.resume, overwrite=options.overwrite)
    _make_dir(root, url)
    lock = OutputLock(
        root / _LOCK,
        busy=f"{root}: another prepare is staging or uploading a set here right now; wait for it, or pass another --staging",
    )
    lock.acquire()
    try:
        identity = json.loads(
            # the URL as messages show it: no password in a file on disk
            json.dumps({"url": redact(url), "options": options.layout_key(), "sources": sources}, default=str)
        )
        if options.resume and (local / MANIFEST_NAME).exists() and not (local / WORK).exists():
            _check_same_run(root, identity)
            result = result_of(local, 0.0, 0)
        else:
            atomic_write_text(root / _RUN, json.dumps(identity, sort_keys=True))
            result = stage(local)
        record = UploadRecord(root / _RECORD, local / MANIFEST_NAME, fresh=options.overwrite)
        uploaded = uploader.upload_set(local, record)
    finally:
        lock.release(remove=False)
    if not keep_staging:
        _remove_staging(root, local)
    return dataclasses.replace(result, path=url, uploaded_bytes=uploaded)


def _make_dir(root: Path, url: str) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(
            f"{root}: cannot create the staging directory of {url} ({exc.strerror or exc}); pass --staging DIR "
            "(staging=) on a disk with room for the whole set"
        ) from None


def _refuse_foreign_staging(root: Path) -> None:
    """Refuse a staging directory that holds files of someone else's (``--staging .``): the run would remove them.

    Raises:
        OutputError: naming the files that are not a staging's.
    """
    try:
        names = sorted(p.name for p in root.iterdir())
    except OSError:
        return  # missing (created later) or not a directory (refused when created)
    foreign = [n for n in names if n not in (_SET, _RUN, _RECORD, _LOCK)]
    if not foreign and (_RUN in names or _SET not in names) and (_RUN not in names or _staged_url(root) is not None):
        return
    raise OutputError(
        f"{root}: the staging directory holds files that a prepare into a URL did not make "
        f"({', '.join((foreign or names)[:5])}); the run writes set/, run.json and uploaded.log there and removes "
        "them once uploaded: pass an empty or new directory as --staging (staging=)"
    )


def _staged_url(root: Path) -> str | None:
    """The URL of the run staged in ``root`` (None if none is recorded)."""
    try:
        url = json.loads((root / _RUN).read_text(encoding="utf-8")).get("url")
    except (OSError, ValueError, AttributeError):
        return None
    return url if isinstance(url, str) else None


def _check_same_run(root: Path, identity: dict[str, Any]) -> None:
    """Refuse to upload a finished staged set that another run (other URL, options or sources) made."""
    try:
        old = json.loads((root / _RUN).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        old = None
    if old != identity:
        diff = sorted(k for k in identity if not isinstance(old, dict) or old.get(k) != identity[k])
        raise OutputError(
            f"{root / _SET}: the staged set was prepared by another run ({', '.join(diff) or 'its record'} "
            "differ); rerun it exactly as before with --resume, or use --overwrite to start over"
        )


def _remove_staging(root: Path, local: Path) -> None:
    """Remove what the run staged (best effort: a leftover staging directory never blocks a later run)."""
    shutil.rmtree(local, ignore_errors=True)
    for name in (_RUN, _RECORD, _LOCK):
        (root / name).unlink(missing_ok=True)
    try:
        root.rmdir()  # only if empty: what else is in a --staging directory stays
    except OSError:
        pass
