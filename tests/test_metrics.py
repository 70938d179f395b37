"""ExactMean in one process: every shape of values against a reference summed sample by sample.

The multi-process claim (sums reduced over ranks equal the one-process mean,
filler rows counting for nothing) is tests/distributed/test_exact_metric.py's.
"""

from __future__ import annotations

import doctest
import importlib
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import shardload
from shardload.errors import InputError
from shardload.testing import synthetic_samples


@st.composite
def padded_batches(draw: st.DrawFn) -> list[tuple[list[float], list[float], list[int]]]:
    """Batches of (values, weights, sources): weights 1.0 or 0.0 (filler), three sources."""
    batches = []
    for _ in range(draw(st.integers(1, 5))):
        b = draw(st.integers(1, 6))
        values = draw(st.lists(st.floats(-1e3, 1e3), min_size=b, max_size=b))
        weights = draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=b, max_size=b))
        sources = draw(st.lists(st.integers(0, 2), min_size=b, max_size=b))
        batches.append((values, weights, sources))
    return batches


def reference(rows: list[tuple[float, float, int]], source: int | None = None) -> float:
    """The mean over the real rows (of one source), one float at a time, exactly rounded sums."""
    kept = [v for v, w, s in rows if w > 0 and (source is None or s == source)]
    return math.fsum(kept) / len(kept) if kept else math.nan


@settings(max_examples=150, deadline=None)
@given(padded_batches())
def test_per_sample_means_match_the_reference(batches: list[tuple[list[float], list[float], list[int]]]) -> None:
    metric = shardload.ExactMean("val", sources=["a", "b", "c"])
    rows = []
    for values, weights, sources in batches:
        batch = {"weight": torch.tensor(weights), "source": torch.tensor(sources)}
        metric.update(torch.tensor(values, dtype=torch.float64), batch)
        rows += list(zip(values, weights, sources, strict=True))
    got = {k: float(v) for k, v in metric.compute().items()}
    want = {"val": reference(rows)} | {f"val/{n}": reference(rows, k) for k, n in enumerate("abc")}
    # Invariant: each mean is its real rows' mean; filler rows (weight 0) count for nothing
    assert got.keys() == want.keys()
    for key, value in want.items():
        if math.isnan(value):
            assert math.isnan(got[key]), key
        else:
            assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key


def test_filler_rows_add_nothing_even_when_their_values_are_not_finite() -> None:
    metric = shardload.ExactMean()
    metric.update(torch.tensor([1.0, math.nan, math.inf, 3.0]), {"weight": torch.tensor([1.0, 0.0, 0.0, 1.0])})
    assert float(metric.compute()["loss"]) == 2.0


