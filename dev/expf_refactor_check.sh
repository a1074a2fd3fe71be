#!/usr/bin/env bash
# ls_expf after its core moved into math_detail::expf_reduced (98e3cc4) against ls_expf as it was
# (e190dc7's src/core/math.h), over all 2^32 inputs on the host (docs/gpu-validation.md, session
# 32: 0 differ; ~4 min on one core). The old header is compiled under a renamed namespace.
#   bash dev/expf_refactor_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/old/core"
git show e190dc7:src/core/math.h >"$tmp/old/core/math.h"
cp src/core/hd.h "$tmp/old/core/"
printf '#include "core/math.h"\nfloat old_expf(float x) { return lockstep::ls_expf(x); }\n' >"$tmp/old.cc"
cat >"$tmp/new.cc" <<'CC'
#include <cstdint>
#include <cstdio>
#include "core/math.h"
float old_expf(float x);
int main() {
  uint64_t bad = 0;
  for (uint64_t b = 0; b <= 0xffffffffull; ++b) {
    const float x = lockstep::f32_from_bits(uint32_t(b));
    if (lockstep::f32_bits(lockstep::ls_expf(x)) != lockstep::f32_bits(old_expf(x)) && bad++ < 5)
      std::printf("differs at %08x\n", unsigned(b));
  }
  std::printf("all 2^32 inputs: %llu differ\n", (unsigned long long)bad);
  return bad != 0;
}
CC
flags=(-std=c++20 -O2 -ffp-contract=off -fno-fast-math)
g++ "${flags[@]}" -I"$tmp/old" -Iinclude -Dlockstep=lockstep_old -c "$tmp/old.cc" -o "$tmp/old.o"
g++ "${flags[@]}" -Isrc -Iinclude "$tmp/new.cc" "$tmp/old.o" -o "$tmp/cmp"
"$tmp/cmp"
