"""Opening the files of a shard set safely: one place for the checks every reader needs.

The loader, ``inspect`` and ``verify`` open ``manifest.json``, the lengths
indexes and the shards through here, so a damaged or hostile set directory
cannot block a reader (a FIFO or device is refused before it is read), make it
read without bound (size caps), or pass an ``OSError`` off as corruption.
Every error is a :class:`~shardload.errors.ShardSetError` (or the subclass the
caller asks for) naming the file and what to do, with a reason code
(:func:`reason_of`) that ``verify`` reports as is.
"""

from __future__ import annotations

import errno
import os
import resource
import stat
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
from numpy.typing import NDArray

from shardload._base import envvars
from shardload._base.checks import MAX_LENGTH
from shardload._base.envvars import env_int
from shardload._base.messages import one_line
from shardload.errors import ManifestError, ShardSetError

__all__ = [
    "ENV_MAX_MANIFEST_BYTES",
    "ENV_MAX_OPEN_SHARDS",
    "MAX_INDEX_LENGTH",
    "MAX_MANIFEST_BYTES",
    "MAX_OPEN_SHARDS",
    "check_index_values",
    "check_path_encoding",
    "env_limit",
    "open_index",
    "open_index_stat",
    "open_regular",
    "read_small",
    "reason_of",
    "stat_regular",
    "tagged",
]

#: largest ``manifest.json`` read (a million shards take about 250 MB); raise with the variable below
MAX_MANIFEST_BYTES = 256 << 20
ENV_MAX_MANIFEST_BYTES = envvars.MAX_MANIFEST_BYTES
#: shards one process keeps open (mapped, with a file descriptor) before closing the least recently used
MAX_OPEN_SHARDS = 128
ENV_MAX_OPEN_SHARDS = envvars.MAX_OPEN_SHARDS
#: largest length a lengths index may hold for one sample: the planner's bound (keeps sums in int64)
MAX_INDEX_LENGTH = MAX_LENGTH

