// Helpers shared by the attention and elementwise benchmarks (bench_attention, bench_attention_bwd,
// bench_elementwise): bf16 buffers filled on the device with a hash of the index (values in
// [-2, 2)), and the mean time of back-to-back calls between two CUDA events.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/cuda_ck.h"  // CK
#include "lockstep/dtype.h"

namespace bench_util {

__global__ void fill_kernel(uint16_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    const float f = (float(x & 0xffff) / 65536.0f - 0.5f) * 4.0f;
    p[i] = lockstep::f32_to_bf16(f).bits;
  }
}

// A device buffer of `bytes` (even) holding bf16 values from fill_kernel.
inline void* dalloc(size_t bytes, uint32_t seed) {
  void* p = nullptr;
  CK(cudaMalloc(&p, bytes));
  fill_kernel<<<1024, 256>>>(static_cast<uint16_t*>(p), bytes / 2, seed);
  CK(cudaGetLastError());
  return p;
}

// Mean ms of `iters` calls of f after `warm` untimed ones.
template <typename F>
double time_ms(F f, int warm, int iters) {
  for (int i = 0; i < warm; ++i) f();
  CK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) f();
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return double(ms) / iters;
}

}  // namespace bench_util
