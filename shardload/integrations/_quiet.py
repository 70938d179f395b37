"""Warnings a user did not cause and cannot act on, filtered when Lightning sets up a ShardDataModule.

Lightning 2.6 builds ``torch.utils._pytree.LeafSpec`` objects and gathers through
``torch.distributed.nn.functional.all_gather``, both of which torch 2.13 deprecates: every rank of every run
(of every multi-process run, for the gather the loader stats make) printed the deprecation once, naming
Lightning's own file. Each filter here names the exact
message, its category and the module that warns, so the same warning from the user's own code, and
every other warning, still prints. Importing shardload sets no filter: the filters are installed by
``ShardDataModule.setup``, which Lightning calls in every rank's process before its loops run.
"""

from __future__ import annotations

import warnings

__all__ = ["FOREIGN_WARNINGS", "quiet_foreign_warnings"]

#: (message, category, module that warns), each a regular expression as ``warnings.filterwarnings`` takes them
FOREIGN_WARNINGS: tuple[tuple[str, type[Warning], str], ...] = (
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning, r"lightning\.pytorch\.utilities\._pytree"),
    # Lightning's all_gather (the loader stats' per-interval gather on every rank of a multi-process run)
    (
        r"torch\.distributed\.nn\.functional\.all_gather is deprecated",
        FutureWarning,
        r"lightning\.fabric\.utilities\.distributed",
    ),
)


def quiet_foreign_warnings() -> None:
    """Install the filters of :data:`FOREIGN_WARNINGS` (at the end of the list: a user's own filter wins)."""
    for message, category, module in FOREIGN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module, append=True)
