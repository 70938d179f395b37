"""A prepare map that misbehaves: exits, forks, raises a BaseException, leaves a thread, closes a stream, prints,
changes directory, returns a field that is no array.

Each is named (the map, the file and the record) or made harmless, with one and two workers, from
the command line and from Python. A map that calls ``os._exit`` would end this test process too:
those runs are subprocesses under a watchdog.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from shardload.cli import main
from shardload.errors import InputError
from tests.distributed.watchdog import Outcome, python, run_with_watchdog

#: the maps the tests name with --map (mapmod:NAME); records are numbered by their first token, file * 10 + line
MAP_MODULE = """
import os
import posix
import sys

import numpy as np


def exit_first(sample):
    os._exit(0)


def exit_later(sample):
    if sample["tokens"][0] == 13:  # in1.jsonl, line 3: after the schema was taken from the first record
        os._exit(0)
    return sample


def exit_bound(sample):
    if sample["tokens"][0] == 13:
        posix._exit(0)  # os._exit under another name: nothing in the process sees it coming
    return sample


def sys_exit_later(sample):
    if sample["tokens"][0] == 13:
        sys.exit(0)
    return sample


def prints(sample):
    print("python print from the map", list(sample["tokens"]))
    return sample


def prints_low(sample):
    os.write(1, b"C-level write to fd 1 from the map\\n")
    return sample


def changes_directory(sample):
    os.chdir(os.environ.get("MAP_ELSEWHERE", "/"))
    return {"tokens": np.asarray(sample["tokens"], dtype=np.int32)}


def none_later(sample):
    return {"tokens": None if sample["tokens"][0] == 13 else sample["tokens"]}


def none_first(sample):
    return {"tokens": None}


def forks_and_exits(sample):
    if os.fork() == 0:  # how a forked child ends: it must end, not run prepare on
        os._exit(0)
    return sample


def _send_sum(queue, tokens):
    queue.put(int(sum(tokens)))


def uses_multiprocessing(sample):
    import multiprocessing

    ctx = multiprocessing.get_context("fork")  # whose children end with os._exit
    queue = ctx.Queue()
    child = ctx.Process(target=_send_sum, args=(queue, list(sample["tokens"])))
    child.start()
    total = queue.get(timeout=20)
    child.join(20)
    return {"tokens": np.asarray(sample["tokens"], dtype=np.int64), "sum": np.int64(total)}


def base_exception_later(sample):
    if sample["tokens"][0] == 13:
        raise BaseException("boom")
    return sample


def generator_exit_first(sample):
    raise GeneratorExit


def leaves_a_thread(sample):
    import threading
    import time

    threading.Thread(target=time.sleep, args=(1000,)).start()
    return sample


def closes_stdout(sample):
    os.close(1)
    return sample


def closes_stderr(sample):
    os.close(2)
    return sample


def closes_stdin(sample):
    os.close(0)
    return sample


def forks_and_returns(sample):
    pid = os.fork()
    if pid == 0:  # a child that forgets to end: it comes back out of the map as a copy of prepare
        return sample
    os.waitpid(pid, 0)
    return sample


def forks_and_sys_exits(sample):
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # raises SystemExit through the map's caller, in the child
    os.waitpid(pid, 0)
    return sample
