// CUDA linear log-prob and sampling: the same bits as cpu::linear_logprob / _partial / _combine
// and cpu::sample (docs/contract.md §L, §S). Logits come from the GEMM contract on tensor cores
// (lockstep::cuda GEMM), tile states / fold / tree / finish per §L; no [T, V] buffer: work is cut
// into bounded blocks of tokens (the scratch size is printed by logprob_launch_plan).
// Plain C++ header (stream = opaque cudaStream_t, nullptr = default stream). h, w, outputs are
// device views. targets / request_ids / positions: host views are checked like the CPU op, then
// copied; device views are trusted (a target outside [0, V) that is not ignore_index gives NaN).
#pragma once

#include <span>
#include <string>

#include "lockstep/contract.h"
#include "lockstep/ops/logprob.h"
#include "lockstep/ops/sampling.h"
#include "lockstep/tensor.h"

namespace lockstep::cuda {

void linear_logprob(const TensorView& h, const TensorView& w, const TensorView& targets,
                    const LogprobParams& params, const ContractConfig& cfg, const TensorView& logp,
                    const TensorView& lse, const TensorView& entropy, void* stream = nullptr);
void linear_logprob_partial(const TensorView& h, const TensorView& w_shard,
                            const TensorView& targets, const LogprobParams& params,
                            const ContractConfig& cfg, const LogprobShard& shard,
                            const TensorView& state, void* stream = nullptr);
void linear_logprob_combine(const TensorView& states, const TensorView& targets,
                            const LogprobParams& params, const ContractConfig& cfg,
                            int64_t vocab_size, const TensorView& logp, const TensorView& lse,
                            const TensorView& entropy, void* stream = nullptr);

// params: host span (one per row). A row whose lse is not finite throws lockstep::Error naming
// the row (this op synchronizes `stream` to learn it) and no output is written.
void sample(const TensorView& h, const TensorView& w, std::span<const SamplingParams> params,
            const TensorView& request_ids, const TensorView& positions, const ContractConfig& cfg,
            const TensorView& token_ids, const TensorView& logp, const TensorView& lse,
            const TensorView& entropy, void* stream = nullptr);

// Vocab-parallel sampling (lockstep/ops/sampling.h has the contract): the logits of a row range
// of the lm_head, and sample() from logits gathered side by side, with sample's bits.
void lm_head_logits(const TensorView& h, const TensorView& w, const ContractConfig& cfg,
                    const TensorView& z, void* stream = nullptr);
void sample_logits(const TensorView& z, std::span<const SamplingParams> params,
                   const TensorView& request_ids, const TensorView& positions,
                   const ContractConfig& cfg, const TensorView& token_ids, const TensorView& logp,
                   const TensorView& lse, const TensorView& entropy, void* stream = nullptr);

std::string logprob_launch_plan(const ContractConfig& cfg, int64_t hidden, int64_t vocab);

}  // namespace lockstep::cuda
