#!/usr/bin/env bash
# Diagnosis of the Python module's segfault on the GPU machine (2026-12-02), one device call:
# builds lockstep._C three ways into separate --target dirs, in parallel —
#   A: CUDA, the image's nanobind      C: CPU only
# (the image's nanobind is 3.1.0, the version CI uses: a pinned copy built the same way, B, made
# no difference on 2026-12-02)
# (all with -g), runs dev/py_round_probe.py against each under dev/segv_backtrace.c (native
# backtrace, frames symbolized with addr2line), then the pytest suite against the first build
# whose probe passes. device: run(command="bash dev/gpu_py_diag.sh", carry=[".deps"])
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
py=python3
{
  echo "date $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null)"
  $py -c 'import sys, nanobind, torch; print("python", sys.version.split()[0], "nanobind", nanobind.__version__, "torch", torch.__version__)'
  PYTHONPATH=$PWD/.deps/pynb $py -c 'import nanobind; print("pinned nanobind", nanobind.__version__)'
  ldd --version | head -1
  g++ --version | head -1; which g++ addr2line gdb
  grep -m1 'model name' /proc/cpuinfo; grep -o -m1 'avx512[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
} >"$OUT/diag_env.txt" 2>&1
gcc -shared -fPIC -O1 -o /tmp/segv.so dev/segv_backtrace.c -ldl
nl=(-C "cmake.define.nlohmann_json_DIR=$PWD/.deps/nlohmann/share/cmake/nlohmann_json")
build() {  # name, extra PYTHONPATH, cuda ON/OFF, jobs
  local t0=$(date +%s)
  PYTHONPATH=$2 CMAKE_BUILD_PARALLEL_LEVEL=$4 $py -m pip install --no-build-isolation --no-deps \
    --no-index --target /tmp/py$1 -C build-dir=build/py$1 -C cmake.define.LOCKSTEP_CUDA=$3 \
    -C cmake.define.CMAKE_CXX_FLAGS=-g "${nl[@]}" . >"$OUT/build_$1.log" 2>&1
  echo "build $1 rc $? ($(($(date +%s) - t0)) s)" >>"$OUT/diag_env.txt"
}
build A "" ON 10 & build C "" OFF 6 & wait
for x in A C; do
  so=$(ls /tmp/py$x/lockstep/_C*.so 2>/dev/null)
  [ -n "$so" ] || { echo "no module for $x" >>"$OUT/diag_env.txt"; continue; }
  (cd /tmp && PYTHONPATH=/tmp/py$x LD_PRELOAD=/tmp/segv.so timeout 120 $py -X faulthandler \
    "$OLDPWD/dev/py_round_probe.py") >"$OUT/probe_$x.txt" 2>&1
  rc=$?
  echo "probe $x rc $rc" >>"$OUT/diag_env.txt"
  # Symbolize every frame in our module.
  grep -o "$so+0x[0-9a-f]*" "$OUT/probe_$x.txt" | sed 's/.*+//' | while read -r off; do
    echo "== $off"; addr2line -f -C -i -e "$so" "$off"
  done >"$OUT/symbols_$x.txt" 2>&1
  grep -o '/[^ ]*\.so[^+ ]*+0x[0-9a-f]*' "$OUT/probe_$x.txt" | grep -v "$so" | sort -u |
    while read -r f; do echo "== $f"; addr2line -f -C -e "${f%+*}" "${f##*+}"; done \
    >>"$OUT/symbols_$x.txt" 2>&1
  if [ "$rc" = 0 ] && [ -z "${good:-}" ]; then good=$x; fi
done
good=${good:-A}  # no probe passed: run the suite on A anyway, for its backtrace
if [ -n "${good:-}" ]; then
  echo "pytest with build $good" >>"$OUT/diag_env.txt"
  cache=$(mktemp -d)
  (cd tests/python && PYTHONPATH=/tmp/py$good LD_PRELOAD=/tmp/segv.so TORCHINDUCTOR_CACHE_DIR=$cache \
    LOCKSTEP_REQUIRE_CUDA=1 PYTHONUNBUFFERED=1 timeout 300 $py -X faulthandler -m pytest -q -p no:cacheprovider -rs \
    --durations=5) >"$OUT/pytest_$good.log" 2>&1
  echo "pytest rc $? $(grep -E '[0-9]+ (passed|failed)' "$OUT/pytest_$good.log" | tail -1)" >>"$OUT/diag_env.txt"
fi
cat "$OUT/diag_env.txt"
