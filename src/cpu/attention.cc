// The CPU attention ops (docs/contract.md §A): argument checks and the mapping of each
// mode (packed prefill, paged decode / chunked prefill, split-KV, chunk states + merge, cascade)
// onto the one canonical engine (attention_engine.cc), which computes every (row, head) in the
// order fixed by absolute key positions: bits never depend on the mode, tiling, splits or threads.
#include "lockstep/ops/attention.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "contract/checks.h"
#include "core/thread_pool.h"
#include "cpu/attention_engine.h"

namespace lockstep {

namespace cpu {
namespace {

using namespace attn_detail;
using namespace contract;

void set_outputs(Ctx& cx, const TensorView& out, const TensorView& lse) {
  cx.out = out.ptr<bf16>();
  cx.o_s0 = out.stride[0];
  cx.o_s1 = out.stride[1];
  if (lse.ndim != 0 && lse.numel() > 0) {
    cx.lse = lse.ptr<float>();
    cx.l_s0 = lse.stride[0];
    cx.l_s1 = lse.stride[1];
  }
}

void set_queries(Ctx& cx, const QShape& s, const TensorView& q, int64_t Hkv,
                 const AttentionConfig& cfg) {
  cx.Hq = s.Hq;
  cx.Hkv = Hkv;
  cx.G = s.Hq / Hkv;
  cx.D = s.D;
  cx.K = cfg.kv_chunk;
  cx.scale = cfg.scale_log2(s.D);
  cx.q = q.ptr<bf16>();
  cx.q_s0 = q.stride[0];
  cx.q_s1 = q.stride[1];
}

// The paged caches of one call and the block tables of its meta (host views).
struct PagedSrc {
  const TensorView& k_cache;
  const TensorView& v_cache;
  const PagedTables& t;
};

KvSource paged_source(const PagedSrc& kv, const Paged& p, int64_t s, bool prefix) {
  KvSource src;
  src.k = kv.k_cache.ptr<const bf16>();
  src.v = kv.v_cache.ptr<const bf16>();
  src.k_s0 = kv.k_cache.stride[0];
  src.k_s1 = kv.k_cache.stride[1];
  src.k_sh = kv.k_cache.stride[2];
  src.v_s0 = kv.v_cache.stride[0];
  src.v_s1 = kv.v_cache.stride[1];
  src.v_sh = kv.v_cache.stride[2];
  src.page_size = p.P;
  if (s >= 0) src.own = kv.t.block_table.ptr<const int32_t>() + s * kv.t.block_table.stride[0];
  const int64_t g = s >= 0 ? p.group[size_t(s)] : -1;
  if (prefix && g >= 0) {
    src.shared =
        kv.t.prefix_block_table.ptr<const int32_t>() + g * kv.t.prefix_block_table.stride[0];
    src.shared_len = p.shared_len[size_t(g)];
  }
  return src;
}

// Tiles of consecutive rows of one sequence (at most kTileRows), over chunks [c_lo, c_hi).
std::vector<Tile> paged_tiles(const Ctx& cx, const PagedSrc& kv, const Paged& p, bool prefix,
                              int64_t c_lo, int64_t c_hi) {
  std::vector<Tile> tiles;
  const int64_t N = p.qs.N;
  for (int64_t r = 0; r < N;) {
    int64_t e = r + 1;
    while (e < N && e - r < kTileRows && p.seq[size_t(e)] == p.seq[size_t(r)]) ++e;
    Tile t;
    t.rbeg = r;
    t.rend = e;
    t.src = paged_source(kv, p, p.seq[size_t(r)], prefix);
    t.c_lo = c_lo;
    t.c_hi = c_hi;
    t.cost = tile_cost(cx, t);
    tiles.push_back(t);
    r = e;
  }
  return tiles;
}

// Split-KV over tiles: each tile's chunks [0, Ct) cut into `splits` ranges, chunk states to a
// workspace, then the left-to-right merge.
void run_split(Ctx& cx, const std::vector<Tile>& base, int64_t N, int64_t splits) {
  int64_t cmax = 1;
  for (int64_t r = 0; r < N; ++r) cmax = std::max(cmax, cx.chunks(r));
  Tensor m(DType::kF32, {N, cx.Hq, cmax}), l(DType::kF32, {N, cx.Hq, cmax}),
      acc(DType::kF32, {N, cx.Hq, cmax, cx.D});
  AttentionChunkStates st{m.view(), l.view(), acc.view()};
  std::vector<Tile> tiles;
  for (const Tile& b : base) {
    int64_t ct = 0;
    for (int64_t i = b.rbeg; i < b.rend; ++i) ct = std::max(ct, cx.chunks(cx.order[i]));
    for (int64_t s = 0; s < splits; ++s) {
      Tile t = b;
      t.c_lo = ct * s / splits;
      t.c_hi = ct * (s + 1) / splits;
      if (t.c_hi <= t.c_lo) continue;
      t.cost = tile_cost(cx, t);
      tiles.push_back(t);
    }
  }
  Ctx c2 = cx;
  c2.finish = Finish::kStoreChunks;
  c2.states = strided(st, 0);
  run_tiles(c2, tiles);
  merge_states_rows(cx, c2.states, N);
}

std::vector<int64_t> iota_rows(int64_t N) {
  std::vector<int64_t> o(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) o[size_t(i)] = i;
  return o;
}

void paged_common(const char* op, const TensorView& q, const PagedMeta& meta,
                  const TensorView& k_cache, const TensorView& v_cache, const AttentionConfig& cfg,
                  int64_t num_splits, const TensorView& out, const TensorView& lse) {
  const Paged p =
      check_paged_call(op, Device::kCPU, q, meta, k_cache, v_cache, cfg, false, out, lse);
  const PagedSrc kv{k_cache, v_cache, meta.device_copies()};
  const int64_t N = p.qs.N;
  if (N == 0) return;
  Ctx cx;
  set_queries(cx, p.qs, q, p.Hkv, cfg);
  set_outputs(cx, out, lse);
  cx.pos = p.pos.data();
  const std::vector<int64_t> order = iota_rows(N);
  cx.order = order.data();
  std::vector<Tile> tiles = paged_tiles(cx, kv, p, false, 0, std::numeric_limits<int64_t>::max());
  if (num_splits == 0) {
    // Automatic: split only when (tiles x kv heads) cannot keep the threads busy. Bits are the
    // same for every split count (tested), so this may look at the batch.
    const int64_t tasks = int64_t(tiles.size()) * p.Hkv, threads = num_threads();
    int64_t cmax = 1;
    for (int64_t r = 0; r < N; ++r) cmax = std::max(cmax, cx.chunks(r));
    const double ws_bytes = double(N) * double(p.qs.Hq) * double(cmax) * double(p.qs.D + 2) * 4;
    num_splits = 1;
    if (threads > 1 && tasks < 2 * threads && cmax > 1 && ws_bytes < 256.0 * (1 << 20)) {
      num_splits = std::min(cmax, (2 * threads + tasks - 1) / tasks);
    }
  }
  if (num_splits <= 1) {
    cx.finish = Finish::kFinalize;
    run_tiles(cx, tiles);
  } else {
    run_split(cx, tiles, N, num_splits);
  }
}

// Packed rows in segments cu (checked): segment b at positions 0 .. len-1, or, when prompt_of[b] >=
// 0 (shared-prompt completions; prompt_of empty: none), at positions Lp .. Lp+len-1 reading the
// keys below Lp from its prompt's rows. Tiles of at most kTileRows rows of one segment.
void prefill_rows(const QShape& qs, const TensorView& q, const TensorView& k, const TensorView& v,
                  std::span<const int64_t> cu, std::span<const int64_t> prompt_of,
                  const AttentionConfig& cfg, const TensorView& out, const TensorView& lse) {
  const int64_t T = qs.N, Hkv = k.shape[1], B = int64_t(cu.size()) - 1;
  if (T == 0) return;
  Ctx cx;
  set_queries(cx, qs, q, Hkv, cfg);
  set_outputs(cx, out, lse);
  std::vector<int64_t> pos(static_cast<size_t>(T));
  const std::vector<int64_t> order = iota_rows(T);
  cx.pos = pos.data();
  cx.order = order.data();
  std::vector<Tile> tiles;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t t0 = cu[size_t(b)], t1 = cu[size_t(b + 1)];
    const int64_t p = prompt_of.empty() ? -1 : prompt_of[size_t(b)];
    const int64_t lp = p < 0 ? 0 : cu[size_t(p + 1)] - cu[size_t(p)];
    for (int64_t t = t0; t < t1; ++t) pos[size_t(t)] = lp + t - t0;
    KvSource src;
    src.k = k.ptr<const bf16>();
    src.v = v.ptr<const bf16>();
    src.k_s0 = k.stride[0];
    src.k_sh = k.stride[1];
    src.v_s0 = v.stride[0];
    src.v_sh = v.stride[1];
    src.base = t0 - lp;  // position j >= lp is row t0 + (j - lp)
    if (p >= 0) {
      src.shared_base = cu[size_t(p)];
      src.shared_len = lp;
    }
    for (int64_t r = t0; r < t1; r += kTileRows) {
      Tile t;
      t.rbeg = r;
      t.rend = std::min(t1, r + kTileRows);
      t.src = src;
      tiles.push_back(t);
    }
  }
  for (Tile& t : tiles) t.cost = tile_cost(cx, t);
  cx.finish = Finish::kFinalize;
  run_tiles(cx, tiles);
}

}  // namespace

// ---------------------------------------------------------------------------------------------

void attention_prefill_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& cu_seqlens, const AttentionConfig& cfg,
                              const TensorView& out, const TensorView& lse) {
  const PackedSeqs seqs = check_prefill_varlen("attention_prefill_varlen", Device::kCPU, q, k, v,
                                               cu_seqlens, cfg, out, lse);
  attention_prefill_varlen(q, k, v, seqs, cfg, out, lse);
}

