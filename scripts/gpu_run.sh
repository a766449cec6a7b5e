#!/usr/bin/env bash
# The GPU run of backend="cuda" (docs/cuda.md, "On a GPU machine"): builds framejit against the
# machine's own python3 and torch with every core, then runs the GPU tests and
# benchmarks/cuda_chains.py, writing logs and results under $OUT. Meant for the lent GPU machine
# (no network there): Debian's fmt headers travel as .deb files in .gpu/ (prepare them with
# `scripts/gpu_run.sh --prepare` on the CPU machine; .gpu/ is git-ignored, carry it).
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--prepare" ]; then
  mkdir -p .gpu && (cd .gpu && apt-get download libfmt-dev libfmt9)
  grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
  exit 0
fi

OUT="${OUT:-/tmp/framejit_gpu}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
START=$SECONDS
stage() { echo "== $1 ($((SECONDS - START)) s)" | tee -a "$OUT/summary.txt"; }

stage "machine"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  "$PY" -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"
  nproc
} 2>&1 | tee -a "$OUT/summary.txt"

stage "build"
mkdir -p .gpu/root
for f in .gpu/*.deb; do dpkg -x "$f" .gpu/root; done
export CMAKE_PREFIX_PATH="$PWD/.gpu/root/usr"
export CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)"
if ! timeout 300 "$PY" -m pip install -q --no-build-isolation --no-deps \
    --config-settings=cmake.define.FRAMEJIT_BUILD_TESTS=OFF \
    --config-settings=cmake.define.FRAMEJIT_WERROR=OFF . > "$OUT/build.log" 2>&1; then
  stage "build FAILED"
  grep -m 20 -B2 -A8 "error" "$OUT/build.log" | tee -a "$OUT/summary.txt"
  exit 1
fi

stage "gpu tests"
(cd tests && timeout 150 "$PY" -m pytest -p no:cacheprovider python/test_cuda_gpu.py -q -rs \
  > "$OUT/tests.log" 2>&1)
echo "rc=$?" >> "$OUT/tests.log"
tail -n 25 "$OUT/tests.log" | tee -a "$OUT/summary.txt"

stage "benchmark"
timeout 130 "$PY" benchmarks/cuda_chains.py --budget "${BENCH_BUDGET:-60}" \
  --out "$OUT/cuda_chains.md" > "$OUT/bench.log" 2>&1
echo "rc=$?" >> "$OUT/bench.log"
tail -n 40 "$OUT/bench.log" | tee -a "$OUT/summary.txt"
stage "done"
