"""Round trips and layout guarantees of shardload.write / the prepare pipeline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from shardload.sets.verify import recompute_lengths, verify
from shardload.testing import synthetic_samples


def assert_same_sample(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for k, v in want.items():
        v = np.asarray(v)
        assert got[k].dtype == v.dtype, k
        assert got[k].shape == v.shape, k
        np.testing.assert_array_equal(got[k], v)


def test_round_trip_multi_field_in_source_order(tmp_path: Path, samples: list[dict[str, np.ndarray]]) -> None:
    shardload.write(samples, tmp_path / "s", num_shards=5, shuffle=False)
    ds = shardload.open(tmp_path / "s")
    assert len(ds) == len(samples)
    for i, want in enumerate(samples):
        assert_same_sample(ds[i], want)


def test_round_trip_shuffled_is_a_permutation_recorded_in_origin(tmp_path: Path, samples: list[dict]) -> None:
    shardload.write(samples, tmp_path / "s", num_shards=4, seed=3)
    ds = shardload.open(tmp_path / "s")
    origin = np.load(tmp_path / "s" / "origin.npy")
    assert sorted(origin.tolist()) == list(range(len(samples)))
    assert not np.array_equal(origin, np.arange(len(samples)))
    for i in range(len(ds)):
        assert_same_sample(ds[i], samples[origin[i]])


def test_empty_length_samples_and_2d_rows(tmp_path: Path) -> None:
    samples = [
        {"x": np.zeros((0, 3), np.float32), "t": np.zeros(0, np.int64)},
        {"x": np.ones((5, 3), np.float32), "t": np.arange(2, dtype=np.int64)},
        {"x": np.zeros((0, 3), np.float32), "t": np.arange(7, dtype=np.int64)},
    ]
    shardload.write(samples, tmp_path / "s", num_shards=2, shuffle=False)
    ds = shardload.open(tmp_path / "s")
    for i, want in enumerate(samples):
        assert_same_sample(ds[i], want)
    np.testing.assert_array_equal(ds.field_lengths("x"), [0, 5, 0])
    np.testing.assert_array_equal(ds.field_lengths("t"), [0, 2, 7])
    # The batching length is the longest variable field of each sample.
    np.testing.assert_array_equal(ds.lengths, [0, 5, 7])


def test_single_sample_set(tmp_path: Path) -> None:
    sample = {"tokens": np.array([4, 5, 6], np.int32), "label": np.int64(2), "flag": np.array([True, False])}
    shardload.write([sample], tmp_path / "s", num_shards=8)
    ds = shardload.open(tmp_path / "s")
    assert len(ds) == 1 and len(ds.shards) == 1  # never more shards than samples
    assert_same_sample(ds[0], sample)


def test_fixed_fields_and_length_field(tmp_path: Path) -> None:
    samples = [{"emb": np.full(4, i, np.float32), "tok": np.arange(i + 1, dtype=np.int32)} for i in range(10)]
    shardload.write(samples, tmp_path / "s", fixed_fields=["emb"], length_field="tok", shuffle=False)
    ds = shardload.open(tmp_path / "s")
    assert ds.schema.field("emb").shape == (4,) and not ds.schema.field("emb").variable
    np.testing.assert_array_equal(ds.lengths, np.arange(1, 11))


@pytest.mark.parametrize("num_shards", [1, 3, 7, 64])
def test_shard_counts_differ_by_at_most_one(tmp_path: Path, num_shards: int) -> None:
    samples = synthetic_samples(101, seed=2)
    shardload.write(samples, tmp_path / "s", num_shards=num_shards)
    counts = [s.samples for s in shardload.open(tmp_path / "s").shards]
    # Invariant: balanced shards (max - min <= 1), nothing lost
    assert max(counts) - min(counts) <= 1 and sum(counts) == 101


def test_balance_tokens_evens_out_total_length(tmp_path: Path) -> None:
    samples = synthetic_samples(400, seed=4)
    shardload.write(samples, tmp_path / "a", num_shards=8, balance="samples", shuffle=False)
    shardload.write(samples, tmp_path / "b", num_shards=8, balance="tokens")
    spread = {}
    for name in "ab":
        shards = shardload.open(tmp_path / name).shards
        tokens = [s.tokens for s in shards]
        counts = [s.samples for s in shards]
        assert max(counts) - min(counts) <= 1
        spread[name] = max(tokens) - min(tokens)
    longest = int(shardload.open(tmp_path / "b").lengths.max())
    assert spread["b"] <= longest
    assert spread["b"] < spread["a"]


def test_shard_size_target_sets_the_shard_count(tmp_path: Path) -> None:
    samples = synthetic_samples(200, seed=5)
    payload = sum(a.nbytes for s in samples for a in s.values())
    shardload.write(samples, tmp_path / "s", shard_size=payload // 4 + 1)
    assert len(shardload.open(tmp_path / "s").shards) == 4


def test_manifest_contents(tmp_path: Path, samples: list[dict]) -> None:
    shardload.write(samples, tmp_path / "s", num_shards=3)
    m = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert m["format"] == "shardload" and m["format_version"] == 1 and m["shard_format"] == "arrow"
    assert m["total_samples"] == len(samples)
    assert [f["name"] for f in m["schema"]["fields"]] == ["tokens", "features", "label"]
    assert m["schema"]["fields"][1]["shape"] == [None, 4]
    firsts = [s["first_sample"] for s in m["shards"]]
    assert firsts == [0, m["shards"][0]["samples"], m["shards"][0]["samples"] + m["shards"][1]["samples"]]
    assert all(s["checksum"].startswith("sha256:") for s in m["shards"])
    assert set(m["stats"]) >= {"min", "p50", "p90", "p99", "max", "mean"}
    assert m["lengths"]["per_field"] == {"tokens": "lengths.tokens.npy", "features": "lengths.features.npy"}


def test_shards_are_plain_arrow(tmp_path: Path, samples: list[dict]) -> None:
    import pyarrow as pa

    shardload.write(samples, tmp_path / "s", num_shards=2, shuffle=False)
    table = pa.ipc.open_file(str(tmp_path / "s" / "shards" / "shard-000000.arrow")).read_all()
    assert table.column("tokens").to_pylist()[3] == samples[3]["tokens"].tolist()
    assert np.asarray(table.column("features")[2].as_py(), np.float32).shape == samples[2]["features"].shape


def test_workers_give_the_same_bytes_as_one_process(tmp_path: Path, samples: list[dict]) -> None:
    shardload.write(samples, tmp_path / "a", num_shards=4, workers=1)
    shardload.write(samples, tmp_path / "b", num_shards=4, workers=2)
    a = [s.checksum for s in shardload.open(tmp_path / "a").shards]
    b = [s.checksum for s in shardload.open(tmp_path / "b").shards]
    assert a == b


def test_dtype_override_casts_and_refuses_overflow(tmp_path: Path) -> None:
    samples = [{"x": np.array([1.5, 2.5], np.float64), "t": np.array([1, 2], np.int64)}]
    shardload.write(samples, tmp_path / "a", dtypes={"x": "float32", "t": "int16"})
    ds = shardload.open(tmp_path / "a")
    assert ds[0]["x"].dtype == np.float32 and ds[0]["t"].dtype == np.int16
    with pytest.raises(shardload.InputError, match="sample 0: field 'x' cannot be cast to float16: values overflow"):
        shardload.write([{"x": np.array([1e6])}], tmp_path / "b", dtypes={"x": "float16"})
    with pytest.raises(shardload.InputError, match="do not fit int8"):
        shardload.write([{"x": np.array([300])}], tmp_path / "c", dtypes={"x": "int8"})


def test_marker_files_in_a_source_directory_are_ignored(tmp_path: Path) -> None:
    src = tmp_path / "npy"
    src.mkdir()
    for i in range(3):
        np.save(src / f"{i}.npy", np.arange(i + 1, dtype=np.int32))
    (src / "_SUCCESS").write_text("")
    shardload.prepare(src, tmp_path / "s", shuffle=False, field="tokens")
    assert [len(shardload.open(tmp_path / "s")[i]["tokens"]) for i in range(3)] == [1, 2, 3]


RULE_SAMPLES = [
    {"a": np.arange(n, dtype=np.int32), "b": np.ones((m, 2), np.float32)} for n, m in [(3, 2), (1, 5), (4, 0)]
]


@pytest.mark.parametrize(
    ("samples", "options", "expected"),
    [
        (RULE_SAMPLES, {}, [3, 5, 4]),  # the longest variable field
        (RULE_SAMPLES, {"length_field": "a"}, [3, 1, 4]),  # the named field, however long the others
        ([{"a": np.int64(i), "b": np.zeros(2, np.float32)} for i in range(3)], {"fixed_fields": ["b"]}, [1, 1, 1]),
    ],
    ids=["longest variable field", "length_field", "no variable field"],
)
def test_one_batching_length_rule_for_prepare_and_verify(
    tmp_path: Path, samples: list[dict[str, np.ndarray]], options: dict[str, Any], expected: list[int]
) -> None:
    # Schema.batching_lengths is the rule; prepare writes lengths.npy with it, verify and the loader recompute it.
    shardload.write(samples, tmp_path / "s", num_shards=2, shuffle=False, **options)
    ds = shardload.open(tmp_path / "s")
    np.testing.assert_array_equal(ds.lengths, expected)
    per_field = {f.name: np.array([s[f.name].shape[0] for s in samples]) for f in ds.schema.variable_fields}
    np.testing.assert_array_equal(ds.schema.batching_lengths(per_field, len(samples)), expected)
    recomputed = [recompute_lengths(ds.schema, ds.shard_columns(k))[""] for k in range(len(ds.shards))]
    np.testing.assert_array_equal(np.concatenate(recomputed), expected)
    assert verify(tmp_path / "s").ok
