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

}  // namespace lockstep
