// Smoke kernel: bf16 round trip through the shared dtype header, proving host and device share
// one conversion. Used by tests/cuda/test_smoke.cu.
#include <cuda_runtime.h>

#include "lockstep/dtype.h"
#include "lockstep/error.h"

namespace lockstep::cuda {

__global__ void bf16_round_kernel(const float* in, bf16* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = f32_to_bf16(in[i]);
}

void bf16_round(const float* in, bf16* out, int n, cudaStream_t stream) {
  LS_CHECK(n >= 0, "cuda::bf16_round", "n must be >= 0, got ", n);
  if (n == 0) return;
  bf16_round_kernel<<<(n + 255) / 256, 256, 0, stream>>>(in, out, n);
  cudaError_t e = cudaGetLastError();
  LS_CHECK(e == cudaSuccess, "cuda::bf16_round", "launch failed: ", cudaGetErrorString(e));
}

}  // namespace lockstep::cuda
