"""Every example runs, on CPU with tiny data, as a real subprocess under the watchdog.

The Python examples print one ``RESULT {json}`` line on rank 0; the checks
read it: the world size they ran with, and a validation count equal to the
number of validation samples (so no sample was dropped or counted twice
across ranks). The SLURM script is checked for syntax, for the torchrun
command line it builds on a two-node allocation (parsed with torchrun's own
parser and the example's), and by running it for real on one "node" with stub
``srun`` / ``scontrol`` / ``torchrun`` commands.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.distributed.watchdog import REPO, Outcome, python, run_with_watchdog

EXAMPLES = REPO / "examples"
TINY = ["--train-samples", "120", "--val-samples", "37"]
pytestmark = pytest.mark.slow


def finished(res: Outcome) -> dict[str, Any]:
    """The example's ``RESULT`` line, after checking it finished cleanly (no hang, exit 0)."""
    assert not res.hung, res.tail()
    assert res.returncode == 0, res.tail()
    lines = [line for line in res.output.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, res.tail()
    return dict(json.loads(lines[0][len("RESULT ") :]))


def torchrun_two_ranks(*args: str) -> list[str]:
    """The command line of ``torchrun --standalone --nproc_per_node 2 ARGS``."""
    return python("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args)


def load_example(name: str) -> ModuleType:
    """Import an example module the way ``python examples/NAME.py`` would see its imports."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(EXAMPLES))


#: Lightning's advice that the defaults and the recipe make not apply (docs/loading.md, "Quiet by default")
NOT_WARNED = ("Consider setting `persistent_workers=True`", "It is recommended to use `self.log(")


def test_lightning_ddp_logs_the_exact_validation_loss(tmp_path: Path) -> None:
    res = run_with_watchdog(
        python(
            str(EXAMPLES / "lightning_ddp.py"),
            "--accelerator",
            "cpu",
            "--devices",
            "2",
            "--strategy",
            "ddp",
            "--max-steps",
            "4",
            "--num-workers",
            "1",
            "--workdir",
            str(tmp_path),
            *TINY,
            "--verify",
        ),
        timeout=240,
    )
    r = finished(res)
    assert (r["world_size"], r["steps"]) == (2, 4)
    # Invariant: 37 validation samples on 2 ranks, each counted exactly once
    assert r["val_count"] == r["exact_val_count"] == 37
    assert abs(r["val_loss"] - r["exact_val_loss"]) < 1e-5, r
    # Quiet: the exact-loss recipe (val_loss logged at epoch end) and the default loader options draw no
    # Lightning warning (persistent_workers is advised where workers start by spawn: test_persistent_workers.py)
    assert not [w for w in NOT_WARNED if w in res.output], res.tail()


def test_torchrun_plain_two_ranks(tmp_path: Path) -> None:
    res = run_with_watchdog(
        torchrun_two_ranks(
            str(EXAMPLES / "torchrun_plain.py"),
            "--max-steps",
            "3",
            "--num-workers",
            "1",
            "--workdir",
            str(tmp_path),
            *TINY,
        ),
        timeout=240,
    )
    r = finished(res)
    assert (r["world_size"], r["steps"], r["val_count"]) == (2, 3, 37)
    assert r["val_loss"] > 0


def test_torchrun_plain_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    # Single process (no torchrun): the checkpoint and resume code path, cheaply.
    args = [
        str(EXAMPLES / "torchrun_plain.py"),
        "--workdir",
        str(tmp_path),
        *TINY,
        "--num-workers",
        "0",
        "--checkpoint",
        str(tmp_path / "ckpt"),
        "--save-every",
        "2",
        "--epochs",
        "3",
    ]
    first = run_with_watchdog(python(*args, "--max-steps", "4"), timeout=180)
    assert finished(first)["steps"] == 4 and (tmp_path / "ckpt.rank0.pt").exists()
    second = run_with_watchdog(python(*args, "--max-steps", "7"), timeout=180)
    assert finished(second)["steps"] == 7
    assert re.search(r"resumed at epoch \d+, step 4", second.output), second.tail()


def test_single_gpu_multiprocess_on_cpu(tmp_path: Path) -> None:
    res = run_with_watchdog(
        python(
            str(EXAMPLES / "single_gpu_multiprocess.py"),
            "--ranks",
            "3",
            "--device",
            "cpu",
            "--max-steps",
            "2",
            "--workdir",
            str(tmp_path),
            *TINY,
        ),
        timeout=240,
    )
    r = finished(res)
    assert (r["world_size"], r["device"], r["val_count"]) == (3, "cpu", 37)
    # Every rank reported the same step and batch counts
    per_rank = re.findall(r"rank (\d)/3: (\d+) train steps, (\d+) val batches", res.output)
    assert sorted(int(x[0]) for x in per_rank) == [0, 1, 2]
    assert len({x[1:] for x in per_rank}) == 1


def test_packed_lm_learns_and_sees_every_sample_once_per_epoch(tmp_path: Path) -> None:
    res = run_with_watchdog(
        torchrun_two_ranks(
            str(EXAMPLES / "packed_lm.py"),
            "--epochs",
            "3",
            "--num-workers",
            "0",
            "--workdir",
            str(tmp_path),
            "--train-samples",
            "400",
            "--val-samples",
            "37",
        ),
        timeout=240,
    )
    r = finished(res)
    assert (r["world_size"], r["val_count"]) == (2, 37)
    # Invariant: every training sample exactly once per epoch over both ranks
    assert r["times_seen"] == [[1, 1]] * 3
    # The model learns the synthetic sequences: far below the uniform loss, and falling
    assert r["train_loss_last"] < r["train_loss_first"] - 1.0
    assert r["val_loss"] < 0.5 * min(r["val_loss_before"], r["uniform_loss"])
    assert 0.8 < r["fill"] <= 1.0 and r["tokens_per_s"] > 0


# -- the SLURM script ---------------------------------------------------------------------------------
SBATCH = EXAMPLES / "slurm_multinode.sbatch"


def write_stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def slurm_env(bin_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in ("RANK", "WORLD_SIZE")}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    env.update(extra)
    return env


def test_sbatch_script_is_valid_bash() -> None:
    res = subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    # sbatch reads its options only from the header, before the first command
    header = SBATCH.read_text().split("set -euo pipefail")[0]
    assert re.search(r"^#SBATCH --nodes=\d+$", header, re.MULTILINE)
    assert re.search(r"^#SBATCH --ntasks-per-node=1\b", header, re.MULTILINE)


def test_sbatch_builds_a_two_node_torchrun_command(tmp_path: Path) -> None:
    from torch.distributed.run import get_args_parser

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "srun.json"
    # srun records its arguments and the environment the job exports, and starts nothing.
    write_stub(
        bin_dir,
        "srun",
        f'{sys.executable} -c "import json, os, sys; '
        f"json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ)}}, open('{log}', 'w'))\" \"$@\"\n",
    )
    write_stub(bin_dir, "scontrol", '[[ "$1 $2" == "show hostnames" ]] && printf "gpu-node-017\\ngpu-node-018\\n"\n')
    env = slurm_env(
        bin_dir,
        SLURM_NNODES="2",
        SLURM_JOB_NODELIST="gpu-node-[017-018]",
        SLURM_JOB_ID="4242",
        SLURM_GPUS_ON_NODE="8",
        TRAIN="/shared/sets/train",
        VAL="/shared/sets/val",
    )
    res = subprocess.run(
        ["bash", str(SBATCH)], env=env, capture_output=True, text=True, timeout=60, cwd=REPO, check=False
    )
    assert res.returncode == 0, res.stderr
    recorded = json.loads(log.read_text())
    argv: list[str] = recorded["argv"]
    # srun's own options, then the command it runs on every node
    cut = argv.index("torchrun")
    assert "--ntasks-per-node=1" in argv[:cut]
    ns = get_args_parser().parse_args(argv[cut + 1 :])
    assert (ns.nnodes, ns.nproc_per_node) == ("2", "8")
    assert (ns.rdzv_backend, ns.rdzv_endpoint, ns.rdzv_id) == ("c10d", "gpu-node-017:29500", "4242")
    assert Path(ns.training_script) == EXAMPLES / "torchrun_plain.py"
    job = load_example("torchrun_plain").build_parser().parse_args(ns.training_script_args)
    assert (job.train, job.val) == (Path("/shared/sets/train"), Path("/shared/sets/val"))
    assert (job.max_tokens, job.num_workers, job.debug) == (16384, 4, False)
    assert recorded["env"]["MASTER_ADDR"] == "gpu-node-017"
    assert recorded["env"]["NCCL_SOCKET_IFNAME"] == "ib0"


def test_sbatch_runs_for_real_on_one_node(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # One node: srun drops its own options and runs the command; torchrun is torch's launcher.
    write_stub(bin_dir, "srun", 'while [[ "$1" == -* ]]; do shift; done\nexec "$@"\n')
    write_stub(bin_dir, "scontrol", 'printf "127.0.0.1\\n"\n')
    write_stub(bin_dir, "torchrun", f'exec {sys.executable} -m torch.distributed.run "$@"\n')
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = slurm_env(
        bin_dir,
        SLURM_NNODES="1",
        SLURM_JOB_NODELIST="localhost",
        SLURM_JOB_ID="7",
        GPUS_PER_NODE="2",
        MASTER_PORT=str(port),
        NUM_WORKERS="0",
        MAX_STEPS="2",
        MAX_TOKENS="1024",
    )
    res = run_with_watchdog(
        ["bash", str(SBATCH), "--workdir", str(tmp_path), *TINY, "--backend", "gloo"], timeout=240, env=env
    )
    r = finished(res)
    assert (r["world_size"], r["steps"], r["val_count"]) == (2, 2, 37)


def test_migration_guide_code_is_valid_python() -> None:
    text = (EXAMPLES / "from_distributed_sampler.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    assert len(blocks) >= 2, "the guide shows the code before and after"
    for block in blocks:
        ast.parse(block)
    after = "\n".join(blocks[1:])
    assert "shardload" in after and "DistributedSampler" not in after


def test_every_example_is_referenced_from_the_docs() -> None:
    docs = (REPO / "docs" / "distributed.md").read_text()
    for path in sorted(EXAMPLES.iterdir()):
        if path.name != "common.py" and path.suffix in (".py", ".sbatch", ".md"):
            assert f"examples/{path.name}" in docs, path.name
            if path.suffix == ".py":
                # Each example says how to run it
                doc = ast.get_docstring(ast.parse(path.read_text()))
                assert doc and f"examples/{path.name}" in doc, path.name
