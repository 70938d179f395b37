"""Mixtures: several shard sets planned as one, each contributing its weight of every epoch.

:class:`MixInputs` is the planner's request for a mixture, beside :class:`~shardload.plan.PlanInputs`,
planned by the same :class:`~shardload.plan.EpochPlanner`. This module makes its selection step, before
assignment: each source's share of an epoch is a window of an endless permutation of its samples, so
every sample is used ``floor`` or ``ceil`` of its expected count. The rule and the pipeline:
docs/planning.md, "Mixtures".
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np
from numpy.typing import NDArray

from shardload._base.checks import MAX_LENGTH, check_scalar
from shardload._base.ranges import offsets_from_lengths
from shardload.errors import MixtureError, PlanError
from shardload.plan.options import Batching
from shardload.plan.packing.pack import refuse_long_samples
from shardload.plan.request import PlanInputs, memo_in

__all__ = [
    "MixBy",
    "MixInputs",
    "Selection",
    "check_weights",
    "refuse_long_samples_in",
    "select_source",
    "source_seed",
]

#: what a mixture's weights and epoch size count
MixBy = Literal["tokens", "samples"]

_MIX_STREAM = 0x4D58  # tag of the per-source random streams
#: the most units an epoch may hold: products with it stay in int64
MAX_EPOCH_SIZE = 1 << 60


def check_weights(names: Sequence[str], weights: Mapping[str, object] | None) -> tuple[float, ...] | None:
    """The weights of ``names`` in order, normalised to sum 1 (``None``: proportional to each source's size).

    The one rule for mixture weights, for :class:`MixInputs` and
    :class:`shardload.Mixture`.

    Raises:
        MixtureError: a weight missing, for a name that is not a source, not a
            finite number >= 0, or all weights 0.
    """
    if weights is None:
        return None
    if not isinstance(weights, Mapping):
        raise MixtureError(f"weights must be a dict of source name -> weight, got {type(weights).__name__}")
    unknown = [str(k) for k in weights if k not in names]
    if unknown:
        raise MixtureError(
            f"weights name {', '.join(map(repr, unknown))}, which is not a source of the mixture "
            f"(sources: {', '.join(map(repr, names))})"
        )
    missing = [n for n in names if n not in weights]
    if missing:
        raise MixtureError(
            f"no weight for source {', '.join(map(repr, missing))}: give every source a weight "
            "(0 leaves a source out of training), or weights=None for proportions by size"
        )
    values = []
    for name in names:
        w = weights[name]
        if isinstance(w, (bool, np.bool_)) or not isinstance(w, numbers.Real):
            raise MixtureError(
                f"weight of source {name!r} must be a number (an int, a float or another real number), got {w!r}"
            )
        try:
            value = float(w)
        except OverflowError:  # an int beyond any float
            raise MixtureError(
                f"weight of source {name!r} is an integer of {len(str(w))} digits, beyond any float: weights "
                "must be finite numbers >= 0 (scale them down)"
            ) from None
        if not math.isfinite(value) or value < 0:
            raise MixtureError(f"weight of source {name!r} is {w!r}: weights must be finite numbers >= 0")
        values.append(value)
    largest = max(values)
    if largest <= 0:
        raise MixtureError("every weight is 0: give at least one source a positive weight")
    try:
        total = math.fsum(values)
    except OverflowError:
        total = math.inf
    if math.isinf(total):  # any scale: huge weights whose sum overflows are scaled down first
        values = [v / largest for v in values]
        total = math.fsum(values)
    return tuple(v / total for v in values)


def source_seed(seed: int, source: int) -> int:
    """The seed of one source's streams (its selection, shard order and batches): distinct per source."""
    state = np.random.SeedSequence([seed, source, _MIX_STREAM]).generate_state(2, np.uint32)
    return int(state[0]) << 32 | int(state[1])


@dataclass(frozen=True, eq=False, repr=False)
class MixInputs:
    """The planner's view of a mixture: one :class:`PlanInputs` per source, and how to mix them.

    Global sample ids are source-major: source ``k``'s sample ``i`` is
    ``offsets[k] + i``, in the order of :attr:`names`.

    Attributes:
        sources: One :class:`PlanInputs` per source, in order.
        names: One name per source (distinct); ``batch["source"]`` indexes them.
        weights: ``{name: weight}`` (any scale; normalised), or ``None``:
            each source in proportion to its size (no subsampling or repetition).
        by: ``"tokens"`` (default): weights and the epoch size count tokens
            (the batching lengths); ``"samples"``: they count samples.
        epoch_size: Units (tokens or samples, as ``by``) in a training epoch;
            ``None``: all sources' units together.
        max_repeats: Refuse an epoch that would use a sample more than this
            many times (``None``: no cap).

    Raises:
        MixtureError: On construction, naming the bad field.

    Examples:
        >>> a = PlanInputs(np.array([4, 4, 4, 4]), np.array([4]))
        >>> b = PlanInputs(np.array([8]), np.array([1]))
        >>> mix = MixInputs((a, b), ("web", "code"), {"web": 1, "code": 1})
        >>> mix.num_samples, mix.offsets.tolist(), mix.shares
        (5, [0, 4, 5], (0.5, 0.5))
    """

    sources: tuple[PlanInputs, ...]
    names: tuple[str, ...]
    weights: Mapping[str, float] | None = None
    by: MixBy = "tokens"
    epoch_size: int | None = None
    max_repeats: int | None = None
    shares: tuple[float, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        sources, names = tuple(self.sources), tuple(self.names)
        if not sources or len(sources) != len(names):
            raise MixtureError(f"a mixture needs one name per source and at least one: {len(names)} names")
        if not all(isinstance(s, PlanInputs) for s in sources):
            raise MixtureError("every source of MixInputs must be a PlanInputs (shard_set.plan_inputs())")
        if not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
            raise MixtureError(f"source names must be distinct non-empty strings, got {list(names)}")
        if self.by not in get_args(MixBy):
            raise MixtureError(f"by={self.by!r}: must be 'tokens' or 'samples'")
        normalised = check_weights(names, self.weights)
        if self.epoch_size is not None:
            size = check_scalar("epoch_size", self.epoch_size, low=0, high=MAX_EPOCH_SIZE)
            object.__setattr__(self, "epoch_size", size)
        if self.max_repeats is not None:
            cap = check_scalar("max_repeats", self.max_repeats, low=1, high=MAX_LENGTH)
            object.__setattr__(self, "max_repeats", cap)
        object.__setattr__(self, "sources", sources)
        object.__setattr__(self, "names", names)
        if normalised is None:
            units = self.units
            total = sum(units)
            normalised = tuple(u / total if total else 1 / len(units) for u in units)
        object.__setattr__(self, "shares", normalised)

    def __repr__(self) -> str:
        shares = ", ".join(f"{n}={s:.3g}" for n, s in zip(self.names, self.shares))
        return f"MixInputs({shares}, by={self.by!r}, num_samples={self.num_samples})"

    def memo(self, key: Hashable, compute: Callable[[], NDArray[np.int64]]) -> NDArray[np.int64]:
        """``compute()``, kept with this mixture under ``key`` (as :meth:`PlanInputs.memo`)."""
        return memo_in(self, key, compute)

    @property
    def num_sources(self) -> int:
        """``K``: the number of sources."""
        return len(self.sources)

    @property
    def offsets(self) -> NDArray[np.int64]:
        """``(K + 1,)`` first global id of each source, then the total."""
        return offsets_from_lengths(np.array([s.num_samples for s in self.sources], dtype=np.int64))

    @property
    def num_samples(self) -> int:
        """All sources' samples together."""
        return sum(s.num_samples for s in self.sources)

    @property
    def num_shards(self) -> int:
        """All sources' shards together."""
        return sum(s.num_shards for s in self.sources)

    @property
    def shard_sizes(self) -> NDArray[np.int64]:
        """``(S,)`` every source's shard sizes, source after source: shards in the global id space."""
        return np.concatenate([s.shard_sizes for s in self.sources]).astype(np.int64)

    @property
    def max_length(self) -> int:
        """The longest sample of any source."""
        return max(s.max_length for s in self.sources)

    @property
    def units(self) -> tuple[int, ...]:
        """``U_k`` of each source: its tokens (``by="tokens"``) or samples."""
        if self.by == "samples":
            return tuple(s.num_samples for s in self.sources)
        return tuple(int(s.shard_tokens.sum()) for s in self.sources)

    @property
    def lengths(self) -> NDArray[np.int64]:
        """``(N,)`` every sample's length in the global id space (a copy of all sources: for reports and tests)."""
        return np.concatenate([np.asarray(s.lengths, dtype=np.int64) for s in self.sources])

    def lengths_at(self, ids: NDArray[np.int64]) -> NDArray[np.int64]:
        """``(n,)`` the lengths of global sample ids, read from their sources."""
        source = self.source_of(ids)
        out = np.zeros(len(ids), dtype=np.int64)
        for k in np.unique(source).tolist():
            mine = source == k
            out[mine] = self.sources[k].lengths[ids[mine] - self.offsets[k]]
        return out

    def source_of(self, ids: NDArray[np.int64]) -> NDArray[np.int64]:
        """``(n,)`` the source index of each global sample id."""
        return (np.searchsorted(self.offsets, ids, side="right") - 1).astype(np.int64)

    @property
    def digest(self) -> str:
        """A digest of :meth:`identity`: names, weights, options and every source's content."""
        return hashlib.sha1(json.dumps(self.identity(), sort_keys=True).encode(), usedforsecurity=False).hexdigest()

    def identity(self) -> dict[str, Any]:
        """What the mixture's plans depend on beyond the spec and batching (it goes into the fingerprint)."""
        return {
            "names": list(self.names),
            "shares": [repr(s) for s in self.shares],
            "by": self.by,
            "epoch_size": self.epoch_size,
            "max_repeats": self.max_repeats,
            "sources": [
                {
                    "digest": s.digest,
                    "num_samples": s.num_samples,
                    "shards": hashlib.sha1(s.shard_sizes.astype("<i8").tobytes(), usedforsecurity=False).hexdigest(),
                }
                for s in self.sources
            ],
        }

    def targets(self) -> tuple[int, ...]:
        """``T_k`` of each source in a training epoch: its share of the epoch's units."""
        units = self.units
        total = sum(units) if self.epoch_size is None else self.epoch_size
        if self.weights is None and (self.epoch_size is None or sum(units) == 0):
            return units  # every sample once (nothing to share out when the sources are empty)
        return tuple(round(share * total) for share in self.shares)


@dataclass(frozen=True)
class Selection:
    """How many times each sample of one source is used in one epoch.

    Attributes:
        counts: ``(N_k,)`` uses of each sample (``None``: every sample once).
        target: ``T_k``, the units the source should give the epoch.
        units: ``U_k``, the source's units.
    """

    counts: NDArray[np.int64] | None
    target: int
    units: int

    @property
    def ratio(self) -> float:
        """``T_k / U_k``: below 1 subsamples, above 1 repeats."""
        return self.target / self.units if self.units else 0.0

    @property
    def max_uses(self) -> int:
        """The most times a sample is used: ``ceil(ratio)`` (1 for every sample once)."""
        if self.counts is None:
            return 1 if self.units else 0
        return int(self.counts.max(initial=0))


def select_source(mix: MixInputs, k: int, *, seed: int, epoch: int, train: bool) -> Selection:
    """The samples of source ``k`` one epoch uses (see the module docstring).

    Raises:
        MixtureError: a source with a positive weight has no units (no samples,
            or only empty ones with ``by="tokens"``), or the epoch would use a
            sample more than ``max_repeats`` times.
    """
    source, name = mix.sources[k], mix.names[k]
    units = mix.units[k]
    if not train:
        return Selection(None, units, units)
    target = mix.targets()[k]
    if target == units:
        return Selection(None, target, units)
    if units == 0:
        raise MixtureError(
            f"source {name!r} has no {mix.by} ({source.num_samples} samples) but weight {mix.shares[k]:.3g}: "
            "give it weight 0 or leave it out of the training mixture"
        )
    need = -(-target // units)
    if mix.max_repeats is not None and need > mix.max_repeats:
        raise MixtureError(
            f"source {name!r} would be repeated {target / units:.3g} times per epoch (each sample up to {need} "
            f"times; {target:,} of its {units:,} {mix.by}), more than max_repeats={mix.max_repeats}: lower its "
            "weight, raise max_repeats, or set a smaller epoch size"
        )
    sseed = source_seed(seed, k)
    perm = source.memo(("mix order", sseed), lambda: np.random.default_rng(sseed).permutation(source.num_samples))

    def first_units() -> NDArray[np.int64]:  # (N_k,) first unit of each sample of the endless stream, in perm order
        sizes = np.ones(len(perm), np.int64) if mix.by == "samples" else np.asarray(source.lengths[perm], np.int64)
        return offsets_from_lengths(sizes)[:-1] % units  # a trailing empty sample sits at U: the next cycle's 0

    starts = source.memo(("mix starts", sseed, mix.by), first_units)
    lo = (epoch % units) * (target % units) % units  # e * T_k mod U_k, exact in Python ints
    # occurrences of s + m * U in [lo, lo + T): ceil((lo + T - s) / U) - [lo > s]
    uses = -((starts - lo - target) // units) - (starts < lo)
    counts = np.empty(source.num_samples, dtype=np.int64)
    counts[perm] = uses
    return Selection(counts, target, units)


def refuse_long_samples_in(inputs: PlanInputs | MixInputs, batching: Batching) -> None:
    """:func:`~shardload.plan.packing.pack.refuse_long_samples` for a shard set, or each source of a mixture (named).

    Raises:
        PlanError: a sample longer than ``pack_length`` without ``pack_split``;
            in a mixture the message starts with ``source 'NAME' of the mixture:``.
    """
    if not isinstance(inputs, MixInputs):
        refuse_long_samples(inputs.lengths, inputs.max_length, batching)
        return
    for name, source in zip(inputs.names, inputs.sources):
        try:
            refuse_long_samples(source.lengths, source.max_length, batching)
        except PlanError as exc:
            raise PlanError(f"source {name!r} of the mixture: {exc}") from None
