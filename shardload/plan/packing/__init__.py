"""Packing in the planner: samples laid end to end in rows of ``pack_length`` tokens.

* ``pack``: :class:`~shardload.plan.packing.pack.PackBatcher`, the fourth batching strategy.
* ``rows``: best-fit decreasing over size histograms, counting the rows every rank opens.
* ``track``: the same run followed row by row, to give every item its row.
"""
