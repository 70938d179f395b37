"""The private base layer: what every other layer of shardload uses, and nothing of theirs.

Nothing here is public API (``shardload.errors`` is the public exception tree
these modules raise). Each module does one job for the whole package, named in
its own docstring: checks, ranges, envvars, setfiles, identity, checksum,
output, pool, faults, progress, messages, version.
"""
