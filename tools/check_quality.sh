#!/usr/bin/env bash
# The quality gates besides the tests: lint, formatting, strict types, and the docs site.
#   bash tools/check_quality.sh [VENV]      (default VENV: .venv, as made by tools/setup_env.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  echo "check_quality: no virtual environment at $VENV; run tools/setup_env.sh first" >&2
  exit 2
fi
"$VENV/bin/python" -m pip install -q -e ".[lint]"
echo "== ruff check";         "$VENV/bin/ruff" check .
echo "== ruff format --check"; "$VENV/bin/ruff" format --check .
echo "== mypy --strict";       "$VENV/bin/mypy"
echo "== layers and cycles";   "$VENV/bin/lint-imports" --no-cache --no-logo
echo "== docs";                bash tools/check_docs.sh "$VENV"
echo "check_quality: ok"
