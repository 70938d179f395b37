"""Text to a trained language model: tokenize with a configured map, mix two corpora, pack, train with Lightning.

On a small synthetic corpus (two sources, made under ``--workdir`` on first
use), one process::

    python examples/text_lm.py --out runs/text-lm

two CPU ranks, or every GPU of the machine::

    python examples/text_lm.py --accelerator cpu --devices 2 --strategy ddp --out runs/text-lm
    python examples/text_lm.py --accelerator gpu --devices -1 --strategy ddp --out runs/text-lm

your own JSON Lines corpora (a ``"text"`` field per line) and tokenizer::

    python examples/text_lm.py --corpus web=data/web.jsonl --corpus code=data/code.jsonl \\
        --tokenizer tokenizer.json --devices 8 --out runs/text-lm

preempted mid-epoch on 2 ranks, resumed on 3 (the checkpoint holds the loader's state)::

    python examples/text_lm.py --devices 2 --strategy ddp --stop-at-step 3 --out runs/part
    python examples/text_lm.py --devices 3 --strategy ddp --resume runs/part/interrupted.ckpt --out runs/rest

What it does, in order (everything before training runs once, in the first
process; Lightning's ranks find it done):

1. **Corpora.** ``--corpus NAME=FILE`` twice (without them, ``web`` and
   ``code``, texts from two small grammars, so the two sources' losses differ).
2. **Tokenizer.** ``--tokenizer FILE``, or a byte-level BPE trained on the
   corpora with HF ``tokenizers`` (``<|endoftext|>`` ends every record).
3. **Prepare.** For each corpus, a train and a val set, each by
   ``shardload.prepare`` with the configured map of ``examples/tokenize_map.py``
   (a factory that loads the tokenizer once per worker, the tokenizer given
   as a map file so its sha256 is recorded, records longer than
   ``--pack-length`` tokens cut into pieces, a hash of the text holding out
   ``--val-percent`` of the records) and 2 workers. A set whose manifest
   records the same map, arguments and tokenizer is reused.
4. **Train.** A mixture of the train sets, 0.7 / 0.3 of the tokens
   (``--weights``), over an epoch as large as it can be with no document
   repeated (``max_repeats=1``: every training document at most once per
   epoch); packed batches of ``--rows-per-batch`` rows of ``--pack-length``
   tokens; the tiny causal LM of ``examples/packed_lm.py`` (SDPA with
   ``shardload.document_causal_mask``, positions from ``batch["position_ids"]``).
5. **Validate.** ``shardload.ExactMean`` per source (``sources=`` the val
   dict): each source's mean next-token loss over every validation document
   once, logged with ``sync_dist=True, reduce_fx="max"`` (exact: sums reduced
   over ranks, divided once).

``--out`` receives ``result.json`` (rank 0: each source's validation loss in
float64 and as Lightning logged it, documents and tokens per source, the
model's shape), ``model.pt`` (the weights that final validation used),
``rank{R}.json`` (every rank: each training batch's real documents as
``[sample_id, source, tokens]``, by epoch, and the validation means it
computed) and, with ``--stop-at-step N``, ``interrupted.ckpt``.
Under torchrun or srun, where every rank starts at once, run it once with
``--prepare-only`` first.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from common import DEFAULT_WORKDIR
from packed_lm import TinyCausalLM
from tokenize_map import END_OF_TEXT, in_validation, make_encoder

import shardload

Batch = dict[str, Any]
FIELD = "input_ids"  # what tokenize_map makes


# -- 1, 2: corpora and tokenizer ------------------------------------------------------------------------
def synthetic_text(source: str, rng: np.random.Generator) -> str:
    """One record of a source: prose from a few sentence patterns, or small Python functions."""

    def pick(words: list[str]) -> str:
        return str(rng.choice(words))

    if source == "web":
        subjects = ["the loader", "a shard", "every rank", "the planner", "each worker", "the model", "a batch"]
        verbs = ["reads", "packs", "writes", "checks", "skips", "sorts", "maps", "splits"]
        objects = ["the tokens", "a long document", "every sample", "the last row", "its own shard", "the index"]
        tails = ["", " before the epoch ends", " on every rank", " without waiting", " in one pass"]
        sentences = [
            f"{pick(subjects)} {pick(verbs)} {pick(objects)}{pick(tails)}." for _ in range(rng.integers(1, 16))
        ]
        return " ".join(s[0].upper() + s[1:] for s in sentences)
    names, args = ["load", "pack", "split", "merge", "count", "plan"], ["rows", "ids", "n", "shard", "batch"]
    bodies = ["return {a} + 1", "return len({a})", "return sorted({a})", "for i in range({a}):\n        yield i"]
    functions = []
    for _ in range(rng.integers(1, 13)):
        a = pick(args)
        functions.append(f"def {pick(names)}_{a}({a}):\n    " + pick(bodies).format(a=a) + "\n")
    return "\n".join(functions)


def synthetic_corpora(workdir: Path, records: int) -> dict[str, Path]:
    """Two JSON Lines corpora of ``records`` texts each, written once (the same on every run)."""
    corpora = {}
    for seed, source in enumerate(("web", "code")):
        path = workdir / f"{source}-{records}.jsonl"
        if not path.exists():
            rng = np.random.default_rng(seed)
            lines = (json.dumps({"text": synthetic_text(source, rng)}) + "\n" for _ in range(records))
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".partial{os.getpid()}")
            partial.write_text("".join(lines))
            partial.replace(path)  # whole or absent, for a process that looks at the same time
        corpora[source] = path
    return corpora


def train_tokenizer(corpora: dict[str, Path], path: Path, vocab_size: int) -> Path:
    """A byte-level BPE trained on every corpus, saved as ``path`` (kept if it is there)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if path.exists():
        return path
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    texts = (json.loads(line)["text"] for corpus in corpora.values() for line in corpus.open())
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=alphabet, special_tokens=[END_OF_TEXT])
    tok.train_from_iterator(texts, trainer=trainer)
    partial = path.with_suffix(f".partial{os.getpid()}")
    tok.save(str(partial))
    partial.replace(path)
    return path


