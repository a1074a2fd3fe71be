// The linear log-prob backward with its token chunk size as a parameter (tests: the bits do not
// depend on it). cpu::linear_logprob_backward calls it with kLogprobBackwardChunkBlocks.
#pragma once

#include <cstdint>

#include "lockstep/ops/backward.h"

namespace lockstep::cpu::logprob_backward_detail {

// Token blocks (16 rows each) whose G the op materializes at once: bounded [64, V_pad] bf16
// scratch, never [T, V].
constexpr int64_t kLogprobBackwardChunkBlocks = 4;

// cpu::linear_logprob_backward processing `chunk_blocks` (>= 1) token blocks per chunk.
void linear_logprob_backward_chunked(const TensorView& h, const TensorView& w,
                                     const TensorView& targets, const LogprobParams& params,
                                     const ContractConfig& cfg, const TensorView& lse,
                                     const TensorView& entropy, const TensorView& g_lp,
                                     const TensorView* g_ent, const TensorView& dh,
                                     const TokenOrder& order, const TensorView& dw,
                                     int64_t chunk_blocks);

}  // namespace lockstep::cpu::logprob_backward_detail
