// The tensor-core arithmetic of one bf16 MMA k-block (16 products + fp32 accumulator), modelled
// bit-exactly on the CPU (DESIGN §3, docs/contract.md §M). Verified on an H200 for mma.sync
// m16n8k16 and wgmma m64nNk16 (same model), random and edge-case data (tests/golden/):
//   products exact, exponent unnormalized e(a)+e(b) (subnormals: e = -126); E = max exponent of
//   the nonzero terms and c; each term truncated toward zero to a multiple of 2^max(E-25, -158);
//   exact sum; result rounded toward zero onto the fp32 grid (subnormals included), >= 2^128 ->
//   inf, exact zero -> +0; any NaN / inf*0 / inf-inf -> 0x7fffffff. Blocks chain along K: one
//   block's result is the next block's c.
#pragma once

#include <cstdint>

#include "lockstep/dtype.h"

namespace lockstep {

constexpr int kMmaK = 16;  // k-block length of one MMA step

// One k-block: returns the fp32 result of c + sum_{i<16} a[i]*b[i] as the tensor core computes it.
// A k-block whose accumulator is not used (wgmma scale-d = 0) equals c = +0.
float mma_kblock_bf16(const bf16* a, const bf16* b, float c);

// Chains k-blocks over a whole range: k must be a multiple of 16. Starts from c.
float mma_chain_bf16(const bf16* a, const bf16* b, int64_t k, float c);

}  // namespace lockstep
