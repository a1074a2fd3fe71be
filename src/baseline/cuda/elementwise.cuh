// Baseline elementwise kernels: RMSNorm (+ residual), RoPE with on-the-fly fp32 cos/sin,
// SiLU-and-mul with __expf, embedding gather. Ordinary one-pass kernels; a row's
// RMSNorm reduction is one warp's shuffle tree (a different order than the contract's lanes).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "baseline/cuda/common.cuh"

namespace lockstep::cuda::baseline::kernels {

constexpr int kNormWarps = 8;  // rows per 256-thread block

// n (<= 8) bf16 values at p as fp32; 16-byte load when `vec` and the group is whole.
__device__ __forceinline__ void load8(const uint16_t* p, int n, bool vec, float (&f)[8]) {
  if (vec && n == 8) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = bf(uint16_t(w[i] & 0xffffu));
      f[2 * i + 1] = bf(uint16_t(w[i] >> 16));
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = i < n ? bf(p[i]) : 0.0f;
}

__device__ __forceinline__ void store8(uint16_t* p, int n, bool vec, const float (&f)[8]) {
  if (vec && n == 8) {
    uint4 u;
    u.x = pack_bf2(f[0], f[1]);
    u.y = pack_bf2(f[2], f[3]);
    u.z = pack_bf2(f[4], f[5]);
    u.w = pack_bf2(f[6], f[7]);
    *reinterpret_cast<uint4*>(p) = u;
    return;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (i < n) p[i] = to_bf(f[i]);
}

// One warp per row. kResidual: s = bf16(x + residual) is written to residual_out first and the
// norm runs over s (re-read by the same lane that wrote it).
template <bool kResidual>
__global__ void rmsnorm_kernel(Rows x, Rows res, const uint16_t* __restrict__ w, Rows res_out,
                               Rows y, int64_t rows, int64_t H, float eps, bool vec) {
  const int lane = threadIdx.x & 31;
  const int64_t groups = (H + 7) / 8;
  for (int64_t row = int64_t(blockIdx.x) * kNormWarps + (threadIdx.x >> 5); row < rows;
       row += int64_t(gridDim.x) * kNormWarps) {
    const uint16_t* src = row_ptr<const uint16_t>(kResidual ? res_out : x, row);
    float ss = 0.0f;
    for (int64_t g = lane; g < groups; g += 32) {
      const int n = int(H - 8 * g < 8 ? H - 8 * g : 8);
      float a[8];
      if (kResidual) {
        float b[8];
        load8(row_ptr<const uint16_t>(x, row) + 8 * g, n, vec, a);
        load8(row_ptr<const uint16_t>(res, row) + 8 * g, n, vec, b);
#pragma unroll
        for (int i = 0; i < 8; ++i) a[i] = bf(to_bf(a[i] + b[i]));
        store8(row_ptr<uint16_t>(res_out, row) + 8 * g, n, vec, a);
      } else {
        load8(src + 8 * g, n, vec, a);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += a[i] * a[i];
    }
    ss = warp_sum(ss);
    const float r = rsqrtf(ss / float(H) + eps);
    for (int64_t g = lane; g < groups; g += 32) {
      const int n = int(H - 8 * g < 8 ? H - 8 * g : 8);
      float a[8], wv[8];
      load8(src + 8 * g, n, vec, a);
      load8(w + 8 * g, n, vec, wv);
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] = bf(to_bf(a[i] * r)) * wv[i];
      store8(row_ptr<uint16_t>(y, row) + 8 * g, n, vec, a);
    }
  }
}

// One thread per (row, pair i): (x_i, x_{i+D/2}) rotated by pos·inv_freq_i.
__global__ void rope_kernel(Rows x, Index positions, Rows y, int64_t rows, int64_t D, float theta) {
  const int64_t half = D / 2, total = rows * half;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / half, i = e % half;
    const float pos = float(read_index(positions, r / x.inner));
    const float inv_freq = 1.0f / powf(theta, float(2 * i) / float(D));
    float s, c;
    sincosf(pos * inv_freq, &s, &c);
    const uint16_t* xr = row_ptr<const uint16_t>(x, r);
    uint16_t* yr = row_ptr<uint16_t>(y, r);
    const float a = bf(xr[i]), b = bf(xr[i + half]);
    yr[i] = to_bf(a * c - b * s);
    yr[i + half] = to_bf(b * c + a * s);
  }
}

__global__ void silu_mul_kernel(const uint16_t* __restrict__ g, int64_t ldg,
                                const uint16_t* __restrict__ u, int64_t ldu, uint16_t* out,
                                int64_t ldo, int64_t T, int64_t I) {
  const int64_t total = T * I;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e / I, i = e % I;
    const float gv = bf(g[t * ldg + i]);
    out[t * ldo + i] = to_bf(gv / (1.0f + __expf(-gv)) * bf(u[t * ldu + i]));
  }
}

__global__ void embedding_kernel(Index ids, const uint16_t* __restrict__ table, int64_t ldt,
                                 int64_t row_begin, int64_t table_rows, uint16_t* out, int64_t ldo,
                                 int64_t T, int64_t H) {
  const int64_t total = T * H;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e / H, h = e % H;
    const int64_t row = read_index(ids, t) - row_begin;
    out[t * ldo + h] = (row >= 0 && row < table_rows) ? table[row * ldt + h] : uint16_t(0);
  }
}

}  // namespace lockstep::cuda::baseline::kernels
