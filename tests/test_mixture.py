"""Mixtures on the data side: real shard sets read as one, batch["source"], resume, refusals."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

import shardload
from shardload import Batching, Mixture, MixtureError, ShardDataModule, make_loader
from shardload.errors import PlanError, PlanMismatchError
from shardload.testing import synthetic_samples

from .helpers.resume import assert_resumes_identically, batch_ids
from .test_datamodule import trainer as lightning

pytestmark = pytest.mark.filterwarnings("ignore:.*does not have many workers")


def token_samples(n: int, seed: int, longest: int = 300) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"tokens": rng.integers(0, 100, k).astype(np.int32)} for k in rng.integers(1, longest, n)]


@pytest.fixture
def sets(tmp_path: Path) -> dict[str, Path]:
    out = {"web": tmp_path / "web", "code": tmp_path / "code", "math": tmp_path / "math"}
    shardload.write(synthetic_samples(150, seed=1), out["web"], num_shards=5, progress=False)
    shardload.write(synthetic_samples(40, seed=2, median_tokens=60), out["code"], num_shards=2, progress=False)
    shardload.write(synthetic_samples(3, seed=3), out["math"], num_shards=1, progress=False)
    return out


@pytest.fixture
def token_sets(tmp_path: Path) -> dict[str, Path]:
    out = {"web": tmp_path / "tweb", "code": tmp_path / "tcode"}
    shardload.write(token_samples(120, 1), out["web"], num_shards=4, progress=False)
    shardload.write(token_samples(30, 2, longest=500), out["code"], num_shards=2, progress=False)
    return out


def all_batches(mix: object, *, world: int, **kw: object) -> list[list[dict[str, torch.Tensor]]]:
    return [list(make_loader(mix, rank=r, world_size=world, **kw)) for r in range(world)]  # type: ignore[arg-type]


def test_evaluation_reads_every_sample_of_every_source_once_with_its_source(sets: dict[str, Path]) -> None:
    mix = Mixture({k: str(v) for k, v in sets.items()}, weights={"web": 1, "code": 5, "math": 2})
    opened = {name: shardload.open(path) for name, path in sets.items()}
    offsets = np.cumsum([0] + [len(s) for s in opened.values()])
    per_rank = all_batches(mix, world=4, stage="val", max_tokens=256)
    assert len({len(b) for b in per_rank}) == 1  # equal steps
    seen = []
    for batches in per_rank:
        for batch in batches:
            real = batch["weight"] > 0
            ids, source = batch["sample_id"].numpy(), batch["source"].numpy()
            assert batch["source"].dtype == torch.int64 and len(source) == len(ids)
            assert (source == np.searchsorted(offsets, ids, side="right") - 1).all()
            for row in np.flatnonzero(real.numpy()):
                k = int(source[row])
                name = mix.names[k]
                sample = opened[name][int(ids[row] - offsets[k])]
                n = int(batch["tokens_lengths"][row])
                assert np.array_equal(batch["tokens"][row, :n].numpy(), sample["tokens"])
            seen.extend(ids[real.numpy()].tolist())
    assert sorted(seen) == list(range(int(offsets[-1])))


def test_training_gives_each_source_its_weight_of_tokens(token_sets: dict[str, Path]) -> None:
    mix = Mixture({k: str(v) for k, v in token_sets.items()}, weights={"web": 0.5, "code": 0.5})
    per_rank = all_batches(mix, world=2, max_tokens=1024, seed=3)
    assert len(per_rank[0]) == len(per_rank[1])
    tokens = np.zeros(2)
    for batches in per_rank:
        for batch in batches:
            w = batch["weight"] > 0
            np.add.at(tokens, batch["source"][w].numpy(), batch["tokens_lengths"][w].numpy())
    share = tokens / tokens.sum()
    assert abs(share[0] - 0.5) < 0.02, share


def test_packed_mixture_batches_name_the_source_of_each_document(token_sets: dict[str, Path]) -> None:
    mix = Mixture({k: str(v) for k, v in token_sets.items()})
    batching = Batching(packing=True, pack_length=512, rows_per_batch=2)
    per_rank = all_batches(mix, world=2, stage="val", batching=batching)
    seen = []
    for batches in per_rank:
        for batch in batches:
            assert batch["tokens"].shape == (2, 512)
            assert len(batch["source"]) == len(batch["sample_id"])
            seen.extend(batch["sample_id"][batch["weight"] > 0].tolist())
    assert sorted(seen) == list(range(150))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mixture_resumes_mid_epoch_whatever_num_workers(token_sets: dict[str, Path], workers: int) -> None:
    mix = Mixture({k: str(v) for k, v in token_sets.items()}, weights={"web": 1, "code": 2})

    def make(num_workers: int = workers) -> shardload.ShardLoader:
        loader = make_loader(mix, rank=1, world_size=2, max_tokens=1024, num_workers=num_workers, seed=4)
        loader.set_epoch(2)
        return loader

    assert_resumes_identically(make, stop_after=3)
    # a state taken with 2 workers resumes with 0 and the reverse
    first = make(2 - workers)
    it = iter(first)
    next(it)
    state = first.state_dict()
    again = make()
    again.load_state_dict(state)
    assert batch_ids(again) == batch_ids(make())[1:]


def test_resume_against_another_mixture_is_refused(token_sets: dict[str, Path]) -> None:
    paths = {k: str(v) for k, v in token_sets.items()}
    a = make_loader(Mixture(paths, weights={"web": 1, "code": 2}), rank=0, world_size=2, max_tokens=1024)
    state = a.state_dict()
    for other in (
        Mixture(paths, weights={"web": 1, "code": 3}),
        Mixture(paths, weights={"web": 1, "code": 2}, epoch_tokens=5000),
        Mixture({"code": paths["code"], "web": paths["web"]}, weights={"web": 1, "code": 2}),
    ):
        b = make_loader(other, rank=0, world_size=2, max_tokens=1024)
        with pytest.raises(PlanMismatchError):
            b.load_state_dict(state)


def test_sources_with_different_fields_are_refused_naming_them(tmp_path: Path, sets: dict[str, Path]) -> None:
    other = [{**s, "tokens": s["tokens"].astype(np.int64)} for s in synthetic_samples(10, seed=4)]
    shardload.write(other, tmp_path / "wide", num_shards=1, progress=False)
    mix = Mixture({"web": sets["web"], "wide": tmp_path / "wide"})
    with pytest.raises(MixtureError, match=r"field 'tokens' differs between sources 'web' and 'wide': dtype int32"):
        make_loader(mix, rank=0, world_size=1, batch_size=4)
    # the fields they share can be loaded
    loader = make_loader(mix, rank=0, world_size=1, batch_size=4, fields=("features", "label"), stage="val")
    assert sum(len(b["sample_id"]) for b in loader) == 160
    shardload.write(
        [{"tokens": s["tokens"]} for s in synthetic_samples(5)], tmp_path / "few", num_shards=1, progress=False
    )
    with pytest.raises(MixtureError, match="different fields"):
        make_loader(Mixture({"web": sets["web"], "few": tmp_path / "few"}), rank=0, world_size=1, batch_size=4)
    named = [{"tokens": s["tokens"], "source": np.asarray(1)} for s in synthetic_samples(5)]
    shardload.write(named, tmp_path / "named", num_shards=1, progress=False)
    with pytest.raises(MixtureError, match="field named 'source'"):
        make_loader(Mixture({"a": tmp_path / "named"}), rank=0, world_size=1, batch_size=4)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sources": {}}, "non-empty dict"),
        ({"sources": {"a": 3}}, "must be a shard set directory"),
        ({"sources": {"a": "x", "b": "./x"}}, "'a' and 'b' are the same shard set"),
        ({"sources": {"a": "x"}, "weights": {"b": 1}}, "not a source"),
        ({"sources": {"a": "x"}, "by": "bytes"}, "by='bytes'"),
        (
            {"sources": {"a": "x"}, "by": "samples", "epoch_tokens": 10},
            r"epoch_tokens=\.\.\.\) does not fit by='samples'",
        ),
        ({"sources": {"a": "x"}, "max_repeats": 0}, "max_repeats"),
        ({"sources": {"a": "x"}, "epoch_tokens": -1}, "epoch_tokens"),
    ],
)
def test_misuse_of_a_mixture_is_refused_when_it_is_made(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(PlanError, match=match):
        Mixture(**kwargs)  # type: ignore[arg-type]


def test_a_path_that_is_not_a_set_or_mixture_is_refused() -> None:
    with pytest.raises(PlanError, match="a shardload.Mixture, or a dict"):
        make_loader(3, rank=0, world_size=1, batch_size=2)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="val must be"):
        ShardDataModule(val=3.5)  # type: ignore[arg-type]


class SourceModel(pl.LightningModule):
    """Logs one exact loss per validation source; records the training batches."""

    def __init__(self, names: tuple[str, ...]) -> None:
        super().__init__()
        self.names = names
        self.lin = torch.nn.Linear(4, 1)
        self.train_ids: list[list[int]] = []

    def per_sample(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        rows = batch["features_lengths"].clamp(min=1).unsqueeze(-1).float()
        return (self.lin(batch["features"].sum(1) / rows).squeeze(-1) - batch["label"].float()) ** 2

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.train_ids.append(batch["sample_id"].tolist())
        w = batch["weight"]
        return (self.per_sample(batch) * w).sum() / w.sum().clamp(min=1)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        loss, w = self.per_sample(batch), batch["weight"]
        for k, name in enumerate(self.names):
            mine = w * (batch["source"] == k)
            self.log(f"{name}_sum", (loss * mine).sum(), reduce_fx="sum", sync_dist=True, on_epoch=True)
            self.log(f"{name}_count", mine.sum(), reduce_fx="sum", sync_dist=True, on_epoch=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_datamodule_validates_a_dict_of_sets_exactly_per_source(tmp_path: Path, sets: dict[str, Path]) -> None:
    val = {"code": sets["code"], "math": sets["math"]}
    dm = ShardDataModule(train=Mixture({"web": sets["web"], "code": sets["code"]}), val=val, batch_size=8)
    model = SourceModel(("code", "math"))
    t = lightning(tmp_path, max_epochs=1, enable_checkpointing=False, limit_train_batches=2)
    t.fit(model, datamodule=dm)
    for name in ("code", "math"):
        ds = shardload.open(sets[name])
        with torch.no_grad():
            exact = [
                float(
                    (model.lin(torch.from_numpy(np.array(ds[i]["features"])).mean(0)).squeeze() - float(ds[i]["label"]))
                    ** 2
                )
                for i in range(len(ds))
            ]
        assert float(t.callback_metrics[f"{name}_count"]) == len(ds)
        assert abs(float(t.callback_metrics[f"{name}_sum"]) - sum(exact)) < 1e-4


def test_a_mixture_resumes_through_a_lightning_checkpoint(tmp_path: Path, token_sets: dict[str, Path]) -> None:
    mix = Mixture({k: str(v) for k, v in token_sets.items()}, weights={"web": 1, "code": 1})

    class TokenModel(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(1, 1)
            self.train_ids: list[list[int]] = []

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            self.train_ids.append(batch["sample_id"].tolist())
            return self.lin(batch["tokens_lengths"].float()[:, None]).mean() * 0

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    cb = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1)
    full = TokenModel()
    lightning(tmp_path, max_epochs=2, callbacks=[cb]).fit(
        full, datamodule=ShardDataModule(train=mix, max_tokens=1024, num_workers=2, seed=5)
    )
    per_epoch = len(full.train_ids) // 2
    step = per_epoch + 3 - (per_epoch % 3) if per_epoch % 3 else per_epoch + 3
    ckpt = tmp_path / "ckpt" / f"epoch=1-step={step}.ckpt"
    assert ckpt.exists(), sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    resumed = TokenModel()
    lightning(tmp_path, max_epochs=2).fit(
        resumed, datamodule=ShardDataModule(train=mix, max_tokens=1024, num_workers=0, seed=5), ckpt_path=ckpt
    )
    assert resumed.train_ids == full.train_ids[step:]
