"""The plan-driven sampler: this rank's plan for the current epoch, one batch key per batch.

:class:`PlanSampler` subclasses ``DistributedSampler`` so that Lightning (``use_distributed_sampler=True``)
leaves the loader alone and calls :meth:`PlanSampler.set_epoch` every epoch. A trainer with its own clock of
the epoch reaches the sampler through a :class:`TrainerLink` (shardload.integrations.trainer makes Lightning's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DistributedSampler

from shardload._base.checks import MAX_EPOCH, check_scalar
from shardload._base.redact import get_logger
from shardload.errors import PlanError, PlanMismatchError
from shardload.load.dataset import BatchKey
from shardload.load.state import LoaderState, check_state, resume_point
from shardload.load.world import World
from shardload.plan import Batching, EpochPlanner, EpochSpec, RankPlan, Stage, plan_rank
from shardload.plan.request import check_request
from shardload.plan.resume import ResumeInputs, run_identity
from shardload.sets.mixture import MixedSets
from shardload.sets.shardset import ShardSet

logger = get_logger("shardload.loader")


@dataclass(frozen=True)
class TrainerLink:
    """What the training loader reads from the trainer, and tells it.

    Attributes:
        steps_done: the training steps of the current epoch a checkpoint saved now resumes after.
        epoch_steps: tell the trainer the training batches of the epoch that starts.
    """

    steps_done: Callable[[], int]
    epoch_steps: Callable[[int], None]


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

    def pass_mark(self) -> tuple[int, bool]:
        """Where this pass's keys start, for :meth:`rewind` (torch's iterator made again before any batch).

        torch's iterator takes its first keys as it is made; where the pass is short, that runs :meth:`__iter__`'s
        keys to their end, which starts the next pass at batch 0.
        """
        return self.start, self._rest_served

    def rewind(self, mark: tuple[int, bool]) -> None:
        """Start the keys again where :meth:`pass_mark` said (no batch of the pass has been taken)."""
        self.start, self._rest_served = mark

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
