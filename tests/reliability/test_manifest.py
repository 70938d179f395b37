"""Manifests that are missing, newer, inconsistent or hostile: a ManifestError on open, never a bad read."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardload
from shardload._base.checksum import file_checksum
from shardload.formats.arrow import ArrowShardReader
from shardload.formats.manifest import FORMAT_VERSION, Manifest
from shardload.sets.verify import verify

from .conftest import read_all, read_manifest, shard_file, write_manifest


def test_missing_manifest_is_not_a_shard_set(damaged: Path) -> None:
    (damaged / "manifest.json").unlink()
    with pytest.raises(shardload.ManifestError, match=r"is not a shard set: it has no manifest\.json"):
        shardload.open(damaged)
    with pytest.raises(shardload.ManifestError, match="not a shard set"):
        verify(damaged)


def test_manifest_of_a_newer_format_asks_for_an_upgrade(damaged: Path) -> None:
    m = read_manifest(damaged)
    m["format_version"] = FORMAT_VERSION + 1
    write_manifest(damaged, m)
    with pytest.raises(
        shardload.ManifestError, match=rf"newer shardload \(format version {FORMAT_VERSION + 1}.*Upgrade"
    ):
        shardload.open(damaged)


def test_unreadable_manifest(damaged: Path) -> None:
    (damaged / "manifest.json").write_bytes(b'{"format": "shardload", "format_ver')
    with pytest.raises(shardload.ManifestError, match="not valid JSON.*re-run prepare"):
        shardload.open(damaged)
    (damaged / "manifest.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(shardload.ManifestError, match="cannot be read"):
        shardload.open(damaged)
    (damaged / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(shardload.ManifestError, match="nested too deeply"):
        shardload.open(damaged)


def mutate(m: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """A copy of manifest ``m`` with the value at dotted ``key`` (``shards.0.file``) replaced."""
    m = copy.deepcopy(m)
    *parents, last = key.split(".")
    node: Any = m
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return m


# key, hostile value, what the error says
HOSTILE = [
    ("shards.0.file", "../../etc/passwd", "points outside the shard set"),
    ("shards.0.file", "/etc/passwd", "points outside the shard set"),
    ("shards.0.file", "shards/../../x.arrow", "points outside the shard set"),
    ("shards.0.file", "~/x.arrow", "points outside the shard set"),
    ("shards.0.file", "shards\\..\\..\\x", "points outside the shard set"),
    ("shards.0.file", "shards/x\0.arrow", "expected a file name"),
    ("shards.0.file", 7, "expected a file name"),
    ("lengths.file", "/etc/passwd", "points outside the shard set"),
    ("lengths.per_field.tokens", "../lengths.npy", "points outside the shard set"),
    ("shards.0.samples", -1, "shard 0 samples: expected an integer"),
    ("shards.0.samples", 2**60, "shard 0 samples: expected an integer"),
    ("shards.0.samples", 1.5, "shard 0 samples: expected an integer"),
    ("shards.0.samples", True, "shard 0 samples: expected an integer"),
    ("shards.0.bytes", -5, "shard 0 bytes"),
    ("shards.1.first_sample", -30, "shard 1 first_sample"),
    ("shards.1.first_sample", 29, "shard 1 .* starts at sample 29, expected 30"),
    ("total_samples", 121, "total_samples is 121 but the shards hold 120"),
    ("total_samples", "120", "total_samples: expected an integer"),
    ("shards", {"0": {}}, "'shards' must be a list"),
    ("shards.0", "shards/shard-000000.arrow", "shard 0 must be an object"),
    ("schema.fields", [], "the schema has no fields"),
    ("schema.fields", "tokens", "must be an object with a list of 'fields'"),
    ("schema.fields.0.dtype", "object", "dtype 'object'"),
    ("schema.fields.0.dtype", "<U8", "dtype '<U8'"),
    ("schema.fields.1.shape", [None, -4], "only the first axis may be null"),
    ("schema.fields.1.shape", [None, None], "only the first axis may be null"),
    ("schema.fields.1.shape", [None, 2**40, 2**40], "too large for one sample"),
    ("schema.fields.1.shape", [None, 1e400], "malformed manifest"),
    ("schema.fields.1.name", "tokens", "names a field twice"),
    ("schema.length_field", "nope", "malformed manifest"),
    ("lengths", [], "'lengths' must be an object"),
    ("lengths.per_field", "tokens", "'lengths' must be an object"),
    ("format_version", True, "invalid format_version"),
    ("format_version", 0, "invalid format_version"),
    ("format", "other", "not a shardload manifest"),
    ("shard_format", "tfrecord", "unknown shard format 'tfrecord'"),
]


@pytest.mark.parametrize(("key", "value", "error"), HOSTILE, ids=[f"{k}={v!r}"[:60] for k, v, _ in HOSTILE])
def test_hostile_manifest_values_are_refused_on_open(damaged: Path, key: str, value: Any, error: str) -> None:
    write_manifest(damaged, mutate(read_manifest(damaged), key, value))
    with pytest.raises(shardload.ManifestError, match=error):
        read_all(damaged)


def test_huge_counts_cause_no_giant_allocation(damaged: Path) -> None:
    # Within the bounds, self-consistent, and absurd: 2**39 samples in one shard. Opening
    # must fail on the lengths index (which holds 120), not try to allocate 2**39 of anything.
    m = read_manifest(damaged)
    m["shards"] = m["shards"][:1]
    m["shards"][0]["samples"] = 2**39
    m["total_samples"] = 2**39
    write_manifest(damaged, m)
    ds = shardload.open(damaged)
    assert len(ds) == 2**39
    with pytest.raises(shardload.ManifestError, match=r"lengths index holds \(120,\).*expected 549755813888"):
        _ = ds.lengths
    with pytest.raises(shardload.CorruptShardError, match="holds 30 samples, the manifest says 549755813888"):
        ds[2**39 - 1]


def test_offsets_beyond_the_values_are_refused_on_open(damaged: Path) -> None:
    # The last offset of a shard made to point past the end of its values buffer, with the
    # manifest entry fixed up to match (size, checksum): opening must not read out of bounds.
    path = shard_file(damaged, 0)
    schema = shardload.open(damaged).schema
    offsets = ArrowShardReader(path, schema).columns().fields["tokens"].offsets
    assert offsets is not None
    data = bytearray(path.read_bytes())
    pos = data.find(offsets.astype("<i8").tobytes())
    assert pos > 0
    end = pos + 8 * (len(offsets) - 1)
    data[end : end + 8] = int(offsets[-1] + 10**9).to_bytes(8, "little")
    path.write_bytes(bytes(data))
    m = read_manifest(damaged)
    m["shards"][0]["checksum"] = file_checksum(path)
    write_manifest(damaged, m)
    with pytest.raises(shardload.CorruptShardError, match=r"shard-000000\.arrow.*(offsets|cannot be read)"):
        shardload.open(damaged)[0]


# -- fuzz: whatever the manifest says, only shardload's own errors come out --------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def paths_of(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path (tuple of keys and indices) into a JSON tree, used to pick what to mutate."""
    out = []
    items = enumerate(node) if isinstance(node, list) else node.items() if isinstance(node, dict) else []
    for k, v in items:
        out.append((*prefix, k))
        out.extend(paths_of(v, (*prefix, k)))
    return out


