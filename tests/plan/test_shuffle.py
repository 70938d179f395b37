"""Seeded generators and batch reordering."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardload.plan.shuffle import epoch_rng, permute_batches, rank_rng


def test_generators_are_pure_functions_of_their_key() -> None:
    # Invariant: same key, same stream; a different key gives another stream
    assert epoch_rng(1, 2).integers(0, 2**62) == epoch_rng(1, 2).integers(0, 2**62)
    assert rank_rng(1, 2, 3).integers(0, 2**62) == rank_rng(1, 2, 3).integers(0, 2**62)
    draws = {rank_rng(1, 2, r).integers(0, 2**62) for r in range(8)}
    draws |= {rank_rng(1, e, 0).integers(0, 2**62) for e in range(3, 6)}
    draws.add(epoch_rng(1, 2).integers(0, 2**62))
    assert len(draws) == 12


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 5), max_size=20), st.randoms(use_true_random=False))
def test_permute_batches_moves_whole_batches(sizes: list[int], random) -> None:
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    ids = np.arange(offsets[-1], dtype=np.int64) * 10
    perm = np.array(random.sample(range(len(sizes)), len(sizes)), dtype=np.int64)
    new_ids, new_offsets = permute_batches(ids, offsets, perm)
    for i, j in enumerate(perm):
        # Invariant: output batch i is input batch perm[i], rows in the same order
        assert new_ids[new_offsets[i] : new_offsets[i + 1]].tolist() == (ids[offsets[j] : offsets[j + 1]].tolist())
    assert new_offsets[-1] == offsets[-1]
