// The CUDA GEMM planner (plan.h): cost models over the compiled tiles. Speed only: every plan
// gives the same bits. The multiprocessor count of the cost models is a constant (the H200's
// 132), so that a plan is a function of the problem alone and can be printed without a GPU.
#include "cuda/gemm/plan.h"

#include <sstream>

#include "lockstep/error.h"

namespace lockstep::cuda {

namespace {

constexpr const char* kOp = "cuda::plan_gemm";
constexpr int64_t kPlanSMs = 132;

// ---- Small M (decode, M <= 64). Four M classes: M <= 8, 16, 32, 64 (the tile's bm; a larger M
// runs ceil(M / bm) CTA rows with the same bits).
int small_m_class(int64_t M) { return M <= 8 ? 0 : M <= 16 ? 1 : M <= 32 ? 2 : 3; }

// Ring tiles (cp.async, every layout) per class, largest BN first: {192, 96, 48, 32, 16}.
// NOTE: for M > 32 the BN 32 / 48 tiles have 4 warps along M (faster than 2 x 2 / 2 x 3 on the
// H200: docs/cuda-gemm.md).
constexpr GemmTile ring(int bm, int bn, int wm, int wn, int bk, int stages) {
  return GemmTile{bm, bn, bk, stages, wm, wn, 0, 0, 1};
}
const GemmTile kRingTiles[4][5] = {
    {ring(8, 192, 1, 12, 64, 7), ring(8, 96, 1, 12, 64, 6), ring(8, 48, 1, 6, 256, 6),
     ring(8, 32, 1, 4, 256, 6), ring(8, 16, 1, 2, 256, 6)},
    {ring(16, 192, 1, 12, 64, 7), ring(16, 96, 1, 12, 64, 6), ring(16, 48, 1, 6, 256, 5),
     ring(16, 32, 1, 4, 256, 6), ring(16, 16, 1, 2, 256, 6)},
    {ring(32, 192, 2, 6, 64, 6), ring(32, 96, 2, 6, 64, 6), ring(32, 48, 2, 6, 128, 6),
     ring(32, 32, 2, 4, 128, 7), ring(32, 16, 2, 2, 128, 6)},
    {ring(64, 192, 2, 6, 64, 5), ring(64, 96, 2, 6, 64, 4), ring(64, 48, 4, 3, 128, 6),
     ring(64, 32, 4, 2, 128, 7), ring(64, 16, 4, 1, 128, 6)}};

// A TMA-ring or wgmma candidate of the small-M table.
struct SmallMCandidate {
  GemmMainloop kind;
  GemmTile tile;
};
// TMA-ring tiles: WM x WN consumer warps, each MB m8 tiles of x x NA n16 tiles of w; KB64 boxes of
// 64 k per stage; NS stages (~150-210 KB of ring: one CTA per SM).
constexpr SmallMCandidate tma(int wm, int mb, int wn, int na, int kb64, int stages) {
  return {GemmMainloop::kSmallMTma,
          GemmTile{wm * mb * 8, wn * na * 16, 64 * kb64, stages, wm, wn, mb, na, 1}};
}
// wgmma tiles: 64 rows of x (the A operand) x BN rows of w, KB64 boxes of 64 k per stage.
constexpr SmallMCandidate wg(int bn, int kb64, int stages) {
  return {GemmMainloop::kSmallMWgmma, GemmTile{64, bn, 64 * kb64, stages, 0, 0, 0, 0, 1}};
}
// Per class one tile per BN in kSmallMColumns; for M > 32 the BN 32 / 48 / 64 columns are the
// wgmma tiles (faster than the TMA-ring ones there; at M <= 32 slower: docs/cuda-gemm.md).
constexpr int kSmallMColumns[6] = {16, 32, 48, 64, 96, 192};
const SmallMCandidate kCandidates[4][6] = {
    {tma(1, 1, 1, 1, 4, 12), tma(1, 1, 2, 1, 4, 9), tma(1, 1, 3, 1, 4, 7), tma(1, 1, 4, 1, 2, 11),
     tma(1, 1, 3, 2, 2, 7), tma(1, 1, 4, 3, 1, 8)},
    {tma(1, 2, 1, 1, 4, 10), tma(1, 2, 2, 1, 4, 8), tma(1, 2, 3, 1, 4, 6), tma(1, 2, 4, 1, 2, 10),
     tma(1, 2, 3, 2, 2, 7), tma(1, 2, 4, 3, 1, 8)},
    {tma(2, 2, 1, 1, 4, 8), tma(2, 2, 2, 1, 2, 12), tma(2, 2, 3, 1, 2, 10), tma(2, 2, 2, 2, 2, 8),
     tma(2, 2, 3, 2, 2, 6), tma(2, 2, 4, 3, 1, 7)},
    {tma(2, 4, 1, 1, 2, 10), wg(32, 4, 4), wg(48, 2, 7), wg(64, 2, 6), tma(2, 4, 3, 2, 1, 10),
     tma(2, 4, 6, 2, 1, 6)}};

// NOTE: the GEMM is bound by streaming w once: the busiest SM streams ceil(CTAs / SMs) · BN rows
// of w; the smallest wins, ties go to the larger BN (fewer CTAs re-reading x).
const GemmTile& small_m_ring_tile(int64_t M, int64_t N) {
  const GemmTile* row = kRingTiles[small_m_class(M)];
  const GemmTile* best = &row[0];
  int64_t best_cost = -1;
  for (int c = 0; c < 5; ++c) {
    const int64_t bn = row[c].bn;
    const int64_t cost = ((N + bn - 1) / bn + kPlanSMs - 1) / kPlanSMs * bn;
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best = &row[c];
    }
  }
  return *best;
}

// NOTE: one CTA per SM; the busiest SM streams waves · BN rows of w (HBM) and waves · M rows of x
// (L2, shared by all CTAs, counted at half weight); the smallest cost wins, ties go to the larger
// BN. For the Qwen3-8B shapes: N = 4096 -> BN 32, 6144 -> 48, 24576 -> 192 (128 CTAs each).
const SmallMCandidate& small_m_tma_tile(int64_t M, int64_t N) {
  const int64_t mrows = M < 1 ? 1 : M;
  int best = 0;
  int64_t best_cost = -1;
  for (int c = 0; c < 6; ++c) {
    const int64_t bn = kSmallMColumns[c];
    const int64_t waves = ((N + bn - 1) / bn + kPlanSMs - 1) / kPlanSMs;
    const int64_t cost = waves * (2 * bn + mrows);
    if (best_cost < 0 || cost <= best_cost) {
      best_cost = cost;
      best = c;
    }
  }
  return kCandidates[small_m_class(M)][best];
}

// The small-M kernels count k in int (segment length, tile offsets, TMA coordinates), n tiles in
// grid.x and w rows in int32 TMA coordinates.
bool small_m_takes(const GemmProblem& p) {
  return !p.partial && p.M <= 64 && p.K < (int64_t(1) << 30) && p.N < (int64_t(1) << 31);
}

GemmPlan with_fold(GemmMainloop kind, const GemmTile& t, int S, int levels) {
  return S > 1 ? GemmPlan{kind, t, GemmFold::kRegisters, levels} : GemmPlan{kind, t};
}

// Every small-M kernel folds in registers (S <= 8: three levels).
GemmPlan small_m_plan(GemmMainloop kind, const GemmTile& t, int S) {
  return with_fold(kind, t, S, 3);
}

// ---- mma.sync (cp.async; any layout): 32x64 for M <= 64, else 128x128. A per-thread register
// stack of three levels.
constexpr GemmTile kMma32x64{32, 64, 64, 8};
constexpr GemmTile kMma128x128{128, 128, 64, 4};

// ---- Hopper (TMA + wgmma): 1 producer + 2 consumer warpgroups, 64 k per stage.
constexpr GemmTile kWg128x256{128, 256, 64, 4};
constexpr GemmTile kWg128x128{128, 128, 64, 6};
// The 128x128 register tree with two levels keeps its upper level in shared memory (64 KB:
// mainloop_sm90.cuh, gemm_tree_upper_in_smem), which leaves room for 4 stages.
constexpr GemmTile kWg128x128Tree2{128, 128, 64, 4};
constexpr GemmTile kWg64x128{64, 128, 64, 8};
constexpr GemmTile kWg64x256{64, 256, 64, 5};  // ping-pong: one consumer warpgroup per tile

GemmPlan wgmma_jobs(const GemmTile& t, int S, bool ping_pong = false) {
  return GemmPlan{GemmMainloop::kWgmma, t, S > 1 ? GemmFold::kPlanes : GemmFold::kNone, 0,
                  ping_pong};
}
// The register tree: 128x128 holds one pending level (S <= 2) in registers and a second in shared
// memory (S <= 4), 64x128 three (S <= 8). The consumers have 232 registers (setmaxnreg; ptxas
// allocates them): two register levels beside 64 accumulators spilled 148 bytes.
GemmPlan wgmma_tree(const GemmTile& t, int levels) {
  return GemmPlan{GemmMainloop::kWgmma, t, GemmFold::kRegisters, levels};
}
GemmPlan wgmma_pairs() { return GemmPlan{GemmMainloop::kWgmma, kWg128x128, GemmFold::kPairs, 1}; }
// The segments folded through the stash (S = 2, 4, 8: 1-3 levels): the ping-pong tile with its
// segments as alternate turns, or the 128x256 tile (both warpgroups fold after each segment).
int stash_levels(int S) { return S == 2 ? 1 : S == 4 ? 2 : 3; }
GemmPlan wgmma_stash(int S, bool ping_pong) {
  return GemmPlan{GemmMainloop::kWgmma, ping_pong ? kWg64x256 : kWg128x256, GemmFold::kStash,
                  stash_levels(S), ping_pong};
}

int64_t tiles(const GemmProblem& p, int bm, int bn) {
  return ((p.M + bm - 1) / bm) * ((p.N + bn - 1) / bn);
}

// NOTE (ping-pong rule, measured on the H200, docs/cuda-gemm.md "Ping-pong"): with one segment the
// 64x256 ping-pong tile beat the tile the cost model picks on qkv (N = 6144, K = 4096) at M = 4096
// and 16384 and gate_up (N = 24576, K = 4096) at M = 4096, and lost on down (N = 4096, K = 12288)
// at M = 1024 and with S = 4 / 8: large M, outputs wider than the reduction, one segment.
// And from M = 1024 for outputs at least 6x wider than the reduction (gate_up, the lm_head), where
// it beat the 128x256 tile in the same number of rounds (H100, every plan forced at M = 128 ..
// 3072: docs/perf.md, session 22).
bool ping_pong_wins(const GemmProblem& p) {
  return p.segments == 1 && p.N > p.K && (p.M >= 4096 || (p.M >= 1024 && p.N >= 6 * p.K));
}

// Estimated time ∝ waves x tile area x relative cost per output of the tile shape (bigger wgmma
// N reuses shared memory better); the cheapest of the job tiles wins, ties to the bigger tile.
const GemmTile& wgmma_cost_tile(const GemmProblem& p) {
  const GemmTile* kTiles[3] = {&kWg128x256, &kWg128x128, &kWg64x128};
  constexpr double kRelCost[3] = {1.0, 1.1, 1.35};
  const GemmTile* best = kTiles[0];
  double best_cost = 0;
  for (int i = 0; i < 3; ++i) {
    const GemmTile& t = *kTiles[i];
    const int64_t jobs = tiles(p, t.bm, t.bn) * p.segments;
    const double cost = double((jobs + kPlanSMs - 1) / kPlanSMs) * t.bm * t.bn * kRelCost[i];
    if (i == 0 || cost < best_cost) {
      best = &t;
      best_cost = cost;
    }
  }
  return *best;
}

// The busiest SM's job count in a persistent launch of `jobs` jobs.
int64_t rounds(int64_t jobs) { return (jobs + kPlanSMs - 1) / kPlanSMs; }

// NOTE (wave rule, measured on the H100 at M = 128 .. 3072: docs/perf.md, session 22): with one
// segment and outputs wider than the reduction (N > K, as for the ping-pong rule), the 64x256
// ping-pong tile when it needs strictly fewer rounds than the job tiles, counted in tile area (a
// round of 64x256 jobs = half a round of 128x256 tiles), and gives every CTA two jobs at least
// (one warpgroup's tile alone ran slower than a 128x128 tile). E.g. gate_up (N = 24576) at
// M = 896: 11 rounds of 64x256 = 5.5 against 6 of 128x256. With N <= K (o_proj, down) it lost;
// on equal rounds it won or lost by a few percent.
bool ping_pong_fills(const GemmProblem& p, const GemmTile& t) {
  const int64_t t64 = tiles(p, 64, 256);
  if (p.N <= p.K || t64 < 2 * kPlanSMs) return false;
  const int64_t pp = rounds(t64) * 64 * 256;
  return pp < rounds(tiles(p, 128, 256)) * 128 * 256 &&
         pp < rounds(tiles(p, t.bm, t.bn)) * t.bm * t.bn;
}

// NOTE (stash schedule, measured on the H100: docs/cuda-gemm.md "Stash", docs/perf.md session 22):
// the ping-pong stash when every CTA gets at least two tile pairs, or when its busiest CTA (a pair
// = one 128x256 tile's time, a lone tile ~0.6 of it) finishes before the 128x256 stash's busiest
// (e.g. M = 1152: 3 tiles of 64x256 = 1.6 units against 2 rounds of 128x256).
bool stash_ping_pong(const GemmProblem& p) {
  const int64_t t64 = tiles(p, 64, 256);
  if (t64 >= 4 * kPlanSMs) return true;
  const int64_t per = rounds(t64);
  return double(per / 2) + (per % 2 != 0 ? 0.6 : 0.0) < double(rounds(tiles(p, 128, 256)));
}

GemmPlan plan_wgmma(const GemmProblem& p) {
  const int S = p.segments;
  // NOTE (tree rule, measured on the H100: docs/perf.md session 23): S = 4 on the 128x128 register
  // tree wherever its tiles fill the SMs; the stash's L2 traffic was nearly its whole cost.
  if (S == 4 && tiles(p, 128, 128) >= kPlanSMs) return wgmma_tree(kWg128x128Tree2, 2);
  // NOTE (stash rule, measured on the H100: docs/cuda-gemm.md "Stash"): with enough 64x256 tiles
  // for every SM, S = 4, and S = 8 with segments of >= 1024 (shorter ones lost to the 64x128
  // register tree), fold through the stash (the schedule: stash_ping_pong).
  if ((S == 4 || (S == 8 && p.segment_len >= 1024)) && tiles(p, 64, 256) >= kPlanSMs)
    return wgmma_stash(S, stash_ping_pong(p));
  if (S > 1) {
    const int64_t tiles128 = tiles(p, 128, 128), tiles64 = tiles(p, 64, 128);
    if (S == 2 && tiles128 >= kPlanSMs) return wgmma_tree(kWg128x128, 1);
    // NOTE: the segment-pair path pays only for long segments (measured: docs/cuda-gemm.md).
    if (S == 4 && p.segment_len >= 2048 && tiles128 >= kPlanSMs) return wgmma_pairs();
    if (tiles64 >= kPlanSMs) return wgmma_tree(kWg64x128, 3);
  }
  if (ping_pong_wins(p)) return wgmma_jobs(kWg64x256, S, /*ping_pong=*/true);
  const GemmTile& t = wgmma_cost_tile(p);
  if (S == 1 && ping_pong_fills(p, t)) return wgmma_jobs(kWg64x256, S, /*ping_pong=*/true);
  return wgmma_jobs(t, S);
}

// TN (accumulate mode, MN-major operands): the ping-pong tile for token runs up to
// kTnPingPongMaxK slots (ping-pong overlaps each job's accumulator load and store, through TMA
// since session 30, with the other warpgroup's MMAs), else the cheapest wgmma job tile. The bound
// is the longest launch measured (bench_gemm_bwd's forced TN plans, docs/perf.md session 30).
GemmPlan plan_tn(const GemmProblem& p) {
  if (p.K <= kTnPingPongMaxK && tiles(p, 64, 256) >= kPlanSMs)
    return wgmma_jobs(kWg64x256, 1, true);
  return wgmma_jobs(wgmma_cost_tile(p), 1);
}

std::vector<GemmPlan> legal_tn_plans() {
  std::vector<GemmPlan> v;
  for (const GemmTile& t : {kWg128x256, kWg128x128, kWg64x128}) v.push_back(wgmma_jobs(t, 1));
  v.push_back(wgmma_jobs(kWg64x256, 1, /*ping_pong=*/true));
  return v;
}

// The wgmma plans of a problem's segments (NT and NN).
std::vector<GemmPlan> legal_wgmma_plans(int S) {
  std::vector<GemmPlan> v;
  v.push_back(wgmma_jobs(kWg128x256, S));
  v.push_back(wgmma_jobs(kWg128x128, S));
  v.push_back(wgmma_jobs(kWg64x128, S));
  v.push_back(wgmma_jobs(kWg64x256, S, /*ping_pong=*/true));
  if (S <= 2) v.push_back(wgmma_tree(kWg128x128, 1));
  // S = 4 on the 128x128 tile: 64 accumulators + a pending level of 64 per thread, the upper level
  // in shared memory.
  if (S == 4) v.push_back(wgmma_tree(kWg128x128Tree2, 2));
  v.push_back(wgmma_tree(kWg64x128, 3));
  if (S == 4 || S == 8) v.push_back(wgmma_pairs());
  if (S > 1) {
    v.push_back(wgmma_stash(S, true));
    v.push_back(wgmma_stash(S, false));
  }
  return v;
}

void check_problem(const GemmProblem& p) {
  LS_CHECK(p.layout == GemmLayout::kNT || p.tma_ok, kOp, "layout ", gemm_layout_name(p.layout),
           " runs on the wgmma kernel only: its operands must be TMA-readable (16-byte aligned "
           "bases, row strides a multiple of 8 elements)");
  LS_CHECK(p.layout != GemmLayout::kTN || (p.segments == 1 && !p.partial), kOp,
           "layout tn (accumulate) takes one segment and no partial, got segments = ", p.segments,
           p.partial ? " (partial)" : "");
  LS_CHECK(p.M >= 0 && p.N >= 0 && p.K >= 0, kOp, "sizes must be >= 0, got M = ", p.M,
           ", N = ", p.N, ", K = ", p.K);
  LS_CHECK(p.segments == 1 || p.segments == 2 || p.segments == 4 || p.segments == 8, kOp,
           "segments must be 1, 2, 4 or 8, got ", p.segments);
  LS_CHECK(p.segment_len >= 0 && p.segment_len % 16 == 0, kOp,
           "segment_len must be a multiple of 16, got ", p.segment_len);
}

}  // namespace

