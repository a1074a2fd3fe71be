// The linear log-prob backward with its scratch bounds as parameters (tests: the bits do not
// depend on them). cpu::linear_logprob_backward calls it with the default Chunking.
#pragma once

#include <cstdint>

#include "lockstep/ops/backward.h"

namespace lockstep::cpu::logprob_backward_detail {

// How the op bounds its scratch. None of it changes a bit (tested).
struct Chunking {
  // Token blocks (16 rows each) whose G is materialized at once: [64, V_pad] bf16, never [T, V].
  int64_t chunk_blocks = 4;
  // Wᵀ (re-laid out in G's segment-padded columns) is built once when it fits this many bytes,
  // else hidden_chunk columns at a time for every chunk.
  int64_t wt_budget_bytes = int64_t(64) << 20;
  int64_t hidden_chunk = 64;
};

// cpu::linear_logprob_backward with the given chunking (chunk_blocks, hidden_chunk >= 1).
void linear_logprob_backward_chunked(const TensorView& h, const TensorView& w,
                                     const TensorView& targets, const LogprobParams& params,
                                     const ContractConfig& cfg, const TensorView& lse,
                                     const TensorView& entropy, const TensorView& g_lp,
                                     const TensorView* g_ent, const TensorView& dh,
                                     const TokenOrder& order, const TensorView& dw,
                                     const Chunking& chunking);

// cpu::linear_logprob_backward_partial with the given chunking.
void linear_logprob_backward_partial_chunked(const TensorView& h, const TensorView& w_shard,
                                             const TensorView& targets, const LogprobParams& params,
                                             const ContractConfig& cfg, const LogprobShard& shard,
                                             const TensorView& lse, const TensorView& entropy,
                                             const TensorView& g_lp, const TensorView* g_ent,
                                             const TensorView& dh_partial, const TokenOrder& order,
                                             const TensorView& dw_shard, const Chunking& chunking);

}  // namespace lockstep::cpu::logprob_backward_detail
