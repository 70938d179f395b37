#!/usr/bin/env bash
# Create .venv with a CPU build of torch and shardload installed (editable) with its test extras
# (zarr, webdataset, matplotlib, ray[data] for tests/test_ray.py, ...: see [project.optional-dependencies] test).
# Users who want a CUDA build: set TORCH_SPEC, e.g. TORCH_SPEC="torch==2.13.0" TORCH_INDEX=https://download.pytorch.org/whl/cu128
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  if [ -n "${TORCH_INDEX:-}" ]; then
    .venv/bin/python -m pip install -q "$TORCH_SPEC" --index-url "$TORCH_INDEX"
  else
    .venv/bin/python -m pip install -q "$TORCH_SPEC"
  fi
fi
# the test extra holds every optional package the tests use (zarr, webdataset, tokenizers, ...); fast-json
# (pysimdjson) is in it too, named here as well: tests/prepare/test_fast_json.py runs with it present and absent
.venv/bin/python -m pip install -q -e ".[test,fast-json]"
# the oldest Lightning shardload supports, beside the venv (not in it): tests/distributed/test_trainer_clock.py
# runs the DataModule under it too (PYTHONPATH first), so a Lightning that moved an attribute fails a test
if [ ! -d .venv/lightning-oldest/lightning ]; then
  .venv/bin/python -m pip install -q --no-deps --target .venv/lightning-oldest "lightning==2.2.5" "setuptools<81"
fi
