"""The torch DataLoader side: a plan-driven sampler and a resumable loader.

:class:`PlanSampler` computes this rank's plan for the current epoch (in the
main process) and yields one :class:`~shardload.dataset.BatchKey` per batch.
It subclasses ``DistributedSampler`` so that Lightning, with its default
``use_distributed_sampler=True``, recognises the loader as already distributed
and leaves it alone, and calls :meth:`PlanSampler.set_epoch` every epoch.

:class:`ShardLoader` is a ``DataLoader`` with ``batch_size=None`` over a
:class:`~shardload.dataset.ShardBatchDataset`, plus ``state_dict()`` /
``load_state_dict()`` for mid-epoch resume (Lightning saves and restores these
automatically for the training loader).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

import torch
from torch.utils.data import DataLoader, DistributedSampler

from shardload.collate import PadSpec
from shardload.dataset import BatchKey, ShardBatchDataset, WorkerBatch
from shardload.errors import PlanError, PlanMismatchError
from shardload.plan import Batching, RankPlan, plan_rank
from shardload.shardset import ShardSet
from shardload.world import World

logger = logging.getLogger("shardload.loader")

Stage = Literal["train", "val", "test", "predict"]
STATE_VERSION = 1


class PlanSampler(DistributedSampler):  # type: ignore[type-arg]
    """Yields this rank's planned batches for the current epoch.

    Guarantee: ``len(self)`` is the same on every rank for every epoch (the
    plan equalises batch counts), so every rank runs the same number of steps.

    Args:
        shard_set: the opened shard set (only its manifest and lengths are used).
        world: this rank and the world size.
        batching: batch size or token budget, bucketing, uneven policy.
        stage: ``"train"`` shuffles per (seed, epoch); other stages are in a
            fixed order and see every sample exactly once.
        seed: shuffle seed.
        shard_assignment: ``"rotate"`` shard groups between epochs, or ``"fixed"``.
        debug: print a plan summary each epoch and check across ranks (one
            small all-gather) that every rank has the same batch count and plan
            fingerprint, raising :class:`PlanMismatchError` instead of hanging.
    """

    def __init__(
        self,
        shard_set: ShardSet,
        *,
        world: World,
        batching: Batching,
        stage: Stage = "train",
        seed: int = 0,
        shard_assignment: Literal["rotate", "fixed"] = "rotate",
        epoch: int = 0,
        debug: bool = False,
    ) -> None:
        # DistributedSampler.__init__ would need a process group; set its public attributes instead.
        self.dataset = shard_set  # type: ignore[assignment]
        self.num_replicas = world.world_size
        self.rank = world.rank
        self.epoch = epoch
        self.seed = seed
        self.shuffle = stage == "train"
        self.drop_last = False
        self.shard_set = shard_set
        self.world = world
        self.batching = batching
        self.stage: Stage = stage
        self.shard_assignment: Literal["rotate", "fixed"] = shard_assignment
        self.debug = debug
        self._start = 0
        self._plan: RankPlan | None = None

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch = epoch
            self._start = 0

    def plan(self) -> RankPlan:
        """This rank's plan for the current epoch (computed once per epoch)."""
        if self._plan is None or self._plan.epoch != self.epoch:
            ss = self.shard_set
            self._plan = plan_rank(
                ss.lengths,
                ss.index.sizes,
                rank=self.world.rank,
                world_size=self.world.world_size,
                batching=self.batching,
                stage=self.stage,
                seed=self.seed,
                epoch=self.epoch,
                shard_assignment=self.shard_assignment,
                # The manifest fingerprint covers every shard's checksum, so it identifies the
                # lengths too; this saves hashing the whole lengths index every epoch.
                lengths_digest=ss.fingerprint,
            )
        return self._plan

    def __len__(self) -> int:
        return len(self.plan())

    def __iter__(self) -> Iterator[BatchKey]:
        # Plan and start point are fixed now, not at the first next(): the same
        # batches whether or not workers prefetch from this iterator right away.
        # The start point is kept until a pass completes, because torch's
        # multi-worker iterator calls iter(sampler) twice when it is created.
        plan, start = self.plan(), self._start
        if self.debug:
            self._debug_check(plan)
        return self._keys(plan, start)

    def _keys(self, plan: RankPlan, start: int) -> Iterator[BatchKey]:
        for i in range(start, len(plan)):
            ids, weights = plan.batch(i)
            yield BatchKey(i, ids, weights)
        if plan.epoch == self.epoch:
            self._start = 0

    def resume_at(self, epoch: int, batches_done: int) -> None:
        """Make the next iteration start at batch ``batches_done`` of ``epoch``."""
        self.epoch = epoch
        self._start = batches_done

    def _debug_check(self, plan: RankPlan) -> None:
        w = self.world
        logger.warning(
            "[shardload debug] %s rank %d/%d epoch %d: %d batches (%d real samples, %d filler), fingerprint %s",
            self.stage,
            w.rank,
            w.world_size,
            self.epoch,
            len(plan),
            plan.num_real,
            plan.num_filler,
            plan.fingerprint,
        )
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return
        mine = (w.rank, len(plan), plan.fingerprint)
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        counts = {int(r): int(n) for r, n, _ in gathered}
        prints = {fp for _, _, fp in gathered}
        if len(set(counts.values())) > 1 or len(prints) > 1:
            raise PlanMismatchError(
                f"{self.stage} epoch {self.epoch}: ranks disagree about the plan (batches per rank: {counts}; "
                f"{len(prints)} distinct fingerprints). Every rank must open the same shard set with the same "
                "options; check paths, seeds and batching options on each node."
            )


