"""The trainer's clock matches the loader's epochs, under real Lightning DDP (gloo on CPU).

Two jobs, each a chain of ``trainer.fit`` runs in one process group under a
watchdog (tests/distributed/clock_job.py records every training step,
validation and epoch boundary on every rank): 3 ranks, then 2 ranks. The
training set's shards differ in length on purpose, so the natural batch count
of an epoch varies from epoch to epoch for token budgets, buckets, packing and
mixtures (checked below); the plan makes it constant
(shardload/plan/length.py). For every batching mode and 6 epochs, and for the
Trainer flags that read the epoch's length, the checks are what Lightning
documents and what the user relies on:

* the length Lightning uses, the progress bar's total and ``len(loader)`` are
  the plan's steps per epoch, the same for every epoch;
* validation runs where Lightning's rule puts it (by default once per epoch,
  after the last training step), and the model it validates is the epoch's
  final model (parameter digests) with the loss logged with ``sync_dist=True``
  equal to the loss recomputed in one process;
* equal counts per rank, every sample once per epoch;
* ``trainer.estimated_stepping_batches`` equals the optimizer steps taken, and
  a ``OneCycleLR`` over it runs to the end;
* the same after a mid-epoch resume, and after an elastic resume from 3 to 2
  ranks (the resumed epoch, then epochs of the new world size).

The 3-rank job runs under the oldest supported Lightning too (2.2, installed
beside the venv by tools/setup_env.sh), so a Lightning that moves an
attribute fails here instead of shifting validation silently.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import shardload
from shardload.plan import Batching, EpochSpec
from shardload.plan.mix.inputs import MixInputs
from shardload.plan.planner import EpochPlanner
from tests.distributed.clock_job import ClockModel
from tests.distributed.watchdog import REPO, python, run_with_watchdog

JOB = str(Path(__file__).with_name("clock_job.py"))
pytestmark = pytest.mark.slow

#: where tools/setup_env.sh installs the oldest Lightning the project supports
OLDEST = REPO / ".venv" / "lightning-oldest"
EPOCHS, SEED = 6, 3
MODES: dict[str, dict[str, Any]] = {
    "fixed": {"batch_size": 4},
    "tokens": {"max_tokens": 256, "bucketing": False},
    "buckets": {"max_tokens": 256},
    "packing": {"packing": True, "pack_length": 128, "rows_per_batch": 2, "pack_split": True},
    "mixture": {"max_tokens": 256},
}
#: Trainer flags that read the epoch's length (buckets unless said; 3 ranks)
FLAGS: dict[str, dict[str, Any]] = {
    "quarter": {"trainer": {"max_epochs": 3, "val_check_interval": 0.25}},
    "every4": {"trainer": {"max_epochs": 3, "val_check_interval": 4}},
    "every2nd": {"trainer": {"max_epochs": 4, "check_val_every_n_epoch": 2}},
    "limit5": {"trainer": {"max_epochs": 3, "limit_train_batches": 5}},
    "limithalf": {"trainer": {"max_epochs": 3, "limit_train_batches": 0.5}},
    "accum3": {"trainer": {"max_epochs": 4, "accumulate_grad_batches": 3}, "onecycle": True, "mode": "tokens"},
    "onecycle": {"trainer": {"max_epochs": EPOCHS}, "onecycle": True, "mode": "packing"},
    "maxsteps": {"trainer": {"max_steps": 25}, "onecycle": True},
}
STOP = (2, 4)  # the mid-epoch checkpoint: after batch_idx 4 of epoch 2
END = (1,)  # the checkpoint at the last step of epoch 1 (resumed on 2 ranks, whose epochs are longer)


def token_set(path: Path, shards: int, seed: int) -> Path:
    """Shards of short, medium and long documents in turn: epochs differ in natural batch count."""
    rng = np.random.default_rng(seed)
    samples = []
    for s in range(shards):
        longest = (8, 40, 120)[s % 3]
        for k in rng.integers(1, longest, int(rng.integers(10, 30))):
            samples.append({"tokens": rng.integers(0, 16, int(k)).astype(np.int32)})
    shardload.write(samples, path, num_shards=shards)
    return path


@pytest.fixture(scope="module")
def clock(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run both jobs once; every test reads their records."""
    root = tmp_path_factory.mktemp("clock")
    sets = {"a": token_set(root / "a", 12, 1), "b": token_set(root / "b", 6, 4), "val": token_set(root / "val", 3, 2)}
    return {"sets": sets, "runs": {**run_job(root / "new", sets, 3, None), **run_job(root / "new", sets, 2, None)}}


