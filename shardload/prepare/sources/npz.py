"""``.npz`` files, one sample per file, one field per array (named as in the file).

``np.savez(path, tokens=t, features=f)`` gives a sample with fields ``tokens``
and ``features``, in the order they were saved; arrays saved without a name
are ``arr_0``, ``arr_1``, ... as numpy names them. Many files are grouped into
one unit (``SourceOptions.files_per_unit``), as for ``.npy``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import numpy as np

from shardload.errors import InputError
from shardload.prepare.sources.base import (
    Sample,
    SourceOptions,
    SourceReader,
    SourceUnit,
    numpy_load_error,
    register,
)


@register
class NpzSource(SourceReader):
    kind: ClassVar[str] = "npz"
    suffixes: ClassVar[tuple[str, ...]] = (".npz",)
    one_sample_per_file: ClassVar[bool] = True

    @classmethod
    def read(cls, unit: SourceUnit, options: SourceOptions) -> Iterator[tuple[str, Sample]]:
        for path in unit.files():
            yield path, _load(path, options.allow_pickle)


def _load(path: str, allow_pickle: bool) -> dict[str, np.ndarray]:
    name = None
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
        if magic[:2] != b"PK":
            raise InputError(f"{path}: not an .npz file (no zip header); save samples with numpy.savez")
        with np.load(path, allow_pickle=allow_pickle) as npz:
            sample = {}
            for name in npz.files:
                sample[name] = npz[name]
    except InputError:
        raise
    except FileNotFoundError:
        raise InputError(f"{path}: file not found (was it deleted while prepare ran?)") from None
    except Exception as exc:  # noqa: BLE001  zip, zlib and .npy header damage raise many kinds
        where = f"{path}: array {name!r}" if name is not None else path
        raise numpy_load_error(where, ".npz file", exc, hint="; re-create the file") from None
    if not sample:
        raise InputError(f"{path}: the .npz file holds no arrays; every sample needs at least one field")
    return sample
