"""Configured maps under careless or hostile use: values no record can hold and map files that change while prepare
runs are refused by name (exit 3), never an internal error, and never a set whose record misstates its map file."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import shardload
from shardload.cli import main
from shardload.errors import InputError
from shardload.prepare.mapconfig import checked_map_args, parse_map_arg

MODULE = """
import os

import numpy as np


def make(tokenizer, then="keep"):
    with open(tokenizer, "rb") as fh:
        size = len(fh.read())
    if then == "append":  # the file changes after this process read it, as an editor saving it would
        with open(tokenizer, "ab") as fh:
            fh.write(b" ")
    elif then == "delete":
        os.unlink(tokenizer)

    def encode(sample):
        return {"ids": np.full(len(sample["text"]), size, dtype=np.int32)}

    return encode


def anything(**kwargs):
    def encode(sample):
        return {"ids": np.zeros(1, dtype=np.int32)}

    return encode
"""


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Any]:
    """A directory with the map's module ``hostilemap`` (importable), ``tok.json`` and two JSON Lines files."""
    d = tmp_path / "job"
    (d / "src").mkdir(parents=True)
    (d / "hostilemap.py").write_text(MODULE)
    (d / "tok.json").write_text('{"vocab": 1}')
    for k in range(2):
        lines = [json.dumps({"text": "x" * (i % 7 + 1)}) + "\n" for i in range(50)]
        (d / "src" / f"part-{k}.jsonl").write_text("".join(lines))
    monkeypatch.setattr(sys, "path", [str(d), *sys.path])
    monkeypatch.delitem(sys.modules, "hostilemap", raising=False)
    import hostilemap  # type: ignore[import-not-found]

    return d, hostilemap


def test_a_map_argument_nested_too_deeply_is_refused_by_name() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(InputError, match=r"--map-arg x=\.\.\.: the value's JSON nests lists or dicts too deeply"):
        parse_map_arg(f"x={deep}")
    nested: list[Any] = []
    for _ in range(100_000):
        nested = [nested]
    with pytest.raises(InputError, match=r"map_args\['x'\] nests lists or dicts too deeply to be recorded"):
        checked_map_args({"x": nested})
    # a map file's path is never read as JSON: a file may be named like a number or a list
    assert parse_map_arg("tok=1e999", "--map-file") == ("tok", "1e999")
    assert parse_map_arg(f"tok={deep[:10]}", "--map-file") == ("tok", deep[:10])


def test_a_number_beyond_a_float_is_refused_naming_the_argument() -> None:
    with pytest.raises(InputError, match=r"--map-arg 'x=1e999': the number 1e999 is beyond the range of a float"):
        parse_map_arg("x=1e999")
    with pytest.raises(InputError, match="beyond the range"):
        parse_map_arg('x={"a": [-1e400]}')
    assert parse_map_arg('x="1e999"') == ("x", "1e999")
    assert parse_map_arg("x=1e308") == ("x", 1e308)


def test_map_arguments_that_are_not_unicode_are_refused() -> None:
    # what Python makes of command-line bytes that are not UTF-8 (b"a\xff")
    with pytest.raises(InputError, match=r"map_args\['x'\] = 'a\\udcff' holds text that is not valid Unicode"):
        checked_map_args({"x": "a\udcff"})
    with pytest.raises(InputError, match="not valid Unicode"):
        checked_map_args({"x": {"k": ["a\udcff"]}})
    assert checked_map_args({"x": "é"}) == {"x": "é"}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--map-arg", "x=" + "[" * 100_000 + "]" * 100_000], "nests lists or dicts too deeply"),
        (["--map-arg", "x=1e999"], "beyond the range of a float"),
        (["--map-arg", "x=a\udcff"], "not valid Unicode"),
    ],
)
def test_command_line_map_arguments_no_record_can_hold_exit_3(
    tmp_path: Path, job: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any, extra: list[str], message: str
) -> None:
    d, _ = job
    monkeypatch.chdir(d)
    out = tmp_path / "out"
    assert (
        main(["prepare", "src", "-o", str(out), "--no-progress", "--map-factory", "hostilemap:anything", *extra]) == 3
    )
    err = capsys.readouterr().err
    assert message in err and "internal error" not in err
    assert len(err) < 2000  # the value is not repeated whole
    assert not out.exists()


def set_files(out: Path) -> dict[Path, bytes]:
    """The bytes of the set's files (a failed run's work dir aside)."""
    return {
        p: p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and not p.relative_to(out).parts[0].startswith(".prepare")
    }


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(("then", "said"), [("append", "changed while prepare ran"), ("delete", "cannot be read any")])
def test_a_map_file_changed_while_prepare_runs_commits_nothing(
    tmp_path: Path, job: Any, workers: int, then: str, said: str
) -> None:
    d, mod = job
    out = tmp_path / "out"
    shardload.prepare(d / "src", out, progress=False)
    before = set_files(out)
    kwargs: dict[str, Any] = {"map_factory": mod.make, "map_files": {"tokenizer": str(d / "tok.json")}}
    with pytest.raises(InputError) as caught:
        shardload.prepare(
            d / "src", out, overwrite=True, workers=workers, progress=False, map_args={"then": then}, **kwargs
        )
    # the old set is intact
    assert set_files(out) == before
    if then == "delete" and workers == 2 and "FileNotFoundError" in str(caught.value):
        return  # the other worker's factory found no file: that is the error, and nothing was committed
    assert re.search(rf"the map file \S+tok.json \(map_files\['tokenizer'\]\) {said}", str(caught.value))
    assert not (out / ".prepare").exists()  # nothing left to resume: its samples may come from either file
    # with the file left as it is now, the same run makes a set whose record is the file it read
    (d / "tok.json").write_text('{"vocab": 2}')
    shardload.prepare(d / "src", out, overwrite=True, workers=workers, progress=False, **kwargs)
    recorded = json.loads((out / "manifest.json").read_text())["options"]["map_files"]["tokenizer"]
    assert recorded["sha256"] == hashlib.sha256(b'{"vocab": 2}').hexdigest()
    assert int(shardload.open(out)[0]["ids"][0]) == len(b'{"vocab": 2}')


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_map_file_that_is_no_regular_file_is_refused_without_reading_it(tmp_path: Path, job: Any, kind: str) -> None:
    d, mod = job
    if kind == "fifo":  # no writer: an open for reading would wait for one for ever
        path = tmp_path / "tok.fifo"
        os.mkfifo(path)
    else:  # never ends
        path = Path("/dev/zero")
    out = tmp_path / "out"
    outcome: list[InputError] = []

    def run() -> None:
        try:
            shardload.prepare(d / "src", out, map_factory=mod.make, map_files={"tokenizer": path}, progress=False)
        except InputError as exc:  # anything else fails the test below: no outcome
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "prepare hung on the map file"
    assert len(outcome) == 1
    assert f"the map file {path} (--map-file tokenizer={path}" in str(outcome[0])
    assert "not a regular file" in str(outcome[0])
    assert not out.exists()
