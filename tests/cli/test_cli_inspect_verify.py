"""`shardload inspect` and `shardload verify`."""

from __future__ import annotations

import json
import sys

from shardload.cli import Exit


def test_inspect_human(cli, shard_set) -> None:
    r = cli("inspect", shard_set)
    assert r.code == 0, r.err
    assert "200 in 4 shards" in r.out and "p99" in r.out and "█" in r.out
    assert r.out.rstrip().endswith(f"shardload.open({str(shard_set)!r})")


def test_inspect_json(cli, shard_set) -> None:
    info = cli("inspect", shard_set, "--json").json()
    assert info["samples"] == 200 and info["shards"] == 4
    assert set(info["lengths"]) == {"p0", "p50", "p90", "p99", "max", "mean"}


def test_inspect_plot(cli, shard_set, tmp_path) -> None:
    png = tmp_path / "lengths.png"
    r = cli("inspect", shard_set, "--plot", png)
    assert r.code == 0 and png.read_bytes()[:4] == b"\x89PNG"


def test_inspect_plot_without_matplotlib(cli, shard_set, tmp_path, monkeypatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    r = cli("inspect", shard_set, "--plot", tmp_path / "x.png")
    assert r.code == Exit.USAGE and "pip install shardload[plot]" in r.err


def test_verify_ok(cli, shard_set) -> None:
    r = cli("verify", shard_set)
    assert (r.code, r.out) == (0, "ok: 4 shards, 200 samples verified\n")


def test_verify_problem_is_exit_1(cli, shard_set) -> None:
    m = json.loads((shard_set / "manifest.json").read_text())
    path = shard_set / m["shards"][3]["file"]
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.write_bytes(bytes(data))
    r = cli("verify", shard_set, "--workers", "2")
    assert r.code == Exit.PROBLEMS == 1
    assert f"shard 3 ({m['shards'][3]['file']}): checksum_mismatch: " in r.out
    assert "FAILED" in r.out.splitlines()[-1]
    report = cli("verify", shard_set, "--json").json()
    assert report["ok"] is False and report["damaged_shards"] == [3]
    assert report["problems"][0]["reason"] == "checksum_mismatch"


def test_verify_not_a_set_is_exit_5(cli, tmp_path) -> None:
    r = cli("verify", tmp_path)
    assert r.code == Exit.SHARD_SET and "not a shard set" in r.err


def test_verify_bad_manifest_is_exit_5(cli, shard_set) -> None:
    (shard_set / "manifest.json").write_text("{not json")
    r = cli("verify", shard_set)
    assert r.code == 5 and "not valid JSON" in r.err
