// Index math of the warp-specialized small-M kernel (mainloop_small_m_tma.cuh), kept free of CUDA
// types and instructions so that a host program can replay it (an emulation of TMA's 128B
// swizzle, ldmatrix and mma.sync fragments) and compare the result with the CPU GEMM.
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace lockstep::cuda::detail::small_m_ws {

constexpr int kBoxK = 64;  // k per TMA box: one 128-byte (swizzle-width) row of bf16

// Tile geometry of one instantiation: WM x WN consumer warps (+ 1 producer warp); a consumer warp
// owns MB m8 tiles of x rows and NA n16 tiles of w rows (NA·MB independent chains); a stage holds
// KB64 boxes of 64 k for w (BN rows) and for x (BM rows).
template <int WM, int MB, int WN, int NA, int KB64, int NS>
struct Shape {
  static constexpr int kConsumers = WM * WN;
  static constexpr int kThreads = 32 * (kConsumers + 1);
  static constexpr int BM = WM * MB * 8;
  static constexpr int BN = WN * NA * 16;
  static constexpr int BK = KB64 * kBoxK;
  static constexpr int KB = BK / 16;  // k-blocks per stage
  static constexpr int kWBox = BN * 128;
  static constexpr int kXBox = BM * 128;
  static constexpr int kStage = KB64 * (kWBox + kXBox);
  // Stages (1024-aligned: the 128B swizzle atom), the 2·NS mbarriers, alignment slack.
  static constexpr int kSmem = NS * kStage + 2 * NS * 8 + 1024;
  static_assert(MB == 1 || MB % 2 == 0, "MB: 1 or even (x fragments are read in pairs)");
  static_assert(NA * MB <= 8, "at most 8 chains (32 accumulators) per warp");
  static_assert(BN <= 256 && BM <= 256, "TMA box rows");
  static_assert(kWBox % 1024 == 0 && kXBox % 1024 == 0, "boxes 1024-aligned");
  static_assert(NS >= 2, "stages");
  static_assert(kSmem <= 232448, "shared memory per block");

  // ---- Stage layout (bytes from the stage base): KB64 w boxes, then KB64 x boxes. Inside a box,
  // as TMA writes it with the 128B swizzle: the 16-byte chunk c of row r sits at
  // r·128 + ((c ^ (r & 7)) << 4).
  LS_HD static uint32_t w_box(int b) { return uint32_t(b * kWBox); }
  LS_HD static uint32_t x_box(int b) { return uint32_t(KB64 * kWBox + b * kXBox); }

  // ---- Tile sequence: segments in order, each nkt(Ls) k-tiles; tile kt of segment sg covers
  // k ∈ [sg·Ls + kt·BK, +BK), of which the first tile_kblocks k-blocks belong to the segment (only
  // their boxes are loaded).
  LS_HD static int nkt(int seg_len) { return (seg_len + BK - 1) / BK; }
  LS_HD static int tile_kblocks(int seg_len, int kt) {
    const int left = (seg_len - kt * BK) / 16;
    return left < KB ? left : KB;
  }
  LS_HD static int tile_boxes(int seg_len, int kt) { return (tile_kblocks(seg_len, kt) + 3) / 4; }
  LS_HD static int32_t tile_k0(int seg_len, int sg, int kt) {
    return int32_t(sg * seg_len + kt * BK);
  }

  // ---- ldmatrix addresses of a lane of consumer warp (wm, wn) for k-block kb of a stage (bytes
  // from the stage base). Every row a lane addresses is ≡ lane & 7 (mod 8), so chunk c of its row
  // sits at ((c ^ (lane & 7)) << 4); c = 2·kin + h (kin: k-block in the box, h: which 8 of its 16
  // k), i.e. ((h ^ (lane & 7)) << 4) ^ (kin << 5).
  // A = w, ldmatrix.x4 of n16 tile i (add i·a_tile_step()): matrices (rows 0-7, k 0-7),
  // (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15) = the m16n8k16 A fragment
  // registers a0..a3.
  LS_HD static uint32_t a_lane_row(int lane, int wn) {
    return uint32_t((wn * NA * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * 128);
  }
  LS_HD static uint32_t a_lane_sw(int lane) {
    return uint32_t((((lane >> 4) & 1) ^ (lane & 7)) << 4);
  }
  LS_HD static uint32_t a_addr(uint32_t row, uint32_t sw, int kb) {
    return w_box(kb >> 2) + row + (sw ^ (uint32_t(kb & 3) << 5));
  }
  static constexpr uint32_t a_tile_step() { return 16 * 128; }
  // B = x, ldmatrix.x4 of m8 tiles 2q, 2q+1 (add q·b_pair_step()): matrices (m 0-7, k 0-7),
  // (m 0-7, k 8-15), (m 8-15, k 0-7), (m 8-15, k 8-15) = b0, b1 of tile 2q, b0, b1 of tile 2q+1;
  // MB = 1: ldmatrix.x2, the first two (lanes 0-15 give the addresses).
  LS_HD static uint32_t b_lane_row(int lane, int wm) {
    return uint32_t((wm * MB * 8 + (lane & 7) + (MB == 1 ? 0 : ((lane >> 4) & 1) * 8)) * 128);
  }
  LS_HD static uint32_t b_lane_sw(int lane) {
    return uint32_t((((lane >> 3) & 1) ^ (lane & 7)) << 4);
  }
  LS_HD static uint32_t b_addr(uint32_t row, uint32_t sw, int kb) {
    return x_box(kb >> 2) + row + (sw ^ (uint32_t(kb & 3) << 5));
  }
  static constexpr uint32_t b_pair_step() { return 16 * 128; }

  // ---- Outputs: acc[i][j][2h + e] of a lane of warp (wm, wn) is y[m0 + out_m, n0 + out_n] (the
  // m16n8k16 D fragment: row = n, column = m).
  LS_HD static int out_n(int lane, int wn, int i, int h) {
    return wn * NA * 16 + i * 16 + (lane >> 2) + h * 8;
  }
  LS_HD static int out_m(int lane, int wm, int j, int e) {
    return wm * MB * 8 + j * 8 + (lane & 3) * 2 + e;
  }
};

}  // namespace lockstep::cuda::detail::small_m_ws
