"""The option objects reach every entry point: make_loader, ShardDataModule and `shardload plan`.

Each field of ``Batching`` (and of ``LoaderOptions``, ``EpochSpec``) gets a
non-default value; the test checks that each entry point plans with exactly
that object. A field added to a class without a case here fails the first
test, so a new option cannot be left unreachable from one of them.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

import shardload
from shardload.cli import main
from shardload.plan import Batching, EpochSpec, summarize_plan
from shardload.testing import synthetic_samples

#: field -> a valid Batching whose value of that field is not the default
BATCHING_CASES: dict[str, Batching] = {
    "batch_size": Batching(batch_size=3),
    "max_tokens": Batching(max_tokens=77),
    "bucketing": Batching(batch_size=4, bucketing=False),
    "pad_to_multiple_of": Batching(batch_size=4, pad_to_multiple_of=8),
    "uneven": Batching(batch_size=4, uneven="pad"),
    "bucket_ratio": Batching(batch_size=4, bucket_ratio=1.5),
    "max_rows": Batching(max_tokens=77, max_rows=2),
    "packing": Batching(packing=True, pack_length=4096, rows_per_batch=2),
    "pack_length": Batching(packing=True, pack_length=2048, rows_per_batch=2),
    "rows_per_batch": Batching(packing=True, pack_length=4096, rows_per_batch=3),
    "pack_split": Batching(packing=True, pack_length=16, rows_per_batch=2, pack_split=True),
    "chunk_window": Batching(batch_size=4, chunk_window=2, chunk_rows=100),  # an Arrow set: rows given
    "chunk_rows": Batching(batch_size=4, chunk_rows=50),
}

#: field -> a valid LoaderOptions whose value of that field is not the default
LOADER_CASES: dict[str, shardload.LoaderOptions] = {
    "num_workers": shardload.LoaderOptions(num_workers=1),
    "pin_memory": shardload.LoaderOptions(pin_memory=True),
    "prefetch_factor": shardload.LoaderOptions(prefetch_factor=3),
    "persistent_workers": shardload.LoaderOptions(num_workers=1, persistent_workers=False),
    "timeout": shardload.LoaderOptions(timeout=30),
    "debug": shardload.LoaderOptions(debug=True),
    "stats": shardload.LoaderOptions(stats=False),
}


@pytest.fixture(scope="module")
def small_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("options") / "set"
    # tokens and label only: packed cases need every loaded variable field at the batching length
    samples = [{k: v for k, v in s.items() if k != "features"} for s in synthetic_samples(60, seed=3)]
    shardload.write(samples, path, num_shards=3, progress=False)
    return path


def test_every_field_has_a_case() -> None:
    # Invariant: a new option field must be added here, and so be checked at every entry point
    assert set(BATCHING_CASES) == {f.name for f in dataclasses.fields(Batching)}
    assert set(LOADER_CASES) == {f.name for f in dataclasses.fields(shardload.LoaderOptions)}
    for name, batching in BATCHING_CASES.items():
        assert getattr(batching, name) != getattr(Batching(batch_size=1), name) or name == "max_tokens"
        assert getattr(batching, name) not in (None, False) or name in ("bucketing", "uneven")


def _flags(batching: Batching) -> list[str]:
    """The `shardload plan` flags that stand for ``batching`` (the fields that are not at their default)."""
    out: list[str] = []
    for f in dataclasses.fields(Batching):
        value = getattr(batching, f.name)
        flag = "--" + f.name.replace("_", "-")
        if value == f.default:
            continue
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        else:
            out += [flag, str(value)]
    return out


@pytest.mark.parametrize("field", list(BATCHING_CASES))
def test_every_batching_field_reaches_every_entry_point(
    small_set: Path, field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    batching = BATCHING_CASES[field]
    loader = shardload.make_loader(small_set, batching=batching, rank=0, world_size=2)
    # Invariant: make_loader plans with the very object given
    assert loader.plan_sampler.batching == batching
    dm = shardload.ShardDataModule(train=small_set, val=small_set, batching=batching, num_workers=0)
    dm.setup("fit")
    train = dm.train_dataloader()
    # Invariant: so does the DataModule (evaluation replaces only uneven="drop", which training keeps)
    assert isinstance(train, shardload.ShardLoader) and train.plan_sampler.batching == batching
    # Invariant: `shardload plan` has a flag for the field, and plans with the same Batching
    assert main(["plan", str(small_set), "--world-size", "2", *_flags(batching), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    ss = shardload.open(small_set)
    # the command sizes a remote cache too: the same figures from the same shard sizes
    expected = summarize_plan(
        ss.plan_inputs(), EpochSpec(world_size=2), batching, shard_bytes=[s.bytes for s in ss.shards]
    )
    assert printed == json.loads(json.dumps(expected.to_dict()))


@pytest.mark.parametrize("field", list(LOADER_CASES))
def test_every_loader_option_reaches_both_loaders(small_set: Path, field: str) -> None:
    options = LOADER_CASES[field]
    loader = shardload.make_loader(small_set, batch_size=4, loader_options=options, rank=0, world_size=1)
    dm = shardload.ShardDataModule(train=small_set, batch_size=4, loader_options=options)
    dm.setup("fit")
    from_dm = dm.train_dataloader()
    assert isinstance(from_dm, shardload.ShardLoader)
    # Invariant: options that leave num_workers unset take each loader's default (make_loader 0, the DataModule 2)
    # and change nothing else
    workers = {None: (0, 2)}.get(options.num_workers, (options.num_workers, options.num_workers))
    for made, default in ((loader, workers[0]), (from_dm, workers[1])):
        expected: dict[str, Any] = dataclasses.replace(options, num_workers=default).dataloader_kwargs()
        # Invariant: what the DataLoader runs with is what the options say (workers off in debug mode)
        got = {name: getattr(made, name) for name in ("num_workers", "pin_memory", "timeout")}
        assert got == {name: expected[name] for name in got}
        assert made.plan_sampler.debug == options.debug
        assert (made.stats is not None) == options.stats
        if expected["num_workers"]:
            assert made.prefetch_factor == (options.prefetch_factor or 2)
            assert made.persistent_workers == options.persistent_workers


@pytest.mark.parametrize("keyword", [None, 0, 3])
def test_options_that_leave_num_workers_unset_agree_with_the_keyword_and_the_default(
    small_set: Path, keyword: int | None
) -> None:
    options = shardload.LoaderOptions(stats=False)
    dm = shardload.ShardDataModule(train=small_set, batch_size=4, loader_options=options, num_workers=keyword)
    loader = shardload.make_loader(
        small_set, batch_size=4, loader_options=options, num_workers=keyword, rank=0, world_size=1
    )
    # Invariant: stats=False turns the stats off and nothing else; a num_workers keyword beside it is no clash
    assert dm.loader_options == dataclasses.replace(options, num_workers=2 if keyword is None else keyword)
    assert loader.num_workers == (0 if keyword is None else keyword) and loader.stats is None
    # ...while a num_workers given in both places must still agree
    with pytest.raises(shardload.PlanError, match="num_workers=3 disagrees with loader_options"):
        shardload.ShardDataModule(
            train=small_set, batch_size=4, loader_options=shardload.LoaderOptions(num_workers=1), num_workers=3
        )


@pytest.mark.parametrize(
    "options", [shardload.LoaderOptions(timeout=30), shardload.LoaderOptions(num_workers=2, timeout=30, debug=True)]
)
def test_a_timeout_without_worker_processes_has_no_effect(small_set: Path, options: shardload.LoaderOptions) -> None:
    # torch refuses a timeout without workers: iterating used to raise an AssertionError
    loader = shardload.make_loader(small_set, batch_size=4, loader_options=options, rank=0, world_size=1)
    assert sum(len(b["sample_id"]) for b in loader) == 60


def test_every_epoch_field_reaches_shardload_plan(small_set: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = EpochSpec(world_size=3, stage="train", seed=9, epoch=2, shard_assignment="fixed")
    flags = [f"--{f.name.replace('_', '-')}={getattr(spec, f.name)}" for f in dataclasses.fields(EpochSpec)]
    assert main(["plan", str(small_set), *flags, "--batch-size", "4", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    ss = shardload.open(small_set)
    expected = summarize_plan(ss.plan_inputs(), spec, Batching(batch_size=4), shard_bytes=[s.bytes for s in ss.shards])
    # Invariant: the flags are the fields of EpochSpec; the fingerprint covers all of them
    assert printed["fingerprint"] == expected.fingerprint
    assert printed == json.loads(json.dumps(expected.to_dict()))


@pytest.mark.parametrize(
    ("keywords", "accepted"),
    [
        ({"batching": Batching(batch_size=4), "batch_size": 4}, True),  # the same value twice: no conflict
        ({"batching": Batching(batch_size=4), "batch_size": 5}, False),
        ({"batching": Batching(batch_size=4), "max_tokens": 64}, False),
        ({"batch_size": 4, "loader_options": shardload.LoaderOptions(num_workers=1), "num_workers": 1}, True),
        ({"batch_size": 4, "loader_options": shardload.LoaderOptions(num_workers=1), "num_workers": 0}, False),
    ],
)
def test_a_shortcut_beside_its_object_must_agree(small_set: Path, keywords: dict[str, Any], accepted: bool) -> None:
    for build in (
        lambda: shardload.make_loader(small_set, rank=0, world_size=1, **keywords),
        lambda: shardload.ShardDataModule(train=small_set, **keywords),
    ):
        if accepted:
            build()
        else:
            # Invariant: a shortcut that disagrees with its object raises instead of being ignored
            with pytest.raises(shardload.PlanError, match="disagrees with"):
                build()


MOVED_KEYWORDS = [
    ("bucketing", True, "batching=Batching(bucketing=...)"),
    ("packing", True, "batching=Batching(packing=...)"),
    ("uneven", "pad", "batching=Batching(uneven=...)"),
    ("prefetch_factor", 4, "loader_options=LoaderOptions(prefetch_factor=...)"),
    ("timeout", 30, "loader_options=LoaderOptions(timeout=...)"),
    ("cache_dir", "/tmp/cache", "remote=RemoteOptions(cache_dir=...)"),
    ("storage_options", {"key": "s3cr3t"}, "remote=RemoteOptions(storage_options=...)"),
]


@pytest.mark.parametrize(("name", "value", "spelling"), MOVED_KEYWORDS)
def test_a_keyword_that_moved_into_an_option_object_is_refused_with_its_new_spelling(
    small_set: Path, name: str, value: Any, spelling: str
) -> None:
    for entry in (
        lambda: shardload.make_loader(small_set, rank=0, world_size=1, **{name: value}),
        lambda: shardload.ShardDataModule(train=small_set, **{name: value}),
    ):
        # Invariant: a ShardloadError that shows the new spelling, never Python's bare TypeError
        with pytest.raises(shardload.PlanError, match=re.escape(spelling)) as info:
            entry()
        assert "s3cr3t" not in str(info.value)  # a value is never printed: it may be a credential


@pytest.mark.parametrize(
    ("entry", "keyword", "suggested"),
    [
        ("make_loader", "batchsize", "batch_size"),
        ("write", "num_shard", "num_shards"),
        ("prepare", "shardsize", "shard_size"),
    ],
)
def test_an_unknown_keyword_names_the_closest_ones(
    tmp_path: Path, small_set: Path, entry: str, keyword: str, suggested: str
) -> None:
    calls = {
        "make_loader": lambda: shardload.make_loader(small_set, rank=0, world_size=1, **{keyword: 1}),
        "write": lambda: shardload.write(synthetic_samples(3), tmp_path / "out", **{keyword: 1}),
        "prepare": lambda: shardload.prepare([str(small_set)], tmp_path / "out", **{keyword: 1}),
    }
    with pytest.raises(
        shardload.ShardloadError, match=rf"{entry}\(\) takes no keyword {keyword}= \(did you mean .*{suggested}"
    ):
        calls[entry]()
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_the_signatures_stay_visible_to_tools() -> None:
    import inspect

    # Invariant: the check wraps the entry points without hiding their parameters (help, IDEs, Lightning)
    assert {"batching", "loader_options", "remote"} <= set(inspect.signature(shardload.make_loader).parameters)
    assert {"batching", "train", "val"} <= set(inspect.signature(shardload.ShardDataModule.__init__).parameters)
