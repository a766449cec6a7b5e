# Sourced by setup.sh and run_tests.sh: picks the Python interpreter both scripts use.
#   PYTHON unset            python3 on PATH, used as it is (packages go into its own site-packages)
#   PYTHON=python3.12 etc.  that version (from PATH, else from ~/.pyenv/versions), in a venv of its
#                           own under $FRAMEJIT_VENVS (default ~/.cache/framejit/venvs) that later
#                           runs reuse, so a warm machine does not download torch again
#   PYTHON=<a venv's python> that venv, as it is
# Sets FJ_PY to the interpreter to run and FJ_BUILD_DIR to its build folder (build/<wheel tag>).

fj_find_python() {
  local want="$1"
  if "$want" -c "" >/dev/null 2>&1; then
    command -v "$want" 2>/dev/null || echo "$want"
    return 0
  fi
  local found
  found=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/*/bin/"$want" 2>/dev/null | sort -V | tail -n 1)
  if [ -n "$found" ] && "$found" -c "" >/dev/null 2>&1; then
    echo "$found"
    return 0
  fi
  echo "framejit: no Python interpreter '$want' on PATH or under ~/.pyenv/versions" >&2
  return 1
}

if [ -z "${PYTHON:-}" ]; then
  FJ_PY=$(fj_find_python python3)
else
  FJ_PY=$(fj_find_python "$PYTHON")
  if [ "$("$FJ_PY" -c 'import sys; print(int(sys.prefix != sys.base_prefix))')" = 0 ]; then
    fj_version=$("$FJ_PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    fj_venv="${FRAMEJIT_VENVS:-$HOME/.cache/framejit/venvs}/py$fj_version"
    if [ ! -x "$fj_venv/bin/python" ]; then
      echo "framejit: creating the Python $fj_version venv $fj_venv"
      "$FJ_PY" -m venv "$fj_venv"
      "$fj_venv/bin/python" -m pip install -q --upgrade pip
    fi
    FJ_PY="$fj_venv/bin/python"
  fi
fi
FJ_BUILD_DIR="build/$("$FJ_PY" -c 'import sys, sysconfig
tag = "cp%d%d" % sys.version_info[:2]
print("%s-%s-%s" % (tag, tag, sysconfig.get_platform().replace("-", "_").replace(".", "_")))')"
export FJ_PY FJ_BUILD_DIR
