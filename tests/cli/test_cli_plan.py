"""`shardload plan`: the dry-run table and its JSON."""

from __future__ import annotations

import numpy as np
import pytest

import shardload
from shardload.cli import Exit


@pytest.mark.parametrize("world_size", [1, 3, 8])
@pytest.mark.parametrize("size", [["--batch-size", "16"], ["--max-tokens", "300"]])
def test_plan_json(cli, shard_set, world_size, size) -> None:
    r = cli("plan", shard_set, "--world-size", world_size, *size, "--json")
    assert r.code == 0, r.err
    obj = r.json()
    # the keys scripts read are there (the object is PlanSummary.to_dict(): it has more)
    assert {"world_size", "stage", "padding_fraction", "ranks"} <= set(obj)
    assert (
        obj
        == shardload.plan.summarize_plan(
            shardload.open(shard_set).plan_inputs(),
            shardload.plan.EpochSpec(world_size=world_size),
            shardload.plan.Batching(**{size[0][2:].replace("-", "_"): int(size[1])}),
            shard_bytes=[s.bytes for s in shardload.open(shard_set).shards],  # the CLI sizes the cache too
        ).to_dict()
    )
    assert (obj["world_size"], obj["stage"]) == (world_size, "train")
    assert 0 <= obj["padding_fraction"] < 1
    assert [row["rank"] for row in obj["ranks"]] == list(range(world_size))
    for row in obj["ranks"]:
        assert {"rank", "batches", "samples", "filler", "tokens", "padded_tokens"} <= set(row)
        assert row["padded_tokens"] >= row["tokens"]
    # Invariant: every rank has the same number of batches
    assert len({row["batches"] for row in obj["ranks"]}) == 1
    # the default uneven="split" loses and repeats nothing
    assert sum(row["samples"] for row in obj["ranks"]) == 200


def test_plan_with_ids_covers_every_sample_once_in_val(cli, shard_set) -> None:
    r = cli(
        "plan",
        shard_set,
        "--world-size",
        "3",
        "--batch-size",
        "7",
        "--stage",
        "val",
        "--uneven",
        "pad",
        "--pad-to-multiple-of",
        "8",
        "--json",
        "--with-ids",
    )
    assert r.code == 0, r.err
    ranks = r.json()["ranks"]
    real = []
    for row in ranks:
        ids, weights = row["batch_sample_ids"], row["batch_weights"]
        assert len(ids) == len(weights) == row["batches"]
        assert [len(b) for b in ids] == [len(w) for w in weights]
        real += [i for b, w in zip(ids, weights) for i, x in zip(b, w) if x > 0]
        assert sum(x == 0 for w in weights for x in w) == row["filler"]
    # Invariant: in evaluation every real sample is planned exactly once over all ranks
    assert sorted(real) == list(range(200))


def test_plan_matches_the_library(cli, shard_set) -> None:
    from shardload.plan import Batching, EpochSpec, plan_rank

    r = cli(
        "plan",
        shard_set,
        "--world-size",
        "2",
        "--max-tokens",
        "256",
        "--no-bucketing",
        "--seed",
        "5",
        "--epoch",
        "2",
        "--shard-assignment",
        "fixed",
        "--json",
        "--with-ids",
    )
    ds = shardload.open(shard_set)
    spec = EpochSpec(world_size=2, stage="train", seed=5, epoch=2, shard_assignment="fixed")
    plan = plan_rank(ds.plan_inputs(), spec, Batching(max_tokens=256, bucketing=False), rank=1)
    got = r.json()["ranks"][1]["batch_sample_ids"]
    assert got == [plan.sample_ids[a:b].tolist() for a, b in zip(plan.batch_offsets[:-1], plan.batch_offsets[1:])]


def test_plan_table(cli, shard_set) -> None:
    r = cli("plan", shard_set, "--world-size", "4", "--max-tokens", "512")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[0].split()[:3] == ["rank", "batches", "samples"]
    assert [line.split()[0] for line in lines[1:5]] == ["0", "1", "2", "3"]
    assert any(line.startswith(" all") or line.split()[:1] == ["all"] for line in lines)
    assert "spread:" in r.out and "padded tokens of the slowest rank" in r.out
    # the padding column of the totals is the summary's padding fraction
    total = next(line for line in lines if line.split()[:1] == ["all"])
    assert total.endswith("%")


