#!/usr/bin/env bash
# Packaging check (run by .ci/run after the tests): both ways of making a wheel, `pip wheel
# --no-build-isolation .` (scikit-build-core) and `python setup.py bdist_wheel` (setuptools over
# the same CMake build), give a wheel that installs and runs in a fresh venv holding only torch
# 2.13.0: no Debian package, no build tree, nothing from the checkout on sys.path.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python_env.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$FJ_PY" -m pip wheel -q --no-build-isolation --no-deps -w "$work/pip" . 2>&1 | grep -v "^WARNING: Location" || true
"$FJ_PY" setup.py -q bdist_wheel -d "$work/setup" >"$work/setup.log" 2>&1 || { cat "$work/setup.log"; exit 1; }
for kind in pip setup; do
  wheel=$(ls "$work/$kind"/framejit-*.whl)
  "$FJ_PY" -m venv "$work/venv-$kind"
  venv_py="$work/venv-$kind/bin/python"
  "$venv_py" -m pip install -q torch==2.13.0 2>&1 | grep -v "^WARNING: Location" || true
  "$venv_py" -m pip install -q --no-deps "$wheel" 2>&1 | grep -v "^WARNING: Location" || true
  # From an empty folder: the installed wheel, not the checkout, is imported.
  out=$(cd "$work" && FRAMEJIT_LOGS=graph_code "$venv_py" -W ignore "$OLDPWD/examples/seed.py" 2>&1)
  graphs=$(grep -c "===== __compiled_fn_" <<<"$out" || true)
  where=$(cd "$work" && "$venv_py" -c "import framejit, os; print(os.path.dirname(framejit.__file__))")
  case "$where" in "$work/venv-$kind/"*) ;; *) echo "framejit imported from $where"; exit 1 ;; esac
  if [ "$graphs" -lt 2 ]; then echo "$out"; echo "wheel from $kind: the seed demo printed $graphs graphs"; exit 1; fi
  echo "wheel from $kind ($(basename "$wheel")): installs in a fresh venv, seed demo printed $graphs graphs"
done
