"""WebDataset tar shards (``.tar``, ``.tar.gz``, ``.tgz``, ``.tar.bz2``, ``.tar.xz``): the members sharing a key.

A tar is read as a stream; one tar is one unit. Unsafe members (names that are absolute or hold
``..``, links, devices), truncated tars, oversized members and compressed tars whose checksum fails
are refused, never read in part. Member naming, what each extension gives (``json``/``txt`` values
convert by the rules of JSON Lines) and what is refused: docs/format.md, "WebDataset
interoperability".
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import pickle
import re
import tarfile
import zlib
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import numpy as np

from shardload.errors import InputError
from shardload.prepare.sources.arrays import load_npy, load_npz
from shardload.prepare.sources.base import Sample, SourceOptions, SourceReader, SourceUnit, record_too_large, register
from shardload.prepare.sources.jsonl import (
    NumberRangeError,
    check_tiny_numbers,
    checked_float,
    json_to_array,
    loads,
    may_mix_bools,
)

__all__ = ["WebDatasetSource", "split_member_name"]

NPY_EXTS = frozenset({"npy"})
NPZ_EXTS = frozenset({"npz"})
JSON_EXTS = frozenset({"json", "jsn"})
CLASS_EXTS = frozenset({"cls", "cls2", "class", "count", "index", "inx", "id"})
TEXT_EXTS = frozenset({"txt", "text"})
PICKLE_EXTS = frozenset({"pyd", "pickle", "pkl"})
#: members whose bytes are the field's value as they are (a ``bytes`` text field)
BYTES_EXTS = frozenset({"bin"})
KNOWN_EXTS = NPY_EXTS | NPZ_EXTS | JSON_EXTS | CLASS_EXTS | TEXT_EXTS | PICKLE_EXTS | BYTES_EXTS

# WebDataset's own patterns: key = up to the first dot of the base name; __x__ names are metadata
_KEY_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META_RE = re.compile(r"__[^/]*__($|/)")
# the header error tarfile raises at the zero block that ends an archive (not in typeshed)
_END_OF_ARCHIVE: type[Exception] = tarfile.EOFHeaderError  # type: ignore[attr-defined]


def split_member_name(name: str) -> tuple[str, str, str, bool] | None:
    """``(key, field, extension, gzipped)`` of a member name, or ``None`` if it has no suffix.

    >>> split_member_name("train/abc.tokens.npy")
    ('train/abc', 'tokens', 'npy', False)
    >>> split_member_name("abc.cls")
    ('abc', 'cls', 'cls', False)
    """
    m = _KEY_RE.match(name)
    if not m:
        return None
    key, suffix = m.group(1), m.group(2).lower()
    gz = suffix.endswith(".gz")
    if gz:
        suffix = suffix[:-3]
    stem, dot, ext = suffix.rpartition(".")
    return key, (stem if dot else ext), ext, gz


class _CheckedTarInfo(tarfile.TarInfo):
    """Remembers why tarfile stopped reading headers (tarfile treats corruption as a quiet end)."""

    @classmethod
    def fromtarfile(cls, tarfile_: tarfile.TarFile) -> _CheckedTarInfo:
        try:
            return super().fromtarfile(tarfile_)
        except tarfile.HeaderError as exc:
            tarfile_.shardload_stop = exc  # type: ignore[attr-defined]
            raise


@register
class WebDatasetSource(SourceReader):
    kind: ClassVar[str] = "webdataset"
    suffixes: ClassVar[tuple[str, ...]] = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")

    @classmethod
    def read(cls, unit: SourceUnit, options: SourceOptions) -> Iterator[tuple[str, Sample]]:
        for path in unit.files():
            yield from _read_tar(path, options)


def _read_tar(path: str, options: SourceOptions) -> Iterator[tuple[str, Sample]]:
    last = "the start"  # where reading got to, for errors about the tar itself
    done: set[str] = set()  # keys of finished samples, to catch members that are not adjacent
    key: str | None = None
    sample: dict[str, Any] = {}
    stop: tarfile.HeaderError | None = None  # why tarfile stopped: must be the end-of-archive marker
    limit = options.max_record_bytes
    try:
        stream = _open_stream(path)
    except FileNotFoundError:
        raise InputError(f"{path}: file not found (was it deleted while prepare ran?)") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        tf = tarfile.open(fileobj=stream, mode="r|", tarinfo=_CheckedTarInfo)  # noqa: SIM115  (closed below)
    except _STREAM_ERRORS as exc:
        stream.close()
        raise InputError(f"{path}: not a readable tar file ({exc}); re-create the shard") from None
    with stream, tf:
        try:
            for member in tf:
                tf.members = []  # type: ignore[attr-defined]  # a stream needs no index: keep memory flat
                name = member.name
                where = f"{path}: member {name!r}"
                _check_member(member, where)
                if not member.isreg() or _META_RE.match(name):
                    continue
                parts = split_member_name(name)
                if parts is None:
                    raise InputError(
                        f"{where}: no extension, so its sample and type are unknown "
                        "(WebDataset names members KEY.FIELD.EXT); rename or remove it"
                    )
                mkey, field, ext, gz = parts
                if mkey != key:
                    if key is not None:
                        done.add(key)
                        yield f"{path}: sample {key!r}", sample
                    if mkey in done:
                        raise InputError(
                            f"{where}: sample {mkey!r} continues after other samples; the members of a "
                            "sample must be adjacent in the tar (write it with webdataset.TarWriter)"
                        )
                    key, sample = mkey, {}
                if member.size > limit:
                    raise record_too_large(where, "the member", member.size, limit)
                fh = tf.extractfile(member)
                assert fh is not None  # a regular member
                data = fh.read()
                if gz:
                    data = _gunzip(data, where, limit)
                for fname, arr in _decode(data, field, ext, where, options):
                    if fname in sample:
                        raise InputError(
                            f"{where}: field {fname!r} of sample {mkey!r} is given twice; "
                            "each field may come from one member only"
                        )
                    sample[fname] = arr
                last = f"member {name!r}"
            stop = getattr(tf, "shardload_stop", None)
            # Read the compressed stream to its end: its checksum (gzip's CRC) is checked only there, and
            # damage in the data already read would otherwise pass.
            while stream.read(1 << 20):
                pass
        except _STREAM_ERRORS as exc:
            raise InputError(
                f"{path}: corrupt or truncated tar after {last} ({exc}); re-create or re-download the shard"
            ) from None
    if not isinstance(stop, _END_OF_ARCHIVE):
        raise InputError(
            f"{path}: the tar ends without its end-of-archive marker after {last} "
            f"({stop or 'no more data'}): truncated or corrupt; re-create or re-download the shard"
        )
    if key is not None:
        yield f"{path}: sample {key!r}", sample


#: what reading a (compressed) tar stream raises on damage
_STREAM_ERRORS = (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError)


def _open_stream(path: str) -> io.BufferedIOBase:
    """``path`` as a stream of tar bytes, decompressed by a reader that checks the checksum once read to its end
    (tarfile's own gzip stream never does)."""
    with open(path, "rb") as fh:
        magic = fh.read(6)
    stream: io.BufferedIOBase
    if magic.startswith(b"\x1f\x8b"):
        stream = gzip.GzipFile(path, "rb")
    elif magic.startswith(b"BZh"):
        stream = bz2.BZ2File(path, "rb")
    elif magic.startswith(b"\xfd7zXZ\x00"):
        stream = lzma.LZMAFile(path, "rb")  # noqa: SIM115  (the caller closes it)
    else:
        stream = open(path, "rb")  # noqa: SIM115  (the caller closes it)
    return stream


def _gunzip(data: bytes, where: str, limit: int) -> bytes:
    """A gzipped member's bytes, refusing more than ``limit`` of them (a small member can expand to any size)."""
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as gz:
            out = gz.read(limit + 1)
            if len(out) > limit:
                raise record_too_large(where, "the member once gunzipped", None, limit)
            gz.read()  # at the end: the CRC is checked
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{where}: corrupt gzip data ({exc}); re-create the shard") from None
    return out


def _check_member(member: tarfile.TarInfo, where: str) -> None:
    name = member.name
    if name.startswith("/") or ".." in name.split("/") or re.match(r"^[A-Za-z]:", name):
        raise InputError(f"{where}: unsafe member name (absolute, or with '..'); refusing to read the shard")
    if member.issym() or member.islnk():
        raise InputError(
            f"{where}: is a link to {member.linkname!r}; links are refused in WebDataset shards: store the data itself"
        )
    if not (member.isreg() or member.isdir()):
        raise InputError(f"{where}: is a device or FIFO, not a file; refusing to read the shard")


def _decode(data: bytes, field: str, ext: str, where: str, options: SourceOptions) -> list[tuple[str, Any]]:
    """The fields one member contributes to its sample."""
    if ext in NPY_EXTS:
        return [(field, load_npy(io.BytesIO(data), len(data), where, ".npy member", allow_pickle=options.allow_pickle))]
    if ext in NPZ_EXTS:
        npz = load_npz(data, where, ".npz member", allow_pickle=options.allow_pickle, limit=options.max_record_bytes)
        return list(npz.items())
    if ext in JSON_EXTS:
        try:
            text = data.decode("utf-8-sig")  # -sig: tolerate a byte-order mark
            value, checked = loads(text)
        except UnicodeDecodeError as exc:
            raise InputError(f"{where}: not valid UTF-8 (byte {exc.start + 1}); JSON members must be UTF-8") from None
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: invalid JSON ({exc.msg}, line {exc.lineno} column {exc.colno})") from None
        except RecursionError:
            raise InputError(f"{where}: JSON nested too deeply") from None
        except ValueError as exc:  # refused by loads: a key twice, a number beyond a float64
            raise InputError(f"{where}: the JSON {exc}") from None
        fields = _from_value(value, field, where, options, may_hold_bools=may_mix_bools(text), infinity_written=checked)
        if not checked:
            try:
                check_tiny_numbers(text, (arr for _, arr in fields))
            except NumberRangeError as exc:
                raise InputError(f"{where}: the JSON {exc}") from None
        return fields
    if ext in CLASS_EXTS:
        text = _text(data, where).strip()
        try:
            label = int(text)
        except ValueError:
            raise InputError(f"{where}: a .{ext} member must hold one integer, found {text[:40]!r}") from None
        return [(field, _convert(label, field, where, options))]
    if ext in BYTES_EXTS:
        return [(field, data)]
    if ext in TEXT_EXTS:
        if field not in options.dtypes:
            return [(field, _text(data, where))]
        text = _text(data, where).strip()
        try:
            number: int | float = int(text)
        except ValueError:
            try:
                number = checked_float(text)
            except NumberRangeError as exc:
                raise InputError(f"{where}: field {field!r} {exc}") from None
            except ValueError:
                raise InputError(
                    f"{where}: --dtype {field}={options.dtypes[field]} makes the .{ext} member one number, found "
                    f"{text[:40]!r}; leave the field out of --dtype to keep it as text"
                ) from None
        return [(field, _convert(number, field, where, options))]
    if ext in PICKLE_EXTS:
        if not options.allow_pickle:
            raise InputError(
                f"{where}: a pickled member; refusing to unpickle untrusted data. "
                "Store .npy members instead, or pass --allow-pickle if you trust the shard."
            )
        try:
            value = pickle.loads(data)  # the user allowed it explicitly
        except Exception as exc:  # noqa: BLE001  (unpickling can raise anything)
            raise InputError(f"{where}: cannot unpickle ({type(exc).__name__}: {exc})") from None
        return _from_value(value, field, where, options)
    raise InputError(
        f"{where}: member type .{ext} is not supported (supported: {', '.join(sorted(KNOWN_EXTS))}); "
        "convert it to .npy, or remove it from the shard"
    )


def _text(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8-sig")  # a byte-order mark (editors on Windows write one) is not text
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{where}: not valid UTF-8 (byte {exc.start + 1}); a .txt/.text member is text: fix its encoding, "
            "or name the member .bin to keep its bytes as they are"
        ) from None


def _from_value(
    value: Any, field: str, where: str, options: SourceOptions, **json: bool
) -> list[tuple[str, np.ndarray]]:
    """A decoded JSON / unpickled value: a mapping gives one field per entry, anything else one field.
    ``json``: :func:`json_to_array`'s flags."""
    if isinstance(value, Mapping):
        if not value:
            raise InputError(f"{where}: an empty object gives no fields; remove the member")
        return [(str(k), _convert(v, str(k), where, options, json)) for k, v in value.items()]
    return [(field, _convert(value, field, where, options, json))]


def _convert(
    value: Any, field: str, where: str, options: SourceOptions, json: Mapping[str, bool] | None = None
) -> np.ndarray:
    if isinstance(value, np.ndarray) and value.dtype != object:
        return value
    if isinstance(value, np.generic):
        return np.asarray(value)
    try:
        return json_to_array(value, options.dtypes.get(field), **(json or {}))
    except ValueError as exc:
        raise InputError(f"{where}: field {field!r} {exc}") from None
