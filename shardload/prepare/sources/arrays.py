"""Reading numpy's own files (``.npy`` arrays, ``.npz`` archives) as sources do, files and tar members alike.

``numpy.load`` is lenient where a data loader must not be: it ignores bytes
after the array (a second array saved into the same file is silently lost),
allocates what a damaged header declares before finding the data missing,
calls a text file "pickled data", and gives one array for two ``.npz``
members whose names differ only by ``.npy`` (``x`` and ``x.npy``). These
readers check the header against the bytes that are there before reading, and
the names of an archive's members before reading any.
"""

from __future__ import annotations

import io
import math
import os
import zipfile
from typing import IO

import numpy as np

from shardload.errors import InputError
from shardload.prepare.sources.base import numpy_load_error, record_too_large

__all__ = ["load_npy", "load_npz"]

NPY_MAGIC = b"\x93NUMPY"


def load_npy(fh: IO[bytes], size: int, where: str, what: str, *, allow_pickle: bool) -> np.ndarray:
    """The one array of an ``.npy`` stream ``fh`` of ``size`` bytes (seekable, at its start).

    Raises:
        InputError: not an ``.npy``, a header that does not match the bytes after it, damage, or a pickle.
    """
    try:
        head = fh.read(len(NPY_MAGIC))
        if head != NPY_MAGIC:
            raise InputError(f"{where}: not an {what} ({_looks_like(head)})")
        fh.seek(0)
        version = np.lib.format.read_magic(fh)
        # version 3.0 differs from 2.0 only in the encoding of structured dtypes' field names (not supported)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(fh)
        if dtype.hasobject:  # a pickled array: its size is known only once unpickled
            fh.seek(0)
            arr = np.lib.format.read_array(fh, allow_pickle=allow_pickle)
        else:
            data = size - fh.tell()
            declared = math.prod(shape) * dtype.itemsize
            if declared != data:
                raise InputError(
                    f"{where}: the {what}'s header declares {dtype} {list(shape)} ({declared:,} bytes), but "
                    f"{data:,} bytes follow it: "
                    + (
                        "truncated or corrupt; re-create the file"
                        if declared > data
                        else "more than one array was saved into it, or it is corrupt; save one array per file"
                    )
                )
            body = fh.read(declared)
            if len(body) != declared:
                raise InputError(f"{where}: the {what} ends after {len(body):,} of its {declared:,} bytes of data")
            arr = np.frombuffer(body, dtype=dtype).reshape(shape, order="F" if fortran else "C")
        if fh.read(1):  # reading to the end also makes a zip member check its CRC
            raise InputError(f"{where}: bytes follow the array of the {what}; save one array per file")
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001  a damaged header is parsed as Python and can raise anything
        raise numpy_load_error(where, what, exc) from None
    if not isinstance(arr, np.ndarray):
        raise InputError(f"{where}: expected an array, found {type(arr).__name__}")
    return arr


def _looks_like(head: bytes) -> str:
    if head.startswith(b"PK"):
        return "it is a zip archive: an .npz? read it with --source-format npz"
    if not head:
        return "it is empty"
    return f"it starts with {head!r}, not numpy's {NPY_MAGIC!r}: save it with numpy.save"


def load_npz(source: str | bytes, where: str, what: str, *, allow_pickle: bool, limit: int) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file (path) or member (bytes), named as ``numpy.savez`` named them.

    Raises:
        InputError: a member that is not an ``.npy`` array of at most ``limit`` bytes, or two that give one name.
    """
    name = None
    try:
        with zipfile.ZipFile(io.BytesIO(source) if isinstance(source, bytes) else source) as zf:
            members: dict[str, zipfile.ZipInfo] = {}
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    raise InputError(
                        f"{where}: member {info.filename!r} is not an .npy array (numpy.savez writes only "
                        f".npy members); remove it from the archive"
                    )
                name = info.filename[: -len(".npy")]
                if name in members:
                    raise InputError(
                        f"{where}: two members give the array {name!r} ({members[name].filename!r} and "
                        f"{info.filename!r}); one would be lost. Save the arrays under distinct names."
                    )
                if info.file_size > limit:
                    raise record_too_large(f"{where}: array {name!r}", "the array", info.file_size, limit)
                members[name] = info
            name = None
            sample = {}
            for name, info in members.items():
                with zf.open(info) as fh:
                    sample[name] = load_npy(
                        fh, info.file_size, f"{where}: array {name!r}", what, allow_pickle=allow_pickle
                    )
    except InputError:
        raise
    except FileNotFoundError:
        raise InputError(f"{where}: file not found (was it deleted while prepare ran?)") from None
    except Exception as exc:  # noqa: BLE001  zip and zlib damage raise many kinds
        at = f"{where}: array {name!r}" if name is not None else where
        raise numpy_load_error(at, what, exc, hint="; re-create the file") from None
    if not sample:
        raise InputError(f"{where}: the {what} holds no arrays; every sample needs at least one field")
    return sample


def load_npy_file(path: str, where: str, *, allow_pickle: bool) -> np.ndarray:
    """:func:`load_npy` of the file at ``path``."""
    try:
        with open(path, "rb") as fh:
            return load_npy(fh, os.fstat(fh.fileno()).st_size, where, ".npy file", allow_pickle=allow_pickle)
    except FileNotFoundError:
        raise InputError(f"{path}: file not found (was it deleted while prepare ran?)") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
