"""Equal batch counts: splitting, filler batches and dropping."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardload.plan.equalize import equalize_batches, split_batches


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=30), st.data())
def test_split_batches_cuts_the_largest_as_evenly_as_possible(sizes: list[int], data: st.DataObject) -> None:
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    target = data.draw(st.integers(len(sizes), int(offsets[-1])))
    new = split_batches(offsets, target)
    pieces = np.diff(new)
    # Invariant: exactly target non-empty batches over the same rows, in the same order
    assert len(pieces) == target and (pieces >= 1).all() and new[-1] == offsets[-1]
    # Invariant: pieces only cut batches (old boundaries stay), near-equal within a batch
    assert set(offsets.tolist()) <= set(new.tolist())
    parts = np.diff(np.searchsorted(new, offsets))  # pieces per original batch
    for i in range(len(sizes)):
        own = pieces[np.searchsorted(new, offsets[i]) : np.searchsorted(new, offsets[i + 1])]
        assert own.max() - own.min() <= 1
    # Invariant: the largest piece is as small as any split into target pieces allows
    largest = int(pieces.max())
    if largest > 1:
        assert int((-(-np.asarray(sizes) // (largest - 1))).sum()) > target
    # Invariant: larger batches are cut into at least as many pieces as smaller ones
    for i in range(len(sizes)):
        for j in range(len(sizes)):
            if sizes[j] > sizes[i]:
                assert parts[j] >= parts[i]


def test_split_a_few_batches_short_halves_the_largest() -> None:
    offsets = np.array([0, 4, 12, 15, 25])  # sizes 4, 8, 3, 10
    # Invariant: two batches short -> the two largest are cut in two
    assert np.diff(split_batches(offsets, 6)).tolist() == [4, 4, 4, 3, 5, 5]


def test_pad_appends_single_row_filler_batches() -> None:
    ids, weights, offsets = equalize_batches(
        np.array([5, 6, 7]), np.array([0, 2, 3]), target=4, uneven="pad", filler_id=6
    )
    # Invariant: filler batches have one row repeating a real id with weight 0
    assert ids.tolist() == [5, 6, 7, 6, 6]
    assert weights.tolist() == [1, 1, 1, 0, 0]
    assert offsets.tolist() == [0, 2, 3, 4, 5]


def test_split_with_too_few_rows_makes_singletons_then_filler() -> None:
    ids, weights, offsets = equalize_batches(np.array([5, 6]), np.array([0, 2]), target=4, uneven="split", filler_id=5)
    # Invariant: nothing is repeated as a real row; the shortfall is masked filler
    assert offsets.tolist() == [0, 1, 2, 3, 4]
    assert ids.tolist() == [5, 6, 5, 5] and weights.tolist() == [1, 1, 0, 0]


def test_empty_rank_gets_only_filler() -> None:
    ids, weights, offsets = equalize_batches(
        np.zeros(0, np.int64), np.zeros(1, np.int64), target=2, uneven="split", filler_id=9
    )
    assert ids.tolist() == [9, 9] and weights.tolist() == [0, 0] and offsets.tolist() == [0, 1, 2]


def test_drop_truncates_trailing_batches() -> None:
    ids, weights, offsets = equalize_batches(np.arange(6), np.array([0, 2, 4, 6]), target=2, uneven="drop", filler_id=0)
    # Invariant: drop keeps the first target batches, all real
    assert ids.tolist() == [0, 1, 2, 3] and offsets.tolist() == [0, 2, 4]
    assert weights.tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize("uneven", ["split", "pad"])
def test_already_at_target_is_unchanged(uneven: str) -> None:
    _, weights, offsets = equalize_batches(np.arange(4), np.array([0, 3, 4]), target=2, uneven=uneven, filler_id=0)
    assert offsets.tolist() == [0, 3, 4] and weights.sum() == 4