void attention_prefill_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                              const PackedSeqs& seqs, const AttentionConfig& cfg,
                              const TensorView& out, const TensorView& lse) {
  const QShape qs =
      check_prefill_call("attention_prefill_varlen", Device::kCPU, q, k, v, seqs, cfg, out, lse);
  prefill_rows(qs, q, k, v, seqs.cu(), {}, cfg, out, lse);
}

void attention_prefill_shared(const TensorView& q, const TensorView& k, const TensorView& v,
                              const SharedPromptSeqs& segs, const AttentionConfig& cfg,
                              const TensorView& out, const TensorView& lse) {
  const QShape qs = check_prefill_call("attention_prefill_shared", Device::kCPU, q, k, v,
                                       segs.segments(), cfg, out, lse);
  prefill_rows(qs, q, k, v, segs.cu(), segs.prompt_of(), cfg, out, lse);
}

void attention_paged(const TensorView& q, const PagedMeta& meta, const TensorView& k_cache,
                     const TensorView& v_cache, const AttentionConfig& cfg, const TensorView& out,
                     const TensorView& lse) {
  paged_common("attention_paged", q, meta, k_cache, v_cache, cfg, 0, out, lse);
}

void attention_paged(const TensorView& q, const TensorView& q_seq, const TensorView& q_pos,
                     const PagedKv& kv, const AttentionConfig& cfg, const TensorView& out,
                     const TensorView& lse) {
  const char* op = "attention_paged";
  const PagedMeta meta =
      check_paged(op, Device::kCPU, q, q_seq, q_pos, kv, nullptr, cfg, 0, kAllChunks);
  paged_common(op, q, meta, kv.k_cache, kv.v_cache, cfg, 0, out, lse);
}

