"""Misused options of the loader and the planner: a clear error where they are given, never silence.

Every public keyword of ``make_loader``, ``ShardDataModule`` and ``Batching``
with a wrong type or value raises a ``PlanError`` naming it when the object is
built, not at the first batch, in a worker, or never; pad values must name a
padded field and fit its dtype; a saved loader state is checked before it
changes anything; ``shardload plan`` maps all of this to exit status 6.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardload
from shardload.cli import main
from shardload.errors import PlanError, PlanMismatchError
from shardload.load.collate import PadSpec, fit_pad_value
from shardload.plan import Batching, EpochSpec, PlanInputs, plan_rank

BAD_LOADER_OPTIONS: dict[str, tuple[dict[str, Any], str]] = {
    # option -> (keyword arguments, what the message must name)
    "batch_size 2**70": ({"batch_size": 2**70}, "batch_size"),
    "max_tokens huge": ({"batch_size": None, "max_tokens": 10**20}, "max_tokens"),
    "pad_to_multiple_of huge": ({"pad_to_multiple_of": 10**12}, "pad_to_multiple_of"),
    "stage unknown": ({"stage": "training"}, "stage"),
    "stage drop in eval": ({"stage": "val", "uneven": "drop"}, "uneven='drop'"),
    "seed negative": ({"seed": -1}, "seed"),
    "seed float": ({"seed": 1.5}, "seed"),
    "seed 2**64": ({"seed": 2**64}, "seed"),
    "epoch negative": ({"epoch": -1}, "epoch"),
    "epoch NaN": ({"epoch": math.nan}, "epoch"),
    "shard_assignment unknown": ({"shard_assignment": "random"}, "shard_assignment"),
    "num_workers negative": ({"num_workers": -1}, "num_workers"),
    "num_workers bool": ({"num_workers": True}, "num_workers"),
    "num_workers float": ({"num_workers": 1.5}, "num_workers"),
    "num_workers huge": ({"num_workers": 10**6}, "num_workers"),
    "prefetch_factor 0": ({"num_workers": 1, "prefetch_factor": 0}, "prefetch_factor"),
    "prefetch_factor float": ({"prefetch_factor": 2.5}, "prefetch_factor"),
    "pin_memory str": ({"pin_memory": "no"}, "pin_memory"),
    "persistent_workers str": ({"persistent_workers": "yes"}, "persistent_workers"),
    "debug str": ({"debug": "false"}, "debug"),
    "timeout negative": ({"timeout": -1}, "timeout"),
    "timeout NaN": ({"timeout": math.nan}, "timeout"),
    "timeout inf": ({"timeout": math.inf}, "timeout"),
    "timeout huge": ({"timeout": 1e20}, "timeout"),
    "timeout str": ({"timeout": "30"}, "timeout"),
    "rank float": ({"rank": 0.5, "world_size": 2}, "rank"),
    "rank bool": ({"rank": True, "world_size": 2}, "rank"),
    "world_size float": ({"rank": 0, "world_size": 2.7}, "world_size"),
    "world_size huge": ({"rank": 0, "world_size": 10**11}, "world_size"),
    "fields duplicated": ({"fields": ("tokens", "tokens")}, "fields"),
    "pad_values a list": ({"pad_values": [0]}, "pad_values"),
    "pad_values a string value": ({"pad_values": {"tokens": "0"}}, "pad_values['tokens']"),
    "batching and batch_size": ({"batching": Batching(batch_size=3)}, "batch_size"),
    "batching of the wrong type": ({"batch_size": None, "batching": {"batch_size": 3}}, "Batching"),
    # a shortcut beside its object: it used to be silently ignored
    "batching and max_tokens disagree": (
        {"batch_size": None, "batching": Batching(max_tokens=64), "max_tokens": 32},
        "max_tokens=32 disagrees with batching=",
    ),
    "loader_options and num_workers disagree": (
        {"loader_options": shardload.LoaderOptions(num_workers=2), "num_workers": 0},
        "num_workers=0 disagrees with loader_options=",
    ),
    "loader_options of the wrong type": ({"loader_options": {"num_workers": 2}}, "LoaderOptions"),
}

#: options only the option objects hold: the tests pass them as keywords, and _route builds the objects
_IN_BATCHING = {f.name for f in dataclasses.fields(Batching)} - {"batch_size", "max_tokens"}
_IN_LOADER_OPTIONS = {f.name for f in dataclasses.fields(shardload.LoaderOptions)} - {"num_workers"}


def _route(options: dict[str, Any]) -> dict[str, Any]:
    """The keywords of make_loader / ShardDataModule, with ``batching`` and ``loader_options`` built here.

    Called inside ``pytest.raises``: an option object refusing a value is the error under test.
    """
    out = dict(options)
    batching = {k: out.pop(k) for k in options if k in _IN_BATCHING}
    if batching:
        out["batching"] = Batching(
            batch_size=out.pop("batch_size", None), max_tokens=out.pop("max_tokens", None), **batching
        )
    loading = {k: out.pop(k) for k in options if k in _IN_LOADER_OPTIONS}
    if loading:
        if "num_workers" in out:
            loading["num_workers"] = out.pop("num_workers")
        out["loader_options"] = shardload.LoaderOptions(**loading)
    return out


def _loader(path: Path, **kwargs: Any) -> Any:
    options: dict[str, Any] = {"rank": 0, "world_size": 1, "batch_size": 4}
    options.update(kwargs)
    return shardload.make_loader(path, **_route(options))


@pytest.mark.parametrize("case", list(BAD_LOADER_OPTIONS))
def test_bad_loader_options_fail_at_construction(pristine: Path, case: str) -> None:
    kwargs, named = BAD_LOADER_OPTIONS[case]
    # Invariant: the error comes from make_loader itself (no iteration), is a PlanError, names the option
    with pytest.raises(PlanError) as err:
        _loader(pristine, **kwargs)
    assert named in str(err.value), str(err.value)


@pytest.mark.parametrize(
    ("pad_values", "named"),
    [
        ({"tokenz": 1}, "'tokenz', which is not a field"),  # a typo: silently no effect before
        ({"tokens": 0.5}, "int32 holds integers only"),  # silently truncated to 0 before
        ({"tokens": True}, "a bool pads bool fields only"),  # silently padded with 1 before
        ({"tokens": 1e10}, "out of the range of int32"),
        ({"tokens": 2**31}, "out of the range of int32"),
        ({"tokens": math.nan}, "int32 cannot hold NaN"),
        ({"tokens": math.inf}, "int32 cannot hold NaN"),
        ({"features": 1e39}, "out of the range of float32"),
        ({"features": 10**400}, "out of the range of float32"),
        ({"features": 2**24 + 1}, "do not fit float32"),  # silently padded with 16777216.0 before
        ({"features": 1e-50}, "underflow float32"),  # silently padded with 0.0 before
        ({"features": 2**70 + 2**20}, "do not fit float32"),  # beyond 64 bits: rounded silently before
        ({"label": 7}, "fixed shape"),  # never padded: silently no effect before
    ],
)
def test_pad_values_that_do_not_fit_name_the_field_and_the_dtype(
    pristine: Path, pad_values: dict[str, Any], named: str
) -> None:
    with pytest.raises(PlanError) as err:
        _loader(pristine, pad_values=pad_values)
    assert named in str(err.value) and repr(next(iter(pad_values))) in str(err.value), str(err.value)


def test_pad_value_for_a_field_that_is_not_loaded_is_refused(pristine: Path) -> None:
    with pytest.raises(PlanError, match="not among the loaded fields"):
        _loader(pristine, fields=("tokens",), pad_values={"features": 1.0})


@pytest.mark.parametrize(
    ("value", "dtype", "problem"),
    [
        (-1, "uint8", "out of the range of uint8"),
        (256, "uint8", "out of the range of uint8"),
        (-1, "uint64", "out of the range of uint64"),
        (2**64, "uint64", "out of the range of uint64"),
        (128, "int8", "out of the range of int8"),
        (1e5, "float16", "out of the range of float16"),
        (2, "bool", "False or True"),
        (True, "int32", "bool pads bool fields only"),
        (np.bool_(False), "float32", "bool pads bool fields only"),
        (0.5, "int64", "integers only"),
        (math.nan, "int16", "cannot hold NaN"),
        ("1", "float32", "must be a number"),
        (None, "float32", "must be a number"),
        (2**53 + 1, "float64", "do not fit float64"),
        (2**24 + 1, "float32", "do not fit float32"),
        (1e-50, "float32", "underflow float32"),
    ],
)
def test_pad_value_outside_its_dtype(value: Any, dtype: str, problem: str) -> None:
    with pytest.raises(PlanError) as err:
        fit_pad_value("x", value, np.dtype(dtype))
    assert problem in str(err.value) and "field 'x'" in str(err.value) and dtype in str(err.value)


@settings(max_examples=200, deadline=None)
@given(
    dtype=st.sampled_from(
        ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16"]
    ),
    value=st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True), st.booleans()),
)
def test_an_accepted_pad_value_is_stored_exactly(dtype: str, value: Any) -> None:
    """Property: a pad value is refused, or the field's dtype holds it exactly (NaN/inf only in floats)."""
    dt = np.dtype(dtype)
    try:
        fitted = fit_pad_value("x", value, dt)
    except PlanError:
        return
    arr = np.zeros(3, dtype=dt)
    with np.errstate(over="raise", invalid="raise"):
        arr.fill(fitted)
    stored = arr[0].item()
    if dt.kind == "f":
        assert math.isnan(stored) if math.isnan(float(value)) else math.isinf(stored) == math.isinf(float(value))
    else:
        assert stored == value


