#!/bin/bash
# Builds and runs dev/math_parity.cu (needs a GPU): GPU vs host bits for all 2^32 inputs.
set -e
cd "$(dirname "$0")/.."
B=${TMPDIR:-/tmp}/math_parity
mkdir -p $B
g++ -O3 -std=c++20 -march=native -ffp-contract=off -fno-fast-math -Iinclude -Isrc -c dev/math_parity_host.cc -o $B/host.o
nvcc -O3 -std=c++17 -fmad=false -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc -Xcompiler=-ffp-contract=off dev/math_parity.cu $B/host.o -o $B/math_parity -lpthread
$B/math_parity
