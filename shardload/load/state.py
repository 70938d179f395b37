"""A loader's saved state: its format, its checks, and what may change between save and resume.

:meth:`shardload.load.loader.PlanSampler.state_dict` writes, and
:meth:`~shardload.load.loader.PlanSampler.load_state_dict` reads, one dict that is
the same on every rank (so a checkpoint written by rank 0 resumes every rank
of the next job, on any world size)::

    version        STATE_VERSION
    epoch          the epoch it stands in
    world_size     the world size of the current segment (the run that saved it)
    batches_done   batches of the current segment's plan consumed, on every rank
    history        [[world_size, batches], ...]: the segments of this epoch that ran
                   before on other world sizes, oldest first (empty for most runs)
    fingerprint    the current segment's plan fingerprint (the same on every rank)
    identity       what must not change: shard set, stage, seed, shard assignment,
                   batching options by name (plan/resume.py, run_identity)

A version-1 state (one rank's, without ``history`` and ``identity``) still
loads: its history is empty, and a mismatch is reported without naming what
changed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardload._base.checks import MAX_EPOCH, MAX_WORLD_SIZE, check_scalar
from shardload.errors import PlanError, PlanMismatchError
from shardload.load.world import World
from shardload.plan import Batching, EpochPlanner, EpochSpec, PlanInputs, RankPlan
from shardload.plan.mix.inputs import MixInputs
from shardload.plan.options import MAX_COUNT
from shardload.plan.resume import ResumeInputs, run_identity

__all__ = ["STATE_VERSION", "LoaderState", "check_identity", "check_state", "resume_point"]

#: segments of an epoch run on other world sizes: ``((world_size, batches), ...)``
History = tuple[tuple[int, int], ...]

#: the format :meth:`~shardload.load.loader.PlanSampler.state_dict` writes
STATE_VERSION = 2
#: the formats it reads
_READS = (1, 2)
_KEYS = ("version", "epoch", "batches_done", "fingerprint", "world_size")
#: what a version-2 state has besides (a version-1 state has neither)
_KEYS_2 = ("history", "identity")


@dataclass(frozen=True)
class LoaderState:
    """A checked loader state (fields: the module docstring); ``identity`` is ``None`` for a version-1 state.

    ``history`` is as saved: :class:`~shardload.plan.resume.ResumeInputs` checks its segments.
    """

    epoch: int
    batches_done: int
    fingerprint: str
    world_size: int
    history: tuple[Any, ...]
    identity: Mapping[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        """The state as :meth:`~shardload.load.loader.PlanSampler.state_dict` returns it."""
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "batches_done": self.batches_done,
            "fingerprint": self.fingerprint,
            "world_size": self.world_size,
            "history": [list(segment) for segment in self.history],
            "identity": dict(self.identity or {}),
        }


def check_state(state: object) -> LoaderState:
    """A loader state from ``state_dict()``, checked for shape and types (not whether it fits this loader's plan).

    Raises:
        PlanError: not a mapping, a key missing, a value of the wrong type or out of range, or an unknown version.
    """
    if not isinstance(state, Mapping):
        raise PlanError(
            f"a loader state must be the dict that state_dict() returned, got {type(state).__name__}: "
            "was the checkpoint saved without the loader's state?"
        )
    required = _KEYS + _KEYS_2 if state.get("version") == STATE_VERSION else _KEYS
    missing = [k for k in required if k not in state]
    if missing:
        raise PlanError(
            f"the loader state lacks {missing} (it has {sorted(map(str, state))}); it was not made by "
            "ShardLoader.state_dict(), or was edited"
        )
    version = state["version"]
    if isinstance(version, bool) or version not in _READS:
        raise PlanError(
            f"loader state of version {version!r} is not supported (this shardload writes {STATE_VERSION} "
            f"and reads {', '.join(map(str, _READS))})"
        )
    fingerprint = state["fingerprint"]
    if not isinstance(fingerprint, str):
        raise PlanError(f"loader state: fingerprint must be a str, got {fingerprint!r}")
    history: object = state.get("history", [])
    if isinstance(history, (str, bytes)) or not isinstance(history, Sequence):
        raise PlanError(f"loader state: history must be a list of [world_size, batches] pairs, got {history!r}")
    identity: object = state.get("identity") if version >= 2 else None
    if version >= 2 and not isinstance(identity, Mapping):
        raise PlanError(f"loader state: identity must be a dict, got {identity!r}; the state was edited")
    where = "loader state: "
    return LoaderState(
        epoch=check_scalar(f"{where}epoch", state["epoch"], low=0, high=MAX_EPOCH),
        batches_done=check_scalar(f"{where}batches_done", state["batches_done"], low=0, high=MAX_COUNT),
        fingerprint=fingerprint,
        world_size=check_scalar(f"{where}world_size", state["world_size"], low=1, high=MAX_WORLD_SIZE),
        history=tuple(history),
        identity=identity if isinstance(identity, Mapping) else None,
    )


def check_identity(saved: Mapping[str, Any], now: Mapping[str, Any]) -> None:
    """Refuse a state whose run differs from this loader's, naming every difference.

    Raises:
        PlanMismatchError: the shard set, stage, seed, shard assignment or a batching option differs.
    """
    changed = []
    for key in sorted(set(saved) | set(now), key=str):  # an edited state may hold keys of other types
        before, after = saved.get(key), now.get(key)
        if key == "batching" and isinstance(before, Mapping) and isinstance(after, Mapping):
            changed += [
                f"batching option {name} ({before.get(name)!r} in the checkpoint, {after.get(name)!r} now)"
                for name in sorted(set(before) | set(after), key=str)
                if _differs(before.get(name), after.get(name))
            ]
        elif key == "shard set" and _differs(before, after):
            changed.append(
                "the shard set or mixture (another set, a re-prepared one, or a mixture's sources, names or weights)"
            )
        elif _differs(before, after):
            changed.append(f"{key} ({before!r} in the checkpoint, {after!r} now)")
    if changed:
        raise PlanMismatchError(
            f"the checkpoint's loader state belongs to another run: {'; '.join(changed)}. Resume with the "
            "options the checkpoint was saved with (only the world size, num_workers and pin_memory may change)"
        )


def _differs(before: Any, after: Any) -> bool:
    """Whether a saved identity value differs from this run's (a value no ``!=`` can compare, an array: it does)."""
    try:
        return bool(before != after)
    except Exception:  # noqa: BLE001  numpy and torch raise their own kinds for an array's truth
        return True


def resume_point(
    saved: LoaderState,
    inputs: PlanInputs | MixInputs,
    spec: EpochSpec,
    batching: Batching,
    world: World,
    plan: Callable[[int, History], RankPlan],
) -> tuple[RankPlan, int, History]:
    """Where a loader resumes from ``saved``: ``(plan, start, history)`` on this rank of ``world``.

    Same world size: the plan the state counted batches of, from its next batch. Another world size: the saved
    segment joins the history, and the rest of the epoch is planned for this world size, from batch 0.
    ``plan(epoch, history)`` is the loader's own planning, so a same-world resume plans as an uninterrupted run.

    Raises:
        PlanMismatchError: the state's run differs (:func:`check_identity`, or its plan's fingerprint).
        PlanError: the history is malformed, or a segment claims more batches than its plan has.
    """
    spec = spec.at_epoch(saved.epoch)
    if saved.identity is not None:
        check_identity(saved.identity, run_identity(inputs, spec, batching))
    history = ResumeInputs(inputs, saved.history).history  # checks the segments
    if saved.world_size == world.world_size:
        mine = plan(saved.epoch, history)
        _check_fingerprint(mine.fingerprint, saved)
        if saved.batches_done > len(mine):
            raise PlanError(
                f"the loader state says {saved.batches_done} batches of epoch {saved.epoch} were done, but the "
                f"epoch has {len(mine)}; the state was edited or belongs to another run"
            )
        return mine, saved.batches_done, history
    if saved.batches_done == 0:  # the saved segment consumed nothing: check the plan it had; the rest is the same
        before = ResumeInputs(inputs, history) if history else inputs
        theirs = EpochPlanner(before, dataclasses.replace(spec, world_size=saved.world_size), batching)
        _check_fingerprint(theirs.fingerprint, saved)
        return plan(saved.epoch, history), 0, history
    resumed = ResumeInputs(inputs, (*history, (saved.world_size, saved.batches_done)))
    planner = EpochPlanner(resumed, spec, batching)  # replays every segment: the saved one's plan is checked too
    assert planner.rest is not None
    _check_fingerprint(planner.rest.fingerprints[-1], saved)
    return planner.plan(world.rank), 0, resumed.history


def _check_fingerprint(fingerprint: str, saved: LoaderState) -> None:
    """Refuse a state whose plan is not the one this loader makes of it.

    A version-2 state's run was already found unchanged (:func:`check_identity`),
    so a difference left is in the state's own counts, or in how plans are made.
    """
    if fingerprint == saved.fingerprint:
        return
    if saved.identity is None:
        why = "shard set, seed or batching options changed"
    else:
        why = (
            "the run's options are the checkpoint's, so its history or batches_done was edited, or the "
            "shardload that saved it planned this epoch differently; resume with the version that saved it"
        )
    raise PlanMismatchError(
        f"the plan for epoch {saved.epoch} differs from the checkpoint's ({why}); the remaining batches "
        "would not be the ones the run would have seen"
    )