def test_pad_spec_checks_itself() -> None:
    with pytest.raises(PlanError, match="pad_to_multiple_of"):
        PadSpec(pad_to_multiple_of=0)
    with pytest.raises(PlanError, match="keys must be field names"):
        PadSpec(pad_values={1: 0})  # type: ignore[dict-item]


def test_shard_batch_dataset_checks_pad_values_on_open(pristine: Path) -> None:
    from shardload.load.dataset import ShardBatchDataset

    ds = ShardBatchDataset(pristine, PadSpec(pad_values={"tokenz": 0}))
    with pytest.raises(PlanError, match="tokenz"):
        ds.fetch(np.array([0]), np.ones(1, np.float32))


# ----- ShardDataModule -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_size": 4, "seed": -1},
        {"batch_size": 4, "num_workers": -1},
        {"batch_size": 4, "num_workers": 2.0},
        {"batch_size": 4, "pin_memory": "yes"},
        {"batch_size": 4, "prefetch_factor": 0},
        {"batch_size": 4, "timeout": -5},
        {"batch_size": 4, "pad_values": {"tokens": "x"}},
        {"batch_size": 4, "fields": "tokens"},
        {"batch_size": 4, "shard_assignment": "random"},
        {"batch_size": 4, "debug": 1},
        {"batch_size": 4, "persistent_workers": None},
    ],
    ids=lambda kw: ",".join(f"{k}={v!r}" for k, v in kw.items()),
)
def test_datamodule_refuses_bad_options_when_built(pristine: Path, kwargs: dict[str, Any]) -> None:
    with pytest.raises(PlanError):
        shardload.ShardDataModule(train=pristine, **_route(kwargs))