void attention_paged_split_kv(const TensorView& q, const PagedMeta& meta, const TensorView& k_cache,
                              const TensorView& v_cache, const AttentionConfig& cfg, int num_splits,
                              const TensorView& out, const TensorView& lse) {
  const char* op = "attention_paged_split_kv";
  LS_CHECK(num_splits >= 1, op, "num_splits must be >= 1, got ", num_splits);
  paged_common(op, q, meta, k_cache, v_cache, cfg, num_splits, out, lse);
}

void attention_paged_split_kv(const TensorView& q, const TensorView& q_seq, const TensorView& q_pos,
                              const PagedKv& kv, const AttentionConfig& cfg, int num_splits,
                              const TensorView& out, const TensorView& lse) {
  const char* op = "attention_paged_split_kv";
  LS_CHECK(num_splits >= 1, op, "num_splits must be >= 1, got ", num_splits);
  const PagedMeta meta =
      check_paged(op, Device::kCPU, q, q_seq, q_pos, kv, nullptr, cfg, 0, kAllChunks);
  paged_common(op, q, meta, kv.k_cache, kv.v_cache, cfg, num_splits, out, lse);
}

void attention_paged_cascade(const TensorView& q, const TensorView& q_seq, const TensorView& q_pos,
                             const PagedKv& kv, const SharedPrefix& prefix,
                             const AttentionConfig& cfg, const TensorView& out,
                             const TensorView& lse) {
  const char* op = "attention_paged_cascade";
  const PagedMeta meta =
      check_paged(op, Device::kCPU, q, q_seq, q_pos, kv, &prefix, cfg, 0, kAllChunks);
  attention_paged_cascade(q, meta, kv.k_cache, kv.v_cache, cfg, out, lse);
}

