"""A configured map: arguments (``map_args``, ``--map-arg``), a factory (``map_factory``, ``--map-factory``) and the
files a map reads (``map_files``, ``--map-file``), with a real tokenizer (HF ``tokenizers``, trained here).

The factory loads the tokenizer it is given and returns the function applied to each text; it is called once per
worker process, never in the main process; its arguments and its file are recorded, and ``--resume`` refuses other
arguments or a changed file.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

import shardload
from shardload.cli import main
from shardload.errors import InputError, OutputError
from shardload.prepare.mapconfig import checked_map_args, parse_map_arg
from shardload.prepare.mapping import load_map
from shardload.prepare.options import PrepareOptions
from tests.helpers.order import in_input_order, in_origin_order

from .conftest import corpus

#: the map's module, as a user writes it: no environment variable, no path in the code
MODULE = """
import os

import numpy as np
from tokenizers import Tokenizer


def make_encoder(tokenizer, max_tokens, calls=None, stop=None):
    if calls is not None:  # one file per process that calls the factory, one line per call
        with open(os.path.join(calls, str(os.getpid())), "a") as fh:
            fh.write("called\\n")
    tok = Tokenizer.from_file(tokenizer)

    def encode(sample):  # a closure: made in the worker, never pickled
        if stop is not None and sample["text"] == "stop here" and os.path.exists(stop):
            raise ValueError("stopped on purpose")
        ids = np.asarray(tok.encode(sample["text"]).ids, dtype=np.int32)
        return [{"input_ids": ids[i : i + max_tokens]} for i in range(0, len(ids), max_tokens)] or None

    return encode


def make_batch_encoder(tokenizer, max_tokens):
    tok = Tokenizer.from_file(tokenizer)

    def encode_batch(batch):
        out = []
        for e in tok.encode_batch(batch["text"]):
            ids = np.asarray(e.ids, dtype=np.int32)
            out.append([{"input_ids": ids[i : i + max_tokens]} for i in range(0, len(ids), max_tokens)] or None)
        return out

    return encode_batch


def encode(sample, tokenizer, max_tokens):
    return make_encoder(tokenizer, max_tokens)(sample)


def raising(tokenizer):
    raise RuntimeError("no GPU here")


def not_a_function(tokenizer):
    return tokenizer


def encode_fixed(sample):  # a map without arguments, as before they existed
    return encode(sample, os.path.join(os.path.dirname(__file__), "tokenizer.json"), 6)
