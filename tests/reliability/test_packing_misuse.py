"""Packed batches, misused as a careless user who read only the docs would.

Each test is one problem found by misusing the documented packing API
(``Batching(packing=True, ...)``, ``make_loader``, ``shardload plan
--packing``): the misuse now ends in a ``ShardloadError`` naming the option,
sample or field and what to do, where the options are written, instead of an
internal error (exit 70), an error deferred to the first batch, or advice that
does not apply.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import shardload
from shardload import Batching
from shardload.cli import main
from shardload.errors import PlanError


def _token_set(path: Path, lengths: list[int], **extra: int) -> Path:
    """A set of ``tokens`` samples of the given lengths; ``extra`` adds a field ``name`` of ``len + delta`` rows."""
    samples = []
    for n in lengths:
        sample = {"tokens": np.arange(n, dtype=np.int32)}
        sample.update({name: np.zeros(n + delta, dtype=np.int16) for name, delta in extra.items()})
        samples.append(sample)
    shardload.write(samples, path, num_shards=2, shuffle=False, progress=False)
    return path


@pytest.mark.parametrize(("length", "rows"), [(1 << 40, 1 << 40), (1 << 62, 1 << 62), (1 << 31, 1), (1 << 20, 1 << 12)])
def test_packed_batches_beyond_int32_tokens_are_refused_where_written(
    tmp_path: Path, length: int, rows: int, capsys: pytest.CaptureFixture[str]
) -> None:
    # Invariant: rows_per_batch * pack_length over 2**31 - 1 (what cu_seqlens counts) is refused by Batching itself,
    # naming both options, so `shardload plan` exits 6 instead of 70 (an OverflowError in the summary's counts).
    with pytest.raises(PlanError, match=r"rows_per_batch \* pack_length .* cu_seqlens"):
        Batching(packing=True, pack_length=length, rows_per_batch=rows)
    out = _token_set(tmp_path / "set", [3, 5, 2])
    argv = ["plan", str(out), "--world-size", "2", "--packing", "--pack-length", str(length)]
    assert main([*argv, "--rows-per-batch", str(rows), "--pack-split"]) == 6
    err = capsys.readouterr().err
    assert "internal error" not in err and "rows_per_batch * pack_length" in err
    assert Batching(packing=True, pack_length=(1 << 31) - 1, rows_per_batch=1).pack_length == (1 << 31) - 1


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_sample_longer_than_a_row_is_refused_when_the_loader_is_built(tmp_path: Path, num_workers: int) -> None:
    # Invariant: without pack_split, a sample longer than pack_length is refused by make_loader (and the
    # DataModule), naming the sample, not at the first len()/iteration (where, with workers, torch also printed a
    # traceback of its half-built iterator).
    out = _token_set(tmp_path / "set", [3, 9, 0, 4])
    batching = Batching(packing=True, pack_length=8, rows_per_batch=2)
    with pytest.raises(PlanError, match=r"sample 1 has 9 tokens, more than pack_length=8.*pack_split=True"):
        shardload.make_loader(out, batching=batching, rank=0, world_size=1, num_workers=num_workers)
    split = Batching(packing=True, pack_length=8, rows_per_batch=2, pack_split=True)
    loader = shardload.make_loader(out, batching=split, rank=0, world_size=1, num_workers=num_workers)
    assert sum(int(b["weight"].sum()) for b in loader) == 5  # 0, 3, 4 and the two pieces of 9


def test_the_advice_for_a_lone_field_shorter_than_the_batching_length_applies(tmp_path: Path) -> None:
    # Invariant: when the one loaded variable field differs from the batching length (set by another field), the
    # error says where that length comes from and how to change it (length_field), not "load only fields of equal
    # lengths" (the user already does); following the advice gives packed batches.
    out = _token_set(tmp_path / "set", [3, 5, 2], labels=1)  # labels one longer: the batching length
    batching = Batching(packing=True, pack_length=8, rows_per_batch=2)
    with pytest.raises(PlanError, match=r"field 'tokens' of sample 0 .* length_field='tokens'") as caught:
        shardload.make_loader(out, batching=batching, fields=("tokens",), rank=0, world_size=1)
    assert "equal lengths" not in str(caught.value)
    fixed = tmp_path / "by_tokens"
    samples = [{"tokens": np.arange(n, dtype=np.int32), "labels": np.zeros(n + 1, np.int16)} for n in (3, 5, 2)]
    shardload.write(samples, fixed, num_shards=2, shuffle=False, progress=False, length_field="tokens")
    loader = shardload.make_loader(fixed, batching=batching, fields=("tokens",), rank=0, world_size=1, stage="val")
    assert sorted(int(n) for b in loader for n in b["tokens_lengths"]) == [2, 3, 5]


def test_a_sample_cut_into_more_pieces_than_a_plan_can_hold_is_refused_when_counting() -> None:
    from shardload.plan import EpochSpec, PlanInputs
    from shardload.plan.planner import EpochPlanner

    lengths = np.full(1000, 10, dtype=np.int64)
    lengths[17] = 10**9
    inputs = PlanInputs(lengths, np.array([500, 500]))
    spec = EpochSpec(world_size=2, stage="val")
    # Invariant: a sample that pack_split would cut into ~10**8 rows (a build of ~20 GB, minutes) is refused when
    # the ranks are counted, naming the sample, its length and pack_length, before any rank's plan is built
    with pytest.raises(
        PlanError, match=r"sample 17 has 1000000000 tokens: pack_split.*125,000,000 pieces.*pack_length"
    ):
        EpochPlanner(inputs, spec, Batching(packing=True, pack_length=8, rows_per_batch=8, pack_split=True))
    # the same sample in rows of 4096 tokens is 244,141 pieces: planned
    plan = EpochPlanner(inputs, spec, Batching(packing=True, pack_length=4096, rows_per_batch=8, pack_split=True))
    assert plan.plan(0).num_real + plan.plan(1).num_real == 999 + 244_141
