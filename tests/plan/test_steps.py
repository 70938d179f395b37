"""Per-step balance: training batches heaviest first at positions shared by every rank (plan/steps.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardload.plan import Batching, EpochSpec, PlanInputs, summarize_plan
from shardload.plan.steps import step_positions

from .strategies import Case, batch_costs, cases, long_tailed, partition, plan_all


def _efficiency(costs: list[np.ndarray]) -> float:
    """Sum over steps of the mean cost over ranks / sum of the largest (1.0 when nothing is computed)."""
    table = np.stack(costs)  # (W, T)
    most = int(table.max(axis=0).sum()) if table.size else 0
    return float(table.mean(axis=0).sum() / most) if most else 1.0


@settings(max_examples=200, deadline=None)
@given(cases(stages=("train",)), st.integers(0, 2**32 - 1))
def test_training_steps_match_every_rank_s_kth_heaviest_batch(case: Case, shuffle_seed: int) -> None:
    planner, plans = plan_all(case)
    if not plans or not len(plans[0]):
        return
    costs = [batch_costs(plan, case.lengths, case.batching.pad_to_multiple_of) for plan in plans]
    # the positions of the epoch's draw of its orders (the run's seed, unless redrawn: shardload/plan/length.py)
    position = step_positions(len(plans[0]), shuffle=True, seed=planner.order_seed, epoch=case.epoch)
    for rank_costs in costs:
        # Invariant: the step of a rank's k-th heaviest batch is the same on every rank (shared positions)
        assert (np.diff(rank_costs[position]) <= 0).all()
    rng = np.random.default_rng(shuffle_seed)
    shuffled = [rng.permutation(c) for c in costs]
    # Invariant: with each rank's batches fixed, no other order lets ranks wait less (sum of step maxima is
    # smallest when every rank's batches are ranked alike)
    assert _efficiency(costs) >= _efficiency(shuffled) - 1e-12


@settings(max_examples=100, deadline=None)
@given(cases())
def test_summary_step_efficiency_is_that_of_the_plans(case: Case) -> None:
    if case.stage != "train" and case.batching.uneven == "drop":
        return  # refused (test_planner)
    _, plans = plan_all(case)
    costs = [batch_costs(plan, case.lengths, case.batching.pad_to_multiple_of) for plan in plans]
    summary = summarize_plan(case.inputs(), case.spec(), case.batching)
    # Invariant: PlanSummary.step_efficiency is mean / max padded tokens per step, summed over steps
    assert summary.step_efficiency == pytest.approx(_efficiency(costs), abs=1e-12)
    assert 0 < summary.step_efficiency <= 1


def test_training_order_changes_with_the_epoch_and_the_seed() -> None:
    a, b, c = (step_positions(50, shuffle=True, seed=s, epoch=e).tolist() for s, e in ((0, 1), (0, 2), (1, 1)))
    # Invariant: the shared positions are a permutation drawn from (seed, epoch)
    assert sorted(a) == list(range(50)) and a != b and a != c
    assert step_positions(5, shuffle=False, seed=3, epoch=4).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    ("batching", "floor"),
    [(Batching(max_tokens=16384), 0.97), (Batching(batch_size=32), 0.9)],
)
def test_long_tailed_steps_keep_ranks_busy(batching: Batching, floor: float) -> None:
    lengths = long_tailed(100_000, seed=5)
    inputs = PlanInputs(lengths, partition(100_000, 100, seed=5, allow_empty=False))
    for world in (3, 8):
        summary = summarize_plan(inputs, EpochSpec(world_size=world, seed=2, epoch=1), batching)
        # Invariant: heaviest-first batches at shared positions keep the ranks' steps alike (docs/benchmarks.md)
        assert summary.step_efficiency >= floor


def test_max_tokens_ranks_are_cut_by_tokens() -> None:
    # the first shard holds short samples, the second long ones: equal samples would be unequal work
    lengths = np.concatenate([np.full(3000, 10), np.full(1000, 300)])
    inputs = PlanInputs(lengths, np.array([3000, 1000]))
    spec = EpochSpec(world_size=2, stage="val")
    by_tokens = summarize_plan(inputs, spec, Batching(max_tokens=600))
    by_samples = summarize_plan(inputs, spec, Batching(batch_size=2))
    # Invariant: max_tokens cuts the ranks at equal tokens, batch_size at equal samples
    assert by_tokens.tokens.tolist() == [165_000, 165_000]
    assert by_samples.samples.tolist() == [2000, 2000]
