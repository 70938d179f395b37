"""Mixtures of shard sets, misused as a careless user who read only the docs would.

Each test is one problem found by misusing the documented mixture API
(``shardload.Mixture``, ``make_loader``, ``shardload plan --source``): the
misuse now ends in a ``ShardloadError`` naming the source, option or file and
what to do, where it is written, instead of a silent wrong result, an
internal error (exit 70) or a message that names neither.
"""

from __future__ import annotations

import shutil
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import shardload
from shardload import Mixture, MixtureError, make_loader
from shardload.cli import main
from shardload.errors import ManifestError, PlanError, ShardSetChangedError

pytestmark = pytest.mark.filterwarnings("ignore:.*does not have many workers")


def _token_set(path: Path, n: int, seed: int) -> Path:
    """``n`` samples of 1..40 ``tokens`` in 2 shards."""
    rng = np.random.default_rng(seed)
    samples = [{"tokens": rng.integers(0, 100, k).astype(np.int32)} for k in rng.integers(1, 41, n)]
    shardload.write(samples, path, num_shards=2, progress=False)
    return path


@pytest.fixture
def two(tmp_path: Path) -> dict[str, Path]:
    return {"web": _token_set(tmp_path / "web", 60, 1), "code": _token_set(tmp_path / "code", 20, 2)}


def _ids(mix: Mixture) -> list[list[int]]:
    return [b["sample_id"].tolist() for b in make_loader(mix, max_tokens=128)]


def test_a_mixture_keeps_what_it_was_given_not_the_callers_dicts(two: dict[str, Path]) -> None:
    # Invariant: Mixture copies `sources` and `weights`: a dict changed by the caller afterwards (the same set
    # twice, a negative weight, an unknown name) neither bypasses the checks nor changes the mixture.
    sources = {"web": str(two["web"]), "code": str(two["code"])}
    weights = {"web": 1.0, "code": 3.0}
    mix = Mixture(sources, weights=weights)
    before = _ids(mix)
    sources["code"] = str(two["web"])
    weights["web"], weights["other"] = -5.0, 1.0
    assert mix.sources == {"web": str(two["web"]), "code": str(two["code"])}
    assert mix.weights == {"web": 1.0, "code": 3.0}
    assert _ids(mix) == before


def test_a_source_re_prepared_between_epochs_is_refused_as_a_single_set_is(two: dict[str, Path]) -> None:
    # Invariant: each epoch's plan checks every source's lengths index as a single set's does, so a source
    # re-prepared after the loader was built raises ShardSetChangedError naming it instead of the next epoch
    # being planned from, and read out of, the old files.
    loader = make_loader(Mixture({k: str(v) for k, v in two.items()}), max_tokens=128)
    assert len(list(loader)) > 0
    shutil.rmtree(two["code"])
    _token_set(two["code"], 25, 9)
    loader.set_epoch(1)
    with pytest.raises(ShardSetChangedError, match=f"{two['code']} was re-prepared"):
        list(loader)


@pytest.mark.parametrize(
    "weights", [{"web": 1e308, "code": 1e308}, {"web": 1e308, "code": 1.0}, {"web": 2**1023, "code": 2**1023}]
)
def test_weights_of_any_finite_scale_are_normalised(two: dict[str, Path], weights: dict[str, float]) -> None:
    # Invariant: weights are "any scale": huge ones whose sum overflows a float are normalised (not an
    # OverflowError, exit 70 in `shardload plan`), and an integer too large for a float is a MixtureError.
    mix = Mixture({k: str(v) for k, v in two.items()}, weights=weights)
    shares = mix.open().plan_inputs().shares
    assert sum(shares) == pytest.approx(1.0) and shares[0] >= shares[1] > 0
    with pytest.raises(MixtureError, match=r"weight of source 'web' .* finite"):
        Mixture({k: str(v) for k, v in two.items()}, weights={"web": 10**400, "code": 1})


def test_weights_may_be_any_real_number(two: dict[str, Path]) -> None:
    # Invariant: a Fraction is a number: it is a weight like a float, not "must be a number".
    exact = Mixture({k: str(v) for k, v in two.items()}, weights={"web": Fraction(1, 3), "code": Fraction(2, 3)})
    floats = Mixture({k: str(v) for k, v in two.items()}, weights={"web": 1.0, "code": 2.0})
    assert _ids(exact) == _ids(floats)