def test_datamodule_checks_pad_values_against_the_sets_in_setup(pristine: Path) -> None:
    dm = shardload.ShardDataModule(train=pristine, val=pristine, batch_size=4, pad_values={"tokens": 0.5})
    # Invariant: the dtype mismatch is found before training starts, naming the set
    with pytest.raises(PlanError, match=r"int32 holds integers only.*the train set "):
        dm.setup("fit")


def test_datamodule_refuses_a_state_that_is_not_a_dict(pristine: Path) -> None:
    dm = shardload.ShardDataModule(train=pristine, batch_size=4)
    with pytest.raises(PlanError, match="state"):
        dm.load_state_dict(None)  # type: ignore[arg-type]


# ----- the loader's saved state ----------------------------------------------------------------


def _state(pristine: Path) -> tuple[Any, dict[str, Any]]:
    loader = _loader(pristine)
    it = iter(loader)
    for _ in range(3):
        next(it)
    return loader, loader.state_dict()


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda s: None, "state_dict() returned"),
        (lambda s: [], "state_dict() returned"),
        (lambda s: {k: v for k, v in s.items() if k != "batches_done"}, "lacks ['batches_done']"),
        (lambda s: {k: v for k, v in s.items() if k != "fingerprint"}, "lacks ['fingerprint']"),
        (lambda s: {**s, "batches_done": -1}, "batches_done must be >= 0"),
        (lambda s: {**s, "batches_done": 10**6}, "the epoch has 30"),
        (lambda s: {**s, "batches_done": 2.5}, "batches_done must be an integer"),
        (lambda s: {**s, "batches_done": None}, "batches_done must be an integer"),
        (lambda s: {**s, "batches_done": "3"}, "batches_done must be an integer"),
        (lambda s: {**s, "epoch": -1}, "epoch must be >= 0"),
        (lambda s: {**s, "epoch": 1.0}, "epoch must be an integer"),
        (lambda s: {**s, "world_size": 0}, "world_size must be >= 1"),
        (lambda s: {**s, "fingerprint": None}, "fingerprint must be a str"),
        (lambda s: {**s, "version": True}, "version True"),
    ],
)
def test_bad_loader_state_is_refused_and_changes_nothing(pristine: Path, edit: Any, named: str) -> None:
    loader, state = _state(pristine)
    before = (loader.plan_sampler.epoch, loader.plan_sampler.start, loader.batches_done)
    with pytest.raises(PlanError) as err:
        loader.load_state_dict(edit(state))
    assert named in str(err.value), str(err.value)
    # Invariant: a refused state leaves the loader where it was, and the real state still resumes
    assert (loader.plan_sampler.epoch, loader.plan_sampler.start, loader.batches_done) == before
    fresh = _loader(pristine)
    fresh.load_state_dict(state)
    assert len(list(fresh)) == 30 - 3