def run_config(name: str, sets: dict[str, Path], mode: str, trainer: dict[str, Any], **extra: Any) -> dict[str, Any]:
    train: Any = {"a": str(sets["a"]), "b": str(sets["b"])} if mode == "mixture" else str(sets["a"])
    return {"name": name, "mode": mode, "train": train, "val": str(sets["val"]), "batching": MODES[mode],
            "trainer": trainer, **extra}  # fmt: skip


def run_job(
    out: Path, sets: dict[str, Path], world: int, lightning: Path | None, only: set[str] | None = None
) -> dict[str, dict[str, Any]]:
    """One job of ``world`` ranks: every mode for 6 epochs; on 3 ranks the flags and a mid-epoch resume, on 2
    an elastic resume of the 3-rank checkpoint (``only``: these runs). Returns ``{run: {"config", "ranks"}}``."""
    out.mkdir(exist_ok=True)
    runs = [run_config(f"{mode}{world}", sets, mode, {"max_epochs": EPOCHS}) for mode in MODES]
    part = out / "part3.ckpt"
    if world == 3:
        for name, flags in FLAGS.items():
            runs.append(run_config(name, sets, flags.get("mode", "buckets"), flags["trainer"],
                                   onecycle=flags.get("onecycle", False)))  # fmt: skip
        runs.append(run_config("part3", sets, "buckets", {"max_epochs": EPOCHS}, stop=list(STOP)))
        runs.append(run_config("resumed3", sets, "buckets", {"max_epochs": EPOCHS}, resume=str(part)))
        length = steps_per_epoch(run_config("", sets, "buckets", {}), 3, END[0])  # a checkpoint at its last step:
        runs.append(run_config("end3", sets, "buckets", {"max_epochs": EPOCHS}, stop=[END[0], length - 1]))
        half = {"max_epochs": EPOCHS, "limit_train_batches": 0.5}  # the last of the steps the limit leaves
        runs.append(run_config("endhalf3", sets, "buckets", half, stop=[END[0], limited(length, 0.5) - 1]))
    else:
        runs.append(run_config("elastic2", sets, "buckets", {"max_epochs": EPOCHS}, resume=str(part)))
        runs.append(run_config("endelastic2", sets, "buckets", {"max_epochs": EPOCHS}, resume=str(out / "end3.ckpt")))
        half = {"max_epochs": EPOCHS, "limit_train_batches": 0.5}
        runs.append(run_config("endhalfelastic2", sets, "buckets", half, resume=str(out / "endhalf3.ckpt")))
    runs = [run for run in runs if only is None or run["name"] in only]
    config = out / f"config{world}.json"
    config.write_text(json.dumps({"out": str(out), "devices": world, "runs": runs}))
    env = None if lightning is None else {"PYTHONPATH": f"{lightning}{os.pathsep}{REPO}"}
    res = run_with_watchdog(python(JOB, str(config)), timeout=300, env=env)
    assert not res.hung, "the job hung:\n" + res.tail()
    assert res.returncode == 0, res.tail()
    done = {}
    for run in runs:
        # a rank that crashed writes no record: Lightning's launcher may still exit 0
        paths = [out / f"{run['name']}_rank{r}.json" for r in range(world)]
        missing = [p.name for p in paths if not p.exists()]
        assert not missing, f"{run['name']}: no record from {missing}:\n{res.tail()}"
        done[run["name"]] = {"config": run, "world": world, "ranks": [json.loads(p.read_text()) for p in paths]}
    return done


def inputs_of(config: dict[str, Any]) -> Any:
    train = config["train"]
    if isinstance(train, dict):
        return MixInputs(
            tuple(shardload.open(train[k]).plan_inputs() for k in ("a", "b")), ("a", "b"), {"a": 0.7, "b": 0.3}
        )
    return shardload.open(train).plan_inputs()


def steps_per_epoch(config: dict[str, Any], world: int, epoch: int, *, steady: bool = True) -> int:
    spec = EpochSpec(world_size=world, seed=SEED, epoch=epoch)
    return EpochPlanner(inputs_of(config), spec, Batching(**config["batching"]), steady=steady).num_batches


def events(record: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in record if e["ev"] == kind]


def limited(length: int, limit: int | float) -> int:
    return min(length, limit) if isinstance(limit, int) else int(length * limit)


def expected_validations(flags: dict[str, Any], batches: int, epoch: int) -> list[int]:
    """The ``batch_idx`` after which Lightning's documented rule validates in ``epoch`` of ``batches`` steps."""
    every = flags.get("check_val_every_n_epoch", 1)
    if (epoch + 1) % every:
        return []
    interval = flags.get("val_check_interval", 1.0)
    check = interval if isinstance(interval, int) else max(1, int(batches * interval))
    return [b for b in range(batches) if (b + 1) % check == 0]


