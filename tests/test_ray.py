"""shardload.integrations.ray_sink on a local Ray (one session for the module): a dataset -> ShardSink -> one merged set."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray  # the test extra installs it (shardload[ray])

import shardload
import shardload.integrations.ray_sink as sr
from shardload.sets.verify import verify

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


def make_samples(n: int = 240) -> list[dict[str, Any]]:
    rng = np.random.default_rng(11)
    return [
        {"tokens": rng.integers(0, 5000, int(k)).astype(np.int32), "label": np.int64(i)}
        for i, k in enumerate(rng.integers(1, 50, n))
    ]


def test_dataset_to_a_merged_set_equal_to_write(tmp_path: Path) -> None:
    samples = make_samples()
    ds = ray.data.from_items(samples, override_num_blocks=4)
    result = sr.write_dataset(ds, tmp_path / "out", shuffle=False, num_shards=2)
    shardload.write(samples, tmp_path / "single", shuffle=False, num_shards=8)
    got, want = shardload.open(tmp_path / "out"), shardload.open(tmp_path / "single")
    assert (result.parts, result.samples) == (4, len(samples))
    assert got.schema == want.schema
    # ids in the dataset's order (write_dataset preserves it): the same samples as write() of the same list
    for i in range(len(samples)):
        assert np.array_equal(got[i]["tokens"], want[i]["tokens"]) and int(got[i]["label"]) == i
    assert np.array_equal(np.asarray(got.lengths), np.asarray(want.lengths))
    assert verify(tmp_path / "out").ok
    assert sorted(p.name for p in (tmp_path / "out" / "parts").iterdir()) == [f"{k:05d}-of-00004" for k in range(4)]


def test_a_failing_task_leaves_no_merged_set(tmp_path: Path) -> None:
    def explode(row: dict[str, Any]) -> dict[str, Any]:
        if int(row["label"]) == 150:
            raise ValueError("bad row 150")
        return row

    ds = ray.data.from_items(make_samples(), override_num_blocks=4).map(explode)
    out = tmp_path / "out"
    with pytest.raises(Exception, match="bad row 150"):
        sr.write_dataset(ds, out)
    assert not (out / "manifest.json").exists()
    assert not [p for p in (out / "parts").iterdir()]  # the parts of this write are removed
    with pytest.raises(shardload.MergeError):
        shardload.merge(out)


def test_sink_refuses_an_existing_set(tmp_path: Path) -> None:
    out = tmp_path / "out"
    shardload.write(make_samples(10), out)
    ds = ray.data.from_items(make_samples(20), override_num_blocks=2)
    with pytest.raises(Exception, match="already holds a shard set"):
        sr.write_dataset(ds, out)
    assert len(shardload.open(out)) == 10  # untouched
    with pytest.raises(shardload.InputError, match="resume"):
        sr.ShardSink(out, resume=True)
