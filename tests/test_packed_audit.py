"""Auditing packed batches: each document's (sample_id, sample_start, tokens) puts it back in its sample.

With ``pack_split`` a sample longer than ``pack_length`` is cut into pieces that
travel in different rows, batches and ranks. ``batch["sample_start"]`` says
where in its sample each piece begins, so an epoch can be checked token by token:
every token of every sample exactly once, in its place, over all ranks, also
across a checkpoint resumed on another world size, with or without workers.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import shardload
from shardload import make_loader
from shardload.plan import Batching

Batch = dict[str, Any]
BATCHING = Batching(packing=True, pack_length=64, rows_per_batch=3, pack_split=True)


@pytest.fixture(scope="module")
def token_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """70 samples of 0 to 300 distinct random tokens (a piece out of place cannot match by chance)."""
    rng = np.random.default_rng(7)
    lengths = [0, 64, 65, 128, *rng.integers(1, 300, 66).tolist()]
    samples = [{"tokens": rng.integers(0, 2**31 - 1, n).astype(np.int32)} for n in lengths]
    out = tmp_path_factory.mktemp("audit") / "set"
    shardload.write(samples, out, num_shards=4, progress=False)
    return out


def audit(batches: Iterable[Batch], path: Path) -> None:
    """Every token of every sample of ``path`` served exactly once, where ``sample_start`` says it belongs.

    A document's tokens are those of its row where ``document_ids`` names it (in order); its sample
    ``sample_id``'s tokens from ``sample_start`` on must be the same. Filler documents (weight 0) are left out.
    """
    ds = shardload.open(path)
    want = [ds[i]["tokens"] for i in range(len(ds))]
    served = [np.zeros(len(t), np.int64) for t in want]
    for b in batches:
        flat, docs = b["tokens"].reshape(-1).numpy(), b["document_ids"].reshape(-1).numpy()
        assert b["sample_start"].dtype == torch.int64 and b["sample_start"].shape == b["sample_id"].shape
        for d in np.flatnonzero(b["weight"].numpy() > 0):
            sid, start, n = (int(b[k][d]) for k in ("sample_id", "sample_start", "tokens_lengths"))
            got = flat[docs == d]
            assert len(got) == n
            # Invariant: the document is its sample's tokens [start, start + n)
            np.testing.assert_array_equal(got, want[sid][start : start + n], err_msg=f"sample {sid} from {start}")
            served[sid][start : start + n] += 1
    # Invariant: every token of every sample once over the epoch
    assert [np.flatnonzero(s != 1).tolist() for s in served] == [[] for _ in served]


def epoch(path: Path, world: int, **kw: Any) -> list[list[Batch]]:
    """One epoch of every rank of a ``world``-rank job, simulated in this process."""
    return [list(make_loader(path, batching=BATCHING, rank=r, world_size=world, seed=3, **kw)) for r in range(world)]


@pytest.mark.parametrize("stage", ["train", "val"])
@pytest.mark.parametrize("world", [1, 3])
def test_every_token_is_served_once_in_its_place(token_set: Path, world: int, stage: str) -> None:
    served = epoch(token_set, world, stage=stage)
    # some sample is cut, and a piece other than the first is served
    assert any(int(b["sample_start"].max()) > 0 for batches in served for b in batches)
    audit((b for batches in served for b in batches), token_set)


def test_wrong_starts_fail_the_audit(token_set: Path) -> None:
    batches = [dict(b) for b in epoch(token_set, 1)[0]]
    for b in batches:  # what a loader without sample_start would leave a user: every piece from token 0
        b["sample_start"] = torch.zeros_like(b["sample_start"])
    with pytest.raises(AssertionError):
        audit(batches, token_set)


def test_workers_serve_the_same_starts(token_set: Path) -> None:
    main = epoch(token_set, 2)
    workers = epoch(token_set, 2, num_workers=2)
    for a, b in zip((x for r in main for x in r), (x for r in workers for x in r), strict=True):
        assert list(a) == list(b)
        for key in ("sample_id", "sample_start", "tokens", "document_ids"):
            assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("chain", [[(2, 3), (2, None)], [(3, 2), (2, None)]], ids=["same world", "3 to 2 ranks"])
def test_a_resumed_epoch_serves_every_token_once(token_set: Path, chain: list[tuple[int, int | None]]) -> None:
    state: dict[str, Any] | None = None
    served: list[Batch] = []
    for world, steps in chain:
        states = []
        for rank in range(world):
            loader = make_loader(token_set, batching=BATCHING, rank=rank, world_size=world, seed=3)
            if state is not None:
                loader.load_state_dict(state)
            it = iter(loader)
            served += list(it) if steps is None else [next(it) for _ in range(steps)]
            states.append(loader.state_dict())
        state = states[0]
    audit(served, token_set)
