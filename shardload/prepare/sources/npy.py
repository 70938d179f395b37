"""``.npy`` files, one sample per file, one field (``--field``, default ``data``).

A file whose header does not match the bytes after it is refused (:mod:`.arrays`), never read in
part. Input rules: docs/format.md, "NumPy files".
"""

from __future__ import annotations

from typing import ClassVar

from shardload.prepare.sources.arrays import load_npy_file
from shardload.prepare.sources.base import OneSamplePerFileReader, Sample, SourceOptions, register


@register
class NpySource(OneSamplePerFileReader):
    kind: ClassVar[str] = "npy"
    suffixes: ClassVar[tuple[str, ...]] = (".npy",)

    @classmethod
    def load(cls, path: str, options: SourceOptions) -> Sample:
        return {options.field: load_npy_file(path, path, allow_pickle=options.allow_pickle)}
