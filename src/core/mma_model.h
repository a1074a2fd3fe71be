// The tensor-core arithmetic of one bf16 MMA k-block (16 products + fp32 accumulator), modelled
// bit-exactly on the CPU (DESIGN §3, docs/contract.md "MMA model"):
//   products exact, exponent unnormalized e(a)+e(b); E = max exponent of the nonzero terms and c;
//   each term truncated toward zero to a multiple of 2^(E-25); exact sum; result rounded toward
//   zero to fp32. Blocks chain along K: one block's result is the next block's c.
#pragma once

#include <cstdint>

#include "lockstep/dtype.h"

namespace lockstep {

constexpr int kMmaK = 16;  // k-block length of one MMA step

// One k-block: returns the fp32 result of c + sum_{i<16} a[i]*b[i] as the tensor core computes it.
float mma_kblock_bf16(const bf16* a, const bf16* b, float c);

// Chains k-blocks over a whole range: k must be a multiple of 16. Starts from c.
float mma_chain_bf16(const bf16* a, const bf16* b, int64_t k, float c);

}  // namespace lockstep
