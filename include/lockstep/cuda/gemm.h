// CUDA GEMM "nt" on tensor cores (mma.sync m16n8k16 bf16 -> fp32), bit-exact with
// lockstep::cpu::gemm_bf16_nt (docs/contract.md §G, §M; design in docs/cuda-gemm.md).
// Plain C++ header: no CUDA types (the stream is an opaque cudaStream_t passed as void*).
#pragma once

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
// No workspace, no atomics, no split-K: the grid depends only on M and N.
void gemm_bf16_nt(const TensorView& x, const TensorView& w, const TensorView* bias,
                  const GemmConfig& cfg, const TensorView& y, void* stream = nullptr);

}  // namespace lockstep::cuda
