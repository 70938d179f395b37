"""The torch DataLoader side: a plan-driven sampler and a resumable loader.

:class:`PlanSampler` computes this rank's plan for the current epoch (in the
main process) and yields one :class:`~shardload.load.dataset.BatchKey` per batch.
It subclasses ``DistributedSampler`` so that Lightning, with its default
``use_distributed_sampler=True``, recognises the loader as already distributed
and leaves it alone, and calls :meth:`PlanSampler.set_epoch` every epoch.

:class:`ShardLoader` is a ``DataLoader`` with ``batch_size=None`` over a
:class:`~shardload.load.dataset.ShardBatchDataset`, plus ``state_dict()`` /
``load_state_dict()`` for mid-epoch resume (Lightning saves and restores these
automatically for the training loader).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler

from shardload._base.checks import MAX_EPOCH, MAX_WORLD_SIZE, check_scalar
from shardload._lightning import TrainerLink
from shardload.errors import PlanError, PlanMismatchError, ShardloadError, WorkerError
from shardload.load.collate import PadSpec
from shardload.load.collate_packed import PackSpec
from shardload.load.dataset import BatchKey, ShardBatchDataset, WorkerBatch
from shardload.load.options import LoaderOptions, with_shortcuts
from shardload.load.prefetch import Prefetcher, read_orders, start_prefetch
from shardload.load.state import LoaderState, check_state, resume_point
from shardload.load.workers import dead_worker, describe_exit, describe_stall
from shardload.load.world import World
from shardload.plan import Batching, EpochPlanner, EpochSpec, RankPlan, ShardAssignment, Stage, plan_rank
from shardload.plan.mix.inputs import refuse_long_samples_in
from shardload.plan.request import check_request
from shardload.plan.resume import ResumeInputs, run_identity
from shardload.remote.options import RemoteOptions
from shardload.sets.mixture import MixedSets, Source, as_source, open_source
from shardload.sets.shardset import ShardSet

logger = logging.getLogger("shardload.load.loader")


class PlanSampler(DistributedSampler):  # type: ignore[type-arg]
    """Yields this rank's planned batches for the current epoch; owns where the epoch stands.

    Guarantee: ``len(self)`` is the same on every rank for every epoch (the
    plan equalises batch counts), so every rank runs the same number of steps.

    The sampler is the stateful part of the loader: the epoch (in
    :attr:`spec`), the segments of it that ran on other world sizes
    (:attr:`history`), the batch the next iteration starts at (:attr:`start`),
    and :meth:`state_dict` / :meth:`load_state_dict` for a mid-epoch resume,
    on the same or another world size (see :mod:`shardload.load.state`).

    Args:
        shard_set: the opened shard set, or mixture of sets (only manifests and lengths are used).
        spec: the epoch to plan; ``set_epoch`` moves it to another epoch.
        batching: batch size or token budget, bucketing, uneven policy.
        world: this rank and the world size (``world.world_size == spec.world_size``).
        debug: log a plan summary each epoch and check across ranks (one
            small all-gather) that every rank has the same batch count and plan
            fingerprint, raising :class:`PlanMismatchError` instead of hanging.
        trainer: when given (by the DataModule), the trainer's count of the
            current epoch's finished training steps, used by :meth:`state_dict`
            instead of :attr:`batches_done` (Lightning fetches one batch ahead
            of the step it runs); :meth:`set_epoch` tells it the new epoch's length.
    """

    def __init__(
        self,
        shard_set: ShardSet | MixedSets,
        spec: EpochSpec,
        batching: Batching,
        *,
        world: World,
        debug: bool = False,
        trainer: TrainerLink | None = None,
    ) -> None:
        check_request(spec, batching)
        if world.world_size != spec.world_size:
            raise PlanError(f"the world has {world.world_size} ranks but the plan asks for {spec.world_size}")
        # DistributedSampler.__init__ would need a process group; set its public attributes instead.
        self.dataset = shard_set  # type: ignore[assignment]
        self.num_replicas = world.world_size
        self.rank = world.rank
        self.seed = spec.seed
        self.shuffle = spec.shuffled
        self.drop_last = False
        self.shard_set = shard_set
        self.world = world
        self.spec = spec
        self.batching = batching
        self.debug = debug
        #: the batch of the current epoch the next iteration starts at (set by a resume)
        self.start = 0
        #: batches of the current epoch consumed so far, counting from a resumed start (counted by the loader)
        self.batches_done = 0
        # the epoch batches_done counts batches of: after set_epoch() to another one, none of it is done yet
        self._counted_epoch = spec.epoch
        self.trainer = trainer
        #: segments of this epoch run before on other world sizes, ``((world_size, batches), ...)``: the plan is of the rest
        self.history: tuple[tuple[int, int], ...] = ()
        self._plan: RankPlan | None = None
        self._loaded: dict[str, Any] | None = None  # the last state loaded (a second load of it changes nothing)
        self._rest_served = False  # a pass over the rest of a resumed epoch ended: the next is all of it (begin_pass)

    @property
    def epoch(self) -> int:  # type: ignore[override]  # DistributedSampler's attribute, read-only here
        """The current epoch (``DistributedSampler``'s attribute)."""
        return self.spec.epoch

    @property
    def stage(self) -> Stage:
        """The stage planned."""
        return self.spec.stage

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to plan; :class:`PlanError` if it is not an integer >= 0.

        With a trainer, a new epoch's length is told to it.
        """
        epoch = check_scalar("epoch", epoch, low=0, high=MAX_EPOCH)
        if epoch == self.spec.epoch:
            return
        if self.history:  # the cached plan is of what the history left: not the epoch's if it is set again
            self._plan = None
        self.spec = self.spec.at_epoch(epoch)
        self.start, self.history, self._loaded = 0, (), None
        if self.trainer is not None:
            self.trainer.epoch_steps(len(self))

    @property
    def offset(self) -> int:
        """Batches of the current epoch run before the current plan, by segments on other world sizes."""
        return sum(batches for _, batches in self.history)

    def plan(self) -> RankPlan:
        """This rank's plan for the current epoch (computed once per epoch)."""
        self._plan = self.plan_for(self.spec.epoch)
        return self._plan

    def plan_for(self, epoch: int) -> RankPlan:
        """This rank's plan for ``epoch`` (the current epoch's is cached by :meth:`plan`)."""
        if self._plan is not None and self._plan.epoch == epoch:
            return self._plan
        return self._planned(epoch, self.history if epoch == self.spec.epoch else ())

    def _planned(self, epoch: int, history: tuple[tuple[int, int], ...]) -> RankPlan:
        """This rank's plan of what ``history`` left of ``epoch`` (all of it when empty)."""
        inputs, spec = self.shard_set.plan_inputs(), self.spec.at_epoch(epoch)
        if not history:
            return plan_rank(inputs, spec, self.batching, rank=self.world.rank)
        return EpochPlanner(ResumeInputs(inputs, history), spec, self.batching).plan(self.world.rank)

    def __len__(self) -> int:
        """The epoch's steps on this rank: those run before the current plan (:attr:`offset`), then the plan's."""
        return self.offset + len(self.plan())

    def __iter__(self) -> Iterator[BatchKey]:
        # Plan and start point are fixed now, not at the first next(): the same
        # batches whether or not workers prefetch from this iterator right away.
        # The start point is kept until a pass completes, because torch's
        # multi-worker iterator calls iter(sampler) twice when it is created.
        plan, start = self.plan(), self.start
        if self.debug:
            self._debug_check(plan)
        return self._keys(plan, start)

    def _keys(self, plan: RankPlan, start: int) -> Iterator[BatchKey]:
        packed, offset = plan.rows is not None, self.offset
        for i in range(start, len(plan)):
            yield BatchKey(offset + i, *plan.packed_batch(i)) if packed else BatchKey(offset + i, *plan.batch(i))
        if plan.epoch == self.spec.epoch:
            self.start, self._rest_served = 0, bool(self.history)

    def begin_pass(self) -> None:
        """A pass begins at :attr:`start`: count consumed batches from there (after the rest of a resumed epoch: all of it)."""
        if self._rest_served and self.history:
            self.history, self._plan, self._loaded = (), None, None
        self._rest_served = False
        self.batches_done = self.start
        self._counted_epoch = self.spec.epoch
        if self.trainer is not None:  # a length set_epoch could not tell yet (see _lightning.train_link)
            # (this runs at the first next() of the loader's iterator, after Lightning's restart check)
            self.trainer.epoch_steps(len(self))

    def state_dict(self) -> dict[str, Any]:
        """Where the current epoch stands, the same on every rank (:mod:`shardload.load.state`).

        Restoring it on the same world size resumes with exactly the remaining batches; on another one, with
        the rest of the epoch planned for it."""
        if self.trainer is not None:  # the trainer counts the epoch's steps, those of earlier segments too
            done = max(self.trainer.steps_done() - self.offset, 0)
        elif self._counted_epoch == self.spec.epoch:
            done = self.batches_done
        else:  # set_epoch() since: the count is the old epoch's, and the new one starts where it was set to
            done = self.start
        identity = run_identity(self.shard_set.plan_inputs(), self.spec, self.batching)
        plan = self.plan()
        return LoaderState(
            plan.epoch, int(done), plan.fingerprint, self.world.world_size, self.history, identity
        ).to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next iteration start where ``state`` stood, on this world size.

        Same world size: the plan the state counted batches of, from its next
        batch. Another world size (an elastic resume): the samples the state's
        run consumed are recomputed, and the rest of the epoch is planned for
        this world size (:class:`~shardload.plan.resume.ResumeInputs`). The
        state is checked completely before anything changes: on an error the
        sampler is as it was. The plan checked is kept, so the epoch is not
        planned twice; loading the state just loaded again changes nothing.

        Raises:
            PlanError: not a loader state (a key missing, a value of the wrong type
                or out of range), of an unknown version, or beyond the epoch's batches.
            PlanMismatchError: shard set, stage, seed or batching changed (named).
        """
        untouched = self.batches_done == self.start and not self._rest_served  # nothing run since the last load
        if isinstance(state, Mapping) and self._loaded == dict(state) and untouched:
            return
        inputs = self.shard_set.plan_inputs()
        plan, start, history = resume_point(
            check_state(state), inputs, self.spec, self.batching, self.world, self._planned
        )
        # planned once: the plan checked is the plan iterated
        self.spec, self.start, self._plan, self.history = plan.spec, start, plan, history
        self._loaded, self._rest_served = dict(state), False
        self.begin_pass()

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


def _as_is(batch: Any) -> Any:
    return batch


class ShardLoader(DataLoader):  # type: ignore[type-arg]
    """A DataLoader of planned, padded batches, resumable mid-epoch.

    Use :func:`make_loader` or :class:`shardload.ShardDataModule` to build one.
    Iterating gives dicts of tensors (see :mod:`shardload.load.collate`). The same
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
        # The iteration that owns batches_done: a new iteration or load_state_dict() starts another one, and
        # an older iterator still held raises instead of yielding batches of a plan (or a start) no longer current.
        self._iteration = 0
        self._superseded_by = ""
        self._prefetch: list[Prefetcher] = []  # remote sets: this rank's shards downloaded ahead

    @property
    def plan_sampler(self) -> PlanSampler:
        """The sampler that plans this rank's batches."""
        assert isinstance(self.sampler, PlanSampler)
        return self.sampler

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to plan (Lightning does this itself; plain loops call it)."""
        self.plan_sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:  # type: ignore[override]
        return self._batches(self._new_iteration("a new iteration over the loader started"))

    def _new_iteration(self, why: str) -> int:
        self._iteration += 1
        self._superseded_by = why
        return self._iteration

    def _batches(self, mine: int) -> Iterator[dict[str, torch.Tensor]]:
        self.plan_sampler.begin_pass()
        self._stop_prefetch()  # before workers fork: no download thread may run across a fork
        sampler = self.plan_sampler
        orders = read_orders(sampler.shard_set, sampler.plan(), self.num_workers)  # a too-small cache: refused here
        try:
            yield from self._consume(mine, orders)
        finally:
            self._stop_prefetch()

    def _stop_prefetch(self) -> None:
        prefetch, self._prefetch = self._prefetch, []
        for p in prefetch:
            p.stop()

    def _consume(self, mine: int, orders: Any) -> Iterator[dict[str, torch.Tensor]]:
        it: Any = None
        direct: Callable[[], Any] | None = None
        while True:
            if self._iteration != mine:
                raise PlanError(
                    f"this iteration over the loader was superseded ({self._superseded_by} while it ran); its "
                    "remaining batches are no longer the plan's and batches_done belongs to the new one. Start a "
                    "new iteration (`for batch in loader`) instead of continuing an old iterator."
                )
            try:
                if it is None:
                    if self._iterator is not None and dead_worker(self._iterator, wait=0) is not None:
                        # a persistent worker died between passes: say so now, not after `timeout`
                        raise RuntimeError("a persistent DataLoader worker exited between passes")
                    # persistent workers: torch's iterator of the last pass, reset (its workers answer first)
                    it = super().__iter__()
                    direct = self._direct_fetch(it)
                    self._prefetch = start_prefetch(orders)  # after the workers forked
                batch = next(it) if direct is None else direct()
            except StopIteration:
                return
            except ShardloadError:
                self._forget_workers()
                raise  # raised on purpose in a worker, with its own message
            except Exception as exc:
                failure = self._worker_failure(it if it is not None else self._iterator, exc)
                self._forget_workers()
                raise failure from exc
            self.plan_sampler.batches_done += 1
            for p in self._prefetch:
                p.advance(self.plan_sampler.batches_done)
            # A batch from a worker arrives packed (unless the pinning thread unpacked it already).
            yield batch.tensors() if isinstance(batch, WorkerBatch) else batch

    def _forget_workers(self) -> None:
        """After a failure, the next iteration starts new workers (persistent ones would carry a dead or stuck one)."""
        self._iterator = None  # DataLoader's persistent iterator; dropped, it shuts its workers down

    def _direct_fetch(self, it: Any) -> Callable[[], Any] | None:
        """Without workers or pinning: the next batch as torch's single-process iterator makes it, called directly.

        That iterator's ``__next__`` takes the next key from the sampler and
        indexes the dataset with it (the collate is the identity); its
        wrappers around that (a profiler range, counters) cost about as much
        as the sampler and the shard lookups together. The iterator itself is
        still created, so everything it does once per pass (the sampler's
        iterator, the draw from torch's random generator) happens as before.
        None (go through ``next(it)``) with workers, with ``pin_memory``, or if
        this torch's iterator has no ``_sampler_iter``.
        """
        keys = getattr(it, "_sampler_iter", None)
        if self.num_workers or keys is None or getattr(it, "_pin_memory", True):
            return None
        dataset = self.dataset
        return lambda: dataset[next(keys)]

    def _worker_failure(self, it: Any, exc: Exception) -> Exception:
        """What to raise when the next batch failed: a dead or stuck worker named, or ``exc`` itself.

        A worker killed mid-transfer can surface as a bare ``ConnectionResetError`` or
        ``EOFError``, a dead one as torch's "exited unexpectedly" (which names no cause),
        a stuck one as torch's "timed out".
        """
        where = f"at batch {self.batches_done} of epoch {self.plan_sampler.epoch}"
        dead = dead_worker(it)
        if dead is not None:
            read = self.plan_sampler.shard_set
            why = describe_exit(int(dead.exitcode), read.sets if isinstance(read, MixedSets) else (read,))
            return WorkerError(f"DataLoader worker (pid {dead.pid}) {why} It failed {where}.")
        if self.timeout > 0 and "timed out" in str(exc):
            why = describe_stall(list(getattr(it, "_workers", ())), self.timeout)
            return WorkerError(f"{where}: {why}")
        return exc

    @property
    def batches_done(self) -> int:
        """Batches of the current epoch consumed so far, counting from a resumed start."""
        return self.plan_sampler.batches_done

    def state_dict(self) -> dict[str, Any]:
        """Where this epoch stands (the sampler's state): restoring it resumes with exactly the remaining batches."""
        return self.plan_sampler.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next iteration yields the batches that were left.

        It takes effect at the next ``iter(loader)``; an iteration still running
        when it is called raises :class:`PlanError` at its next batch rather than
        go on with the old plan. The state is checked by
        :meth:`PlanSampler.load_state_dict` before anything changes: on an
        error the loader is as it was.
        """
        self.plan_sampler.load_state_dict(state)
        # An iterator still running was planned from the old start: it must not go on (and count batches).
        self._new_iteration("load_state_dict() was called")


def make_loader(
    path: Source | Mapping[str, str | os.PathLike[str]],
    *,
    batching: Batching | None = None,
    batch_size: int | None = None,
    max_tokens: int | None = None,
    stage: Stage = "train",
    epoch: int = 0,
    seed: int = 0,
    shard_assignment: ShardAssignment = "rotate",
    pad_values: Mapping[str, float] | None = None,
    fields: tuple[str, ...] | None = None,
    loader_options: LoaderOptions | None = None,
    num_workers: int | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    remote: RemoteOptions | None = None,
) -> ShardLoader:
    """A DataLoader over this rank's share of a shard set.

    Rank and world size default to the environment (``RANK``/``WORLD_SIZE``,
    SLURM, or the initialised process group; see :mod:`shardload.load.world`).

    Every option is checked here, before any batch is planned or read: a wrong
    type (``batch_size=True``, ``num_workers=1.5``), a value out of range, a
    ``pad_values`` entry for a field the set does not have or that its dtype
    cannot hold, or a shortcut that disagrees with its option object, raises
    :class:`~shardload.errors.PlanError` naming the option.

    Args:
        path: A shard set directory, an opened :class:`~shardload.ShardSet`, or a
            :class:`~shardload.Mixture` of sets (a dict of name -> directory is a
            mixture in proportion to size); see docs/loading.md, "Mixtures".
        batching: How rows become batches (:class:`~shardload.plan.Batching`:
            batch size or token budget, bucketing, padding multiple, uneven
            policy, ...).
        batch_size: Shortcut for ``batching=Batching(batch_size=...)``.
        max_tokens: Shortcut for ``batching=Batching(max_tokens=...)``. Given
            together with ``batching``, a shortcut must agree with it.
        stage: ``"train"`` shuffles per (seed, epoch); ``"val"``, ``"test"``
            and ``"predict"`` see every sample exactly once over all ranks.
        epoch: The first epoch (``set_epoch`` moves to another).
        seed: Shuffle seed.
        shard_assignment: ``"rotate"`` shard groups between training epochs, or
            keep them ``"fixed"``.
        pad_values: Pad value per field (default 0).
        fields: Load only these fields.
        loader_options: Workers, pinning, prefetch, timeout, debug
            (:class:`~shardload.LoaderOptions`; default: no worker process).
        num_workers: Shortcut for ``loader_options=LoaderOptions(num_workers=...)``.
        rank: This rank (with ``world_size``; default: from the environment).
        world_size: Number of ranks.
        remote: For a URL (``s3://``, ``gs://``, ``https://``, also as a mixture's source): credentials,
            node cache and prefetch (:class:`~shardload.remote.RemoteOptions`; docs/remote.md).

    Examples:
        >>> loader = shardload.make_loader("out/", batch_size=32, num_workers=2)  # doctest: +SKIP
        >>> for epoch in range(3):                                                # doctest: +SKIP
        ...     loader.set_epoch(epoch)
        ...     for batch in loader:
        ...         loss = (model(batch) * batch["weight"]).sum() / batch["weight"].sum()
    """
    source = as_source("path", path)
    batching = with_shortcuts(batching, Batching, "batching", batch_size=batch_size, max_tokens=max_tokens)
    options = with_shortcuts(loader_options, LoaderOptions, "loader_options", num_workers=num_workers)
    if (rank is None) != (world_size is None):
        raise PlanError(
            f"give rank and world_size together (got rank={rank!r}, world_size={world_size!r}), "
            "or neither: then they come from the environment (torchrun, SLURM) or the process group"
        )
    if rank is not None or world_size is not None:
        # World.detect would round 1.5 to 1; refuse instead
        world_size = check_scalar("world_size", world_size, low=1, high=MAX_WORLD_SIZE)
        rank = check_scalar("rank", rank, low=0, high=world_size - 1, hint="rank must be in [0, world_size)")
    world = World.detect(rank, world_size)
    spec = EpochSpec(
        world_size=world.world_size, stage=stage, seed=seed, epoch=epoch, shard_assignment=shard_assignment
    )
    pad = PadSpec({} if pad_values is None else pad_values, batching.pad_to_multiple_of, fields)
    return build_loader(source, spec, batching, pad=pad, options=options, world=world, remote=remote)


def build_loader(
    path: Source | MixedSets,
    spec: EpochSpec,
    batching: Batching,
    *,
    pad: PadSpec,
    options: LoaderOptions,
    world: World,
    trainer: TrainerLink | None = None,
    remote: RemoteOptions | None = None,
) -> ShardLoader:
    """The loader of checked option objects: what :func:`make_loader` and the DataModule both build.

    Opens the shard set, or every source of a mixture (manifest and lengths
    only), and checks ``pad`` against its schema (a mixture's sources against
    each other too); no batch is planned or read yet.
    """
    check_request(spec, batching)
    shard_set = open_source(path, remote)
    if isinstance(shard_set, MixedSets):
        shard_set.check_fields(pad.fields)
    sampler = PlanSampler(shard_set, spec, batching, world=world, debug=options.debug, trainer=trainer)
    pack = None
    if batching.packing:
        assert batching.pack_length is not None and batching.rows_per_batch is not None
        pack = PackSpec(batching.pack_length, batching.rows_per_batch)
        refuse_long_samples_in(shard_set.plan_inputs(), batching)
    # Checks fields and pad values against the set's schema (names and dtypes), and that a packed set can be packed.
    dataset = ShardBatchDataset(shard_set, pad, fingerprint=shard_set.fingerprint, pack=pack)
    # sampler by keyword: Lightning re-creates the loader (predict) from the recorded arguments
    return ShardLoader(dataset, sampler=sampler, **options.dataloader_kwargs())
