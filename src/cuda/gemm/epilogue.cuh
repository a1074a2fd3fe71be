// The GEMM epilogue, shared by every kernel (docs/contract.md §G.4): bias once (fp32 RNE), one
// rounding (bf16 RNE, or the fp32 value), canonical NaN; and the Hopper kernel's staged row
// stores (final values or per-segment fp32 planes). The tree kernel over fp32 planes, the other
// end of the plane path: tree_combine.cuh.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm/params.cuh"
#include "cuda/mma_sync.cuh"  // round_bf16_canonical, canonical_f32_bits

namespace lockstep::cuda::detail {

// bias[n] (bf16 or f32, elements `stride` apart) as fp32.
__device__ __forceinline__ float load_bias(const void* bias, int64_t stride, int bias_f32,
                                           int64_t n) {
  return bias_f32 ? static_cast<const float*>(bias)[n * stride]
                  : __uint_as_float(uint32_t(static_cast<const uint16_t*>(bias)[n * stride]) << 16);
}

// y[m, n] = v, rounded once to bf16 (RNE) or stored as fp32; NaN canonical.
__device__ __forceinline__ void store_output(void* y, int64_t ldy, int y_f32, int64_t m, int64_t n,
                                             float v) {
  if (y_f32) {
    static_cast<uint32_t*>(y)[m * ldy + n] = canonical_f32_bits(v);
  } else {
    static_cast<uint16_t*>(y)[m * ldy + n] = round_bf16_canonical(v);
  }
}

// ---- The Hopper kernel's epilogue: per consumer warp, 16 rows x 32 fp32 columns staged in
// shared memory, rows padded to 40 floats (fragment writes and row reads are then conflict-free:
// 2 wavefronts per 256 bytes), then row-contiguous stores.
constexpr int kSm90EpiCols = 32;
constexpr int kSm90EpiLd = 40;
constexpr int kSm90EpiBytes = 8 * 16 * kSm90EpiLd * 4;

// Stores 16 staged rows x 32 columns of one warp: lane -> row (lane >> 4) + 2t, columns
// col0 + 2(lane & 15) + {0, 1}. Final mode: bias once (fp32 RNE), one rounding to bf16 (RNE) or
// f32, canonical NaN. Workspace mode: the fp32 segment value into plane s.
__device__ __forceinline__ void sm90_store_rows(const Sm90Params& p, int s, const float* stg,
                                                int64_t row0, int64_t col0, int lane) {
  const int lc = (lane & 15) * 2;
  const int64_t col = col0 + lc;
  if (col >= p.N) return;
  const bool has1 = col + 1 < p.N;
  if (p.ws_mode) {
    float* plane = p.ws + int64_t(s) * p.ws_plane;
#pragma unroll 1
    for (int t = 0; t < 8; ++t) {
      const int lr = 2 * t + (lane >> 4);
      const int64_t row = row0 + lr;
      if (row >= p.M) break;
      // ld_ws is even and covers N rounded up: the pair never crosses the row.
      *reinterpret_cast<float2*>(plane + row * p.ld_ws + col) =
          *reinterpret_cast<const float2*>(stg + lr * kSm90EpiLd + lc);
    }
    return;
  }
  float b0 = 0.0f, b1 = 0.0f;
  if (p.bias) {
    b0 = load_bias(p.bias, p.bias_stride, p.bias_f32, col);
    if (has1) b1 = load_bias(p.bias, p.bias_stride, p.bias_f32, col + 1);
  }
#pragma unroll 1
  for (int t = 0; t < 8; ++t) {
    const int lr = 2 * t + (lane >> 4);
    const int64_t row = row0 + lr;
    if (row >= p.M) break;
    const float2 v2 = *reinterpret_cast<const float2*>(stg + lr * kSm90EpiLd + lc);
    float v0 = v2.x, v1 = v2.y;
    if (p.bias) {
      v0 = __fadd_rn(v0, b0);
      v1 = __fadd_rn(v1, b1);
    }
    if (p.y_f32) {
      uint32_t* yr = static_cast<uint32_t*>(p.y) + row * p.ldy + col;
      if (has1 && p.y_pair) {
        *reinterpret_cast<uint2*>(yr) = make_uint2(canonical_f32_bits(v0), canonical_f32_bits(v1));
      } else {
        yr[0] = canonical_f32_bits(v0);
        if (has1) yr[1] = canonical_f32_bits(v1);
      }
    } else {
      uint16_t* yr = static_cast<uint16_t*>(p.y) + row * p.ldy + col;
      if (has1 && p.y_pair) {
        *reinterpret_cast<uint32_t*>(yr) =
            uint32_t(round_bf16_canonical(v0)) | (uint32_t(round_bf16_canonical(v1)) << 16);
      } else {
        yr[0] = round_bf16_canonical(v0);
        if (has1) yr[1] = round_bf16_canonical(v1);
      }
    }
  }
}

}  // namespace lockstep::cuda::detail
