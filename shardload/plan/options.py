"""Batching options: the one config object the planner takes, and its checks.

Everything here is plain data. :class:`Batching` validates itself when it is
built, so a bad option fails where the user wrote it, with a
:class:`~shardload.errors.PlanError` that says what to change, not deep inside
an epoch.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, overload

import numpy as np
from numpy.typing import NDArray

from shardload.errors import PlanError

__all__ = [
    "EVAL_STAGES",
    "MAX_COUNT",
    "MAX_PACKED_TOKENS",
    "MAX_PAD_MULTIPLE",
    "Batching",
    "ShardAssignment",
    "Stage",
    "Uneven",
    "padded_length",
]

Stage = Literal["train", "val", "test", "predict"]
Uneven = Literal["split", "pad", "drop"]
ShardAssignment = Literal["rotate", "fixed"]

#: Stages that must see every sample exactly once (no shuffling, no dropping).
EVAL_STAGES: frozenset[str] = frozenset({"val", "test", "predict"})


@overload
def padded_length(max_len: int, pad_to_multiple_of: int = 1) -> int: ...
@overload
def padded_length(max_len: NDArray[np.integer[Any]], pad_to_multiple_of: int = 1) -> NDArray[np.int64]: ...
def padded_length(max_len: int | NDArray[np.integer[Any]], pad_to_multiple_of: int = 1) -> int | NDArray[np.int64]:
    """Length a batch is padded to: ``max_len`` rounded up to a multiple.

    The one rule for it: the collate pads every row of a batch to this length,
    and the planner's token budgets, buckets and plan summaries count
    ``rows * padded_length(...)``; the ``max_tokens`` guarantee holds because
    they all call this. ``max_len`` may be an integer array, rounded
    element-wise to int64 (its entries are not checked: lengths indexes are
    checked when a set is opened); ``0`` stays ``0``.

    Raises:
        PlanError: If an int ``max_len < 0`` or ``pad_to_multiple_of < 1``.

    >>> padded_length(13, 8)
    16
    >>> padded_length(16, 8)
    16
    >>> padded_length(np.array([0, 1, 9]), 8).tolist()
    [0, 8, 16]
    """
    multiple = operator.index(pad_to_multiple_of)
    if multiple < 1:
        raise PlanError(f"padded_length: pad_to_multiple_of must be >= 1, got {multiple}")
    if isinstance(max_len, np.ndarray):
        lens = max_len.astype(np.int64, copy=False)
        rounded: NDArray[np.int64] = lens if multiple == 1 else -(-lens // multiple) * multiple
        return rounded
    max_len = operator.index(max_len)
    if max_len < 0:
        raise PlanError(f"padded_length: max_len must be >= 0, got {max_len}")
    return -(-max_len // multiple) * multiple


#: Largest row count or token budget: beyond it, counts no longer fit the planner's int64 arithmetic.
MAX_COUNT = 1 << 62
#: Largest ``pad_to_multiple_of``: every batch is at least this long, so a larger one means
#: a giant allocation per batch (and padded-token sums that overflow int64).
MAX_PAD_MULTIPLE = 1 << 20
#: Most tokens of one packed batch (``rows_per_batch * pack_length``): ``cu_seqlens`` is int32.
MAX_PACKED_TOKENS = (1 << 31) - 1


def check_packed_tokens(pack_length: int, rows_per_batch: int) -> None:
    """Refuse packed batches of more than :data:`MAX_PACKED_TOKENS` tokens (``cu_seqlens`` counts them in int32).

    The one check of it: :class:`Batching` makes it where the options are
    written, and :class:`~shardload.load.collate_packed.PackSpec` for a spec built directly.

    Raises:
        PlanError: naming both options, if their product is too large.
    """
    if pack_length * rows_per_batch > MAX_PACKED_TOKENS:
        raise PlanError(
            f"rows_per_batch * pack_length = {rows_per_batch} * {pack_length} tokens per batch is more "
            f"than cu_seqlens (int32) can count ({MAX_PACKED_TOKENS:,}); use fewer rows or shorter ones"
        )


def _positive_int(name: str, value: object, *, hint: str, limit: int = MAX_COUNT) -> int:
    """Return ``value`` as a plain int if it is an integer in ``[1, limit]``, else raise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise PlanError(f"Batching({name}={value!r}): must be an integer >= 1 (not {type(value).__name__}); {hint}")
    if value < 1:
        raise PlanError(f"Batching({name}={value}): must be >= 1; {hint}")
    if value > limit:
        raise PlanError(f"Batching({name}={value}): must be at most {limit:,}; {hint}")
    return int(value)


