// The canonical attention engine behind every CPU attention op (docs/contract.md §A A.4):
// for each (query row, head), keys in 64-key blocks by absolute position folded inside
// kv_chunk-key chunks, chunk states merged left to right. The ops (attention.cc) check their
// arguments and describe the work as tiles; how rows are tiled never changes a row's bits.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/mma_batch.h"
#include "lockstep/dtype.h"
#include "lockstep/ops/attention.h"

namespace lockstep::cpu::attn_detail {

constexpr int64_t kTileRows = 16;  // query rows of one sequence sharing a K/V block gather

// §A.4 step 1, the scores of one query row against n key rows (row j at k + j·ldk):
// x_j = mma_chain(q, k_j, D, +0) ⊗ sigma, sigma = AttentionConfig::scale_log2(D). The forward's
// block step and the backward (§B.9, which recomputes the forward's score bits) both call this.
inline void block_scores(const bf16* q, const bf16* k, int64_t ldk, int64_t n, int64_t D,
                         float sigma, float* x) {
  mma_chain_rows_bf16(q, k, ldk, n, D, nullptr, x);
  for (int64_t j = 0; j < n; ++j) x[j] = x[j] * sigma;
}

// A chunk state is [m, l, acc[0..D)] in fp32.
inline int64_t state_size(int64_t D) { return D + 2; }

// Where the K/V rows of one sequence live. Contiguous (packed prefill): position j is token
// base + j, or shared_base + j for j < shared_len (a shared-prompt completion: its prompt's rows
// below shared_len, its own from there on). Paged: page table[j / P], slot j % P, where
// table = shared for j < shared_len (prefix sharing) and own otherwise.
struct KvSource {
  const bf16* k = nullptr;
  const bf16* v = nullptr;
  int64_t k_s0 = 0, k_s1 = 0, k_sh = 0;  // contiguous: s0 = token; paged: s0 = page, s1 = slot
  int64_t v_s0 = 0, v_s1 = 0, v_sh = 0;  // sh = kv head
  int64_t page_size = 0;                 // 0 = contiguous
  int64_t base = 0, shared_base = 0;
  const int32_t* own = nullptr;
  const int32_t* shared = nullptr;
  int64_t shared_len = 0;

  void offsets(int64_t j, int64_t* ko, int64_t* vo) const {
    if (page_size == 0) {
      const int64_t row = (j < shared_len ? shared_base : base) + j;
      *ko = row * k_s0;
      *vo = row * v_s0;
      return;
    }
    const int32_t* table = j < shared_len ? shared : own;
    const int64_t page = table[j / page_size], slot = j % page_size;
    *ko = page * k_s0 + slot * k_s1;
    *vo = page * v_s0 + slot * v_s1;
  }
};

// One run of the engine: which rows, what to compute, where results go.
enum class Finish {
  kFinalize,     // fold all chunks [0, C_r) (from empty or from a prefix state), write out/lse
  kStoreChunks,  // write every chunk state of [c_lo, c_hi) to `states`
  kStorePrefix,  // fold chunks [0, c_hi) and write the running state to the prefix workspace
};

struct StridedStates {  // AttentionChunkStates as raw pointers; chunk index relative to c0
  float* m = nullptr;
  float* l = nullptr;
  float* acc = nullptr;
  int64_t ms[3] = {}, ls[3] = {}, as[3] = {};
  int64_t c0 = 0;

  float* mp(int64_t r, int64_t h, int64_t c) const {
    return m + r * ms[0] + h * ms[1] + (c - c0) * ms[2];
  }
  float* lp(int64_t r, int64_t h, int64_t c) const {
    return l + r * ls[0] + h * ls[1] + (c - c0) * ls[2];
  }
  float* ap(int64_t r, int64_t h, int64_t c) const {
    return acc + r * as[0] + h * as[1] + (c - c0) * as[2];
  }
};

// View of public chunk states, chunk index relative to c0.
StridedStates strided(const AttentionChunkStates& s, int64_t c0);

// Everything a run needs besides the tiles: sizes, the scale constant, queries, positions,
// outputs, and the finish mode with its destination.
struct Ctx {
  int64_t Hq = 0, Hkv = 0, G = 0, D = 0, K = 0;  // K = kv_chunk
  float scale = 0;
  const bf16* q = nullptr;
  int64_t q_s0 = 0, q_s1 = 0;
  const int64_t* pos = nullptr;  // [N] absolute position of each row
  bf16* out = nullptr;
  int64_t o_s0 = 0, o_s1 = 0;
  float* lse = nullptr;
  int64_t l_s0 = 0, l_s1 = 0;
  const int64_t* order = nullptr;  // row indices; a tile is a range of it
  Finish finish = Finish::kFinalize;
  StridedStates states;     // kStoreChunks
  float* prefix = nullptr;  // [N, Hq, D+2]: kStorePrefix writes, kFinalize may start from
  const uint8_t* has_prefix = nullptr;  // [N]: row r starts from prefix state (kFinalize)

  const bf16* qrow(int64_t r, int64_t h) const { return q + r * q_s0 + h * q_s1; }
  int64_t chunks(int64_t r) const { return pos[r] / K + 1; }
};

// Rows (of one KV source) computed together over chunks [c_lo, c_hi): one K/V block gather
// serves every row and every query head of a kv head.
struct Tile {
  int64_t rbeg = 0, rend = 0;  // range of Ctx::order
  KvSource src;
  int64_t c_lo = 0, c_hi = std::numeric_limits<int64_t>::max();  // rows clip c_hi to C_r
  int64_t cost = 0;
};

// Runs every (tile, kv head) task once on the thread pool (longest first); each task owns its
// outputs and computes them in the canonical order, so the thread assignment does not matter.
void run_tiles(const Ctx& cx, std::vector<Tile>& tiles);

// Work estimate of a tile (blocks x heads), for scheduling only.
int64_t tile_cost(const Ctx& cx, const Tile& t);

// Folds the chunk states 0 .. C_r-1 of every (row, head) of rows 0 .. N-1 and writes out/lse.
void merge_states_rows(const Ctx& cx, const StridedStates& st, int64_t N);

}  // namespace lockstep::cpu::attn_detail
