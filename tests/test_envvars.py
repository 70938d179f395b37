"""Limits read from environment variables: one rule for every variable (shardload/_base/envvars.py)."""

from __future__ import annotations

import pytest

from shardload._base.envvars import env_int, parse_size_text
from shardload.errors import InputError, ShardSetError


@pytest.mark.parametrize(
    ("text", "size", "expected"),
    [("12", False, 12), ("1GiB", True, 1 << 30), ("500MB", True, 500_000_000), ("4k", True, 4096), ("0", True, 0)],
)
def test_good_values_are_read(monkeypatch: pytest.MonkeyPatch, text: str, size: bool, expected: int) -> None:
    monkeypatch.setenv("SHARDLOAD_TEST_LIMIT", text)
    assert env_int("SHARDLOAD_TEST_LIMIT", 7, minimum=0, size=size, error=InputError) == expected


def test_unset_or_empty_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHARDLOAD_TEST_LIMIT", raising=False)
    assert env_int("SHARDLOAD_TEST_LIMIT", 7, error=InputError) == 7
    monkeypatch.setenv("SHARDLOAD_TEST_LIMIT", "  ")
    assert env_int("SHARDLOAD_TEST_LIMIT", 7, error=InputError) == 7


@pytest.mark.parametrize(
    ("text", "size", "minimum", "phrase"),
    [
        ("lots", False, 1, "is not a positive integer"),
        ("0", False, 1, "is not a positive integer"),
        ("1GiB", False, 1, "is not a positive integer"),  # units only where sizes are meant
        ("-1", True, 0, "is not a non-negative size"),
        ("1.5.2", True, 0, "is not a non-negative size"),
    ],
)
def test_bad_values_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, text: str, size: bool, minimum: int, phrase: str
) -> None:
    monkeypatch.setenv("SHARDLOAD_TEST_LIMIT", text)
    # Invariant: a bad limit is refused in the caller's branch of the error tree, never used or ignored
    with pytest.raises(ShardSetError, match=rf"SHARDLOAD_TEST_LIMIT='{text}' {phrase}.*SHARDLOAD_TEST_LIMIT=7"):
        env_int("SHARDLOAD_TEST_LIMIT", 7, minimum=minimum, size=size, error=ShardSetError)


def test_size_text() -> None:
    assert parse_size_text("256MB") == 256_000_000 and parse_size_text("x") is None and parse_size_text("1i") is None


def test_the_zarr_cache_limit_uses_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    from shardload.formats.zarr import cache

    monkeypatch.setenv(cache.CACHE_ENV, "-5")
    with pytest.raises(InputError, match=cache.CACHE_ENV):
        cache._bytes_from_env()
    monkeypatch.setenv(cache.CACHE_ENV, "2MiB")
    assert cache._bytes_from_env() == 2 << 20


@pytest.mark.parametrize("text", ["9223372036854775807", "99999999999999999999999999", "1.5"])
def test_sizes_beyond_any_buffer_or_of_part_of_a_byte_are_refused(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    from shardload.prepare.sources import SourceOptions

    monkeypatch.setenv("SHARDLOAD_MAX_RECORD_BYTES", text)
    # Invariant: a bound that would overflow a reader's C size (exit 70 before) is refused by name
    with pytest.raises(InputError, match="SHARDLOAD_MAX_RECORD_BYTES"):
        SourceOptions()
    monkeypatch.delenv("SHARDLOAD_MAX_RECORD_BYTES")
    with pytest.raises(InputError, match="max_record_bytes"):
        SourceOptions(max_record_bytes=1 << 63)


def test_every_variable_name_is_written_in_one_place() -> None:
    import ast
    import re
    from pathlib import Path

    import shardload._base.envvars as envvars

    package = Path(envvars.__file__).parents[1]
    found = []
    for path in sorted(package.rglob("*.py")):
        if path == Path(envvars.__file__):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            # a variable's name as a whole string literal (docstrings are longer than a name)
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and re.fullmatch(r"SHARDLOAD_[A-Z_]+", node.value)
            ):
                found.append(f"{path.relative_to(package)}:{node.lineno} {node.value}")
            # os.environ.get("NAME") / os.getenv("NAME") / os.environ["NAME"] with the name spelled in place
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                func = ast.unparse(node.func)
                if func in ("os.environ.get", "os.getenv", "environ.get"):
                    found.append(f"{path.relative_to(package)}:{node.lineno} {func}({node.args[0].value!r})")
            if (
                isinstance(node, ast.Subscript)
                and ast.unparse(node.value) == "os.environ"
                and isinstance(node.slice, ast.Constant)
            ):
                found.append(f"{path.relative_to(package)}:{node.lineno} os.environ[{node.slice.value!r}]")
    # Invariant: every environment variable's name is written in _base/envvars.py only
    assert found == []
    assert envvars.CACHE_DIR == "SHARDLOAD_CACHE_DIR"  # the names themselves are part of the interface
