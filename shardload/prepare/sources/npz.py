"""``.npz`` files, one sample per file, one field per array (named as in the file).

``np.savez(path, tokens=t, features=f)`` gives a sample with fields ``tokens``
and ``features``, in the order they were saved; arrays saved without a name
are ``arr_0``, ``arr_1``, ... as numpy names them. Many files are grouped into
one unit (``SourceOptions.files_per_unit``), as for ``.npy``.

Every member of the archive must be an ``.npy`` array; two members that give
one name (``x`` and ``x.npy``, or one name twice) are refused, as is an array
larger than ``SourceOptions.max_record_bytes`` once decompressed
(:mod:`.arrays`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import numpy as np

from shardload.errors import InputError
from shardload.prepare.sources.arrays import load_npz
from shardload.prepare.sources.base import Sample, SourceOptions, SourceReader, SourceUnit, register


@register
class NpzSource(SourceReader):
    kind: ClassVar[str] = "npz"
    suffixes: ClassVar[tuple[str, ...]] = (".npz",)
    one_sample_per_file: ClassVar[bool] = True

    @classmethod
    def read(cls, unit: SourceUnit, options: SourceOptions) -> Iterator[tuple[str, Sample]]:
        for path in unit.files():
            yield path, _load(path, options)


def _load(path: str, options: SourceOptions) -> dict[str, np.ndarray]:
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except FileNotFoundError:
        raise InputError(f"{path}: file not found (was it deleted while prepare ran?)") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if magic[:2] != b"PK":
        raise InputError(f"{path}: not an .npz file (no zip header); save samples with numpy.savez")
    return load_npz(path, path, ".npz file", allow_pickle=options.allow_pickle, limit=options.max_record_bytes)
