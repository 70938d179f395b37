"""Packed batches: the collate against a hand-built plan, its refusals, and attention over packed rows.

Plans are built by hand here (BatchKey with rows and starts), so these tests
do not depend on a packing planner.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import shardload
from shardload.errors import PlanError
from shardload.load.collate import Layout, PadSpec
from shardload.load.collate_packed import PackSpec
from shardload.load.dataset import BatchArena, BatchKey, ShardBatchDataset, WorkerBatch

# Sample i: tokens i*1000 + [0, 1, ...] (each token says where it comes from), feats [L, 2], a label.
LENGTHS = [3, 5, 2, 7, 1, 4, 0, 9, 6, 2, 8, 3]
PAD = {"tokens": -1, "feats": 7.5}


def _samples() -> list[dict[str, np.ndarray]]:
    out = []
    for i, n in enumerate(LENGTHS):
        tokens = np.arange(i * 1000, i * 1000 + n, dtype=np.int32)
        out.append({"tokens": tokens, "feats": np.stack([tokens, -tokens], 1).astype(np.float32), "label": np.int64(i)})
    return out


@pytest.fixture(scope="module")
def packed_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("packed") / "set"
    shardload.write(_samples(), path, num_shards=3, shuffle=False, progress=False)  # ids 0-3, 4-7, 8-11
    return path


def _key(
    ids: list[int], rows: list[int], starts: list[int] | None = None, weights: list[float] | None = None
) -> BatchKey:
    w = np.ones(len(ids), np.float32) if weights is None else np.array(weights, np.float32)
    return BatchKey(
        0,
        np.array(ids, np.int64),
        w,
        np.array(rows, np.int32),
        None if starts is None else np.array(starts, np.int64),
    )


def _reference(key: BatchKey, spec: PackSpec, pad: dict[str, float]) -> dict[str, np.ndarray]:
    """The packed batch, token by token."""
    r, p = spec.rows_per_batch, spec.pack_length
    samples = _samples()
    tokens = np.full((r, p), pad.get("tokens", 0), np.int32)
    feats = np.full((r, p, 2), pad.get("feats", 0), np.float32)
    pos = np.zeros((r, p), np.int64)
    doc = np.full((r, p), -1, np.int32)
    fill = [0] * r
    lengths, cu = [], [0]
    starts = np.zeros(len(key.sample_ids), np.int64) if key.starts is None else key.starts
    assert key.rows is not None
    for i, (sid, row, start) in enumerate(zip(key.sample_ids, key.rows, starts)):
        s = samples[sid]
        piece = slice(int(start), min(int(start) + p, len(s["tokens"])))
        n = piece.stop - piece.start
        for t in range(n):
            tokens[row, fill[row] + t] = s["tokens"][piece][t]
            feats[row, fill[row] + t] = s["feats"][piece][t]
            pos[row, fill[row] + t] = spec.position_start + t
            doc[row, fill[row] + t] = i
        fill[row] += n
        lengths.append(n)
    for row in range(r):  # boundaries in flat order: each document, then the row's padding tail if any
        docs = [n for i, n in enumerate(lengths) if key.rows[i] == row]
        for n in docs:
            cu.append(cu[-1] + n)
        if sum(docs) < p:
            cu.append(cu[-1] + p - sum(docs))
    return {
        "tokens": tokens,
        "tokens_lengths": np.array(lengths, np.int64),
        "feats": feats,
        "feats_lengths": np.array(lengths, np.int64),
        "label": key.sample_ids.copy(),
        "position_ids": pos,
        "document_ids": doc,
        "cu_seqlens": np.array(cu, np.int32),
        "max_seqlen": np.array(max(np.diff(cu)), np.int32),
        "sample_start": np.asarray(starts, np.int64).copy(),
        "sample_id": key.sample_ids.copy(),
        "weight": key.weights.copy(),
    }


def _poisoned(layout: Layout) -> dict[str, np.ndarray]:
    """Arrays full of garbage: the collate must write every element it does not ask to be zeroed."""
    out = {}
    for name, shape, dtype, zeroed in layout:
        arr = np.zeros(shape, dtype) if zeroed else np.empty(shape, dtype)
        if not zeroed:
            arr.reshape(-1).view(np.uint8).fill(0x5A)
        out[name] = arr
    return out


CASES = {
    "rows full and not": ([0, 1, 3, 4], [0, 0, 1, 2], None, None),
    "three shards": ([0, 5, 11, 2, 9], [0, 0, 1, 1, 2], None, None),
    "pieces of a cut sample": ([7, 7, 3, 10], [0, 1, 1, 2], [0, 8, 0, 0], None),
    "filler documents": ([2, 2, 2], [0, 0, 1], None, [1.0, 0.0, 0.0]),
    "empty rows": ([3], [1], None, None),
    "a sample of length 0": ([6, 1, 6], [0, 0, 2], None, None),
    "an empty batch": ([], [], None, None),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("alloc", ["separate", "shared", "poisoned"])
def test_packed_batch_matches_a_token_by_token_reference(packed_set: Path, case: str, alloc: str) -> None:
    ids, rows, starts, weights = CASES[case]
    spec = PackSpec(pack_length=8, rows_per_batch=3)
    key = _key(ids, rows, starts, weights)
    ds = ShardBatchDataset(packed_set, PadSpec(PAD), pack=spec)
    arena = BatchArena(shared_from=0)
    allocate: Callable[[Layout], dict[str, np.ndarray]] = {"shared": arena, "poisoned": _poisoned}.get(
        alloc, BatchArena(shared_from=1 << 40)
    )
    got = ds.fetch(key.sample_ids, key.weights, allocate, rows=key.rows, starts=key.starts)
    if alloc == "shared":
        assert arena.tensors is not None  # the batch really is one shared buffer
    want = _reference(key, spec, PAD)
    assert list(got) == list(want)
    for name, arr in want.items():
        assert got[name].dtype == arr.dtype, name
        np.testing.assert_array_equal(got[name], arr, err_msg=name)
    # every batch of a set has the same token shape, whatever its documents
    assert got["tokens"].shape == (3, 8) and got["feats"].shape == (3, 8, 2)


def test_position_start(packed_set: Path) -> None:
    spec = PackSpec(pack_length=8, rows_per_batch=2, position_start=1)
    key = _key([0, 1], [0, 0])
    got = ShardBatchDataset(packed_set, pack=spec)[key]
    assert got["position_ids"].tolist() == [[1, 2, 3, 1, 2, 3, 4, 5], [0] * 8]


def test_batch_keys_are_the_keys_the_packed_collate_adds(packed_set: Path) -> None:
    ds = ShardBatchDataset(packed_set, pack=PackSpec(8, 2))
    batch = ds[_key([0, 1], [0, 1])]
    schema = ds.shard_set.schema
    assert set(batch) - set(schema.names) == set(schema.batch_keys(packed=True))
    assert set(schema.batch_keys(packed=True)) > set(schema.batch_keys())


class _Keys:
    """A sampler of fixed BatchKeys."""

    def __init__(self, keys: list[BatchKey]) -> None:
        self.keys = keys

    def __iter__(self) -> Any:
        return iter(self.keys)

    def __len__(self) -> int:
        return len(self.keys)


@pytest.mark.parametrize("shared_from", [0, 1 << 40], ids=["shared", "by-value"])
def test_workers_give_the_same_packed_batches(
    packed_set: Path, monkeypatch: pytest.MonkeyPatch, shared_from: int
) -> None:
    monkeypatch.setattr(shardload.load.dataset, "SHARED_FROM_BYTES", shared_from)
    keys = [_key(ids, rows, starts, weights) for ids, rows, starts, weights in CASES.values()]
    spec = PackSpec(pack_length=8, rows_per_batch=3)

    def run(workers: int) -> list[dict[str, torch.Tensor]]:
        ds = ShardBatchDataset(packed_set, PadSpec(PAD), pack=spec)
        loader = DataLoader(ds, batch_size=None, sampler=_Keys(keys), num_workers=workers, collate_fn=lambda b: b)
        return [b.tensors() if isinstance(b, WorkerBatch) else b for b in loader]

    main, workers = run(0), run(2)
    assert len(main) == len(workers) == len(keys)
    for a, b in zip(main, workers):
        assert list(a) == list(b)
        for name in a:
            assert torch.equal(a[name], b[name]), name


# -- refusals ------------------------------------------------------------------------------------


def test_pack_spec_checks_its_numbers() -> None:
    for bad, match in [
        ({"pack_length": 0, "rows_per_batch": 2}, "pack_length must be >= 1"),
        ({"pack_length": True, "rows_per_batch": 2}, "pack_length must be an integer"),
        ({"pack_length": 8, "rows_per_batch": 2.0}, "rows_per_batch must be an integer"),
        ({"pack_length": 8, "rows_per_batch": 2, "position_start": -1}, "position_start must be >= 0"),
        ({"pack_length": 1 << 16, "rows_per_batch": 1 << 16}, "more than cu_seqlens"),
    ]:
        with pytest.raises(PlanError, match=match):
            PackSpec(**bad)


def test_a_set_packing_cannot_use_is_refused_when_the_spec_meets_it(tmp_path: Path) -> None:
    def opened(samples: list[dict[str, Any]], **pad: Any) -> Callable[[], ShardBatchDataset]:
        path = tmp_path / f"set{len(list(tmp_path.iterdir()))}"
        shardload.write(samples, path, progress=False)
        ss = shardload.open(path)
        return lambda: ShardBatchDataset(ss, PadSpec(**pad), pack=PackSpec(8, 2))

    fixed_only = opened([{"y": np.int64(i)} for i in range(3)])
    with pytest.raises(PlanError, match=r"packing needs a variable-length field.*\(y\)"):
        fixed_only()
    uneven = [{"a": np.zeros(3, np.int32), "b": np.zeros(3 + (i == 1), np.int32)} for i in range(3)]
    make = opened(uneven)
    with pytest.raises(PlanError, match="field 'a' of sample 1 has 3 rows and its batching length is 4"):
        make()
    assert set(opened(uneven, fields=("b",))()[_key([1], [0])]) >= {"b", "document_ids"}  # one field: fine
    named = [{"tokens": np.zeros(3, np.int32), "position_ids": np.arange(3)} for _ in range(2)]
    with pytest.raises(PlanError, match="field 'position_ids' .* has the name of a key packed batches add"):
        opened(named)()
    assert "position_ids" in opened(named, fields=("tokens",))()[_key([0], [0])]  # not loaded: no clash
    # unpacked, such a field is an ordinary field
    assert "position_ids" in ShardBatchDataset(tmp_path / "set3").fetch(np.array([0]), np.ones(1, np.float32))


@pytest.mark.parametrize(
    ("ids", "rows", "starts", "match"),
    [
        ([0, 1], [0, 2], None, "in row 2, outside the 2 rows_per_batch"),
        ([0, 1], [1, 0], None, "rows non-decreasing"),
        ([3, 7], [0, 0], None, "puts 15 tokens in row 0, more than pack_length=8"),
        ([0], [0], [3], "starts sample 0 at token 3, outside its 3 tokens"),
        ([0], [0], [-1], "at token -1"),
    ],
)
def test_a_plan_that_does_not_fit_the_spec_is_refused(
    packed_set: Path, ids: list[int], rows: list[int], starts: list[int] | None, match: str
) -> None:
    ds = ShardBatchDataset(packed_set, pack=PackSpec(8, 2))
    with pytest.raises(PlanError, match=match):
        ds[_key(ids, rows, starts)]


def test_packed_keys_and_datasets_must_agree(packed_set: Path) -> None:
    with pytest.raises(PlanError, match="needs a dataset built with pack=PackSpec"):
        ShardBatchDataset(packed_set)[_key([0], [0])]
    with pytest.raises(PlanError, match="the batch has no rows"):
        ShardBatchDataset(packed_set, pack=PackSpec(8, 2))[BatchKey(0, np.array([0]), np.ones(1, np.float32))]


# -- the property: every token once, in its place ------------------------------------------------


@st.composite
def _packed_plans(draw: st.DrawFn) -> tuple[PackSpec, BatchKey]:
    p = draw(st.integers(1, 12))
    r = draw(st.integers(1, 4))
    docs = draw(st.lists(st.tuples(st.integers(0, len(LENGTHS) - 1), st.integers(0, 20), st.booleans()), max_size=12))
    ids, rows, starts, fill, row = [], [], [], 0, draw(st.integers(0, r - 1))
    for sid, cut, skip_row in docs:
        length = LENGTHS[sid]
        start = (cut % length) if length else 0
        n = min(length - start, p)
        if skip_row or fill + n > p:  # next row (leaving the rest of this one as padding)
            row, fill = row + 1, 0
        if row >= r:
            break
        ids.append(sid)
        rows.append(row)
        starts.append(start)
        fill += n
    return PackSpec(p, r), _key(ids, rows, starts)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=_packed_plans())
def test_every_token_is_in_its_place_exactly_once(packed_set: Path, plan: tuple[PackSpec, BatchKey]) -> None:
    spec, key = plan
    got = ShardBatchDataset(packed_set, PadSpec({"tokens": -1}), pack=spec)[key]
    tokens, doc = got["tokens"].numpy(), got["document_ids"].numpy()
    r, p = spec.rows_per_batch, spec.pack_length
    assert tokens.shape == doc.shape == got["position_ids"].shape == (r, p)
    assert key.rows is not None and key.starts is not None
    n = got["tokens_lengths"].numpy()
    fill = np.zeros(r, np.int64)
    for i, (sid, row, start) in enumerate(zip(key.sample_ids, key.rows, key.starts)):
        # document i: its own tokens, in order, where its row had got to
        want = sid * 1000 + start + np.arange(n[i])
        assert n[i] == min(LENGTHS[sid] - start, p)
        np.testing.assert_array_equal(tokens[row, fill[row] : fill[row] + n[i]], want)
        assert (doc[row, fill[row] : fill[row] + n[i]] == i).all()
        fill[row] += n[i]
    assert (fill <= p).all()  # no row over capacity
    real = doc >= 0
    assert real.sum() == n.sum()  # every token once: nothing else is marked as a document's
    assert (tokens[~real] == -1).all() and (got["position_ids"].numpy()[~real] == 0).all()
    # cu_seqlens: every token in exactly one sequence, none across a row boundary, documents as they lie
    cu = got["cu_seqlens"].numpy().astype(np.int64)
    assert cu[0] == 0 and cu[-1] == r * p and (np.diff(cu) >= 0).all()
    assert len(cu) == len(n) + 1 + int((fill < p).sum())
    assert ((cu[:-1] // p) == (np.maximum(cu[1:] - 1, cu[:-1]) // p)).all()
    flat_doc = doc.reshape(-1)
    for lo, hi in itertools.pairwise(cu.tolist()):
        assert len(set(flat_doc[lo:hi].tolist())) <= 1
    assert int(got["max_seqlen"]) == np.diff(cu).max()


# -- attention over packed rows equals attention over each document alone ------------------------


class _TinyLayer(torch.nn.Module):
    """Embedding with learned positions, one causal self-attention block, a head over the vocabulary."""

    def __init__(self, vocab: int = 16, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.vocab, self.heads = vocab, heads
        self.emb = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Embedding(64, dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)
        self.head = torch.nn.Linear(dim, vocab)

    def qkv_of(self, tokens: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = self.emb(tokens % self.vocab) + self.pos(positions)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return x, *(t.unflatten(-1, (self.heads, -1)).transpose(-3, -2) for t in (q, k, v))  # [..., H, L, D]

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        return self.head(x + self.out(attended.transpose(-3, -2).flatten(-2)))

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x, q, k, v = self.qkv_of(tokens, positions)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.finish(x, attended)


def _next_token_loss(logits: torch.Tensor, tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return F.cross_entropy(logits[:-1], tokens[1:] % vocab, reduction="sum")


def test_packed_attention_and_losses_equal_each_document_alone(packed_set: Path) -> None:
    torch.manual_seed(0)
    model = _TinyLayer().eval()
    spec = PackSpec(pack_length=12, rows_per_batch=3)
    key = _key([7, 11, 3, 0, 5, 2], [0, 0, 1, 1, 2, 2])
    batch = ShardBatchDataset(packed_set, pack=spec)[key]
    tokens, positions, doc = batch["tokens"].long(), batch["position_ids"], batch["document_ids"]
    mask = shardload.document_causal_mask(doc)  # the library's mask (its rule: tests/test_attention.py)
    with torch.no_grad():
        packed = model(tokens, positions, mask)  # [R, P, vocab]
        # per-document loss from the packed batch: next-token pairs inside one document only
        same_doc = (doc[:, 1:] == doc[:, :-1]) & (doc[:, 1:] >= 0)
        token_loss = F.cross_entropy(packed[:, :-1].transpose(1, 2), tokens[:, 1:] % model.vocab, reduction="none")
        per_doc = torch.zeros(len(batch["sample_id"])).index_add_(0, doc[:, :-1][same_doc].long(), token_loss[same_doc])
        samples = _samples()
        for i, sid in enumerate(batch["sample_id"].tolist()):
            alone_tokens = torch.from_numpy(samples[sid]["tokens"]).long()[None]
            alone = model(alone_tokens, torch.arange(alone_tokens.shape[1])[None], None)[0]
            torch.testing.assert_close(packed[doc == i], alone, rtol=1e-5, atol=1e-5)
            want = _next_token_loss(alone, alone_tokens[0], model.vocab)
            torch.testing.assert_close(per_doc[i], want, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(packed).all()  # padding rows attend to themselves: no NaN to mask out


def varlen_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """What ``flash_attn_varlen_func(q, k, v, cu, cu, max, max, causal=True)`` computes, on ``[T, H, D]``."""
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for lo, hi in itertools.pairwise(bounds):
        if hi > lo:
            seg = [t[lo:hi].transpose(0, 1) for t in (q, k, v)]
            out[lo:hi] = F.scaled_dot_product_attention(*seg, is_causal=True).transpose(0, 1)
    return out


def _flat_qkv(model: _TinyLayer, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    x, q, k, v = model.qkv_of(batch["tokens"].long(), batch["position_ids"])
    return x, *(t.transpose(1, 2).flatten(0, 1) for t in (q, k, v))  # [R * P, H, D]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("attention", ["reference", "flex"])
def test_cu_seqlens_and_document_ids_give_the_same_attention_as_the_mask(packed_set: Path, attention: str) -> None:
    torch.manual_seed(0)
    model = _TinyLayer().eval()
    spec = PackSpec(pack_length=12, rows_per_batch=3)
    batch = ShardBatchDataset(packed_set, pack=spec)[_key([7, 11, 3, 0, 5], [0, 0, 1, 1, 2])]
    r, p = spec.rows_per_batch, spec.pack_length
    with torch.no_grad():
        want = model(
            batch["tokens"].long(), batch["position_ids"], shardload.document_causal_mask(batch["document_ids"])
        )
        x, q, k, v = _flat_qkv(model, batch)
        if attention == "reference":
            flat = varlen_reference(q, k, v, batch["cu_seqlens"])
        else:
            from torch.nn.attention.flex_attention import flex_attention

            block = shardload.document_block_mask(batch["document_ids"])
            flat = flex_attention(*(t.transpose(0, 1)[None] for t in (q, k, v)), block_mask=block)[0].transpose(0, 1)
        got = model.finish(x, flat.unflatten(0, (r, p)).transpose(1, 2))
    real = batch["document_ids"] >= 0
    torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(got).all()
