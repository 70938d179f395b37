"""The private base layer: what every other layer of shardload uses, and nothing of theirs.

Nothing here is public API (``shardload.errors`` is the public exception tree
these modules raise). Each module does one job for the whole package:

* ``checks``: limits and the one rule for checking a scalar option.
* ``ranges``: offsets of variable-length rows, and positions inside ranges.
* ``envvars``: every environment variable shardload reads, and the rule that reads it.
* ``setfiles``: opening a set's files safely (regular files, inside the set, bounded sizes).
* ``identity``: which set and position a shard file belongs to, and whether it changed.
* ``checksum``: a file's sha256, computed while it is written.
* ``output``: writing a directory safely (one writer, atomic files, the index last).
* ``pool``: a pool of worker processes whose failures are named.
* ``faults``: the named crash points that the fault-injection tests stop a run at.
* ``progress``: a bar on a terminal, log lines otherwise.
* ``messages``: small pieces of messages, said the same way everywhere.
"""
