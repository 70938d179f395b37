"""Parts of a prepare run: which source units part K of N reads, where it goes, and what ties the parts together.

``--part K/N`` runs the ordinary pipeline over part K of a deterministic split of the units into
``OUT/parts/KKKKK-of-NNNNN``, a set of its own; each part records the *run id* of the whole input,
options and ``N``, so that the merge refuses a part of another run. See docs/parts.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from shardload._base.output import withdraw_index
from shardload.errors import InputError, OutputExistsError, ShardloadError
from shardload.prepare.sources import SourceUnit
from shardload.prepare.workdir import PARTS_DIR, WORK

if TYPE_CHECKING:
    from shardload.formats.manifest import Manifest

logger = logging.getLogger("shardload.prepare")

#: a part's folder name: ``00003-of-00008``
PART_NAME = re.compile(r"(\d{5,})-of-(\d{5,})")
#: the most parts one run may have (a name holds at least five digits; more are allowed)
MAX_PARTS = 1 << 20


def parse_part(value: str | Sequence[int]) -> tuple[int, int]:
    """``"3/8"`` or ``(3, 8)`` -> ``(3, 8)``: part 3 (counted from 0) of 8.

    Raises:
        InputError: not two integers, ``N`` below 1 or above :data:`MAX_PARTS`, or ``K`` outside ``0..N-1``.
    """
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", value)
        if m is None:
            raise InputError(
                f"--part {value!r}: expected K/N, e.g. 3/8 for part 3 of 8 (parts are counted from 0, as "
                "SLURM_ARRAY_TASK_ID with --array=0-7)"
            )
        k, n = int(m.group(1)), int(m.group(2))
    else:
        items = tuple(value)
        if len(items) != 2 or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in items):
            raise InputError(f"part must be (K, N), two integers, e.g. (3, 8) for part 3 of 8; got {value!r}")
        k, n = int(items[0]), int(items[1])
    if not 1 <= n <= MAX_PARTS:
        raise InputError(f"part {k}/{n}: the number of parts N must be in 1..{MAX_PARTS:,}")
    if not 0 <= k < n:
        raise InputError(
            f"part {k}/{n}: K must be in 0..{n - 1} (parts are counted from 0; the last of {n} parts is {n - 1}/{n})"
        )
    return k, n


def part_name(k: int, n: int) -> str:
    """The folder of part ``k`` of ``n`` inside ``OUT/parts``."""
    return f"{k:05d}-of-{n:05d}"


def part_dir(out: str | os.PathLike[str], k: int, n: int) -> Path:
    """``OUT/parts/KKKKK-of-NNNNN``: where part ``k`` of ``n`` is prepared."""
    return Path(out) / PARTS_DIR / part_name(k, n)


def unit_bytes(unit: SourceUnit) -> int:
    """Input bytes of one unit: a part's own bytes, else its files' sizes (0 for a file that cannot be ``stat``-ed)."""
    if unit.part is not None:
        return unit.nbytes
    total = 0
    for path in unit.paths:
        try:
            total += os.stat(path).st_size
        except OSError:
            pass
    return total


def split_units(units: Sequence[SourceUnit], n: int) -> list[list[SourceUnit]]:
    """Cut ``units`` into ``n`` contiguous runs balanced by input bytes (``n - len(units)`` empty when fewer units).

    A unit goes to the part its middle byte falls in, then moves to the nearest part that keeps every
    part filled (with fewer than ``n`` units, one per part), so no machine idles while another reads two files.
    """
    m = len(units)
    sizes = np.array([unit_bytes(u) for u in units], dtype=np.float64)
    if m and sizes.sum() <= 0:
        sizes[:] = 1.0  # nothing to weigh by: by count
    ends = np.cumsum(sizes)
    middles = ends - sizes / 2
    total = float(ends[-1]) if m else 1.0
    which = np.minimum((middles * n / total).astype(np.int64), n - 1).tolist()
    parts: list[list[SourceUnit]] = [[] for _ in range(n)]
    prev = -1
    for i, (unit, k) in enumerate(zip(units, which)):
        # bounds that leave enough units for the parts after this one, and no part skipped (m >= n)
        # or shared (m <= n)
        lo, hi = (prev + 1, n - m + i) if m <= n else (max(prev, n - m + i), prev + 1)
        prev = min(max(k, lo), hi)
        parts[prev].append(unit)
    return parts


def run_id(units: Sequence[SourceUnit], n: int, layout: Mapping[str, Any]) -> str:
    """The id every part of one run records: all units of the input, the options and the part count."""
    description = {"units": [u.describe() for u in units], "parts": n, "options": dict(layout)}
    return hashlib.sha256(json.dumps(description, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _set_at(out: str | os.PathLike[str]) -> Manifest | None:
    """The manifest of the set in ``out``, or None where there is none (or none that can be read)."""
    from shardload.formats.manifest import Manifest

    try:
        return Manifest.load(Path(out))
    except ShardloadError:
        return None


def refuse_part_into_single_set(out: str | os.PathLike[str], k: int, n: int) -> None:
    """Refuse ``prepare --part K/N`` into an ``out`` that holds a set prepared in one run (the merge would refuse it).

    Raises:
        OutputExistsError: naming the set and what to do.
    """
    manifest = _set_at(out)
    if manifest is not None and not manifest.parts:
        raise OutputExistsError(
            f"{out}: already holds a shard set prepared in one run (not parts), so part {k}/{n} could never be "
            f"merged there; give the parts another output directory, or remove this set first"
        )


def refuse_resume_of_merged(out: str | os.PathLike[str]) -> None:
    """Refuse ``prepare --resume`` into a set merged from parts: each part is resumed on its own.

    Raises:
        OutputExistsError: naming the set and the command that finishes a part.
    """
    manifest = _set_at(out)
    if manifest is not None and manifest.parts:
        n = len(manifest.parts)
        raise OutputExistsError(
            f"{out}: is a shard set merged from {n} parts ({PARTS_DIR}/...); there is no single run to resume. "
            f"To redo a part, run prepare with --part K/{n} --resume (or --overwrite), then `shardload merge {out}`."
        )


def _merged_set_of(part_out: str | os.PathLike[str]) -> tuple[Path, Manifest] | None:
    """The set merged from parts that ``part_out`` (``OUT/parts/KKKKK-of-NNNNN``) belongs to, if ``OUT`` holds one."""
    root = Path(part_out).parent.parent
    manifest = _set_at(root)
    return (root, manifest) if manifest is not None and manifest.parts else None


def refuse_part_of_another_run(part_out: str | os.PathLike[str], k: int, n: int, run: str) -> None:
    """Refuse part ``k`` of ``n`` of run ``run`` into an ``OUT`` merged from the parts of another run.

    Such a part could never be merged with the others (the merge compares run ids), and replacing one of
    them would leave the merged set unloadable: the part is refused before anything is written.

    Raises:
        OutputExistsError: naming the merged set and what to do.
    """
    found = _merged_set_of(part_out)
    if found is None or found[1].options.get("run") == run:
        return
    root, merged = found
    raise OutputExistsError(
        f"{root}: is a shard set merged from {len(merged.parts)} parts of another run than this part {k}/{n} (other "
        "sources, source order, options or number of parts: the run id differs), so this part could never be "
        f"merged with them, and replacing {PARTS_DIR}/{part_name(k, n)} would leave that set unloadable. Prepare "
        "the part with the same sources in the same order and the same options as the others, or prepare this "
        f"run into another directory (to replace the whole set: remove {root}/manifest.json and {root}/{PARTS_DIR}/ "
        "first)."
    )


def withdraw_stale_merge(part_out: str | os.PathLike[str], k: int, n: int, set_id: str) -> None:
    """Before part ``k`` of ``n`` with ``set_id`` is committed: withdraw the merged set it would contradict.

    A part prepared again from changed input gets another set id; the merged manifest's record of the
    old part would then name shards that are gone. Its manifest goes first, so ``OUT`` says "merge again"
    (:meth:`Manifest.load <shardload.formats.manifest.Manifest.load>`) instead of "copied in from another set".
    The same input gives the same set id (:func:`shardload._base.identity.set_id_of`): the merged set stays.
    """
    found = _merged_set_of(part_out)
    if found is None:
        return
    root, merged = found
    if len(merged.parts) == n and merged.parts[k].set_id == set_id:
        return
    from shardload.formats.manifest import MANIFEST_NAME

    logger.warning(
        "%s: part %d/%d was prepared from other data than when %s was merged; run `shardload merge %s` again",
        part_out,
        k,
        n,
        root,
        root,
    )
    withdraw_index(root / MANIFEST_NAME)


def finished_part(out: str | os.PathLike[str], k: int, n: int, run: str) -> bool:
    """Whether ``out`` holds part ``k`` of ``n`` of run ``run``, committed, with no interrupted work.

    Then ``--resume`` has nothing to do and succeeds: a scheduler may rerun a task that had finished.
    """
    if (Path(out) / WORK).exists():
        return False  # interrupted work (or a run under way): the ordinary resume decides
    manifest = _set_at(out)
    return manifest is not None and manifest.options.get("run") == run and manifest.options.get("part") == [k, n]


def part_record(k: int, n: int, run: str) -> dict[str, Any]:
    """What a part's manifest records among its options (``part``, ``run``), for the merge to check."""
    return {"part": [k, n], "run": run}


__all__ = [
    "PARTS_DIR",
    "PART_NAME",
    "finished_part",
    "parse_part",
    "part_dir",
    "part_name",
    "part_record",
    "refuse_part_into_single_set",
    "refuse_part_of_another_run",
    "refuse_resume_of_merged",
    "run_id",
    "split_units",
    "withdraw_stale_merge",
]