def _flag(name: str, value: object) -> bool:
    """Return ``value`` as a plain bool if it is one (numpy's too), else raise."""
    if not isinstance(value, (bool, np.bool_)):
        raise PlanError(f"Batching({name}={value!r}): must be True or False")
    return bool(value)


@dataclass(frozen=True)
class Batching:
    """How a rank's samples are grouped into batches.

    Set exactly one of ``batch_size`` (fixed rows per batch) or ``max_tokens``
    (a token budget that counts padding). The other options tune bucketing and
    what happens when ranks end up with different batch counts.

    Attributes:
        batch_size: Fixed number of rows per batch (the last batch of a rank
            may be smaller).
        max_tokens: Token budget per batch: ``rows * padded_length(longest row,
            pad_to_multiple_of) <= max_tokens``. A row always costs at least
            one token, so a batch never has more than ``max_tokens`` rows. A
            single sample longer than the budget gets a batch of its own.
        bucketing: Group samples of similar length to cut padding, in
            geometric length buckets (:mod:`shardload.plan.buckets`). Without
            it, batches are consecutive runs of the shuffled samples (fixed
            chunks, or a greedy fill of the budget): random lengths pad a lot.
        pad_to_multiple_of: The collate pads each batch to a multiple of this
            (e.g. 8 for tensor cores); budgets and buckets count it.
        uneven: How ranks are brought to the same batch count. ``"split"``
            (default): a rank with fewer batches splits its largest batches;
            nothing is dropped or repeated. ``"pad"``: it appends filler
            batches (one row, weight 0). ``"drop"``: every rank drops its
            trailing batches down to the smallest count (training only).
        bucket_ratio: Ratio between consecutive bucket upper bounds, in
            ``[1.01, 4]``. Smaller pads less but makes more, smaller buckets:
            1.05 pads ~2-3% on long-tailed lengths.
        max_rows: ``max_tokens`` mode: optional cap on rows per batch (short
            samples otherwise fill a batch with up to ``max_tokens`` rows).
        packing: Pack samples end to end into rows of ``pack_length`` tokens
            (instead of ``batch_size`` or ``max_tokens``): every batch is
            ``rows_per_batch`` rows, so every batch has the same shape, and
            padding is what the rows leave empty (under 1% on long-tailed
            lengths). See docs/loading.md for the packed batch.
        pack_length: ``packing``: tokens per row.
        rows_per_batch: ``packing``: rows per batch;
            ``rows_per_batch * pack_length`` is at most ``2**31 - 1``
            (``cu_seqlens`` is int32).
        pack_split: ``packing``: cut a sample longer than ``pack_length``
            into row-sized pieces, each its own document (default: such a
            sample is refused, naming it, when the loader is built).
        chunk_window: Training order for compressed (chunked) shards: shuffle
            chunks, then samples within windows of this many chunks, so that
            each chunk is decoded about once (:mod:`shardload.plan.chunks`).
            ``0``: a full shuffle. ``None`` (default): 64 for a Zarr set, 0
            otherwise. Not with ``packing``.
        chunk_rows: ``chunk_window``: value rows of the length field per
            chunk (default: the set's, from its manifest; needed for a set
            without chunks, e.g. to plan an Arrow set like its Zarr copy).

    Raises:
        PlanError: On construction, if an option is invalid.

    Examples:
        >>> Batching(max_tokens=16384, pad_to_multiple_of=8).uneven
        'split'
    """

    # metadata: the help, metavar and least value of each field's flag in `shardload plan` (cli/_flags.py)
    batch_size: int | None = field(default=None, metadata={"help": "fixed rows per batch", "metavar": "B", "min": 1})
    max_tokens: int | None = field(
        default=None,
        metadata={"help": "token budget per batch, padding included (rows x padded length)", "metavar": "T", "min": 1},
    )
    bucketing: bool = field(default=True, metadata={"help": "group samples of similar length (default: on)"})
    pad_to_multiple_of: int = field(
        default=1, metadata={"help": "pad each batch's length to a multiple of M (e.g. 8)", "metavar": "M", "min": 1}
    )
    uneven: Uneven = field(
        default="split",
        metadata={
            "help": "how ranks reach the same batch count: split big batches (default), "
            "pad with weight-0 filler, or drop (training only)"
        },
    )
    bucket_ratio: float = field(
        default=1.05,
        metadata={"help": "ratio between bucket bounds, in [1.01, 4] (default: 1.05)", "metavar": "R"},
    )
    max_rows: int | None = field(
        default=None, metadata={"help": "with --max-tokens: at most N rows per batch", "metavar": "N", "min": 1}
    )
    packing: bool = field(
        default=False,
        metadata={"help": "pack samples end to end into rows of --pack-length tokens, --rows-per-batch rows a batch"},
    )
    pack_length: int | None = field(
        default=None, metadata={"help": "with --packing: tokens per row", "metavar": "L", "min": 1}
    )
    rows_per_batch: int | None = field(
        default=None, metadata={"help": "with --packing: rows per batch", "metavar": "R", "min": 1}
    )
    pack_split: bool = field(
        default=False,
        metadata={"help": "with --packing: cut samples longer than a row into row-sized pieces (default: refuse)"},
    )
    chunk_window: int | None = field(
        default=None,
        metadata={
            "help": "training: shuffle chunks, then samples within windows of K chunks (0: full shuffle; "
            "default: 64 for a zarr set, 0 otherwise)",
            "metavar": "K",
            "min": 0,
        },
    )
    chunk_rows: int | None = field(
        default=None,
        metadata={"help": "with --chunk-window: value rows per chunk (default: the set's)", "metavar": "R", "min": 1},
    )

    def __post_init__(self) -> None:
        fixed: dict[str, object] = {
            "packing": _flag("packing", self.packing),
            "pack_split": _flag("pack_split", self.pack_split),
        }
        modes = [name for name in ("batch_size", "max_tokens") if getattr(self, name) is not None]
        if self.packing:
            modes.append("packing")
        if len(modes) != 1:
            given = {0: "neither", 2: "both"}.get(len(modes), "all three")
            if "packing" in modes and len(modes) == 2:
                given = " and ".join(modes)
            raise PlanError(
                f"Batching needs exactly one of batch_size or max_tokens, got {given} (or packing=True instead "
                "of both): use Batching(batch_size=32) for a fixed number of rows per batch, "
                "Batching(max_tokens=16384) for a token budget that counts padding, or "
                "Batching(packing=True, pack_length=4096, rows_per_batch=8) for packed rows"
            )
        if self.packing:
            fixed.update(self._packing_fields())
        else:
            for name in ("pack_length", "rows_per_batch", "pack_split"):
                if getattr(self, name) not in (None, False):
                    raise PlanError(
                        f"Batching({name}={getattr(self, name)!r}) applies to packed batches only: "
                        "add packing=True (and pack_length, rows_per_batch), or remove it"
                    )
        if self.batch_size is not None:
            fixed["batch_size"] = _positive_int(
                "batch_size", self.batch_size, hint="it is the number of rows per batch"
            )
            if self.max_rows is not None:
                raise PlanError(
                    f"Batching(max_rows={self.max_rows}) only caps token batches; "
                    "with batch_size the row count is already fixed: remove max_rows"
                )
        elif self.max_tokens is not None:
            fixed["max_tokens"] = _positive_int(
                "max_tokens", self.max_tokens, hint="it is rows * padded length per batch"
            )
            if self.max_rows is not None:
                fixed["max_rows"] = _positive_int(
                    "max_rows", self.max_rows, hint="or None for no cap on rows per batch"
                )
        fixed["pad_to_multiple_of"] = _positive_int(
            "pad_to_multiple_of",
            self.pad_to_multiple_of,
            hint="use 1 for no rounding (every batch is padded to at least this length)",
            limit=MAX_PAD_MULTIPLE,
        )
        fixed["bucketing"] = _flag("bucketing", self.bucketing)
        if self.uneven not in get_args(Uneven):
            raise PlanError(
                f"Batching(uneven={self.uneven!r}): must be one of 'split' (default, "
                "no sample lost), 'pad' (masked filler batches) or 'drop' (training only)"
            )
        ratio = self.bucket_ratio
        if (
            isinstance(ratio, bool)
            or not isinstance(ratio, (int, float, np.integer, np.floating))
            or not math.isfinite(ratio)
            or not 1.01 <= ratio <= 4.0
        ):
            raise PlanError(
                f"Batching(bucket_ratio={ratio!r}): must be a number in [1.01, 4]; "
                "1.05 pads a few percent, 1.1-1.2 makes fewer, wider buckets"
            )
        fixed["bucket_ratio"] = float(ratio)
        fixed.update(self._chunk_fields())
        for name, value in fixed.items():
            object.__setattr__(self, name, value)  # plain Python values, hashable

    def _chunk_fields(self) -> dict[str, object]:
        """The checked chunk-window fields (``None`` stays ``None``)."""
        fixed: dict[str, object] = {}
        window = self.chunk_window
        if window is not None:
            if isinstance(window, (int, np.integer)) and not isinstance(window, bool) and window == 0:
                fixed["chunk_window"] = 0  # off: a full shuffle
            else:
                fixed["chunk_window"] = _positive_int(
                    "chunk_window", window, hint="it is the number of chunks per window, e.g. 64 (0: full shuffle)"
                )
            if fixed["chunk_window"] and self.packing:
                raise PlanError(
                    f"Batching(chunk_window={window}) orders samples for batch_size or max_tokens batches; packed "
                    "rows are reordered by the packer: remove chunk_window (or set it to 0)"
                )
        if self.chunk_rows is not None:
            fixed["chunk_rows"] = _positive_int(
                "chunk_rows", self.chunk_rows, hint="it is the number of value rows per chunk of the length field"
            )
        return fixed

    def _packing_fields(self) -> dict[str, object]:
        """The checked packing fields; the options that only shape other batches are refused."""
        length = _positive_int(
            "pack_length", self.pack_length, hint="it is the number of tokens per packed row, e.g. 4096"
        )
        rows = _positive_int(
            "rows_per_batch", self.rows_per_batch, hint="it is the number of packed rows per batch, e.g. 8"
        )
        check_packed_tokens(length, rows)
        fixed: dict[str, object] = {"pack_length": length, "rows_per_batch": rows}
        others = {"max_rows": self.max_rows is not None, "bucket_ratio": self.bucket_ratio != 1.05}
        if self.pad_to_multiple_of != 1:
            raise PlanError(
                f"Batching(pad_to_multiple_of={self.pad_to_multiple_of!r}): packed rows are always pack_length "
                "long; choose pack_length as a multiple of it instead, and leave pad_to_multiple_of at 1"
            )
        wrong = [name for name, given in others.items() if given]
        if wrong:
            raise PlanError(
                f"Batching({', '.join(wrong)}) shapes bucketed or token batches, not packed rows: remove it"
            )
        return fixed

    def identity(self) -> tuple[object, ...]:
        """The options that shape the plan, as a tuple for its fingerprint.

        Plans without packing keep the fingerprint they had before packing
        existed (the same seven fields), so their saved loader states still
        resume; a packed plan is named by its own fields (``bucketing``, which
        packing ignores, is left out). ``chunk_window`` and ``chunk_rows``
        are not here: what they resolve to depends on the set, and the plan
        fingerprint and a loader state name the chunk windows a plan uses
        (:func:`shardload.plan.chunks.chunk_identity`).
        """
        return tuple(self.identity_items().values())

    def identity_items(self) -> dict[str, object]:
        """:meth:`identity` by option name (to say which option changed)."""
        names: tuple[str, ...]
        if self.packing:
            names = ("packing", "pack_length", "rows_per_batch", "pack_split", "uneven")
        else:
            names = (
                "batch_size",
                "max_tokens",
                "bucketing",
                "pad_to_multiple_of",
                "uneven",
                "bucket_ratio",
                "max_rows",
            )
        return {name: getattr(self, name) for name in names}
