// gemm: the CPU reference op (the executable spec of the contract). Its types, layouts and
// formulas, and the normative description, are in lockstep/contract/gemm.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/contract/gemm.h"
#include "lockstep/tensor.h"

namespace lockstep::cpu {

// y = x · wᵀ (+ bias), the GEMM contract.
//   x     [M, K] bf16, rows may be strided (last dim contiguous)
//   w     [N, K] bf16, rows may be strided (last dim contiguous)
//   bias  [N] bf16 or f32 (any stride), or nullptr for none; converted to fp32 and added once
//   y     [M, N] bf16 (rounded once, RNE) or f32 (kept); rows may be strided; must not overlap
//         x, w or bias
// M, N or K may be 0 (K == 0 gives y = bias or +0).
// Speed (not bits): for M > 4, w is re-packed for every block of up to 64 rows of x, so pass as
// many rows per call as is convenient (>= 64 amortizes the packing to a few percent).
void gemm_bf16_nt(const TensorView& x, const TensorView& w, const TensorView* bias,
                  const GemmConfig& cfg, const TensorView& y);
inline void gemm_bf16_nt(const TensorView& x, const TensorView& w, const GemmConfig& cfg,
                         const TensorView& y) {
  gemm_bf16_nt(x, w, nullptr, cfg, y);
}

// Tensor-parallel building blocks (the engine simulates TP in-process with these; a real
// deployment exchanges the fp32 partials between ranks).
// Rank `tp_rank` of `tp_size` computes the fp32 value of the subtree of its S/t segments:
//   x_shard    [M, Kr] bf16, Kr = end - begin of gemm_tp_k_range(cfg, k_total, tp_size, tp_rank):
//              the columns [begin, end) of the full x (a strided column view of x works)
//   w_shard    [N, Kr] bf16, the same columns of w
//   y_partial  [M, N] f32 (no bias, no rounding)
void gemm_bf16_nt_partial(const TensorView& x_shard, const TensorView& w_shard, int64_t k_total,
                          int tp_size, int tp_rank, const GemmConfig& cfg,
                          const TensorView& y_partial);

// Finishes the tree: y = round(tree(partials[0..t)) + bias), t = partials.size() a power of two
// (partials in rank order, each [M, N] f32, rows may be strided). With the partials of
// gemm_bf16_nt_partial for t ranks this gives the same bits as gemm_bf16_nt.
//   bias  [N] bf16 or f32, or nullptr;  y [M, N] bf16 or f32 (an f32 y may be exactly one of the
//   partials, same data and row stride: the combine then runs in place)
void gemm_tree_combine(const std::vector<TensorView>& partials, const TensorView* bias,
                       const TensorView& y);

// The plain scalar path (one output at a time through mma_chain_bf16): the executable spec the
// fast path is tested against. Same arguments, same bits, much slower.
void gemm_bf16_nt_scalar(const TensorView& x, const TensorView& w, const TensorView* bias,
                         const GemmConfig& cfg, const TensorView& y);
inline void gemm_bf16_nt_scalar(const TensorView& x, const TensorView& w, const GemmConfig& cfg,
                                const TensorView& y) {
  gemm_bf16_nt_scalar(x, w, nullptr, cfg, y);
}

}  // namespace lockstep::cpu
