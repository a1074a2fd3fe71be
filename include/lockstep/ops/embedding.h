// Token embedding: out[t] = table[ids[t]] (a gather; the only arithmetic-free op), and its
// vocab-parallel form: rank r holds rows [v0, v1), writes its rows and -0.0 (the IEEE additive
// identity) elsewhere, and embedding_combine sums the partials in fp32 — exact, so TP = 1, 2, 4, 8
// give identical bits. NaN values are stored as the canonical 0x7FC0 on every path. Normative
// text: docs/contract.md §E "Embedding".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/tensor.h"

namespace lockstep {

// A contiguous block of vocabulary rows [begin, end) held by one rank.
struct VocabShard {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  std::string to_string() const;  // "vocab rows [0, 75968)"
};

// Megatron-style split: blocks of ceil(V / world) rows, rank r gets [r·b, min(V, (r+1)·b)) (the
// last blocks may be short or empty). Any partition of [0, V) gives the same bits; this is the
// one the library uses.
VocabShard vocab_shard(int64_t vocab, int rank, int world);

namespace cpu {

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

}  // namespace cpu
}  // namespace lockstep
