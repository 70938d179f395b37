#!/usr/bin/env bash
# Build the documentation site strictly (any broken page, link, anchor or API reference fails).
#   bash tools/check_docs.sh [VENV]      (default VENV: .venv, as made by tools/setup_env.sh)
# Installs shardload's [docs] extra into VENV, then runs `mkdocs build --strict` into a
# temporary directory that is removed afterwards. To preview the site: VENV/bin/mkdocs serve
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
PY="$VENV/bin/python"
if [ ! -x "$PY" ]; then
  echo "check_docs: no virtual environment at $VENV; run tools/setup_env.sh first" >&2
  exit 2
fi
# The [docs] extra installs shardload too, which depends on torch: without torch already in
# place, pip would fetch its default (multi-GB CUDA) build.
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "check_docs: torch is not installed in $VENV; run tools/setup_env.sh (or install a torch build) first" >&2
  exit 2
fi
"$PY" -m pip install -q -e ".[docs]"
SITE=$(mktemp -d "${TMPDIR:-/tmp}/shardload-site.XXXXXX")
trap 'rm -rf "$SITE"' EXIT
NO_MKDOCS_2_WARNING=1 "$PY" -m mkdocs build --strict --site-dir "$SITE"
echo "check_docs: ok (mkdocs build --strict)"
