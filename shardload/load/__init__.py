"""The loading side: a rank's plan -> batches from a torch ``DataLoader``.

* ``world``: this process's rank and the world size, found in one documented order.
* ``options``: :class:`~shardload.load.options.LoaderOptions` and the shortcut rule for option objects.
* ``loader``: ``make_loader``, :class:`~shardload.load.loader.ShardLoader` and its plan-driven sampler.
* ``state``: a loader's saved state, its checks, and what may change between save and resume.
* ``dataset``: the map-style dataset whose items are whole planned batches.
* ``collate``, ``collate_packed``: a batch's samples -> padded (or packed) numpy arrays.
* ``prefetch``: the plan-driven prefetcher of a remote set's shards.
* ``workers``: what went wrong with a DataLoader worker, in words a user can act on.
* ``stats``: :class:`~shardload.load.stats.LoaderStats`, the wait, step time and tokens the loader measures.
* ``attention``: attention masks that keep a packed batch's documents apart (SDPA, FlexAttention).
* ``metrics``: :class:`~shardload.load.metrics.ExactMean`, exact weighted means reduced over ranks.

torch is imported by ``loader``, ``dataset``, ``attention`` and ``metrics`` only.
"""
