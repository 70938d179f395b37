"""The format registry: a format is its registration, and prepare, its command line and the readers need nothing else."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import pytest

import shardload
from shardload.cli import main
from shardload.formats import FORMATS, OptionFlag, ShardFormat
from shardload.formats.arrow import ArrowShardReader, ArrowShardWriter
from shardload.formats.base import FormatOptions
from shardload.prepare.options import PrepareOptions


@dataclass(frozen=True)
class NotedOptions(FormatOptions):
    """A third format's options: one text field, checked when made."""

    note: str = "plain"

    def __post_init__(self) -> None:
        if not self.note:
            raise shardload.InputError("note must not be empty")


NOTED = ShardFormat(
    name="noted",
    writer=ArrowShardWriter,
    reader=ArrowShardReader,
    options=NotedOptions,
    summary="arrow, with a note",
    flags=(OptionFlag("note", "a note recorded in the manifest", metavar="TEXT"),),
)


def test_the_flags_of_each_format_set_fields_of_its_own_options() -> None:
    own = {f.name for f in fields(PrepareOptions)}
    for fmt in FORMATS.values():
        # Invariant: a format's options land in the manifest's options beside prepare's own: no name is shared
        assert not own & set(fmt.option_names()), fmt.name
        assert {flag.field for flag in fmt.flags} <= set(fmt.option_names()), fmt.name


def test_a_registered_format_is_prepared_read_and_given_flags_without_other_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(FORMATS, "noted", NOTED)
    src = tmp_path / "t.npy"
    np.save(src, np.arange(6, dtype=np.int32))
    assert main(["prepare", str(src), "-o", str(tmp_path / "a"), "--format", "noted", "--note", "hi"]) == 0
    m = shardload.open(tmp_path / "a").manifest
    assert (m.shard_format, m.options["note"]) == ("noted", "hi")
    assert list(shardload.open(tmp_path / "a")[0]["data"]) == list(range(6))
    # The name alone takes the defaults; the options object gives them; the old spelling says the new one.
    shardload.prepare(src, tmp_path / "b", shard_format="noted")
    assert shardload.open(tmp_path / "b").manifest.options["note"] == "plain"
    with pytest.raises(shardload.InputError, match=r"shard_format=shardload\.NotedOptions\(note='x'\)"):
        shardload.prepare(src, tmp_path / "c", note="x")
    assert main(["prepare", str(src), "-o", str(tmp_path / "d"), "--format", "noted", "--note", ""]) == 3
    with pytest.raises(shardload.InputError, match="shard_format must name a format or give its options"):
        PrepareOptions(shard_format=NotedOptions)  # type: ignore[arg-type]  # the class, not options
