"""Elastic resume: the rest of an epoch after parts of it ran on other world sizes.

A plan is a pure function of (inputs, spec, batching), so what a run consumed
before it stopped can be recomputed exactly. :class:`ResumeInputs` is the
planner's request for the rest, a selection step before assignment (beside a
mixture's), planned by the same :class:`~shardload.plan.EpochPlanner`::

    ResumeInputs(base, history=((W1, k1), (W2, k2), ...))
       |  select     the epoch's uses: every sample once (a mixture: its selected uses)
       |  replay     segment i: plan what is left for W_i, take the real entries of its first k_i batches
       |  subtract   uses - consumed -> the remainder, in shard order (one bincount)
       v
    derived PlanInputs / MixInputs (one shard per base shard; a consumed shard is empty) -> EpochPlanner
       -> RankPlan in the base id space (Rest.globalise maps ids and starts back)

An entry is one use of a sample. With ``pack_split`` a sample whose pieces
are all left stays one entry (the packer cuts it again, alike); a partly
consumed one leaves its other pieces, ``(sample, start)`` with ``start`` a
multiple of ``pack_length``, as entries of their own. Keeping the base's shards and order
keeps locality: each new rank reads a contiguous group of the shards that
still hold unread samples. Guarantees and cost: docs/loading.md ("Resuming").
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from shardload._base.checks import MAX_WORLD_SIZE, check_scalar
from shardload._base.ranges import offsets_from_lengths
from shardload.errors import PlanError
from shardload.plan.chunks import chunk_identity, resolve_chunk_windows
from shardload.plan.mix.inputs import MixInputs, select_source
from shardload.plan.options import MAX_COUNT, Batching
from shardload.plan.packing.rows import pieces_per_sample
from shardload.plan.request import EpochSpec, PlanInputs


class SegmentPlan(Protocol):
    """What the replay reads of one segment's plan (an :class:`~shardload.plan.EpochPlanner`)."""

    num_batches: int
    fingerprint: str

    def consumed(self, batches: int) -> Iterator[tuple[NDArray[np.int64], NDArray[np.int64] | None]]:
        """The real entries (ids, piece starts) of every rank's first ``batches`` batches."""
        ...


class SegmentPlanner(Protocol):
    """Plans a segment: ``EpochPlanner`` itself (the planner hands itself in, so this module never imports it)."""

    def __call__(
        self, inputs: PlanInputs | MixInputs, spec: EpochSpec, batching: Batching, *, steady: bool
    ) -> SegmentPlan: ...


__all__ = ["Rest", "ResumeInputs", "rest_of", "run_identity"]


@dataclass(frozen=True, eq=False, repr=False)
class ResumeInputs:
    """The planner's request for the rest of an epoch: the base inputs and the segments already run.

    Attributes:
        base: The shard set's :class:`PlanInputs`, or a mixture's :class:`MixInputs`.
        history: ``((world_size, batches), ...)`` the segments of this epoch that
            ran before, in order: segment ``i`` ran ``batches`` batches on every
            rank of a ``world_size``-rank plan of what the segments before it
            left. Segments of 0 batches consumed nothing and are dropped.

    Raises:
        PlanError: On construction, if ``base`` is not plan inputs or a segment
            is not a pair of integers (world size >= 1, batches >= 0).

    Examples:
        >>> base = PlanInputs(np.array([3, 8, 5, 1]), np.array([2, 2]))
        >>> ResumeInputs(base, ((4, 1), (2, 0))).history
        ((4, 1),)
    """

    base: PlanInputs | MixInputs
    history: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if not isinstance(self.base, (PlanInputs, MixInputs)):
            raise PlanError(f"ResumeInputs(base=...) must be PlanInputs or MixInputs, got {type(self.base).__name__}")
        if isinstance(self.history, (str, bytes)) or not isinstance(self.history, Sequence):
            raise PlanError(f"resume history must be a list of [world_size, batches] pairs, got {self.history!r}")
        segments = []
        for i, segment in enumerate(self.history):
            if isinstance(segment, (str, bytes)) or not isinstance(segment, Sequence) or len(segment) != 2:
                raise PlanError(f"resume history segment {i} must be a [world_size, batches] pair, got {segment!r}")
            world = check_scalar(f"resume history segment {i}: world_size", segment[0], low=1, high=MAX_WORLD_SIZE)
            batches = check_scalar(f"resume history segment {i}: batches", segment[1], low=0, high=MAX_COUNT)
            if batches:
                segments.append((world, batches))
        object.__setattr__(self, "history", tuple(segments))

    def __repr__(self) -> str:
        return f"ResumeInputs({self.base!r}, history={list(self.history)})"


