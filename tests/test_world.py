from __future__ import annotations

import types

import pytest

from shardload.errors import PlanError
from shardload.load.world import World


def test_precedence_arguments_then_trainer_then_env() -> None:
    trainer = types.SimpleNamespace(global_rank=1, world_size=4)
    env = {"RANK": "3", "WORLD_SIZE": "8", "SLURM_PROCID": "5", "SLURM_NTASKS": "16"}
    assert World.detect(0, 2, trainer=trainer, env=env).rank == 0
    assert World.detect(trainer=trainer, env=env).world_size == 4
    assert (World.detect(env=env).rank, World.detect(env=env).world_size) == (3, 8)
    slurm = {"SLURM_PROCID": "5", "SLURM_NTASKS": "16"}
    assert (World.detect(env=slurm).rank, World.detect(env=slurm).world_size) == (5, 16)
    assert World.detect(env={}) == World()


def test_invalid_values_are_refused() -> None:
    with pytest.raises(PlanError, match="rank 4 of 4"):
        World(4, 4)
    with pytest.raises(PlanError, match="both"):
        World.detect(rank=1)
    with pytest.raises(PlanError, match="not integers"):
        World.detect(env={"RANK": "a", "WORLD_SIZE": "2"})
