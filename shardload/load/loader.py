"""The torch DataLoader side: a resumable loader over the plan-driven sampler (load/sampler.py).

:class:`ShardLoader` is a ``DataLoader`` with ``batch_size=None`` over a
:class:`~shardload.load.dataset.ShardBatchDataset`, plus ``state_dict()`` / ``load_state_dict()`` for
mid-epoch resume (which Lightning calls itself for the training loader).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader

from shardload._base.checks import MAX_WORLD_SIZE, check_scalar, keywords_checked, with_shortcuts
from shardload._base.redact import get_logger
from shardload.errors import PlanError, ShardloadError, WorkerError
from shardload.load.collate import PadSpec
from shardload.load.collate_packed import PackSpec
from shardload.load.dataset import ShardBatchDataset, WorkerBatch
from shardload.load.options import LoaderOptions
from shardload.load.prefetch import Prefetcher, read_orders, start_prefetch
from shardload.load.sampler import PlanSampler, TrainerLink
from shardload.load.stats import LoaderStats, StatsRecorder, token_field
from shardload.load.worker_start import START_ATTEMPTS, START_PATIENCE, MarkStart, await_start, new_board
from shardload.load.workers import dead_worker, describe_exit, describe_stall, end_workers
from shardload.load.world import World
from shardload.plan import Batching, EpochSpec, ShardAssignment, Stage
from shardload.plan.mix.inputs import refuse_long_samples_in
from shardload.plan.request import check_request
from shardload.remote.options import RemoteOptions
from shardload.sets.mixture import MixedSets, Source, as_source, open_source

logger = get_logger("shardload.loader")


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
        stats: bool = True,
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
        self._stopping: list[Prefetcher] = []  # stopped after a failure; their downloads under way not yet ended
        field = token_field(dataset.shard_set.schema, dataset.pad.fields) if stats else None
        self._recorder = StatsRecorder(field) if stats else None

    @property
    def stats(self) -> LoaderStats | None:
        """Wait, step time and tokens since the loader was made or :meth:`reset_stats` (None: stats are off).

        See :class:`~shardload.load.stats.LoaderStats` and docs/loading.md, "Is the loader the bottleneck?".
        """
        return None if self._recorder is None else self._recorder.snapshot()

    def reset_stats(self) -> None:
        """Start a new interval of :attr:`stats` (the DataModule does so at every logging step)."""
        if self._recorder is not None:
            self._recorder.reset()

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
        if self._recorder is not None:
            self._recorder.begin_pass()
        self._stop_prefetch()  # before workers fork: no download thread may run across a fork
        sampler = self.plan_sampler
        orders = read_orders(sampler.shard_set, sampler.plan(), self.num_workers)  # a too-small cache: refused here
        try:
            yield from self._consume(mine, orders)
        except BaseException:
            # A download may be what failed (or stalled past `timeout`): the error is not held back until the
            # prefetch downloads under way end; each ends by itself, within its client's timeouts and retries.
            self._stop_prefetch(wait=False)
            raise
        self._stop_prefetch()

    def _stop_prefetch(self, *, wait: bool = True) -> None:
        """Stop the prefetch threads; with ``wait``, also wait for their downloads under way (and earlier ones')."""
        prefetch, self._prefetch = [*self._stopping, *self._prefetch], []
        for p in prefetch:
            p.stop(wait=wait)
        self._stopping = [] if wait else prefetch

    def _consume(self, mine: int, orders: Any) -> Iterator[dict[str, torch.Tensor]]:
        it: Any = None
        direct: Callable[[], Any] | None = None
        recorder = self._recorder
        while True:
            asked = 0.0 if recorder is None else recorder.asked()
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
                    it = self._start_iterator()
                    direct = self._direct_fetch(it)
                    self._prefetch = start_prefetch(orders)  # after the workers forked
                batch = next(it) if direct is None else direct()
            except StopIteration:
                return
            except ShardloadError:
                self._forget_workers(it)
                raise  # raised on purpose in a worker, with its own message
            except Exception as exc:
                failure = self._worker_failure(it if it is not None else self._iterator, exc)
                self._forget_workers(it if it is not None else self._iterator)
                raise failure from exc
            self.plan_sampler.batches_done += 1
            for p in self._prefetch:
                p.advance(self.plan_sampler.batches_done)
            # A batch from a worker arrives packed (unless the pinning thread unpacked it already).
            if isinstance(batch, WorkerBatch):
                batch = batch.tensors()
            if recorder is not None:
                recorder.got(asked, batch)
            yield batch

    def _start_iterator(self) -> Any:
        """torch's iterator for a pass; new workers are first seen to start (:mod:`shardload.load.worker_start`).

        A worker stuck on its way out of ``fork()`` would leave the pass waiting for its batch for ever. Nothing has
        been taken from these workers yet, so ending them all and forking new ones changes no batch.
        """
        if self.num_workers == 0 or (self.persistent_workers and self._iterator is not None):
            return super().__iter__()  # no workers, or the last pass's, which started
        stuck: list[Any] = []
        # Each try starts the same pass: the sampler's start and the random draw torch's iterator makes
        mark, rng = self.plan_sampler.pass_mark(), self._rng_state()
        for attempt in range(START_ATTEMPTS):
            if attempt:
                self.plan_sampler.rewind(mark)
                self._set_rng_state(rng)
            board = new_board(self.num_workers, self.multiprocessing_context)
            user_init = self.worker_init_fn
            self.worker_init_fn = MarkStart(board, user_init)  # read by torch's iterator as it starts the workers
            try:
                it: Any = super().__iter__()
            finally:
                self.worker_init_fn = user_init  # a loader Lightning re-creates gets the user's own back
            stuck = await_start(it._workers, board)  # torch's list of worker processes, by worker id
            if not stuck:
                return it
            pids = ", ".join(str(w.pid) for w in stuck)
            logger.warning(
                "DataLoader worker pid %s never started (asleep without using the CPU since its fork, for %g s): "
                "the pass's workers are replaced; no batch had been taken from them",
                pids,
                START_PATIENCE,
            )
            self._forget_workers(it)
        raise WorkerError(
            f"DataLoader workers (last: pid {', '.join(str(w.pid) for w in stuck)}) never started, {START_ATTEMPTS} "
            "times: each stopped in fork(), on a lock another thread of this process held at that instant. "
            "Restart from the last checkpoint; if it recurs, persistent_workers=True (LoaderOptions) forks the "
            "workers once per run instead of once per pass, and docs/loading.md, 'A worker stuck at its start', "
            "shows how to find the thread."
        )

    def _rng_state(self) -> torch.Tensor:
        """The state of the generator torch's iterator draws its base seed from (the loader's, else the global)."""
        return self.generator.get_state() if self.generator is not None else torch.random.get_rng_state()

    def _set_rng_state(self, state: torch.Tensor) -> None:
        if self.generator is not None:
            self.generator.set_state(state)
        else:
            torch.random.set_rng_state(state)

    def _forget_workers(self, it: Any) -> None:
        """After a failure: ``it``'s workers end now, and the next iteration starts new ones.

        Persistent workers would carry a dead or stuck one; and a stopped one, left to torch's shutdown when
        ``it`` is collected (it lives on in the error's traceback), would keep the interpreter from exiting.
        """
        if it is not None:
            end_workers(it)
        self._iterator = None  # DataLoader's persistent iterator

    def _direct_fetch(self, it: Any) -> Callable[[], Any] | None:
        """Without workers or pinning: the next batch as torch's single-process iterator makes it, called directly.

        Its ``__next__`` wrappers (profiler range, counters) cost as much as the sampler and shard lookups
        together. ``it`` is still created, so its once-per-pass work (the draw from torch's generator) happens as
        before. None (use ``next(it)``) with workers, with ``pin_memory``, or without ``it._sampler_iter``.
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


@keywords_checked("make_loader()", batching=Batching, loader_options=LoaderOptions, remote=RemoteOptions)
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
    options = with_shortcuts(
        loader_options, LoaderOptions, "loader_options", open_fields=("num_workers",), num_workers=num_workers
    )
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

    Opens the set or every source of a mixture (manifest and lengths only) and checks ``pad`` against it; no
    batch is planned or read yet.
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
    return ShardLoader(dataset, sampler=sampler, stats=options.stats, **options.dataloader_kwargs())