const char* gemm_layout_name(GemmLayout l) {
  switch (l) {
    case GemmLayout::kNT:
      return "nt";
    case GemmLayout::kNN:
      return "nn";
    case GemmLayout::kTN:
      return "tn";
  }
  return "?";
}

const char* gemm_mainloop_name(GemmMainloop k) {
  switch (k) {
    case GemmMainloop::kSmallMRing:
      return "small-M cp.async ring (mma.sync)";
    case GemmMainloop::kSmallMTma:
      return "small-M warp-specialized TMA ring (mma.sync)";
    case GemmMainloop::kSmallMWgmma:
      return "small-M TMA ring (wgmma)";
    case GemmMainloop::kMmaSync:
      return "mma.sync m16n8k16 + cp.async";
    case GemmMainloop::kWgmma:
      return "wgmma + TMA";
  }
  return "?";
}

const char* gemm_fold_name(GemmFold f) {
  switch (f) {
    case GemmFold::kNone:
      return "one segment";
    case GemmFold::kRegisters:
      return "segments folded in registers";
    case GemmFold::kPlanes:
      return "one job per segment into fp32 planes + tree kernel";
    case GemmFold::kPairs:
      return "S/2 launches of the S = 2 register tree into fp32 planes + tree kernel";
    case GemmFold::kStash:
      return "segments folded through a per-warpgroup stash in L2";
  }
  return "?";
}

