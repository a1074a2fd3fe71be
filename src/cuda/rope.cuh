// RoPE kernel, docs/contract.md §E.2 ("rotate_half" pairs (i, i + D/2)): one thread per pair of a
// (token, head) row, y_i = round(a·c − b·s), y_{i+D/2} = round(b·c + a·s), each product, the
// difference and the sum one fp32 RNE op (no fma), c/s from the host-built fp32 table on the
// device. A position outside [0, P) (device positions cannot be checked before the launch) gives a
// canonical-NaN pair.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/elementwise_common.cuh"

namespace lockstep::cuda::detail {

struct RopeParams {
  const uint16_t* x;  // [T, heads, D] via xm (rows = T·heads)
  uint16_t* y;
  RowMap xm, ym;
  RopeTableRef tab;
  int64_t rows, heads, half;
};

// NOTE: y may be the same view as x: a thread reads both elements of its pair before writing.
static __global__ void rope_kernel(const RopeParams p) {
  const int64_t n = p.rows * p.half;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = idx / p.half, i = idx - row * p.half;
    const int64_t pos = p.tab.pos[row / p.heads];
    const uint16_t* xr = p.x + p.xm.offset(row);
    uint16_t* yr = p.y + p.ym.offset(row);
    const float a = bf16_bits_to_f32(xr[i]), b = bf16_bits_to_f32(xr[i + p.half]);
    if (pos < 0 || pos >= p.tab.P) {
      yr[i] = kNanBf16;
      yr[i + p.half] = kNanBf16;
      continue;
    }
    const float c = p.tab.cos[pos * p.tab.cs + i], s = p.tab.sin[pos * p.tab.ss + i];
    yr[i] = rope_first(a, b, c, s);
    yr[i + p.half] = rope_second(a, b, c, s);
  }
}

// The same per pair with a 2-D block (half pairs x 256 / half rows, half <= 256 dividing 256) and
// 32-bit row arithmetic (rows < 2^31): x and y as [T, heads, D] views through their own strides.
struct RopeRowsParams {
  const uint16_t* x;
  uint16_t* y;
  int64_t xs0, xs1, ys0, ys1;
  RopeTableRef tab;
  int32_t rows, heads;
};
static __global__ void __launch_bounds__(256) rope_rows_kernel(const RopeRowsParams p) {
  const int32_t row = int32_t(blockIdx.x) * int32_t(blockDim.y) + int32_t(threadIdx.y);
  if (row >= p.rows) return;
  const int32_t t = row / p.heads, h = row - t * p.heads;
  const int i = threadIdx.x, half = blockDim.x;
  const uint16_t* xr = p.x + int64_t(t) * p.xs0 + int64_t(h) * p.xs1;
  uint16_t* yr = p.y + int64_t(t) * p.ys0 + int64_t(h) * p.ys1;
  const int64_t pos = p.tab.pos[t];
  const float a = bf16_bits_to_f32(xr[i]), b = bf16_bits_to_f32(xr[i + half]);
  if (pos < 0 || pos >= p.tab.P) {
    yr[i] = kNanBf16;
    yr[i + half] = kNanBf16;
    return;
  }
  const float c = p.tab.cos[pos * p.tab.cs + i], s = p.tab.sin[pos * p.tab.ss + i];
  yr[i] = rope_first(a, b, c, s);
  yr[i + half] = rope_second(a, b, c, s);
}

}  // namespace lockstep::cuda::detail
