"""``.npz`` files, one sample per file, one field per array, in the order saved.

What is refused is checked in :func:`.arrays.load_npz`. Input rules: docs/format.md, "NumPy files".
"""

from __future__ import annotations

from typing import ClassVar

from shardload.errors import InputError
from shardload.prepare.sources.arrays import load_npz
from shardload.prepare.sources.base import OneSamplePerFileReader, Sample, SourceOptions, register


@register
class NpzSource(OneSamplePerFileReader):
    kind: ClassVar[str] = "npz"
    suffixes: ClassVar[tuple[str, ...]] = (".npz",)

    @classmethod
    def load(cls, path: str, options: SourceOptions) -> Sample:
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