_CHUNK = 1 << 22
_MAX_NPY_HEADER = 1 << 16
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, for a message: ``"a FIFO (named pipe)"``, ``"a directory"``, ..."""
    return next((name for test, name in _KINDS if test(mode)), f"a special file (mode {mode:o})")


def reason_of(exc: BaseException) -> str:
    """The reason code of an error raised here.

    One of ``missing``, ``outside_set``, ``unreadable``, ``lengths_mismatch`` (the
    codes of :mod:`shardload.sets.verify`) or ``fd_limit`` (out of file descriptors).
    """
    reason = getattr(exc, "shardload_reason", "unreadable")
    return reason if isinstance(reason, str) else "unreadable"


def os_level(exc: BaseException) -> bool:
    """Whether an error raised here came from the operating system, not from what a file holds.

    Such a file's bytes may be fine, so a read after fixing the cause may
    succeed; a missing file (nothing to read again) is not counted.
    """
    return getattr(exc, "shardload_errno", None) is not None and reason_of(exc) not in ("missing", "fd_limit")


def tagged(cls: type[ShardSetError], message: str, reason: str) -> ShardSetError:
    """``cls(message)`` carrying ``reason`` (see :func:`reason_of`)."""
    exc = cls(message)
    exc.shardload_reason = reason  # type: ignore[attr-defined]  # read back by reason_of()
    return exc


def env_limit(name: str, default: int) -> int:
    """A positive integer from environment variable ``name``, else ``default``."""
    return env_int(name, default, error=ShardSetError)


def os_error(
    exc: OSError, path: Path, *, what: str, error: type[ShardSetError], missing: ShardSetError | None = None
) -> ShardSetError:
    """The :class:`ShardSetError` that says what ``exc`` (raised opening ``path``) means for the user."""
    where = f"{what} ({path})"
    code = exc.errno
    if code in (errno.ENOENT, errno.ENOTDIR):
        if missing is not None:
            missing.shardload_reason = "missing"  # type: ignore[attr-defined]
            err = missing
        else:
            how = "does not exist" if code == errno.ENOENT else "is missing: a directory on its path is a file"
            err = tagged(error, f"{where} {how}; re-run prepare for this shard set", "missing")
    elif code in (errno.EACCES, errno.EPERM):
        err = tagged(
            error,
            f"{where} cannot be read: permission denied. Fix its permissions (e.g. `chmod a+r` on it, and "
            "`chmod a+x` on its directories) for the user running this job; the shard set itself is not damaged.",
            "unreadable",
        )
    elif code in (errno.EMFILE, errno.ENFILE):
        err = tagged(error, f"cannot open {where}: {fd_limit_hint(code)}", "fd_limit")
    elif code == errno.ENAMETOOLONG:
        err = tagged(
            error,
            f"{where}: the path is too long for the file system ({exc.strerror}); move the shard set to a "
            "shorter path, or re-run prepare if the manifest names such a file",
            "unreadable",
        )
    elif code == errno.ELOOP:
        err = tagged(error, f"{where}: a loop of symbolic links; fix the links or re-run prepare", "unreadable")
    else:
        err = tagged(error, f"{where} cannot be read ({exc.strerror or exc}); check the disk and re-run", "unreadable")
    err.shardload_errno = exc.errno  # type: ignore[attr-defined]  # read back by os_level()
    return err


def fd_limit_hint(code: int = errno.EMFILE) -> str:
    """What to do about running out of file descriptors (no fault of the shard set)."""
    if code == errno.ENFILE:
        return (
            "the system-wide table of open files is full (ENFILE). Close other programs or raise fs.file-max; "
            "nothing is wrong with the shard set."
        )
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError:
        used = -1
    now = f"{used} open of a limit of {soft}" if used >= 0 else f"a limit of {soft}"
    return (
        f"too many open files in this process (EMFILE: {now}). Raise the limit (`ulimit -n 65536` in the shell "
        f"that starts the job), or lower {ENV_MAX_OPEN_SHARDS} (shards kept open per process); nothing is wrong "
        "with the shard set."
    )


def _encodable(path: Path, *, what: str, error: type[ShardSetError]) -> None:
    try:
        os.fsencode(path)
    except UnicodeEncodeError:
        raise tagged(
            error,
            f"{what} ({path!s:.200}): the path holds characters no file name can have; re-run prepare",
            "unreadable",
        ) from None


def check_path_encoding(path: Path, *, what: str, shard_format: str) -> None:
    """Refuse, naming the fix, a path pyarrow cannot open: it takes file names as UTF-8 only.

    Python keeps a non-UTF-8 file name as lone surrogates; pyarrow cannot encode
    them and its error would read as a damaged shard.
    """
    if shard_format != "arrow":
        return
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        raise tagged(
            ShardSetError,
            f"{what} ({path!s}): its path is not valid UTF-8, and pyarrow opens UTF-8 paths only; rename the shard "
            "set's directory (or a directory above it) to a UTF-8 name",
            "unreadable",
        ) from None


def open_regular(
    path: Path, *, what: str, error: type[ShardSetError] = ShardSetError, missing: ShardSetError | None = None
) -> tuple[int, os.stat_result]:
    """``(fd, fstat)`` of ``path`` opened for reading if, and only if, it is a regular file; the caller closes ``fd``.

    The open is non-blocking (a FIFO without a writer returns at once) and the
    type comes from ``fstat`` of that descriptor, so what is checked is what is
    read. ``what`` names the file in messages (``"shard 3"``); ``missing`` is
    raised as is when the file does not exist.
    """
    _encodable(path, what=what, error=error)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise os_error(exc, path, what=what, error=error, missing=missing) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = file_kind(st.st_mode)
            raise tagged(
                error,
                f"{what} ({path}) is {kind}, not a regular file; refusing to read it (it could block or never end). "
                "Put back the file prepare wrote, or re-run prepare.",
                "unreadable",
            )
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def stat_regular(
    path: Path, *, what: str, error: type[ShardSetError] = ShardSetError, missing: ShardSetError | None = None
) -> os.stat_result:
    """``fstat`` of ``path`` once :func:`open_regular` accepts it (the file is closed again)."""
    fd, st = open_regular(path, what=what, error=error, missing=missing)
    os.close(fd)
    return st


def read_small(
    path: Path,
    *,
    what: str,
    limit: int,
    env: str,
    error: type[ShardSetError] = ShardSetError,
    missing: ShardSetError | None = None,
) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (raise it with environment variable ``env``)."""
    fd, st = open_regular(path, what=what, error=error, missing=missing)
    with open(fd, "rb") as fh:
        if st.st_size > limit:
            data = b""
        else:
            try:
                # fstat's size (+1: a file that grew since is still caught), not the cap: read(n) allocates n
                data = fh.read(st.st_size + 1)
            except OSError as exc:
                raise os_error(exc, path, what=what, error=error) from None
    if st.st_size > limit or len(data) > limit:
        raise tagged(
            error,
            f"{what} ({path}) is {max(st.st_size, len(data)):,} bytes, more than the {limit:,} bytes this "
            f"shardload reads; if the file is genuine, raise the cap with {env}=<bytes>",
            "unreadable",
        )
    return data


def open_index(
    path: Path, *, what: str, samples: int, error: type[ShardSetError] = ShardSetError
) -> NDArray[np.integer[Any]]:
    """Memory-map a lengths index; :func:`open_index_stat` without the ``fstat``."""
    return open_index_stat(path, what=what, samples=samples, error=error)[0]


