// sampling: the CPU reference op (the executable spec of the contract). Its types, layouts and
// formulas, and the normative description, are in lockstep/contract/sampling.h.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "lockstep/contract/sampling.h"
#include "lockstep/tensor.h"

namespace lockstep {

// The candidate set of one row after the filters (top-k, then top-p, then min-p), as vocab ids in
// ascending order. y [V]: tempered logits of the row (temperature > 0); lse: their logsumexp as
// the LogP op computes it (finite). Greedy rows (temperature 0) do not use it.
std::vector<int64_t> sampling_candidates(const float* y, int64_t V, float lse,
                                         const SamplingParams& params);

namespace cpu {

// Samples one token per row.
//   h            [T, H] bf16, rows may be strided (last dim contiguous)
//   w            [V, H] bf16, rows may be strided (last dim contiguous); V < 2^21
//   params       T entries (the row's request settings)
//   request_ids  [T] i64 (any stride): Philox counter words 2, 3
//   positions    [T] i32 or i64 (any stride), in [0, 2^32): Philox counter word 1
//   token_ids    [T] i32 or i64 (any stride): the sampled ids
//   logp, lse, entropy  [T] f32 (any stride): linear_logprob's values for the sampled id at
//                temperature params[t].logprob_temperature()
// A row whose logits give a non-finite logsumexp (NaN or +inf logits, all −inf) is an Error.
void sample(const TensorView& h, const TensorView& w, std::span<const SamplingParams> params,
            const TensorView& request_ids, const TensorView& positions, const ContractConfig& cfg,
            const TensorView& token_ids, const TensorView& logp, const TensorView& lse,
            const TensorView& entropy);

// Vocab-parallel sampling in two steps, with sample's bits: each rank computes the logits of its
// lm_head rows, the ranks gather them side by side, and one sample_logits call decides.
//   lm_head_logits: z [T, N] f32 (rows may be strided, last dim contiguous) = h · wᵀ by the
//                   logits GEMM of linear_logprob and sample (logprob_logits_gemm(cfg)); h, w as
//                   sample's, N = w's rows (any row range of an lm_head). z[t, j] depends only on
//                   h row t and w row j: a shard's logits are the full logits' columns.
//   sample_logits:  sample() from z [T, V] f32, the lm_head_logits of the whole lm_head (or of
//                   its shards side by side): the same ids and values as sample(h, w, ...).
void lm_head_logits(const TensorView& h, const TensorView& w, const ContractConfig& cfg,
                    const TensorView& z);
void sample_logits(const TensorView& z, std::span<const SamplingParams> params,
                   const TensorView& request_ids, const TensorView& positions,
                   const ContractConfig& cfg, const TensorView& token_ids, const TensorView& logp,
                   const TensorView& lse, const TensorView& entropy);

}  // namespace cpu
}  // namespace lockstep
