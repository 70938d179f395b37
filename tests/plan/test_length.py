"""One length for every training epoch of a run (shardload/plan/length.py)."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardload.errors import PlanError
from shardload.plan import Batching, EpochSpec, MixInputs, PlanInputs, RankPlan
from shardload.plan import planner as planner_module
from shardload.plan.length import PROBE_EPOCHS, EpochLengthWarning, draw_seed
from shardload.plan.planner import EpochPlanner

from .strategies import cases, long_tailed, partition

EPOCHS = 10


def unlike(num: int, shards: int, seed: int) -> PlanInputs:
    """Shards of short, medium and long samples in turn: the natural count of an epoch varies most."""
    sizes = partition(num, shards, seed, allow_empty=False)
    scale = np.repeat(np.array([1, 4, 12])[np.arange(shards) % 3], sizes)
    return PlanInputs(np.minimum(long_tailed(num, seed) * scale // 4 + 1, 4000), sizes)


MODES = {
    "fixed": Batching(batch_size=7),
    "tokens": Batching(max_tokens=900, bucketing=False),
    "buckets": Batching(max_tokens=900),
    "packing": Batching(packing=True, pack_length=256, rows_per_batch=3, pack_split=True),
    "packing, no split": Batching(packing=True, pack_length=4000, rows_per_batch=1),
    "buckets, pad": Batching(max_tokens=900, uneven="pad"),
    "buckets, drop": Batching(max_tokens=900, uneven="drop"),
}


def counts(inputs: PlanInputs | MixInputs, spec: EpochSpec, batching: Batching, *, steady: bool) -> list[int]:
    return [EpochPlanner(inputs, spec.at_epoch(e), batching, steady=steady).num_batches for e in range(EPOCHS)]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("world", [3, 8])
def test_every_training_epoch_has_the_same_length_where_natural_counts_vary(mode: str, world: int) -> None:
    inputs, batching = unlike(6000, 48, seed=world), MODES[mode]
    spec = EpochSpec(world_size=world, seed=11)
    with warnings.catch_warnings():
        warnings.simplefilter("error", EpochLengthWarning)
        steady = counts(inputs, spec, batching, steady=True)
    natural = counts(inputs, spec, batching, steady=False)
    # the set is one whose epochs differ (a fixed batch_size cannot: its count is the same every epoch)
    assert (len(set(natural)) > 1) == (mode != "fixed"), natural
    # Invariant: one length for every epoch, reachable by every rank of every epoch
    assert len(set(steady)) == 1
    if batching.uneven == "drop":
        assert steady[0] <= min(natural[:PROBE_EPOCHS])
    else:
        assert steady[0] >= max(natural[:PROBE_EPOCHS])
    # the cost: a few more steps than the natural mean (the margin of the probes' spread)
    assert abs(steady[0] / np.mean(natural) - 1) < 0.1


def test_a_mixture_has_the_same_length_every_epoch() -> None:
    mix = MixInputs((unlike(3000, 24, 1), unlike(800, 6, 2)), ("web", "code"), {"web": 0.7, "code": 0.3})
    spec, batching = EpochSpec(world_size=4, seed=5), Batching(max_tokens=900)
    with warnings.catch_warnings():
        warnings.simplefilter("error", EpochLengthWarning)
        assert len(set(counts(mix, spec, batching, steady=True))) == 1
    assert len(set(counts(mix, spec, batching, steady=False))) > 1


def test_a_fixed_batch_size_plans_exactly_as_the_epoch_alone_would() -> None:
    inputs = unlike(5000, 40, 3)
    spec, batching = EpochSpec(world_size=6, seed=2, epoch=7), Batching(batch_size=16)
    steady, natural = EpochPlanner(inputs, spec, batching), EpochPlanner(inputs, spec, batching, steady=False)
    # Invariant: no step added and no draw where every epoch needs the same count
    assert steady.draw == 0 and steady.fingerprint == natural.fingerprint
    assert all(np.array_equal(a.sample_ids, b.sample_ids) for a, b in zip(steady.plans(), natural.plans()))


def test_an_epoch_that_needs_more_is_drawn_again_and_names_its_draw() -> None:
    inputs, batching = unlike(6000, 48, 8), Batching(max_tokens=900)
    spec = EpochSpec(world_size=8, seed=11)
    redrawn = [p for p in (EpochPlanner(inputs, spec.at_epoch(e), batching) for e in range(40)) if p.draw]
    assert redrawn, "no epoch of 40 needed a second draw: the test no longer tests draws"
    first = redrawn[0]
    natural = EpochPlanner(inputs, first.spec, batching, steady=False)
    # Invariant: a redrawn epoch has its own orders, its draw in the fingerprint, and every sample once
    assert first.fingerprint != natural.fingerprint
    ids = np.concatenate([p.sample_ids[p.weights > 0] for p in first.plans()])
    assert np.array_equal(np.sort(ids), np.arange(inputs.num_samples))
    assert draw_seed(11, first.draw) != 11 and draw_seed(11, 0) == 11


@pytest.mark.parametrize("mode", ["tokens", "buckets", "packing", "buckets, drop"])
def test_an_epoch_no_draw_fits_is_held_to_the_runs_length_and_warns(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(planner_module, "MAX_DRAWS", 1)  # no second draw: an epoch off the steps cannot fit
    inputs, batching = unlike(6000, 48, 8), MODES[mode]
    spec = EpochSpec(world_size=8, seed=11)
    steps = EpochPlanner(inputs, spec, batching).num_batches
    for epoch in range(PROBE_EPOCHS, 80):
        natural = EpochPlanner(inputs, spec.at_epoch(epoch), batching, steady=False)
        counts = natural.rank_batch_counts
        if (counts.min() < steps) if batching.uneven == "drop" else (counts.max() > steps):
            break
    else:
        pytest.fail("no epoch of 80 is off the run's steps: the test no longer tests the fallback")
    with pytest.warns(EpochLengthWarning, match=f"training epoch {epoch} "):
        planner = EpochPlanner(inputs, spec.at_epoch(epoch), batching)
    plans = list(planner.plans())
    # Invariant: the run's length and equal counts on every rank, whatever the epoch needs
    assert planner.num_batches == steps and {len(p) for p in plans} == {steps}

    def entries(plans: list[RankPlan]) -> set[tuple[int, int]]:
        """Every real ``(sample, first token)`` the plans train (pieces of a cut sample apart), checked once each."""
        got = [
            (i, s)
            for p in plans
            for i, s in zip(
                p.sample_ids[p.weights > 0].tolist(),
                (p.starts if p.starts is not None else p.sample_ids * 0)[p.weights > 0].tolist(),
            )
        ]
        assert len(set(got)) == len(got)  # nothing twice
        return set(got)

    held, alone = entries(plans), entries(list(natural.plans()))
    if batching.uneven == "drop":  # the epoch alone drops to its smallest rank; held, to the run's steps
        assert len(held) >= len(alone)
    else:  # only the batches above the steps are left out (a rank below them splits: loses nothing)
        assert held < alone


def test_evaluation_counts_are_not_concerned() -> None:
    inputs, batching = unlike(3000, 24, 4), Batching(max_tokens=900)
    for stage in ("val", "test", "predict"):
        spec = EpochSpec(world_size=5, stage=stage, epoch=3)  # type: ignore[arg-type]
        assert (
            EpochPlanner(inputs, spec, batching).fingerprint
            == EpochPlanner(inputs, spec, batching, steady=False).fingerprint
        )


@settings(max_examples=60)
@given(case=cases(max_samples=3000, stages=("train",)), seed=st.integers(0, 2**32 - 1))
def test_every_epoch_of_a_random_run_has_the_runs_length(case: object, seed: int) -> None:
    inputs = PlanInputs(case.lengths, case.shard_sizes)  # type: ignore[attr-defined]
    spec = EpochSpec(world_size=case.world_size, seed=seed, shard_assignment=case.shard_assignment)  # type: ignore[attr-defined]
    batching = case.batching  # type: ignore[attr-defined]
    try:
        EpochPlanner(inputs, spec, batching)
    except PlanError:  # a sample longer than a packed row without pack_split: refused, as documented
        return
    lengths = set()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", EpochLengthWarning)
        for epoch in range(8):
            planner = EpochPlanner(inputs, spec.at_epoch(epoch), batching)
            plans = list(planner.plans())
            # Invariant: equal counts on every rank, whatever the epoch
            assert {len(p) for p in plans} == {planner.num_batches}
            lengths.add(planner.num_batches)
    # Invariant: one length for every epoch, whatever its draws (a warned epoch is held to it too)
    assert len(lengths) == 1, (lengths, [str(w.message) for w in caught])


def test_steps_are_computed_once_per_run(monkeypatch: pytest.MonkeyPatch) -> None:
    real, probed = planner_module.epoch_steps, []

    def counting(spec: EpochSpec, batching: Batching, natural_of: Any, memo: Any, *, margin: bool) -> int:
        return real(spec, batching, lambda epoch: probed.append(epoch) or natural_of(epoch), memo, margin=margin)

    monkeypatch.setattr(planner_module, "epoch_steps", counting)
    inputs = unlike(3000, 24, 5)
    batching = Batching(packing=True, pack_length=256, rows_per_batch=2, pack_split=True)  # keeps counts too
    spec = EpochSpec(world_size=4, seed=1)
    for epoch in range(40):  # more epochs than the inputs keep results: the run's steps stay
        EpochPlanner(inputs, spec.at_epoch(epoch), batching)
    assert probed == list(range(PROBE_EPOCHS))
    EpochPlanner(inputs, dataclasses.replace(spec, seed=2), batching)  # another run: its own steps
    assert probed == list(range(PROBE_EPOCHS)) * 2
