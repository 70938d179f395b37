"""Describe a shard set from its manifest and lengths index, without reading a shard.

``shardload inspect OUT``. It reads only ``manifest.json`` and the lengths index, streamed in chunks, so it
costs the same for 3 shards or 100,000 and a billion-sample index needs a few hundred MB.

>>> info = describe("out/")                       # doctest: +SKIP
>>> info["samples"], info["lengths"]["p99"]       # doctest: +SKIP
>>> print(render_histogram(info["histogram"]))    # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from shardload._base.messages import format_bytes
from shardload._base.redact import redact
from shardload.formats.manifest import Manifest
from shardload.remote.options import RemoteOptions
from shardload.schema.text import TEXT_DTYPES
from shardload.sets.shardset import open_shard_set

__all__ = [
    "LengthDistribution",
    "describe",
    "format_bytes",
    "format_description",
    "length_distribution",
    "plot_lengths",
    "render_histogram",
]

#: quantiles reported by :func:`describe`, as (key, q)
QUANTILES = (("p0", 0.0), ("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))
#: eighths of a character cell, for bars with sub-character resolution
_BLOCKS = " ▏▎▍▌▋▊▉█"
#: largest value range counted with one dense ``bincount`` (32 MB of counters)
_DENSE_RANGE = 1 << 22
_CHUNK = 1 << 24


@dataclass(frozen=True)
class LengthDistribution:
    """Exact distribution of sample lengths, compressed to distinct values.

    Attributes:
        values: ``(k,)`` distinct lengths, ascending.
        counts: ``(k,)`` how many samples have each length.
    """

    values: NDArray[np.int64]
    counts: NDArray[np.int64]

    @property
    def num_samples(self) -> int:
        return int(self.counts.sum())

    @property
    def total(self) -> int:
        return int(np.dot(self.values, self.counts)) if len(self.values) else 0

    @property
    def mean(self) -> float:
        n = self.num_samples
        return self.total / n if n else 0.0

    def quantile(self, q: float) -> float:
        """The ``q`` quantile, interpolated exactly as ``numpy.quantile`` (linear) would."""
        n = self.num_samples
        if n == 0:
            return math.nan
        cum = np.cumsum(self.counts)
        h = (n - 1) * q
        lo = math.floor(h)
        # the k-th smallest length (0-based) is the first value whose cumulative count exceeds k
        a = int(self.values[np.searchsorted(cum, lo, side="right")])
        b = int(self.values[np.searchsorted(cum, min(lo + 1, n - 1), side="right")])
        return a + (h - lo) * (b - a)

    def histogram(self, bins: int = 16) -> tuple[list[int], list[int]]:
        """Counts in log-spaced integer bins ``[edges[i], edges[i + 1])``.

        Length 0 gets a bin of its own (a log scale cannot hold it); a range narrower than ``bins``, one per length.
        """
        if not len(self.values):
            return [0, 1], [0]
        lo, hi = int(self.values[0]), int(self.values[-1])
        edges: list[int] = [0] if lo == 0 else []
        first = max(lo, 1)
        if hi >= first:
            span = hi + 1 - first
            if span <= bins:
                edges += list(range(first, hi + 2))
            else:
                geo = np.geomspace(first, hi + 1, num=bins + 1)
                edges += sorted({round(float(e)) for e in geo} | {first, hi + 1})
        else:
            edges.append(1)
        which = np.searchsorted(np.asarray(edges), self.values, side="right") - 1
        counts = np.bincount(which, weights=self.counts, minlength=len(edges) - 1)
        return edges, [int(c) for c in counts]


def length_distribution(lengths: NDArray[np.integer], *, chunk: int = _CHUNK) -> LengthDistribution:
    """Exact length distribution of a (possibly memory-mapped) index, read in chunks."""
    n = len(lengths)
    if n == 0:
        return LengthDistribution(np.zeros(0, np.int64), np.zeros(0, np.int64))
    chunks = [slice(i, i + chunk) for i in range(0, n, chunk)]
    lo = min(int(lengths[c].min()) for c in chunks)
    hi = max(int(lengths[c].max()) for c in chunks)
    if lo >= 0 and hi - lo < _DENSE_RANGE:
        dense = np.zeros(hi - lo + 1, dtype=np.int64)
        for c in chunks:
            dense += np.bincount(np.asarray(lengths[c], dtype=np.int64) - lo, minlength=len(dense))
        nz = np.flatnonzero(dense)
        return LengthDistribution((nz + lo).astype(np.int64), dense[nz])
    # A huge value range: merge per-chunk distinct values instead (memory ~ distinct lengths).
    values = np.zeros(0, np.int64)
    counts = np.zeros(0, np.int64)
    for c in chunks:
        v, k = np.unique(np.asarray(lengths[c], dtype=np.int64), return_counts=True)
        allv = np.concatenate([values, v])
        allc = np.concatenate([counts, k])
        values, inv = np.unique(allv, return_inverse=True)
        counts = np.bincount(inv, weights=allc).astype(np.int64)
    return LengthDistribution(values, counts)


def describe(path: str | os.PathLike[str], *, bins: int = 16, remote: RemoteOptions | None = None) -> dict[str, Any]:
    """Summarise the shard set at ``path`` (no shard is read).

    ``path`` may be a URL: its manifest and lengths index are fetched into the node
    cache (``remote``: credentials and cache, :class:`~shardload.remote.RemoteOptions`).

    Returns:
        A JSON-ready dict with keys ``path``, ``fingerprint``, ``shard_format``,
        ``created``, ``shardload_version``, ``fields`` (name, dtype, shape with
        ``None`` for the variable axis, variable), ``length_field``,
        ``samples``, ``shards``, ``bytes``, ``tokens``, ``shard_balance``
        (min/max samples, tokens and bytes per shard), for a set merged from
        parts ``part_balance`` (``parts``, min/max shards, samples and bytes
        per part), ``lengths`` (p0, p50,
        p90, p99, max, mean) and ``histogram`` (log-spaced ``edges`` and
        ``counts``, see :func:`render_histogram`).

    Raises:
        ManifestError: the manifest or the lengths index is missing or unusable.
    """
    ss = open_shard_set(path, remote=remote)
    m = ss.manifest
    dist = length_distribution(ss.lengths)
    edges, counts = dist.histogram(bins)
    lengths: dict[str, Any] = {key: _num(dist.quantile(q)) for key, q in QUANTILES} if dist.num_samples else {}
    if lengths:
        lengths["mean"] = round(dist.mean, 2)
    return {
        "path": redact(ss.url or str(ss.path)),
        "fingerprint": m.fingerprint,
        "shard_format": m.shard_format,
        "created": m.created,
        "shardload_version": m.shardload_version,
        "fields": [
            {"name": f.name, "dtype": f.dtype, "shape": list(f.shape), "variable": f.variable} for f in m.schema.fields
        ],
        "length_field": m.schema.length_field,
        "samples": m.total_samples,
        "shards": len(m.shards),
        "bytes": int(m.table.bytes.sum()),
        "tokens": m.total_tokens,
        "shard_balance": {key: _min_max(getattr(m.table, key)) for key in ("samples", "tokens", "bytes")},
        **({"part_balance": _part_balance(m)} if m.parts else {}),
        "lengths": lengths,
        "histogram": {"edges": edges, "counts": counts},
    }


# -- rendering ------------------------------------------------------------------------------------------
def render_histogram(histogram: Mapping[str, Sequence[int]], *, width: int = 40) -> str:
    """Render ``{"edges": [...], "counts": [...]}`` as text bars of unicode blocks.

    One line per bin: the length range, a bar up to ``width`` cells long (in
    eighths of a cell), the count and its share.

    >>> print(render_histogram({"edges": [1, 2, 4], "counts": [3, 1]}, width=8))
      1 │████████ 3  75.0%
    2-3 │██▋      1  25.0%
    """
    edges, counts = list(histogram["edges"]), list(histogram["counts"])
    total, top = sum(counts), max(counts, default=0)
    labels = [str(a) if b - a == 1 else f"{a}-{b - 1}" for a, b in itertools.pairwise(edges)]
    lw = max((len(s) for s in labels), default=1)
    cw = max((len(f"{c:,}") for c in counts), default=1)
    lines = []
    for label, c in zip(labels, counts):
        eighths = round(c / top * width * 8) if top else 0
        if c and not eighths:
            eighths = 1  # a non-empty bin stays visible
        bar = "█" * (eighths // 8) + (_BLOCKS[eighths % 8] if eighths % 8 else "")
        share = 100.0 * c / total if total else 0.0
        lines.append(f"{label:>{lw}} │{bar:<{width}} {c:>{cw},} {share:5.1f}%")
    return "\n".join(lines)


def format_description(info: Mapping[str, Any], *, width: int = 40) -> str:
    """The human-readable report of ``shardload inspect`` for a :func:`describe` dict."""

    def shape(f: Mapping[str, Any]) -> str:
        if f["dtype"] in TEXT_DTYPES:
            return "text, one value per sample"
        return "[" + ", ".join("L" if d is None else str(d) for d in f["shape"]) + "]"

    fields = info["fields"]
    nw = max(len(f["name"]) for f in fields)
    dw = max(len(f["dtype"]) for f in fields)
    field_lines = [f"{f['name']:<{nw}}  {f['dtype']:<{dw}}  {shape(f)}" for f in fields]
    by = info["length_field"] or ("longest variable field" if any(f["variable"] for f in fields) else "1 per sample")
    bal = info["shard_balance"]
    out = [
        f"shard set  {info['path']}",
        f"           {info['shard_format']} shards, fingerprint {info['fingerprint']}, "
        f"written {info['created'] or '?'} by shardload {info['shardload_version'] or '?'}",
        f"samples    {info['samples']:,} in {count_of(info['shards'], 'shard')}, {format_bytes(info['bytes'])}, "
        f"{info['tokens']:,} tokens",
        "fields     " + ("\n           ".join(field_lines)),
        f"length     {by}",
    ]
    if info["shards"]:
        out.append(
            f"per shard  samples {_range(bal['samples'])}, tokens {_range(bal['tokens'])}, "
            f"bytes {_range(bal['bytes'], format_bytes)}"
        )
    if "part_balance" in info:
        pb = info["part_balance"]
        out.append(
            f"per part   {pb['parts']:,} parts: shards {_range(pb['shards'])}, samples {_range(pb['samples'])}, "
            f"bytes {_range(pb['bytes'], format_bytes)}"
        )
    if info["lengths"]:
        q = info["lengths"]
        out.append("lengths    " + "  ".join(f"{k} {q[k]:,}" for k in ("p0", "p50", "p90", "p99", "max", "mean")))
        out.append("")
        out.append(render_histogram(info["histogram"], width=width))
    out.append("")
    out.append(f"load it:   shardload.open({info['path']!r})")
    return "\n".join(out)


def plot_lengths(
    path: str | os.PathLike[str], png: str | os.PathLike[str], *, bins: int = 60, remote: RemoteOptions | None = None
) -> Path:
    """Save a histogram of the sample lengths of the set at ``path`` to ``png``.

    matplotlib's object API (no pyplot, no global backend change): safe in notebooks and headless jobs.

    Raises:
        ModuleNotFoundError: matplotlib is not installed (``pip install shardload[plot]``).
        ManifestError: the shard set is unusable.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ModuleNotFoundError(
            "plotting lengths needs matplotlib: pip install shardload[plot]", name="matplotlib"
        ) from None
    ss = open_shard_set(path, remote=remote)
    dist = length_distribution(ss.lengths)
    edges, counts = dist.histogram(bins)
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.stairs(counts, edges, fill=True, alpha=0.7)
    if edges[0] == 0:
        ax.set_xscale("symlog", linthresh=1)  # a log axis cannot show length 0
    else:
        ax.set_xscale("log")
    for key, q in QUANTILES[1:4]:
        x = dist.quantile(q)
        ax.axvline(x, color="k", lw=0.8, ls="--")
        ax.annotate(
            f"{key}={x:g}", (x, 1.0), xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right", fontsize=8
        )
    ax.set_xlabel("sample length (log scale)")
    ax.set_ylabel("samples")
    ax.set_title(f"{ss.path.name or ss.path}: {dist.num_samples:,} samples, {len(ss.shards):,} shards")
    out = Path(png)
    fig.savefig(out, dpi=120)
    return out