def _dead_worker(iterator: Any, wait: float = 2.0) -> Any:
    """The first worker process of ``iterator`` that has exited, or ``None``.

    A worker that just died may not be reaped yet, so this polls for up to ``wait`` seconds.
    """
    workers = list(getattr(iterator, "_workers", ()))
    deadline = time.monotonic() + wait
    while workers:
        for w in workers:
            if w.exitcode is not None:
                return w
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)
    return None


def _as_is(batch: Any) -> Any:
    return batch


class ShardLoader(DataLoader):  # type: ignore[type-arg]
    """A DataLoader of planned, padded batches, resumable mid-epoch.

    Use :func:`make_loader` or :class:`shardload.ShardDataModule` to build one.
    Iterating gives dicts of tensors (see :mod:`shardload.collate`). The same
    batches come out in the same order for any ``num_workers``.
    """

    def __init__(
        self,
        dataset: ShardBatchDataset,
        sampler: PlanSampler,
        *,
        num_workers: int = 0,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        timeout: float = 0,
        multiprocessing_context: Any = None,
        **kwargs: Any,
    ) -> None:
        # Lightning passes the DataLoader arguments back when it re-creates a loader.
        for fixed in ("batch_size", "collate_fn", "shuffle", "batch_sampler", "drop_last"):
            kwargs.pop(fixed, None)
        super().__init__(
            dataset,
            batch_size=None,
            sampler=sampler,
            num_workers=num_workers,
            collate_fn=_as_is,
            pin_memory=pin_memory,
            prefetch_factor=prefetch_factor if num_workers > 0 else None,
            persistent_workers=persistent_workers and num_workers > 0,
            timeout=timeout,
            multiprocessing_context=multiprocessing_context,
            **kwargs,
        )
        #: batches of the current epoch consumed so far, counting from a resumed start
        self.batches_done = 0
        #: when set (by the DataModule), the trainer's count of finished training steps this
        #: epoch; used instead of ``batches_done`` because Lightning fetches one batch ahead
        self.progress_fn: Callable[[], int] | None = None

    @property
    def plan_sampler(self) -> PlanSampler:
        """The sampler that plans this rank's batches."""
        assert isinstance(self.sampler, PlanSampler)
        return self.sampler

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to plan (Lightning does this itself; plain loops call it)."""
        self.plan_sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:  # type: ignore[override]
        self.batches_done = self.plan_sampler._start
        it = super().__iter__()
        while True:
            try:
                batch = next(it)
            except StopIteration:
                return
            except Exception as exc:
                # A worker killed mid-transfer (OOM killer, kill -9) can surface as a bare
                # ConnectionResetError or EOFError; name the dead worker instead.
                dead = _dead_worker(it)
                if dead is None:
                    raise
                raise RuntimeError(
                    f"DataLoader worker (pid {dead.pid}) died with exit code {dead.exitcode} at batch "
                    f"{self.batches_done} of epoch {self.plan_sampler.epoch} (a negative code is the signal "
                    "that killed it; -9 is often the out-of-memory killer). Lower num_workers or "
                    "prefetch_factor if memory is short, then resume from the last checkpoint."
                ) from exc
            self.batches_done += 1
            # A batch from a worker arrives packed (unless the pinning thread unpacked it already).
            yield batch.tensors() if isinstance(batch, WorkerBatch) else batch

    def state_dict(self) -> dict[str, Any]:
        """Where this epoch stands: restoring it resumes with exactly the remaining batches."""
        s = self.plan_sampler
        done = self.progress_fn() if self.progress_fn is not None else self.batches_done
        return {
            "version": STATE_VERSION,
            "epoch": s.epoch,
            "batches_done": int(done),
            "fingerprint": s.plan().fingerprint,
            "world_size": s.world.world_size,
            "rank": s.world.rank,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next iteration yields the batches that were left.

        Raises:
            PlanError: the world size differs from the checkpoint's, or the state is of
                an unknown version.
            PlanMismatchError: the plan differs (shard set, seed or batching changed).
        """
        s = self.plan_sampler
        if state.get("version") != STATE_VERSION:
            raise PlanError(f"loader state of version {state.get('version')!r} is not supported")
        if state["world_size"] != s.world.world_size:
            raise PlanError(
                f"the checkpoint was taken with world size {state['world_size']}, this run has "
                f"{s.world.world_size}; a mid-epoch resume needs the same world size (resume from an "
                "end-of-epoch checkpoint instead)"
            )
        s.resume_at(int(state["epoch"]), int(state["batches_done"]))
        if s.plan().fingerprint != state["fingerprint"]:
            raise PlanMismatchError(
                "the plan for this epoch differs from the checkpoint's (shard set, seed or batching options "
                "changed); the remaining batches would not be the ones the run would have seen"
            )
        self.batches_done = s._start


