"""The command line as a whole: registry, --version, --help, errors and exit codes."""

from __future__ import annotations

import logging

import pytest

import shardload
from shardload.cli import COMMANDS, Exit, _command, main
from shardload.cli._common import parse_size


def test_version(cli) -> None:
    r = cli("--version")
    assert r.code == 0 and r.out.strip() == f"shardload {shardload.__version__}"


def test_help_lists_commands_and_exit_codes(cli) -> None:
    r = cli("--help")
    assert r.code == 0
    for name in COMMANDS:
        assert name in r.out
    assert "exit status" in r.out and "verify found problems" in r.out


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_help_has_an_example_and_python(cli, name: str) -> None:
    r = cli(name, "--help")
    assert r.code == 0
    assert "examples:" in r.out and f"shardload {name} " in r.out
    # the help ends with how to load the result in Python
    tail = r.out.rstrip().split("in Python:")[-1]
    assert "in Python:" in r.out and "shardload" in tail


@pytest.mark.parametrize("name", COMMANDS)
def test_registry_contract(name: str) -> None:
    module = _command(name)
    assert module.__name__.startswith("shardload.cli.")
    assert module.__doc__ and module.SUMMARY and module.EPILOG
    assert callable(module.add_arguments) and callable(module.run)


def test_only_the_chosen_command_sets_up_its_options(cli, shard_set, monkeypatch) -> None:
    import shardload.cli.prepare

    def broken(parser):
        raise RuntimeError("prepare's options are broken")

    monkeypatch.setattr(shardload.cli.prepare, "add_arguments", broken)
    # another command, --help and --version do not depend on prepare's option setup
    assert cli("verify", shard_set).code == 0
    assert cli("--help").code == 0 and "prepare" in cli("--help").out
    assert cli("--debug", "verify", shard_set).code == 0


def test_no_command_is_a_usage_error(cli) -> None:
    r = cli()
    assert r.code == Exit.USAGE and "usage:" in r.err


def test_unknown_option_is_a_usage_error(cli, shard_set) -> None:
    r = cli("verify", shard_set, "--frobnicate")
    assert r.code == 2 and "unrecognized arguments" in r.err


def test_missing_directory_is_exit_5_with_one_line(cli, tmp_path) -> None:
    r = cli("inspect", tmp_path / "nowhere")
    assert r.code == Exit.SHARD_SET == 5
    assert r.err.startswith("shardload: error: ") and r.err.count("\n") == 1
    assert "Traceback" not in r.err


def test_debug_shows_the_traceback(cli, tmp_path) -> None:
    r = cli("--debug", "inspect", tmp_path / "nowhere")
    assert r.code == 5 and "Traceback" in r.err and "shardload: error:" in r.err
    r = cli("inspect", "--debug", tmp_path / "nowhere")
    assert r.code == 5 and "Traceback" in r.err


def test_unexpected_exception_is_an_internal_error(cli, shard_set, monkeypatch) -> None:
    import shardload.sets.describe

    def boom(*a, **k):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(shardload.sets.describe, "describe", boom)
    r = cli("inspect", shard_set)
    assert r.code == Exit.INTERNAL and "internal error: RuntimeError: kaboom" in r.err


def test_os_error_is_exit_4_without_traceback(cli, shard_set, monkeypatch) -> None:
    import shardload.sets.describe

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied", "/somewhere/lengths.png")

    monkeypatch.setattr(shardload.sets.describe, "describe", denied)
    r = cli("inspect", shard_set)
    assert r.code == Exit.OUTPUT
    assert r.err == "shardload: error: /somewhere/lengths.png: Permission denied\n"


def test_running_out_of_memory_is_named_not_an_internal_error(cli, shard_set, monkeypatch) -> None:
    import shardload.sets.describe

    def hungry(*a, **k):
        raise MemoryError

    monkeypatch.setattr(shardload.sets.describe, "describe", hungry)
    r = cli("inspect", shard_set)
    # Invariant: memory running short is the machine's or the limit's, exit 4 with what to change, never exit 70
    assert r.code == Exit.OUTPUT, r.err
    assert "shardload inspect ran out of memory" in r.err and "give the process more memory" in r.err
    assert "internal error" not in r.err and "Traceback" not in r.err


def test_logging_is_restored_after_a_command(cli, shard_set) -> None:
    logger = logging.getLogger("shardload")
    handlers, level = list(logger.handlers), logger.level
    cli("verify", shard_set)
    assert logger.handlers == handlers and logger.level == level


def test_main_defaults_to_sys_argv(monkeypatch, capsys) -> None:
    monkeypatch.setattr("sys.argv", ["shardload", "--version"])
    assert main() == 0
    assert "shardload" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1000", 1000),
        ("256MB", 256_000_000),
        ("256mb", 256_000_000),
        ("1GiB", 1 << 30),
        ("512M", 512 << 20),
        ("4k", 4096),
        ("1.5GB", 1_500_000_000),
        ("64 KiB", 65536),
        ("10B", 10),
    ],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "MB", "12XB", "-5MB", "0", "1iB", "1.2.3"])
def test_parse_size_rejects(text: str) -> None:
    import argparse

    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


def test_every_error_class_has_its_own_exit_status() -> None:
    import shardload.errors as errors
    from shardload.cli import ERROR_CODES

    # Invariant: no error raised on purpose falls through to exit 1 ("verify found problems")
    direct = [cls for name in errors.__all__ if (cls := getattr(errors, name)).__base__ is errors.ShardloadError]
    for cls in direct:
        assert any(issubclass(cls, mapped) for mapped, _ in ERROR_CODES), cls.__name__
    codes = [int(code) for _, code in ERROR_CODES]
    assert len(set(codes)) == len(codes) and 1 not in codes


def test_an_interrupted_command_ends_with_one_line(tmp_path) -> None:
    import subprocess
    import sys

    job = tmp_path / "job.py"
    job.write_text(
        "import argparse, asyncio, atexit, gc, sys, threading\n"
        "import shardload.cli as cli\n"
        "loop = asyncio.new_event_loop()\n"
        "thread = threading.Thread(target=loop.run_forever, daemon=True)\n"
        "thread.start()\n"
        "def close():  # as zarr does at exit: stop and close its loop, dropping the tasks still pending\n"
        "    loop.call_soon_threadsafe(loop.stop)\n    thread.join()\n    loop.close()\n"
        "    for t in asyncio.all_tasks(loop):\n        t._log_destroy_pending = True\n    gc.collect()\n"
        "atexit.register(close)\n"
        "async def forever():\n    await asyncio.sleep(3600)\n"
        "for _ in range(200):\n    asyncio.run_coroutine_threadsafe(forever(), loop)\n"
        "def run(args):\n    raise cli.Terminated()\n"
        "class Parser(argparse.ArgumentParser):\n"
        "    def parse_args(self, argv=None, namespace=None):\n"
        "        return argparse.Namespace(command='verify', debug=False)\n"
        "cli.build_parser = lambda argv: Parser()\n"
        "cli._command = lambda name: argparse.Namespace(run=run)\n"
        "sys.exit(cli.main(['verify']))\n"
    )
    r = subprocess.run([sys.executable, str(job)], capture_output=True, text=True, timeout=60)
    # Invariant: after SIGTERM the user reads one line, not the teardown of work cut short in other threads
    assert r.returncode == 143, r.stderr
    assert r.stderr.strip().splitlines() == ["shardload: error: stopped by SIGTERM"], r.stderr[:2000]