def check_clock(run: dict[str, Any], *, start: tuple[int, int] = (0, 0)) -> None:
    """Every clock invariant of one run on every rank (``start``: the epoch and batch a resume starts at)."""
    config, world, ranks = run["config"], run["world"], run["ranks"]
    flags = config["trainer"]
    name = config["name"]
    # Invariant: every rank ran the same steps and validations, in the same order
    shapes = [[(e["ev"], e.get("epoch"), e.get("batch_idx")) for e in r if e["ev"] in ("step", "val")] for r in ranks]
    assert all(s == shapes[0] for s in shapes), f"{name}: ranks differ"
    record = ranks[0]
    for begin in events(record, "epoch_start"):
        epoch = begin["epoch"]
        natural = steps_per_epoch(config, world, epoch)
        if epoch == start[0] and start[1]:  # the resumed epoch: what ran before, then the rest
            natural = begin["loader_len"]
        # Invariant: the trainer's length, len(loader) and the progress bar's total are the plan's steps
        batches = limited(natural, flags.get("limit_train_batches", 1.0))
        assert begin["loader_len"] == natural, f"{name} epoch {epoch}"
        assert begin["num_training_batches"] == batches, f"{name} epoch {epoch}"
        steps = [e for e in events(record, "step") if e["epoch"] == epoch]
        first = start[1] if epoch == start[0] else 0
        # Invariant: the epoch ran every one of its steps, in order (the resumed epoch: from where it stopped)
        if "max_steps" not in flags:
            assert [e["batch_idx"] for e in steps] == list(range(first, batches)), f"{name} epoch {epoch}"
        bar = batches  # the progress bar's total: the epoch's batches, or the steps max_steps leaves
        if "max_steps" in flags and steps:
            bar = min(batches, flags["max_steps"] - steps[0]["global_step"])
        assert all(e.get("bar_total", bar) == bar for e in steps), f"{name} epoch {epoch}: progress bar"
        # Invariant: validation ran where Lightning's rule puts it, never elsewhere
        vals = [e for e in record if e["ev"] in ("step", "val") and e["epoch"] == epoch]
        after = [vals[i - 1]["batch_idx"] for i, e in enumerate(vals) if e["ev"] == "val" and i > 0]
        expected = [
            b for b in expected_validations(flags, batches, epoch) if b >= first and b <= steps[-1]["batch_idx"]
        ]
        assert after == expected, f"{name} epoch {epoch}: validated after {after}, expected {expected}"
        if expected and expected[-1] == batches - 1:  # the end-of-epoch validation saw the epoch's final model
            end = next(e for e in events(record, "epoch_end") if e["epoch"] == epoch)
            assert [e for e in vals if e["ev"] == "val"][-1]["params"] == end["params"], f"{name} epoch {epoch}"


def samples_of(config: dict[str, Any]) -> dict[int, int]:
    data = shardload.open(config["train"])
    return {i: int(n) for i, n in enumerate(data.plan_inputs().lengths)}


def docs_by_epoch(records: list[list[dict[str, Any]]]) -> dict[int, Counter[int]]:
    """Tokens served per sample id, per epoch, over all ranks (pieces of a cut sample add up)."""
    out: dict[int, Counter[int]] = defaultdict(Counter)
    for record in records:
        for e in events(record, "step"):
            for sample, tokens in e["docs"]:
                out[e["epoch"]][sample] += tokens
    return out


def val_loss(model_path: Path, val: str) -> tuple[float, float]:
    """The validation sums recomputed in one process, padded batches."""
    model = ClockModel([], False)
    model.load_state_dict(torch.load(model_path))
    total = count = 0.0
    with torch.no_grad():
        for batch in shardload.make_loader(val, rank=0, world_size=1, stage="val", batch_size=8, num_workers=0):
            s, c = model.token_loss(batch)
            total, count = total + float(s), count + float(c)
    return total, count


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("world", [3, 2])
def test_every_epoch_has_the_plans_length_and_validates_after_its_last_step(
    clock: dict[str, Any], mode: str, world: int
) -> None:
    run = clock["runs"][f"{mode}{world}"]
    check_clock(run)
    config = run["config"]
    # the set is one whose natural batch count varies from epoch to epoch (a fixed batch_size: it cannot)
    natural = {steps_per_epoch(config, world, e, steady=False) for e in range(EPOCHS)}
    if mode != "fixed":
        assert len(natural) > 1 or mode == "packing", natural
    # Invariant: one length for every epoch (an epoch whose first draw needs more steps is drawn again)
    lengths = {e["loader_len"] for e in events(run["ranks"][0], "epoch_start")}
    assert len(lengths) == 1
    # Invariant: one validation per epoch, each of the epoch's final model
    assert len(events(run["ranks"][0], "val")) == EPOCHS
    # Invariant: the stepping estimate is the optimizer steps taken
    estimate = events(run["ranks"][0], "estimate")[0]["value"]
    assert estimate == run["ranks"][0][-1]["global_step"] == EPOCHS * min(lengths)


