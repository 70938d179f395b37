"""Is the data pipeline slowing training? What the loader measures of each step, and the warning it leads to.

:class:`~shardload.load.loader.ShardLoader` times every ``next()`` the training loop makes: the **wait** (from
the loop asking for a batch to getting it) and the **step** (from one ask to the next: the wait plus the loop's
own work on the batch), and counts each batch's **real tokens** (the lengths of its samples of weight > 0) and
**padded tokens** (what its padded tensor holds). ``loader.stats`` sums them over an interval
(:class:`LoaderStats`); the DataModule logs them every ``log_every_n_steps`` steps, reduced over ranks
(``integrations/datamodule.py``). The rule and the figures: docs/loading.md, "Is the loader the bottleneck?";
the cost: docs/benchmarks.md, "Loader stats".

torch is imported where held lengths are summed (``StatsRecorder._fold``), not with the module.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardload.schema.fields import WEIGHT_KEY, Schema, lengths_key

__all__ = [
    "BOTTLENECK_FRACTION",
    "BOTTLENECK_MIN_SECONDS",
    "BOTTLENECK_MIN_STEPS",
    "LoaderBottleneckWarning",
    "LoaderStats",
    "StatsRecorder",
    "token_field",
    "warn_bottleneck",
]

#: the share of the step spent waiting for the batch above which the loader is called the bottleneck
BOTTLENECK_FRACTION = 0.2
#: the fewest steps, and seconds of steps, the share is judged over: a short run's waits are mostly the workers
#: starting and each epoch's first batches, which say more about start-up than about the loader
BOTTLENECK_MIN_STEPS = 8
BOTTLENECK_MIN_SECONDS = 5.0


class LoaderBottleneckWarning(UserWarning):
    """The training loop waited for its batches a large share of its steps (:mod:`shardload.load.stats`)."""


@dataclass(frozen=True)
class LoaderStats:
    """What the loader measured over an interval of steps (since it was made, or since ``reset()``).

    Attributes:
        steps: Steps measured: batches for which the loop asked again (a batch's step ends at the next ask).
        wait_s: Seconds the loop waited in ``next()`` for those batches.
        step_s: Seconds from each ask to the next (the wait plus the loop's own work).
        real_tokens: Tokens of the samples of weight > 0 (of the set's length field, else its first
            variable field; rows if it has none).
        padded_tokens: Tokens the padded (or packed) tensor of that field holds.

    Examples:
        >>> s = LoaderStats(steps=10, wait_s=0.5, step_s=2.0, real_tokens=7_000, padded_tokens=8_000)
        >>> s.wait_fraction, s.tokens_per_s, s.padding
        (0.25, 3500.0, 0.125)
    """

    steps: int = 0
    wait_s: float = 0.0
    step_s: float = 0.0
    real_tokens: int = 0
    padded_tokens: int = 0

    @property
    def wait_fraction(self) -> float:
        """The share of the steps' time spent waiting for batches (0 before the first step)."""
        return self.wait_s / self.step_s if self.step_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Real tokens per second of step time."""
        return self.real_tokens / self.step_s if self.step_s > 0 else 0.0

    @property
    def padding(self) -> float:
        """The share of padded tokens that are padding (0 with none)."""
        return 1.0 - self.real_tokens / self.padded_tokens if self.padded_tokens > 0 else 0.0

    def metrics(self, prefix: str = "data/") -> dict[str, float]:
        """``wait_fraction``, ``tokens_per_s`` and ``padding`` under ``prefix``: what the DataModule logs."""
        return {
            prefix + "wait_fraction": self.wait_fraction,
            prefix + "tokens_per_s": self.tokens_per_s,
            prefix + "padding": self.padding,
        }


def token_field(schema: Schema, fields: tuple[str, ...] | None) -> str | None:
    """The field whose tokens are counted: the set's ``length_field`` if loaded, else the first loaded variable one."""
    loaded = [f.name for f in schema.variable_fields if not f.text and (fields is None or f.name in fields)]
    if schema.length_field in loaded:
        return schema.length_field
    return loaded[0] if loaded else None


#: batches whose lengths and weights are kept before their real tokens are summed (in one vectorised step)
FOLD_BATCHES = 64


class StatsRecorder:
    """The loader's running sums; a batch's step is counted at the next ask (:meth:`asked`).

    Per batch: two ``perf_counter`` calls, the padded tensor's shape, and a reference to the batch's lengths and
    weights (small ``(B,)`` vectors), whose real tokens are summed every :data:`FOLD_BATCHES` batches in one
    step: a tensor operation costs a few microseconds whatever its size, a batch without workers about a hundred
    (docs/benchmarks.md, "Loader stats").
    """

    __slots__ = ("_asked", "_field", "_held", "_lengths", "_padded", "_real", "_sums", "_wait")

    def __init__(self, field: str | None) -> None:
        self._field = field
        self._lengths = None if field is None else lengths_key(field)
        self._asked: float | None = None  # when the batch being trained was asked for; None: none pending
        self._wait = 0.0
        self._real: Any = None  # the pending batch's (lengths, weights), or its row count without a variable field
        self._padded = 0
        self._sums = [0, 0.0, 0.0, 0, 0]  # steps, wait_s, step_s, real_tokens, padded_tokens
        self._held: list[Any] = []  # the counted batches' (lengths, weights), not summed yet

    def begin_pass(self) -> None:
        """A new pass: a batch left pending by a pass left early is not counted (its step ended elsewhere)."""
        self._asked = None

    def asked(self) -> float:
        """The loop asks for a batch: the pending one's step ends now."""
        now = time.perf_counter()
        if self._asked is not None:
            sums = self._sums
            sums[0] += 1
            sums[1] += self._wait
            sums[2] += now - self._asked
            sums[4] += self._padded
            self._held.append(self._real)
            if len(self._held) >= FOLD_BATCHES:
                self._fold()
            self._asked = None
        return now

    def _fold(self) -> None:
        """Add the held batches' real tokens (lengths of the samples of weight > 0) to the sums."""
        held, self._held = self._held, []
        if not held:
            return
        import torch  # the loader's batches are torch tensors; this module stays importable without torch

        # summed in numpy: torch may spread even a small reduction over threads the training process needs
        lengths = torch.cat([h[0] for h in held]).numpy()
        weights = torch.cat([h[1] for h in held]).numpy()
        self._sums[3] += int(lengths[weights > 0].sum())

    def got(self, asked: float, batch: Mapping[str, Any]) -> None:
        """The batch asked for at ``asked`` is handed to the loop."""
        self._wait = time.perf_counter() - asked
        self._asked = asked
        weight = batch[WEIGHT_KEY]
        if self._lengths is None:  # no variable field: a row is a token
            self._real = (weight, weight)
            self._padded = weight.shape[0]
            return
        self._real = (batch[self._lengths], weight)
        shape = batch[self._field].shape  # type: ignore[index]
        self._padded = shape[0] * shape[1]

    def snapshot(self) -> LoaderStats:
        """The sums since the last :meth:`reset`."""
        self._fold()
        steps, wait_s, step_s, real, padded = self._sums
        return LoaderStats(int(steps), float(wait_s), float(step_s), int(real), int(padded))

    def reset(self) -> None:
        """Start a new interval (a pending batch stays pending: its step ends in the new one)."""
        self._sums = [0, 0.0, 0.0, 0, 0]
        self._held = []


def warn_bottleneck(stats: LoaderStats, options: str) -> bool:
    """Warn (:class:`LoaderBottleneckWarning`) if ``stats``, of :data:`BOTTLENECK_MIN_STEPS` steps and
    :data:`BOTTLENECK_MIN_SECONDS` seconds of steps or more, waited more than :data:`BOTTLENECK_FRACTION`.

    ``options``: the loader's delivery options as the user would change them (e.g. ``num_workers=0``). Returns
    whether it warned, so that a caller can warn once per run.
    """
    if stats.steps < max(BOTTLENECK_MIN_STEPS, 1) or stats.step_s < BOTTLENECK_MIN_SECONDS:
        return False
    if stats.wait_fraction <= BOTTLENECK_FRACTION:
        return False
    warnings.warn(
        f"the training loop waited for its batches {stats.wait_fraction:.0%} of {stats.step_s:.1f} s over "
        f"{stats.steps} steps: the loader is the bottleneck ({options}). More worker processes "
        "(LoaderOptions(num_workers=...)), more batches loaded ahead (prefetch_factor=...), or a local copy of a "
        'remote set (RemoteOptions) feed it faster; see docs/loading.md, "Is the loader the bottleneck?".',
        LoaderBottleneckWarning,
        stacklevel=2,
    )
    return True
