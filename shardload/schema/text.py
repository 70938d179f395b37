"""Text fields: one ``str`` or ``bytes`` value per sample, stored as its bytes.

Where it sits: :class:`shardload.schema.fields.Schema` infers and checks text
fields with :func:`text_kind` and :func:`text_to_array` when ``prepare``
reads samples; shards store a text field's bytes with per-sample offsets
(like a variable ``uint8`` field, as Arrow ``large_string``/``large_binary``);
:func:`decode_text` turns one sample's bytes back into ``str``/``bytes`` for
``ds[i]`` and for the lists batches hold.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from shardload.errors import CorruptShardError, InputError


class Field(Protocol):
    """What this module reads of a :class:`~shardload.schema.fields.Field` (which imports this module)."""

    @property
    def name(self) -> str: ...

    @property
    def dtype(self) -> str: ...

    @property
    def text(self) -> bool: ...


#: dtypes of a text field: one Python ``str`` (stored as UTF-8) or ``bytes`` value per sample
TEXT_DTYPES = ("str", "bytes")
#: the numpy dtype a text field's values (its bytes) are stored as
TEXT_STORAGE = np.dtype(np.uint8)


def text_kind(value: Any) -> str | None:
    """The text dtype of a field value (``"str"`` or ``"bytes"``), or ``None`` for any other value."""
    if isinstance(value, str):
        return "str"
    if isinstance(value, bytes):
        return "bytes"
    return None


def text_to_array(f: Field, value: Any, kind: str | None, where: str) -> np.ndarray:
    """A text field's value as its stored ``uint8`` bytes; refuses a value of another kind, or bad text.

    Raises:
        InputError: naming ``where`` and the field: a number where earlier
            samples had text (or the reverse), ``bytes`` in a ``str`` field (or
            the reverse), a ``str`` that cannot be UTF-8 (a lone surrogate).
    """
    if kind != f.dtype:
        found = f"{kind} ({type(value).__name__})" if kind is not None else _describe(value)
        was = "text" if f.text else "arrays"
        raise InputError(
            f"{where}: field {f.name!r} holds {found}, but earlier samples have {f.dtype} ({was}); a field holds "
            "one kind of value in every sample: convert the value in the source, or drop the field"
        )
    if isinstance(value, str):
        try:
            raw = value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InputError(
                f"{where}: field {f.name!r} is not valid Unicode text ({exc.reason} at character {exc.start}); "
                "fix the text, or store it as bytes"
            ) from None
    else:
        raw = bytes(value)
    return np.frombuffer(raw, dtype=TEXT_STORAGE)


def _describe(value: Any) -> str:
    """What a non-text value is, in the words of a message: ``a number (int64)``, ``None (no value)``."""
    if value is None:
        return "None (no value)"
    if isinstance(value, (np.ndarray, np.generic)):
        arr = np.asarray(value)
        if arr.ndim == 0:
            return f"a number ({arr.dtype})"
        return f"an array ({arr.dtype}, shape {list(arr.shape)})"
    return f"a {type(value).__name__}"


def decode_text(f: Field, values: np.ndarray, where: str) -> str | bytes:
    """Text field ``f``'s value from its stored bytes (one sample's ``uint8`` values).

    The one decoding of text read from a shard, for ``ds[i]`` and for batches.

    Raises:
        CorruptShardError: a ``str`` field's bytes are not UTF-8 (prepare never writes such).
    """
    raw = values.tobytes()
    if f.dtype == "bytes":
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptShardError(
            f"{where}: text field {f.name!r} is not valid UTF-8 (byte {exc.start}); prepare writes only UTF-8, so "
            "the shard is damaged: run `shardload verify` and re-run prepare"
        ) from None