"""

#: how long a run may be idle before the watchdog calls it a hang
TIMEOUT = 60.0


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``in0.jsonl`` and ``in1.jsonl`` (5 records each, two source units) and ``mapmod.py``, in the current directory."""
    for k in range(2):
        lines = [json.dumps({"tokens": [k * 10 + line] * line}) for line in range(1, 6)]
        (tmp_path / f"in{k}.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "mapmod.py").write_text(MAP_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("mapmod", None)
    return tmp_path


#: run by `python -c` in the work directory: prepare in0/in1 -> out with map mapmod:NAME and WORKERS workers
API_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, "")
    import mapmod
    import shardload
    name, workers = sys.argv[1], int(sys.argv[2])
    try:
        shardload.prepare(["in0.jsonl", "in1.jsonl"], "out", map=getattr(mapmod, name), workers=workers, progress=False)
    except shardload.ShardloadError as exc:
        print(f"RAISED {type(exc).__name__}: {exc}", flush=True)
        sys.exit(3)
    print("RETURNED", flush=True)
    """
)


def run_prepare(work: Path, interface: str, name: str, workers: int, *flags: str) -> Outcome:
    """prepare in0.jsonl in1.jsonl -> out with map ``name``, in a subprocess run in ``work``."""
    if interface == "cli":
        args = ["-m", "shardload", "prepare", "in0.jsonl", "in1.jsonl", "-o", "out", "--map", f"mapmod:{name}"]
        args += ["--workers", str(workers), "--no-progress", *flags]
    else:
        args = ["-c", API_SCRIPT, name, str(workers)]
    cwd = os.getcwd()
    os.chdir(work)
    try:
        outcome = run_with_watchdog(python(*args), timeout=TIMEOUT)
    finally:
        os.chdir(cwd)
    assert not outcome.hung, outcome.tail()
    return outcome


@pytest.mark.parametrize("interface", ["cli", "api"])
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(
    ("name", "where", "called"),
    [
        ("exit_first", "in0.jsonl: line 1", "called os._exit(0)"),
        ("exit_later", "in1.jsonl: line 3", "called os._exit(0)"),
        ("sys_exit_later", "in1.jsonl: line 3", "called sys.exit(0)"),
    ],
)
def test_a_map_that_exits_stops_prepare_with_an_error_naming_it(
    work: Path, interface: str, workers: int, name: str, where: str, called: str
) -> None:
    outcome = run_prepare(work, interface, name, workers)
    # Invariant: never a silent exit 0: the run fails with the map, the file and the record named
    assert outcome.returncode == 3, outcome.tail()
    assert f"{where}: the map function mapmod:{name} {called}" in outcome.output, outcome.tail()
    assert "RETURNED" not in outcome.output
    # Invariant: no set is left in OUT
    assert not (work / "out" / "manifest.json").exists()


def test_an_exit_bound_before_the_run_is_a_worker_death_naming_the_likely_cause(work: Path) -> None:
    """``posix._exit`` is not caught in the process; in a worker its death is seen."""
    outcome = run_prepare(work, "cli", "exit_bound", 2)
    # Invariant: a worker that exits is a failure of the run that names a map's exit as the likely cause
    assert outcome.returncode == 4, outcome.tail()
    assert "exited with status 0 before its work was done" in outcome.output, outcome.tail()
    assert not (work / "out" / "manifest.json").exists()


def run_alone(
    work: Path, name: str, workers: int, *flags: str, timeout: float = TIMEOUT
) -> tuple[int | None, str, list[str]]:
    """prepare with map ``name`` in a process group of its own: its exit status (``None``: killed at ``timeout``),
    its output (both streams), and the processes of its group still alive once it exited (orphans)."""
    import subprocess
    import tempfile
    import time

    args = ["-m", "shardload", "prepare", "in0.jsonl", "in1.jsonl", "-o", "out", "--map", f"mapmod:{name}"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    # a file, not a pipe: an orphan holding the output must not hold up the wait
    with tempfile.TemporaryFile("w+") as output:
        proc = subprocess.Popen(
            python(*args, "--workers", str(workers), "--no-progress", *flags),
            cwd=work,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code: int | None = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        try:
            left = _group(proc.pid)
            deadline = time.monotonic() + 3.0  # a child ending as its parent does is given a moment
            while left and time.monotonic() < deadline:
                time.sleep(0.1)
                left = _group(proc.pid)
        finally:
            try:
                os.killpg(proc.pid, 9)  # the watchdog: nothing of the run outlives the test
            except ProcessLookupError:
                pass
            proc.wait()
        output.seek(0)
        return code, output.read(), left


def _group(pgid: int) -> list[str]:
    """The live (not zombie) processes of process group ``pgid``, as ``pid state command``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm_end = text.rindex(")")
        state, _ppid, pgrp = text[comm_end + 2 :].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            found.append(f"{stat.parent.name} {state} {text[: comm_end + 1]}")
    return found


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(
    "name", ["forks_and_exits", "uses_multiprocessing", "forks_and_returns", "forks_and_sys_exits"]
)
def test_a_map_that_forks_leaves_its_children_their_own_exit(work: Path, workers: int, name: str) -> None:
    code, output, left = run_alone(work, name, workers, "--json", timeout=30)
    # Invariant: a forked child's os._exit ends the child, not blamed on the map: prepare succeeds, ends,
    # and leaves no process behind
    assert code == 0, output[-3000:]
    assert "os._exit" not in output and "sys.exit" not in output, output[-3000:]
    assert not left, left
    assert len(shardload.open(work / "out")) == 10


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(
    ("name", "where", "what"),
    [
        ("base_exception_later", "in1.jsonl: line 3", "raised BaseException: boom"),
        ("generator_exit_first", "in0.jsonl: line 1", "raised GeneratorExit"),
    ],
)
def test_a_map_raising_a_base_exception_is_named(work: Path, workers: int, name: str, where: str, what: str) -> None:
    outcome = run_prepare(work, "cli", name, workers)
    # Invariant: anything a map raises, but Ctrl-C or SIGTERM, is the map's failure: exit 3 naming the
    # file, the record and the function; no traceback
    assert outcome.returncode == 3, outcome.tail()
    assert f"{where}: the map function mapmod:{name} {what}" in outcome.output, outcome.tail()
    assert "Traceback" not in outcome.output, outcome.tail()
    assert not (work / "out" / "manifest.json").exists()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_thread_the_map_leaves_running_does_not_hold_up_the_end(work: Path, workers: int) -> None:
    code, output, left = run_alone(work, "leaves_a_thread", workers, "--json", timeout=30)
    # Invariant: the command ends once its work is done, saying which code left threads running (in this
    # process, or in worker processes that are ended once their work is in); the set is complete
    assert code == 0, output[-3000:]
    said = (
        "thread(s) left running by the map function mapmod:leaves_a_thread"
        if workers == 1
        else "most likely waiting on threads that a map function left running"
    )
    assert said in output, output[-3000:]
    assert not left, left
    assert len(shardload.open(work / "out")) == 10


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(
    ("name", "fd"), [("closes_stdin", "0 (stdin)"), ("closes_stdout", "1 (stdout)"), ("closes_stderr", "2 (stderr)")]
)
def test_a_map_that_closes_an_output_stream_is_named(work: Path, workers: int, name: str, fd: str) -> None:
    outcome = run_prepare(work, "cli", name, workers, "--json")
    # Invariant: exit 3 naming the file, the record, the function and the descriptor, on a stderr put back
    assert outcome.returncode == 3, outcome.tail()
    assert f"in0.jsonl: line 1: the map function mapmod:{name} closed file descriptor {fd}" in outcome.output, (
        outcome.tail()
    )
    assert not (work / "out" / "manifest.json").exists()


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("name", ["prints", "prints_low"])
def test_json_stdout_is_one_line_whatever_the_map_prints(work: Path, workers: int, name: str) -> None:
    outcome = run_prepare(work, "cli", name, workers, "--json")
    assert outcome.returncode == 0, outcome.tail()
    # run_with_watchdog merges the streams: run again with stdout apart to check it alone
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cmd = ["-m", "shardload", "prepare", "in0.jsonl", "in1.jsonl", "-o", "out2", "--map", f"mapmod:{name}"]
    done = subprocess.run(
        python(*cmd, "--workers", str(workers), "--no-progress", "--json"),
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # Invariant: stdout is exactly one line, one JSON object; what the map printed went to stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    assert json.loads(lines[0])["samples"] == 10
    assert "from the map" in done.stderr


def test_json_stdout_is_one_line_in_process(work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """``main([...])`` called in a program: Python prints and fd-level writes of the map both stay off stdout."""
    for name in ("prints", "prints_low"):
        code = main(["prepare", "in0.jsonl", "in1.jsonl", "-o", f"out-{name}", "--map", f"mapmod:{name}", "--json"])
        assert code == 0
        out, err = capfd.readouterr()
        # Invariant: one JSON line on stdout
        assert len(out.splitlines()) == 1 and json.loads(out)["samples"] == 10, out
        assert "from the map" in err
    print("stdout is stdout again")
    assert capfd.readouterr().out == "stdout is stdout again\n"


@pytest.mark.parametrize("interface", ["cli", "api"])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_map_that_changes_directory_does_not_move_prepare(
    work: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, interface: str, workers: int
) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    monkeypatch.setenv("MAP_ELSEWHERE", str(elsewhere))
    if interface == "cli":
        args = ["prepare", "in0.jsonl", "in1.jsonl", "-o", "out", "--map", "mapmod:changes_directory"]
        code = main([*args, "--workers", str(workers)])
        assert code == 0
    else:
        import mapmod

        shardload.prepare(["in0.jsonl", "in1.jsonl"], "out", map=mapmod.changes_directory, workers=workers)
    # Invariant: the sources were read and the set written where they were named, and this process's
    # working directory is its own again
    assert Path.cwd() == work
    assert len(shardload.open(work / "out")) == 10
    assert not any(elsewhere.iterdir())


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(("name", "where"), [("none_first", "in0.jsonl: line 1"), ("none_later", "in1.jsonl: line 3")])
def test_a_map_returning_none_for_a_field_is_told_so(work: Path, workers: int, name: str, where: str) -> None:
    import mapmod

    with pytest.raises(InputError) as info:
        shardload.prepare(["in0.jsonl", "in1.jsonl"], "out", map=getattr(mapmod, name), workers=workers)
    message = str(info.value)
    # Invariant: the map, the field, the value and the record are named; not a guess at ragged lists
    assert f"{where}: the map function mapmod:{name} returned field 'tokens' = None" in message, message
    assert "a field holds" in message and "ragged" not in message


def as_set(sample: dict[str, Any]) -> dict[str, Any]:
    return {"tokens": set(sample["tokens"])}


def as_dict(sample: dict[str, Any]) -> dict[str, Any]:
    return {"tokens": {"ids": sample["tokens"]}}


def as_object(sample: dict[str, Any]) -> dict[str, Any]:
    return {"tokens": object()}


def with_none_inside(sample: dict[str, Any]) -> dict[str, Any]:
    return {"tokens": [1, None, 3]}


@pytest.mark.parametrize(
    ("fn", "said"),
    [
        (as_set, "returned field 'tokens' = a set (which has no order)"),
        (as_dict, "returned field 'tokens' = a dict"),
        (as_object, "returned field 'tokens' = an object of type object"),
        # found only when converted: named as a mapped sample's field
        (with_none_inside, "(mapped by {map}): field 'tokens' is a list holding None (at index 1)"),
    ],
)
def test_a_map_returning_a_field_that_is_no_array_is_told_so(fn: Any, said: str) -> None:
    rows = [{"tokens": np.arange(3)}]
    with pytest.raises(InputError) as info:
        shardload.write(rows, "unused", map=fn)
    message = str(info.value)
    name = f"{__name__}:{fn.__name__}"
    said = said.format(map=name) if "{map}" in said else f"the map function {name} {said}"
    # Invariant: the map and the field are named with what the value is, never "ragged nested lists"
    assert message.startswith("sample 0") and said in message, message
    assert "a field holds" in message and "ragged" not in message, message


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "is None"),
        ({"a": 1}, "is a dict"),
        ([1, None], "is a list holding None (at index 1)"),
        ([[1, 2], [3]], "is a ragged nested list"),
    ],
)
def test_a_field_that_is_no_array_is_named_without_a_map(tmp_path: Path, value: Any, shown: str) -> None:
    with pytest.raises(InputError) as info:
        shardload.write([{"tokens": value}], tmp_path / "s")
    message = str(info.value)
    # Invariant: what the value is, and what a field holds
    assert f"sample 0: field 'tokens' {shown}" in message and "a field holds" in message, message
    if "ragged" not in shown:
        assert "ragged" not in message
