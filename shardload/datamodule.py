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
from typing import Any, Literal

import lightning.pytorch as pl

from shardload.collate import PadSpec
from shardload.errors import PlanError
from shardload.loader import ShardLoader, Stage, make_loader
from shardload.loader_options import check_bool, check_path, check_worker_options
from shardload.plan import Batching
from shardload.plan.validate import MAX_SEED, check_call, check_scalar
from shardload.shardset import ShardSet
from shardload.world import World

#: which shard sets each Lightning stage reads
_SETS_OF_STAGE: dict[str | None, tuple[Stage, ...]] = {
    "fit": ("train", "val"),
    "validate": ("val",),
    "test": ("test",),
    "predict": ("predict",),
    None: ("train", "val", "test", "predict"),
}

PathLike = str | os.PathLike[str]


class ShardDataModule(pl.LightningDataModule):
    """Train/val/test/predict loaders over shard sets, one plan per rank.

    Args:
        train: shard set directory for training (``None``: no training loader).
        val: shard set directory for validation (``None``: none).
        test: shard set directory for testing (``None``: none).
        predict: shard set directory for prediction (``None``: none).
        batch_size: rows per batch; or
        max_tokens: a token budget per batch (rows x padded length).
        bucketing: group similar lengths to cut padding (default on).
        pad_to_multiple_of: round padded lengths up to a multiple of this.
        uneven: how training evens out batch counts across ranks: ``"split"``
            (default: split the largest batches, nothing dropped or repeated),
            ``"pad"`` (filler batches with weight 0) or ``"drop"``. Evaluation
            never drops: it uses ``"split"`` when ``"drop"`` is asked.
        seed: shuffle seed (the epoch comes from the trainer).
        shard_assignment: ``"rotate"`` shard groups between epochs or keep them ``"fixed"``.
        num_workers: DataLoader workers; the batches do not depend on it.
        pin_memory: pin batches for faster host-to-device copies (default: when CUDA is available).
        pad_values: pad value per field (default 0).
        fields: load only these fields.
        debug: ``num_workers=0``, a per-rank plan summary every epoch, and a
            cross-rank check that raises instead of hanging.
        persistent_workers: keep worker processes alive between epochs (passed to the DataLoader).
        prefetch_factor: batches each worker loads ahead (passed to the DataLoader).
        timeout: seconds to wait for a batch from the workers before raising
            :class:`~shardload.errors.WorkerError` (0, the default, waits for
            ever); see :func:`~shardload.loader.make_loader`.

    Raises:
        PlanError: an option has the wrong type or value (here, when the
            DataModule is built); ``pad_values`` or ``fields`` do not fit the
            shard set's schema (in :meth:`setup`, before any batch).

    Examples:
        >>> dm = ShardDataModule(train="data/train", val="data/val", max_tokens=16384)  # doctest: +SKIP
        >>> trainer.fit(model, datamodule=dm)                                             # doctest: +SKIP
    """

    def __init__(
        self,
        train: PathLike | None = None,
        val: PathLike | None = None,
        test: PathLike | None = None,
        predict: PathLike | None = None,
        *,
        batch_size: int | None = None,
        max_tokens: int | None = None,
        bucketing: bool = True,
        pad_to_multiple_of: int = 1,
        uneven: Literal["split", "pad", "drop"] = "split",
        seed: int = 0,
        shard_assignment: Literal["rotate", "fixed"] = "rotate",
        num_workers: int = 2,
        pin_memory: bool | None = None,
        pad_values: Mapping[str, float] | None = None,
        fields: tuple[str, ...] | None = None,
        debug: bool = False,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        timeout: float = 0,
    ) -> None:
        super().__init__()
        self.paths: dict[Stage, PathLike | None] = {"train": train, "val": val, "test": test, "predict": predict}
        for stage, path in self.paths.items():
            if path is not None:
                check_path(stage, path)
        self.batching = Batching(
            batch_size=batch_size,
            max_tokens=max_tokens,
            bucketing=bucketing,
            pad_to_multiple_of=pad_to_multiple_of,
            uneven=uneven,
        )
        # Everything that does not need the shard sets is checked now, where the user wrote it.
        check_call(
            world_size=1, batching=self.batching, stage="train", seed=seed, epoch=0, shard_assignment=shard_assignment
        )
        workers, prefetch, persistent, _, wait = check_worker_options(
            num_workers=num_workers,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory=False if pin_memory is None else pin_memory,
            timeout=timeout,
        )
        self.debug = check_bool("debug", debug)
        self.pad = PadSpec({} if pad_values is None else pad_values, self.batching.pad_to_multiple_of, fields)
        self.seed = check_scalar("seed", seed, low=0, high=MAX_SEED)
        self.shard_assignment: Literal["rotate", "fixed"] = shard_assignment
        self.num_workers = 0 if self.debug else workers
        self.pin_memory = pin_memory
        self.pad_values = dict(self.pad.pad_values)
        self.fields = self.pad.fields
        self.persistent_workers = persistent
        self.prefetch_factor = prefetch
        self.timeout = wait
        self.world: World | None = None

    def setup(self, stage: str | None = None) -> None:
        """Take rank and world size from the trainer (Lightning calls this on every rank).

        Also checks ``pad_values`` and ``fields`` against the schema of each shard
        set the stage reads (its manifest only), so that a typo fails before training starts.
        """
        self.world = World.detect(trainer=self.trainer)
        for name in _SETS_OF_STAGE.get(stage, ()):
            path = self.paths[name]
            if path is not None:
                self.pad.for_schema(ShardSet(path).schema, f"the {name} set {path}")

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
        pin = self.pin_memory
        if pin is None:
            import torch

            pin = torch.cuda.is_available()
        loader = make_loader(
            path,
            rank=world.rank,
            world_size=world.world_size,
            stage=stage,
            epoch=self.trainer.current_epoch if self.trainer is not None else 0,
            batching=batching,
            seed=self.seed,
            shard_assignment=self.shard_assignment,
            pad_values=self.pad_values,
            fields=self.fields,
            num_workers=self.num_workers,
            pin_memory=pin,
            prefetch_factor=self.prefetch_factor,
            persistent_workers=self.persistent_workers,
            timeout=self.timeout,
            debug=self.debug,
        )
        if stage == "train" and self.trainer is not None:
            loader.progress_fn = self._train_steps_done
        return loader

    def _train_steps_done(self) -> int:
        # Lightning fetches one batch ahead of the step it runs; what a resume must skip is
        # the batches whose training step finished, which the fit loop counts.
        assert self.trainer is not None
        progress: Any = self.trainer.fit_loop.epoch_loop.batch_progress.current  # has `processed` in Lightning >= 2.0
        return int(progress.processed)

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
        """What a checkpoint must match to resume: the shuffle seed."""
        return {"seed": self.seed}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Refuse a checkpoint taken with another seed, or a state that is not this DataModule's (:class:`PlanError`)."""
        if not isinstance(state_dict, Mapping):
            raise PlanError(
                f"a ShardDataModule state must be the dict that state_dict() returned, got {type(state_dict).__name__}"
            )
        if "seed" in state_dict and state_dict["seed"] != self.seed:
            raise PlanError(
                f"the checkpoint was trained with seed {state_dict['seed']}, this DataModule has seed "
                f"{self.seed}; resuming would change the remaining batches"
            )
