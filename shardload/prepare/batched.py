"""The batched map (``map_batch=N``, ``--map-batch N``): the map is called with up to N records at a time.

Where it sits: as the per-sample map (:mod:`shardload.prepare.mapping`), between reading a unit and
checking its samples, in the worker processes. The function gets a batch of consecutive records as a
dict of column lists (``{"text": [str, ...]}``, one entry per record, in read order) and returns either

- a dict of columns with one entry per record (each record becomes one sample), or
- a list with one entry per record, each what a per-sample map returns for it: a dict, ``None`` to
  drop the record, or a list of dicts.

Either way every sample keeps the locator and origin of its record, so the staged samples, the set
and every message are those of the per-sample map that returns, for each record, what the batch
returned for it: a set does not depend on ``N``. A failure of the call names the batch's records
(first and last); a bad value names its record. A batch holds records with the same fields: a record
with other fields than the one before it starts a new batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shardload.errors import InputError
from shardload.prepare.mapconfig import ConfiguredMap
from shardload.prepare.mapping import MapFunction, MappedSamples, check_record, map_name

__all__ = ["BATCH_RETURNS", "BatchedSamples", "mapped_samples"]

#: what a batched map must return, for messages
BATCH_RETURNS = (
    "a batched map (map_batch) returns a dict of columns with one entry per record of the batch, or a list with one "
    "entry per record (a dict, None to drop the record, or a list of dicts)"
)


def mapped_samples(
    samples: Iterable[tuple[str, Mapping[str, Any]]], fn: MapFunction | None, batch: int | None = None
) -> MappedSamples:
    """``samples`` passed through the map ``fn``: one record at a time, or ``batch`` records at a time.

    A factory's map (:class:`~shardload.prepare.mapconfig.ConfiguredMap`) is made here, once per process.
    """
    if fn is None:
        return MappedSamples(samples)
    name = map_name(fn)
    if isinstance(fn, ConfiguredMap):
        fn = fn.function()
    if batch is None:
        return MappedSamples(samples, fn, name)
    return BatchedSamples(samples, fn, batch, name)


class BatchedSamples(MappedSamples):
    """The ``(locator, sample)`` pairs of a reader, passed lazily through a batched map, ``batch`` records a call."""

    returns = BATCH_RETURNS

    def __init__(
        self, samples: Iterable[tuple[str, Mapping[str, Any]]], fn: MapFunction, batch: int, name: str | None = None
    ) -> None:
        super().__init__(samples, fn, name)
        self._batch = batch
        self._ahead: tuple[str, Mapping[str, Any]] | None = None

    def __next__(self) -> tuple[str, Mapping[str, Any]]:
        while not self._pending:
            records = self._records()
            if not records:
                raise StopIteration
            self._pending = self._apply_batch(records)[::-1]
        return self._pending.pop()

    def _records(self) -> list[tuple[str, Mapping[str, Any]]]:
        """The next batch: up to ``batch`` consecutive records with the fields of the first."""
        records: list[tuple[str, Mapping[str, Any]]] = []
        keys = None
        while len(records) < self._batch:
            item = self._ahead if self._ahead is not None else next(self._it, None)
            self._ahead = None
            if item is None:
                break
            check_record(*item)
            if keys is None:
                keys = list(item[1])
            elif list(item[1]) != keys:
                self._ahead = item
                break
            records.append(item)
        return records

    def _apply_batch(self, records: Sequence[tuple[str, Mapping[str, Any]]]) -> list[tuple[str, Mapping[str, Any]]]:
        n = len(records)
        wheres = [w for w, _ in records]
        where = wheres[0] if n == 1 else f"the batch of {n} records {wheres[0]} to {wheres[-1]}"
        columns = {key: [sample[key] for _, sample in records] for key in records[0][1]}
        out = self._call(where, columns)
        if isinstance(out, Mapping):
            for key, column in out.items():
                size = _length(column)
                if size != n:
                    got = "a value that is not a column" if size is None else f"{size:,} entries"
                    raise InputError(
                        f"{where}: the map function {self._name} returned {got} for field {key!r}, for {n:,} "
                        f"records; {BATCH_RETURNS}"
                    )
            results = []
            for i, w in enumerate(wheres):
                results.extend(self._results(w, {key: column[i] for key, column in out.items()}))
            return results
        if not isinstance(out, list) or len(out) != n:
            got = (
                f"a list of {len(out):,} entries" if isinstance(out, list) else f"a value of type {type(out).__name__}"
            )
            raise InputError(
                f"{where}: the map function {self._name} returned {got} for {n:,} records; {BATCH_RETURNS}"
            )
        return [sample for w, value in zip(wheres, out) for sample in self._results(w, value)]


def _length(column: Any) -> int | None:
    """The entries of a returned column (a list, tuple or array); None for a value that is not one."""
    if isinstance(column, (str, bytes, Mapping)) or not hasattr(column, "__getitem__"):
        return None
    try:
        return len(column)
    except TypeError:  # a 0-d array
        return None
