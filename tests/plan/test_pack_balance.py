"""Packed evaluation: ranks cut by the rows they pack, so no rank gets more than one batch of filler."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from shardload.plan import Batching, EpochSpec, MixInputs, PlanInputs
from shardload.plan.options import EVAL_STAGES
from shardload.plan.planner import EpochPlanner, _batcher_of

from .strategies import long_tailed, partition
from .test_pack import _check


def _pieces_then_short(num: int, seed: int, pack_length: int) -> NDArray[np.int64]:
    """``(num,)`` lengths of two corpora one after the other: long documents cut into rows by a map (full rows
    and a last piece each), then short documents, as a map that splits records prepares them."""
    rng = np.random.default_rng(seed)
    docs = np.clip(rng.lognormal(np.log(2 * pack_length), 1.0, max(num // 4, 1)), 1, 20 * pack_length).astype(int)
    pieces = [[pack_length] * (d // pack_length) + ([d % pack_length] if d % pack_length else []) for d in docs]
    short = rng.integers(1, pack_length // 3 + 2, num)
    return np.concatenate([np.concatenate(pieces), short])[:num].astype(np.int64)


@st.composite
def eval_cases(draw: st.DrawFn) -> tuple[PlanInputs, EpochSpec, Batching]:
    num = draw(st.one_of(st.integers(0, 40), st.integers(0, 2000)))
    seed = draw(st.integers(0, 2**32 - 1))
    pack_length = draw(st.sampled_from([1, 7, 64, 512, 4096]))
    kind = draw(st.sampled_from(["pieces then short", "pieces then short", "lognormal", "zeros", "giant"]))
    if kind == "pieces then short":
        lengths = _pieces_then_short(num, seed, pack_length)
    else:
        lengths = np.minimum(long_tailed(num, seed, kind), pack_length)  # every sample fits a row
    batching = Batching(
        packing=True,
        pack_length=pack_length,
        rows_per_batch=draw(st.integers(1, 8)),
        uneven=draw(st.sampled_from(["split", "pad"])),
    )
    spec = EpochSpec(
        world_size=draw(st.one_of(st.integers(1, 8), st.integers(1, 64))),
        stage=draw(st.sampled_from(sorted(EVAL_STAGES))),
    )
    sizes = partition(num, draw(st.integers(1, 30)), seed, allow_empty=draw(st.booleans()))
    return PlanInputs(lengths, sizes), spec, batching


@settings(max_examples=150, deadline=None)
@given(eval_cases())
def test_no_rank_gets_more_than_one_filler_batch(case: tuple[PlanInputs, EpochSpec, Batching]) -> None:
    inputs, spec, batching = case
    planner = EpochPlanner(inputs, spec, batching)
    needed = planner.rank_batch_counts  # (W,) the batches each rank's packing needs
    # Invariant: with every sample within a row, each rank gets at most one batch more than its packing needs
    assert int((planner.num_batches - needed).max()) <= 1
    # Invariant: never more batches than the cut at equal tokens needs on its largest rank
    by_tokens = _batcher_of(inputs, spec, batching, spec.seed, None).count_batches()
    assert planner.num_batches <= int(by_tokens.max())


@settings(max_examples=60, deadline=None)
@given(eval_cases(), st.booleans())
def test_recut_ranks_keep_every_guarantee(case: tuple[PlanInputs, EpochSpec, Batching], split: bool) -> None:
    inputs, spec, batching = case
    if split:  # pieces of samples longer than a row (up to 3 each) move with their sample
        assert batching.pack_length is not None
        inputs = PlanInputs(np.minimum(inputs.lengths * 3, 3 * batching.pack_length), inputs.shard_sizes)
        batching = Batching(
            packing=True,
            pack_length=batching.pack_length,
            rows_per_batch=batching.rows_per_batch,
            uneven=batching.uneven,
            pack_split=True,
        )
    planner = EpochPlanner(inputs, spec, batching)
    # Invariant: the ranges still tile the epoch in order (each rank one contiguous run of the shards)
    assert planner.layout.rank_starts[0] == 0 and planner.layout.rank_starts[-1] == inputs.num_samples
    assert (np.diff(planner.layout.rank_starts) >= (1 if inputs.num_samples >= spec.world_size else 0)).all()
    # every sample (piece) once, equal batch counts, rows within pack_length, all ranks at once = each alone
    _check(inputs, spec, batching)


@st.composite
def eval_mixtures(draw: st.DrawFn) -> tuple[MixInputs, EpochSpec, Batching]:
    pack_length = draw(st.sampled_from([7, 64, 512]))
    sources = []
    for _ in range(draw(st.integers(1, 3))):
        num = draw(st.one_of(st.integers(0, 40), st.integers(0, 1000)))
        seed = draw(st.integers(0, 2**32 - 1))
        if draw(st.booleans()):
            lengths = _pieces_then_short(num, seed, pack_length)
        else:
            lengths = np.minimum(long_tailed(num, seed), pack_length)
        sources.append(PlanInputs(lengths, partition(num, draw(st.integers(1, 10)), seed, allow_empty=True)))
    names = tuple(f"s{k}" for k in range(len(sources)))
    mix = MixInputs(tuple(sources), names, None, by=draw(st.sampled_from(["tokens", "samples"])))
    batching = Batching(packing=True, pack_length=pack_length, rows_per_batch=draw(st.integers(1, 8)))
    return mix, EpochSpec(world_size=draw(st.one_of(st.integers(1, 8), st.integers(1, 64))), stage="val"), batching


@settings(max_examples=80, deadline=None)
@given(eval_mixtures())
def test_a_mixture_gives_no_rank_more_filler_than_one_batch_a_source(
    case: tuple[MixInputs, EpochSpec, Batching],
) -> None:
    mix, spec, batching = case
    planner = EpochPlanner(mix, spec, batching)
    # Invariant: evaluating several sets, each rank gets at most one batch per source more than its packing needs
    assert int((planner.num_batches - planner.rank_batch_counts).max()) <= len(mix.sources)
    plans = list(planner.plans())
    ids = np.sort(np.concatenate([p.sample_ids[p.weights > 0] for p in plans]))
    # Invariant: every sample of every source once, and every rank the same number of batches
    assert np.array_equal(ids, np.arange(sum(s.num_samples for s in mix.sources)))
    assert {len(p) for p in plans} == {planner.num_batches}


def test_two_corpora_in_natural_order_get_no_extra_batches() -> None:
    # long documents cut into rows of 512 by a map, then short documents: the layout that gave one rank 4 filler batches
    lengths = _pieces_then_short(700, seed=5, pack_length=512)
    inputs = PlanInputs(lengths, np.array([300, 400]))
    spec = EpochSpec(world_size=2, stage="val")
    batching = Batching(packing=True, pack_length=512, rows_per_batch=2)
    by_tokens = _batcher_of(inputs, spec, batching, 0, None).count_batches()
    assert int(by_tokens.max() - by_tokens.min()) >= 2  # cut at equal tokens, rank 1 would get filler batches
    planner = EpochPlanner(inputs, spec, batching)
    # Invariant: cut by rows, the ranks need the same batches within one
    assert int(planner.rank_batch_counts.max() - planner.rank_batch_counts.min()) <= 1
    assert planner.num_batches < int(by_tokens.max())


def test_balanced_plans_keep_their_cuts_and_fingerprint() -> None:
    lengths = long_tailed(3000, seed=2)
    inputs = PlanInputs(np.minimum(lengths, 4096), np.full(3, 1000))
    spec = EpochSpec(world_size=3, stage="val")
    batching = Batching(packing=True, pack_length=4096, rows_per_batch=2)
    by_tokens = _batcher_of(inputs, spec, batching, 0, None)
    counts = by_tokens.count_batches()
    assert int(counts.max() - counts.min()) <= 1
    planner = EpochPlanner(inputs, spec, batching)
    # Invariant: ranks whose packings already agree within a batch keep the cut at equal tokens (same plan bytes)
    assert np.array_equal(planner.layout.rank_starts, by_tokens.layout.rank_starts)
    assert not planner.cut_by_rows
