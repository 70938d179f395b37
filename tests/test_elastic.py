"""Elastic resume through the loader: a state saved on W ranks resumes on W' ranks (a plain loop).

Each segment builds one loader per rank, as a torchrun job would, restores
the previous segment's state (taken on rank 0: the state is the same on every
rank), runs some steps and saves. What the ranks served over all segments is
checked sample by sample; tests/distributed/test_elastic_ddp.py does the same
through Lightning and real processes.
"""

from __future__ import annotations

from collections import Counter
from itertools import islice
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import shardload
from shardload import Mixture, make_loader
from shardload.errors import PlanError, PlanMismatchError
from shardload.integrations.trainer import train_link
from shardload.load.loader import PlanSampler
from shardload.load.world import World
from shardload.plan import Batching, EpochSpec, PlanInputs
from shardload.testing import synthetic_samples
from tests.plan.strategies import long_tailed, partition
from tests.plan.test_resume import batchings

Batch = dict[str, torch.Tensor]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("elastic") / "set"
    shardload.write(synthetic_samples(160, seed=4), out, num_shards=7, progress=False)
    return out


def token_set(path: Path, n: int, longest: int = 700) -> Path:
    """A set of ``n`` samples of one token field (packing's batching length), written once."""
    if not path.exists():
        rng = np.random.default_rng(0)
        samples = [{"tokens": rng.integers(0, 9, k).astype(np.int32)} for k in rng.integers(1, longest, n)]
        shardload.write(samples, path, num_shards=3, progress=False)
    return path


def segment(
    source: Any, world: int, state: dict[str, Any] | None, steps: int | None, **kw: Any
) -> tuple[list[list[Batch]], dict[str, Any], list[int]]:
    """Every rank of a ``world``-rank job: restore ``state``, run ``steps`` batches (None: to the end), save."""
    served, states, lengths = [], [], []
    for rank in range(world):
        loader = make_loader(source, rank=rank, world_size=world, **kw)
        if state is not None:
            loader.load_state_dict(state)
        it = iter(loader)
        served.append(list(it) if steps is None else [next(it) for _ in range(steps)])
        states.append(loader.state_dict())
        lengths.append(len(loader))
    # Invariant: the state is the same on every rank, so rank 0's checkpoint resumes them all
    assert all(s == states[0] for s in states)
    return served, states[0], lengths


def real_ids(served: list[list[Batch]]) -> list[int]:
    return [i for batches in served for b in batches for i in b["sample_id"][b["weight"] > 0].tolist()]


def run_chain(source: Any, chain: list[tuple[int, int | None]], **kw: Any) -> tuple[list[int], list[list[Batch]]]:
    """The real sample ids served over a chain of ``(world_size, steps)`` segments, and the last segment's batches."""
    state, ids, last = None, [], []
    for world, steps in chain:
        last, state, lengths = segment(source, world, state, steps, **kw)
        if steps is None:
            # Invariant: equal batch counts on the new ranks; len() counts the epoch's steps before the resume too
            assert len({len(b) for b in last}) == 1
            done = sum(s for _, s in chain[:-1] if s)
            assert lengths == [done + len(last[0])] * world
        ids += real_ids(last)
    return ids, last


@pytest.mark.parametrize(
    "batching",
    [
        Batching(batch_size=6),
        Batching(max_tokens=900),
        Batching(max_tokens=900, bucketing=True),
        Batching(packing=True, pack_length=1024, rows_per_batch=2),
    ],
    ids=["fixed", "tokens", "buckets", "packing"],
)
def test_three_ranks_to_two_serves_every_sample_of_the_epoch_once(data: Path, batching: Batching) -> None:
    source = token_set(data.parent / "tokens", 160) if batching.packing else data  # packing: one variable field
    ids, _ = run_chain(source, [(3, 2), (2, None)], batching=batching, seed=3, epoch=1)
    assert sorted(ids) == list(range(160))


def test_a_chain_of_world_sizes_composes(data: Path) -> None:
    ids, _ = run_chain(data, [(8, 1), (3, 2), (5, None)], max_tokens=900, seed=1)
    assert sorted(ids) == list(range(160))


