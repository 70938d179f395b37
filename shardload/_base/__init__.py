"""The private base layer: what every other layer of shardload uses, and nothing of theirs.

Importing it installs the credential mask of every error message (:mod:`.redact`).
Nothing here is public API (they raise the public tree of ``shardload.errors``);
each module does one job for the whole package, named in its own docstring.
"""

from shardload._base import redact as _redact  # noqa: F401  installs the mask of ShardloadError's messages