"""


@pytest.fixture
def job(tmp_path: Path, tokenizer_file: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Any]:
    """The job's directory (its module ``cfgtok.py`` importable), with four JSON Lines files in ``src``."""
    d = tmp_path / "job"
    d.mkdir()
    (d / "cfgtok.py").write_text(MODULE)
    monkeypatch.setattr(sys, "path", [str(d), *sys.path])
    monkeypatch.delitem(sys.modules, "cfgtok", raising=False)
    src = d / "src"
    src.mkdir()
    for k in range(4):
        texts = corpus(40, 30 + k) + (["stop here"] if k == 3 else [])
        (src / f"part-{k}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    shutil.copy(tokenizer_file, d / "tokenizer.json")
    import cfgtok  # type: ignore[import-not-found]

    return d, cfgtok


def pieces(d: Path, max_tokens: int) -> list[np.ndarray]:
    """What the map must make of the job's texts, in input order, tokenized here directly."""
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    out = []
    for f in sorted((d / "src").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            ids = tok.encode(json.loads(line)["text"]).ids
            out += [np.asarray(ids[i : i + max_tokens], dtype=np.int32) for i in range(0, len(ids), max_tokens)]
    return out


def same_pieces(out: Path, d: Path, max_tokens: int) -> None:
    got, want = in_input_order(out), pieces(d, max_tokens)
    assert len(got) == len(want) > 0
    assert all(np.array_equal(g, w) and g.dtype == np.int32 for g, w in zip(got, want, strict=True))
    # ShardSet.origin alone (record, then piece) gives the same order, whichever way the map was given
    assert all(np.array_equal(g, w) for g, w in zip(in_origin_order(out), want, strict=True))


def test_a_factory_is_called_once_in_each_worker_and_never_in_the_main_process(tmp_path: Path, job: Any) -> None:
    d, mod = job
    calls = tmp_path / "calls"
    calls.mkdir()
    args = {"max_tokens": 6, "calls": str(calls)}
    shardload.prepare(
        d / "src",
        tmp_path / "out",
        map_factory=mod.make_encoder,
        map_args=args,
        map_files={"tokenizer": d / "tokenizer.json"},
        workers=2,
        unit_bytes=600,  # many units per worker: the factory is still called once per process, not per unit
        progress=False,
    )
    made = {int(p.name): p.read_text().splitlines() for p in calls.iterdir()}
    # Invariant: once per worker process (2 at most), none in the main process, never per unit or record
    assert 1 <= len(made) <= 2 and os.getpid() not in made
    assert all(lines == ["called"] for lines in made.values()), made
    same_pieces(tmp_path / "out", d, 6)  # the arguments reached the map: pieces of at most max_tokens


def test_a_factory_makes_a_batched_map(tmp_path: Path, job: Any) -> None:
    d, mod = job
    files = {"tokenizer": d / "tokenizer.json"}
    run = {"map_args": {"max_tokens": 5}, "map_files": files, "workers": 2, "num_shards": 2, "progress": False}
    one = shardload.prepare(d / "src", tmp_path / "one", map_factory=mod.make_encoder, **run)
    many = shardload.prepare(d / "src", tmp_path / "many", map_factory=mod.make_batch_encoder, map_batch=16, **run)
    assert many.samples == one.samples and many.dropped == one.dropped > 0
    same_pieces(tmp_path / "many", d, 5)
    assert shardload.open(tmp_path / "many").manifest.options["map_batch"] == 16


def test_arguments_reach_a_plain_map_and_are_recorded(tmp_path: Path, job: Any) -> None:
    d, mod = job
    tok = str(d / "tokenizer.json")
    shardload.prepare(d / "src", tmp_path / "out", map=mod.encode, map_args={"tokenizer": tok, "max_tokens": 5})
    same_pieces(tmp_path / "out", d, 5)
    options = shardload.open(tmp_path / "out").manifest.options
    assert options["map"]["function"] == "cfgtok:encode" and "map_factory" not in options
    assert options["map_args"] == {"max_tokens": 5, "tokenizer": tok}


def test_without_arguments_the_options_record_is_the_one_made_before(job: Any) -> None:
    _, mod = job
    # Invariant: the record of a map with no arguments holds no new key (a run made before them resumes)
    for options in (PrepareOptions(), PrepareOptions(map=mod.encode)):
        assert not {"map_args", "map_factory", "map_files"} & set(options.layout_key())
        assert options.mapper is options.map


def test_the_command_line_and_python_make_the_same_set(
    tmp_path: Path, job: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    d, mod = job
    monkeypatch.chdir(d)
    shardload.prepare(
        "src",
        tmp_path / "py",
        map_factory=mod.make_encoder,
        map_args={"max_tokens": 7},
        map_files={"tokenizer": "tokenizer.json"},
        num_shards=2,
        workers=2,
        unit_bytes=2000,
        progress=False,
    )
    argv = ["prepare", "src", "-o", str(tmp_path / "cli"), "--map-factory", "cfgtok:make_encoder"]
    argv += ["--map-arg", "max_tokens=7", "--map-file", "tokenizer=tokenizer.json"]
    assert main([*argv, "--num-shards", "2", "--workers", "2", "--unit-size", "2000", "--no-progress"]) == 0
    py, cli = (json.loads((tmp_path / w / "manifest.json").read_text()) for w in ("py", "cli"))
    # Invariant: the same options record, set id and shard bytes (checksums) from either entry point
    assert py["options"] == cli["options"] and py["set_id"] == cli["set_id"] and py["shards"] == cli["shards"]
    assert cli["options"]["map_args"] == {"max_tokens": 7}
    assert cli["options"]["map_factory"]["function"] == "cfgtok:make_encoder"
    assert cli["options"]["map_files"]["tokenizer"]["path"] == "tokenizer.json"
    same_pieces(tmp_path / "cli", d, 7)


def test_a_map_named_by_its_file_needs_no_import_path(
    tmp_path: Path, job: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    d, _ = job
    (d / "byfile_tok.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    assert str(d) not in [p for p in sys.path if p != str(d)]
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(d)])
    fn = load_map(f"{d / 'byfile_tok.py'}:make_encoder", "--map-factory")
    assert fn.__module__ == "byfile_tok" and callable(fn(str(d / "tokenizer.json"), 4))
    with pytest.raises(InputError, match=r"--map 'nowhere.py:f': no file nowhere.py"):
        load_map("nowhere.py:f")


def run_of(d: Path, mod: Any) -> dict[str, Any]:
    """The keywords of a run with the factory; it stops on the last file's "stop here" (the other files staged)
    while ``d/stop`` exists."""
    return {
        "map_factory": mod.make_encoder,
        "map_args": {"max_tokens": 6, "stop": str(d / "stop")},
        "map_files": {"tokenizer": d / "tokenizer.json"},
        "chunk_bytes": 64,
        "progress": False,
    }


def test_resume_refuses_other_arguments_and_a_changed_map_file(tmp_path: Path, job: Any) -> None:
    d, mod = job
    out = tmp_path / "out"
    run = run_of(d, mod)
    (d / "stop").touch()
    with pytest.raises(InputError, match="stopped on purpose"):
        shardload.prepare(d / "src", out, **run)
    (d / "stop").unlink()
    assert list((out / ".prepare" / "staging").glob("*.done"))  # work to resume
    other = {**run, "map_args": {**run["map_args"], "max_tokens": 8}}
    with pytest.raises(OutputError, match=r"options differ: map_args was \{'max_tokens': 6, .*now \{'max_tokens': 8"):
        shardload.prepare(d / "src", out, resume=True, **other)
    # the same values reach the map, but the file is no longer compared: another run
    unrecorded = {**run, "map_args": {**run["map_args"], "tokenizer": str(d / "tokenizer.json")}, "map_files": {}}
    with pytest.raises(OutputError, match=r"map_files was \{'tokenizer': .*, now None"):
        shardload.prepare(d / "src", out, resume=True, **unrecorded)
    saved = (d / "tokenizer.json").read_bytes()
    (d / "tokenizer.json").write_bytes(saved.replace(b'"[UNK]"', b'"[UNK2]"', 1))
    with pytest.raises(OutputError, match=r"the map file \S*tokenizer.json \(map_files\['tokenizer'\]\) changed since"):
        shardload.prepare(d / "src", out, resume=True, **run)
    (d / "tokenizer.json").write_bytes(saved)
    done = shardload.prepare(d / "src", out, resume=True, **run)
    fresh = shardload.prepare(d / "src", tmp_path / "fresh", **run)
    assert done.samples == fresh.samples > 0
    ours, theirs = (json.loads((p / "manifest.json").read_text()) for p in (out, tmp_path / "fresh"))
    assert ours["set_id"] == theirs["set_id"] and ours["shards"] == theirs["shards"]
    same_pieces(out, d, 6)


def test_a_run_recorded_without_map_arguments_resumes(
    tmp_path: Path, job: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    d, mod = job
    from shardload.prepare import schedule

    real = schedule.ingest_unit
    calls = []

    def stop_at_the_second_unit(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(schedule, "ingest_unit", stop_at_the_second_unit)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        shardload.prepare(d / "src", out, map=mod.encode_fixed, progress=False)
    monkeypatch.setattr(schedule, "ingest_unit", real)
    recorded = json.loads((out / ".prepare" / "state.json").read_text())["options"]
    # Invariant: a map without arguments is recorded as before they existed (no key of theirs) ...
    assert recorded["map"]["function"] == "cfgtok:encode_fixed"
    assert not {"map_args", "map_factory", "map_files"} & set(recorded)
    with pytest.raises(OutputError, match=r"map_args was None, now \{'max_tokens': 6"):
        args = {"max_tokens": 6, "tokenizer": str(d / "tokenizer.json")}
        shardload.prepare(d / "src", out, resume=True, map=mod.encode, map_args=args)
    # ... and such a record resumes as a run without arguments
    done = shardload.prepare(d / "src", out, resume=True, map=mod.encode_fixed, progress=False)
    same_pieces(out, d, 6)
    assert done.samples == len(pieces(d, 6))


# -- errors --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("max_tokens=2048", ("max_tokens", 2048)),
        ("path=tokenizer.json", ("path", "tokenizer.json")),
        ('name="12"', ("name", "12")),
        ("lower=true", ("lower", True)),
        ("ids=[1, 2]", ("ids", [1, 2])),
        ("x=NaN", ("x", "NaN")),  # no JSON constant: a record could not compare it
        ("empty=", ("empty", "")),
        ("eq=a=b", ("eq", "a=b")),
    ],
)
def test_a_map_argument_is_json_where_it_parses(text: str, parsed: tuple[str, Any]) -> None:
    assert parse_map_arg(text) == parsed


@pytest.mark.parametrize("text", ["max_tokens", "=3", "max-tokens=3", "1x=2"])
def test_a_bad_map_argument_says_how_to_write_it(text: str) -> None:
    with pytest.raises(InputError, match=rf"--map-arg '{text}': write KEY=VALUE"):
        parse_map_arg(text)


@pytest.mark.parametrize(
    ("kind", "fn", "args", "files", "message"),
    [
        (
            "map_factory",
            "make_encoder",
            {"max_tokens": 6, "nope": 1},
            True,
            r"the map factory cfgtok:make_encoder cannot be called with the map arguments given \(max_tokens, "
            r"nope, tokenizer\): got an unexpected keyword argument 'nope'",
        ),
        (
            "map_factory",
            "make_encoder",
            {},
            True,
            r"cfgtok:make_encoder cannot be called .*missing a required argument: 'max_tokens'",
        ),
        (
            "map",
            "encode",
            {"max_tokens": 6, "nope": 1},
            True,
            r"the map function cfgtok:encode cannot be called .*unexpected keyword argument 'nope'",
        ),
        (
            "map_factory",
            "raising",
            {},
            False,
            r"the map factory cfgtok:raising raised RuntimeError: no GPU here, called with tokenizer='\S+' \(once "
            r"per worker process",
        ),
        (
            "map_factory",
            "not_a_function",
            {},
            False,
            r"the map factory cfgtok:not_a_function, called with tokenizer='\S+', returned str '\S+', not a function",
        ),
    ],
)
@pytest.mark.parametrize("workers", [1, 2])
def test_map_errors_name_the_map_and_leave_the_old_set(
    tmp_path: Path, job: Any, kind: str, fn: str, args: dict[str, Any], files: bool, message: str, workers: int
) -> None:
    d, mod = job
    out = tmp_path / "out"
    shardload.prepare(d / "src", out, num_shards=2, progress=False)
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    tokenizer = {"tokenizer": str(d / "tokenizer.json")}
    kwargs = {kind: getattr(mod, fn), "map_args": args if files else {**args, **tokenizer}}
    if files:
        kwargs["map_files"] = tokenizer
    with pytest.raises(InputError, match=message):
        shardload.prepare(d / "src", out, overwrite=True, workers=workers, progress=False, **kwargs)
    # Invariant: a refused or failed run leaves the set it was to replace byte for byte
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before
    assert len(shardload.open(out)) > 0


def test_map_options_are_checked(tmp_path: Path, job: Any) -> None:
    d, mod = job
    with pytest.raises(InputError, match="map and map_factory exclude each other"):
        PrepareOptions(map=mod.encode, map_factory=mod.make_encoder)
    with pytest.raises(InputError, match=r"map_args and map_files .* no map is given"):
        PrepareOptions(map_args={"max_tokens": 3})
    with pytest.raises(InputError, match=r"map_args\['tok'\] = <object .* is not a JSON value"):
        PrepareOptions(map=mod.encode, map_args={"tok": object()})
    with pytest.raises(InputError, match=r"the map file \S*missing.json \(--map-file tokenizer=\S*missing.json"):
        PrepareOptions(map_factory=mod.make_encoder, map_files={"tokenizer": d / "missing.json"})
    with pytest.raises(InputError, match=r"'tokenizer' given both as a map argument and a map file"):
        PrepareOptions(map=mod.encode, map_args={"tokenizer": "a"}, map_files={"tokenizer": d / "tokenizer.json"})
    with pytest.raises(InputError, match="map_factory must be a function"):
        PrepareOptions(map_factory="cfgtok:make_encoder")  # type: ignore[arg-type]
    # a tuple reaches the map as the list the command line gives
    assert checked_map_args({"ids": (1, 2), "a": 1}) == {"a": 1, "ids": [1, 2]}


def test_command_line_map_errors(tmp_path: Path, job: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    d, _ = job
    monkeypatch.chdir(d)
    base = ["prepare", "src", "-o", str(tmp_path / "out"), "--no-progress", "--map-factory", "cfgtok:make_encoder"]
    for extra, message in (
        (["--map-arg", "max_tokens"], "--map-arg 'max_tokens': write KEY=VALUE"),
        (["--map-arg", "max_tokens=3", "--map-arg", "max_tokens=4"], "'max_tokens' is given already"),
        (["--map-arg", "tokenizer=a", "--map-file", "tokenizer=tokenizer.json"], "'tokenizer' is given already"),
    ):
        capsys.readouterr()
        assert main([*base, *extra]) == 3
        assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
