"""shardload._base.output: the one lock, atomic file and index-last rules of prepare and export."""

from __future__ import annotations

import doctest
import importlib
import os
from pathlib import Path

import pytest

import shardload
from shardload._base.output import OutputLock, atomic_file, atomic_write_text, publish_index, withdraw_index


def test_a_second_writer_is_refused_until_the_first_lets_go(tmp_path: Path) -> None:
    first = OutputLock(tmp_path / ".lock", busy="busy: wait for it")
    second = OutputLock(tmp_path / ".lock", busy="busy: wait for it")
    first.acquire()
    assert OutputLock.held_by_another(tmp_path / ".lock")
    with pytest.raises(shardload.OutputLockedError, match="busy: wait for it"):
        second.acquire()
    first.release()
    assert not (tmp_path / ".lock").exists()  # released with remove: no litter
    second.acquire()  # the file removed under it is created again, and locked
    assert second.held
    second.release(remove=False)
    assert (tmp_path / ".lock").exists() and not OutputLock.held_by_another(tmp_path / ".lock")


def test_the_lock_is_never_inherited(tmp_path: Path) -> None:
    lock = OutputLock(tmp_path / ".lock", busy="busy")
    lock.acquire()
    try:
        fd = lock._fd
        assert fd is not None and not os.get_inheritable(fd)  # exec'd children never get it
        pid = os.fork()
        if pid == 0:  # the child's copy of the descriptor no longer names the lock file
            same = os.path.samestat(os.fstat(fd), os.stat(tmp_path / ".lock"))
            os._exit(1 if same else 0)
        assert os.waitpid(pid, 0)[1] == 0
    finally:
        lock.release()


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "record.json"
    atomic_write_text(path, "old")
    with pytest.raises(RuntimeError), atomic_file(path) as tmp:
        tmp.write_text("half of the ne")
        raise RuntimeError("stopped")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]
    with atomic_file(path, tmp=tmp_path / "record.json.tmp") as tmp:
        tmp.write_text("new")
    assert path.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]


def test_the_index_goes_first_and_comes_back_last(tmp_path: Path) -> None:
    index = tmp_path / "index.json"
    index.write_text("old")
    withdraw_index(index)
    assert not index.exists()  # from now on the directory does not claim to be complete
    staged = tmp_path / ".index.json.new"
    staged.write_text("new")
    publish_index(staged, index)
    assert index.read_text() == "new" and not staged.exists()


@pytest.mark.parametrize(
    "module", ["shardload._base.output", "shardload.sets.verify", "shardload.integrations.webdataset_export"]
)
def test_docstring_examples_run(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module))
    assert result.failed == 0
