// The CUDA GEMM planner (src/cuda/gemm/plan.h), on the CPU: the plans for the Qwen3-0.6B and 8B
// layer shapes equal the choices of the dispatch it replaced (commit 90d8be4), except where the
// ping-pong, stash and wave rules now apply; the planner is a pure function; the layouts of the
// backward are a clear error; every legal plan is distinct and plan_gemm's choice is one of them.
//
// Where the expectations come from: the table kDispatch90d8be4 below was produced by a verbatim
// host transcription of 90d8be4's dispatch — src/cuda/gemm_bf16_nt.cu choose_sm90 (kPlanSMs = 132)
// for M > 64, src/cuda/gemm_small_m.cu small_m_candidate_variant (kSmallMCandidateUpToM = 64,
// kCandidateClusters = false, kCandidateWgmma = true) for M <= 64 with sm_count 132 (the H200),
// and small_m_default_variant for operands TMA cannot read — run on these shapes. Each entry names
// the old GemmPath or variant index; kOldNames maps it to the tile that variant instantiated (its
// macro arguments in 90d8be4's kVariants are quoted beside it).
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "cuda/gemm/plan.h"
#include "lockstep/error.h"
#include "lockstep/ops/gemm.h"

namespace lockstep::cuda {
namespace {

using K = GemmMainloop;

GemmTile tile(int bm, int bn, int bk, int stages, int wm = 0, int wn = 0, int mb = 0, int na = 0) {
  return GemmTile{bm, bn, bk, stages, wm, wn, mb, na, 1};
}
// 90d8be4's LS_SMALL_M_WS(WM, MB, WN, NA, KB64, NS) and LS_SMALL_M_VARIANT(BM, BN, WM, WN, BK, NS).
GemmTile ws(int wm, int mb, int wn, int na, int kb64, int ns) {
  return tile(wm * mb * 8, wn * na * 16, 64 * kb64, ns, wm, wn, mb, na);
}
GemmTile ring(int bm, int bn, int wm, int wn, int bk, int ns) {
  return tile(bm, bn, bk, ns, wm, wn);
}

struct Old {
  K kind;
  GemmTile tile;
  GemmFold fold_s1;  // the fold at S = 1
  GemmFold fold_sn;  // at S > 1
  int levels;        // register-stack levels at S > 1 (or for kRegisters at any S)
  bool ping_pong = false;
};

const std::map<std::string, Old>& old_names() {
  static const std::map<std::string, Old> m = {
      // small-M kind 1 (TMA ring) and kind 2 (wgmma) candidates; every small-M kernel folds in
      // registers with three levels.
      {"v28", {K::kSmallMTma, ws(1, 1, 1, 1, 4, 12), GemmFold::kNone, GemmFold::kRegisters, 3}},
      {"v29", {K::kSmallMTma, ws(1, 1, 2, 1, 4, 9), GemmFold::kNone, GemmFold::kRegisters, 3}},
      {"v30", {K::kSmallMTma, ws(1, 1, 3, 1, 4, 7), GemmFold::kNone, GemmFold::kRegisters, 3}},
      {"v33", {K::kSmallMTma, ws(1, 1, 4, 3, 1, 8), GemmFold::kNone, GemmFold::kRegisters, 3}},
      {"v34", {K::kSmallMTma, ws(1, 2, 1, 1, 4, 10), GemmFold::kNone, GemmFold::kRegisters, 3}},
      {"v35", {K::kSmallMTma, ws(1, 2, 2, 1, 4, 8), GemmFold::kNone, GemmFold::kRegisters, 3}},
      {"v36", {K::kSmallMTma, ws(1, 2, 3, 1, 4, 6), GemmFold::kNone, GemmFold::kRegisters, 3}},
      {"v39", {K::kSmallMTma, ws(1, 2, 4, 3, 1, 8), GemmFold::kNone, GemmFold::kRegisters, 3}},
      {"v46", {K::kSmallMTma, ws(2, 4, 1, 1, 2, 10), GemmFold::kNone, GemmFold::kRegisters, 3}},
      {"v51", {K::kSmallMTma, ws(2, 4, 6, 2, 1, 6), GemmFold::kNone, GemmFold::kRegisters, 3}},
      // LS_SMALL_M_WG(BN, KB64, NS): 64 x BN, 64·KB64 k per stage
      {"v78", {K::kSmallMWgmma, tile(64, 32, 256, 4), GemmFold::kNone, GemmFold::kRegisters, 3}},
      {"v79", {K::kSmallMWgmma, tile(64, 48, 128, 7), GemmFold::kNone, GemmFold::kRegisters, 3}},
      // small-M kind 0 (cp.async ring) default tiles
      {"v0", {K::kSmallMRing, ring(8, 16, 1, 2, 256, 6), GemmFold::kNone, GemmFold::kRegisters, 3}},
      {"v1", {K::kSmallMRing, ring(8, 32, 1, 4, 256, 6), GemmFold::kNone, GemmFold::kRegisters, 3}},
      {"v2", {K::kSmallMRing, ring(8, 48, 1, 6, 256, 6), GemmFold::kNone, GemmFold::kRegisters, 3}},
      {"v4",
       {K::kSmallMRing, ring(8, 192, 1, 12, 64, 7), GemmFold::kNone, GemmFold::kRegisters, 3}},
      {"v5",
       {K::kSmallMRing, ring(16, 16, 1, 2, 256, 6), GemmFold::kNone, GemmFold::kRegisters, 3}},
      {"v6",
       {K::kSmallMRing, ring(16, 32, 1, 4, 256, 6), GemmFold::kNone, GemmFold::kRegisters, 3}},
      {"v7",
       {K::kSmallMRing, ring(16, 48, 1, 6, 256, 5), GemmFold::kNone, GemmFold::kRegisters, 3}},
      {"v9",
       {K::kSmallMRing, ring(16, 192, 1, 12, 64, 7), GemmFold::kNone, GemmFold::kRegisters, 3}},
      {"v15",
       {K::kSmallMRing, ring(64, 16, 4, 1, 128, 6), GemmFold::kNone, GemmFold::kRegisters, 3}},
      {"v19",
       {K::kSmallMRing, ring(64, 192, 2, 6, 64, 5), GemmFold::kNone, GemmFold::kRegisters, 3}},
      {"v20",
       {K::kSmallMRing, ring(64, 32, 4, 2, 128, 7), GemmFold::kNone, GemmFold::kRegisters, 3}},
      {"v22",
       {K::kSmallMRing, ring(64, 48, 4, 3, 128, 6), GemmFold::kNone, GemmFold::kRegisters, 3}},
      // 90d8be4's kSm90Tiles {path, bm, bn, stages, levels}; levels 0 with S > 1: workspace planes
      {"kWgmma128x256", {K::kWgmma, tile(128, 256, 64, 4), GemmFold::kNone, GemmFold::kPlanes, 0}},
      {"kWgmma128x128", {K::kWgmma, tile(128, 128, 64, 6), GemmFold::kNone, GemmFold::kPlanes, 0}},
      {"kWgmma64x128", {K::kWgmma, tile(64, 128, 64, 8), GemmFold::kNone, GemmFold::kPlanes, 0}},
      {"kWgmma128x128Tree",
       {K::kWgmma, tile(128, 128, 64, 6), GemmFold::kRegisters, GemmFold::kRegisters, 1}},
      {"kWgmma64x128Tree",
       {K::kWgmma, tile(64, 128, 64, 8), GemmFold::kRegisters, GemmFold::kRegisters, 3}},
      {"kWgmma128x128Pairs",
       {K::kWgmma, tile(128, 128, 64, 6), GemmFold::kPairs, GemmFold::kPairs, 1}},
      {"kWgmma64x256PingPong",
       {K::kWgmma, tile(64, 256, 64, 5), GemmFold::kNone, GemmFold::kPlanes, 0, true}},
      // mma.sync kernels: a three-level register stack
      {"kMma32x64", {K::kMmaSync, tile(32, 64, 64, 8), GemmFold::kNone, GemmFold::kRegisters, 3}},
      {"kMma128x128",
       {K::kMmaSync, tile(128, 128, 64, 4), GemmFold::kNone, GemmFold::kRegisters, 3}},
  };
  return m;
}

GemmPlan expected(const std::string& old_name, int S) {
  const auto it = old_names().find(old_name);
  EXPECT_NE(it, old_names().end()) << old_name;
  const Old& o = it->second;
  GemmPlan p;
  p.mainloop = o.kind;
  p.tile = o.tile;
  p.fold = S == 1 ? o.fold_s1 : o.fold_sn;
  p.tree_levels = (p.fold == GemmFold::kRegisters || p.fold == GemmFold::kPairs) ? o.levels : 0;
  p.ping_pong = o.ping_pong;
  return p;
}

struct Row {
  const char* shape;
  int64_t N, K, M;
  const char* by_s[4];  // S = 1, 2, 4, 8
};

// Qwen3-0.6B (H = 1024, 16 q / 8 kv heads of 128, I = 3072, V = 151936) and Qwen3-8B (H = 4096,
// 32 / 8 heads of 128, I = 12288): qkv [(Hq + 2 Hkv) D, H], o_proj [H, Hq D], gate_up [2 I, H],
// down [H, I], lm_head [V, H]. Operands TMA-compatible (contiguous weights and activations).
const Row kDispatch90d8be4[] = {
    // Qwen3-0.6B
    {"qkv", 4096, 1024, 1, {"v29", "v29", "v29", "v29"}},
    {"qkv", 4096, 1024, 16, {"v35", "v35", "v35", "v35"}},
    {"qkv", 4096, 1024, 64, {"v78", "v78", "v78", "v78"}},
    {"qkv",
     4096,
     1024,
     1024,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
    {"qkv",
     4096,
     1024,
     4096,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
    {"qkv",
     4096,
     1024,
     16384,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
    {"o_proj", 1024, 2048, 1, {"v28", "v28", "v28", "v28"}},
    {"o_proj", 1024, 2048, 16, {"v34", "v34", "v34", "v34"}},
    {"o_proj", 1024, 2048, 64, {"v46", "v46", "v46", "v46"}},
    {"o_proj",
     1024,
     2048,
     1024,
     {"kWgmma64x128", "kWgmma128x128", "kWgmma128x256", "kWgmma128x256"}},
    {"o_proj",
     1024,
     2048,
     4096,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
    {"o_proj",
     1024,
     2048,
     16384,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
    {"gate_up", 6144, 1024, 1, {"v30", "v30", "v30", "v30"}},
    {"gate_up", 6144, 1024, 16, {"v36", "v36", "v36", "v36"}},
    {"gate_up", 6144, 1024, 64, {"v79", "v79", "v79", "v79"}},
    {"gate_up",
     6144,
     1024,
     1024,
     {"kWgmma128x128", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
    {"gate_up",
     6144,
     1024,
     4096,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
    {"gate_up",
     6144,
     1024,
     16384,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
    {"down", 1024, 3072, 1, {"v28", "v28", "v28", "v28"}},
    {"down", 1024, 3072, 16, {"v34", "v34", "v34", "v34"}},
    {"down", 1024, 3072, 64, {"v46", "v46", "v46", "v46"}},
    {"down", 1024, 3072, 1024, {"kWgmma64x128", "kWgmma128x128", "kWgmma128x256", "kWgmma128x256"}},
    {"down",
     1024,
     3072,
     4096,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
    {"down",
     1024,
     3072,
     16384,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
    {"lm_head", 151936, 1024, 1, {"v33", "v33", "v33", "v33"}},
    {"lm_head", 151936, 1024, 16, {"v39", "v39", "v39", "v39"}},
    {"lm_head", 151936, 1024, 64, {"v51", "v51", "v51", "v51"}},
    {"lm_head",
     151936,
     1024,
     1024,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
    {"lm_head",
     151936,
     1024,
     4096,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
    {"lm_head",
     151936,
     1024,
     16384,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
    // Qwen3-8B
    {"qkv", 6144, 4096, 1, {"v30", "v30", "v30", "v30"}},
    {"qkv", 6144, 4096, 16, {"v36", "v36", "v36", "v36"}},
    {"qkv", 6144, 4096, 64, {"v79", "v79", "v79", "v79"}},
    {"qkv",
     6144,
     4096,
     1024,
     {"kWgmma128x128", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
    {"qkv",
     6144,
     4096,
     4096,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
    {"qkv",
     6144,
     4096,
     16384,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
    {"o_proj", 4096, 4096, 1, {"v29", "v29", "v29", "v29"}},
    {"o_proj", 4096, 4096, 16, {"v35", "v35", "v35", "v35"}},
    {"o_proj", 4096, 4096, 64, {"v78", "v78", "v78", "v78"}},
    {"o_proj",
     4096,
     4096,
     1024,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
    {"o_proj",
     4096,
     4096,
     4096,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
    {"o_proj",
     4096,
     4096,
     16384,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
    {"gate_up", 24576, 4096, 1, {"v33", "v33", "v33", "v33"}},
    {"gate_up", 24576, 4096, 16, {"v39", "v39", "v39", "v39"}},
    {"gate_up", 24576, 4096, 64, {"v51", "v51", "v51", "v51"}},
    {"gate_up",
     24576,
     4096,
     1024,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
    {"gate_up",
     24576,
     4096,
     4096,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
    {"gate_up",
     24576,
     4096,
     16384,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
    {"down", 4096, 12288, 1, {"v29", "v29", "v29", "v29"}},
    {"down", 4096, 12288, 16, {"v35", "v35", "v35", "v35"}},
    {"down", 4096, 12288, 64, {"v78", "v78", "v78", "v78"}},
    {"down",
     4096,
     12288,
     1024,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma128x128Pairs", "kWgmma64x128Tree"}},
    {"down",
     4096,
     12288,
     4096,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma128x128Pairs", "kWgmma64x128Tree"}},
    {"down",
     4096,
     12288,
     16384,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma128x128Pairs", "kWgmma64x128Tree"}},
    {"lm_head", 151936, 4096, 1, {"v33", "v33", "v33", "v33"}},
    {"lm_head", 151936, 4096, 16, {"v39", "v39", "v39", "v39"}},
    {"lm_head", 151936, 4096, 64, {"v51", "v51", "v51", "v51"}},
    {"lm_head",
     151936,
     4096,
     1024,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
    {"lm_head",
     151936,
     4096,
     4096,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
    {"lm_head",
     151936,
     4096,
     16384,
     {"kWgmma128x256", "kWgmma128x128Tree", "kWgmma64x128Tree", "kWgmma64x128Tree"}},
};

constexpr int kSegments[4] = {1, 2, 4, 8};

GemmProblem problem(int64_t M, int64_t N, int64_t K, int S) {
  GemmProblem p;
  p.M = M;
  p.N = N;
  p.K = K;
  p.segments = S;
  p.segment_len = gemm_k_layout(GemmConfig{S}, K).segment_len;
  return p;
}

// The deliberate changes from 90d8be4: the ping-pong rule (docs/cuda-gemm.md "Ping-pong"): one
// segment, M >= 4096, N > K; the stash rule ("Stash"): M > 64, S = 4 (or 8 with segments of >=
// 1024), at least 132 tiles of 64x256.
bool ping_pong_rule(int64_t M, int64_t N, int64_t K, int S) {
  return S == 1 && N > K &&
         (M >= 4096 || (M >= 1024 && N >= 6 * K));  // session 22: from 1024, N >= 6K
}
// The busiest of 132 SMs' share of n jobs.
int64_t busiest(int64_t n) { return (n + 131) / 132; }
// The wave rule (session 22): S = 1, N > K, >= 2 x 132 jobs of 64x256, and strictly fewer rounds
// (in tile area) than both the 128x256 tile and the plan the table names.
bool wave_rule(int64_t M, int64_t N, int64_t K, int S, const GemmTile& named) {
  const int64_t t64 = ((M + 63) / 64) * ((N + 255) / 256);
  if (S != 1 || M <= 64 || N <= K || t64 < 2 * 132) return false;
  auto area_rounds = [&](int64_t bm, int64_t bn) {
    return busiest(((M + bm - 1) / bm) * ((N + bn - 1) / bn)) * bm * bn;
  };
  const int64_t pp = busiest(t64) * 64 * 256;
  return pp < area_rounds(128, 256) && pp < area_rounds(named.bm, named.bn);
}
// S = 4 on the 128x128 register tree (2 levels, 4 stages) with >= 132 of its tiles.
bool tree128_rule(int64_t M, int64_t N, int S) {
  return M > 64 && S == 4 && ((M + 127) / 128) * ((N + 127) / 128) >= 132;
}
GemmPlan tree128_plan() {
  GemmPlan p = expected("kWgmma128x128Tree", 1);
  p.tree_levels = 2;
  p.tile.stages = 4;  // its upper level in shared memory
  return p;
}
bool stash_rule(int64_t M, int64_t N, int64_t K, int S) {
  const int64_t seg_len = gemm_k_layout(GemmConfig{S}, K).segment_len;
  return M > 64 && (S == 4 || (S == 8 && seg_len >= 1024)) &&
         ((M + 63) / 64) * ((N + 255) / 256) >= 132 && !tree128_rule(M, N, S);
}
// The stash plan (session 22's schedule rule): the ping-pong tile with at least two tile pairs per
// CTA (>= 528 tiles of 64x256), or when its busiest CTA (pairs of 64x256 tiles at 1 unit, a lone
// tile at 0.6) beats the 128x256 tile's rounds; else the 128x256 tile.
GemmPlan stash_plan(int64_t M, int64_t N, int S) {
  const int64_t t64 = ((M + 63) / 64) * ((N + 255) / 256);
  const int64_t per = busiest(t64);
  const bool pp = t64 >= 4 * 132 || double(per / 2) + (per % 2 != 0 ? 0.6 : 0.0) <
                                        double(busiest(((M + 127) / 128) * ((N + 255) / 256)));
  GemmPlan p = expected(pp ? "kWgmma64x256PingPong" : "kWgmma128x256", 1);
  p.fold = GemmFold::kStash;
  p.tree_levels = S == 2 ? 1 : S == 4 ? 2 : 3;
  return p;
}

TEST(GemmPlan, QwenShapesMatchTheDispatchItReplaced) {
  int ping_pong_rows = 0, stash_rows = 0, wave_rows = 0;
  for (const Row& r : kDispatch90d8be4) {
    for (int si = 0; si < 4; ++si) {
      const int S = kSegments[si];
      const GemmProblem p = problem(r.M, r.N, r.K, S);
      const GemmPlan got = plan_gemm(p);
      const bool pp = ping_pong_rule(r.M, r.N, r.K, S);
      const bool stash = stash_rule(r.M, r.N, r.K, S);
      ping_pong_rows += pp ? 1 : 0;
      stash_rows += stash ? 1 : 0;
      GemmPlan want =
          stash ? stash_plan(r.M, r.N, S) : expected(pp ? "kWgmma64x256PingPong" : r.by_s[si], S);
      const bool wave = !stash && !pp && wave_rule(r.M, r.N, r.K, S, want.tile);
      wave_rows += wave ? 1 : 0;
      if (wave) want = expected("kWgmma64x256PingPong", 1);
      if (tree128_rule(r.M, r.N, S)) want = tree128_plan();
      EXPECT_EQ(got, want) << r.shape << " N=" << r.N << " K=" << r.K << " M=" << r.M << " S=" << S
                           << ": got " << got.to_string() << ", want " << want.to_string()
                           << (pp      ? " (ping-pong rule)"
                               : stash ? " (stash rule)"
                               : wave  ? " (wave rule)"
                                       : "");
      EXPECT_TRUE(gemm_plan_legal(p, got)) << got.to_string();
    }
  }
  // qkv, gate_up, lm_head of both models at M = 4096 and 16384 (N > K); never o_proj / down.
  // + gate_up and lm_head of both models at M = 1024 (N >= 6 K)
  EXPECT_EQ(ping_pong_rows, 16);
  // S = 8 on the 8B down_proj (segments of 1536) at M = 1024, 4096, 16384; every S = 4 row with
  // >= 132 tiles takes the 128x128 register tree instead.
  EXPECT_EQ(stash_rows, 3);
  // The table's M (1, 16, 64, 1024, 4096, 16384) fill the SMs as well with either tile.
  EXPECT_EQ(wave_rows, 0);
}

// The wave rule and the stash schedule at the training forward's micro-batch sizes (the points
// measured on the H100, docs/perf.md session 22), and the rules' oracles over every M of the 8B
// shapes from 65 to 3072.
TEST(GemmPlan, WaveRuleAtMicroBatchSizes) {
  const GemmPlan pp = expected("kWgmma64x256PingPong", 1);
  // gate_up (N = 24576 > K): 14 x 96 = 1344 jobs = 11 rounds of half tiles against 6 whole ones
  EXPECT_EQ(plan_gemm(problem(896, 24576, 4096, 1)), pp);
  EXPECT_EQ(plan_gemm(problem(1280, 24576, 4096, 1)), pp);
  // qkv at M = 1024 (N = 1.5 K): 3 rounds of 64x256 = 1.5 against 128x128's 3 x 0.5 = 1.5: equal
  EXPECT_EQ(plan_gemm(problem(1024, 6144, 4096, 1)), expected("kWgmma128x128", 1));
  // gate_up at M = 1024: the ping-pong rule (N >= 6 K), not the wave rule (12 half rounds = 6)
  EXPECT_EQ(plan_gemm(problem(1024, 24576, 4096, 1)), pp);
  EXPECT_EQ(plan_gemm(problem(192, 151936, 4096, 1)), pp);  // the lm_head: 14 half rounds vs 9
  // N <= K (o_proj, down): never
  EXPECT_EQ(plan_gemm(problem(1152, 4096, 4096, 1)), expected("kWgmma128x128", 1));
  EXPECT_EQ(plan_gemm(problem(1152, 4096, 12288, 1)), expected("kWgmma128x128", 1));
  // qkv at M = 256: 96 jobs, fewer than two per CTA
  EXPECT_EQ(plan_gemm(problem(256, 6144, 4096, 1)).ping_pong, false);
  // The stash schedule at S = 4: o_proj / down at M = 1152 (3 tiles of 64x256 on the busiest CTA
  // = 1.6 units against 2 rounds of 128x256) on the ping-pong tile; at M = 1024 (1 against 1) and
  // 2048 (2 against 2) on the 128x256 tile.
  // (At S = 4 the 128x128 register tree wherever its tiles fill the SMs.)
  for (const int64_t K : {int64_t(4096), int64_t(12288)})
    for (const int64_t M : {int64_t(1024), int64_t(1152), int64_t(2048)})
      EXPECT_EQ(plan_gemm(problem(M, 4096, K, 4)), tree128_plan()) << "M=" << M << " K=" << K;
  // The oracles at every M: the stash rule's schedule, the wave rule's tile.
  struct Sh {
    int64_t N, K;
  };
  for (const Sh sh : {Sh{6144, 4096}, Sh{4096, 4096}, Sh{24576, 4096}, Sh{4096, 12288}}) {
    for (int64_t M = 65; M <= 3072; ++M) {
      for (const int S : {1, 4}) {
        const GemmPlan got = plan_gemm(problem(M, sh.N, sh.K, S));
        if (tree128_rule(M, sh.N, S)) {
          EXPECT_EQ(got, tree128_plan()) << "M=" << M << " N=" << sh.N;
        } else if (stash_rule(M, sh.N, sh.K, S)) {
          EXPECT_EQ(got, stash_plan(M, sh.N, S)) << "M=" << M << " N=" << sh.N << " S=" << S;
        } else if (S == 1 && !ping_pong_rule(M, sh.N, sh.K, S)) {
          // got is the ping-pong tile exactly when the rule says so against the job tile the cost
          // model would have taken (the plan with the rule off: got itself when not ping-pong).
          if (got.ping_pong) {
            EXPECT_GT(sh.N, sh.K) << "M=" << M;
            EXPECT_GE(((M + 63) / 64) * ((sh.N + 255) / 256), 264) << "M=" << M;
          } else {
            EXPECT_FALSE(wave_rule(M, sh.N, sh.K, S, got.tile))
                << "M=" << M << " N=" << sh.N << ": " << got.to_string();
          }
        }
      }
    }
  }
}

// Operands TMA cannot read: the cp.async ring tiles for M <= 64 (90d8be4's small_m_default_variant,
// sm_count 132), the 128x128 mma.sync kernel above.
TEST(GemmPlan, NonTmaOperands) {
  struct R {
    int64_t N, M;
    const char* old;
  };
  const R rows[] = {{1024, 1, "v0"},
                    {1024, 16, "v5"},
                    {1024, 64, "v15"},
                    {4096, 1, "v1"},
                    {4096, 16, "v6"},
                    {4096, 64, "v20"},
                    {6144, 1, "v2"},
                    {6144, 16, "v7"},
                    {6144, 64, "v22"},
                    {24576, 1, "v4"},
                    {24576, 16, "v9"},
                    {24576, 64, "v19"},
                    {151936, 1, "v4"},
                    {151936, 16, "v9"},
                    {151936, 64, "v19"},
                    {4096, 1024, "kMma128x128"},
                    {4096, 16384, "kMma128x128"}};
  for (const R& r : rows) {
    for (int S : kSegments) {
      GemmProblem p = problem(r.M, r.N, 4096, S);
      p.tma_ok = false;
      EXPECT_EQ(plan_gemm(p), expected(r.old, S)) << "N=" << r.N << " M=" << r.M << " S=" << S;
    }
  }
}

// gemm_bf16_nt_partial never takes the small-M kernels (90d8be4: small_m_candidate = false):
// M <= 64 goes to choose_sm90 (TMA) or the 128x128 mma.sync kernel.
TEST(GemmPlan, PartialsSkipSmallM) {
  GemmProblem p = problem(16, 4096, 2048, 2);
  p.partial = true;
  EXPECT_EQ(plan_gemm(p), expected("kWgmma64x128", 2));  // 4 jobs of 64x128: cheapest
  p.tma_ok = false;
  EXPECT_EQ(plan_gemm(p), expected("kMma128x128", 2));
  // Full GEMM, M <= 64, a K the small-M kernels do not count (>= 2^30): mma.sync 32x64.
  GemmProblem big = problem(8, 64, int64_t(1) << 30, 1);
  EXPECT_EQ(plan_gemm(big), expected("kMma32x64", 1));
}

TEST(GemmPlan, PureFunction) {
  // Same inputs, same plan, whatever was planned in between (no global state).
  for (const Row& r : kDispatch90d8be4) {
    for (int S : kSegments) {
      const GemmProblem p = problem(r.M, r.N, r.K, S);
      const GemmPlan a = plan_gemm(p);
      (void)plan_gemm(problem(1, 151936, 4096, 8));
      (void)gemm_legal_plans(problem(16384, 24576, 4096, 1));
      const GemmPlan b = plan_gemm(p);
      EXPECT_EQ(a, b);
      EXPECT_EQ(a.to_string(), b.to_string());
    }
  }
}

// NN (dX, w read in place) and TN (dW): the wgmma kernel only, so TMA-readable operands only; a
// problem TMA cannot read throws naming the layout.
TEST(GemmPlan, NnAndTnNeedTma) {
  for (GemmLayout l : {GemmLayout::kNN, GemmLayout::kTN}) {
    GemmProblem p = problem(256, 4096, 4096, 1);
    p.layout = l;
    p.tma_ok = false;
    try {
      (void)plan_gemm(p);
      ADD_FAILURE() << "no error for layout " << gemm_layout_name(l) << " without TMA";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("TMA-readable"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(gemm_layout_name(l)), std::string::npos) << e.what();
    }
    EXPECT_THROW((void)gemm_legal_plans(p), Error);
  }
}

// NN: the NT layout's wgmma plans (same cost model: the same choice as NT where NT picks wgmma),
// every segment count; the chosen plan is legal.
TEST(GemmPlan, NnPlansAreTheWgmmaPlans) {
  const int64_t kSizes[][3] = {{65, 4096, 6144},     {1024, 4096, 6144},  {1024, 4096, 24576},
                               {4096, 12288, 4096},  {16384, 4096, 4096}, {333, 989, 1000},
                               {16384, 4096, 12288}, {1, 128, 64}};
  for (const auto& sz : kSizes) {
    for (int S : {1, 2, 4, 8}) {
      GemmProblem p = problem(sz[0], sz[1], sz[2], S);
      GemmProblem nt = p;
      p.layout = GemmLayout::kNN;
      const GemmPlan chosen = plan_gemm(p);
      EXPECT_EQ(chosen.mainloop, GemmMainloop::kWgmma) << chosen.to_string();
      EXPECT_TRUE(gemm_plan_legal(p, chosen)) << chosen.to_string();
      const GemmPlan nt_plan = plan_gemm(nt);
      if (nt_plan.mainloop == GemmMainloop::kWgmma) {
        EXPECT_EQ(chosen, nt_plan);
      }
      for (const GemmPlan& q : gemm_legal_plans(p)) {
        EXPECT_EQ(q.mainloop, GemmMainloop::kWgmma) << q.to_string();
        EXPECT_TRUE(gemm_plan_legal(nt, q)) << q.to_string();  // an NT plan too
      }
    }
  }
}

// TN (dW, accumulate mode): the wgmma job tiles and the ping-pong tile, one segment, no fold,
// whatever the sizes (small M included); the chosen plan is legal.
TEST(GemmPlan, TnPlansAccumulateOnly) {
  auto accumulates = [](const GemmPlan& q) {
    const bool jobs =
        !q.ping_pong && (q.tile == GemmTile{128, 256, 64, 4} ||
                         q.tile == GemmTile{128, 128, 64, 6} || q.tile == GemmTile{64, 128, 64, 8});
    const bool pp = q.ping_pong && q.tile == GemmTile{64, 256, 64, 5};
    return q.mainloop == GemmMainloop::kWgmma && (jobs || pp) && q.fold == GemmFold::kNone &&
           q.tree_levels == 0;
  };
  const int64_t kSizes[][3] = {{1, 1, 16},       {3, 17, 16},         {64, 64, 64},
                               {111, 989, 336},  {256, 256, 4096},    {6144, 4096, 8192},
                               {4096, 4096, 16}, {24576, 4096, 8192}, {4096, 12288, 1024}};
  for (const auto& sz : kSizes) {
    GemmProblem p = problem(sz[0], sz[1], sz[2], 1);
    p.layout = GemmLayout::kTN;
    const GemmPlan chosen = plan_gemm(p);
    EXPECT_TRUE(accumulates(chosen)) << chosen.to_string();
    EXPECT_TRUE(gemm_plan_legal(p, chosen)) << chosen.to_string();
    const std::vector<GemmPlan> legal = gemm_legal_plans(p);
    EXPECT_EQ(legal.size(), 4u);
    for (const GemmPlan& q : legal) EXPECT_TRUE(accumulates(q)) << q.to_string();
  }
  GemmProblem p = problem(256, 256, 256, 2);
  p.layout = GemmLayout::kTN;
  EXPECT_THROW((void)plan_gemm(p), Error);
  p = problem(256, 256, 256, 1);
  p.layout = GemmLayout::kTN;
  p.partial = true;
  EXPECT_THROW((void)gemm_legal_plans(p), Error);
}

// The dW launches of the Qwen3-8B shapes (rows, columns of dw; K = token slots) take the 64x256
// ping-pong tile up to kTnPingPongMaxK slots, the cost model's job tile past it (measured:
// docs/perf.md).
TEST(GemmPlan, TnTakesPingPongUpToItsBound) {
  const int64_t kShapes[][2] = {{6144, 4096}, {4096, 4096}, {24576, 4096}, {4096, 12288}};
  for (const auto& sh : kShapes) {
    for (int64_t K : {int64_t(1024), int64_t(2048), int64_t(4096), int64_t(8192), kTnPingPongMaxK,
                      kTnPingPongMaxK + 16, int64_t(65536)}) {
      GemmProblem p = problem(sh[0], sh[1], K, 1);
      p.layout = GemmLayout::kTN;
      const GemmPlan chosen = plan_gemm(p);
      const bool pp = K <= kTnPingPongMaxK;
      EXPECT_EQ(chosen.ping_pong, pp)
          << sh[0] << "x" << sh[1] << " K " << K << ": " << chosen.to_string();
      if (pp) {
        EXPECT_EQ(chosen.tile, (GemmTile{64, 256, 64, 5})) << chosen.to_string();
      }
    }
  }
  // Too few 64x256 tiles to fill the multiprocessors: a job tile however short the run.
  GemmProblem p = problem(256, 1024, 1024, 1);
  p.layout = GemmLayout::kTN;
  EXPECT_FALSE(plan_gemm(p).ping_pong) << plan_gemm(p).to_string();
}

TEST(GemmPlan, BadProblemsThrow) {
  GemmProblem p = problem(64, 64, 64, 1);
  p.segments = 3;
  EXPECT_THROW((void)plan_gemm(p), Error);
  p = problem(64, 64, 64, 2);
  p.segment_len = 40;
  EXPECT_THROW((void)plan_gemm(p), Error);
  p = problem(-1, 64, 64, 1);
  EXPECT_THROW((void)plan_gemm(p), Error);
}

TEST(GemmPlan, LegalPlansAreDistinctAndContainTheChoice) {
  for (int64_t M : {int64_t(1), int64_t(64), int64_t(65), int64_t(4096)}) {
    for (int S : kSegments) {
      for (bool tma : {true, false}) {
        GemmProblem p = problem(M, 6144, 4096, S);
        p.tma_ok = tma;
        const std::vector<GemmPlan> v = gemm_legal_plans(p);
        std::set<std::string> names;
        for (const GemmPlan& q : v) names.insert(q.to_string());
        EXPECT_EQ(names.size(), v.size()) << "M=" << M << " S=" << S;
        EXPECT_TRUE(gemm_plan_legal(p, plan_gemm(p))) << plan_gemm(p).to_string();
        // The ping-pong and segment-pair plans are offered wherever their kernels run.
        bool has_pp = false, has_pairs = false, has_stash = false;
        for (const GemmPlan& q : v) {
          has_pp |= q.ping_pong;
          has_pairs |= q.fold == GemmFold::kPairs;
          has_stash |= q.fold == GemmFold::kStash;
          if (!tma) {
            EXPECT_TRUE(q.mainloop == K::kMmaSync || q.mainloop == K::kSmallMRing);
          }
        }
        EXPECT_EQ(has_pp, tma);
        EXPECT_EQ(has_pairs, tma && S >= 4);
        EXPECT_EQ(has_stash, tma && S > 1);
      }
    }
  }
  // 20 ring + 21 TMA-ring + 3 wgmma small-M tiles are compiled: the 44 dispatch can choose.
  EXPECT_EQ(gemm_small_m_tiles(K::kSmallMRing).size(), 20u);
  EXPECT_EQ(gemm_small_m_tiles(K::kSmallMTma).size(), 21u);
  EXPECT_EQ(gemm_small_m_tiles(K::kSmallMWgmma).size(), 3u);
}

TEST(GemmPlan, Printable) {
  EXPECT_EQ(GemmTile({64, 128, 64, 4}).to_string(), "64x128x64 s4");
  EXPECT_EQ(plan_gemm(problem(16384, 6144, 4096, 1)).to_string(),
            "wgmma + TMA, tile 64x256x64 s5, 2 consumer warpgroups on alternate tiles "
            "(ping-pong), one segment");
  EXPECT_EQ(plan_gemm(problem(1, 4096, 4096, 4)).to_string(),
            "small-M warp-specialized TMA ring (mma.sync), tile 8x32x256 s9 warps 1x2 chains 1x1 "
            "(+1 producer warp), segments folded in registers (3 levels)");
}

}  // namespace
}  // namespace lockstep::cuda
