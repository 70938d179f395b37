"""``examples/text_lm.py`` end to end, run as a user runs it: two real Lightning DDP jobs on CPU under the watchdog.

The first job (2 gloo ranks) makes two JSON Lines corpora and a BPE
tokenizer, prepares a train and a val set of each with the configured map of
``examples/tokenize_map.py`` and 2 workers, trains on a 0.7 / 0.3 mixture of
packed batches and stops after step 4 with a checkpoint; the second resumes
it on 3 ranks and finishes both epochs. The checks read what every rank
recorded, not only the exit codes: each source's validation loss as the DDP
job reduced and logged it equals the one computed here, in one process, from
the saved weights and each validation document run alone; every training
document of the interrupted epoch is seen exactly once across the two jobs,
and the epoch is the one an uninterrupted run would have served.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import shardload
from tests.distributed.watchdog import Outcome, python, run_with_watchdog
from tests.test_examples import EXAMPLES, finished, load_example

pytestmark = pytest.mark.slow
STOP_STEP = 4


def run_example(*args: str) -> Outcome:
    return run_with_watchdog(
        python(str(EXAMPLES / "text_lm.py"), "--accelerator", "cpu", "--strategy", "ddp", *args), timeout=240
    )


def rank_records(out: Path, world: int) -> list[dict[str, Any]]:
    """What each rank wrote; a rank that died before the end (exit 0 or not) has no file, and fails here."""
    missing = [r for r in range(world) if not (out / f"rank{r}.json").exists()]
    assert not missing, f"ranks {missing} of {world} wrote no record in {out}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def documents(records: list[dict[str, Any]], epoch: int) -> Counter[tuple[int, int, int]]:
    """The real training documents ``(sample_id, source, tokens)`` the ranks saw in ``epoch``, with multiplicity."""
    return Counter(tuple(d) for r in records for batch in r["trained"].get(str(epoch), []) for d in batch)


def uninterrupted(mixture: shardload.Mixture, batching: shardload.Batching, world: int, epoch: int) -> Counter[Any]:
    """The documents an uninterrupted ``world``-rank run serves in ``epoch``, each rank's loader built here."""
    docs: Counter[tuple[int, int, int]] = Counter()
    for rank in range(world):
        loader = shardload.make_loader(
            mixture, rank=rank, world_size=world, seed=0, epoch=epoch, batching=batching, num_workers=0
        )
        for batch in loader:
            real = batch["weight"] > 0
            ids, source = batch["sample_id"][real].tolist(), batch["source"][real].tolist()
            docs.update(zip(ids, source, batch["input_ids_lengths"][real].tolist()))
    return docs


def one_process_losses(lm: torch.nn.Module, val_sets: dict[str, str]) -> dict[str, tuple[float, int, int]]:
    """Per source: the mean next-token loss over every validation document, each run alone; documents; tokens."""
    out = {}
    lm.eval()
    with torch.no_grad():
        for name, path in val_sets.items():
            val = shardload.open(path)
            total, tokens = 0.0, 0
            for i in range(len(val)):
                ids = torch.from_numpy(val[i]["input_ids"].astype("int64"))[None]  # [1, L]: one document
                n = ids.shape[1]
                alone = {"input_ids": ids, "position_ids": torch.arange(n)[None], "document_ids": torch.zeros_like(ids)}
                logits = lm.logits(alone)  # type: ignore[operator]
                total += float(F.cross_entropy(logits[0, :-1].double(), ids[0, 1:], reduction="sum"))
                tokens += n - 1
            out[name] = (total / tokens, len(val), tokens)
    return out


