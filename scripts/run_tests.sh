#!/usr/bin/env bash
# Runs every test: the Catch2 unit tests (through ctest, from the build tree setup.sh left) and
# the pytest suite against the installed framejit.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
build_dir=$(ls -d build/*/ | head -n 1)
ctest --test-dir "$build_dir" --output-on-failure
# Run from tests/ so `import framejit` finds the installed package, not python/ in the tree.
"$PYTHON" -m pytest -q -p no:cacheprovider "$@"