@dataclass(frozen=True, eq=False)
class Rest:
    """What is left of an epoch, as inputs the planner plans like any shard set or mixture.

    Attributes:
        inputs: The remainder's entries as plan inputs (a mixture stays one, each source used once).
        ids: ``(n,)`` base sample id of each entry (derived id ``j`` is ``ids[j]``), or ``None``:
            the base itself (nothing replayed yet).
        starts: ``(n,)`` first token of each entry (pieces of a partly consumed sample), or ``None``: all 0.
        fingerprints: The plan fingerprint of each replayed segment, in order.
    """

    inputs: PlanInputs | MixInputs
    ids: NDArray[np.int64] | None
    starts: NDArray[np.int64] | None
    fingerprints: tuple[str, ...]

    def globalise(
        self, ids: NDArray[np.int64], starts: NDArray[np.int64] | None
    ) -> tuple[NDArray[np.int64], NDArray[np.int64] | None]:
        """A derived plan's ``(sample_ids, starts)`` in the base id space (starts: ``None`` unless packed)."""
        out = ids if self.ids is None else self.ids[ids]
        if starts is None:
            return out, None
        return out, starts if self.starts is None else starts + self.starts[ids]


def _compact(counts: NDArray[np.integer]) -> NDArray[np.integer]:
    """``counts`` as int32 when they fit (a use count per sample or piece: half the memory at scale)."""
    return counts.astype(np.int32) if counts.max(initial=0) < 1 << 31 else counts.astype(np.int64)


@dataclass
class _Uses:
    """The epoch's uses as counts per key: a sample id, or with pieces a piece index."""

    lengths: NDArray[np.integer]  # (N,) every base sample's length
    counts: NDArray[np.integer]  # (keys,) uses of each key (int32 when they fit)
    cap: int | None  # pack_length when the keys are pieces
    piece_offsets: NDArray[np.int64] | None = None  # (N + 1,) first key of each sample

    def keys(self, ids: NDArray[np.int64], starts: NDArray[np.int64] | None) -> NDArray[np.int64]:
        if self.piece_offsets is None or self.cap is None:
            return ids
        assert starts is not None
        return self.piece_offsets[ids] + starts // self.cap


def _selection(base: PlanInputs | MixInputs, spec: EpochSpec, batching: Batching) -> _Uses:
    """The epoch's uses before anything is consumed: every sample once, or a mixture's selection."""
    lengths: NDArray[np.integer] = base.lengths
    counts: NDArray[np.integer]
    if isinstance(base, MixInputs):  # a mixture's selected uses
        selections = [
            select_source(base, k, seed=spec.seed, epoch=spec.epoch, train=spec.shuffled)
            for k in range(base.num_sources)
        ]
        counts = np.concatenate(
            [
                np.ones(s.num_samples, np.int32) if sel.counts is None else _compact(sel.counts)
                for s, sel in zip(base.sources, selections)
            ]
        )
    else:
        counts = np.ones(base.num_samples, dtype=np.int32)
    cap = batching.pack_length
    if not (batching.packing and batching.pack_split and cap is not None and base.max_length > cap):
        return _Uses(lengths, counts, None)
    per = pieces_per_sample(lengths, cap)
    return _Uses(lengths, np.repeat(counts, per), cap, offsets_from_lengths(per))


