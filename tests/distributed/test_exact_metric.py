"""ExactMean over real ranks (torchrun, gloo, 2 and 3 processes, under the watchdog) against one process.

Claims tested: every rank's ``compute()`` is the same, and equals the mean
computed in this process over every sample of each source once, per sample
and per token, to float64 rounding; filler rows occurred and counted for
nothing; the ranks' own sums add up to the reference.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from shardload.testing import synthetic_samples
from tests.distributed.watchdog import run_with_watchdog

JOB = str(Path(__file__).with_name("metric_job.py"))
pytestmark = pytest.mark.slow


def references(samples: dict[str, list[np.ndarray]]) -> dict[str, float]:
    """The means of metric_job.py's values, one sample (one token) at a time, exactly rounded sums."""
    want = {}
    per_sample = {
        k: [math.log1p(float(t.sum(dtype=np.float64))) + 1e-3 * len(t) for t in v] for k, v in samples.items()
    }
    per_token = {k: [math.cos(float(x)) for t in v for x in t] for k, v in samples.items()}
    for name, values in (("sample", per_sample), ("token", per_token)):
        every = [x for k in values for x in values[k]]
        want[name] = math.fsum(every) / len(every)
        for k, xs in values.items():
            want[f"{name}/{k}"] = math.fsum(xs) / len(xs)
    return want


@pytest.mark.parametrize(("devices", "n_a", "n_b"), [(2, 23, 6), (3, 17, 40)])
def test_exact_mean_over_ranks_equals_the_one_process_mean(tmp_path: Path, devices: int, n_a: int, n_b: int) -> None:
    samples = {
        "a": [s["tokens"] for s in synthetic_samples(n_a, seed=1)],
        "b": [s["tokens"] for s in synthetic_samples(n_b, seed=2, median_tokens=40)],
    }
    for name, tokens in samples.items():
        shardload.write([{"tokens": t} for t in tokens], tmp_path / name, num_shards=3, progress=False)
    out = tmp_path / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(devices), JOB]
    res = run_with_watchdog([*cmd, str(tmp_path / "a"), str(tmp_path / "b"), str(out)], timeout=240)
    assert not res.hung, "the evaluation hung:\n" + res.tail()
    assert res.returncode == 0, res.tail()
    ranks: list[dict[str, Any]] = []
    for r in range(devices):
        record = out / f"rank{r}.json"
        assert record.exists(), f"rank {r} left no record:\n" + res.tail()
        ranks.append(json.loads(record.read_text()))
    # Invariant: every rank ran the same batches' count, and gets the same values, bit for bit
    assert len({(r["batches"], r["packed_batches"]) for r in ranks}) == 1
    assert all(r["computed"] == ranks[0]["computed"] and r["counts"] == ranks[0]["counts"] for r in ranks)
    # the check covers filler rows, and each real sample once over the ranks
    assert sum(r["fillers"] for r in ranks) > 0
    assert sorted(i for r in ranks for i in r["ids"]) == list(range(n_a + n_b))
    # Invariant: the reduced means are those of one process over every sample (every token) once
    want = references(samples)
    got = ranks[0]["computed"]
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-12), key
    n_tokens = [sum(len(t) for t in samples[k]) for k in ("a", "b")]
    assert ranks[0]["counts"] == [n_a, n_b, *n_tokens]
    # what each rank added itself sums to the reference: the reduction adds sums, not means
    for k, name in enumerate(("a", "b")):
        total = math.fsum(r["own"][name][0] for r in ranks)
        assert total / sum(r["own"][name][1] for r in ranks) == pytest.approx(want[f"sample/{name}"], rel=1e-12)
        assert sum(r["own"][name][1] for r in ranks) == [n_a, n_b][k]
