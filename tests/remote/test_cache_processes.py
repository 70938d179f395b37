"""Processes and loaders sharing one node cache of a remote set.

Claims tested: a loader worker forked from a process that maps shards must not keep them mapped: after a fork, the child has copies of its parent's shard mappings and descriptors; kept,
they would hold the disk space of a shard the node cache evicted (deleted) for as long as the child lives.
The child lets go of its copies when it first reads, and reads its own shards under locks of its own.
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from tests.helpers.servers import S3Server
from tests.remote.test_remote_sets import make_set, options


def _child(ss: Any, sample: int, ready: Any, done: Any) -> None:
    try:
        ready.send(("ok", ss[sample]["tokens"].tolist()))
    except BaseException as exc:  # noqa: BLE001  reported to the parent, which fails the test
        ready.send(("error", repr(exc)))
    done.recv()  # keep running while the parent evicts


@pytest.mark.slow
def test_a_forked_reader_lets_go_of_the_shards_its_parent_released(s3: S3Server, tmp_path: Path) -> None:
    local = make_set(tmp_path, n=40, shards=4)
    url = s3.upload(local, "forked/set")
    ss = shardload.open(url, remote=options(s3, tmp_path / "cache"))
    ss[0]  # this process maps shard 0 and holds it in the cache
    remote = ss.remote
    assert remote is not None and not remote._remove_unused(0)  # held: the cache may not evict it
    last = len(ss) - 1  # in the last shard
    ctx = multiprocessing.get_context("fork")
    ready_r, ready_w = ctx.Pipe(duplex=False)
    done_r, done_w = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(ss, last, ready_w, done_r), daemon=True)
    child.start()
    try:
        assert ready_r.poll(60), "the forked reader did not answer"
        status, tokens = ready_r.recv()
        assert status == "ok", tokens
        np.testing.assert_array_equal(tokens, shardload.open(local)[last]["tokens"])
        shard0 = str(remote._path(0))
        ss.close()  # the parent releases shard 0 while the child still runs
        assert remote._remove_unused(0) and not remote.cached(0)  # evicted: the file is deleted
        # Invariant: no process keeps the deleted shard mapped or open, so its space is free
        assert not [line for line in Path(f"/proc/{child.pid}/maps").read_text().splitlines() if shard0 in line]
        fds = Path(f"/proc/{child.pid}/fd")
        assert not [fd for fd in fds.iterdir() if os.readlink(fd).startswith(shard0)]
        # The child's own shard stays held by the child, under its own lock.
        last_shard = len(ss.manifest.shards) - 1
        assert not remote._remove_unused(last_shard)
    finally:
        done_w.send("exit")
        child.join(30)
        if child.is_alive():
            os.kill(child.pid or 0, 9)
    assert child.exitcode == 0


def test_a_killed_open_leaves_nothing_behind_for_the_next_one(s3: S3Server, tmp_path: Path) -> None:
    # A process killed while it fetched the metadata leaves its .incoming.<pid> directory; the next
    # fetch, under the same lock, removes it (no other process can be fetching at that moment).
    local = make_set(tmp_path, n=20, shards=2)
    url = s3.upload(local, "killed-open/set")
    remote = shardload.open(url, remote=options(s3, tmp_path / "cache")).remote
    assert remote is not None
    stale = remote.set_dir / ".incoming.4194304"
    stale.mkdir()
    (stale / "manifest.json").write_text("{}")
    (remote.set_dir / "current.json").unlink()  # the next open fetches the metadata again
    again = shardload.open(url, remote=options(s3, tmp_path / "cache"))
    assert len(again) == 20 and not stale.exists()
    assert not list(remote.set_dir.glob(".incoming.*"))


def test_two_loaders_of_one_set_in_one_process_publish_their_read_orders_apart(s3: S3Server, tmp_path: Path) -> None:
    # The eviction rule reads every reader's published order; two loaders of the same URL in one process
    # (train and val of one set, say) wrote the same file and the second hid the first's next uses.
    local = make_set(tmp_path, n=40, shards=4)
    url = s3.upload(local, "two-loaders/set")
    first = shardload.open(url, remote=options(s3, tmp_path / "cache")).remote
    second = shardload.open(url, remote=options(s3, tmp_path / "cache")).remote
    assert first is not None and second is not None
    first.publish_sequence(np.array([0, 1], dtype=np.int64))
    second.publish_sequence(np.array([3, 2], dtype=np.int64))
    # Invariant: each shard's next use is the nearest over both orders
    assert first.next_use().tolist() == [0, 1, 1, 0]
    second.unpublish()
    assert first.next_use()[:2].tolist() == [0, 1] and (first.next_use()[2:] > 1000).all()
