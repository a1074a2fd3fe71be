// The parameter blocks of the GEMM kernels (trivial structs: kernel arguments). Four, one per
// way a kernel reads its operands and writes its result:
//   GemmParams     pointer operands (the mma.sync kernel, the small-M cp.async ring kernels);
//   TmaGemmParams  operands as tensor maps (the small-M TMA-ring and wgmma kernels);
//   Sm90Params     the Hopper kernel: tensor maps, final values or per-segment fp32 planes;
//   CombineParams  the tree kernel over fp32 planes.
#pragma once

#include <cstdint>

namespace lockstep::cuda::detail {

struct GemmParams {
  const uint16_t* x;  // [M, K] bf16, row stride ldx
  const uint16_t* w;  // [N, K] bf16, row stride ldw
  const void* bias;   // nullptr, bf16 or f32 [N] with stride bias_stride
  void* y;            // [M, N] bf16 or f32, row stride ldy
  int64_t M, N, K;
  int64_t ldx, ldw, ldy, bias_stride;  // elements
  int64_t seg_len;                     // Ls (multiple of 16)
  int segments;                        // S
  int bias_f32;                        // 1: bias is f32, 0: bf16
  int y_f32;                           // 1: y is f32, 0: bf16
  int x_vec, w_vec;                    // 16-byte loads allowed (base and row stride aligned)
  // 1: x is stored [K, M] (rows ldx apart) / w is stored [K, N] (rows ldw apart): MN-major, the
  // "tn" / "nn" layouts (plan.h), which only the wgmma kernel reads.
  int x_mn, w_mn;
};

struct TmaGemmParams {
  int64_t M, N;
  int64_t seg_len;   // Ls (multiple of 16, >= 16)
  int segments;      // S
  const void* bias;  // nullptr, bf16 or f32 [N] with stride bias_stride
  int64_t bias_stride;
  int bias_f32;  // 1: bias is f32, 0: bf16
  void* y;       // [M, N] bf16 or f32, row stride ldy
  int64_t ldy;
  int y_f32;  // 1: y is f32, 0: bf16
};

struct Sm90Params {
  int64_t M, N;     // rows of x in this launch, rows of w
  int64_t seg_len;  // Ls (multiple of 16)
  int nseg;         // segments computed by this launch
  int ws_mode;      // 1: each segment's fp32 value to ws plane s; 0: final values to y
  // final mode (ws_mode == 0)
  const void* bias;  // nullptr, bf16 or f32
  int64_t bias_stride;
  int bias_f32;
  void* y;
  int64_t ldy;
  int y_f32;
  int y_pair;  // 1: two adjacent outputs (even column) may be stored as one aligned word
  // 1: bf16 y with a 16-byte aligned base and row stride (the Hopper kernel's 16-byte row-chunk
  // stores, epilogue.cuh sm90_store_bf16)
  int y_vec;
  // workspace mode
  float* ws;
  int64_t ld_ws;     // even
  int64_t ws_plane;  // elements per segment plane
  // kStash plans (the 64x256 ping-pong or the 128x256 tile): segments folded through global
  // memory (mainloop_sm90.cuh, sm90_stash_fold): per CTA of the grid and consumer warpgroup, LEVELS
  // levels of a 64 x 256 fp32 tile
  float* stash;
};

struct CombineParams {
  const float* part[8];  // n planes [M, N], rows ld[i] apart
  int64_t ld[8];
  int n;  // 1, 2, 4 or 8
  int64_t M, N;
  const void* bias;  // nullptr, bf16 or f32
  int64_t bias_stride;
  int bias_f32;
  void* y;  // bf16 (one RNE rounding) or f32; NaN stored canonical
  int64_t ldy;
  int y_f32;
};

}  // namespace lockstep::cuda::detail
