// logprob: the CPU reference op (the executable spec of the contract). Its types, layouts and
// formulas, and the normative description, are in lockstep/contract/logprob.h.
#pragma once

#include <cstdint>
#include <string>

#include "lockstep/contract/logprob.h"
#include "lockstep/tensor.h"

namespace lockstep::cpu {

// The LogP op.
//   h        [T, H] bf16, rows may be strided (last dim contiguous)
//   w        [V, H] bf16, rows may be strided (last dim contiguous)  (lm_head / tied embedding)
//   targets  [T] i32 or i64, any stride; each in [0, V) or == params.ignore_index
//   logp     [T] f32 (any stride): y[target] − lse, +0 for an ignored target
//   lse      [T] f32 (any stride): logsumexp of y
//   entropy  [T] f32 (any stride): entropy of softmax(y) (nats)
// A token whose logits hold NaN or +inf gets NaN in all three outputs; other tokens are unaffected.
void linear_logprob(const TensorView& h, const TensorView& w, const TensorView& targets,
                    const LogprobParams& params, const ContractConfig& cfg, const TensorView& logp,
                    const TensorView& lse, const TensorView& entropy);

// Vocab-parallel part 1: one rank's subtree state per token.
//   w_shard  [Vs, H] bf16: the rank's rows (see LogprobShard), Vs may be 0 for an all-padding shard
//   state    [T, 4] f32 (rows may be strided, last dim contiguous): (m, s, w, y_target), where
//            y_target is the target's tempered logit if the target lies in this shard, else a
//            canonical NaN (also for an ignored target).
void linear_logprob_partial(const TensorView& h, const TensorView& w_shard,
                            const TensorView& targets, const LogprobParams& params,
                            const ContractConfig& cfg, const LogprobShard& shard,
                            const TensorView& state);

// Vocab-parallel part 2: finishes the segment tree over R ranks' states (R a power of two
// dividing vocab_segments; rank r owns segments [r·S/R, (r+1)·S/R)) and takes y_target from the
// rank owning each target. Gives the same bits as linear_logprob for every R.
//   states   [R, T, 4] f32 (last dim contiguous), in rank order
void linear_logprob_combine(const TensorView& states, const TensorView& targets,
                            const LogprobParams& params, const ContractConfig& cfg,
                            int64_t vocab_size, const TensorView& logp, const TensorView& lse,
                            const TensorView& entropy);

}  // namespace lockstep::cpu