def test_padded_per_token_values_with_a_mask() -> None:
    values = torch.tensor([[1.0, 2.0, 99.0], [4.0, 99.0, 99.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[True, True, False], [True, False, False], [True, True, True]])
    metric = shardload.ExactMean()
    metric.update(values, {"weight": torch.tensor([1.0, 1.0, 0.0])}, mask=mask)
    sums, counts = metric.totals()
    # Invariant: a token counts when its row is real and the mask keeps it
    assert (float(sums[0]), float(counts[0])) == (7.0, 3.0)


@pytest.fixture(scope="module")
def packed_mixture(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("metrics")
    sets = {"a": root / "a", "b": root / "b"}
    for seed, path in enumerate(sets.values()):
        samples = [{"tokens": s["tokens"]} for s in synthetic_samples(25 + 10 * seed, seed=seed, median_tokens=12)]
        shardload.write(samples, path, num_shards=2, progress=False)
    return sets


def _token_value(tokens: torch.Tensor) -> torch.Tensor:
    return torch.cos(tokens.double())


def test_packed_per_token_and_per_document_updates_match_a_token_loop(packed_mixture: dict[str, Path]) -> None:
    batching = shardload.Batching(packing=True, pack_length=32, rows_per_batch=3, pack_split=True)
    loader = shardload.make_loader(packed_mixture, stage="val", batching=batching, rank=1, world_size=2)
    by_token = shardload.ExactMean("m", sources=packed_mixture)
    by_pair = shardload.ExactMean("m", sources=packed_mixture)
    by_document = shardload.ExactMean("m", sources=packed_mixture)
    sums, counts, pair_sums, pair_counts = np.zeros(2), np.zeros(2), np.zeros(2), np.zeros(2)
    padding = 0
    for n, batch in enumerate(loader):
        if n == 1:  # packed evaluation pads with empty rows, not with filler: make one document filler
            batch["weight"] = batch["weight"].clone().index_fill_(0, torch.tensor([0]), 0.0)
        doc, weight, source = batch["document_ids"], batch["weight"], batch["source"]
        values = _token_value(batch["tokens"])  # [R, P]
        by_token.update(values, batch)
        pair = (doc[:, 1:] == doc[:, :-1]) & (doc[:, 1:] >= 0)  # a next-token loss: pairs inside a document
        by_pair.update(values[:, :-1], batch, mask=pair)
        e = len(batch["sample_id"])
        per_doc = torch.zeros(e, dtype=torch.float64).index_add_(0, doc[:, :-1][pair].long(), values[:, :-1][pair])
        by_document.update(per_doc, batch, counts=(batch["tokens_lengths"] - 1).clamp(min=0))
        padding += int((doc < 0).sum())
        r, p = doc.shape
        for i in range(r):
            for t in range(p):
                d = int(doc[i, t])
                if d >= 0 and weight[d] > 0:
                    k = int(source[d])
                    sums[k] += float(values[i, t])
                    counts[k] += 1
                    if t + 1 < p and int(doc[i, t + 1]) == d:
                        pair_sums[k] += float(values[i, t])
                        pair_counts[k] += 1
    assert padding > 0
    for metric, s, c in [
        (by_token, sums, counts),
        (by_pair, pair_sums, pair_counts),
        (by_document, pair_sums, pair_counts),
    ]:
        got = metric.compute()
        # Invariant: per token, a document's tokens weigh its weight; padding and filler count for nothing
        assert float(got["m"]) == pytest.approx(s.sum() / c.sum(), rel=1e-12)
        for k, name in enumerate(packed_mixture):
            assert float(got[f"m/{name}"]) == pytest.approx(s[k] / c[k], rel=1e-12)
        torch.testing.assert_close(metric.totals().counts, torch.from_numpy(c))


def test_sources_come_from_a_mixture_a_dict_or_names(packed_mixture: dict[str, Path]) -> None:
    mixture = shardload.Mixture(packed_mixture)
    assert shardload.ExactMean(sources=mixture).sources == ("a", "b")
    assert shardload.ExactMean(sources=packed_mixture).sources == ("a", "b")
    assert shardload.ExactMean(sources=iter(["x"])).sources == ("x",)
    assert shardload.ExactMean().num_bins == 1


def test_compute_leaves_the_sums_and_reset_forgets_them() -> None:
    metric = shardload.ExactMean()
    assert math.isnan(float(metric.compute()["loss"]))  # nothing counted: NaN, not 0
    metric.update(torch.tensor([2.0]), {"weight": torch.tensor([1.0])})
    assert float(metric.compute()["loss"]) == float(metric.compute()["loss"]) == 2.0
    metric.update(torch.tensor([4.0]), {"weight": torch.tensor([1.0])})
    assert float(metric.compute()["loss"]) == 3.0
    metric.reset()
    assert metric.totals().counts.tolist() == [0.0]


@pytest.mark.parametrize(
    ("kwargs", "values", "batch", "match"),
    [
        ({}, torch.ones(3), {"weight": torch.ones(2)}, r"one row per batch\['weight'\] \(2\)"),
        ({}, torch.ones(()), {"weight": torch.ones(1)}, "one row per"),
        ({"sources": ["a"]}, torch.ones(2), {"weight": torch.ones(2)}, r"needs batch\['source'\]"),
        ({"sources": ["a"]}, torch.ones(2), {"weight": torch.ones(2), "source": torch.tensor([0, 1])}, r"\[0, 1\]"),
        (
            {},
            torch.ones(2, 5),
            {"weight": torch.ones(3), "document_ids": torch.zeros(2, 4, dtype=torch.int32)},
            r"T <= P",
        ),
    ],
)
def test_update_refuses_what_does_not_fit_the_batch(
    kwargs: dict[str, object], values: torch.Tensor, batch: dict[str, torch.Tensor], match: str
) -> None:
    with pytest.raises(InputError, match=match):
        shardload.ExactMean(**kwargs).update(values, batch)  # type: ignore[arg-type]


def test_update_refuses_a_mask_or_counts_of_another_shape() -> None:
    metric = shardload.ExactMean()
    batch = {"weight": torch.ones(2)}
    with pytest.raises(InputError, match="mask"):
        metric.update(torch.ones(2, 3), batch, mask=torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(InputError, match="counts= goes with per-sample values"):
        metric.update(torch.ones(2), batch, counts=torch.ones(3))


@pytest.mark.parametrize("sources", ["web", ["a", "a"], [], ["a", ""], 3])
def test_sources_must_be_distinct_names(sources: object) -> None:
    with pytest.raises(InputError, match="sources must be"):
        shardload.ExactMean(sources=sources)


def test_docstring_examples_run() -> None:
    assert doctest.testmod(importlib.import_module("shardload.load.metrics")).failed == 0