@pytest.mark.parametrize("mode", ["fixed", "tokens", "buckets", "packing"])
def test_every_sample_is_trained_once_per_epoch(clock: dict[str, Any], mode: str) -> None:
    for world in (3, 2):
        run = clock["runs"][f"{mode}{world}"]
        want = samples_of(run["config"])
        served = docs_by_epoch(run["ranks"])
        assert sorted(served) == list(range(EPOCHS))
        for epoch, tokens in served.items():
            assert dict(tokens) == want, f"{mode} on {world} ranks, epoch {epoch}"


@pytest.mark.parametrize("mode", list(MODES))
def test_the_logged_validation_loss_is_the_exact_loss_of_the_validated_model(clock: dict[str, Any], mode: str) -> None:
    run = clock["runs"][f"{mode}3"]
    vals = events(run["ranks"][0], "val")
    out = Path(run["config"]["val"]).parent / "new"
    for val in (vals[0], vals[-1]):
        exact = val_loss(out / f"{run['config']['name']}_val{val['k']}.pt", run["config"]["val"])
        logged = val["logged"]
        summed = np.sum([events(r, "val")[val["k"]]["mine"] for r in run["ranks"]], axis=0)
        assert math.isclose(logged[1], exact[1]) and math.isclose(summed[1], exact[1])
        assert math.isclose(logged[0], exact[0], rel_tol=1e-5) and math.isclose(summed[0], exact[0], rel_tol=1e-5)


@pytest.mark.parametrize("name", list(FLAGS))
def test_trainer_flags_that_read_the_epochs_length(clock: dict[str, Any], name: str) -> None:
    run = clock["runs"][name]
    check_clock(run)
    record, flags = run["ranks"][0], run["config"]["trainer"]
    estimate, final = events(record, "estimate")[0]["value"], record[-1]["global_step"]
    if "max_steps" in flags:
        assert estimate == final == flags["max_steps"]
        return
    length = limited(steps_per_epoch(run["config"], 3, 0), flags.get("limit_train_batches", 1.0))
    optimizer_steps = math.ceil(length / flags.get("accumulate_grad_batches", 1)) * flags["max_epochs"]
    # Invariant: the stepping estimate is the optimizer steps taken (a OneCycleLR over it ran to its last step)
    assert estimate == final == optimizer_steps


def resume_start(part: dict[str, Any], resumed: dict[str, Any]) -> tuple[tuple[int, int], dict[int, Counter[int]]]:
    """Where the resumed run started, and the documents of the two runs as one run's.

    A checkpoint saved in ``on_train_batch_end`` counts that step as finished in Lightning with restart stages
    (2.6) and not in 2.2, which runs it again on resume: the loader follows the trainer's count either way, so
    the part's steps from the resumed start on are the ones the resumed run replaces.
    """
    steps = [e["batch_idx"] for e in events(part["ranks"][0], "step") if e["epoch"] == STOP[0]]
    assert steps == list(range(STOP[1] + 1))  # the first run stopped where it was told
    first = next(e["batch_idx"] for e in events(resumed["ranks"][0], "step"))
    assert first in (STOP[1], STOP[1] + 1)
    kept = [
        [e for e in r if e["ev"] != "step" or e["epoch"] != STOP[0] or e["batch_idx"] < first] for r in part["ranks"]
    ]
    return (STOP[0], first), docs_by_epoch(kept + resumed["ranks"])


def test_a_mid_epoch_resume_keeps_the_clock_and_serves_the_epoch_once(clock: dict[str, Any]) -> None:
    check_resume(clock["runs"]["part3"], clock["runs"]["resumed3"])


def check_resume(part: dict[str, Any], resumed: dict[str, Any]) -> None:
    start, both = resume_start(part, resumed)
    check_clock(resumed, start=start)
    assert dict(both[STOP[0]]) == samples_of(resumed["config"])
    # Invariant: the stepping estimate of the resumed run is the optimizer steps of the whole run (Lightning
    # 2.2 steps once more: it runs the checkpoint's last step again)
    length = steps_per_epoch(resumed["config"], 3, 0)
    assert events(resumed["ranks"][0], "estimate")[0]["value"] == EPOCHS * length
    assert resumed["ranks"][0][-1]["global_step"] == EPOCHS * length + (start[1] == STOP[1])


