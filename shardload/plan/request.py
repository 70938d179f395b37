"""What the planner is asked: the data it plans over (:class:`PlanInputs`) and the epoch (:class:`EpochSpec`).

A plan is a pure function of these two and :class:`~shardload.plan.Batching`,
each checked once where it is built. :class:`PlanInputs` is built once per
shard set (:meth:`shardload.ShardSet.plan_inputs`), an :class:`EpochSpec` once
per loader and re-made per epoch with :meth:`EpochSpec.at_epoch`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, get_args

import numpy as np
from numpy.typing import NDArray

from shardload._base.checks import MAX_EPOCH, MAX_SEED, MAX_WORLD_SIZE, check_arrays, check_scalar
from shardload._base.ranges import offsets_from_lengths
from shardload.errors import PlanError
from shardload.plan.options import EVAL_STAGES, MAX_COUNT, Batching, ShardAssignment, Stage

__all__ = ["MEMO_ENTRIES", "EpochSpec", "PlanInputs", "check_request", "digest_lengths", "memo_has", "memo_in"]

#: results :meth:`PlanInputs.memo` keeps per inputs (a few epochs' worth of stages, and a run's probe epochs)
MEMO_ENTRIES = 16


def memo_in(owner: object, key: Hashable, compute: Callable[[], NDArray[np.int64]]) -> NDArray[np.int64]:
    """``compute()``, kept in ``owner`` (a frozen inputs object) under ``key``: the :data:`MEMO_ENTRIES` keys used last."""
    cache: dict[Hashable, NDArray[np.int64]] = owner.__dict__.setdefault("_memo", {})
    if key in cache:  # kept longest when used most recently (a run's steps stay while epochs come and go)
        cache[key] = cache.pop(key)
    else:
        if len(cache) >= MEMO_ENTRIES:
            cache.pop(next(iter(cache)))
        value = compute()
        value.setflags(write=False)
        cache[key] = value
    return cache[key]


def memo_has(owner: object, key: Hashable) -> bool:
    """Whether :func:`memo_in` keeps a result under ``key`` in ``owner`` (without using it)."""
    return key in owner.__dict__.get("_memo", {})


@dataclass(frozen=True)
class EpochSpec:
    """Which epoch of which stage is planned, and for how many ranks.

    The rank itself is not part of it: every rank plans from the same
    :class:`EpochSpec` and gets the same batch count.

    Attributes:
        world_size: Number of ranks (``1 .. 2**20``).
        stage: ``"train"`` shuffles per (seed, epoch); ``"val"``, ``"test"``
            and ``"predict"`` keep a fixed order, independent of ``seed``,
            ``epoch`` and ``shard_assignment``, and see every sample once.
        seed: Run seed (``0 .. 2**64 - 1``).
        epoch: Epoch number (``>= 0``).
        shard_assignment: ``"rotate"``: training lays shards out in a new
            seeded order every epoch, so ranks see different shards;
            ``"fixed"``: natural order (evaluation always uses it).

    Raises:
        PlanError: On construction, naming the bad field and its allowed values.

    Examples:
        >>> spec = EpochSpec(world_size=4, seed=7)
        >>> spec.at_epoch(3).epoch, spec.shuffled
        (3, True)
    """

    world_size: int = field(metadata={"help": "number of ranks", "metavar": "W", "min": 1})
    stage: Stage = field(
        default="train", metadata={"help": "training shuffles; evaluation stages keep every sample exactly once"}
    )
    seed: int = field(default=0, metadata={"help": "run seed (default: 0)", "metavar": "S", "min": 0})
    epoch: int = field(default=0, metadata={"help": "epoch to plan (default: 0)", "metavar": "E", "min": 0})
    shard_assignment: ShardAssignment = field(
        default="rotate",
        metadata={"help": "rotate: new shard order each training epoch (default); fixed: natural order"},
    )

    def __post_init__(self) -> None:
        if self.stage not in get_args(Stage):
            raise PlanError(f"stage={self.stage!r}: must be one of {', '.join(get_args(Stage))}")
        if self.shard_assignment not in get_args(ShardAssignment):
            raise PlanError(f"shard_assignment={self.shard_assignment!r}: must be 'rotate' or 'fixed'")
        fixed = {
            "world_size": check_scalar("world_size", self.world_size, low=1, high=MAX_WORLD_SIZE),
            "seed": check_scalar("seed", self.seed, low=0, high=MAX_SEED),
            "epoch": check_scalar("epoch", self.epoch, low=0, high=MAX_EPOCH),
        }
        for name, value in fixed.items():
            object.__setattr__(self, name, value)  # plain ints: hashable, JSON-ready

    @property
    def shuffled(self) -> bool:
        """Whether this stage shuffles (training only)."""
        return self.stage == "train"

    def at_epoch(self, epoch: int) -> EpochSpec:
        """The same request for another epoch (checked like the constructor)."""
        return dataclasses.replace(self, epoch=epoch)

    def identity(self) -> dict[str, Any]:
        """What the plan depends on: evaluation ignores seed, epoch and shard assignment.

        Two specs with the same identity give the same plans (for the same
        inputs and batching); it goes into the plan fingerprint.
        """
        train = self.shuffled
        return {
            "world_size": self.world_size,
            "stage": self.stage,
            "seed": self.seed if train else 0,
            "epoch": self.epoch if train else 0,
            "shard_assignment": self.shard_assignment if train else "fixed",
        }


def check_request(spec: object, batching: object) -> None:
    """Check that ``spec`` and ``batching`` are the planner's types and fit together.

    Raises:
        PlanError: If either is of the wrong type, or ``uneven="drop"`` is
            asked for an evaluation stage (which must see every sample once).
    """
    if not isinstance(spec, EpochSpec):
        raise PlanError(
            f"spec must be a shardload.plan.EpochSpec, got {type(spec).__name__}: e.g. EpochSpec(world_size=8)"
        )
    if not isinstance(batching, Batching):
        raise PlanError(
            f"batching must be a shardload.plan.Batching, got {type(batching).__name__}: "
            "e.g. Batching(batch_size=32) or Batching(max_tokens=16384)"
        )
    if spec.stage in EVAL_STAGES and batching.uneven == "drop":
        raise PlanError(
            f"Batching(uneven='drop') would lose samples in stage {spec.stage!r}, which must "
            "see every sample once: use uneven='split' (default) or 'pad' for evaluation"
        )


#: samples summed at once for the tokens per shard (bounds the int64 copy)
_SUM_CHUNK = 1 << 22


@dataclass(frozen=True, eq=False, repr=False)
class PlanInputs:
    """The planner's view of a shard set: per-sample lengths and samples per shard.

    Checked once when built; the lengths are not copied (a memory map stays
    one) and are read once, for their minimum and maximum.

    Attributes:
        lengths: ``(N,)`` batching length of every sample, global sample ids
            in shard order; any integer dtype, values in ``[0, 2**40]``.
        shard_sizes: ``(S,)`` samples per shard (int64; empty shards allowed);
            they add up to ``N``.
        digest: A string naming the content of ``lengths``, the same on every
            rank; it goes into the plan fingerprint. ``None`` when built:
            :func:`digest_lengths` of the lengths (hashing costs ~0.25 s per
            100M int32 lengths; a shard set passes its manifest fingerprint).
        max_length: The longest length (0 when ``N == 0``), set when built.
        chunk_rows: Value rows of the length field per stored chunk (a Zarr
            set's, from its manifest), ``None`` for a set without chunks: what
            ``Batching.chunk_window`` groups samples by (:mod:`shardload.plan.chunks`).

    Raises:
        PlanError: On construction, if the arrays are not a valid index.

    Examples:
        >>> inputs = PlanInputs(np.array([3, 8, 5, 1]), np.array([4]))
        >>> inputs.num_samples, inputs.max_length
        (4, 8)
    """

    lengths: NDArray[np.integer]
    shard_sizes: NDArray[np.int64]
    digest: str = None  # type: ignore[assignment]  # None when built: computed from the lengths
    max_length: int = field(default=0, init=False)
    chunk_rows: int | None = None

    def __post_init__(self) -> None:
        lengths, sizes, max_length = check_arrays(self.lengths, self.shard_sizes)
        if self.digest is not None and not isinstance(self.digest, str):
            raise PlanError(f"PlanInputs(digest={self.digest!r}): must be a str (or None to hash the lengths)")
        object.__setattr__(self, "lengths", lengths)
        object.__setattr__(self, "shard_sizes", sizes)
        object.__setattr__(self, "max_length", max_length)
        if self.chunk_rows is not None:
            object.__setattr__(self, "chunk_rows", check_scalar("chunk_rows", self.chunk_rows, low=1, high=MAX_COUNT))
        if self.digest is None:
            object.__setattr__(self, "digest", digest_lengths(lengths))

    def __repr__(self) -> str:
        return (
            f"PlanInputs(num_samples={self.num_samples}, num_shards={self.num_shards}, "
            f"max_length={self.max_length}, digest={self.digest[:12]!r}, chunk_rows={self.chunk_rows})"
        )

    @property
    def shard_tokens(self) -> NDArray[np.int64]:
        """``(S,)`` tokens per shard (sum of its lengths), computed once (one pass over the lengths)."""
        cached: NDArray[np.int64] | None = self.__dict__.get("_shard_tokens")
        if cached is None:
            bounds = offsets_from_lengths(self.shard_sizes)  # (S + 1,) sample offsets of the shards
            prefix = np.zeros(len(bounds), dtype=np.int64)  # tokens before each offset
            carry = 0
            for lo in range(0, self.num_samples, _SUM_CHUNK):  # an int64 copy of a chunk, not of N
                hi = min(lo + _SUM_CHUNK, self.num_samples)
                sums = np.cumsum(self.lengths[lo:hi], dtype=np.int64)
                first = np.searchsorted(bounds, lo + 1, side="left")  # the offsets in (lo, hi]
                last = np.searchsorted(bounds, hi, side="right")
                prefix[first:last] = carry + sums[bounds[first:last] - lo - 1]
                carry += int(sums[-1])
            cached = np.diff(prefix)
            object.__setattr__(self, "_shard_tokens", cached)
        return cached

    def memo(self, key: Hashable, compute: Callable[[], NDArray[np.int64]]) -> NDArray[np.int64]:
        """``compute()``, kept with these inputs under ``key`` (the last few keys only).

        For results that are a pure function of the inputs and ``key`` and
        costly to recompute every epoch (the packed batch counts of an
        evaluation stage, whose layout never changes). The array is returned
        read-only.
        """
        return memo_in(self, key, compute)

    @property
    def num_samples(self) -> int:
        """``N``: the number of samples."""
        return len(self.lengths)

    @property
    def num_shards(self) -> int:
        """``S``: the number of shards."""
        return len(self.shard_sizes)


def digest_lengths(lengths: NDArray[np.integer]) -> str:
    """Hex digest of a lengths index (its dtype and bytes), read in chunks."""
    digest = hashlib.sha1(usedforsecurity=False)
    digest.update(f"{lengths.dtype.str}:{len(lengths)}:".encode())
    for lo in range(0, len(lengths), 1 << 24):
        digest.update(np.ascontiguousarray(lengths[lo : lo + (1 << 24)]).data.cast("B"))
    return digest.hexdigest()
