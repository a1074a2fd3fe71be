// Internal interface between the GEMM weight gradient (gemm.cc: checks, token blocks, gather) and
// its vectorized kernel (gemm_dw_avx512.cc). One chunk of consecutive token blocks in canonical
// order is gathered with padding rows +0; each dw[n, k] then advances by one MMA chain over the
// chunk's tokens (16 per k-block) from its current value, bit for bit mma_chain_bf16.
#pragma once

#include <cstdint>

#include "lockstep/dtype.h"

namespace lockstep::cpu::dw_detail {

// The chunk's ld = 16·blocks tokens, in two layouts of the same values:
//   dyc [N][ld], xc [K][ld]  column-major (column c of dy / x over the chunk's tokens)
//   xr  [ld][K]              x row-major
struct Chunk {
  const bf16* dyc = nullptr;
  const bf16* xc = nullptr;
  const bf16* xr = nullptr;
  int64_t N = 0, K = 0, ld = 0;
};

// dw[n·ldw + k] = mma_chain_bf16(dyc + n·ld, xc + k·ld, ld, dw[n·ldw + k]) for n in [n0, n1) and
// every k. Outputs whose inputs the kernel does not model exactly (inf, NaN, subnormal, exponent
// sums outside [-100, 90], a tiny accumulator) are computed with mma_chain_bf16 itself, as is
// every output in a build without AVX-512 F/BW/DQ/VL.
void chain_rows(const Chunk& c, int64_t n0, int64_t n1, float* dw, int64_t ldw);

}  // namespace lockstep::cpu::dw_detail