@st.composite
def mutated_manifests(draw: st.DrawFn, base: dict[str, Any]) -> Any:
    m = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        keys = paths_of(m)
        if not keys:
            break
        *parents, slot = draw(st.sampled_from(keys))
        node: Any = m
        for p in parents:
            node = node[p]
        action = draw(st.sampled_from(["replace", "delete", "nudge"]))
        if action == "delete":
            del node[slot]
        elif action == "nudge" and isinstance(node[slot], int) and not isinstance(node[slot], bool):
            node[slot] += draw(st.sampled_from([-1, 1, -(2**40), 2**62]))
        else:
            node[slot] = draw(json_values)
    return m


@pytest.fixture(scope="module")
def fuzz_set(pristine: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(shutil.copytree(pristine, tmp_path_factory.mktemp("fuzz") / "set"))


def test_fuzzed_manifests_raise_only_shardload_errors(fuzz_set: Path) -> None:
    base = read_manifest(fuzz_set)
    original = (fuzz_set / "manifest.json").read_text()

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(mutated_manifests(base))
    def check(obj: Any) -> None:
        try:
            Manifest.from_json(obj)
        except shardload.ManifestError:
            pass
        (fuzz_set / "manifest.json").write_text(json.dumps(obj))
        try:
            # Invariant: a manifest that parses never leads to a read that is not a shardload error
            read_all(fuzz_set)
        except shardload.ShardloadError:
            pass
        finally:
            (fuzz_set / "manifest.json").write_text(original)

    check()


def one_variable_field_set(tmp_path: Path) -> Path:
    samples = [{"tokens": np.arange(1 + i % 7, dtype=np.int32), "label": np.int64(i)} for i in range(40)]
    shardload.write(samples, tmp_path / "one", num_shards=2, progress=False)
    return tmp_path / "one"


@pytest.mark.parametrize(
    ("variable_fields", "key", "value", "error"),
    [
        (2, "schema.length_field", "label", r"length_field 'label' is fixed-shape"),
        (1, "schema.length_field", "label", r"length_field 'label' is fixed-shape"),
        (2, "lengths.per_field", {}, r"fields \['tokens', 'features'\] vary in length but 'lengths.per_field'"),
        (2, "lengths.per_field.label", "lengths.tokens.npy", r"names \['label'\], which are not variable fields"),
        (1, "lengths.per_field.tokens2", "lengths.npy", r"names \['tokens2'\], which are not variable fields"),
    ],
    ids=[
        "length_field fixed, 2 variable",
        "length_field fixed, 1 variable",
        "per_field dropped",
        "per_field fixed",
        "per_field unknown",
    ],
)
def test_manifest_lengths_the_loader_cannot_use_are_refused_by_loader_and_verify(
    damaged: Path, tmp_path: Path, variable_fields: int, key: str, value: Any, error: str
) -> None:
    # The loader and verify read the same manifest: both refuse it on open, with the same message, instead of
    # a bare KeyError (or a silent plan from the wrong lengths), or verify passing a set the loader refuses.
    path = damaged if variable_fields == 2 else one_variable_field_set(tmp_path)
    write_manifest(path, mutate(read_manifest(path), key, value))
    with pytest.raises(shardload.ManifestError, match=error):
        list(shardload.make_loader(path, rank=0, world_size=1, max_tokens=64))
    with pytest.raises(shardload.ManifestError, match=error):
        verify(path)
