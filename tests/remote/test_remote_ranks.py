"""Two ranks of one node sharing one cache of a remote set (separate processes, gloo barrier, watchdog).

Claims tested: each rank's batches (no workers, then two) equal that rank's batches of the same set on
disk; the manifest, the lengths index and each shard are downloaded once for the node (the proxy's
request log and the cache's own ``.downloads`` log); both ranks read the same mirror.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import shardload
from tests.distributed.watchdog import python, run_with_watchdog, together
from tests.helpers.faultproxy import FaultProxy
from tests.helpers.servers import S3Server, free_port
from tests.remote.shared_cache_digest import READS, digest
from tests.remote.test_remote_sets import downloads, make_set

JOB = str(Path(__file__).with_name("shared_cache_job.py"))


@pytest.mark.slow
def test_two_ranks_share_one_cache_and_download_each_shard_once(s3: S3Server, tmp_path: Path) -> None:
    local = make_set(tmp_path, n=200, shards=8)
    url = s3.upload(local, "ranks/set")
    cache, out = tmp_path / "cache", tmp_path / "out"
    out.mkdir()
    with FaultProxy(s3.endpoint) as proxy:  # no fault: it only counts the requests
        env = {**s3.env(), "AWS_ENDPOINT_URL": proxy.url, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
        port = str(free_port())
        cmds = [python(JOB, url, str(cache), str(out), port) for _ in range(2)]
        res = run_with_watchdog(together(cmds, [{"RANK": str(r)} for r in range(2)]), timeout=240, env=env)
        requests = proxy.requests
    assert not res.hung, "the ranks hung:\n" + res.tail()
    assert res.returncode == 0, res.tail()
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["pid"] != ranks[1]["pid"] and ranks[0]["mirror"] == ranks[1]["mirror"]
    for r, record in enumerate(ranks):
        for name, kw in READS.items():
            want = [digest(b) for b in shardload.make_loader(local, rank=r, world_size=2, **kw)]
            assert record[name] == want and want, (r, name)
    gets = Counter(q.path.rsplit("/", 1)[-1] for q in requests if q.method == "GET")
    shards = [Path(s.file).name for s in shardload.open(local).shards]
    assert {name: gets[name] for name in shards} == dict.fromkeys(shards, 1)
    assert gets["manifest.json"] == 1  # both ranks opened at once; one fetched, the other waited
    assert gets["lengths.npy"] == 1 and set(gets.values()) == {1}  # every object once for the node
    heads = sum(1 for q in requests if q.method == "HEAD" and q.path.endswith("/manifest.json"))
    assert heads >= 2  # each rank asked for the manifest's stamp: both really opened it
    assert downloads(cache) == Counter(range(8))