def test_num_workers_may_change_and_the_next_epoch_is_planned_normally(data: Path) -> None:
    _, state, _ = segment(data, 3, None, 2, max_tokens=900)
    fresh = make_loader(data, rank=1, world_size=2, max_tokens=900, epoch=1)
    resumed = make_loader(data, rank=1, world_size=2, max_tokens=900, num_workers=1)
    resumed.load_state_dict(state)
    assert len(list(resumed)) > 0
    resumed.set_epoch(1)
    # Invariant: after the resumed epoch, the next one is the W' run's own
    assert [b["sample_id"].tolist() for b in resumed] == [b["sample_id"].tolist() for b in fresh]


def test_evaluation_resumes_exactly_with_weight_one(data: Path) -> None:
    state, served = None, []
    for world, steps in [(4, 3), (3, None)]:
        got, state, _ = segment(data, world, state, steps, stage="val", max_tokens=700)
        served += [b for batches in got for b in batches]
    weights = torch.cat([b["weight"] for b in served])
    assert set(weights.tolist()) <= {0.0, 1.0}
    assert sorted(real_ids([served])) == list(range(160))


def test_same_world_size_after_a_change_resumes_identically(data: Path) -> None:
    _, state, _ = segment(data, 4, None, 2, batch_size=5, seed=2)
    _, mid, _ = segment(data, 2, state, 3, batch_size=5, seed=2)
    whole, _, _ = segment(data, 2, state, None, batch_size=5, seed=2)
    rest, _, _ = segment(data, 2, mid, None, batch_size=5, seed=2)
    # Invariant: resuming on the world size that saved is the uninterrupted run's remaining batches
    for r in range(2):
        assert [b["sample_id"].tolist() for b in rest[r]] == [b["sample_id"].tolist() for b in whole[r][3:]]


def test_a_mixture_resumes_with_each_selected_use_once(tmp_path: Path) -> None:
    paths = {"web": tmp_path / "web", "code": tmp_path / "code"}
    shardload.write(synthetic_samples(90, seed=1), paths["web"], num_shards=4, progress=False)
    shardload.write(synthetic_samples(25, seed=2, median_tokens=60), paths["code"], num_shards=2, progress=False)
    mix = Mixture({k: str(v) for k, v in paths.items()}, weights={"web": 1, "code": 1})
    whole, _, _ = segment(mix, 3, None, None, max_tokens=800, seed=5)
    ids, _ = run_chain(mix, [(3, 2), (2, None)], max_tokens=800, seed=5)
    # Invariant: the uninterrupted epoch's uses (code is repeated to reach its weight), each once
    assert Counter(ids) == Counter(real_ids(whole))
    assert max(Counter(ids).values()) > 1


def test_pieces_of_cut_samples_are_each_served_once(tmp_path: Path) -> None:
    token_set(tmp_path / "s", 80)
    batching = Batching(packing=True, pack_length=128, rows_per_batch=3, pack_split=True)
    tokens: Counter[int] = Counter()
    state = None
    for world, steps in [(2, 3), (3, None)]:
        got, state, _ = segment(tmp_path / "s", world, state, steps, batching=batching, seed=1)
        for b in (b for batches in got for b in batches):
            real = b["weight"] > 0
            tokens.update(dict.fromkeys(b["sample_id"][real].tolist(), 0))
            for i, n in zip(b["sample_id"][real].tolist(), b["tokens_lengths"][real].tolist()):
                tokens[i] += n
    lengths = shardload.open(tmp_path / "s").lengths
    # Invariant: every token of every sample once: partly served samples resume with exactly their other pieces
    assert tokens == Counter(dict(enumerate(int(n) for n in lengths)))


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"seed": 4}, "seed (3 in the checkpoint, 4 now)"),
        ({"max_tokens": 901}, "batching option max_tokens (900 in the checkpoint, 901 now)"),
        ({"stage": "val"}, "stage ('train' in the checkpoint, 'val' now)"),
    ],
)
def test_a_change_of_run_is_refused_naming_it(data: Path, change: dict[str, Any], named: str) -> None:
    _, state, _ = segment(data, 3, None, 2, max_tokens=900, seed=3)
    loader = make_loader(data, rank=0, world_size=2, **{"max_tokens": 900, "seed": 3, **change})
    with pytest.raises(PlanMismatchError) as err:
        loader.load_state_dict(state)
    assert named in str(err.value)
    assert loader.plan_sampler.history == () and loader.plan_sampler.start == 0


