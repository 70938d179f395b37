"""The drop-in ``LightningDataModule``: shard sets -> plans -> loaders.

Works with the Trainer's default flags (``use_distributed_sampler=True``
included): the loaders' sampler is a ``DistributedSampler`` subclass, so
Lightning neither replaces nor re-wraps it. Rank and world size come from the
trainer in :meth:`setup`, so ddp, ddp_spawn, fsdp, deepspeed and multi-node
runs need nothing special.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl

from shardload._base.checks import keywords_checked, with_shortcuts
from shardload.errors import PlanError
from shardload.integrations._quiet import quiet_foreign_warnings
from shardload.integrations.loader_stats import LoaderStatsLogger
from shardload.integrations.trainer import current_epoch, train_link
from shardload.load.collate import PadSpec
from shardload.load.loader import ShardLoader, build_loader
from shardload.load.options import LoaderOptions
from shardload.load.state import check_state
from shardload.load.world import World
from shardload.plan import Batching, EpochSpec, ShardAssignment, Stage
from shardload.remote.options import RemoteOptions
from shardload.sets.mixture import MixedSets, Mixture, Source, as_source, open_source

#: which shard sets each Lightning stage reads
_SETS_OF_STAGE: dict[str | None, tuple[Stage, ...]] = {
    "fit": ("train", "val"),
    "validate": ("val",),
    "test": ("test",),
    "predict": ("predict",),
    None: ("train", "val", "test", "predict"),
}

PathLike = str | os.PathLike[str]
#: what a stage reads: a shard set directory, a Mixture, or a dict of name -> directory (a Mixture by size)
SetArg = PathLike | Mixture | Mapping[str, PathLike]


class ShardDataModule(pl.LightningDataModule):
    """Train/val/test/predict loaders over shard sets, one plan per rank.

    Args:
        train: shard set directory for training (``None``: no training loader),
            or a :class:`~shardload.Mixture` of sets.
        val: shard set directory for validation (``None``: none), or a
            :class:`~shardload.Mixture`, or a dict ``{name: directory}`` of
            validation sets: a mixture in which every sample of every set is
            seen once, with ``batch["source"]`` naming its set (docs/loading.md, "Mixtures").
        test: as ``val``, for testing.
        predict: as ``val``, for prediction.
        batching: how rows become batches (:class:`~shardload.plan.Batching`:
            batch size or token budget, bucketing, padding multiple, uneven
            policy, bucket ratio, row cap). Evaluation never drops: it uses
            ``uneven="split"`` when ``"drop"`` is asked.
        batch_size: shortcut for ``batching=Batching(batch_size=...)``.
        max_tokens: shortcut for ``batching=Batching(max_tokens=...)``; given
            together with ``batching``, a shortcut must agree with it.
        seed: shuffle seed (the epoch comes from the trainer).
        shard_assignment: ``"rotate"`` shard groups between epochs or keep them ``"fixed"``.
        pad_values: pad value per field (default 0).
        fields: load only these fields.
        loader_options: workers, pinning, prefetch, timeout, debug
            (:class:`~shardload.LoaderOptions`; default: 2 workers, pinned
            when CUDA is available).
        num_workers: shortcut for ``loader_options=LoaderOptions(num_workers=...)``;
            the batches do not depend on it.
        remote: for sets given as URLs (``s3://``, ``gs://``, ``https://``): credentials, node
            cache and prefetch (:class:`~shardload.remote.RemoteOptions`; docs/remote.md).

    Raises:
        PlanError: an option has the wrong type or value (here, when the
            DataModule is built); ``pad_values`` or ``fields`` do not fit the
            shard set's schema (in :meth:`setup`, before any batch).

    Examples:
        >>> dm = ShardDataModule(train="data/train", val="data/val", max_tokens=16384)  # doctest: +SKIP
        >>> trainer.fit(model, datamodule=dm)                                             # doctest: +SKIP
    """

    #: the loader options when neither ``loader_options`` nor ``num_workers`` is given
    DEFAULT_LOADER_OPTIONS: Mapping[str, Any] = {"num_workers": 2}

    @keywords_checked("ShardDataModule()", batching=Batching, loader_options=LoaderOptions, remote=RemoteOptions)
    def __init__(
        self,
        train: SetArg | None = None,
        val: SetArg | None = None,
        test: SetArg | None = None,
        predict: SetArg | None = None,
        *,
        batching: Batching | None = None,
        batch_size: int | None = None,
        max_tokens: int | None = None,
        seed: int = 0,
        shard_assignment: ShardAssignment = "rotate",
        pad_values: Mapping[str, float] | None = None,
        fields: tuple[str, ...] | None = None,
        loader_options: LoaderOptions | None = None,
        num_workers: int | None = None,
        remote: RemoteOptions | None = None,
    ) -> None:
        super().__init__()
        given: dict[Stage, object] = {"train": train, "val": val, "test": test, "predict": predict}
        self.paths: dict[Stage, Source | None] = {
            stage: None if path is None else as_source(stage, path) for stage, path in given.items()
        }
        self.batching = with_shortcuts(batching, Batching, "batching", batch_size=batch_size, max_tokens=max_tokens)
        self.loader_options = with_shortcuts(
            loader_options,
            LoaderOptions,
            "loader_options",
            defaults=self.DEFAULT_LOADER_OPTIONS,
            open_fields=("num_workers",),
            num_workers=num_workers,
        )
        # Everything that does not need the shard sets is checked now, where the user wrote it.
        self.spec = EpochSpec(world_size=1, seed=seed, shard_assignment=shard_assignment)
        self.pad = PadSpec({} if pad_values is None else pad_values, self.batching.pad_to_multiple_of, fields)
        self.seed = self.spec.seed
        if remote is not None and not isinstance(remote, RemoteOptions):
            raise PlanError(f"remote must be a shardload.remote.RemoteOptions, got {type(remote).__name__}")
        self.remote = remote
        self.world: World | None = None
        self._train_loader: ShardLoader | None = None
        # the training loader's state from a checkpoint, applied when the loader is made (see load_state_dict)
        self._train_state: Mapping[str, Any] | None = None

    def setup(self, stage: str | None = None) -> None:
        """Take rank and world size from the trainer (Lightning calls this on every rank).

        Also checks ``pad_values`` and ``fields`` against the schema of each shard
        set the stage reads (its manifest only), so that a typo fails before training starts, and
        filters the warnings of Lightning that a user did not cause (:mod:`shardload.integrations._quiet`).
        """
        quiet_foreign_warnings()
        self.world = World.detect(trainer=self.trainer)
        self._add_stats_logger()
        for name in _SETS_OF_STAGE.get(stage, ()):
            path = self.paths[name]
            if path is not None:
                opened = open_source(path, self.remote)
                if isinstance(opened, MixedSets):
                    opened.check_fields(self.pad.fields)
                self.pad.for_schema(opened.schema, f"the {name} set {opened.path}")

    def _add_stats_logger(self) -> None:
        """With ``LoaderOptions(stats=True)``: the callback that logs the training loader's stats to the trainer."""
        trainer = self.trainer
        callbacks = getattr(trainer, "callbacks", None)
        if not self.loader_options.stats or not isinstance(callbacks, list):
            return
        o = self.loader_options
        settings = f"num_workers={o.workers}" + (f", prefetch_factor={o.prefetch_factor or 2}" if o.workers else "")
        # one per trainer: a second setup (another fit) replaces the callback of the first
        callbacks[:] = [c for c in callbacks if not isinstance(c, LoaderStatsLogger)]
        callbacks.append(LoaderStatsLogger(lambda: self._train_loader, settings))

    def _make(self, stage: Stage) -> ShardLoader | list[Any]:
        path = self.paths[stage]
        if path is None:
            if stage == "train":
                raise PlanError("ShardDataModule has no train shard set; pass train=PATH to fit")
            return []  # Lightning's way of saying "no loader for this stage"
        world = self.world or World.detect(trainer=self.trainer)
        batching = self.batching
        if stage != "train" and batching.uneven == "drop":
            batching = dataclasses.replace(batching, uneven="split")
        spec = dataclasses.replace(
            self.spec, world_size=world.world_size, stage=stage, epoch=current_epoch(self.trainer)
        )
        training = stage == "train" and self.trainer is not None
        loader = build_loader(
            path,
            spec,
            batching,
            pad=self.pad,
            options=self.loader_options,
            world=world,
            trainer=train_link(self.trainer) if training else None,
            remote=self.remote,
        )
        if stage == "train":
            self._train_loader, state = loader, self._train_state
            if state is not None:
                # before the trainer reads len(loader): the resumed epoch's length, also when the trainer has not
                # restored its epoch yet (configure_optimizers reading estimated_stepping_batches): the state moves
                # the loader to its own epoch, the one the trainer restores
                loader.load_state_dict(state)
            self._train_state = None
        return loader

    def train_dataloader(self) -> ShardLoader | list[Any]:
        """This rank's loader for training: shuffled per epoch, batch counts equalised across ranks."""
        return self._make("train")

    def val_dataloader(self) -> ShardLoader | list[Any]:
        """This rank's loader for validation: every sample once over all ranks, filler weighted 0."""
        return self._make("val")

    def test_dataloader(self) -> ShardLoader | list[Any]:
        """This rank's loader for test: every sample once over all ranks, filler weighted 0."""
        return self._make("test")

    def predict_dataloader(self) -> ShardLoader | list[Any]:
        """This rank's loader for prediction: every sample once over all ranks, filler weighted 0."""
        return self._make("predict")

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must match to resume (the shuffle seed), and where training stands.

        ``"train_loader"`` is the training loader's own state (the same on every
        rank). Lightning restores the DataModule first, so the loader is made
        already resumed; its second restore of the same state changes nothing.
        """
        state: dict[str, Any] = {"seed": self.seed}
        if self._train_loader is not None:
            state["train_loader"] = self._train_loader.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Refuse a checkpoint taken with another seed, or a state that is not this DataModule's (:class:`PlanError`).

        A broken training loader's state is refused here too; a good one is kept for
        the loader :meth:`train_dataloader` makes next.
        """
        if not isinstance(state_dict, Mapping):
            raise PlanError(
                f"a ShardDataModule state must be the dict that state_dict() returned, got {type(state_dict).__name__}"
            )
        if "seed" in state_dict and state_dict["seed"] != self.seed:
            raise PlanError(
                f"the checkpoint was trained with seed {state_dict['seed']}, this DataModule has seed "
                f"{self.seed}; resuming would change the remaining batches"
            )
        train_state = state_dict.get("train_loader")
        if train_state is not None:
            check_state(train_state)  # a broken state fails here, not as an epoch silently started over
        self._train_state = train_state if isinstance(train_state, Mapping) else None
