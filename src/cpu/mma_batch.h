// Batched MMA-model chains: one bf16 row a against n rows of b, each output exactly
// mma_chain_bf16(a, b_j, k, c_j) (core/mma_model.h, docs/contract.md §M), bit for bit on every
// input. The AVX-512 path computes 16 outputs per step with the GEMM's exact k-block arithmetic
// (gemm_avx512.cc, contract §G.9) and hands outputs whose inputs it does not model (inf, NaN,
// subnormal, extreme exponents, tiny or huge c) to the scalar chain.
#pragma once

#include <cstdint>

#include "lockstep/dtype.h"

namespace lockstep::cpu {

// a [k], b [n, ldb] (row j = b + j·ldb, k elements used), c_in [n] or nullptr (+0), c_out [n]:
//   c_out[j] = mma_chain_bf16(a, b + j·ldb, k, c_in ? c_in[j] : +0)   for j < n.
// k must be a multiple of 16. c_out may alias c_in.
void mma_chain_rows_bf16(const bf16* a, const bf16* b, int64_t ldb, int64_t n, int64_t k,
                         const float* c_in, float* c_out);

}  // namespace lockstep::cpu