# -- 3: prepare -------------------------------------------------------------------------------------------
def texts(corpus: Path) -> Iterator[str]:
    """The non-blank texts of a JSON Lines corpus, as the map sees them."""
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            try:
                text = json.loads(line).get("text") if line.strip() else None
            except (ValueError, AttributeError):
                continue  # prepare names the line
            if isinstance(text, str) and text.strip():
                yield text


def prepared_set(corpus: Path, out: Path, tokenizer: Path, map_args: dict[str, Any], workers: int) -> Path | None:
    """``corpus`` tokenized into the shard set ``out``, unless ``out`` was made with this map, arguments and file.

    ``None`` when the split would hold no record of the corpus.
    """
    if (out / "manifest.json").exists():
        recorded = shardload.open(out).manifest.options
        sha256 = hashlib.sha256(tokenizer.read_bytes()).hexdigest()
        recorded_file = recorded.get("map_files", {}).get("tokenizer", {})
        if recorded.get("map_args") == map_args and recorded_file.get("sha256") == sha256:
            return out
    if not any(in_validation(text, map_args["val_percent"]) == (map_args["split"] == "val") for text in texts(corpus)):
        return None  # the map would drop every record: nothing to prepare
    result = shardload.prepare(
        corpus,
        out,
        map_factory=make_encoder,  # called once in each worker process: one tokenizer load per worker
        map_files={"tokenizer": str(tokenizer)},  # its sha256 is recorded: --resume refuses a changed file
        map_args=map_args,
        workers=workers,
        num_shards=4,
        overwrite=out.exists(),
    )
    print(f"prepared {out}: {result.samples} samples, {result.dropped} records dropped by the map", flush=True)
    return out


