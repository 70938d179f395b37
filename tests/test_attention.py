"""The attention masks of packed batches against a reference built token pair by token pair.

The rule (shardload/load/attention.py): a document's token attends to the
tokens of its own document up to itself; a padding token attends to itself
only. Checked on random packed layouts (hypothesis) and on the loader's own
packed batches; that attention under these masks equals each document run
alone is tests/test_collate_packed.py's.
"""

from __future__ import annotations

import doctest
import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import shardload
from shardload.errors import InputError, MissingDependencyError
from shardload.testing import synthetic_samples


def reference_mask(doc: np.ndarray) -> np.ndarray:
    """``[R, P, P]`` bool, one pair at a time: may query ``i`` of row ``r`` attend to key ``j``?"""
    r_count, p = doc.shape
    out = np.zeros((r_count, p, p), dtype=bool)
    for r in range(r_count):
        for i in range(p):
            for j in range(p):
                if doc[r, i] < 0:
                    out[r, i, j] = i == j
                else:
                    out[r, i, j] = doc[r, j] == doc[r, i] and j <= i
    return out


def reference_flat(doc: np.ndarray) -> np.ndarray:
    """The same over the rows flattened into one sequence: ``[R * P, R * P]``, nothing across rows."""
    r_count, p = doc.shape
    per_row = reference_mask(doc)
    out = np.zeros((r_count * p, r_count * p), dtype=bool)
    for r in range(r_count):
        out[r * p : (r + 1) * p, r * p : (r + 1) * p] = per_row[r]
    return out


@st.composite
def packed_document_ids(draw: st.DrawFn) -> np.ndarray:
    """A packed batch's ``document_ids``: documents end to end in each row, numbered in order, -1 after them."""
    rows, p = draw(st.integers(1, 4)), draw(st.integers(1, 12))
    doc = np.full((rows, p), -1, dtype=np.int32)
    next_id = 0
    for r in range(rows):
        used = 0
        for length in draw(st.lists(st.integers(0, p), max_size=5)):  # length 0: an empty sample, no token
            length = min(length, p - used)
            doc[r, used : used + length] = next_id
            used += length
            next_id += 1
    return doc


def mod_grid(doc: np.ndarray) -> np.ndarray:
    """Every ``(q, kv)`` pair of ``document_mask_mod`` evaluated at once (it is elementwise in the indices)."""
    n = doc.size
    mask_mod = shardload.document_mask_mod(torch.from_numpy(doc))
    zero = torch.tensor(0)
    return mask_mod(zero, zero, torch.arange(n)[:, None], torch.arange(n)[None]).numpy()


@settings(max_examples=150, deadline=None)
@given(packed_document_ids())
def test_masks_match_the_pair_by_pair_reference(doc: np.ndarray) -> None:
    want = reference_mask(doc)
    got = shardload.document_causal_mask(torch.from_numpy(doc))
    # Invariant: the SDPA mask is the rule, pair by pair, with one head dimension to broadcast
    assert got.dtype == torch.bool and tuple(got.shape) == (doc.shape[0], 1, doc.shape[1], doc.shape[1])
    np.testing.assert_array_equal(got[:, 0].numpy(), want)
    additive = shardload.document_causal_mask(torch.from_numpy(doc), torch.float32)[:, 0].numpy()
    # Invariant: the additive mask is 0 where the boolean one allows, -inf elsewhere
    np.testing.assert_array_equal(additive == 0, want)
    assert np.isneginf(additive[~want]).all()
    # Invariant: no row of the mask is empty (an empty row is NaN out of the softmax)
    assert want.any(axis=-1).all()
    # Invariant: FlexAttention's mask_mod is the same rule over the flattened rows, nothing across rows
    np.testing.assert_array_equal(mod_grid(doc), reference_flat(doc))


@pytest.fixture(scope="module")
def packed_batches(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, torch.Tensor]]:
    path = tmp_path_factory.mktemp("attention") / "set"
    samples = [{"tokens": s["tokens"]} for s in synthetic_samples(40, seed=5, median_tokens=10)]
    shardload.write(samples, path, num_shards=2, progress=False)
    batching = shardload.Batching(packing=True, pack_length=24, rows_per_batch=3, pack_split=True)
    loader = shardload.make_loader(path, stage="val", batching=batching, rank=0, world_size=2)
    return list(loader)


