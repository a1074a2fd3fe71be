// Compile check: src/core/math.h as __host__ __device__ under nvcc (-fmad=false).
#include "core/math.h"

__global__ void math_kernel(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float v = x[i];
    y[4 * i + 0] = lockstep::ls_exp2f(v);
    y[4 * i + 1] = lockstep::ls_expf(v);
    y[4 * i + 2] = lockstep::ls_log2f(v);
    y[4 * i + 3] = lockstep::ls_logf(v);
  }
}

float host_side(float v) {
  return lockstep::ls_exp2f(v) + lockstep::ls_expf(v) + lockstep::ls_log2f(v) + lockstep::ls_logf(v);
}
