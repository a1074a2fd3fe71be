#!/usr/bin/env bash
# Installs the Debian packages lockstep needs (only those missing), then configures and builds
# into ./build, printing progress (full log: build.log). Used by scripts/run.sh, scripts/test.sh
# and .ci/run.
#
#   scripts/setup.sh [--no-cuda] [--target NAME]...
#     --no-cuda      build without the CUDA sources (same as LOCKSTEP_CUDA=OFF)
#     --target NAME  build only NAME (repeatable; default: everything)
#   LOCKSTEP_CUDA=ON|OFF  build the CUDA sources or not; unset: keep build/'s earlier choice, and
#                         on a first configure build them when nvcc is found
#   LOCKSTEP_BUILD_DIR    build directory (default: build)
#   LOCKSTEP_CMAKE_ARGS   extra configure arguments (e.g. "-DLOCKSTEP_BENCH=OFF")
# ccache is used when it is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-cuda) LOCKSTEP_CUDA=OFF ;;
    --target)
      [ $# -ge 2 ] || { echo "[setup] --target needs a name" >&2; exit 2; }
      targets+=(--target "$2")
      shift
      ;;
    *)
      echo "[setup] unknown argument: $1 (usage: scripts/setup.sh [--no-cuda] [--target NAME]...)" >&2
      exit 2
      ;;
  esac
  shift
done
build=${LOCKSTEP_BUILD_DIR:-build}

pkgs=(cmake make g++ python3 libgtest-dev libbenchmark-dev libopenblas-dev nlohmann-json3-dev libcli11-dev clang-format librsvg2-bin)
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

start=$(date +%s)
elapsed() {
  local s=$(($(date +%s) - start))
  printf '%dm%02ds' $((s / 60)) $((s % 60))
}

args=(-DCMAKE_BUILD_TYPE=Release)
case "${LOCKSTEP_CUDA:-}" in
  "") ;;
  ON | on | 1) args+=(-DLOCKSTEP_CUDA=ON) ;;
  OFF | off | 0) args+=(-DLOCKSTEP_CUDA=OFF) ;;
  *) echo "[setup] LOCKSTEP_CUDA must be ON or OFF, not '$LOCKSTEP_CUDA'" >&2; exit 2 ;;
esac
if command -v ccache >/dev/null 2>&1; then
  args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
# shellcheck disable=SC2206  # LOCKSTEP_CMAKE_ARGS is a space-separated list on purpose
args+=(${LOCKSTEP_CMAKE_ARGS:-})
if [ "$build" = build ]; then
  log=build.log conf_log=build.configure.log
else
  mkdir -p "$build"
  log=$build/build.log conf_log=$build/build.configure.log
fi
cmake -S . -B "$build" "${args[@]}" >"$conf_log" 2>&1 || {
  cat "$conf_log"
  exit 1
}

cuda=$(grep -q 'LOCKSTEP_CUDA:BOOL=ON' "$build/CMakeCache.txt" && echo with || echo without)
what=${targets[*]:-}
what=${what//--target /}
jobs=$(nproc 2>/dev/null || echo 2)
echo "[setup] building ${what:-everything} in $build/ ($cuda CUDA sources, $jobs jobs; log: $log)"

# While the build runs, a watcher looks at the newest progress line ("[ 42%] Building ...") every
# 5 s and prints it when the percentage moved, and at least every 30 s a line saying the build is
# still running (so at most ~100 progress lines, and never a silent minute).
watch_progress() {
  local last="" line quiet=0
  while sleep 5; do
    line=$(grep -E '^\[ *[0-9]+%\]|^\[[0-9]+/[0-9]+\]' "$log" | tail -n 1 || true)
    quiet=$((quiet + 5))
    if [ -n "$line" ] && [ "${line%%]*}" != "$last" ]; then
      echo "[setup] $(elapsed) ${line:0:110}"
      last=${line%%]*} quiet=0
    elif [ "$quiet" -ge 30 ]; then
      echo "[setup] $(elapsed) still building"
      quiet=0
    fi
  done
}
: >"$log"
watch_progress &
watcher=$!
trap 'kill "$watcher" 2>/dev/null || true' EXIT
if ! cmake --build "$build" -j"$jobs" "${targets[@]}" >"$log" 2>&1; then
  kill "$watcher" 2>/dev/null || true
  grep -E -A5 'error|Error' "$log" | head -60
  echo "[setup] build failed after $(elapsed); full log in $log"
  exit 1
fi
kill "$watcher" 2>/dev/null || true
grep -E 'warning: ' "$log" | sort -u | head -20 || true
echo "[setup] build ok ($(elapsed))"