def test_another_shard_set_is_refused_naming_it(data: Path, tmp_path: Path) -> None:
    shardload.write(synthetic_samples(160, seed=5), tmp_path / "other", num_shards=7, progress=False)
    _, state, _ = segment(data, 3, None, 2, batch_size=4)
    with pytest.raises(PlanMismatchError, match="the shard set"):
        make_loader(tmp_path / "other", rank=0, world_size=2, batch_size=4).load_state_dict(state)


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda s: {**s, "history": [[3]]}, "segment 0 must be a [world_size, batches] pair"),
        (lambda s: {**s, "history": "3:2"}, "history must be a list"),
        (lambda s: {**s, "history": [[3, 10**6]]}, "segment 0 ran 1000000 batches"),
        (lambda s: {**s, "identity": None}, "identity must be a dict"),
        (lambda s: {**s, "batches_done": 10**6}, "segment 1 ran 1000000 batches"),
        (lambda s: {**s, "fingerprint": "0" * 40}, "differs from the checkpoint's"),
    ],
)
def test_an_edited_state_is_refused(data: Path, edit: Any, named: str) -> None:
    _, state, _ = segment(data, 3, None, 1, batch_size=4)
    _, state, _ = segment(data, 2, state, 1, batch_size=4)
    loader = make_loader(data, rank=0, world_size=4, batch_size=4)
    with pytest.raises(PlanError) as err:
        loader.load_state_dict(edit(state))
    assert named in str(err.value)


@pytest.mark.parametrize("world", [2, 3])
def test_a_version_1_state_still_resumes(data: Path, world: int) -> None:
    _, state, _ = segment(data, 2, None, 3, batch_size=4, seed=1)
    old = {k: state[k] for k in ("epoch", "batches_done", "fingerprint", "world_size")} | {"version": 1, "rank": 0}
    ref = segment(data, world, state, None, batch_size=4, seed=1)[0]
    got = segment(data, world, old, None, batch_size=4, seed=1)[0]
    assert [[b["sample_id"].tolist() for b in r] for r in got] == [[b["sample_id"].tolist() for b in r] for r in ref]


class InputsOnly:
    """What a PlanSampler reads of a shard set: its plan inputs."""

    def __init__(self, inputs: PlanInputs) -> None:
        self.inputs = inputs

    def plan_inputs(self) -> PlanInputs:
        return self.inputs


def keys(sampler: PlanSampler, steps: int | None) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Run ``steps`` batches (None: to the end) as the loader does; each batch's real ids and starts."""
    sampler.begin_pass()
    out = []
    for key in islice(iter(sampler), steps):
        real = key.weights > 0
        starts = np.zeros(len(real), np.int64) if key.starts is None else key.starts
        out.append((tuple(key.sample_ids[real].tolist()), tuple(starts[real].tolist())))
        sampler.batches_done += 1
    return out


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_sampler_states_resume_any_chain_and_the_same_world_size_exactly(data: st.DataObject) -> None:
    n, seed = data.draw(st.integers(0, 300)), data.draw(st.integers(0, 2**32 - 1))
    batching = data.draw(batchings(), "batching")
    longest = batching.pack_length if batching.packing and not batching.pack_split else 4096  # else refused
    shards = partition(n, data.draw(st.integers(1, 9)), seed, allow_empty=True)
    inputs = PlanInputs(np.minimum(long_tailed(n, seed), longest), shards)
    stage = data.draw(st.sampled_from(["train", "val"]))
    worlds = data.draw(st.lists(st.integers(1, 7), min_size=2, max_size=4), "world sizes")

    def samplers(world: int, state: dict[str, Any] | None) -> list[PlanSampler]:
        spec = EpochSpec(world_size=world, stage=stage, seed=seed % 1000, epoch=2)  # type: ignore[arg-type]
        out = [PlanSampler(InputsOnly(inputs), spec, batching, world=World(r, world, "test")) for r in range(world)]  # type: ignore[arg-type]
        for sampler in out:
            if state is not None:
                sampler.load_state_dict(state)
        return out

    state: dict[str, Any] | None = None
    served: Counter[tuple[int, int]] = Counter()
    for i, world in enumerate(worlds):
        ranks = samplers(world, state)
        last = i == len(worlds) - 1
        steps = None if last else data.draw(st.integers(0, len(ranks[0].plan())), f"steps on {world}")
        got = [keys(s, steps) for s in ranks]
        # Invariant: equal counts on the new ranks; the state is the same on every rank
        assert len({len(g) for g in got}) == 1
        states = [s.state_dict() for s in ranks]
        assert all(s == states[0] for s in states)
        if not last and data.draw(st.booleans(), "also resume on the same world size"):
            again = [keys(s, None) for s in samplers(world, states[0])]
            # Invariant: a resume on the saving world size is the uninterrupted run's remaining batches
            assert again == [keys(s, None)[steps:] for s in samplers(world, state)]
        served.update((i, s) for g in got for ids, starts in g for i, s in zip(ids, starts))
        state = states[0]
    whole = Counter(
        (i, s) for g in (keys(x, None) for x in samplers(worlds[0], None)) for ids, st_ in g for i, s in zip(ids, st_)
    )
    # Invariant: every entry of the epoch exactly as often as in an uninterrupted run (each sample once)
    assert served == whole


