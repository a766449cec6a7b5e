#!/usr/bin/env bash
# Installs everything framejit needs on a fresh Debian machine, then builds and installs framejit
# itself: into python3 (3.11) by default, or with PYTHON=python3.12 / python3.13 into a venv of
# that version (scripts/python_env.sh). Safe to rerun: installed pieces are skipped, the build is
# incremental (build/<wheel tag>/ is kept between runs, ccache caches objects).
set -euo pipefail
cd "$(dirname "$0")/.."

apt_packages=(catch2 libfmt-dev ninja-build ccache cmake g++)
missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${missing[@]}"
fi
source scripts/python_env.sh
PYTHON="$FJ_PY"

# torch is pinned and installed on its own first, so nothing later resolves a bare "torch".
"$PYTHON" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null \
  || "$PYTHON" -m pip install -q "torch==2.13.0"
"$PYTHON" -m pip install -q "scikit-build-core>=0.10" pytest numpy matplotlib nvidia-cuda-nvrtc-cu12
# transformers for the tests on library code (tests/python/test_transformers.py), with torch
# held at its pin so pip resolves nothing else for it.
"$PYTHON" -c "import transformers, sys; sys.exit(transformers.__version__ != '5.24.0')" 2>/dev/null \
  || "$PYTHON" -m pip install -q -c <(echo "torch==2.13.0") "transformers==5.24.0"
# einops (pure Python, no dependencies) for the tests of code written with it (test_einops.py).
"$PYTHON" -c "import einops, sys; sys.exit(einops.__version__ != '0.8.2')" 2>/dev/null \
  || "$PYTHON" -m pip install -q --no-deps "einops==0.8.2"

export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
"$PYTHON" -m pip install -q --no-build-isolation --no-deps .
