// The GEMM epilogue, shared by every kernel (docs/contract.md §G.4): bias once (fp32 RNE), one
// rounding (bf16 RNE, or the fp32 value), canonical NaN; and the Hopper kernel's staged row
// stores (final values or per-segment fp32 planes). The tree kernel over fp32 planes, the other
// end of the plane path: tree_combine.cuh.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm/params.cuh"
#include "cuda/mma_sync.cuh"    // round_bf16_canonical, pack_bf16_rn_canonical, canonical_f32_bits
#include "cuda/sm90_async.cuh"  // smem_u32

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

// ---- The bf16 fast path (p.y_vec, no bias, final mode: every Qwen3 projection): one consumer
// warp's 16 rows x 2R columns straight from the wgmma fragments (acc[4i + 2h + c] is row lane/4 +
// 8h, column 8i + 2(lane%4) + c), rounded in registers, in pieces of 64 columns: stmatrix puts a
// piece's bf16 rows in the warp's staging (rows 144 bytes apart: conflict-free for stmatrix's
// 8-row writes and for the 16-byte row reads), then each lane stores 16-byte chunks (a warp store
// = 4 rows x 128 bytes). The same values as sm90_store_rows (pack_bf16_rn_canonical's bits are
// round_bf16_canonical's); per lane and piece: 32 roundings, 4 stmatrix, 4 loads and 4 stores.
constexpr int kSm90Bf16Pitch = 72;  // bf16 per staged row: 64 + 8 of padding
static_assert(16 * kSm90Bf16Pitch * 2 <= 16 * kSm90EpiLd * 4, "a piece fits a warp's staging");

// y rows row0 .. row0 + 15 (those < p.M), columns col0 .. col0 + 2R − 1 (those < p.N) of the
// warp's fragments, through stg (the warp's own staging, 16-byte aligned). p.y_vec: y's base and
// row stride are 16-byte aligned, so every 8-column chunk inside N is one 16-byte store.
template <int R>
__device__ __forceinline__ void sm90_store_bf16(const Sm90Params& p, const float (&acc)[R],
                                                float* stg, int64_t row0, int64_t col0, int lane) {
  static_assert(R % 32 == 0, "whole 64-column pieces");
  uint16_t* const buf = reinterpret_cast<uint16_t*>(stg);
  // stmatrix.x4: lanes 8j .. 8j + 7 address matrix j's rows; matrix j = rows 8(j & 1) .., columns
  // 8(j >> 1) .. of the 16 x 16 block.
  const uint32_t st_addr =
      smem_u32(buf + ((lane & 7) + 8 * ((lane >> 3) & 1)) * kSm90Bf16Pitch + 8 * (lane >> 4));
  const int rr = lane >> 3, cc = 8 * (lane & 7);  // copy-out: row rr + 4t, columns cc .. cc + 7
  uint16_t* const y = static_cast<uint16_t*>(p.y);
#pragma unroll  // acc's indices must be constants
  for (int q = 0; q < R / 32; ++q) {
#pragma unroll
    for (int b = 0; b < 4; ++b) {  // 16-column blocks of the piece: i = 8q + 2b, 8q + 2b + 1
      const int i = 8 * q + 2 * b;
      const uint32_t r0 = pack_bf16_rn_canonical(acc[4 * i], acc[4 * i + 1]);
      const uint32_t r1 = pack_bf16_rn_canonical(acc[4 * i + 2], acc[4 * i + 3]);
      const uint32_t r2 = pack_bf16_rn_canonical(acc[4 * i + 4], acc[4 * i + 5]);
      const uint32_t r3 = pack_bf16_rn_canonical(acc[4 * i + 6], acc[4 * i + 7]);
      asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                       st_addr + 32u * b),
                   "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                   : "memory");
    }
    __syncwarp();
    const int64_t col = col0 + 64 * q + cc;
#pragma unroll 1  // (rolled: no accumulator indices here, and the kernel's code stays small)
    for (int t = 0; t < 4; ++t) {
      const int r = rr + 4 * t;
      const int64_t row = row0 + r;
      const uint4 v = *reinterpret_cast<const uint4*>(buf + r * kSm90Bf16Pitch + cc);
      if (row >= p.M || col >= p.N) continue;
      uint16_t* const dst = y + row * p.ldy + col;
      if (col + 8 <= p.N) {
        *reinterpret_cast<uint4*>(dst) = v;
      } else {  // the last chunk of a row whose N is not a multiple of 8
#pragma unroll 1
        for (int e = 0; e < int(p.N - col); ++e) {
          const uint32_t w = e < 2 ? v.x : e < 4 ? v.y : e < 6 ? v.z : v.w;
          dst[e] = uint16_t(w >> (16 * (e & 1)));
        }
      }
    }
    __syncwarp();  // the piece's reads are done before the next piece's stmatrix
  }
}

}  // namespace lockstep::cuda::detail
