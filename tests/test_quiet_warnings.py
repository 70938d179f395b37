"""A default Lightning fit over a ShardDataModule prints no warning the user did not cause.

Run in a fresh interpreter with Python's default warning filters (a user's -W or PYTHONWARNINGS comes
first and wins), since which warnings print is a fact about a whole process (pytest installs filters of
its own).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import shardload
from shardload.testing import synthetic_samples
from tests.distributed.watchdog import python, run_with_watchdog

pytestmark = pytest.mark.slow

#: the module both fits train (no braces: it goes into the templates below through format)
MODEL = """
    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch, i):
            return self.layer(batch["features"].float().mean(dim=(1, 2)).unsqueeze(1)).sum()

        def validation_step(self, batch, i):
            self.log("val", self.layer(batch["features"].float().mean(dim=(1, 2)).unsqueeze(1)).sum(), sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)
"""

FIT = """
    import sys, warnings
    import lightning.pytorch as pl, torch
    from lightning.pytorch.utilities._pytree import _tree_flatten
    from shardload import ShardDataModule

    # control: with the pinned torch and Lightning, Lightning's own code warns (if this stops, drop the filter)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _tree_flatten(torch.zeros(1))
    print("CONTROL", any("LeafSpec" in str(w.message) for w in seen), flush=True)

{model}
    warnings.filterwarnings("ignore", ".*does not have many workers.*")  # advice to the test's own setup
    dm = ShardDataModule(train={train!r}, val={val!r}, batch_size=4)
    pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    ).fit(Model(), dm)
    print("FIT DONE", flush=True)
"""


def test_a_default_fit_prints_no_lightning_deprecation_of_torch(tmp_path: Path) -> None:
    shardload.write(synthetic_samples(24, seed=1), tmp_path / "train", num_shards=2)
    shardload.write(synthetic_samples(9, seed=2), tmp_path / "val", num_shards=2)
    code = textwrap.dedent(FIT.format(model=MODEL, train=str(tmp_path / "train"), val=str(tmp_path / "val")))
    res = run_with_watchdog(python("-c", code), timeout=240)
    assert not res.hung and res.returncode == 0, res.tail()
    assert "CONTROL True" in res.output, res.tail()
    assert "FIT DONE" in res.output, res.tail()
    fit_output = res.output.split("CONTROL True", 1)[1]
    assert "LeafSpec" not in fit_output, fit_output[-3000:]
    assert "Warning" not in fit_output, fit_output[-3000:]


DDP_FIT = """
    import sys, warnings
    import lightning.pytorch as pl, torch
    from lightning.fabric.utilities.distributed import _all_gather_ddp_if_available
    from lightning.pytorch.loggers import CSVLogger
    from shardload import ShardDataModule

{model}
    class Gathering(Model):
        def on_train_end(self):
            # control: with the pinned torch and Lightning, Lightning's gather warns (if this stops, drop the filter)
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                _all_gather_ddp_if_available(torch.zeros(1))
            warned = any("all_gather is deprecated" in str(w.message) for w in seen)
            open({logs!r} + f"/control-{{self.global_rank}}", "w").write(str(warned))  # (the ranks' prints interleave)

    warnings.filterwarnings("ignore", ".*does not have many workers.*")  # advice to the test's own setup
    dm = ShardDataModule(train={train!r}, val={val!r}, batch_size=4)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=CSVLogger({logs!r}, name="", version=0),
        log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(Gathering(), dm)
    open({logs!r} + f"/done-{{trainer.global_rank}}", "w").write("FIT DONE")
"""


def test_a_two_rank_fit_that_logs_the_loader_stats_prints_no_lightning_deprecation_of_torch(tmp_path: Path) -> None:
    shardload.write(synthetic_samples(40, seed=1), tmp_path / "train", num_shards=4)
    shardload.write(synthetic_samples(9, seed=2), tmp_path / "val", num_shards=2)
    script = tmp_path / "fit.py"  # a file: Lightning starts the second rank by running the script again
    logs = tmp_path / "logs"
    logs.mkdir()
    script.write_text(
        textwrap.dedent(
            DDP_FIT.format(model=MODEL, train=str(tmp_path / "train"), val=str(tmp_path / "val"), logs=str(logs))
        )
    )
    res = run_with_watchdog(python(str(script)), timeout=240)
    assert not res.hung and res.returncode == 0, res.tail()
    for rank in (0, 1):  # every rank finished, and Lightning's gather still warns unfiltered
        assert (logs / f"done-{rank}").exists(), res.tail()
        assert (logs / f"control-{rank}").read_text() == "True"
    metrics = (logs / "version_0" / "metrics.csv").read_text()
    assert "data/wait_fraction_max" in metrics.splitlines()[0]  # the stats were gathered from both ranks
    assert "deprecated" not in res.output, res.output[-3000:]
    assert "Warning" not in res.output, res.output[-3000:]
