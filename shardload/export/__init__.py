"""Export a shard set to formats that other data pipelines read.

Where it sits: after ``prepare``, beside the loading side::

    shard set (manifest.json + shards/)  --shardload.export.to_webdataset-->  DEST/shard-000000.tar ...

An export is a copy, never the thing shardload trains from; ``shardload
prepare`` turns it back into a shard set with the same samples. One module
per target format:

* :mod:`shardload.export.webdataset`: WebDataset tar shards, one ``.npy``
  member per field (``<key>.<field>.npy``), for streaming with
  ``webdataset.WebDataset``.

Nothing here imports torch.
"""

from __future__ import annotations

from shardload.export.webdataset import WebDatasetExport, to_webdataset

__all__ = ["WebDatasetExport", "to_webdataset"]
