"""Deterministic synthetic variable-length data with long-tailed lengths."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def long_tailed_lengths(
    n: int, *, median: float = 256, sigma: float = 0.8, low: int = 8, high: int = 4096, seed: int = 0
) -> NDArray[np.int64]:
    """Lognormal lengths around ``median``, clipped to ``[low, high]``."""
    rng = np.random.default_rng(seed)
    lens = rng.lognormal(mean=np.log(median), sigma=sigma, size=n)
    return np.clip(np.rint(lens), low, high).astype(np.int64)


def synthetic_samples(
    n: int,
    *,
    seed: int = 0,
    median_tokens: float = 24,
    median_rows: float = 6,
    channels: int = 4,
    vocab: int = 1000,
) -> list[dict[str, np.ndarray]]:
    """``n`` samples with ``tokens`` int32[L], ``features`` float32[rows, channels], ``label`` int64[].

    Token lengths may be 0 (empty samples are valid); rows are at least 1.
    """
    rng = np.random.default_rng(seed)
    tok = long_tailed_lengths(n, median=median_tokens, low=0, high=int(median_tokens * 16), seed=seed)
    rows = long_tailed_lengths(n, median=median_rows, low=1, high=int(median_rows * 16), seed=seed + 1)
    out: list[dict[str, np.ndarray]] = []
    for i in range(n):
        out.append(
            {
                "tokens": rng.integers(0, vocab, size=int(tok[i]), dtype=np.int32),
                "features": rng.standard_normal((int(rows[i]), channels), dtype=np.float32),
                "label": np.asarray(i % 7, dtype=np.int64),
            }
        )
    return out