def _consumed(
    planner: SegmentPlan, batches: int, *, pieces: bool
) -> tuple[NDArray[np.int64], NDArray[np.int64] | None]:
    """``(ids, starts)`` of the real entries of the first ``batches`` batches of every rank of ``planner``.

    ``pieces``: whether the uses are counted per piece; if not, the starts are not kept (``None``): a
    packed plan's are one int64 per consumed entry, all 0.
    """
    ids, starts = [], []
    for got, got_starts in planner.consumed(batches):
        ids.append(got)
        if got_starts is not None and pieces:
            starts.append(got_starts)
    all_ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    return all_ids, (np.concatenate(starts) if starts else None)


def _per_shard(ids: NDArray[np.int64], shard_starts: NDArray[np.int64]) -> NDArray[np.int64]:
    """``(S,)`` entries per shard, for entries sorted by sample id."""
    return np.diff(np.searchsorted(ids, shard_starts, side="left")).astype(np.int64)


def _entries(uses: _Uses) -> tuple[NDArray[np.int64], NDArray[np.int64] | None, NDArray[np.int64]]:
    """``(ids, starts, lengths)`` of the remaining uses, sorted by sample id (then start)."""
    n = len(uses.lengths)
    if uses.piece_offsets is None or uses.cap is None:
        if uses.counts.max(initial=0) <= 1:  # every sample once (no mixture repeats): no index of all N
            ids = np.flatnonzero(uses.counts).astype(np.int64)
        else:
            ids = np.repeat(np.arange(n, dtype=np.int64), uses.counts)
        return ids, None, np.asarray(uses.lengths[ids], dtype=np.int64)
    per = np.diff(uses.piece_offsets)
    # a sample is whole as often as its least used piece is left; the rest of its pieces stand alone
    whole = np.minimum.reduceat(uses.counts, uses.piece_offsets[:-1]) if n else np.zeros(0, np.int64)
    loose = uses.counts - np.repeat(whole, per)
    piece_sample = np.repeat(np.arange(n, dtype=np.int64), per)
    piece_start = (np.arange(len(piece_sample), dtype=np.int64) - uses.piece_offsets[piece_sample]) * uses.cap
    w_ids = np.repeat(np.arange(n, dtype=np.int64), whole)
    l_ids = np.repeat(piece_sample, loose)
    l_starts = np.repeat(piece_start, loose)
    ids = np.concatenate([w_ids, l_ids])
    starts = np.concatenate([np.zeros(len(w_ids), np.int64), l_starts])
    lens = np.asarray(uses.lengths, dtype=np.int64)
    lengths = np.concatenate([lens[w_ids], np.minimum(lens[l_ids] - l_starts, uses.cap)])
    order = np.lexsort((starts, ids))
    return ids[order], starts[order], lengths[order]


def _derive(
    base: PlanInputs | MixInputs, uses: _Uses, digest: str
) -> tuple[PlanInputs | MixInputs, NDArray[np.int64], NDArray[np.int64] | None]:
    """Plan inputs over the remaining uses (one shard per base shard), and their base ids and starts."""
    ids, starts, lengths = _entries(uses)
    if isinstance(base, PlanInputs):
        sizes = _per_shard(ids, offsets_from_lengths(base.shard_sizes))
        derived = PlanInputs(lengths.astype(base.lengths.dtype), sizes, digest=digest, chunk_rows=base.chunk_rows)
        return derived, ids, starts
    bounds = np.searchsorted(ids, base.offsets, side="left")  # (K + 1,) entries of each source
    sources = []
    for k, source in enumerate(base.sources):
        lo, hi = int(bounds[k]), int(bounds[k + 1])
        local = ids[lo:hi] - base.offsets[k]
        sizes = _per_shard(local, offsets_from_lengths(source.shard_sizes))
        lens = lengths[lo:hi].astype(source.lengths.dtype)
        sources.append(PlanInputs(lens, sizes, digest=f"{digest}/{k}", chunk_rows=source.chunk_rows))
    # every entry once, the sources in proportion to what is left of them (the selection was made already)
    mix = MixInputs(tuple(sources), base.names, None, by=base.by)
    return mix, ids, starts


