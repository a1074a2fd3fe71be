#!/usr/bin/env bash
# Builds and installs the Python package (pip install .[torch,test]: lockstep._C + lockstep.torch)
# into a virtual environment and runs its pytest suite (tests/python), printing the time of each
# step. CPU only. Needs python3 (with venv), a C++20 compiler and nlohmann_json (Debian:
# nlohmann-json3-dev; scripts/setup.sh installs it); CMake comes from PyPI (into the venv) when
# the system's is missing or older than 3.25.
#   scripts/test_python.sh [pytest arguments...]
#   LOCKSTEP_PY_VENV   the virtual environment (default: build/venv-py; created when missing)
#   LOCKSTEP_PY_CMAKE  extra -C settings for the build, e.g. "-C cmake.define.LOCKSTEP_NATIVE=ON"
# ccache is used when it is installed. torch comes from PyPI (the first install downloads it).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=${LOCKSTEP_PY_VENV:-build/venv-py}
t0=$SECONDS
step() { echo "[test_python] $1 ($((SECONDS - t0)) s so far)"; }

if [ ! -x "$venv/bin/python" ]; then
  step "creating $venv"
  if ! python3 -m venv "$venv" 2>/dev/null; then
    # Debian's python3 keeps venv in its own package.
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
      apt-get install -y -qq python3-venv >/dev/null
      python3 -m venv "$venv"
    else
      echo "[test_python] python3 -m venv failed: install python3-venv" >&2
      exit 1
    fi
  fi
fi
case $venv in
  /*) py=$venv/bin/python ;;
  *) py=$root/$venv/bin/python ;;
esac

t=$SECONDS
step "build requirements (scikit-build-core, nanobind)"
reqs=("scikit-build-core>=0.10" "nanobind>=2.0")
cmake_version=$(cmake --version 2>/dev/null | awk 'NR == 1 {print $3}' || true)
if [ -z "$cmake_version" ] || [ "$(printf '3.25\n%s\n' "$cmake_version" | sort -V | head -1)" != 3.25 ]; then
  reqs+=("cmake>=3.25")  # the build runs without isolation: it uses the cmake on PATH
fi
"$py" -m pip install -q --disable-pip-version-check "${reqs[@]}"
venv_bin=$(dirname "$py")
export PATH=$venv_bin:$PATH
echo "[test_python] requirements: $((SECONDS - t)) s"

# NOTE: --no-build-isolation keeps the nanobind sources at one path, so ccache hits across
# rebuilds; the build directory (build/python/<wheel tag>) is reused too.
cmake_args=()
if command -v ccache >/dev/null; then
  cmake_args+=(-C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
fi
# shellcheck disable=SC2206  # word splitting intended
cmake_args+=(${LOCKSTEP_PY_CMAKE:-})
t=$SECONDS
mkdir -p build
step "pip install .[torch,test]"
if ! "$py" -m pip install -q --disable-pip-version-check --no-build-isolation \
    "${cmake_args[@]}" ".[torch,test]" >build/test_python_install.log 2>&1; then
  tail -40 build/test_python_install.log >&2
  echo "[test_python] pip install failed (full log: build/test_python_install.log)" >&2
  exit 1
fi
echo "[test_python] install (build + torch when missing): $((SECONDS - t)) s"
"$py" -c "import lockstep, torch; print('[test_python] lockstep', lockstep.__version__, \
'contract', lockstep.contract_version, 'cuda_build', lockstep.cuda_build, '| torch', torch.__version__)"

# A fresh inductor cache: a cached graph must not stand in for this build's ops.
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
t=$SECONDS
step "pytest tests/python"
# Run from tests/python against the installed package (never the source tree's python/).
(cd tests/python && TORCHINDUCTOR_CACHE_DIR=$cache "$py" -m pytest -q -p no:cacheprovider \
  --durations=5 "$@")
echo "[test_python] pytest: $((SECONDS - t)) s; total $((SECONDS - t0)) s"
