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

// Every GEMM setting that can change bits (depends only on the model, never on M).
struct GemmConfig {
  int segments = 1;  // S in {1, 2, 4, 8}: K segments, tree-combined (max row-parallel TP degree)

  static GemmConfig from_contract(const ContractConfig& c) { return GemmConfig{c.gemm_segments}; }
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