@pytest.mark.parametrize("num_workers", [0, 2])
def test_load_state_dict_during_an_iteration_stops_the_old_iterator(pristine: Path, num_workers: int) -> None:
    # Before: accepted and ignored by the running iterator, which went on counting: state_dict() then said
    # more batches were done than the epoch has, a checkpoint that cannot be resumed.
    _, state = _state(pristine)  # 3 of 30 done
    loader = _loader(pristine, num_workers=num_workers)
    it = iter(loader)
    next(it), next(it)
    loader.load_state_dict(state)
    with pytest.raises(PlanError, match=r"superseded \(load_state_dict\(\) was called"):
        list(it)
    assert loader.state_dict()["batches_done"] == 3
    assert len(list(loader)) == 30 - 3  # the restored state takes effect in the next iteration
    assert loader.state_dict()["batches_done"] == 30


def test_state_dict_after_set_epoch_counts_nothing_of_the_new_epoch(pristine: Path) -> None:
    # A checkpoint taken after set_epoch(1) used to say epoch 1 with epoch 0's 30 batches done: resuming from it
    # silently skipped the whole of epoch 1.
    loader = _loader(pristine)
    assert len(list(loader)) == 30
    loader.set_epoch(1)
    state = loader.state_dict()
    assert (state["epoch"], state["batches_done"]) == (1, 0)
    fresh = _loader(pristine)
    fresh.load_state_dict(state)
    assert len(list(fresh)) == 30