def test_plan_error_is_exit_6(cli, shard_set) -> None:
    r = cli("plan", shard_set, "--world-size", "2", "--batch-size", "4", "--stage", "val", "--uneven", "drop")
    assert r.code == Exit.PLAN == 6 and "shardload: error:" in r.err and "drop" in r.err


def test_plan_usage_errors(cli, shard_set) -> None:
    assert cli("plan", shard_set, "--batch-size", "4").code == 2  # no --world-size
    assert cli("plan", shard_set, "--world-size", "2").code == 2  # neither size option
    assert cli("plan", shard_set, "--world-size", "2", "--batch-size", "4", "--max-tokens", "9").code == 2
    assert cli("plan", shard_set, "--world-size", "0", "--batch-size", "4").code == 2
    r = cli("plan", shard_set, "--world-size", "2", "--batch-size", "4", "--with-ids")
    assert r.code == 2 and "--json" in r.err


def test_plan_missing_set_is_exit_5(cli, tmp_path) -> None:
    assert cli("plan", tmp_path, "--world-size", "2", "--batch-size", "4").code == 5


def test_plan_lengths_are_those_of_the_index(cli, shard_set) -> None:
    tokens = sum(
        row["tokens"]
        for row in cli("plan", shard_set, "--world-size", "3", "--batch-size", "5", "--json").json()["ranks"]
    )
    assert tokens == int(np.load(shard_set / "lengths.npy").sum())


def test_plan_of_a_mixture_reports_every_source(cli, shard_set, tmp_path) -> None:
    from shardload.testing import synthetic_samples

    shardload.write(synthetic_samples(40, seed=5, median_tokens=80), tmp_path / "code", num_shards=2, progress=False)
    argv = ["--source", f"web={shard_set}:0.7", "--source", f"code={tmp_path / 'code'}:0.3", "--world-size", "3"]
    r = cli("plan", *argv, "--max-tokens", "400", "--json")
    assert r.code == 0, r.err
    obj = r.json()
    mix = shardload.Mixture({"web": shard_set, "code": tmp_path / "code"}, weights={"web": 0.7, "code": 0.3})
    shard_bytes = [s.bytes for path in (shard_set, tmp_path / "code") for s in shardload.open(path).shards]
    expected = shardload.plan.summarize_plan(
        mix.open().plan_inputs(),
        shardload.plan.EpochSpec(world_size=3),
        shardload.plan.Batching(max_tokens=400),
        shard_bytes=shard_bytes,  # the sources' shards one after another
    )
    assert obj == expected.to_dict()
    assert [s["name"] for s in obj["sources"]] == ["web", "code"]
    assert abs(obj["sources"][0]["tokens"] / (obj["sources"][0]["tokens"] + obj["sources"][1]["tokens"]) - 0.7) < 0.02
    table = cli("plan", *argv, "--max-tokens", "400").out
    assert "worst deviation" in table and "share per rank" in table
    # a cap the weights need more than: the planner's error, exit 6, naming the source and the cap
    r = cli("plan", *argv, "--max-tokens", "400", "--max-repeats", "1")
    assert r.code == Exit.PLAN and "'web'" in r.err and "max_repeats=1" in r.err
    assert cli("plan", "--world-size", "2", "--batch-size", "4").code == 2  # neither OUT nor --source
    assert cli("plan", shard_set, *argv, "--batch-size", "4").code == 2  # both
    assert cli("plan", "--source", "web", "--world-size", "2", "--batch-size", "4").code == 2


def test_plan_sizes_the_cache_per_rank_and_per_node(cli, shard_set) -> None:
    r = cli("plan", shard_set, "--world-size", "4", "--batch-size", "8", "--ranks-per-node", "2", "--json")
    assert r.code == 0, r.err
    obj = r.json()
    shard_bytes = [s.bytes for s in shardload.open(shard_set).shards]
    assert obj["ranks_per_node"] == 2 and len(obj["node_cache_bytes"]) == 2
    for row in obj["ranks"]:
        assert 0 < row["step_bytes"] <= row["cache_bytes"] <= sum(shard_bytes)
    assert max(obj["node_cache_bytes"]) <= sum(shard_bytes)
    table = cli("plan", shard_set, "--world-size", "4", "--batch-size", "8", "--ranks-per-node", "2").out
    assert "cache:" in table and "per node of 2 ranks" in table
    r = cli("plan", shard_set, "--world-size", "2", "--batch-size", "8", "--ranks-per-node", "4")
    assert r.code == 2 and "--ranks-per-node 4 is more than --world-size 2" in r.err


