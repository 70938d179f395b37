"""Turn raw files into a shard set: Arrow (or Zarr) shards, a lengths index and a manifest.

Sources are files, directories, globs or brace patterns (data-{000..009}.tar);
their kind is detected from the suffix (--source-format overrides it). Samples
are checked against the schema of the first one, shuffled across shards once
(seeded), and written in parallel. An interrupted run is finished with --resume;
an existing shard set is replaced only with --overwrite, and only once the new
one is complete. --map applies a Python function to every sample as it is read
(to tokenize text, filter or split records). With a URL as OUT (s3://bucket/prefix/set),
the set is prepared in a local staging directory and uploaded, manifest.json last
(credentials and endpoint from the environment: AWS_* variables, config files).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shardload.cli._common import CommandError, int_at_least, parse_size, positive_int, print_json, python_hint

if TYPE_CHECKING:
    from shardload.prepare.pipeline import PrepareResult

SUMMARY = "turn raw files into a shard set"

EPILOG = """examples:
  shardload prepare data/*.npy -o out/ --field tokens --shard-size 256MB --workers 8
  shardload prepare corpus.jsonl -o out/ --dtype tokens=int32 --balance tokens
  shardload prepare corpus.jsonl -o out/ --map mytok:encode --workers 8   # mytok.py in the current directory
  shardload prepare corpus.jsonl -o out/ --map-factory mytok:make_encoder --map-file path=tokenizer.json \
      --map-arg max_tokens=2048 --workers 8   # make_encoder(path=..., max_tokens=2048) once per worker
  shardload prepare data/*.npy -o out/ --resume      # finish an interrupted run
  shardload prepare data/*.npy -o out/ --format zarr --compression zstd --compression-level 5
  shardload prepare data/*.parquet -o out/ --part 3/8   # part 3 of 8 (one machine each), then: shardload merge out/
  shardload prepare data/*.parquet -o s3://bucket/sets/v1 --staging /scratch/stage   # staged, then uploaded

""" + python_hint(
    "import shardload",
    "shardload.prepare('data/*.npy', 'out/', field='tokens', workers=8)   # the same run",
    "ds = shardload.open('out/')   # len(ds), ds.lengths, ds[0]['tokens']",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="input files, directories, globs or brace patterns")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="OUT",
        help="the shard set directory to create, or a URL (s3://bucket/prefix/set): staged locally, then uploaded",
    )
    src = p.add_argument_group("reading the sources")
    src.add_argument("--source-format", metavar="KIND", help=f"source kind instead of detecting it ({_kinds()})")
    src.add_argument(
        "--field", default=None, metavar="NAME", help="field name of single-array files (.npy; default: data)"
    )
    src.add_argument(
        "--dtype",
        action="append",
        default=[],
        type=_dtype_item,
        metavar="FIELD=DTYPE",
        help="cast FIELD to DTYPE on ingest, e.g. tokens=int32 (repeatable)",
    )
    src.add_argument(
        "--fixed-field",
        action="append",
        default=[],
        metavar="FIELD",
        help="a field whose shape never varies between samples (repeatable)",
    )
    src.add_argument(
        "--length-field",
        metavar="FIELD",
        help="the field whose length is the sample length (default: the longest variable field)",
    )
    which = src.add_mutually_exclusive_group()
    which.add_argument(
        "--map",
        metavar="MODULE:FUNCTION",
        help="apply this function to every sample as it is read, in the worker processes: it returns the sample "
        "mapped, None to drop it, or a list of samples (e.g. mypkg.tok:encode; the current directory is importable, "
        "as with python -m; or FILE.py:FUNCTION). With --workers > 1 it must be defined at the top level of its module",
    )
    which.add_argument(
        "--map-factory",
        metavar="MODULE:FUNCTION",
        help="instead of --map: a function called once in each worker process, with the --map-arg and --map-file "
        "arguments, that returns the function to apply to every sample (e.g. one that loads a tokenizer)",
    )
    src.add_argument(
        "--map-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a keyword argument of the --map function (after the sample) or of the --map-factory (repeatable); "
        "VALUE is read as JSON where it parses (2048, true, [1,2]), else kept as text. Recorded: --resume refuses "
        "other values",
    )
    src.add_argument(
        "--map-file",
        action="append",
        default=[],
        metavar="KEY=PATH",
        help="like --map-arg KEY=PATH, for a file the map reads (a tokenizer.json): its sha256 is recorded, and "
        "--resume refuses a changed file (repeatable)",
    )
    src.add_argument(
        "--map-batch",
        type=int,
        metavar="N",
        help="call the --map function with up to N records at a time, as a dict of column lists "
        '({"text": [str, ...]}); it returns a dict of columns with one entry per record, or a list with one '
        "per-sample result per record (e.g. a tokenizer's encode_batch on many texts a call)",
    )
    pick = src.add_mutually_exclusive_group()
    pick.add_argument(
        "--fields",
        type=_names,
        metavar="A,B",
        help="keep only these fields of the input (Parquet/Arrow read only these columns)",
    )
    pick.add_argument("--drop-fields", type=_names, metavar="A,B", help="leave these fields of the input out")
    src.add_argument("--reject-nonfinite", action="store_true", default=None, help="refuse NaN/inf in float fields")
    src.add_argument(
        "--allow-pickle",
        action="store_true",
        help="allow pickled arrays (runs code from the file: only for input you trust)",
    )
    lay = p.add_argument_group("laying out the shards")
    lay.add_argument(
        "--shard-size",
        type=parse_size,
        metavar="SIZE",
        help="target bytes per shard: 256MB (default), 1GiB, 512M or plain bytes",
    )
    lay.add_argument(
        "--num-shards",
        type=positive_int,
        metavar="N",
        help="exact number of shards, at most one per sample (overrides --shard-size)",
    )
    lay.add_argument(
        "--balance", choices=("samples", "tokens"), help="even out samples per shard (default), or tokens per shard too"
    )
    lay.add_argument(
        "--shuffle",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="shuffle samples across shards once (default: on)",
    )
    lay.add_argument("--seed", type=_seed, metavar="N", help="seed of that shuffle, 0 to 2**64-1 (default: 0)")
    _add_format_arguments(p.add_argument_group("shard format"))
    run_ = p.add_argument_group("running")
    run_.add_argument("--workers", type=positive_int, metavar="N", help="parallel processes (default: 1)")
    run_.add_argument(
        "--part",
        metavar="K/N",
        help="prepare only part K (from 0) of N of the input, into OUT/parts/KKKKK-of-NNNNN; run every part "
        "(one per machine), then `shardload merge OUT`",
    )
    run_.add_argument(
        "--unit-size",
        type=parse_size,
        metavar="SIZE",
        help="split files larger than this into units that workers read in parallel (default: 16MiB; JSON Lines "
        "at line boundaries, Parquet by row groups, Arrow IPC files by record batches; not gzipped files; at most "
        "256 units per file: a smaller size is raised for a larger file, with a warning)",
    )
    mode = run_.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", default=None, help="finish an interrupted run into OUT")
    mode.add_argument("--overwrite", action="store_true", default=None, help="replace a shard set already in OUT")
    run_.add_argument(
        "--staging",
        metavar="DIR",
        help="with a URL as OUT: prepare in DIR, then upload (default: $SHARDLOAD_CACHE_DIR/staging/..., "
        "~/.cache/shardload/staging/...); it needs room for the whole set",
    )
    run_.add_argument(
        "--keep-staging", action="store_true", help="with a URL as OUT: keep the staged set after the upload"
    )
    run_.add_argument("--no-progress", action="store_true", help="no progress bar (log lines instead)")
    run_.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")


#: flags passed to ``shardload.prepare`` under their own name when given (``field`` is a keyword of prepare()
#: itself, the others are ``PrepareOptions`` fields)
_PASSED_IF_GIVEN = (
    "shard_size",
    "num_shards",
    "balance",
    "shuffle",
    "seed",
    "workers",
    "resume",
    "overwrite",
    "length_field",
    "reject_nonfinite",
    "fields",
    "drop_fields",
    "field",
    "map_batch",
)


def run(args: argparse.Namespace) -> int:
    import shardload

    # an option not given is not passed: the library's default
    options: dict[str, Any] = {k: v for k in _PASSED_IF_GIVEN if (v := getattr(args, k)) is not None}
    options.update(_format_options(args))
    if args.fixed_field:
        options["fixed_fields"] = tuple(args.fixed_field)
    if args.dtype:
        options["dtypes"] = _dtypes(args.dtype)
    options["progress"] = False if args.no_progress else None
    options.update(_map_options(args))
    result = shardload.prepare(
        args.sources,
        args.output,
        source_format=args.source_format,
        allow_pickle=args.allow_pickle,
        part=args.part,
        unit_bytes=args.unit_size,
        staging=args.staging,
        keep_staging=args.keep_staging,
        **options,
    )
    if args.json:
        print_json(result.to_json())
        return 0
    from shardload._base.messages import format_bytes
    from shardload.sets.describe import count_of

    timing = (
        f"{result.seconds:.1f} s, {result.input_mb_per_s:.1f} MB/s, {result.samples_per_s:,.0f} samples/s"
        if result.seconds > 0
        else "already prepared by an earlier run"
    )
    print(
        f"prepared {result.path}: {count_of(result.samples, 'sample')} in {count_of(result.shards, 'shard')}, "
        f"{format_bytes(result.bytes)}, {result.tokens:,} tokens ({timing})"
    )
    if result.uploaded_bytes:
        print(f"uploaded {format_bytes(result.uploaded_bytes)} to {result.path}")
    for line in record_lines(result):
        print(line)
    if result.skipped_files:
        from shardload.prepare.sources import SKIP_REASONS

        why = "; ".join(f"{n} {SKIP_REASONS.get(k, k)}" for k, n in result.skipped.items())
        print(f"skipped {result.skipped_files:,} files of the source directories as not data: {why}")
    if args.part is not None:
        print(f"when every part is done: shardload merge {args.output}")
    else:
        print(f"load it: shardload.open({result.path!r})")
    return 0


def _map_options(args: argparse.Namespace) -> dict[str, Any]:
    """``map=`` or ``map_factory=``, with ``map_args=`` and ``map_files=``, of ``--map``/``--map-factory``,
    ``--map-arg`` and ``--map-file`` (a key given twice is refused: which value would win is a guess)."""
    from shardload.errors import InputError
    from shardload.prepare.mapconfig import parse_map_arg
    from shardload.prepare.mapping import load_map

    options: dict[str, Any] = {}
    given: dict[str, str] = {}
    for flag, items, name in (("--map-arg", args.map_arg, "map_args"), ("--map-file", args.map_file, "map_files")):
        values: dict[str, Any] = {}
        for text in items:
            key, value = parse_map_arg(text, flag)
            if key in given:
                shown = text if len(text) <= 200 else text[:197] + "..."
                raise InputError(f"{flag} {shown!r}: {key!r} is given already ({given[key]}); give each argument once")
            given[key] = f"{flag} {text if len(text) <= 200 else text[:197] + '...'}"
            values[key] = value
        if values:
            options[name] = values
    for flag, name in (("--map", "map"), ("--map-factory", "map_factory")):
        spec = getattr(args, name)
        if spec is None:
            continue
        if os.getcwd() not in sys.path:  # as `python -m` does; worker processes inherit sys.path
            sys.path.insert(0, os.getcwd())
        options[name] = load_map(spec, flag)
    return options


def record_lines(result: PrepareResult) -> list[str]:
    """What the summary says beyond its first line: records read and what became of them, the size by field, and
    a field the map repeated in every piece of the records it split."""
    from shardload._base.messages import format_bytes
    from shardload.sets.describe import count_of

    lines = []
    dropped = f"the map dropped {result.dropped:,} records (it returned None or an empty list for them)"
    if result.records is not None:
        fates = [f"the map split {result.split:,} into several samples"] if result.split else []
        fates += [dropped] if result.dropped else []
        became = f"{count_of(result.records, 'input record')} became {count_of(result.samples, 'sample')}"
        lines.append(f"records:  {became}" + (f": {'; '.join(fates)}" if fates else ""))
    elif result.dropped:
        lines.append(dropped)
    if result.field_bytes:
        sizes = ", ".join(f"{name} {format_bytes(n)}" for name, n in result.field_bytes.items())
        lines.append(f"size by field: {sizes}")
    for name, n in result.repeated_fields.items():
        size = format_bytes(result.field_bytes.get(name, 0))
        lines.append(
            f"note: the map repeated field {name!r} in every piece of {count_of(n, 'record')} it split; each "
            f"piece stores it again ({name} is {size} of the set). To keep it once, see docs/cli.md, "
            '"Text beside tokens, kept once"'
        )
    return lines


def _add_format_arguments(group: argparse._ArgumentGroup) -> None:
    """``--format`` and the flags of each registered format's options (``--compression``, ...)."""
    from shardload.formats import FORMATS

    group.add_argument(
        "--format",
        "--shard-format",
        dest="shard_format",
        choices=sorted(FORMATS),
        help="; ".join(
            f"{f.name}{' (default)' if f.name == _default_format() else ''}: {f.summary}" for f in FORMATS.values()
        ),
    )
    parsers: dict[str, Callable[[str], Any]] = {"text": str, "int": int, "size": parse_size}
    for fmt in FORMATS.values():
        for flag in fmt.flags:
            group.add_argument(
                flag.flag,
                dest=_dest(flag.field),
                type=parsers[flag.kind],
                choices=flag.choices or None,
                metavar=flag.metavar,
                help=flag.help,
            )


def _default_format() -> object:
    from shardload.prepare.options import PrepareOptions

    return next(f.default for f in dataclasses.fields(PrepareOptions) if f.name == "shard_format")


def _dest(field: str) -> str:
    return f"format_option_{field}"


def _format_options(args: argparse.Namespace) -> dict[str, Any]:
    """``shard_format=``: ``--format``'s name, or its options object made of its flags' values.

    Flags of another format are passed on as keywords of their own, which
    ``PrepareOptions`` refuses with the spelling that applies.
    """
    from shardload.formats import FORMATS

    given = {
        flag.field: value
        for fmt in FORMATS.values()
        for flag in fmt.flags
        if (value := getattr(args, _dest(flag.field))) is not None
    }
    fmt = FORMATS.get(args.shard_format or "")
    own = {k: v for k, v in given.items() if fmt is not None and k in fmt.option_names()}
    options: dict[str, Any] = {k: v for k, v in given.items() if k not in own}
    if fmt is not None:
        options["shard_format"] = fmt.options(**own) if own else fmt.name
    return options


def _kinds() -> str:
    from shardload.prepare.sources import READERS

    return ", ".join(sorted(READERS))


def _names(text: str) -> tuple[str, ...]:
    """``a,b`` (``--fields``, ``--drop-fields``) as field names."""
    names = tuple(n.strip() for n in text.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(f"{text!r}: expected field names separated by commas, e.g. tokens,label")
    return names


def _dtype_item(text: str) -> tuple[str, str]:
    from shardload.errors import InputError
    from shardload.schema.fields import parse_dtype_overrides

    try:
        ((name, dtype),) = parse_dtype_overrides([text]).items()
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return name, dtype


def _dtypes(items: list[tuple[str, str]]) -> dict[str, str]:
    """``--dtype`` items as a dict, refusing a field given twice (which one would win is a guess)."""
    dtypes: dict[str, str] = {}
    for name, dtype in items:
        if name in dtypes:
            raise CommandError(
                f"--dtype names field {name!r} twice ({dtypes[name]}, then {dtype}); give each field one dtype"
            )
        dtypes[name] = dtype
    return dtypes


_seed = int_at_least(0, "in [0, 2**64)", maximum=2**64 - 1)
