// The CUDA GEMM planner: which kernel, tile and segment fold cuda::gemm_bf16_nt runs for a
// problem. Host-only C++ (no CUDA types), compiled without nvcc and unit-tested on the CPU
// (tests/cpu/test_gemm_plan.cc). A plan is a pure function of the problem (sizes, segments, operand
// layout and TMA compatibility): no device query, no global state. It is a speed choice only:
// every kernel computes each output with the same chains (§G.3) and the same tree (§G.4).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::cuda {

// Operand layout of y = op(a) · op(b), K the reduced axis:
//   "nt": y[M, N] = x[M, K] · w[N, K]ᵀ, both K-major (the forward).
//   "nn": y[M, N] = x[M, K] · w[K, N], w MN-major: dX = dY · W with W [N, K] read in place
//         (docs/contract.md §B.3; the wgmma kernel with its B transpose bit).
//   "tn": y[M, N] += a[K, M]ᵀ · b[K, N], both MN-major (rows = k = the token slots): the weight
//         gradient dW += dYᵀ · X on token-major operands (§B.3), in accumulate mode — y is f32
//         in/out, one segment, every output's chain starts from y's current value (not +0), no
//         tree, no bias, no rounding; rows past K are zero (TMA fill).
// "nn" and "tn" run on the wgmma kernel only (TMA-readable operands).
enum class GemmLayout { kNT, kNN, kTN };
const char* gemm_layout_name(GemmLayout l);

struct GemmProblem {
  int64_t M = 0, N = 0, K = 0;  // K: the columns this launch reads (a TP shard's for partials)
  int segments = 1;             // S of this launch (1, 2, 4 or 8)
  int64_t segment_len = 0;      // Ls, a multiple of 16 (gemm_k_layout)
  GemmLayout layout = GemmLayout::kNT;
  // Operands readable by TMA: 16-byte aligned bases, row strides a multiple of 8 elements that
  // cover K and stay below 2^38, K >= 1, M, N, K < 2^31 (a function of pointers and strides).
  bool tma_ok = true;
  // gemm_bf16_nt_partial (a TP rank's f32 partial): the small-M kernels do not take it.
  bool partial = false;
};

// The main loop of a plan, one file per kind under src/cuda/gemm/.
enum class GemmMainloop {
  kSmallMRing,   // small M: cp.async ring, every warp loads and computes (any operand layout)
  kSmallMTma,    // small M: warp-specialized TMA ring, mma.sync consumer warps
  kSmallMWgmma,  // small M: TMA ring, one wgmma consumer warpgroup (64 rows of x)
  kMmaSync,      // mma.sync m16n8k16, cp.async (operands TMA cannot read)
  kWgmma,        // Hopper: TMA + wgmma, 1 producer + 2 consumer warpgroups, persistent
};
const char* gemm_mainloop_name(GemmMainloop k);

// How the S segment values of an output are combined (§G.4).
enum class GemmFold {
  kNone,       // S = 1
  kRegisters,  // in the CTA, a register stack of pending subtrees
  kPlanes,     // one job per segment into fp32 planes, then the tree kernel (+ bias, rounding)
  kPairs,      // S/2 launches of the S = 2 register tree into fp32 planes, then the tree kernel
  kStash,      // each segment folded into the tree through a per-warpgroup stash in global memory
               // (L2): the 64x256 ping-pong tile (tile pairs, alternate segments) or 128x256
};
const char* gemm_fold_name(GemmFold f);

// A tile, named by its parameters: "64x128x64 s8" (bm x bn x bk, stages), plus the small-M
// kernels' warp layout ("warps 2x6", TMA kinds "+1" producer, "chains 2x4" = n16 x m8 tiles per
// consumer warp).
struct GemmTile {
  int bm = 0, bn = 0, bk = 0, stages = 0;
  int wm = 0, wn = 0;  // small-M ring / TMA kinds: (consumer) warps along M and N
  int mb = 0, na = 0;  // small-M TMA kind: m8 tiles of x, n16 tiles of w per consumer warp
  int cluster = 1;     // CTAs per cluster along N sharing x (dev/gemm sweeps only)
  std::string to_string() const;
  bool operator==(const GemmTile&) const = default;
};

struct GemmPlan {
  GemmMainloop mainloop = GemmMainloop::kWgmma;
  GemmTile tile;
  GemmFold fold = GemmFold::kNone;
  int tree_levels = 0;     // kRegisters / kPairs / kStash: levels of the stack (S <= 2^levels)
  bool ping_pong = false;  // kWgmma: consumer warpgroups on alternate tiles (64 x BN each)
  std::string to_string() const;
  bool operator==(const GemmPlan&) const = default;
};

// The wgmma register tree whose upper level lives in shared memory (the 128x128 tile with two
// levels: 64 accumulators and two register levels of 64 spilled): the kernel's layout
// (mainloop_sm90.cuh) and the plan's name follow it.
constexpr bool gemm_tree_upper_in_smem(int bm, int bn, int tree_levels) {
  return bm == 128 && bn == 128 && tree_levels == 2;
}

// TN (dW) launches over at most this many token slots take the 64x256 ping-pong tile when it
// gives every multiprocessor a tile; longer ones (not measured) the cost model's job tile
// (plan.cc, plan_tn). With y through TMA the ping-pong tile won at every measured length.
constexpr int64_t kTnPingPongMaxK = 16384;

// Ping-pong TN launches load and store y (the f32 dW being accumulated) through TMA: over at most
// this many token slots with four y slots per warpgroup and four pipeline stages, longer ones
// with one slot and five stages (y's share of a job shrinks with K, the fifth stage's does not).
// The choice changes no bit. Measured: docs/perf.md, session 30.
constexpr int64_t kTnFourYSlotsMaxK = 2048;

// The plan the launchers run. Throws lockstep::Error for NN or TN operands TMA cannot read, for
// TN with segments != 1 or a partial, and for sizes or segments outside the contract. NN plans are
// the wgmma plans of the NT layout (the same cost model); TN plans are the wgmma job tiles
// (128x256, 128x128, 64x128) and the 64x256 ping-pong tile, one segment, no fold.
GemmPlan plan_gemm(const GemmProblem& p);

// Every plan the launchers can run for this problem (plan_gemm's among them): what the parity
// tests force, one by one, through the internal entry gemm_bf16_nt_with_plan. Same bits for each.
std::vector<GemmPlan> gemm_legal_plans(const GemmProblem& p);

// Whether `plan` is one of gemm_legal_plans(p).
bool gemm_plan_legal(const GemmProblem& p, const GemmPlan& plan);

// The small-M tiles compiled into the library (what plan_gemm can choose for M <= 64), per
// mainloop kind.
const std::vector<GemmTile>& gemm_small_m_tiles(GemmMainloop kind);

}  // namespace lockstep::cuda
