// Linear log-prob ("LogP"): per token t, y[v] = z[t,v] / temperature with z = h·Wᵀ by the GEMM
// contract (fp32), gives log p(target), logsumexp and entropy of softmax(y) without a [T, V]
// buffer. Vocab in tiles of cfg.vocab_tile (fixed 8-lane order inside a tile), tiles folded left to
// right inside each of cfg.vocab_segments segments, segments combined by a balanced tree: a token's
// bits never depend on T, other rows, strides, thread count or the vocab-parallel degree.
// Normative text: docs/contract.md §L.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "lockstep/contract/config.h"
#include "lockstep/contract/gemm.h"
#include "lockstep/tensor.h"

namespace lockstep {

// Fixed in-tile reduction layout (part of the contract, not a setting): lane l of 8 owns the tile
// entries j = l, l+8, l+16, ... in ascending order; the 8 lanes combine in a tree.
constexpr int kLogprobLanes = 8;

// Softmax partial over a set of vocab entries, relative to its own max:
//   m = max y,  s = Σ exp(y − m),  w = Σ exp(y − m)·(y − m)   (w <= 0).
// Entries with y == −inf (vocab padding, masked logits) contribute nothing. A state with s == 0 is
// *empty* (its m is −inf) and is the identity of logprob_merge.
struct LogprobState {
  float m = -std::numeric_limits<float>::infinity();
  float s = 0.0f;
  float w = 0.0f;
};

// Per-call values of the LogP op (none of them depends on the batch).
struct LogprobParams {
  float temperature = 1.0f;   // > 0 and finite; y = z / temperature, IEEE divide, always applied
  int64_t ignore_index = -1;  // a target equal to this has no target: its logp is written as +0
  void validate() const;      // throws lockstep::Error
  std::string to_string() const;  // "logprob: temperature=0x1p+0 (1) ignore_index=-1"
};

// The vocab layout for a vocab of V entries (depends only on V and cfg):
//   padded = V rounded up to a multiple of vocab_tile · vocab_segments (entries >= V are −inf),
//   segment_len = padded / vocab_segments, tiles_per_segment = segment_len / vocab_tile.
struct LogprobVocabLayout {
  int64_t vocab_size = 0;
  int64_t padded = 0;
  int64_t segment_len = 0;
  int64_t tile = 0;
  int64_t tiles_per_segment = 0;
  int segments = 1;
};
LogprobVocabLayout logprob_vocab_layout(const ContractConfig& cfg, int64_t vocab_size);

// The GEMM of the head's logits z = h·Wᵀ (§L.4; the log-prob op, its backward and the sampler):
// the lm_head is vocab-parallel (column-parallel), so K = hidden is one segment whatever
// gemm_segments (contract 0.3).
inline GemmConfig logprob_logits_gemm(const ContractConfig& cfg) {
  return GemmConfig::for_layer(cfg, LayerRole::kColumnParallel);
}

// A vocab-parallel rank's share: segments [seg_begin, seg_begin + seg_count) of the layout.
// seg_count is a power of two dividing cfg.vocab_segments and seg_begin a multiple of it, so the
// share is one aligned subtree of the segment tree. Its W rows are the global vocab rows
// [seg_begin·segment_len, min(V, (seg_begin + seg_count)·segment_len)).
struct LogprobShard {
  int64_t vocab_size = 0;  // V of the whole (unsharded) vocab
  int seg_begin = 0;
  int seg_count = 1;
};

// Building blocks (the normative primitives; the CUDA kernel implements exactly these).
// State of one tile: y[0 .. tile) tempered logits, tile a multiple of kLogprobLanes, padding =
// −inf.
LogprobState logprob_tile_state(const float* y, int64_t tile);
// The one merge formula (−inf safe; empty states are identities, returned bit-exact).
LogprobState logprob_merge(const LogprobState& a, const LogprobState& b);
// Balanced tree over n states, n a power of two: level by level, merge(s[2i], s[2i+1]).
LogprobState logprob_tree(const LogprobState* states, int64_t n);
// lse = m + log(s); entropy = log(s) − w / s. NaN results are written as canonical NaN 0x7FC00000.
void logprob_finish(const LogprobState& st, float* lse, float* entropy);

}  // namespace lockstep