std::string GemmTile::to_string() const {
  std::ostringstream os;
  os << bm << 'x' << bn << 'x' << bk << " s" << stages;
  if (wm > 0) os << " warps " << wm << 'x' << wn;
  if (mb > 0) os << " chains " << na << 'x' << mb;
  if (cluster > 1) os << " cluster " << cluster;
  return os.str();
}

std::string GemmPlan::to_string() const {
  std::string s = gemm_mainloop_name(mainloop);
  s += ", tile ";
  s += tile.to_string();
  if (mainloop == GemmMainloop::kSmallMTma) s += " (+1 producer warp)";
  if (mainloop == GemmMainloop::kWgmma)
    s += !ping_pong ? ", 2 consumer warpgroups per tile"
         : fold == GemmFold::kStash
             ? ", 2 consumer warpgroups on tile pairs, alternate segments (ping-pong)"
             : ", 2 consumer warpgroups on alternate tiles (ping-pong)";
  s += ", ";
  s += gemm_fold_name(fold);
  if (fold == GemmFold::kRegisters || fold == GemmFold::kPairs || fold == GemmFold::kStash)
    s += " (" + std::to_string(tree_levels) + (tree_levels == 1 ? " level)" : " levels)");
  if (fold == GemmFold::kRegisters && mainloop == GemmMainloop::kWgmma &&
      gemm_tree_upper_in_smem(tile.bm, tile.bn, tree_levels))
    s += ", the upper in shared memory";
  return s;
}

