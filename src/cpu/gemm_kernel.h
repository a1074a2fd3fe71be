// Internal interface between the GEMM op (gemm.cc: checks, scalar path, bias/rounding) and its
// vectorized MMA-model kernel (gemm_avx512.cc). Both compute the same "tree value" of an output:
// the balanced fp32 tree over nseg segment chains (mma_chain_bf16 from +0) of the zero-padded row
// pair. The fast kernel is bitwise equal to the scalar one on every input (it routes the inputs
// it does not model, e.g. inf/NaN/subnormal, to the scalar chain itself).
#pragma once

#include <cstdint>

#include "lockstep/tensor.h"

namespace lockstep::cpu::gemm_detail {

// x [M, kw], w [N, kw] bf16 (last dim contiguous); each row is zero-padded to nseg·seg_len and
// cut into nseg segments of seg_len (a multiple of 16).
struct Problem {
  TensorView x, w;
  int64_t M = 0, N = 0, kw = 0;
  int nseg = 1;
  int64_t seg_len = 0;
};

// Receives the tree values of outputs (m, n0 .. n0+count) of one tile.
using TileSink = void (*)(void* ctx, int64_t m, int64_t n0, int64_t count, const float* values);

// Balanced binary tree over n (a power of two) fp32 values, left + right (RNE).
inline float tree_sum(const float* v, int n) {
  if (n == 1) return v[0];
  return tree_sum(v, n / 2) + tree_sum(v + n / 2, n / 2);
}

// The scalar path for one output; xbuf, wbuf: scratch of nseg·seg_len elements each.
float tree_value_scalar(const bf16* xr, const bf16* wr, int64_t kw, int nseg, int64_t seg_len,
                        bf16* xbuf, bf16* wbuf);

// True when this build has the vectorized kernel (AVX-512 F/BW/DQ/VL at compile time).
bool fast_kernel_available();

// Computes every output of p with the vectorized kernel (parallel over tiles; each output is
// computed by one task in the contract order) and hands the tree values to sink.
void tree_all_fast(const Problem& p, TileSink sink, void* ctx);

}  // namespace lockstep::cpu::gemm_detail
