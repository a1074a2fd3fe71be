// GEMM "nt": y[m,n] = tree_s(seg_s[m,n]) (+ bias[n]), rounded once, with seg_s = the MMA k-block
// chain (mma_chain_bf16, from +0, k-blocks of 16 ascending) over segment s of K (K zero-padded to
// a multiple of 16·S, cut into S equal segments). A row's bits never depend on M, other rows,
// strides, the thread count, the machine, or the tensor-parallel degree t <= S.
// Normative text: docs/contract.md §G.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/contract/config.h"
#include "lockstep/tensor.h"

namespace lockstep {

// Megatron tensor-parallel role of a linear layer (§G.5, B.2).
enum class LayerRole {
  kColumnParallel,  // q|k|v, gate|up, the lm_head: TP splits N; each rank reduces whole K
  kRowParallel,     // o_proj, down: TP splits K; the ranks' partial sums are combined
};

// Every GEMM setting that can change bits (depends only on the model, never on M).
struct GemmConfig {
  int segments = 1;  // S in {1, 2, 4, 8}: K segments, tree-combined (max row-parallel TP degree)

  // The forward GEMM of a layer of `role` (contract 0.3, §G.5): a row-parallel layer cuts K into
  // the contract's gemm_segments (TP ranks own whole segments); a column-parallel one (and the
  // log-prob head and sampler's logits) reduces K in one segment whatever the TP degree.
  static GemmConfig for_layer(const ContractConfig& c, LayerRole role) {
    return GemmConfig{role == LayerRole::kRowParallel ? c.gemm_segments : 1};
  }
  void validate() const;          // throws lockstep::Error on a bad setting
  std::string to_string() const;  // "gemm: segments=4"
};

// The K layout for a reduced dimension of k elements (depends only on k and cfg):
//   padded = k rounded up to a multiple of 16·S (elements >= k are zeros),
//   segment_len = padded / S (a multiple of 16).
struct GemmKLayout {
  int64_t k = 0;
  int64_t padded = 0;
  int64_t segment_len = 0;
  int segments = 1;
};
GemmKLayout gemm_k_layout(const GemmConfig& cfg, int64_t k);

// Row-parallel tensor parallelism: rank r of t (t a power of two dividing S) owns the S/t
// consecutive segments [r·S/t, (r+1)·S/t), i.e. the unpadded K columns [begin, end) below (end is
// clipped to k; a rank may own only padding, then begin == end).
struct GemmKRange {
  int64_t begin = 0;
  int64_t end = 0;
};
GemmKRange gemm_tp_k_range(const GemmConfig& cfg, int64_t k, int tp_size, int tp_rank);

}  // namespace lockstep
