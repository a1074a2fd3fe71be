// The tree kernel: folds n fp32 planes (per-segment workspace planes, segment-pair planes, TP
// partials) with the §G.4 fold (fold.cuh), adds the bias once and rounds once (epilogue.cuh).
// Launched by launch.cu only (a non-template kernel: one translation unit defines it).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm/epilogue.cuh"  // load_bias, store_output
#include "cuda/gemm/fold.cuh"      // fold_segment
#include "cuda/gemm/params.cuh"    // CombineParams

namespace lockstep::cuda::detail {

constexpr int kCombineThreads = 256;

// Grid (⌈N/256⌉, rows): one output per thread and row; an in-place f32 combine (y aliasing
// part[i] exactly) is safe: each output is read and written by the same thread only.
__global__ void __launch_bounds__(kCombineThreads) gemm_tree_combine_kernel(const CombineParams p) {
  const int64_t n = int64_t(blockIdx.x) * kCombineThreads + threadIdx.x;
  if (n >= p.N) return;
  const float b = p.bias ? load_bias(p.bias, p.bias_stride, p.bias_f32, n) : 0.0f;
  for (int64_t m = blockIdx.y; m < p.M; m += gridDim.y) {
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = i < p.n ? p.part[i][m * p.ld[i] + n] : 0.0f;
    float acc = 0.0f, stack[3];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (i < p.n) {
        acc = v[i];
        fold_segment<false>(acc, stack, i, p.n);
      }
    }
    float t = acc;
    if (p.bias) t = __fadd_rn(t, b);
    store_output(p.y, p.ldy, p.y_f32, m, n, t);
  }
}

}  // namespace lockstep::cuda::detail