def make_loader(
    path: str | os.PathLike[str] | ShardSet,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    stage: Stage = "train",
    epoch: int = 0,
    batching: Batching | None = None,
    batch_size: int | None = None,
    max_tokens: int | None = None,
    bucketing: bool = True,
    pad_to_multiple_of: int = 1,
    uneven: Literal["split", "pad", "drop"] = "split",
    seed: int = 0,
    shard_assignment: Literal["rotate", "fixed"] = "rotate",
    pad_values: Mapping[str, float] | None = None,
    fields: tuple[str, ...] | None = None,
    num_workers: int = 0,
    pin_memory: bool = False,
    prefetch_factor: int | None = None,
    persistent_workers: bool = False,
    debug: bool = False,
    trainer: Any = None,
) -> ShardLoader:
    """A DataLoader over this rank's share of a shard set.

    Rank and world size default to the environment (``RANK``/``WORLD_SIZE``,
    SLURM, or the initialised process group; see :mod:`shardload.world`).

    Examples:
        >>> loader = shardload.make_loader("out/", batch_size=32, num_workers=2)  # doctest: +SKIP
        >>> for epoch in range(3):                                                # doctest: +SKIP
        ...     loader.set_epoch(epoch)
        ...     for batch in loader:
        ...         loss = (model(batch) * batch["weight"]).sum() / batch["weight"].sum()
    """
    shard_set = path if isinstance(path, ShardSet) else ShardSet(path)
    world = World.detect(rank, world_size, trainer=trainer)
    if batching is None:
        if batch_size is None and max_tokens is None:
            raise PlanError("give batch_size or max_tokens (or a Batching object)")
        batching = Batching(
            batch_size=batch_size,
            max_tokens=max_tokens,
            bucketing=bucketing,
            pad_to_multiple_of=pad_to_multiple_of,
            uneven=uneven,
        )
    if fields is not None:
        unknown = set(fields) - set(shard_set.schema.names)
        if unknown:
            raise PlanError(f"fields {sorted(unknown)} are not in {shard_set.path} (fields: {shard_set.schema.names})")
    pad = PadSpec(
        pad_values=dict(pad_values or {}),
        pad_to_multiple_of=batching.pad_to_multiple_of,
        fields=tuple(fields) if fields is not None else None,
    )
    sampler = PlanSampler(
        shard_set,
        world=world,
        batching=batching,
        stage=stage,
        seed=seed,
        shard_assignment=shard_assignment,
        epoch=epoch,
        debug=debug,
    )
    dataset = ShardBatchDataset(shard_set, pad, fingerprint=shard_set.fingerprint)
    if debug:
        num_workers = 0
    # sampler by keyword: Lightning re-creates the loader (predict) from the recorded arguments
    return ShardLoader(
        dataset,
        sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin_memory,
        prefetch_factor=prefetch_factor,
        persistent_workers=persistent_workers,
    )
