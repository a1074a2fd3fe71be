// Internals shared by the LogP op (logprob.cc) and sampling (sampling.cc): the logits of a block
// of tokens against a block of vocab rows by the GEMM contract, and strided element access. Both
// ops get their logits from here, so a token's z bits are the same in both.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/contract.h"
#include "lockstep/ops/logprob.h"
#include "lockstep/tensor.h"

namespace lockstep::cpu::logprob_detail {

// out[r * ld + j] = z[r, j] = Σ_k h[r, k]·w[j, k] by the GEMM contract (fp32 output, K in
// logprob_logits_gemm(cfg)'s one segment), for r < h.size(0), j < w.size(0). Row-invariant: z[r, j]
// depends only on h row r and w row j. h [rows, H], w [n, H]: bf16, last dim contiguous (checked by
// the caller).
void tile_logits(const TensorView& h, const TensorView& w, const ContractConfig& cfg, float* out,
                 int64_t ld);

// Folds tiles_per_segment tile states left to right in each of seg_count consecutive segments
// and combines the segment states in the balanced tree (seg_scratch: seg_count states).
LogprobState fold_tiles(const LogprobState* tiles, int64_t tiles_per_segment, int seg_count,
                        LogprobState* seg_scratch);

// The state of one token over the whole vocab from its padded row y [lay.padded] of tempered
// logits (entries >= V already -inf): tile states, fold, tree — the same bits as linear_logprob.
LogprobState row_state(const float* y, const LogprobVocabLayout& lay,
                       std::vector<LogprobState>* scratch);

// Element i of a 1-D i32/i64 view (any stride).
inline int64_t read_index(const TensorView& t, int64_t i) {
  if (t.dtype == DType::kI32) return static_cast<const int32_t*>(t.data)[i * t.stride[0]];
  return static_cast<const int64_t*>(t.data)[i * t.stride[0]];
}

// Element i of a 1-D f32 view (any stride).
inline float& f32_at(const TensorView& t, int64_t i) {
  return static_cast<float*>(t.data)[i * t.stride[0]];
}

}  // namespace lockstep::cpu::logprob_detail
