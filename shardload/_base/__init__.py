"""The private base layer: what every other layer of shardload uses, and nothing of theirs.

Nothing here is public API (they raise the public tree of ``shardload.errors``);
each module does one job for the whole package, named in its own docstring.
"""
