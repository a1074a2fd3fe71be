// CUDA GEMM "nt" on tensor cores, bit-exact with lockstep::cpu::gemm_bf16_nt (docs/contract.md
// §G, §M; design in docs/cuda-gemm.md). Every output's K segment is one MMA chain from +0 in
// ascending k-blocks of 16, segments combined by the G.4 tree: tile shapes and kernel choice may
// vary with M for speed, the arithmetic never does.
// Plain C++ header: no CUDA types (the stream is an opaque cudaStream_t passed as void*).
#pragma once

#include <string>
#include <vector>

#include "lockstep/ops/gemm.h"
#include "lockstep/tensor.h"

namespace lockstep::cuda {

// y = x · wᵀ (+ bias), the GEMM contract, on the GPU. Same arguments and same bits as
// cpu::gemm_bf16_nt, but every view must have device == Device::kCUDA and point to device memory:
//   x     [M, K] bf16, rows may be strided (last dim contiguous)
//   w     [N, K] bf16, rows may be strided (last dim contiguous)
//   bias  [N] bf16 or f32 (any stride), or nullptr
//   y     [M, N] bf16 (rounded once, RNE) or f32; rows may be strided; must not overlap x, w, bias
// Arguments are checked before the launch (lockstep::Error naming the argument); the launch is
// asynchronous on `stream` (nullptr = the default stream) and a launch error throws.
// No atomics, no split-K inside a segment.
void gemm_bf16_nt(const TensorView& x, const TensorView& w, const TensorView* bias,
                  const GemmConfig& cfg, const TensorView& y, void* stream = nullptr);

// Row-parallel TP building blocks, same meaning and bits as the cpu functions of the same name.
void gemm_bf16_nt_partial(const TensorView& x_shard, const TensorView& w_shard, int64_t k_total,
                          int tp_size, int tp_rank, const GemmConfig& cfg,
                          const TensorView& y_partial, void* stream = nullptr);
void gemm_tree_combine(const std::vector<TensorView>& partials, const TensorView* bias,
                       const TensorView& y, void* stream = nullptr);

// The kernel and tiling chosen for these sizes, printable (e.g. for `lockstep audit`).
std::string gemm_launch_plan(int64_t M, int64_t N, int64_t K, const GemmConfig& cfg);

}  // namespace lockstep::cuda