@pytest.mark.parametrize(("by", "option"), [("tokens", "epoch_tokens"), ("samples", "epoch_samples")])
def test_an_empty_training_epoch_is_refused(
    two: dict[str, Path], by: str, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Invariant: an epoch size of 0 (a training epoch without a batch) is refused where it is written, not
    # planned into a loader of length 0 and a report of zeros.
    with pytest.raises(PlanError, match=f"{option} must be >= 1, got 0"):
        Mixture({k: str(v) for k, v in two.items()}, by=by, **{option: 0})  # type: ignore[arg-type]
    flag = "--" + option.replace("_", "-")
    argv = ["plan", "--source", f"web={two['web']}", "--by", by, flag, "0", "--world-size", "2", "--max-tokens", "64"]
    assert main(argv) == 2 and "at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("weight", ["x", "0x10", "", "1/3"])
def test_a_source_weight_that_is_not_a_number_says_so(
    two: dict[str, Path], weight: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Invariant: `--source NAME=PATH:WEIGHT` whose WEIGHT is not a number, beside an existing PATH, is a usage
    # error saying so, instead of "no weight for source" or "PATH:x is not a shard set".
    argv = ["plan", "--source", f"web={two['web']}:{weight}", "--source", f"code={two['code']}:1"]
    assert main([*argv, "--world-size", "2", "--max-tokens", "64"]) == 2
    err = capsys.readouterr().err
    assert f"weight {weight!r} of source 'web' is not a number" in err and "no weight" not in err


def test_a_copy_of_a_set_is_the_same_set(two: dict[str, Path], tmp_path: Path) -> None:
    # Invariant: two sources with the same content (a `cp -r` copy: the same manifest fingerprint) are refused
    # when the mixture is opened, as the same path twice is, instead of silently doubling that data's weight.
    copy = Path(shutil.copytree(two["web"], tmp_path / "web-copy"))
    mix = Mixture({"web": str(two["web"]), "again": str(copy), "code": str(two["code"])})
    with pytest.raises(MixtureError, match=r"sources 'web' and 'again' hold the same shard set .*web-copy"):
        make_loader(mix, max_tokens=128)


def test_a_missing_source_is_named(two: dict[str, Path], tmp_path: Path) -> None:
    # Invariant: a source that is not a shard set is reported with the source's name, not only a path.
    mix = Mixture({"web": str(two["web"]), "code": str(tmp_path / "nope")})
    with pytest.raises(ManifestError, match=r"source 'code' of the mixture: .*nope is not a shard set"):
        make_loader(mix, max_tokens=128)


def _two_field_set(path: Path, length_field: str | None, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    samples = [
        {"tokens": np.arange(n, dtype=np.int32), "aux": np.zeros(n // 10 + 1, dtype=np.int32)}
        for n in rng.integers(20, 60, 30)
    ]
    shardload.write(samples, path, num_shards=2, length_field=length_field, progress=False)
    return path


def test_sources_whose_batching_lengths_measure_different_fields_are_refused(tmp_path: Path) -> None:
    # Invariant: weights by tokens and the token budget count each sample's batching length; sources that take it
    # from different fields (length_field "tokens" in one, "aux" in another) are refused when the loader is built,
    # naming both sources and fields, instead of the aux source being counted in aux rows (and mixed ~10x over).
    tok = _two_field_set(tmp_path / "tok", "tokens", 1)
    aux = _two_field_set(tmp_path / "aux", "aux", 2)
    mix = Mixture({"tok": str(tok), "aux": str(aux)})
    with pytest.raises(MixtureError, match=r"sources 'tok' and 'aux' .*length_field 'tokens' vs 'aux'"):
        make_loader(mix, max_tokens=256)
    # the same rule said two ways (the default rule, the longest field, is `tokens` here in every sample) still mixes
    default = _two_field_set(tmp_path / "default", None, 3)
    single = {"a": _token_set(tmp_path / "a", 10, 4), "b": _token_set(tmp_path / "b", 10, 5)}
    assert len(make_loader(Mixture({"tok": str(tok), "default": str(default)}), max_tokens=256)) > 0
    assert len(make_loader(Mixture({k: str(v) for k, v in single.items()}), max_tokens=256)) > 0


def test_an_epoch_too_large_to_plan_names_the_source(two: dict[str, Path]) -> None:
    # Invariant: an epoch size with zeros too many (2**59 tokens of a set of a few thousand: far beyond any
    # memory or address space) is a MixtureError naming the source and what to change, not numpy's bare
    # "Unable to allocate ... EiB" from the planner's insides.
    mix = Mixture({k: str(v) for k, v in two.items()}, epoch_tokens=2**59)
    with pytest.raises(MixtureError, match=r"source 'web' of the mixture: planning its .* sample uses .*memory"):
        len(make_loader(mix, max_tokens=128))
