"""Helpers for tests (ours and users'): deterministic synthetic data."""

from shardload.testing.synthetic import long_tailed_lengths, synthetic_samples

__all__ = ["long_tailed_lengths", "synthetic_samples"]
