"""Who am I in the job: rank and world size, found in one documented order.

Precedence (first that applies wins):

1. explicit ``rank`` / ``world_size`` arguments;
2. a Lightning ``Trainer`` (``trainer.global_rank``, ``trainer.world_size``),
   which covers ddp, ddp_spawn, fsdp, deepspeed and multi-node;
3. environment variables: ``RANK``/``WORLD_SIZE`` (torchrun), else
   ``SLURM_PROCID``/``SLURM_NTASKS`` (srun);
4. an initialised ``torch.distributed`` process group;
5. a single process: rank 0 of 1.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardload._base import envvars
from shardload.errors import PlanError


@dataclass(frozen=True)
class World:
    """This process's place in a distributed job.

    Attributes:
        rank: global rank, ``0 <= rank < world_size``.
        world_size: number of ranks.
        source: where the values came from (for debug summaries).
    """

    rank: int = 0
    world_size: int = 1
    source: str = "single process"

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise PlanError(
                f"invalid rank/world size: rank {self.rank} of {self.world_size} (from {self.source}); "
                "rank must be in [0, world_size)"
            )

    @classmethod
    def detect(
        cls,
        rank: int | None = None,
        world_size: int | None = None,
        *,
        trainer: Any = None,
        env: Mapping[str, str] | None = None,
    ) -> World:
        """Find rank and world size by the precedence in the module docstring."""
        if (rank is None) != (world_size is None):
            raise PlanError("pass both rank and world_size, or neither")
        if rank is not None and world_size is not None:
            return cls(int(rank), int(world_size), "arguments")
        if trainer is not None:
            return cls(int(trainer.global_rank), int(trainer.world_size), "Lightning trainer")
        env = os.environ if env is None else env
        for r_key, w_key in envvars.RANK_VARIABLES:
            if r_key in env and w_key in env:
                try:
                    return cls(int(env[r_key]), int(env[w_key]), f"${r_key}/${w_key}")
                except ValueError:
                    raise PlanError(f"${r_key}={env[r_key]!r} / ${w_key}={env[w_key]!r} are not integers") from None
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return cls(dist.get_rank(), dist.get_world_size(), "torch.distributed")
        except ImportError:  # pragma: no cover - torch is a dependency
            pass
        return cls()
