"""examples/slurm_prepare_array.sbatch with stub ``sbatch``/``srun``: it submits, prepares parts, merges."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import shardload
from tests.test_examples import EXAMPLES, REPO, slurm_env, write_stub

SCRIPT = EXAMPLES / "slurm_prepare_array.sbatch"


def test_script_is_valid_bash_with_an_sbatch_header() -> None:
    res = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    header = SCRIPT.read_text().split("set -euo pipefail")[0]
    assert re.search(r"^#SBATCH --ntasks=1\b", header, re.MULTILINE)


def test_login_node_submits_the_array_then_a_dependent_merge(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "sbatch.log"
    # sbatch records its arguments and the MERGE setting it was given, and answers with a job id.
    write_stub(bin_dir, "sbatch", f'echo "$* MERGE=${{MERGE:-}}" >> {log}\necho "4711;cluster"\n')
    env = slurm_env(bin_dir, SOURCES="/raw/*.jsonl", OUT="/sets/train", PARTS="6")
    res = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    first, second = log.read_text().splitlines()
    assert "--array=0-5" in first.split() and first.endswith("MERGE=")
    assert "--dependency=afterok:4711" in second.split() and "--export=ALL,MERGE=1" in second.split()
    assert "submitted 6 parts as job 4711" in res.stdout


@pytest.mark.slow
def test_array_tasks_then_merge_make_one_set(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # srun drops its own options and runs the command; shardload is this checkout's.
    write_stub(bin_dir, "srun", 'while [[ "$1" == -* ]]; do shift; done\nexec "$@"\n')
    write_stub(bin_dir, "shardload", f'PYTHONPATH={REPO} exec {sys.executable} -m shardload "$@"\n')
    src = tmp_path / "raw"
    src.mkdir()
    rng = np.random.default_rng(5)
    for i in range(5):
        lines = [json.dumps({"tokens": rng.integers(0, 99, int(n)).tolist()}) for n in rng.integers(1, 30, 20 + i)]
        (src / f"d{i}.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    settings = {"SOURCES": f"{src}/*.jsonl", "OUT": str(out), "PARTS": "3", "PREPARE_ARGS": "--no-shuffle"}
    for k in (2, 0, 1):  # any order: the merged set follows part order
        env = slurm_env(bin_dir, SLURM_ARRAY_TASK_ID=str(k), SLURM_CPUS_PER_TASK="1", **settings)
        res = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120, check=False)
        assert res.returncode == 0, res.stderr
    res = subprocess.run(
        ["bash", str(SCRIPT)],
        env=slurm_env(bin_dir, MERGE="1", **settings),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert "merged" in res.stdout and "ok: 3 shards" in res.stdout
    shardload.prepare(f"{src}/*.jsonl", tmp_path / "single", shuffle=False)
    merged, single = shardload.open(out), shardload.open(tmp_path / "single")
    assert len(merged) == len(single) == 110
    assert all(np.array_equal(merged[i]["tokens"], single[i]["tokens"]) for i in range(len(single)))