void attention_paged_cascade(const TensorView& q, const PagedMeta& meta, const TensorView& k_cache,
                             const TensorView& v_cache, const AttentionConfig& cfg,
                             const TensorView& out, const TensorView& lse) {
  const char* op = "attention_paged_cascade";
  const Paged p =
      check_paged_call(op, Device::kCPU, q, meta, k_cache, v_cache, cfg, true, out, lse);
  const PagedSrc kv{k_cache, v_cache, meta.device_copies()};
  const TensorView& prefix_table = meta.device_copies().prefix_block_table;
  const int64_t N = p.qs.N, K = cfg.kv_chunk;
  if (N == 0) return;
  Ctx cx;
  set_queries(cx, p.qs, q, p.Hkv, cfg);
  set_outputs(cx, out, lse);
  cx.pos = p.pos.data();

  // Phase 1: per group, the prefix chunks (wholly below shared_len) of all its rows, one K/V
  // block gather per tile of rows, folded into a prefix state per (row, head).
  std::vector<uint8_t> has_prefix(size_t(N), 0);
  std::vector<int64_t> order1;
  std::vector<Tile> tiles1;
  const int64_t GR = int64_t(p.shared_len.size());
  std::vector<std::vector<int64_t>> rows_of(static_cast<size_t>(GR));
  for (int64_t r = 0; r < N; ++r) {
    const int64_t g = p.group[size_t(p.seq[size_t(r)])];
    if (g >= 0 && p.shared_len[size_t(g)] / K > 0) {
      rows_of[size_t(g)].push_back(r);
      has_prefix[size_t(r)] = 1;
    }
  }
  for (const auto& rows : rows_of) order1.insert(order1.end(), rows.begin(), rows.end());
  std::vector<float> prefix_ws;
  if (!order1.empty()) {
    prefix_ws.resize(size_t(N * p.qs.Hq * state_size(p.qs.D)));
    int64_t at = 0;
    for (int64_t g = 0; g < GR; ++g) {
      const int64_t n = int64_t(rows_of[size_t(g)].size());
      for (int64_t r0 = 0; r0 < n; r0 += kTileRows) {
        Tile t;
        t.rbeg = at + r0;
        t.rend = at + std::min(n, r0 + kTileRows);
        t.src = paged_source(kv, p, -1, false);
        t.src.own = prefix_table.ptr<const int32_t>() + g * prefix_table.stride[0];
        t.c_lo = 0;
        t.c_hi = p.shared_len[size_t(g)] / K;
        tiles1.push_back(t);
      }
      at += n;
    }
    Ctx c1 = cx;
    c1.order = order1.data();
    c1.finish = Finish::kStorePrefix;
    c1.prefix = prefix_ws.data();
    for (Tile& t : tiles1) t.cost = tile_cost(c1, t);
    run_tiles(c1, tiles1);
  }

  // Phase 2: every row continues from its prefix state with the remaining chunks, read through
  // its own view (shared pages below shared_len, own pages from there on).
  const std::vector<int64_t> order2 = iota_rows(N);
  cx.order = order2.data();
  cx.finish = Finish::kFinalize;
  cx.prefix = prefix_ws.empty() ? nullptr : prefix_ws.data();
  cx.has_prefix = has_prefix.data();
  std::vector<Tile> tiles2 = paged_tiles(cx, kv, p, true, 0, std::numeric_limits<int64_t>::max());
  for (Tile& t : tiles2) {
    const int64_t g = p.group[size_t(p.seq[size_t(t.rbeg)])];
    t.c_lo = g >= 0 ? p.shared_len[size_t(g)] / K : 0;
    t.cost = tile_cost(cx, t);
  }
  run_tiles(cx, tiles2);
}