def test_masks_of_the_loaders_packed_batches(packed_batches: list[dict[str, torch.Tensor]]) -> None:
    assert len(packed_batches) > 1
    for batch in packed_batches:
        doc = batch["document_ids"].numpy()
        np.testing.assert_array_equal(
            shardload.document_causal_mask(batch["document_ids"])[:, 0].numpy(), reference_mask(doc)
        )
        np.testing.assert_array_equal(mod_grid(doc), reference_flat(doc))


def test_boolean_and_additive_masks_give_the_same_finite_attention(
    packed_batches: list[dict[str, torch.Tensor]],
) -> None:
    torch.manual_seed(0)
    for batch in packed_batches:
        r, p = batch["document_ids"].shape
        q, k, v = torch.randn(3, r, 2, p, 8).unbind(0)
        boolean = F.scaled_dot_product_attention(
            q, k, v, attn_mask=shardload.document_causal_mask(batch["document_ids"])
        )
        additive = shardload.document_causal_mask(batch["document_ids"], q.dtype)
        torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=additive), boolean)
        # padding attends to itself: its output is its own value, and nothing is NaN
        assert torch.isfinite(boolean).all()
        pad = batch["document_ids"] < 0
        torch.testing.assert_close(boolean.transpose(1, 2)[pad], v.transpose(1, 2)[pad])


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_block_mask_gives_the_attention_of_the_sdpa_mask(packed_batches: list[dict[str, torch.Tensor]]) -> None:
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    torch.manual_seed(0)
    batch = packed_batches[0]
    doc = batch["document_ids"]
    r, p = doc.shape
    q, k, v = torch.randn(3, r, 2, p, 8).unbind(0)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=shardload.document_causal_mask(doc))  # [R, H, P, D]
    flat = [t.transpose(0, 1).reshape(1, 2, r * p, 8) for t in (q, k, v)]  # [1, H, R * P, D]
    got = flex.flex_attention(*flat, block_mask=shardload.document_block_mask(doc))
    torch.testing.assert_close(got.reshape(2, r, p, 8).transpose(0, 1), want, rtol=1e-5, atol=1e-5)


def test_block_mask_without_flex_attention_names_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch.nn.attention.flex_attention", None)  # as on torch < 2.5
    with pytest.raises(MissingDependencyError, match="torch 2.5 or later.*document_causal_mask"):
        shardload.document_block_mask(torch.zeros(2, 4, dtype=torch.int32))


@pytest.mark.parametrize(
    ("doc", "dtype", "match"),
    [
        (torch.zeros(4, dtype=torch.int32), torch.bool, r"\[R, P\] tensor; got \(4,\)"),
        (torch.zeros(2, 4), torch.bool, "must hold integers"),
        (np.zeros((2, 4), np.int32), torch.bool, "got ndarray"),
        (torch.zeros(2, 4, dtype=torch.int32), torch.int64, "torch.bool or a floating dtype"),
    ],
)
def test_masks_refuse_what_is_not_document_ids(doc: object, dtype: torch.dtype, match: str) -> None:
    with pytest.raises(InputError, match=match):
        shardload.document_causal_mask(doc, dtype)  # type: ignore[arg-type]
    if dtype == torch.bool:
        with pytest.raises(InputError, match=match):
            shardload.document_mask_mod(doc)  # type: ignore[arg-type]


def test_the_module_docstring_names_what_the_varlen_kernels_take() -> None:
    # the packed batch already carries the varlen arguments: the docs say so where the masks are
    doc = importlib.import_module("shardload.load.attention").__doc__ or ""
    text = (Path(__file__).resolve().parents[1] / "docs" / "loading.md").read_text()
    for where in (doc, text):
        assert 'batch["cu_seqlens"]' in where and 'batch["max_seqlen"]' in where


def test_docstring_examples_run() -> None:
    assert doctest.testmod(importlib.import_module("shardload.load.attention")).failed == 0