def test_text_lm_exact_per_source_loss_and_every_document_once_across_an_elastic_resume(tmp_path: Path) -> None:
    work, part, rest = tmp_path / "work", tmp_path / "part", tmp_path / "rest"
    common = ["--workdir", str(work)]
    first = run_example(*common, "--devices", "2", "--out", str(part), "--stop-at-step", str(STOP_STEP))
    r1 = finished(first)
    assert (part / "interrupted.ckpt").exists(), first.tail()
    # the resumed job changes the loader's worker count too: only the ranks' share of the epoch matters
    second = run_example(
        *common, "--devices", "3", "--out", str(rest), "--resume", str(part / "interrupted.ckpt"), "--num-workers", "0"
    )
    r2 = finished(second)
    assert (r1["world_size"], r1["global_step"], r2["world_size"]) == (2, STOP_STEP, 3)
    assert "Restored all states from the checkpoint" in second.output, second.tail()
    text_lm, tokenize_map = load_example("text_lm"), load_example("tokenize_map")

    # Prepared with the configured map: the factory, its arguments and the tokenizer's sha256 are recorded
    sets = r2["sets"]
    tokenizer = Path(r2["tokenizer"])
    for split, by_name in sets.items():
        for path in by_name.values():
            options = shardload.open(path).manifest.options
            assert options["map_factory"]["function"] == "tokenize_map:make_encoder"
            assert options["map_args"] == {"max_tokens": 128, "split": split, "val_percent": 15}
            assert options["map_files"]["tokenizer"]["sha256"] == hashlib.sha256(tokenizer.read_bytes()).hexdigest()
    # ... and long records were cut into pieces of at most 128 tokens: more samples than records kept
    for name, path in sets["train"].items():
        records = [json.loads(line)["text"] for line in (work / f"{name}-160.jsonl").open()]
        kept = [t for t in records if t.strip() and not tokenize_map.in_validation(t, 15)]
        train = shardload.open(path)
        assert len(train) > len(kept) and int(train.lengths.max()) == 128

    # Exact per-source validation: every rank reduced the same float64 means, Lightning logged them, and they
    # equal the loss of the saved weights over every validation document run alone, in this one process
    records = rank_records(rest, 3)
    assert all(r["val"] == records[0]["val"] for r in records)
    lm = text_lm.TinyCausalLM(**r2["model"])
    lm.load_state_dict(torch.load(rest / "model.pt"))
    for name, (loss, docs, tokens) in one_process_losses(lm, sets["val"]).items():
        assert r2["val"][f"val_documents/{name}"] == docs > 0
        assert r2["val"][f"val_tokens/{name}"] == tokens
        assert r2["val"][f"val_loss/{name}"] == pytest.approx(loss, rel=1e-6), name
        assert r2["logged"][f"val_loss/{name}"] == pytest.approx(loss, rel=1e-6), name
    assert r2["val"]["val_loss/web"] != r2["val"]["val_loss/code"]
    # the resumed job kept training: its loss is below the interrupted job's, which is below uniform
    assert r2["val"]["val_loss"] < r1["val"]["val_loss"] < math.log(r2["model"]["vocab"])

    # Elastic resume: each of the 2 ranks ran STOP_STEP steps of epoch 0; the 3 resumed ranks equal counts
    before = rank_records(part, 2)
    assert [len(r["trained"]["0"]) for r in before] == [STOP_STEP] * 2
    assert len({len(r["trained"]["0"]) for r in records}) == 1 and len(records[0]["trained"]["0"]) > 0
    mixture = text_lm.training_mixture({k: Path(v) for k, v in sets["train"].items()}, r2["weights"])
    batching = shardload.Batching(packing=True, pack_length=128, rows_per_batch=4)
    seen = documents(before, 0) + documents(records, 0)
    # Invariant: across both jobs, every training document of the interrupted epoch exactly once ...
    assert set(seen.values()) == {1}
    # ... and exactly the documents an uninterrupted 2-rank epoch serves (the mixture's selection)
    assert seen == uninterrupted(mixture, batching, 2, 0)
    # ... of both sources, about 0.7 / 0.3 of the tokens
    share = sum(n for (_, source, n) in seen if source == 0) / sum(n for (_, _, n) in seen)
    assert abs(share - 0.7) < 0.05
    # the next epoch is a whole epoch on the 3 new ranks
    assert documents(records, 1) == uninterrupted(mixture, batching, 3, 1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--val-percent", "0"], "--val-percent"),
        (["--val-percent", "100"], "--val-percent"),
        (["--pack-length", "0"], "--pack-length"),
        (["--records", "0"], "--records"),
        (["--rows-per-batch", "-1"], "--rows-per-batch"),
        (["--weights", "web,code"], "--weights"),
        (["--weights=-1,2"], "--weights"),
        (["--devices", "two"], "--devices"),
        (["--stop-at-step", "0"], "--stop-at-step"),
        (["--resume", "no-such.ckpt"], "--resume"),
        (["--records", "1"], "no record for"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_odd_arguments_are_refused_by_name_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    text_lm = load_example("text_lm")
    work = ["--workdir", str(tmp_path / "w"), "--out", str(tmp_path / "o"), "--prepare-workers", "1"]
    with pytest.raises(SystemExit) as exit_:
        text_lm.main([*work, *args])
    err = capsys.readouterr().err
    # Invariant: a usage error (exit 2) that names the option, never a traceback from prepare or the trainer
    assert exit_.value.code == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "w" / "sets").exists() or args == ["--records", "1"]
