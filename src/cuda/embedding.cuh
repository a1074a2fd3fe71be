// Embedding kernels, docs/contract.md §E.4: a gather (NaN stored as 0x7FC0), the vocab-parallel
// partial (the shard's rows, −0.0 for ids other ranks own), and the combine: an fp32 sum of the
// partials in rank order, rounded once (exact: all terms but one are −0). An id outside the
// vocabulary (device ids cannot be checked before the launch) gives a canonical-NaN row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/elementwise_common.cuh"

namespace lockstep::cuda::detail {

constexpr int kMaxCombinePartials = 64;

struct EmbeddingParams {
  IndexRef ids;           // [T]
  const uint16_t* table;  // [v1 - v0, H], row stride lt (row 0 = vocab row v0)
  uint16_t* out;          // [T, H], row stride lo
  int64_t lt, lo, T, H;
  int64_t v0, v1, vocab;  // shard rows [v0, v1) of the vocabulary [0, vocab)
};

static __global__ void embedding_kernel(const EmbeddingParams p) {
  const int64_t n = p.T * p.H;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / p.H, k = idx - t * p.H;
    const int64_t id = p.ids[t];
    uint16_t b;
    if (id < 0 || id >= p.vocab) {
      b = kNanBf16;  // documented: invalid id
    } else if (id < p.v0 || id >= p.v1) {
      b = kNegZeroBf16;  // another rank's row
    } else {
      b = p.table[(id - p.v0) * p.lt + k];
      if ((b & 0x7fffu) > 0x7f80u) b = kNanBf16;
    }
    p.out[t * p.lo + k] = b;
  }
}

struct EmbedCombineParams {
  const uint16_t* part[kMaxCombinePartials];  // [T, H] each, row stride ld[r]
  int64_t ld[kMaxCombinePartials];
  int n;
  uint16_t* out;  // [T, H], row stride lo; may be the same view as part[0]
  int64_t lo, T, H;
};

static __global__ void embedding_combine_kernel(const EmbedCombineParams p) {
  const int64_t n = p.T * p.H;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / p.H, k = idx - t * p.H;
    float acc = bf16_bits_to_f32(p.part[0][t * p.ld[0] + k]);
    for (int r = 1; r < p.n; ++r)
      acc = __fadd_rn(acc, bf16_bits_to_f32(p.part[r][t * p.ld[r] + k]));
    p.out[t * p.lo + k] = f32_to_bf16_bits(acc);
  }
}

}  // namespace lockstep::cuda::detail
