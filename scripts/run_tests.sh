#!/usr/bin/env bash
# Runs every test: the Catch2 unit tests (through ctest, from the build tree setup.sh left) and
# the pytest suite against the installed framejit.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python_env.sh  # the interpreter and build folder setup.sh used (PYTHON=...)
ctest --test-dir "$FJ_BUILD_DIR" --output-on-failure
# Run from tests/ so `import framejit` finds the installed package, not python/ in the tree.
"$FJ_PY" -m pytest -q -p no:cacheprovider "$@"