def prepare_sets(corpora: dict[str, Path], args: argparse.Namespace) -> dict[str, dict[str, Path | None]]:
    """``{"train": {source: set}, "val": {source: set}}``, prepared where they are missing or out of date.

    A set is ``None`` where its split holds no record of the corpus.
    """
    sets: dict[str, dict[str, Path | None]] = {"train": {}, "val": {}}
    for name, corpus in corpora.items():
        st = corpus.stat()  # a set per corpus file (its path, size and time), so another corpus is not mistaken
        key = hashlib.sha256(f"{corpus.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
        for split in sets:
            map_args = {"max_tokens": args.pack_length, "split": split, "val_percent": args.val_percent}
            out = args.workdir / "sets" / f"{name}-{split}-{key}"
            sets[split][name] = prepared_set(corpus, out, args.tokenizer, map_args, args.prepare_workers)
    return sets


def training_mixture(train: dict[str, Path], weights: dict[str, float]) -> shardload.Mixture:
    """The train sets mixed by tokens, over the largest epoch in which no document is used twice."""
    tokens = {name: int(shardload.open(path).lengths.sum()) for name, path in train.items()}
    share = {name: w / sum(weights.values()) for name, w in weights.items()}
    # A source gets round(share * epoch_tokens) tokens in whole documents; one document less keeps it within the set.
    longest = max(int(shardload.open(path).lengths.max()) for path in train.values())
    epoch_tokens = int(min((tokens[n] - longest) / share[n] for n in train))
    return shardload.Mixture(
        {name: str(path) for name, path in train.items()},
        weights=weights,
        epoch_tokens=epoch_tokens,
        max_repeats=1,  # refused, naming the source, if the epoch would repeat a document
    )


# -- 4, 5: the model in Lightning ------------------------------------------------------------------------
class LitTextLM(pl.LightningModule):
    """The packed causal LM of ``packed_lm.py``; records what it trained on; exact per-source validation."""

    def __init__(self, vocab: int, pack_length: int, sources: list[str], lr: float = 3e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.lm = TinyCausalLM(vocab=vocab, max_length=pack_length, field=FIELD)
        self.lr = lr
        self.val_loss = shardload.ExactMean("val_loss", sources=sources)  # per predicted token
        self.val_docs = shardload.ExactMean("val_document_loss", sources=sources)  # per document: counts documents
        self.trained: dict[str, list[list[list[int]]]] = {}  # epoch -> batches -> [sample_id, source, tokens]
        self.validated: dict[str, float] = {}

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        s, c = self.lm(batch)  # per document: summed next-token losses, predicted tokens
        w = batch["weight"]  # 0.0 for filler documents
        real = w > 0
        documents = torch.stack([batch["sample_id"], batch["source"], batch[f"{FIELD}_lengths"]], 1)[real]
        self.trained.setdefault(str(self.current_epoch), []).append(documents.tolist())
        loss = (s * w).sum() / (c * w).sum().clamp(min=1)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def on_validation_epoch_start(self) -> None:
        self.val_loss.reset()  # also after the sanity check
        self.val_docs.reset()

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        s, c = self.lm(batch)
        self.val_loss.update(s, batch, counts=c)  # weighted by batch["weight"], binned by batch["source"]
        self.val_docs.update(s / c.clamp(min=1), batch)

    def on_validation_epoch_end(self) -> None:
        metrics = self.val_loss.compute() | self.val_docs.compute()  # collectives: reduced, equal on every rank
        self.validated = {k: float(v) for k, v in metrics.items()}  # float64; Lightning logs float32
        for name, tokens, docs in zip(self.val_loss.sources or (), *self._counts()):
            self.validated |= {f"val_tokens/{name}": tokens, f"val_documents/{name}": docs}
        self.log_dict(metrics, prog_bar=True, sync_dist=True, reduce_fx="max")

    def _counts(self) -> tuple[list[float], list[float]]:
        return self.val_loss.totals().counts.tolist(), self.val_docs.totals().counts.tolist()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class StopAt(pl.Callback):
    """Saves ``path`` after global step ``step`` and stops there, as a preempted job that kept its checkpoint."""

    def __init__(self, path: Path, step: int) -> None:
        self.path, self.step = path, step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)  # every rank calls it; rank 0 writes
            trainer.should_stop = True


def at_least(low: int) -> Any:
    """An argparse type: an integer of at least ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}")
        return value

    return parse


def percent(text: str) -> int:
    """An argparse type: the share held out for validation, 1 to 99 (each split needs records)."""
    value = at_least(1)(text)
    if value > 99:
        raise argparse.ArgumentTypeError(f"{value} leaves no record for training: 1 to 99")
    return value


def devices(text: str) -> int | str:
    """An argparse type: ``auto``, ``-1`` (every device) or a count."""
    if text == "auto":
        return text
    value = at_least(-1)(text)
    if value == 0:
        raise argparse.ArgumentTypeError("0 devices: a count, -1 for all, or auto")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Command-line options of this example."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", action="append", default=[], metavar="NAME=FILE", help="a JSON Lines corpus (twice)")
    p.add_argument(
        "--tokenizer", type=Path, help="a tokenizer.json with <|endoftext|> (default: a BPE trained on the corpora)"
    )
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR / "text", help="corpora, tokenizer, sets")
    p.add_argument("--out", type=Path, default=Path("text-lm-run"), help="result.json, model.pt, rank*.json")
    p.add_argument("--records", type=at_least(1), default=160, help="records per synthetic corpus")
    p.add_argument("--vocab-size", type=at_least(1), default=512, help="of the trained tokenizer")
    p.add_argument("--val-percent", type=percent, default=15, help="records held out for validation")
    p.add_argument("--prepare-workers", type=at_least(1), default=2)
    p.add_argument("--prepare-only", action="store_true", help="stop once the sets are prepared")
    p.add_argument("--weights", default="0.7,0.3", help="training shares of the corpora, by tokens")
    p.add_argument("--pack-length", type=at_least(1), default=128, help="tokens per packed row (and the longest piece)")
    p.add_argument("--rows-per-batch", type=at_least(1), default=4)
    p.add_argument("--accelerator", default="auto", help="cpu, gpu, auto")
    p.add_argument("--devices", type=devices, default="auto", help="device count, -1 for all, or auto")
    p.add_argument("--strategy", default="auto", help="ddp, auto ...")
    p.add_argument("--max-epochs", type=at_least(1), default=2)
    p.add_argument("--num-workers", type=at_least(0), default=1, help="loader workers per rank")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop-at-step", type=at_least(1), help="save OUT/interrupted.ckpt after this step and stop")
    p.add_argument("--resume", type=Path, help="a checkpoint to resume from (any --devices)")
    return p


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    if args.corpus:
        corpora = {name: Path(path) for name, _, path in (c.partition("=") for c in args.corpus)}
        if len(corpora) != len(args.corpus) or not all(name and path.is_file() for name, path in corpora.items()):
            parser.error(f"--corpus takes NAME=FILE, a file, once per distinct NAME; got {args.corpus}")
    else:
        corpora = synthetic_corpora(args.workdir, args.records)
    try:
        shares = [float(w) for w in args.weights.split(",")]
    except ValueError:
        shares = []
    if len(shares) != len(corpora) or not all(w >= 0 for w in shares) or not sum(shares) > 0:
        parser.error(f"--weights {args.weights}: one weight per corpus ({', '.join(corpora)}), >= 0, not all 0")
    if args.resume is not None and not args.resume.is_file():
        parser.error(f"--resume {args.resume}: no such checkpoint file")
    args.tokenizer = args.tokenizer or train_tokenizer(corpora, args.workdir / "tokenizer.json", args.vocab_size)
    prepared = prepare_sets(corpora, args)
    empty = [f"{name} ({split})" for split, by_name in prepared.items() for name, path in by_name.items() if not path]
    if empty:
        parser.error(
            f"no record for {', '.join(empty)}: --val-percent {args.val_percent} holds out about that share of each "
            "corpus's records, by a hash of each text; give each corpus more records, or another --val-percent"
        )
    if args.prepare_only:
        return
    sets = {split: {name: path for name, path in by_name.items() if path} for split, by_name in prepared.items()}
    weights = dict(zip(corpora, shares))

    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(args.tokenizer)).get_vocab_size()
    pl.seed_everything(args.seed, verbose=False)
    model = LitTextLM(vocab, args.pack_length, list(corpora))
    batching = shardload.Batching(packing=True, pack_length=args.pack_length, rows_per_batch=args.rows_per_batch)
    dm = shardload.ShardDataModule(
        train=training_mixture(sets["train"], weights),
        val={name: str(path) for name, path in sets["val"].items()},  # every document once, source by source
        batching=batching,
        seed=args.seed,
        num_workers=args.num_workers,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    stop = [StopAt(args.out / "interrupted.ckpt", args.stop_at_step)] if args.stop_at_step else []
    trainer = pl.Trainer(
        accelerator=args.accelerator,
        devices=args.devices if args.devices == "auto" else int(args.devices),
        strategy=args.strategy,
        max_epochs=args.max_epochs,
        callbacks=stop,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
    trainer.fit(model, datamodule=dm, ckpt_path=args.resume)
    # One more validation with the final weights: those saved below, which the per-source losses belong to.
    logged = trainer.validate(model, datamodule=dm, verbose=False)[0]
    rank = trainer.global_rank
    record = {"rank": rank, "world_size": trainer.world_size, "trained": model.trained, "val": model.validated}
    (args.out / f"rank{rank}.json").write_text(json.dumps(record))
    if rank != 0:
        return
    torch.save({k: v.cpu() for k, v in model.lm.state_dict().items()}, args.out / "model.pt")
    result = {
        "world_size": trainer.world_size,
        "global_step": trainer.global_step,
        "resumed_from": str(args.resume) if args.resume else None,
        "sources": list(corpora),
        "weights": weights,
        "val": model.validated,
        "logged": {k: float(v) for k, v in logged.items()},
        "model": {"vocab": vocab, "max_length": args.pack_length, "field": FIELD},
        "tokenizer": str(args.tokenizer),
        "sets": {split: {k: str(v) for k, v in by_name.items()} for split, by_name in sets.items()},
    }
    (args.out / "result.json").write_text(json.dumps(result, indent=1))
    print("RESULT " + json.dumps(result) + "\n", end="", flush=True)  # one write: ranks share the output


if __name__ == "__main__":
    main()
