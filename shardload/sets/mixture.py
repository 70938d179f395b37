"""A mixture of shard sets, read as one: the public :class:`Mixture` and the opened :class:`MixedSets`.

Accepted wherever a shard set is (docs/loading.md, "Mixtures"). Each source is opened as its own
:class:`~shardload.ShardSet`, so every check is the one a single set gets; :class:`MixedSets` gives the sources
one id space and one shard numbering.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import numpy as np
from numpy.typing import NDArray

from shardload._base.checks import MAX_LENGTH, check_scalar
from shardload.errors import MixtureError, PlanError, ShardSetError
from shardload.formats import Columns
from shardload.plan.mix.inputs import MixBy, MixInputs, check_weights
from shardload.remote.options import RemoteOptions
from shardload.remote.url import is_remote, local_path
from shardload.schema.fields import Schema
from shardload.sets.index import ShardIndex
from shardload.sets.shardset import ShardSet

__all__ = ["SOURCE_KEY", "MixedSets", "Mixture", "as_source", "open_source"]

#: the batch key of a mixture's batches: int64, the source of each sample (or packed document)
SOURCE_KEY = "source"


@dataclass(frozen=True)
class Mixture:
    """Several shard sets read as one, each contributing its weight of every training epoch.

    Args:
        sources: ``{name: shard set directory or opened ShardSet}``. The order
            given is the order of :attr:`names`, which ``batch["source"]`` indexes.
        weights: ``{name: weight}`` (any scale, normalised; 0 leaves a source
            out of training), or ``None`` (default): each source in proportion
            to its size, which subsamples and repeats nothing.
        by: ``"tokens"`` (default): weights and the epoch size count tokens
            (each sample's batching length); ``"samples"``: samples.
        epoch_tokens: With ``by="tokens"``: tokens in a training epoch
            (default: all sources' tokens together).
        epoch_samples: With ``by="samples"``: samples in a training epoch
            (default: all sources' samples together).
        max_repeats: Refuse (:class:`~shardload.errors.MixtureError`) an epoch
            that would use a sample more than this many times (default: no cap).

    Evaluation stages ignore weights and the epoch size: every sample of every
    source is seen exactly once. Sources must have the same fields (names,
    dtypes, variable or fixed, inner shapes), or the same ``fields=`` that the
    loader loads; no source may have a field named ``"source"``.

    Raises:
        MixtureError: On construction, naming the bad argument (a weight
            missing, negative, NaN or for an unknown name; all weights 0; the
            same set twice; an epoch size of 0; ``epoch_tokens`` with
            ``by="samples"``). The dicts given are copied.

    Examples:
        >>> mix = Mixture({"web": "sets/web", "code": "sets/code"}, weights={"web": 0.7, "code": 0.3})
        >>> mix.names
        ('web', 'code')
    """

    sources: Mapping[str, str | os.PathLike[str] | ShardSet]
    weights: Mapping[str, float] | None = None
    by: MixBy = "tokens"
    epoch_tokens: int | None = None
    epoch_samples: int | None = None
    max_repeats: int | None = None
    names: tuple[str, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.sources, Mapping) or not self.sources:
            raise MixtureError(
                f"Mixture(sources=...) must be a non-empty dict of name -> shard set directory, got {self.sources!r}"
            )
        names = tuple(self.sources)
        seen: dict[str, str] = {}
        for name, where in self.sources.items():
            if not isinstance(name, str) or not name:
                raise MixtureError(f"source names must be non-empty strings, got {name!r}")
            if not isinstance(where, (str, os.PathLike, ShardSet)):
                raise MixtureError(
                    f"source {name!r} must be a shard set directory (str or path) or a ShardSet, "
                    f"got {type(where).__name__}"
                )
            if isinstance(where, ShardSet):
                path = where.url or str(where.path.resolve())
            else:
                path = (
                    where.rstrip("/")
                    if isinstance(where, str) and is_remote(where)
                    else str(Path(local_path(where)).resolve())
                )
            if path in seen:
                raise MixtureError(
                    f"sources {seen[path]!r} and {name!r} are the same shard set ({path}): give each set once "
                    "(a larger weight reads it more often)"
                )
            seen[path] = name
        if self.by not in get_args(MixBy):
            raise MixtureError(f"Mixture(by={self.by!r}): must be 'tokens' or 'samples'")
        check_weights(names, self.weights)
        # our own copies: a dict the caller changes afterwards must not bypass these checks
        object.__setattr__(self, "sources", dict(self.sources))
        if self.weights is not None:
            object.__setattr__(self, "weights", dict(self.weights))
        wrong = "epoch_samples" if self.by == "tokens" else "epoch_tokens"
        if getattr(self, wrong) is not None:
            raise MixtureError(
                f"Mixture({wrong}=...) does not fit by={self.by!r}: the epoch size counts what the weights "
                f"count; use {'epoch_tokens' if self.by == 'tokens' else 'epoch_samples'}"
            )
        size = self.epoch_size
        if size is not None:
            # 0 would be a training epoch without a batch
            check_scalar("epoch_tokens" if self.by == "tokens" else "epoch_samples", size, low=1, high=1 << 60)
        if self.max_repeats is not None:
            check_scalar("max_repeats", self.max_repeats, low=1, high=MAX_LENGTH)
        object.__setattr__(self, "names", names)

    @property
    def epoch_size(self) -> int | None:
        """The training epoch's size in the unit of :attr:`by` (``None``: all sources together)."""
        return self.epoch_tokens if self.by == "tokens" else self.epoch_samples

    def open(self, remote: RemoteOptions | None = None) -> MixedSets:
        """Open every source (manifest and lengths only); the loaders then check their fields agree.

        A source may be a URL: ``remote`` (:class:`~shardload.remote.RemoteOptions`) gives its
        credentials and node cache.

        Raises:
            ShardSetError: a source that is not a usable shard set, its name in the message.
            MixtureError: two sources with the same content (a copy of a set: the same fingerprint).
        """
        sets: list[ShardSet] = []
        for name, where in self.sources.items():
            try:
                sets.append(where if isinstance(where, ShardSet) else ShardSet(where, remote=remote))
            except ShardSetError as exc:
                raise type(exc)(f"source {name!r} of the mixture: {exc}") from None
        seen: dict[str, str] = {}
        for name, s in zip(self.names, sets):
            if s.fingerprint in seen:
                first = seen[s.fingerprint]
                raise MixtureError(
                    f"sources {first!r} and {name!r} hold the same shard set ({self._path_of(first)} and "
                    f"{s.path}: the same content, fingerprint {s.fingerprint}): give each set once (a larger "
                    "weight reads it more often)"
                )
            seen[s.fingerprint] = name
        return MixedSets(self, tuple(sets))

    def _path_of(self, name: str) -> str:
        where = self.sources[name]
        return str(where.path if isinstance(where, ShardSet) else where)


class MixedSets:
    """An opened :class:`Mixture`: what the loader reads from, in place of one :class:`~shardload.ShardSet`.

    Global sample ids are source-major (source ``k``'s sample ``i`` is ``offsets[k] + i``), and so are shard
    numbers (``shard_offsets[k] + j``). Picklable: a worker gets each source without its mappings. The loaders
    call :meth:`check_fields` with the fields they load before any batch.
    """

    def __init__(self, mixture: Mixture, sets: tuple[ShardSet, ...]) -> None:
        self.mixture = mixture
        self.names = mixture.names
        self.sets = sets
        self.offsets = np.cumsum([0] + [len(s) for s in sets]).astype(np.int64)
        self.shard_offsets = np.cumsum([0] + [len(s.shards) for s in sets]).astype(np.int64)
        self.index = ShardIndex(np.concatenate([s.index.sizes for s in sets]).astype(np.int64))
        self._inputs: MixInputs | None = None

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __repr__(self) -> str:
        return f"MixedSets({', '.join(f'{n}={s.path}' for n, s in zip(self.names, self.sets))})"

    @property
    def path(self) -> str:
        """The sources, for messages: ``web=sets/web, code=sets/code``."""
        return ", ".join(f"{n}={s.url or s.path}" for n, s in zip(self.names, self.sets))

    @property
    def schema(self) -> Schema:
        """The first source's schema (the others agree on the fields that are loaded)."""
        return self.sets[0].schema

    @property
    def fingerprint(self) -> str:
        """Digest of the names and every source's manifest fingerprint."""
        text = json.dumps([[n, s.fingerprint] for n, s in zip(self.names, self.sets)])
        return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()

    def check_fields(self, fields: tuple[str, ...] | None) -> None:
        """Refuse sources whose loaded fields differ (all fields, or ``fields``), or that have a ``source`` field.

        Raises:
            MixtureError: naming the source, the field and what differs.
        """
        first, name0 = self.sets[0].schema, self.names[0]
        for name, s in zip(self.names, self.sets):
            if SOURCE_KEY in s.schema.names and (fields is None or SOURCE_KEY in fields):
                raise MixtureError(
                    f"source {name!r} ({s.path}) has a field named {SOURCE_KEY!r}, the key a mixture's batches "
                    "add (the source of each sample): leave it out with fields=, or rename it"
                )
            if fields is None and set(s.schema.names) != set(first.names):
                raise MixtureError(
                    f"sources {name0!r} and {name!r} have different fields ({sorted(first.names)} and "
                    f"{sorted(s.schema.names)}): every source of a mixture needs the same fields, or give "
                    "fields= with the ones they share"
                )
            for f in fields if fields is not None else first.names:
                self._check_field(f, name, s, first, name0)
            self._check_length_rule(name, s, name0, self.sets[0])

    @staticmethod
    def _check_length_rule(name: str, s: ShardSet, name0: str, first: ShardSet) -> None:
        """Refuse sources whose batching lengths (what weights by tokens and budgets count) measure other fields."""
        a, b = _length_rule(first.schema), _length_rule(s.schema)
        if a == b:
            return
        if a is None or b is None:  # the longest field in one: the same rule if that is always the named field
            longest, named = (first, b) if a is None else (s, a)
            assert named is not None
            if named in {f.name for f in longest.schema.variable_fields} and np.array_equal(
                longest.field_lengths(named), longest.lengths
            ):
                return
        raise MixtureError(
            f"sources {name0!r} and {name!r} measure sample lengths on different fields (length_field "
            f"{a or 'the longest variable field'!r} vs {b or 'the longest variable field'!r}): weights by tokens "
            "and max_tokens would count other things in each; re-prepare one with the other's length_field"
        )

    def _check_field(self, f: str, name: str, s: ShardSet, first: Schema, name0: str) -> None:
        if f not in s.schema.names or f not in first.names:
            missing = name if f not in s.schema.names else name0
            raise MixtureError(f"source {missing!r} has no field {f!r}, which the mixture loads")
        a, b = first.field(f), s.schema.field(f)
        for what, x, y in (
            ("dtype", a.dtype, b.dtype),
            ("variable length", a.variable, b.variable),
            ("inner shape", a.inner_shape, b.inner_shape),
        ):
            if x != y:
                raise MixtureError(
                    f"field {f!r} differs between sources {name0!r} and {name!r}: {what} {x} vs {y}; batches "
                    "of a mixture stack samples of every source, so re-prepare one of them (or leave the field "
                    "out with fields=)"
                )

    def plan_inputs(self) -> MixInputs:
        """The planner's request for this mixture: each source's own ``plan_inputs()``, rebuilt when one changes.

        Each call asks every source, so a source re-prepared under a live loader is a ``ShardSetChangedError``.
        """
        sources = tuple(s.plan_inputs() for s in self.sets)
        if self._inputs is None or any(a is not b for a, b in zip(sources, self._inputs.sources)):
            m = self.mixture
            self._inputs = MixInputs(
                sources,
                self.names,
                m.weights,
                by=m.by,
                epoch_size=m.epoch_size,
                max_repeats=m.max_repeats,
            )
        return self._inputs

    def _source_of_shard(self, shard: int) -> tuple[int, int]:
        k = int(np.searchsorted(self.shard_offsets, shard, side="right")) - 1
        return k, shard - int(self.shard_offsets[k])

    def shard_columns(self, shard: int) -> Columns:
        """Global shard ``shard``, mapped (and checked) by its source's set."""
        k, local = self._source_of_shard(shard)
        return self.sets[k].shard_columns(local)

    def _by_source(self, shards: Iterable[int]) -> list[list[int]]:
        """Global shards as each source's local ones."""
        local: list[list[int]] = [[] for _ in self.sets]
        for g in shards:
            k, j = self._source_of_shard(int(g))
            local[k].append(j)
        return local

    def check_shards_unchanged(self, shards: Iterable[int]) -> None:
        """Each source's check that its shards are the files it mapped."""
        for s, local in zip(self.sets, self._by_source(shards)):
            s.check_shards_unchanged(local)

    def source_of(self, ids: NDArray[np.int64]) -> NDArray[np.int64]:
        """``(n,)`` the source index of each global sample id."""
        return (np.searchsorted(self.offsets, ids, side="right") - 1).astype(np.int64)

    def release_others(self, shards: Iterable[int]) -> None:
        """Each remote source in a bounded cache keeps only these (global) shards open."""
        for s, local in zip(self.sets, self._by_source(shards)):
            s.release_others(local)

    def close(self) -> None:
        """Unmap every source's shards."""
        for s in self.sets:
            s.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_inputs"] = None  # workers read by id; they do not plan
        return state


def _length_rule(schema: Schema) -> str | None:
    """The field whose length is each sample's batching length (``None``: the longest variable field)."""
    if schema.length_field is not None:
        return schema.length_field
    variable = schema.variable_fields
    return variable[0].name if len(variable) == 1 else None


#: what a loader reads: a shard set directory, an opened set, or a mixture of sets
Source = str | os.PathLike[str] | ShardSet | Mixture


def as_source(name: str, value: object) -> Source:
    """``value`` as what a loader reads; a dict of name -> set is a :class:`Mixture` of them by size.

    Raises:
        PlanError: naming ``name``, when ``value`` is none of these.
        MixtureError: a dict that is not a valid mixture.
    """
    if isinstance(value, (str, os.PathLike, ShardSet, Mixture)):
        return value
    if isinstance(value, Mapping):
        return Mixture(value)
    raise PlanError(
        f"{name} must be a shard set directory (str or path), a shardload.Mixture, or a dict of "
        f"name -> directory (a mixture by size), got {type(value).__name__}"
    )


def open_source(source: Source | MixedSets, remote: RemoteOptions | None = None) -> ShardSet | MixedSets:
    """Open what a loader reads (an opened set or mixture is used as it is); ``remote`` for URLs."""
    if isinstance(source, (ShardSet, MixedSets)):
        return source
    if isinstance(source, Mixture):
        return source.open(remote)
    return ShardSet(source, remote=remote)