GemmPlan plan_gemm(const GemmProblem& p) {
  check_problem(p);
  if (p.layout == GemmLayout::kTN) return plan_tn(p);
  if (p.layout == GemmLayout::kNN) return plan_wgmma(p);
  const int S = p.segments;
  if (small_m_takes(p)) {
    // The TMA tiles when the operands allow them, else the ring tile (every layout).
    if (p.tma_ok) {
      const SmallMCandidate& c = small_m_tma_tile(p.M, p.N);
      return small_m_plan(c.kind, c.tile, S);
    }
    return small_m_plan(GemmMainloop::kSmallMRing, small_m_ring_tile(p.M, p.N), S);
  }
  if (!p.partial && p.M <= 64) return with_fold(GemmMainloop::kMmaSync, kMma32x64, S, 3);
  if (!p.tma_ok) return with_fold(GemmMainloop::kMmaSync, kMma128x128, S, 3);
  return plan_wgmma(p);
}

std::vector<GemmPlan> gemm_legal_plans(const GemmProblem& p) {
  check_problem(p);
  if (p.layout == GemmLayout::kTN) return legal_tn_plans();
  const int S = p.segments;
  if (p.layout == GemmLayout::kNN) return legal_wgmma_plans(S);
  std::vector<GemmPlan> v;
  v.push_back(with_fold(GemmMainloop::kMmaSync, kMma32x64, S, 3));
  v.push_back(with_fold(GemmMainloop::kMmaSync, kMma128x128, S, 3));
  if (p.tma_ok) {
    const std::vector<GemmPlan> wg = legal_wgmma_plans(S);
    v.insert(v.end(), wg.begin(), wg.end());
  }
  if (small_m_takes(p)) {
    for (const GemmTile& t : gemm_small_m_tiles(GemmMainloop::kSmallMRing))
      v.push_back(small_m_plan(GemmMainloop::kSmallMRing, t, S));
    if (p.tma_ok) {
      for (GemmMainloop k : {GemmMainloop::kSmallMTma, GemmMainloop::kSmallMWgmma})
        for (const GemmTile& t : gemm_small_m_tiles(k)) v.push_back(small_m_plan(k, t, S));
    }
  }
  return v;
}

