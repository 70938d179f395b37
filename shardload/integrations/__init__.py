"""Where shardload meets other systems: Lightning, Ray Data, WebDataset.

* ``datamodule``: :class:`~shardload.integrations.datamodule.ShardDataModule`, the drop-in
  ``LightningDataModule``.
* ``trainer``: everything shardload reads from a Lightning ``Trainer`` or writes into it.
* ``ray_sink``: prepare a shard set from a Ray Data dataset (``ShardSink``).
* ``webdataset_export``: export a shard set to WebDataset tar shards (``shardload export``).

Each imports its system (or duck-types it) and the layers below; nothing below imports this folder.
"""
