"""Where shardload meets other systems: Lightning (``datamodule``, ``trainer``), Ray Data (``ray_sink``)
and WebDataset (``webdataset_export``).

Each imports its system (or duck-types it) and the layers below; nothing below imports this folder.
"""
