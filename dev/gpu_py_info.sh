#!/usr/bin/env bash
# Second step of the GPU image's Python-module segfault (2026-12-02): the crash is in
# TensorView::shape_string's ostream insertion inside _C.so. Records the build environment and
# the module's link (compiler, flags, libstdc++), brings the module back, and tries a build with
# the compiler environment cleared (E). device: run(command="bash dev/gpu_py_info.sh", carry=[".deps"])
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
py=python3
{
  env | grep -E '^(CC|CXX|CUDAHOSTCXX|CFLAGS|CXXFLAGS|LDFLAGS|CPPFLAGS|CPATH|LIBRARY_PATH|LD_LIBRARY_PATH|LD_PRELOAD|PATH|CMAKE[A-Z_]*|NVCC[A-Z_]*)='
  ls /opt; ls /opt/gcc/bin 2>&1 | head -5
  /usr/bin/g++ -print-file-name=libstdc++.so; /usr/bin/g++ -print-file-name=libstdc++.a
  $py -c 'import torch, lockstep; print(torch.__file__)' 2>&1 | tail -1
  $py - <<'PY'
import torch
print([l.split()[-1] for l in open("/proc/self/maps") if "libstdc++" in l or "libgcc_s" in l][:4])
PY
} >"$OUT/info_env.txt" 2>&1
gcc -shared -fPIC -O1 -o /tmp/segv.so dev/segv_backtrace.c -ldl
nl=(-C "cmake.define.nlohmann_json_DIR=$PWD/.deps/nlohmann/share/cmake/nlohmann_json")
build() {  # name, env prefix...
  local n=$1; shift
  env "$@" CMAKE_BUILD_PARALLEL_LEVEL=8 $py -m pip install -v --no-build-isolation --no-deps \
    --no-index --target /tmp/py$n -C build-dir=build/py$n -C cmake.define.LOCKSTEP_CUDA=OFF \
    -C cmake.define.CMAKE_CXX_FLAGS=-g -C cmake.define.CMAKE_VERBOSE_MAKEFILE=ON "${nl[@]}" . \
    >"$OUT/build_$n.log" 2>&1
  echo "build $n rc $?" >>"$OUT/info_env.txt"
}
build C &
build E -u CC -u CXX -u CFLAGS -u CXXFLAGS -u LDFLAGS -u CPPFLAGS CXX=/usr/bin/g++ CC=/usr/bin/gcc &
wait
for n in C E; do
  so=$(ls /tmp/py$n/lockstep/_C*.so)
  cp "$so" "$OUT/_C_$n.so"
  grep -E '^CMAKE_(CXX_COMPILER|CXX_FLAGS|SHARED_LINKER_FLAGS|MODULE_LINKER_FLAGS|EXE_LINKER_FLAGS|CXX_FLAGS_RELEASE):' \
    build/py$n/CMakeCache.txt >"$OUT/cache_$n.txt" 2>&1
  grep -E -B2 -A2 '_C\.cpython' build/py$n/build.ninja >"$OUT/ninja_$n.txt" 2>&1
  { readelf -d "$so" | grep -E 'NEEDED|RPATH|RUNPATH'; ldd "$so"; nm -D --defined-only "$so" | grep -c ' [TW] _ZNS'; } \
    >"$OUT/elf_$n.txt" 2>&1
  (cd /tmp && PYTHONPATH=/tmp/py$n LD_PRELOAD=/tmp/segv.so timeout 120 $py "$OLDPWD/dev/py_round_probe.py") \
    >"$OUT/probe_$n.txt" 2>&1
  echo "probe $n rc $?" >>"$OUT/info_env.txt"
done
cat "$OUT/info_env.txt"