def test_an_elastic_resume_validates_after_the_last_step_of_every_epoch(clock: dict[str, Any]) -> None:
    part, elastic = clock["runs"]["part3"], clock["runs"]["elastic2"]
    start, both = resume_start(part, elastic)
    check_clock(elastic, start=start)
    starts = {e["epoch"]: e["num_training_batches"] for e in events(elastic["ranks"][0], "epoch_start")}
    # the later epochs have the new world size's steps, whatever the resumed one had
    assert all(starts[e] == steps_per_epoch(elastic["config"], 2, e) for e in range(STOP[0] + 1, EPOCHS))
    assert dict(both[STOP[0]]) == samples_of(elastic["config"])
    assert len(events(elastic["ranks"][0], "val")) == EPOCHS - STOP[0]


def test_an_elastic_resume_from_the_last_step_of_an_epoch_runs_the_next_epochs_whole(clock: dict[str, Any]) -> None:
    # 3 -> 2 ranks: the next epoch is longer than the one the checkpoint ended. Lightning restores its step count
    # of the old epoch, compares it with the length it has, and iterates the loader it set up before the restore.
    check_end_of_epoch_resume(clock["runs"]["end3"], clock["runs"]["endelastic2"])


def test_an_elastic_resume_from_the_last_step_a_limit_leaves_runs_the_next_epochs_limited(
    clock: dict[str, Any],
) -> None:
    # limit_train_batches=0.5: the old epoch ended at half its plan's batches, which Lightning counts as its end
    check_end_of_epoch_resume(clock["runs"]["endhalf3"], clock["runs"]["endhalfelastic2"])


def check_end_of_epoch_resume(part: dict[str, Any], resumed: dict[str, Any]) -> None:
    length = {w: steps_per_epoch(part["config"], w, END[0] + 1) for w in (3, resumed["world"])}
    assert length[resumed["world"]] != length[3]  # the epochs of the new world size have another length
    steps = [e["batch_idx"] for e in events(part["ranks"][0], "step") if e["epoch"] == END[0]]
    first = next(e for e in events(resumed["ranks"][0], "step"))
    if (first["epoch"], first["batch_idx"]) == (END[0] + 1, 0):  # the restore counts the last step done
        check_clock(resumed, start=(END[0] + 1, 0))
        served = docs_by_epoch(resumed["ranks"])
    else:  # Lightning 2.2 runs the last step again: a resume within the epoch
        assert (first["epoch"], first["batch_idx"]) == (END[0], steps[-1])
        check_clock(resumed, start=(END[0], steps[-1]))
        kept = [
            [e for e in r if e["ev"] != "step" or e["epoch"] != END[0] or e["batch_idx"] < steps[-1]]
            for r in part["ranks"]
        ]
        served = docs_by_epoch(kept + resumed["ranks"])
    # Invariant: every later epoch whole (every sample once; under a limit, each at most once), validated after
    # its last step (check_clock: every step the limit leaves, in order)
    samples = samples_of(resumed["config"])
    for epoch in range(first["epoch"], EPOCHS):
        if "limit_train_batches" in resumed["config"]["trainer"]:
            assert set(served[epoch]) < set(samples) and all(served[epoch][i] == samples[i] for i in served[epoch])
        else:
            assert dict(served[epoch]) == samples, f"epoch {epoch}"
    vals = {e["epoch"] for e in events(resumed["ranks"][0], "val")}
    assert set(range(END[0] + 1, EPOCHS)) <= vals


def test_the_oldest_supported_lightning_keeps_the_clock(tmp_path: Path, clock: dict[str, Any]) -> None:
    assert (OLDEST / "lightning").is_dir(), f"{OLDEST} is missing: run tools/setup_env.sh"
    names = {"tokens3", "packing3", "quarter", "accum3", "limithalf", "part3", "resumed3", "end3", "endhalf3"}
    runs = run_job(tmp_path, clock["sets"], 3, OLDEST, names)
    for name in ("tokens3", "packing3", "quarter", "accum3", "limithalf"):
        check_clock(runs[name])
    check_resume(runs["part3"], runs["resumed3"])
    runs |= run_job(tmp_path, clock["sets"], 2, OLDEST, {"endelastic2", "endhalfelastic2"})
    check_end_of_epoch_resume(runs["end3"], runs["endelastic2"])
    check_end_of_epoch_resume(runs["endhalf3"], runs["endhalfelastic2"])