def open_index_stat(
    path: Path, *, what: str, samples: int, error: type[ShardSetError] = ShardSetError
) -> tuple[NDArray[np.integer[Any]], os.stat_result]:
    """Memory-map a lengths index (``.npy``, one integer per sample) after checking its header.

    Refused: anything but a regular file, a header that is not a plain 1-D
    array of ``samples`` integers (no pickle, no structured or object dtype,
    no other shape), and a file whose size is not exactly header plus data.
    Any byte order is read correctly. The values are checked by
    :func:`check_index_values`; the ``fstat`` returned is of the file mapped
    (for :func:`shardload._base.identity.file_stamp`).
    """
    missing = tagged(error, f"{path}: {what} is missing; re-run prepare", "missing")
    fd, st = open_regular(path, what=what, error=error, missing=missing)
    with open(fd, "rb") as fh:
        try:
            version = np.lib.format.read_magic(fh)
            # numpy reads the header length it is told before it checks it: check it first
            size_bytes = 2 if version == (1, 0) else 4
            header_len = int.from_bytes(fh.read(size_bytes), "little")
            if header_len > _MAX_NPY_HEADER:
                raise ValueError(f"a header of {header_len} bytes, more than a .npy index ever has")
            fh.seek(-size_bytes, os.SEEK_CUR)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
            elif version in ((2, 0), (3, 0)):
                shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
            else:
                raise ValueError(f"unknown .npy version {version}")
            offset = fh.tell()
        except (ValueError, OSError, EOFError, SyntaxError, TypeError) as exc:
            raise tagged(
                error, f"{path}: {what} is unreadable (not a valid .npy file: {exc}); re-run prepare", "unreadable"
            ) from None
        if dtype.kind not in "iu" or dtype.fields is not None or dtype.subdtype is not None:
            # object (pickled), float, bool, structured: never what prepare writes, never loaded
            raise tagged(
                error,
                f"{path}: {what} is unreadable: it holds {dtype} values, not integers; re-run prepare",
                "unreadable" if dtype.hasobject else "lengths_mismatch",
            )
        if shape != (samples,):
            raise tagged(
                error,
                f"{path}: {what} holds {tuple(shape)} {dtype}, expected {samples} integers; re-run prepare",
                "lengths_mismatch",
            )
        expected = offset + samples * dtype.itemsize
        if st.st_size != expected:
            raise tagged(
                error,
                f"{path}: {what} is {st.st_size} bytes, a .npy of {samples} {dtype} is {expected}: truncated or "
                "damaged; re-run prepare",
                "unreadable",
            )
        if samples == 0:
            return np.zeros(0, dtype=dtype), st
        try:
            arr: NDArray[np.integer[Any]] = np.memmap(fh, dtype=dtype, mode="r", offset=offset, shape=(samples,))
        except OSError as exc:
            raise os_error(exc, path, what=what, error=error) from None
        except ValueError as exc:
            raise tagged(error, f"{what} ({path}) cannot be mapped ({exc}); re-run prepare", "unreadable") from None
        return arr, st


def check_index_values(
    arr: NDArray[np.integer[Any]],
    path: Path,
    *,
    what: str,
    total: int | None = None,
    error: type[ShardSetError] = ShardSetError,
) -> None:
    """Every length in ``[0, MAX_INDEX_LENGTH]`` and, given ``total``, their sum equal to it.

    Reads the index in chunks (no temporary larger than a few MB), once per
    process: about 0.1 s per 100 M int32 lengths. Catches uint64 values that
    would wrap negative in int64, negative values, and narrow integers that
    wrapped when written (their sum no longer matches the manifest).
    """
    running = 0
    for lo in range(0, len(arr), _CHUNK):
        chunk = arr[lo : lo + _CHUNK]
        low, high = int(chunk.min()), int(chunk.max())
        if low < 0 or high > MAX_INDEX_LENGTH:
            bad = lo + int(np.argmin(chunk) if low < 0 else np.argmax(chunk))
            raise tagged(
                error,
                f"{what} ({path}) says sample {bad} has length {int(arr[bad])}, outside [0, {MAX_INDEX_LENGTH}]: "
                "the index is damaged (or was written with too narrow an integer type); re-run prepare",
                "lengths_mismatch",
            )
        running += int(chunk.sum(dtype=np.int64))  # at most 2**22 values of at most 2**40: no int64 overflow
    if total is not None and running != total:
        raise tagged(
            error,
            f"{what} ({path}) sums to {running} tokens, the manifest says {total}: the index is damaged (or was "
            "written with too narrow an integer type); re-run prepare",
            "lengths_mismatch",
        )


#: bounds on a file name in the manifest (bytes): of one path component, and of the whole relative path
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 1024


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
    """``root / relative``, refusing a path that a symbolic link leads out of ``root`` (:class:`ShardSetError`).

    ``relative`` has passed :func:`safe_relative_path`; this catches the other
    way out, a link (the file or a directory on the way) that points elsewhere.
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