def fake_loop(batches: int, *, restarting: bool = False, ran: int = 0, last: bool = False) -> Any:
    """The parts of Lightning's fit loop the trainer link reads and writes (shardload/integrations/trainer.py)."""
    progress = SimpleNamespace(current=SimpleNamespace(processed=ran), is_last_batch=last)
    return SimpleNamespace(
        max_batches=batches,
        _combined_loader=SimpleNamespace(flattened=[None], limits=[batches]),
        _data_fetcher=SimpleNamespace(length=batches),
        epoch_loop=SimpleNamespace(restarting=restarting, batch_progress=progress),
    )


def test_a_restore_at_the_last_step_of_an_epoch_keeps_its_length_until_the_next_epoch_iterates() -> None:
    # Lightning starts the epoch after such a checkpoint from step 0 only if its restored count reaches the length
    # it has; a resumed run iterates the data fetcher it set up before the restore, which keeps its own count
    loop = fake_loop(9, restarting=True, ran=4, last=True)  # the old epoch ran 4 steps (a limit left 4 of 9)
    trainer = SimpleNamespace(fit_loop=loop, limit_train_batches=1.0, val_check_interval=1.0, val_check_batch=9)
    tell = train_link(trainer).epoch_steps
    tell(12)
    assert (loop.max_batches, loop._combined_loader.limits, loop._data_fetcher.length) == (4, [12], 12)
    loop.epoch_loop.restarting, loop.epoch_loop.batch_progress.current.processed = False, 0  # Lightning's reset
    tell(12)  # the epoch's iteration starts
    assert (loop.max_batches, trainer.val_check_batch) == (12, 12)


def test_set_epoch_tells_the_trainer_the_new_epochs_length(data: Path) -> None:
    # Lightning reads a training loader's length once; after an elastic resume the next epoch's length differs
    attrs = {"fit_loop": fake_loop(7), "limit_train_batches": 1.0, "val_check_interval": 1.0, "val_check_batch": 7}
    trainer = type("FakeTrainer", (), attrs)()
    _, state, _ = segment(data, 3, None, 2, max_tokens=900)
    loader = make_loader(data, rank=0, world_size=2, max_tokens=900)
    loader.plan_sampler.trainer = train_link(trainer)
    loader.load_state_dict(state)
    loader.set_epoch(1)
    fresh = len(make_loader(data, rank=0, world_size=2, max_tokens=900, epoch=1))
    assert fresh != 7
    # Invariant: what a reload of the loader would set: the epoch's batches, its limits, the validation point
    loop = trainer.fit_loop
    assert (loop.max_batches, loop._combined_loader.limits, trainer.val_check_batch) == (fresh, [fresh], fresh)
    # under the user's limit_train_batches and val_check_interval, as Lightning computes them
    trainer.limit_train_batches, trainer.val_check_interval = 0.5, 0.25
    loader.set_epoch(2)
    assert (loop.max_batches, trainer.val_check_batch) == (int(fresh * 0.5), max(1, int(fresh * 0.5 * 0.25)))
    before = trainer.val_check_batch
    trainer.limit_train_batches, trainer.val_check_interval = 1, 3  # one batch an epoch; an int interval is kept
    loader.set_epoch(3)
    assert (loop.max_batches, loop._combined_loader.limits, trainer.val_check_batch) == (1, [1], before)
