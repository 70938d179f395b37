"""Opened shard sets: the model the planner and the loader read, above the formats and remote storage.

* ``shardset``: :class:`~shardload.sets.shardset.ShardSet` and ``open_shard_set`` (``shardload.open``):
  manifest + lengths index, shards mapped on demand, local or through the node cache.
  Its pool of open readers is ``_readers``, its checks of the set's files against the manifest ``_integrity``.
* ``index``: sample id <-> (shard, row) arithmetic.
* ``mixture``: :class:`~shardload.sets.mixture.Mixture`, several sets read as one by weight.
* ``verify``: a set on disk checked against its manifest, byte for byte (``shardload verify``).
* ``describe``: a set described from its manifest and index without reading a shard (``shardload inspect``).
"""
