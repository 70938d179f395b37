"""Batching options: validation messages and the padded-length helper."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from shardload.errors import PlanError
from shardload.plan import Batching, padded_length


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of batch_size or max_tokens, got neither"),
        ({"batch_size": 4, "max_tokens": 100}, "exactly one of batch_size or max_tokens, got both"),
        ({"batch_size": 0}, r"batch_size=0\): must be >= 1"),
        ({"batch_size": 2.5}, "must be an integer"),
        ({"batch_size": True}, "must be an integer"),
        ({"max_tokens": -5}, r"max_tokens=-5\): must be >= 1"),
        ({"max_tokens": 100, "max_rows": 0}, r"max_rows=0\)"),
        ({"batch_size": 4, "max_rows": 3}, "remove max_rows"),
        ({"batch_size": 4, "pad_to_multiple_of": 0}, "pad_to_multiple_of=0"),
        ({"batch_size": 4, "uneven": "repeat"}, "uneven='repeat'"),
        (
            {"batch_size": 4, "bucket_ratio": 1.0},
            r"bucket_ratio=1.0\): must be a number in \[1.01, 4\]",
        ),
        ({"batch_size": 4, "bucket_ratio": float("nan")}, "bucket_ratio=nan"),
        ({"batch_size": 4, "bucketing": "yes"}, "bucketing='yes'"),
    ],
)
def test_bad_options_say_what_to_do(kwargs: dict, message: str) -> None:
    # Invariant: a bad option fails when the Batching is built, naming the option
    with pytest.raises(PlanError, match=message):
        Batching(**kwargs)


def test_plan_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        Batching()


def test_options_are_frozen_plain_values() -> None:
    batching = Batching(max_tokens=np.int64(100), max_rows=np.int32(4))
    # Invariant: numpy integers are stored as plain ints (hashable, JSON-able)
    assert type(batching.max_tokens) is int and type(batching.max_rows) is int
    assert hash(batching) == hash(Batching(max_tokens=100, max_rows=4))
    with pytest.raises(dataclasses.FrozenInstanceError):
        batching.max_tokens = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("length", "multiple", "expected"),
    [(0, 1, 0), (0, 8, 0), (1, 8, 8), (8, 8, 8), (9, 8, 16), (13, 1, 13), (np.int32(5), 4, 8)],
)
def test_padded_length_rounds_up(length: int, multiple: int, expected: int) -> None:
    # Invariant: the padded length is the smallest multiple >= the length
    assert padded_length(length, multiple) == expected


def test_padded_length_rejects_bad_input() -> None:
    with pytest.raises(PlanError, match="max_len must be >= 0"):
        padded_length(-1, 1)
    with pytest.raises(PlanError, match="pad_to_multiple_of must be >= 1"):
        padded_length(3, 0)