def _num(x: float) -> int | float:
    return int(x) if float(x).is_integer() else round(float(x), 2)


def _part_balance(m: Manifest) -> dict[str, Any]:
    """How evenly the parts of a merged set are filled: their count, and min/max shards, samples and bytes."""
    sizes = [m.table.bytes[p.first_shard : p.first_shard + p.shards] for p in m.parts]
    return {
        "parts": len(m.parts),
        "shards": _min_max([p.shards for p in m.parts]),
        "samples": _min_max([p.samples for p in m.parts]),
        "bytes": _min_max([int(b.sum()) for b in sizes]),
    }


def _min_max(values: Sequence[int] | NDArray[np.int64]) -> dict[str, int | None]:
    if not len(values):
        return {"min": None, "max": None}
    return {"min": int(np.min(values)), "max": int(np.max(values))}


def _range(mm: Mapping[str, Any], fmt: Callable[[Any], str] = "{:,}".format) -> str:
    """``min-max`` of ``mm``, or one value when they are equal (a set of one shard)."""
    lo, hi = fmt(mm["min"]), fmt(mm["max"])
    return lo if lo == hi else f"{lo}-{hi}"


def count_of(n: int, noun: str) -> str:
    """``"1 shard"``, ``"2 shards"``, ``"1,000 shards"``: a count with its noun in the right number."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"