def _epoch_of(ranks: list[dict], rows_per_batch: int | None = None) -> tuple[int, int, int]:
    """``(samples, documents, rows)`` of the batches ``--with-ids`` lists: a cut sample's pieces one sample,
    each piece one document, and the distinct packed rows that hold one."""
    samples = documents = rows = 0
    for rank in ranks:
        for b, (weights, starts) in enumerate(
            zip(rank["batch_weights"], rank.get("batch_starts", rank["batch_weights"]))
        ):
            real = [i for i, w in enumerate(weights) if w > 0]
            documents += len(real)
            samples += sum(1 for i in real if "batch_starts" not in rank or starts[i] == 0)
            if rows_per_batch is not None:
                rows += len({rank["batch_rows"][b][i] for i in real})
    return samples, documents, rows


def test_plan_of_a_mixture_headlines_the_epoch_then_the_sources(cli, npy_dir, tmp_path) -> None:
    """`plan --source` said "1,899 samples" (the sources') for an epoch of 80 samples, 416 documents."""
    lengths = {}
    for name, seed in (("web", 1), ("code", 2)):
        rng = np.random.default_rng(seed)
        arrays = [rng.integers(0, 9, size=int(rng.integers(5, 300))) for _ in range(120)]
        lengths[name] = [len(a) for a in arrays]
        shardload.write(({"tokens": a} for a in arrays), tmp_path / name, num_shards=3, progress=False)
    argv = ["plan", "--source", f"web={tmp_path / 'web'}:0.7", "--source", f"code={tmp_path / 'code'}:0.3"]
    argv += ["--epoch-tokens", "9000", "--world-size", "2", "--packing", "--pack-length", "128"]
    argv += ["--rows-per-batch", "4", "--pack-split"]
    r = cli(*argv, "--json", "--with-ids")
    assert r.code == 0, r.err
    obj = r.json()
    samples, documents, rows = _epoch_of(obj["ranks"], rows_per_batch=4)
    all_samples, all_tokens = sum(map(len, lengths.values())), sum(map(sum, lengths.values()))
    assert documents > samples  # some samples are cut into pieces: the two counts differ
    assert samples < all_samples  # the epoch takes part of the sources: the two totals differ
    # Invariant: the epoch's figures are those of its batches; the sources' those of the sets
    assert (obj["epoch_samples"], obj["epoch_documents"]) == (samples, documents)
    assert sum(rank["rows"] for rank in obj["ranks"]) == rows
    assert (obj["num_samples"], obj["input_tokens"]) == (all_samples, all_tokens)
    assert [(s["input_samples"], s["input_tokens"]) for s in obj["sources"]] == [
        (len(lengths[n]), sum(lengths[n])) for n in ("web", "code")
    ]
    text = cli(*argv).out
    head = text.index("stage train: ")
    # Invariant: the headline is the epoch; the sources' totals come after it, labelled
    assert text[head:].startswith(
        f"stage train: the epoch holds {samples:,} samples, {obj['epoch_tokens']:,} tokens, on 2 ranks: "
        f"{obj['num_batches']:,} batches per rank\npacked:   {documents:,} documents"
    )
    assert f"in {rows:,} rows" in text
    assert f"\nsources:  {all_samples:,} samples, {all_tokens:,} tokens in all (" in text[head:]
    assert f"web {len(lengths['web']):,} / {sum(lengths['web']):,}" in text


def test_plan_of_one_set_headlines_the_epoch_then_the_set(cli, npy_dir, tmp_path) -> None:
    assert cli("prepare", npy_dir, "-o", tmp_path / "set", "--field", "tokens", "--no-progress").code == 0
    lengths = [len(np.load(p)) for p in npy_dir.iterdir()]
    argv = ["plan", tmp_path / "set", "--world-size", "3", "--batch-size", "4", "--uneven", "drop"]
    obj = cli(*argv, "--json", "--with-ids").json()
    samples, _, _ = _epoch_of(obj["ranks"])
    assert obj["epoch_samples"] == samples and obj["input_tokens"] == sum(lengths)
    text = cli(*argv).out
    assert f"stage train: the epoch holds {samples:,} samples, " in text
    assert f"\nset:      {len(lengths):,} samples, {sum(lengths):,} tokens in all" in text
    assert text.index("the epoch holds") < text.index("\nset:")
