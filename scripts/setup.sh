#!/usr/bin/env bash
# Installs the Debian packages lockstep needs (only those missing), then configures and builds
# into ./build. Used by scripts/run.sh, scripts/test.sh and .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(cmake make g++ python3 libgtest-dev libbenchmark-dev libopenblas-dev nlohmann-json3-dev libcli11-dev clang-format)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >build.configure.log 2>&1 || {
  cat build.configure.log
  exit 1
}
echo "[setup] building ($(grep -q 'LOCKSTEP_CUDA:BOOL=ON' build/CMakeCache.txt && echo 'with' || echo 'without') CUDA sources, $jobs jobs)"
if ! cmake --build build -j"$jobs" >build.log 2>&1; then
  grep -E -A5 'error|Error' build.log | head -60
  echo "[setup] build failed; full log in build.log"
  exit 1
fi
grep -E 'warning: ' build.log | sort -u | head -20 || true
echo "[setup] build ok"