def rest_of(inputs: ResumeInputs, spec: EpochSpec, batching: Batching, plan_segment: SegmentPlanner) -> Rest:
    """Replay ``inputs.history`` and return what it left of the epoch (see the module docstring).

    ``plan_segment`` plans each segment of the history (the planner passes ``EpochPlanner``).

    Raises:
        PlanError: a segment claims more batches than its plan has (the state was edited or
            belongs to another run).
    """
    base = inputs.base
    uses = _selection(base, spec, batching)
    current: PlanInputs | MixInputs = base
    ids: NDArray[np.int64] | None = None
    starts: NDArray[np.int64] | None = None
    prints = []
    for i, (world, batches) in enumerate(inputs.history):
        # the first segment ran the epoch's plan (the run's steps per epoch); each later one ran a remainder,
        # which has its natural target (shardload.plan.length)
        planner = plan_segment(current, dataclasses.replace(spec, world_size=world), batching, steady=i == 0)
        if batches > planner.num_batches:
            raise PlanError(
                f"the resume history says segment {i} ran {batches} batches on {world} ranks, but its plan has "
                f"{planner.num_batches}; the state was edited or belongs to another run"
            )
        prints.append(planner.fingerprint)
        got, got_starts = _consumed(planner, batches, pieces=uses.piece_offsets is not None)
        rest = Rest(current, ids, starts, ())
        got, got_starts = rest.globalise(got, got_starts)
        used = np.bincount(uses.keys(got, got_starts), minlength=len(uses.counts))
        np.subtract(uses.counts, used, out=uses.counts, casting="unsafe")
        del used, got, got_starts
        assert uses.counts.min(initial=0) >= 0, "a segment consumed a use that was not left"
        tail = json.dumps(inputs.history[: i + 1])
        current, ids, starts = _derive(base, uses, f"{base.digest}/rest/{tail}")
    return Rest(current, ids, starts, tuple(prints))


def run_identity(inputs: PlanInputs | MixInputs, spec: EpochSpec, batching: Batching) -> dict[str, Any]:
    """What a loader state must match to resume on any world size, by name (for messages).

    Everything the plan depends on except the world size and the epoch:
    the shard set (or mixture), the stage, the seed and shard assignment
    (training only: evaluation ignores them), the batching options and,
    when the plan uses them, the chunk windows (:mod:`shardload.plan.chunks`).
    """
    ident = spec.identity()
    shards = hashlib.sha1(inputs.shard_sizes.astype("<i8").tobytes(), usedforsecurity=False).hexdigest()
    shard_set = {"lengths": inputs.digest, "shards": shards}
    if isinstance(inputs, MixInputs):
        shard_set["mixture"] = json.dumps(inputs.identity(), sort_keys=True)
    set_digest = hashlib.sha1(json.dumps(shard_set, sort_keys=True).encode(), usedforsecurity=False).hexdigest()
    out: dict[str, Any] = {
        "shard set": set_digest,
        "stage": ident["stage"],
        "seed": ident["seed"],
        "shard_assignment": ident["shard_assignment"],
        "batching": batching.identity_items(),
    }
    sources = inputs.sources if isinstance(inputs, MixInputs) else (inputs,)
    windows = chunk_identity([resolve_chunk_windows(batching, s.chunk_rows, shuffled=spec.shuffled) for s in sources])
    if windows is not None:  # [rows per chunk, chunks per window] of each set
        out["chunk windows"] = windows
    return out
