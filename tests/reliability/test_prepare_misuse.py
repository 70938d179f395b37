"""Misuse of prepare's map step: a map that exits instead of returning or raising, a map that drops everything.

A map is the user's code running inside prepare (in this process for one
worker, in the ingest workers otherwise). Whatever it does, the run must end
with an error naming the file, the sample and the function, never with the
map's own exit status and no message.
"""

from __future__ import annotations

import json
import os
import posix
import sys
from pathlib import Path
from typing import Any

import pytest

import shardload
from shardload.errors import InputError, OutputError
from shardload.prepare.mapping import load_map


def exit_on_five(sample: dict[str, Any]) -> dict[str, Any]:
    """A map that calls ``sys.exit(0)`` on the first sample of 5 tokens (not the first sample of the input)."""
    if len(sample["tokens"]) == 5:
        sys.exit(0)
    return sample


def os_exit_in_worker(sample: dict[str, Any]) -> dict[str, Any]:
    """A map that ends its worker process with ``_exit(0)`` on a sample of 5 tokens (never in this process).

    ``posix._exit``: ``os._exit`` itself is caught in the map's thread (tests/reliability/test_map_misuse.py);
    this is an exit nothing in the process sees, which only the pool can report.
    """
    if len(sample["tokens"]) == 5 and os.getpid() != PARENT:
        posix._exit(0)
    return sample


def drop_all(sample: dict[str, Any]) -> None:
    return None


PARENT = os.getpid()


@pytest.fixture
def src(tmp_path: Path) -> Path:
    """Three JSON Lines files of 20 samples each, token lists of 1-7 tokens; the first 5-token one is line 5."""
    d = tmp_path / "src"
    d.mkdir()
    for k in range(3):
        (d / f"f{k}.jsonl").write_text(
            "".join(json.dumps({"tokens": list(range(i % 7 + 1))}) + "\n" for i in range(20))
        )
    return d


@pytest.mark.parametrize("workers", [1, 2])
def test_map_calling_sys_exit_is_an_error_naming_the_sample(tmp_path: Path, src: Path, workers: int) -> None:
    # it once left prepare by the map's own exit status (0 here: a "success" that wrote nothing), with no message
    with pytest.raises(InputError, match=r"f0\.jsonl: line 5: the map function .*exit_on_five called sys\.exit\(0\)"):
        shardload.prepare(src, tmp_path / "out", map=exit_on_five, workers=workers, progress=False)


def test_map_module_calling_sys_exit_on_import_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit('no GPU here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InputError, match=r"importing 'exits_on_import' failed: .*sys\.exit\('no GPU here'\)"):
        load_map("exits_on_import:f")


def test_worker_ended_by_the_map_is_not_reported_as_killed_by_sigterm(tmp_path: Path, src: Path) -> None:
    # the pool SIGTERMs the other workers once one is gone: that was reported as the death, not the exit 0
    with pytest.raises(OutputError, match=r"exited with status 0 .*os\._exit") as info:
        shardload.prepare(src, tmp_path / "out", map=os_exit_in_worker, workers=2, progress=False)
    assert "SIGTERM" not in str(info.value)


def test_map_dropping_every_record_says_so(tmp_path: Path, src: Path) -> None:
    with pytest.raises(
        InputError, match=r"hold no samples after the map: the map function .*drop_all dropped all 60 records"
    ):
        shardload.prepare(src, tmp_path / "out", map=drop_all, progress=False)
    assert not (tmp_path / "out").exists()
