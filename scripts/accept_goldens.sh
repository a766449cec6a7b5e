#!/usr/bin/env bash
# Rewrites the expected-text files (tests/python/expected/) on every Python set up here: the
# default python3 first (the shared files), then each version whose venv scripts/setup.sh made (PYTHON=python3.X).
# A version whose text differs from the shared file gets its own (tests/python/goldens.py).
# Review the diff afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
golden_tests=(tests/python/test_graph_text.py tests/python/test_cuda_fusion.py)
run_on() {  # $1: 1 writes the shared files, own a version's own where it differs
  echo "=== accepting on $("$FJ_PY" --version) ==="
  FRAMEJIT_ACCEPT=$1 "$FJ_PY" -m pytest -q -p no:cacheprovider "${golden_tests[@]}" -k "expected"
}
(source scripts/python_env.sh && run_on 1)
for venv in "${FRAMEJIT_VENVS:-$HOME/.cache/framejit/venvs}"/py3.*; do
  [ -x "$venv/bin/python" ] || continue
  (PYTHON="$venv/bin/python" && source scripts/python_env.sh && run_on own)
done
git status --short tests/python/expected
