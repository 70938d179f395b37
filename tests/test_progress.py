"""shardload._base.progress: the one progress display of prepare, export and verify."""

from __future__ import annotations

import logging

import pytest

from shardload._base.progress import Progress


@pytest.mark.parametrize(
    ("unit", "line"),
    [("samples", "write: 30/40 samples, "), ("bytes", "verify: 3 of 4 MB, ")],
)
def test_without_a_bar_it_logs_counts_and_rates(caplog: pytest.LogCaptureFixture, unit: str, line: str) -> None:
    total = 40 if unit == "samples" else 4_000_000
    bar = Progress("write" if unit == "samples" else "verify", total=total, unit=unit, enabled=False, every=0.0)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="shardload"):
        bar.update(10, 1_000_000)
        bar.update(20, 2_000_000)
        bar.close()
    assert bar.samples == 30 and bar.nbytes == 3_000_000
    # one per update (every=0); the end adds none, as the last update's line already holds the final counts
    assert len(caplog.records) == 2
    assert caplog.records[-1].getMessage().startswith(line), caplog.records[-1].getMessage()
    assert "MB/s" in caplog.records[-1].getMessage()


def test_the_last_line_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    bar = Progress("read", enabled=False, every=3600.0)
    with caplog.at_level(logging.INFO, logger="shardload"):
        bar.update(10, 1_000)  # long before a line is due
        bar.close()  # the counts: logged when it ends
        assert [r.getMessage().split(",")[0] for r in caplog.records] == ["read: 10 samples"]
        bar = Progress("read", enabled=False, every=0.0)
        bar.update(10, 1_000)  # logged at once
        bar.close()  # not a second time
    assert [r.getMessage().split(",")[0] for r in caplog.records] == ["read: 10 samples"] * 2
