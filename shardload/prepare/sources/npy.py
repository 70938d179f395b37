"""``.npy`` files, one sample per file, one field (``--field``, default ``data``)."""

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
class NpySource(SourceReader):
    kind: ClassVar[str] = "npy"
    suffixes: ClassVar[tuple[str, ...]] = (".npy",)
    one_sample_per_file: ClassVar[bool] = True

    @classmethod
    def read(cls, unit: SourceUnit, options: SourceOptions) -> Iterator[tuple[str, Sample]]:
        for path in unit.files():
            try:
                arr = np.load(path, allow_pickle=options.allow_pickle)
            except FileNotFoundError:
                raise InputError(f"{path}: file not found (was it deleted while prepare ran?)") from None
            except Exception as exc:  # noqa: BLE001  a damaged header can raise SyntaxError, TokenError, ...
                raise numpy_load_error(path, ".npy file", exc) from None
            if not isinstance(arr, np.ndarray):
                raise InputError(f"{path}: expected one array, found {type(arr).__name__}")
            yield path, {options.field: arr}
