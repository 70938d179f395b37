"""shardload.sets.describe: a description from the manifest and lengths index alone."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import shardload
from shardload.errors import ManifestError
from shardload.sets.describe import (
    describe,
    format_description,
    length_distribution,
    plot_lengths,
    render_histogram,
)
from shardload.testing import synthetic_samples


@pytest.fixture(scope="module")
def set_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("inspect") / "set"
    shardload.write(synthetic_samples(200), out, num_shards=4)
    return out


def test_describe(set_path: Path) -> None:
    info = describe(set_path)
    m = json.loads((set_path / "manifest.json").read_text())
    lengths = np.load(set_path / "lengths.npy")
    assert (info["samples"], info["shards"], info["tokens"]) == (200, 4, int(lengths.sum()))
    assert info["bytes"] == sum(s["bytes"] for s in m["shards"])
    assert info["fields"] == [
        {"name": "tokens", "dtype": "int32", "shape": [None], "variable": True},
        {"name": "features", "dtype": "float32", "shape": [None, 4], "variable": True},
        {"name": "label", "dtype": "int64", "shape": [], "variable": False},
    ]
    for key, q in (("p0", 0), ("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1)):
        assert info["lengths"][key] == pytest.approx(np.quantile(lengths, q), abs=0.01), key
    per_shard = [s["samples"] for s in m["shards"]]
    tokens = [s["tokens"] for s in m["shards"]]
    assert info["shard_balance"]["samples"] == {"min": min(per_shard), "max": max(per_shard)}
    assert info["shard_balance"]["tokens"] == {"min": min(tokens), "max": max(tokens)}
    assert sum(info["histogram"]["counts"]) == 200
    json.dumps(info, allow_nan=False)  # JSON-ready as it is


def test_describe_reads_no_shard(set_path: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(set_path, tmp_path / "set"))
    shutil.rmtree(copy / "shards")
    assert describe(copy)["samples"] == 200


def test_describe_without_a_set(tmp_path: Path) -> None:
    with pytest.raises(ManifestError):
        describe(tmp_path)


def test_format_description(set_path: Path) -> None:
    text = format_description(describe(set_path))
    assert "200 in 4 shards" in text and "features" in text and "p99" in text
    assert "shardload.open(" in text
    assert "█" in text


@pytest.mark.parametrize("chunk", [7, 1 << 24])
def test_length_distribution_is_exact(chunk: int) -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 50, size=1000).astype(np.int32)
    dist = length_distribution(lengths, chunk=chunk)
    values, counts = np.unique(lengths, return_counts=True)
    assert dist.values.tolist() == values.tolist() and dist.counts.tolist() == counts.tolist()
    for q in (0, 0.1, 0.5, 0.9, 0.99, 1):
        assert dist.quantile(q) == pytest.approx(np.quantile(lengths, q))


def test_length_distribution_with_a_huge_range() -> None:
    lengths = np.array([3, 1 << 40, 3, 7, 1 << 40, 1 << 30], dtype=np.int64)
    dist = length_distribution(lengths, chunk=4)
    assert dist.values.tolist() == [3, 7, 1 << 30, 1 << 40]
    assert dist.counts.tolist() == [2, 1, 1, 2]
    assert dist.quantile(0.5) == np.quantile(lengths, 0.5)


def test_histogram_bins() -> None:
    dist = length_distribution(np.array([0, 0, 1, 5, 1000, 4000]))
    edges, counts = dist.histogram(8)
    assert edges[:2] == [0, 1]  # zero has a bin of its own
    assert edges[-1] == 4001 and sorted(edges) == edges and len(set(edges)) == len(edges)
    assert sum(counts) == 6 and counts[0] == 2
    # a narrow range: one bin per length
    assert length_distribution(np.array([3, 4, 4, 6])).histogram(16) == ([3, 4, 5, 6, 7], [1, 2, 0, 1])


def test_render_histogram() -> None:
    text = render_histogram({"edges": [1, 2, 4, 8], "counts": [10, 5, 0]}, width=40)
    lines = text.splitlines()
    assert len(lines) == 3
    assert lines[0].count("█") == 40 and lines[1].count("█") == 20 and "█" not in lines[2]
    assert lines[1].lstrip().startswith("2-3")
    assert "33.3%" in lines[1]
    # every bar column lines up: same position of the separator on each line
    assert len({line.index("│") for line in lines}) == 1


def test_plot_lengths(set_path: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = plot_lengths(set_path, tmp_path / "lengths.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_lengths_without_matplotlib(set_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib...` fail
    with pytest.raises(ModuleNotFoundError, match=r"pip install shardload\[plot\]"):
        plot_lengths(set_path, tmp_path / "x.png")