void attention_paged_chunk_states(const TensorView& q, const TensorView& q_seq,
                                  const TensorView& q_pos, const PagedKv& kv,
                                  const AttentionConfig& cfg, int64_t chunk_begin,
                                  const AttentionChunkStates& states) {
  const char* op = "attention_paged_chunk_states";
  LS_CHECK(chunk_begin >= 0, op, "chunk_begin must be >= 0, got ", chunk_begin);
  LS_CHECK(states.m.ndim == 3, op, "argument 'states.m' expected shape [N, Hq, C], got ",
           states.m.shape_string());
  const int64_t C = states.m.shape[2];
  const PagedMeta meta = check_paged(op, Device::kCPU, q, q_seq, q_pos, kv, nullptr, cfg,
                                     chunk_begin, chunk_begin + C);
  const Paged p = paged_problem(q, kv.k_cache, meta);
  const PagedSrc src{kv.k_cache, kv.v_cache, meta.device_copies()};
  const int64_t N = p.qs.N;
  check_chunk_states(op, Device::kCPU, p, C, states);
  if (N == 0 || C == 0) return;
  Ctx cx;
  set_queries(cx, p.qs, q, p.Hkv, cfg);
  cx.pos = p.pos.data();
  const std::vector<int64_t> order = iota_rows(N);
  cx.order = order.data();
  cx.finish = Finish::kStoreChunks;
  cx.states = strided(states, chunk_begin);
  std::vector<Tile> tiles = paged_tiles(cx, src, p, false, chunk_begin, chunk_begin + C);
  run_tiles(cx, tiles);
}

void attention_merge_chunk_states(const AttentionChunkStates& states, const TensorView& q_pos,
                                  const AttentionConfig& cfg, const TensorView& out,
                                  const TensorView& lse) {
  const char* op = "attention_merge_chunk_states";
  const MergeShape ms = check_merge_states(op, Device::kCPU, states, q_pos, cfg, out, lse);
  const int64_t N = ms.qs.N, Hq = ms.qs.Hq, D = ms.qs.D;
  const std::vector<int64_t>& pos = ms.pos;
  if (N == 0 || Hq == 0) return;
  Ctx cx;
  cx.Hq = Hq;
  cx.D = D;
  cx.K = cfg.kv_chunk;
  cx.pos = pos.data();
  set_outputs(cx, out, lse);
  merge_states_rows(cx, strided(states, 0), N);
}

void kv_cache_write(const TensorView& k, const TensorView& v, const TensorView& slot_mapping,
                    const TensorView& k_cache, const TensorView& v_cache) {
  const char* op = "kv_cache_write";
  const KvWrite w = check_kv_write(op, Device::kCPU, k, v, slot_mapping, k_cache, v_cache);
  const int64_t T = w.T, Hkv = w.Hkv, D = w.D, P = w.P;
  const std::vector<int64_t>& slot = w.slots;
  if (T == 0) return;
  bf16* kc = k_cache.ptr<bf16>();
  bf16* vc = v_cache.ptr<bf16>();
  parallel_for(T, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t s = slot[size_t(t)];
      if (s < 0) continue;
      const int64_t page = s / P, off = s % P;
      for (int64_t h = 0; h < Hkv; ++h) {
        std::memcpy(kc + page * k_cache.stride[0] + off * k_cache.stride[1] + h * k_cache.stride[2],
                    k.ptr<const bf16>() + t * k.stride[0] + h * k.stride[1],
                    size_t(D) * sizeof(bf16));
        std::memcpy(vc + page * v_cache.stride[0] + off * v_cache.stride[1] + h * v_cache.stride[2],
                    v.ptr<const bf16>() + t * v.stride[0] + h * v.stride[1],
                    size_t(D) * sizeof(bf16));
      }
    }
  });
}

}  // namespace cpu
}  // namespace lockstep