bool gemm_plan_legal(const GemmProblem& p, const GemmPlan& plan) {
  for (const GemmPlan& q : gemm_legal_plans(p))
    if (q == plan) return true;
  return false;
}

const std::vector<GemmTile>& gemm_small_m_tiles(GemmMainloop kind) {
  static const std::vector<GemmTile> kRing = [] {
    std::vector<GemmTile> v;
    for (const auto& row : kRingTiles)
      for (const GemmTile& t : row) v.push_back(t);
    return v;
  }();
  auto candidates_of = [](GemmMainloop k) {
    std::vector<GemmTile> v;
    for (const auto& row : kCandidates)
      for (const SmallMCandidate& c : row)
        if (c.kind == k) v.push_back(c.tile);
    return v;
  };
  static const std::vector<GemmTile> kTma = candidates_of(GemmMainloop::kSmallMTma);
  static const std::vector<GemmTile> kWg = candidates_of(GemmMainloop::kSmallMWgmma);
  static const std::vector<GemmTile> kNoTiles;
  return kind == GemmMainloop::kSmallMRing    ? kRing
         : kind == GemmMainloop::kSmallMTma   ? kTma
         : kind == GemmMainloop::kSmallMWgmma ? kWg
                                              : kNoTiles;
}

}  // namespace lockstep::cuda
