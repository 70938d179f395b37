"""Exact means over an evaluation: weighted sums and counts, per source, reduced across ranks once.

Evaluation plans give every real sample to one rank exactly once and pad the
ranks that run out with filler rows of ``batch["weight"] == 0``
(docs/distributed.md). A metric is then exact when it adds ``weight * value``
and ``weight`` (never a mean of means), keeps the two sums apart until the
end, and reduces them as sums over ranks; :class:`ExactMean` does that, in
float64, with one bin per source of a mixture (``batch["source"]``).

Part of the loading side because it reads the batch contract (``weight``,
``source``, and a packed batch's ``document_ids``); torch only. Not a
torchmetrics ``Metric``: that would make torchmetrics a dependency, and a
``Metric`` logged to Lightning must give one scalar, where this gives one
mean per source. It works alongside torchmetrics (and without it) as a
plain object whose :meth:`ExactMean.compute` is called on every rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from shardload.errors import InputError


class Totals(NamedTuple):
    """The reduced sums of an :class:`ExactMean`: one entry per source (one in all without sources), float64."""

    sums: torch.Tensor  # (K,) sum of weight * value
    counts: torch.Tensor  # (K,) sum of weight (times counts=, where given)


def _source_names(sources: Iterable[str] | Any | None) -> tuple[str, ...] | None:
    if sources is None:
        return None
    names = getattr(sources, "names", sources)  # a Mixture (or MixedSets) names its sources in batch order
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise InputError(f"ExactMean: sources must be names, a dict of sets or a Mixture, got {sources!r}")
    found = tuple(names)  # a dict gives its keys: the order of the val= dict is batch["source"]'s
    if not found or not all(isinstance(n, str) and n for n in found) or len(set(found)) < len(found):
        raise InputError(f"ExactMean: sources must be distinct non-empty names, got {found!r}")
    return found


class ExactMean:
    """An exact mean over every rank's evaluation batches: ``sum(weight * value) / sum(weight)``, in float64.

    Filler rows (``batch["weight"] == 0``) add nothing, padding tokens are
    left out, and the sums are reduced across ranks as sums, so the result is
    the mean over every sample once, whatever the world size or batching.
    Given ``sources`` (the names of a mixture's sources, in order), it also
    keeps one mean per source, read from ``batch["source"]``.

    ``update`` takes, with ``B`` rows (``E`` documents in a packed batch):

    * per-sample values ``[B]`` (``[E]``): each weighs the sample's ``weight``;
      with ``counts=`` ``[B]`` each value is a sum over that many terms (a
      document's summed token losses and its token count), and the mean is
      per term;
    * values ``[B, T, ...]`` of a padded batch: every element weighs its row's
      weight; give ``mask=`` (same shape, ``True`` = counts) to leave padding
      out;
    * per-token values ``[R, T]`` of a packed batch, ``T <= P``, aligned with
      ``batch["document_ids"][:, :T]``: each token weighs its document's
      weight, padding (``document_ids == -1``) is left out, and ``mask=``
      leaves out more (for a next-token loss over ``T = P - 1``: the pairs
      inside one document).

    :meth:`compute` (and :meth:`totals`) all-reduce once in the default
    process group (or ``group``) when ``torch.distributed`` is initialised:
    call it on every rank, and it returns the same value on every rank. The
    local sums stay as they are until :meth:`reset`. With Lightning::

        def on_validation_epoch_start(self):
            self.val_loss.reset()  # also after the sanity check

        def validation_step(self, batch, batch_idx):
            self.val_loss.update(per_sample_loss(batch), batch)

        def on_validation_epoch_end(self):
            # equal on every rank already: "max" keeps it bit for bit, and Lightning does not warn
            self.log_dict(self.val_loss.compute(), sync_dist=True, reduce_fx="max")

    Lightning stores what it logs as float32; read :meth:`compute` itself for
    the float64 value. A source (or the whole) with nothing counted has the
    mean NaN.

    Args:
        name: the key of the overall mean in :meth:`compute`'s dict; each
            source's is ``f"{name}/{source}"``.
        sources: the sources' names in ``batch["source"]``'s order: a
            ``Mixture``, the dict given as ``val=`` (its keys), or a sequence
            of names. ``None``: one mean over everything.
        group: the process group to reduce over (default: the whole world).

    >>> metric = ExactMean("val_loss", sources=["web", "code"])
    >>> batch = {"weight": torch.tensor([1.0, 1.0, 0.0]), "source": torch.tensor([0, 1, 1])}
    >>> metric.update(torch.tensor([2.0, 4.0, 100.0]), batch)  # the third row is filler
    >>> {k: float(v) for k, v in metric.compute().items()}
    {'val_loss': 3.0, 'val_loss/web': 2.0, 'val_loss/code': 4.0}
    """

    def __init__(self, name: str = "loss", *, sources: Iterable[str] | Any | None = None, group: Any = None) -> None:
        self.name = name
        self.sources = _source_names(sources)
        self.group = group
        # sums, counts: (K,) float64 on the device of the first values (None before the first update)
        self._sums: torch.Tensor | None = None
        self._counts: torch.Tensor | None = None

    @property
    def num_bins(self) -> int:
        """How many sums are kept: one per source, or one."""
        return len(self.sources) if self.sources is not None else 1

    def reset(self) -> None:
        """Forget every update (call it where an evaluation starts)."""
        self._sums = self._counts = None

    def update(
        self,
        values: torch.Tensor,
        batch: Mapping[str, Any],
        *,
        counts: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> None:
        """Add one batch's weighted values (see the class for the shapes); no synchronisation with the device.

        Raises:
            InputError: shapes that do not fit the batch, or ``sources`` without ``batch["source"]``.
        """
        values = values.detach()
        device = values.device
        weight = batch["weight"].to(device, torch.float64)  # (B,) or (E,)
        packed_tokens = "document_ids" in batch and values.ndim == 2 and counts is None
        if packed_tokens:
            doc = batch["document_ids"].to(device)
            r, t = values.shape
            if r != doc.shape[0] or t > doc.shape[1]:
                raise InputError(
                    f"ExactMean.update: per-token values {tuple(values.shape)} must be [R, T] with T <= P "
                    f"for document_ids {tuple(doc.shape)}"
                )
            keep = doc[:, :t] >= 0  # (R, T): tokens of a document
            if mask is not None:
                keep = keep & self._mask(mask, values)
            owner = doc[:, :t][keep].long()  # (N,) the document of each kept token
            v = values[keep].to(torch.float64)
            w = weight[owner]
            c = w
        else:
            if values.ndim == 0 or values.shape[0] != weight.shape[0]:
                raise InputError(
                    f"ExactMean.update: values {tuple(values.shape)} must have one row per batch['weight'] "
                    f"({weight.shape[0]})"
                )
            owner = torch.arange(weight.shape[0], device=device).reshape(-1, *[1] * (values.ndim - 1))
            owner = owner.expand(values.shape)
            w = weight[owner]
            if mask is not None:
                w = w * self._mask(mask, values)
            v = values.to(torch.float64)
            c = w
            if counts is not None:
                if values.ndim != 1 or counts.shape != values.shape:
                    raise InputError(
                        f"ExactMean.update: counts= goes with per-sample values: counts {tuple(counts.shape)} "
                        f"and values {tuple(values.shape)} must both be [B]"
                    )
                c = w * counts.detach().to(device, torch.float64)
            owner, v, w, c = owner.reshape(-1), v.reshape(-1), w.reshape(-1), c.reshape(-1)
        # A weight-0 element adds nothing, even where its value is NaN or infinite.
        added = torch.where(w != 0, v * w, torch.zeros((), dtype=torch.float64, device=device))
        bins = self._bins(batch, owner, device)
        if self._sums is None or self._counts is None:
            self._sums = torch.zeros(self.num_bins, dtype=torch.float64, device=device)
            self._counts = torch.zeros(self.num_bins, dtype=torch.float64, device=device)
        self._sums.index_add_(0, bins, added.to(self._sums.device))
        self._counts.index_add_(0, bins, c.to(self._counts.device))

    def _mask(self, mask: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        if mask.shape != values.shape:
            raise InputError(
                f"ExactMean.update: mask {tuple(mask.shape)} must have the shape of the values {tuple(values.shape)}"
            )
        return mask.to(values.device, torch.bool)

    def _bins(self, batch: Mapping[str, Any], owner: torch.Tensor, device: torch.device) -> torch.Tensor:
        """The bin of each element: its sample's source, or 0 without sources."""
        if self.sources is None:
            return torch.zeros_like(owner)
        if "source" not in batch:
            raise InputError(
                f"ExactMean(sources={list(self.sources)}) needs batch['source'], which only a mixture's batches "
                "have (make_loader or ShardDataModule given a Mixture or a dict of sets); or leave sources out"
            )
        source: torch.Tensor = batch["source"]
        # Checked where it costs no device synchronisation; on a GPU, index_add_ asserts on a bin out of range.
        if (
            source.device.type == "cpu"
            and source.numel()
            and (int(source.min()) < 0 or int(source.max()) >= self.num_bins)
        ):
            raise InputError(
                f"ExactMean: batch['source'] holds {sorted(set(source.tolist()))}, but sources names {self.num_bins}: "
                f"{list(self.sources)} (give every source of the mixture, in its order)"
            )
        return source.to(device).long()[owner]

    def totals(self) -> Totals:
        """The sums and counts of every rank added together (one all-reduce when distributed), float64."""
        if self._sums is not None and self._counts is not None:
            state = torch.stack([self._sums, self._counts])  # (2, K), a copy: the local sums stay
        else:
            state = torch.zeros(2, self.num_bins, dtype=torch.float64, device=self._idle_device())
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(state, op=dist.ReduceOp.SUM, group=self.group)
        return Totals(state[0], state[1])

    def compute(self) -> dict[str, torch.Tensor]:
        """``{name: overall mean}``, plus ``{f"{name}/{source}": mean}`` per source; 0-d float64 tensors.

        A collective when distributed: every rank calls it, and gets the same values.
        """
        sums, counts = self.totals()
        result = {self.name: sums.sum() / counts.sum()}
        for k, source in enumerate(self.sources or ()):
            result[f"{self.name}/{source}"] = sums[k] / counts[k]
        return result

    def _idle_device(self) -> torch.device:
        """Where a rank with no update reduces: NCCL reduces on the GPU, other backends on the CPU."""
        if dist.is_available() and dist.is_initialized() and dist.get_backend(self.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def __repr__(self) -> str:
        return f"ExactMean({self.name!r}, sources={list(self.sources) if self.sources else None})"
