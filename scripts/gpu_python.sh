#!/usr/bin/env bash
# The Python package on the GPU machine, in ONE device call: builds lockstep._C with CUDA
# (pip install . -C cmake.define.LOCKSTEP_CUDA=ON, sm_90a) into the image's Python and runs the
# pytest suite (tests/python) there, CUDA tests included.
#   here:    bash scripts/gpu_python.sh --prepare    (copies nlohmann_json into .deps/: the GPU
#            image has CMake, ninja, nanobind, scikit-build-core, pytest, torch, transformers, but
#            no Debian -dev packages, and the engine reads config.json with nlohmann_json)
#   device:  run(command="bash scripts/gpu_python.sh [pytest arguments]", carry=[".deps"])
# The build uses every core (CMAKE_BUILD_PARALLEL_LEVEL) and no ccache. Logs go under $OUT (./out
# by hand): python_install.log, pytest.log and python_summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--prepare" ]; then
  set -e
  src=$(dirname "$(dpkg -L nlohmann-json3-dev 2>/dev/null | grep -m1 'nlohmann_jsonConfig.cmake$')")
  [ -d "$src" ] || { echo "[gpu_python] nlohmann-json3-dev is not installed (scripts/setup.sh)"; exit 1; }
  # The package's CMake config is relocatable: <prefix>/share/cmake/nlohmann_json, <prefix>/include.
  rm -rf .deps/nlohmann && mkdir -p .deps/nlohmann/share/cmake .deps/nlohmann/include
  cp -r "$src" .deps/nlohmann/share/cmake/
  cp -r /usr/include/nlohmann .deps/nlohmann/include/
  grep -qx '/.deps/' .git/info/exclude 2>/dev/null || echo /.deps/ >>"$(git rev-parse --git-path info/exclude)"
  echo "[gpu_python] prepared .deps/nlohmann ($(du -sh .deps/nlohmann | cut -f1)): carry .deps"
  exit 0
fi

OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
log() { echo "[gpu_python] $*" | tee -a "$OUT/python_summary.txt"; }
log "date $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null)"
log "gpu $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
py=${PYTHON:-python3}
# The image's default compiler (CXX=/opt/gcc/bin/g++) links libstdc++ statically, which crashes a
# module loaded next to torch (cmake/check_shared_libstdcxx.cmake refuses such a build): use the
# system g++, which links it as a shared library.
if [ -x /usr/bin/g++ ]; then
  export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
fi
log "compiler $($CXX --version 2>/dev/null | head -1) ($CXX)"
log "$($py -c 'import sys, torch; print("python", sys.version.split()[0], "| torch", torch.__version__, "cuda", torch.version.cuda)')"
defs=(-C cmake.define.LOCKSTEP_CUDA=ON)
if [ -d .deps/nlohmann ]; then
  defs+=(-C "cmake.define.nlohmann_json_DIR=$PWD/.deps/nlohmann/share/cmake/nlohmann_json")
fi
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
start=$(date +%s)
if ! $py -m pip install --no-build-isolation --no-deps --no-index -v "${defs[@]}" . \
  >"$OUT/python_install.log" 2>&1; then
  log "FAIL install ($(($(date +%s) - start)) s): $(grep -E -m3 'error|Error' "$OUT/python_install.log" | tr '\n' ' ')"
  exit 1
fi
log "installed ($(($(date +%s) - start)) s): $($py -c 'import lockstep; print("lockstep", lockstep.__version__, "cuda_build", lockstep.cuda_build)')"
cache=$(mktemp -d)
start=$(date +%s)
# Run from tests/python against the installed package (never the source tree's python/).
# LOCKSTEP_REQUIRE_CUDA=1: test_cuda.py fails instead of skipping if the CUDA path is missing.
(cd tests/python && LOCKSTEP_REQUIRE_CUDA=1 TORCHINDUCTOR_CACHE_DIR=$cache PYTHONUNBUFFERED=1 \
  $py -m pytest -q \
  -p no:cacheprovider -rs --durations=5 "$@") >"$OUT/pytest.log" 2>&1
rc=$?
log "pytest exit $rc ($(($(date +%s) - start)) s): $(grep -E '[0-9]+ (passed|failed)' "$OUT/pytest.log" | tail -1)"
exit $rc
