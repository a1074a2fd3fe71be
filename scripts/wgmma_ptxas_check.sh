#!/usr/bin/env bash
# What ptxas makes of the Hopper GEMM kernel, in seconds, without building the library: compiles
# five representative gemm_sm90_kernel instantiations (the 128x256 and 128x128-tree store kernels,
# the 128x256 and ping-pong accumulate kernels, the ping-pong one with y through TMA) from the working tree's headers and reports, per
# kernel, the stack, the SASS size and the k-loop's wgmma waits, and any ptxas note that costs
# speed: C7517 (a warpgroup.wait injected), C7520 (every wgmma serialized). Run it after touching
# src/cuda/gemm/*.cuh (docs/perf.md session 25: an epilogue change can serialize the main loop).
# Usage: bash scripts/wgmma_ptxas_check.sh [SRC_ROOT]   (default: this checkout). CI runs it
# wherever nvcc is (.ci/run); exit 1 on any C7517 / C7520 note.
set -euo pipefail
root=$(cd "${1:-$(dirname "$0")/..}" && pwd)
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/k.cu" <<'CU'
#include "cuda/gemm/mainloop_sm90.cuh"
namespace lockstep::cuda::detail {
#define LS_K(BM, BN, WGN, NS, L, EPI, PP, AT, BT)                                              \
  template __global__ void gemm_sm90_kernel<BM, BN, WGN, NS, L, EPI, PP, AT, BT>(             \
      const __grid_constant__ CUtensorMap, const __grid_constant__ CUtensorMap,                \
      const EPI::Params, const __grid_constant__ sm90_blocked_maps_t<EPI>);
using TmaY = Sm90TmaYEpilogue<Sm90AccumulateEpilogue, 4>;
using TmaY1 = Sm90TmaYEpilogue<Sm90AccumulateEpilogue, 1>;
LS_K(128, 256, 1, 4, 0, Sm90StoreEpilogue, false, false, false)
LS_K(128, 128, 1, 4, 2, Sm90StoreEpilogue, false, false, false)
LS_K(128, 256, 1, 4, 0, Sm90AccumulateEpilogue, false, true, true)
LS_K(64, 256, 1, 5, 0, Sm90AccumulateEpilogue, true, true, true)
LS_K(64, 256, 1, 4, 0, TmaY, true, true, true)
LS_K(64, 256, 1, 5, 0, TmaY1, true, true, true)
}
CU
"$nvcc" -I"$root/include" -I"$root/src" -O3 --generate-code=arch=compute_90a,code=sm_90a \
  -fmad=false --expt-relaxed-constexpr -std=c++20 -Xptxas -v -c "$tmp/k.cu" -o "$tmp/k.o" \
  >"$tmp/ptxas.txt" 2>&1 || { cat "$tmp/ptxas.txt"; exit 1; }
bad=$(grep -c 'C7517\|C7520' "$tmp/ptxas.txt" || true)
{ grep 'C7517\|C7520' "$tmp/ptxas.txt" || true; } | sed 's/ in the function.*//; s/ in function.*//' | sort | uniq -c
if [ -x "$cuobjdump" ]; then
  "$cuobjdump" -sass "$tmp/k.o" | awk '
    /Function :/ { if (name) printf "%6d instructions, wgmma waits: %d x 0, %d x 1  %s\n", n, w0, w1, name
                   name = $3; n = 0; w0 = 0; w1 = 0; next }
    /^ +\/\*[0-9a-f]+\*\// { n++ }
    /DEPBAR.LE gsb0, 0x0/ { w0++ }
    /DEPBAR.LE gsb0, 0x1/ { w1++ }
    END { if (name) printf "%6d instructions, wgmma waits: %d x 0, %d x 1  %s\n", n, w0, w1, name }' |
    sed 's/_ZN8lockstep4cuda6detail16gemm_sm90_kernel//; s/EEEv14CUtensorMap.*//'
  "$cuobjdump" -res-usage "$tmp/k.o" | grep -o 'REG:[0-9]* STACK:[0-9]*' | sort | uniq -c
else
  echo "(no cuobjdump: set CUOBJDUMP; Triton's wheel carries one)"
fi
echo "ptxas notes that cost speed (C7517/C7520): $bad"
[ "$bad" -eq 0 ]
