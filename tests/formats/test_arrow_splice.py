"""A staged chunk written piece by piece is the file the concatenated pieces would give."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from shardload.formats.arrow import ArrowOptions, ArrowShardWriter
from shardload.formats.arrow import writer as writer_module
from shardload.formats.arrow.splice import SplicingFile
from shardload.formats.base import Columns, FieldData, concat_columns
from shardload.schema.fields import Schema


def pieces_of(samples: list[dict[str, Any]], cuts: list[int]) -> tuple[Schema, list[Columns]]:
    schema = Schema.infer(samples[0])
    bounds = [0, *cuts, len(samples)]
    return schema, [
        Columns.from_samples(schema, [schema.check(s, where="test") for s in samples[a:b]])
        for a, b in itertools.pairwise(bounds)
    ]


def numeric_samples(n: int, most: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    return [
        {
            "tokens": rng.integers(0, 50_000, size=int(k)).astype(np.int32),
            "xyz": rng.random((int(k), 3)).astype(np.float32),
            "mask": rng.integers(0, 2, size=int(k)).astype(bool),
            "label": np.int64(k),
        }
        for k in rng.integers(0, most + 1, n)
    ]


@pytest.mark.parametrize(
    ("n", "most", "cuts"),
    [
        (300, 50, [100, 101]),  # a piece of one sample
        (300, 50, [1, 2, 3, 299]),
        (40, 0, [10, 20]),  # every list empty: no values to write
        (500, 2000, [250]),  # values of several MiB per piece
    ],
)
def test_written_piece_by_piece_is_the_concatenation_byte_for_byte(
    tmp_path: Path, n: int, most: int, cuts: list[int]
) -> None:
    schema, pieces = pieces_of(numeric_samples(n, most, seed=n + most), cuts)
    writer = ArrowShardWriter(schema, ArrowOptions())
    writer.write(tmp_path / "plain.arrow", concat_columns(schema, pieces))
    writer.write_concatenated(tmp_path / "pieces.arrow", pieces)
    assert (tmp_path / "pieces.arrow").read_bytes() == (tmp_path / "plain.arrow").read_bytes()


def test_every_placeholder_is_replaced_when_pyarrow_hands_it_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[SplicingFile] = []
    real_init = SplicingFile.__init__

    def spy(self: SplicingFile, *args: Any) -> None:
        real_init(self, *args)
        made.append(self)

    monkeypatch.setattr(SplicingFile, "__init__", spy)
    schema, pieces = pieces_of(numeric_samples(200, 30, seed=1), [50, 120])
    ArrowShardWriter(schema, ArrowOptions()).write_concatenated(tmp_path / "c.arrow", pieces)
    assert len(made) == 1 and made[0].complete  # the fast path ran: no second, plain write


def test_a_placeholder_pyarrow_did_not_hand_over_whole_falls_back_to_the_plain_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema, pieces = pieces_of(numeric_samples(200, 30, seed=2), [70])
    writer = ArrowShardWriter(schema, ArrowOptions())
    writer.write(tmp_path / "plain.arrow", concat_columns(schema, pieces))
    real = writer_module.to_arrow
    # a copy of the values: the sink sees other buffers, and the placeholders' zeros reach the file
    monkeypatch.setattr(writer_module, "to_arrow", lambda f, values, offsets: real(f, values.copy(), offsets))
    writer.write_concatenated(tmp_path / "pieces.arrow", pieces)
    assert (tmp_path / "pieces.arrow").read_bytes() == (tmp_path / "plain.arrow").read_bytes()


def test_text_fields_are_written_from_the_concatenation(tmp_path: Path) -> None:
    samples = [{"text": "é" * k, "tokens": np.arange(k, dtype=np.int64)} for k in range(30)]
    schema, pieces = pieces_of(samples, [7, 8, 20])
    writer = ArrowShardWriter(schema, ArrowOptions())
    writer.write(tmp_path / "plain.arrow", concat_columns(schema, pieces))
    writer.write_concatenated(tmp_path / "pieces.arrow", pieces)
    assert (tmp_path / "pieces.arrow").read_bytes() == (tmp_path / "plain.arrow").read_bytes()


def test_a_piece_in_another_byte_order_is_converted_not_spliced(tmp_path: Path) -> None:
    schema, pieces = pieces_of(numeric_samples(100, 20, seed=3), [40])
    data = pieces[1].fields["tokens"]
    swapped = FieldData(data.values.astype(">i4"), data.offsets)  # the same numbers, big-endian bytes
    pieces[1] = Columns(pieces[1].num_samples, {**pieces[1].fields, "tokens": swapped})
    writer = ArrowShardWriter(schema, ArrowOptions())
    writer.write(tmp_path / "plain.arrow", concat_columns(schema, pieces))
    writer.write_concatenated(tmp_path / "pieces.arrow", pieces)
    assert (tmp_path / "pieces.arrow").read_bytes() == (tmp_path / "plain.arrow").read_bytes()
    back = pa.ipc.open_file(pa.memory_map(str(tmp_path / "pieces.arrow"))).get_batch(0).column("tokens")
    assert back.values.to_numpy()[-len(data.values) :].tolist() == data.values.tolist()