def test_state_dict_counts_only_the_latest_iteration(pristine: Path) -> None:
    # Two iterators of one loader used to add their batches up in batches_done.
    loader = _loader(pristine)
    old = iter(loader)
    next(old)
    new = iter(loader)
    for _ in range(5):
        next(new)
    with pytest.raises(PlanError, match=r"superseded \(a new iteration"):
        next(old)
    assert loader.state_dict()["batches_done"] == 5


def test_state_of_another_seed_or_set_is_a_plan_mismatch(pristine: Path) -> None:
    _, state = _state(pristine)
    other = _loader(pristine, seed=1)
    with pytest.raises(PlanMismatchError):
        other.load_state_dict(state)
    assert other.plan_sampler.start == 0 and other.plan_sampler.epoch == 0


def test_set_epoch_refuses_a_negative_or_non_integer_epoch(pristine: Path) -> None:
    loader = _loader(pristine)
    for bad in (-1, 1.5, None):
        with pytest.raises(PlanError, match="epoch"):
            loader.set_epoch(bad)


# ----- the planner and `shardload plan` ---------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"world_size": 10**11}, "world_size"),
        ({"world_size": 2**20 + 1}, "world_size"),
        ({"seed": 2**64}, "seed"),
        ({"epoch": 2**63}, "epoch"),
    ],
)
def test_plan_rank_refuses_huge_values_without_allocating(kwargs: dict[str, Any], named: str) -> None:
    spec: dict[str, Any] = {"world_size": 2, **kwargs}
    with pytest.raises(PlanError, match=named):
        plan_rank(PlanInputs(np.array([3, 8, 5, 1]), np.array([4])), EpochSpec(**spec), Batching(batch_size=2), rank=0)


@pytest.mark.parametrize(
    "option",
    [
        "--batch-size 100000000000000000000",
        "--max-tokens 100000000000000000000",
        "--batch-size 4 --pad-to-multiple-of 100000000000000000000",
        "--batch-size 4 --pad-to-multiple-of 4611686018427387904",  # gave padded tokens 0 (int64 wrap)
        "--batch-size 4 --world-size 100000000000",  # 745 GiB allocation before
        "--batch-size 4 --world-size 2000000",
        "--batch-size 4 --seed 18446744073709551616",
    ],
)
def test_plan_cli_refuses_huge_values_with_the_plan_exit_status(
    pristine: Path, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", str(pristine), *option.split()]
    if "--world-size" not in option:
        argv += ["--world-size", "2"]
    # Invariant: exit 6 (plan error) with one line, never 70 or a giant allocation
    assert main(argv) == 6
    err = capsys.readouterr().err
    assert err.startswith("shardload: error: ") and "internal error" not in err


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.sampled_from(["batch_size", "seed", "epoch", "num_workers", "prefetch_factor", "timeout", "world_size"]),
    value=st.one_of(
        st.integers(-(2**80), 2**80),
        st.floats(allow_nan=True, allow_infinity=True),
        st.booleans(),
        st.text(max_size=3),
        st.none(),
    ),
)
def test_any_value_of_an_option_is_accepted_or_refused_at_construction(pristine: Path, name: str, value: Any) -> None:
    """Fuzz: make_loader either builds a loader or raises PlanError; nothing else, and never a wrapped value."""
    kwargs: dict[str, Any] = {name: value}
    if name == "world_size":
        kwargs["rank"] = 0
    try:
        loader = _loader(pristine, **kwargs)
    except PlanError:
        return
    if name in ("seed", "epoch"):
        assert getattr(loader.plan_sampler, name) == value and type(value) is int
    elif name == "world_size":
        assert loader.plan_sampler.world.world_size == value and type(value) is int
