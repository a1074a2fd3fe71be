// embedding: the CPU reference op (the executable spec of the contract). Its types, layouts and
// formulas, and the normative description, are in lockstep/contract/embedding.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/contract/embedding.h"
#include "lockstep/tensor.h"

namespace lockstep::cpu {

// out[t, :] = table[ids[t], :].
//   ids   [T]     i32 or i64 (any stride); each in [0, V), else Error naming t and the value
//   table [V, H]  bf16, last dim contiguous, any row stride
//   out   [T, H]  bf16, last dim contiguous, any row stride
void embedding(const TensorView& ids, const TensorView& table, const TensorView& out);

// One rank's partial of the vocab-parallel embedding.
//   ids   [T]                  i32 or i64; each in [0, vocab) (the FULL vocab), else Error
//   table [shard.size(), H]    bf16: rows shard.begin .. shard.end-1 of the full table
//   out   [T, H]               bf16: table row for ids in the shard, -0.0 (0x8000) elsewhere
void embedding_vocab_parallel(const TensorView& ids, const TensorView& table,
                              const VocabShard& shard, int64_t vocab, const TensorView& out);

// out = round_bf16(((p_0 + p_1) + p_2) + ...) elementwise in fp32, ranks in ascending order
// (the order cannot matter: all but one term are -0.0, and x + -0 == x exactly for every x).
//   partials  t >= 1 views, each [T, H] bf16, last dim contiguous
//   out       [T, H] bf16, last dim contiguous; may be the same view as partials[0]
void embedding_combine(const std::vector<TensorView>& partials, const TensorView& out);

}  // namespace lockstep::cpu
