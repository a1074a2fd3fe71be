// The CPU attention ops (docs/contract.md §A): argument checks and the mapping of each
// mode (packed prefill, paged decode / chunked prefill, split-KV, chunk states + merge, cascade)
// onto the one canonical engine (attention_engine.cc), which computes every (row, head) in the
// order fixed by absolute key positions: bits never depend on the mode, tiling, splits or threads.
#include "lockstep/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "core/thread_pool.h"
#include "cpu/attention_engine.h"
#include "cpu/checks.h"

namespace lockstep {

double AttentionConfig::resolved_scale(int64_t head_dim) const {
  return softmax_scale != 0.0 ? softmax_scale : 1.0 / std::sqrt(double(head_dim));
}

float AttentionConfig::scale_log2(int64_t head_dim) const {
  constexpr double kLog2e = 1.4426950408889634074;  // log2(e), the nearest double
  return float(resolved_scale(head_dim) * kLog2e);
}

void AttentionConfig::validate() const {
  LS_CHECK(kv_chunk >= kAttnBlock && kv_chunk % kAttnBlock == 0, "AttentionConfig",
           "kv_chunk must be a positive multiple of ", kAttnBlock, ", got ", kv_chunk);
  LS_CHECK(std::isfinite(softmax_scale) && softmax_scale >= 0.0, "AttentionConfig",
           "softmax_scale must be finite and > 0 (or 0 for 1/sqrt(head_dim)), got ", softmax_scale);
}

std::string AttentionConfig::to_string() const {
  char buf[160];
  if (softmax_scale == 0.0) {
    std::snprintf(buf, sizeof buf, "attention: kv_chunk=%d block=%d softmax_scale=1/sqrt(head_dim)",
                  kv_chunk, kAttnBlock);
  } else {
    std::snprintf(buf, sizeof buf, "attention: kv_chunk=%d block=%d softmax_scale=%.17g (%a)",
                  kv_chunk, kAttnBlock, softmax_scale, softmax_scale);
  }
  return buf;
}

namespace cpu {
namespace {

int32_t read_i32(const TensorView& t, int64_t i) { return t.ptr<const int32_t>()[i * t.stride[0]]; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Argument checks (shared with the engine's baseline backend).

namespace check_detail {
namespace {

QShape check_q(const char* op, const TensorView& q) {
  LS_CHECK(q.ndim == 3, op, "argument 'q' expected shape [N, Hq, D], got ", q.shape_string());
  check_tensor(op, "q", q, DType::kBF16, {-1, -1, -1});
  check_inner_contiguous(op, "q", q);
  const int64_t D = q.shape[2];
  LS_CHECK(D >= kAttnMmaK && D <= kAttnMaxHeadDim && D % kAttnMmaK == 0, op,
           "argument 'q' head_dim must be a multiple of ", kAttnMmaK, " in [", kAttnMmaK, ", ",
           kAttnMaxHeadDim, "], got ", D);
  LS_CHECK(q.shape[1] >= 1, op, "argument 'q' expected at least one head, got ", q.shape_string());
  return {q.shape[0], q.shape[1], D};
}

void check_heads(const char* op, int64_t Hq, int64_t Hkv) {
  LS_CHECK(Hkv >= 1 && Hq % Hkv == 0, op, "query heads Hq=", Hq,
           " must be a multiple of kv heads Hkv=", Hkv);
}

void check_cache(const char* op, const char* arg, const TensorView& c, int64_t D) {
  LS_CHECK(c.ndim == 4, op, "argument '", arg, "' expected shape [NP, P, Hkv, D], got ",
           c.shape_string());
  check_tensor(op, arg, c, DType::kBF16, {-1, -1, -1, D});
  check_inner_contiguous(op, arg, c);
}

}  // namespace

void check_attn_outputs(const char* op, const QShape& s, const TensorView& out,
                        const TensorView& lse) {
  check_tensor(op, "out", out, DType::kBF16, {s.N, s.Hq, s.D});
  check_inner_contiguous(op, "out", out);
  if (lse.ndim != 0 || lse.data != nullptr) check_tensor(op, "lse", lse, DType::kF32, {s.N, s.Hq});
}

Paged check_paged(const char* op, const TensorView& q, const TensorView& q_seq,
                  const TensorView& q_pos, const PagedKv& kv, const SharedPrefix* prefix,
                  const AttentionConfig& cfg, int64_t c_lo, int64_t c_hi) {
  cfg.validate();
  Paged p;
  p.qs = check_q(op, q);
  const int64_t N = p.qs.N, D = p.qs.D;
  check_cache(op, "kv.k_cache", kv.k_cache, D);
  check_cache(op, "kv.v_cache", kv.v_cache, D);
  check_tensor(op, "kv.v_cache", kv.v_cache, DType::kBF16,
               {kv.k_cache.shape[0], kv.k_cache.shape[1], kv.k_cache.shape[2], D});
  p.NP = kv.k_cache.shape[0];
  p.P = kv.k_cache.shape[1];
  p.Hkv = kv.k_cache.shape[2];
  LS_CHECK(p.P >= 1, op, "argument 'kv.k_cache' page size must be >= 1, got ",
           kv.k_cache.shape_string());
  check_heads(op, p.qs.Hq, p.Hkv);
  LS_CHECK(kv.block_table.ndim == 2, op, "argument 'kv.block_table' expected shape [S, MP], got ",
           kv.block_table.shape_string());
  check_tensor(op, "kv.block_table", kv.block_table, DType::kI32, {-1, -1});
  check_inner_contiguous(op, "kv.block_table", kv.block_table);
  p.S = kv.block_table.shape[0];
  p.MP = kv.block_table.shape[1];
  check_tensor(op, "kv.seq_lens", kv.seq_lens, DType::kI32, {p.S});
  check_tensor(op, "q_seq", q_seq, DType::kI32, {N});
  check_tensor(op, "q_pos", q_pos, DType::kI32, {N});

  // Prefix tables.
  const int32_t* ptab = nullptr;
  int64_t GR = 0, MPs = 0, ptab_s0 = 0;
  p.group.assign(size_t(p.S), -1);
  if (prefix != nullptr) {
    LS_CHECK(prefix->block_table.ndim == 2, op,
             "argument 'prefix.block_table' expected shape [GR, MPs], got ",
             prefix->block_table.shape_string());
    check_tensor(op, "prefix.block_table", prefix->block_table, DType::kI32, {-1, -1});
    check_inner_contiguous(op, "prefix.block_table", prefix->block_table);
    GR = prefix->block_table.shape[0];
    MPs = prefix->block_table.shape[1];
    ptab = prefix->block_table.ptr<const int32_t>();
    ptab_s0 = prefix->block_table.stride[0];
    check_tensor(op, "prefix.shared_len", prefix->shared_len, DType::kI32, {GR});
    check_tensor(op, "prefix.seq_group", prefix->seq_group, DType::kI32, {p.S});
    p.shared_len.resize(size_t(GR));
    for (int64_t g = 0; g < GR; ++g) {
      const int64_t len = read_i32(prefix->shared_len, g);
      LS_CHECK(len >= 0 && len <= MPs * p.P, op, "prefix.shared_len[", g, "] = ", len,
               " outside [0, MPs * P = ", MPs * p.P, "] (prefix block table too short)");
      p.shared_len[size_t(g)] = len;
    }
    for (int64_t s = 0; s < p.S; ++s) {
      const int64_t g = read_i32(prefix->seq_group, s);
      LS_CHECK(g >= -1 && g < GR, op, "prefix.seq_group[", s, "] = ", g, " outside [-1, ", GR, ")");
      p.group[size_t(s)] = g;
    }
  }

  const int32_t* bt = kv.block_table.ptr<const int32_t>();
  const int64_t bt_s0 = kv.block_table.stride[0];
  p.pos.resize(size_t(N));
  p.seq.resize(size_t(N));
  // Furthest position read per sequence (-1: not referenced).
  std::vector<int64_t> reach(size_t(p.S), -1);
  for (int64_t r = 0; r < N; ++r) {
    const int64_t s = read_i32(q_seq, r);
    LS_CHECK(s >= 0 && s < p.S, op, "q_seq[", r, "] = ", s, " outside [0, S = ", p.S, ")");
    const int64_t len = read_i32(kv.seq_lens, s);
    LS_CHECK(len >= 1, op, "kv.seq_lens[", s, "] = ", len,
             ": context length must be >= 1 for a sequence with queries (row ", r, ")");
    LS_CHECK(len <= p.MP * p.P, op, "kv.seq_lens[", s, "] = ", len,
             " needs more pages than kv.block_table has (MP = ", p.MP, ", P = ", p.P, ")");
    const int64_t pos = read_i32(q_pos, r);
    LS_CHECK(pos >= 0 && pos < len, op, "q_pos[", r, "] = ", pos, " outside [0, seq_len = ", len,
             ") of sequence ", s);
    const int64_t g = p.group[size_t(s)];
    if (g >= 0) {
      LS_CHECK(len >= p.shared_len[size_t(g)], op, "kv.seq_lens[", s, "] = ", len,
               " is shorter than the shared prefix of its group ", g, " (", p.shared_len[size_t(g)],
               ")");
    }
    p.pos[size_t(r)] = pos;
    p.seq[size_t(r)] = s;
    if (reach[size_t(s)] < 0) ++p.num_seqs;
    reach[size_t(s)] = std::max(reach[size_t(s)], pos);
  }
  // Page indices of every position that will be read: [c_lo * K, min(c_hi * K, reach + 1)).
  const int64_t K = cfg.kv_chunk;
  auto check_pages = [&](const int32_t* row, const char* what, int64_t which, int64_t j_lo,
                         int64_t j_hi) {
    if (j_hi <= j_lo) return;
    for (int64_t i = j_lo / p.P; i <= (j_hi - 1) / p.P; ++i) {
      const int64_t page = row[i];
      LS_CHECK(page >= 0 && page < p.NP, op, what, "[", which, "][", i, "] = ", page,
               " is not a page of the cache (NP = ", p.NP, ")");
    }
  };
  const int64_t j_lo = c_lo * K;
  for (int64_t s = 0; s < p.S; ++s) {
    if (reach[size_t(s)] < 0) continue;
    const int64_t j_hi = c_hi >= std::numeric_limits<int64_t>::max() / K
                             ? reach[size_t(s)] + 1
                             : std::min(c_hi * K, reach[size_t(s)] + 1);
    const int64_t g = p.group[size_t(s)];
    const int64_t split = g >= 0 ? p.shared_len[size_t(g)] : 0;
    check_pages(bt + s * bt_s0, "kv.block_table", s, std::max(j_lo, split), j_hi);
    if (g >= 0)
      check_pages(ptab + g * ptab_s0, "prefix.block_table", g, j_lo, std::min(j_hi, split));
  }
  return p;
}

QShape check_prefill_varlen(const char* op, const TensorView& q, const TensorView& k,
                            const TensorView& v, const TensorView& cu_seqlens,
                            const AttentionConfig& cfg, const TensorView& out,
                            const TensorView& lse) {
  cfg.validate();
  const QShape qs = check_q(op, q);
  const int64_t T = qs.N, D = qs.D;
  LS_CHECK(k.ndim == 3, op, "argument 'k' expected shape [T, Hkv, D], got ", k.shape_string());
  check_tensor(op, "k", k, DType::kBF16, {T, -1, D});
  check_inner_contiguous(op, "k", k);
  const int64_t Hkv = k.shape[1];
  check_heads(op, qs.Hq, Hkv);
  check_tensor(op, "v", v, DType::kBF16, {T, Hkv, D});
  check_inner_contiguous(op, "v", v);
  LS_CHECK(cu_seqlens.ndim == 1 && cu_seqlens.shape[0] >= 1, op,
           "argument 'cu_seqlens' expected shape [B+1] with B >= 0, got ",
           cu_seqlens.shape_string());
  check_tensor(op, "cu_seqlens", cu_seqlens, DType::kI32, {-1});
  const int64_t B = cu_seqlens.shape[0] - 1;
  LS_CHECK(read_i32(cu_seqlens, 0) == 0, op, "cu_seqlens[0] must be 0, got ",
           read_i32(cu_seqlens, 0));
  for (int64_t b = 0; b < B; ++b) {
    LS_CHECK(read_i32(cu_seqlens, b + 1) >= read_i32(cu_seqlens, b), op,
             "cu_seqlens must be non-decreasing: cu_seqlens[", b + 1,
             "] = ", read_i32(cu_seqlens, b + 1), " < cu_seqlens[", b,
             "] = ", read_i32(cu_seqlens, b));
  }
  LS_CHECK(read_i32(cu_seqlens, B) == T, op, "cu_seqlens[B] must equal T = ", T, ", got ",
           read_i32(cu_seqlens, B));
  check_attn_outputs(op, qs, out, lse);
  return qs;
}

}  // namespace check_detail

namespace {

using namespace attn_detail;
using namespace check_detail;

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

KvSource paged_source(const PagedKv& kv, const Paged& p, int64_t s, const SharedPrefix* prefix) {
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
  if (s >= 0) src.own = kv.block_table.ptr<const int32_t>() + s * kv.block_table.stride[0];
  const int64_t g = s >= 0 ? p.group[size_t(s)] : -1;
  if (prefix != nullptr && g >= 0) {
    src.shared = prefix->block_table.ptr<const int32_t>() + g * prefix->block_table.stride[0];
    src.shared_len = p.shared_len[size_t(g)];
  }
  return src;
}

// Tiles of consecutive rows of one sequence (at most kTileRows), over chunks [c_lo, c_hi).
std::vector<Tile> paged_tiles(const Ctx& cx, const PagedKv& kv, const Paged& p,
                              const SharedPrefix* prefix, int64_t c_lo, int64_t c_hi) {
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

void paged_common(const char* op, const TensorView& q, const TensorView& q_seq,
                  const TensorView& q_pos, const PagedKv& kv, const AttentionConfig& cfg,
                  int64_t num_splits, const TensorView& out, const TensorView& lse) {
  Paged p = check_paged(op, q, q_seq, q_pos, kv, nullptr, cfg, 0, kAllChunks);
  check_attn_outputs(op, p.qs, out, lse);
  const int64_t N = p.qs.N;
  if (N == 0) return;
  Ctx cx;
  set_queries(cx, p.qs, q, p.Hkv, cfg);
  set_outputs(cx, out, lse);
  cx.pos = p.pos.data();
  const std::vector<int64_t> order = iota_rows(N);
  cx.order = order.data();
  std::vector<Tile> tiles = paged_tiles(cx, kv, p, nullptr, 0, std::numeric_limits<int64_t>::max());
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

}  // namespace

// ---------------------------------------------------------------------------------------------

void attention_prefill_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& cu_seqlens, const AttentionConfig& cfg,
                              const TensorView& out, const TensorView& lse) {
  const QShape qs = check_detail::check_prefill_varlen("attention_prefill_varlen", q, k, v,
                                                       cu_seqlens, cfg, out, lse);
  const int64_t T = qs.N, Hkv = k.shape[1], B = cu_seqlens.shape[0] - 1;
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
    const int64_t t0 = read_i32(cu_seqlens, b), t1 = read_i32(cu_seqlens, b + 1);
    for (int64_t t = t0; t < t1; ++t) pos[size_t(t)] = t - t0;
    KvSource src;
    src.k = k.ptr<const bf16>();
    src.v = v.ptr<const bf16>();
    src.k_s0 = k.stride[0];
    src.k_sh = k.stride[1];
    src.v_s0 = v.stride[0];
    src.v_sh = v.stride[1];
    src.base = t0;
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

void attention_paged(const TensorView& q, const TensorView& q_seq, const TensorView& q_pos,
                     const PagedKv& kv, const AttentionConfig& cfg, const TensorView& out,
                     const TensorView& lse) {
  paged_common("attention_paged", q, q_seq, q_pos, kv, cfg, 0, out, lse);
}

void attention_paged_split_kv(const TensorView& q, const TensorView& q_seq, const TensorView& q_pos,
                              const PagedKv& kv, const AttentionConfig& cfg, int num_splits,
                              const TensorView& out, const TensorView& lse) {
  const char* op = "attention_paged_split_kv";
  LS_CHECK(num_splits >= 1, op, "num_splits must be >= 1, got ", num_splits);
  paged_common(op, q, q_seq, q_pos, kv, cfg, num_splits, out, lse);
}

void attention_paged_cascade(const TensorView& q, const TensorView& q_seq, const TensorView& q_pos,
                             const PagedKv& kv, const SharedPrefix& prefix,
                             const AttentionConfig& cfg, const TensorView& out,
                             const TensorView& lse) {
  const char* op = "attention_paged_cascade";
  Paged p = check_paged(op, q, q_seq, q_pos, kv, &prefix, cfg, 0, kAllChunks);
  check_attn_outputs(op, p.qs, out, lse);
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
        t.src = paged_source(kv, p, -1, nullptr);
        t.src.own = prefix.block_table.ptr<const int32_t>() + g * prefix.block_table.stride[0];
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
  std::vector<Tile> tiles2 =
      paged_tiles(cx, kv, p, &prefix, 0, std::numeric_limits<int64_t>::max());
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
  Paged p = check_paged(op, q, q_seq, q_pos, kv, nullptr, cfg, chunk_begin, chunk_begin + C);
  const int64_t N = p.qs.N;
  check_tensor(op, "states.m", states.m, DType::kF32, {N, p.qs.Hq, C});
  check_tensor(op, "states.l", states.l, DType::kF32, {N, p.qs.Hq, C});
  check_tensor(op, "states.acc", states.acc, DType::kF32, {N, p.qs.Hq, C, p.qs.D});
  check_inner_contiguous(op, "states.acc", states.acc);
  if (N == 0 || C == 0) return;
  Ctx cx;
  set_queries(cx, p.qs, q, p.Hkv, cfg);
  cx.pos = p.pos.data();
  const std::vector<int64_t> order = iota_rows(N);
  cx.order = order.data();
  cx.finish = Finish::kStoreChunks;
  cx.states = strided(states, chunk_begin);
  std::vector<Tile> tiles = paged_tiles(cx, kv, p, nullptr, chunk_begin, chunk_begin + C);
  run_tiles(cx, tiles);
}

void attention_merge_chunk_states(const AttentionChunkStates& states, const TensorView& q_pos,
                                  const AttentionConfig& cfg, const TensorView& out,
                                  const TensorView& lse) {
  const char* op = "attention_merge_chunk_states";
  cfg.validate();
  LS_CHECK(states.acc.ndim == 4, op, "argument 'states.acc' expected shape [N, Hq, C, D], got ",
           states.acc.shape_string());
  check_tensor(op, "states.acc", states.acc, DType::kF32, {-1, -1, -1, -1});
  check_inner_contiguous(op, "states.acc", states.acc);
  const int64_t N = states.acc.shape[0], Hq = states.acc.shape[1], C = states.acc.shape[2],
                D = states.acc.shape[3];
  check_tensor(op, "states.m", states.m, DType::kF32, {N, Hq, C});
  check_tensor(op, "states.l", states.l, DType::kF32, {N, Hq, C});
  check_tensor(op, "q_pos", q_pos, DType::kI32, {N});
  const QShape qs{N, Hq, D};
  check_attn_outputs(op, qs, out, lse);
  std::vector<int64_t> pos(static_cast<size_t>(N));
  for (int64_t r = 0; r < N; ++r) {
    pos[size_t(r)] = read_i32(q_pos, r);
    LS_CHECK(pos[size_t(r)] >= 0 && pos[size_t(r)] / cfg.kv_chunk < C, op, "q_pos[", r,
             "] = ", pos[size_t(r)], " needs ", pos[size_t(r)] / cfg.kv_chunk + 1,
             " chunks, but states hold C = ", C);
  }
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
  LS_CHECK(k.ndim == 3, op, "argument 'k' expected shape [T, Hkv, D], got ", k.shape_string());
  check_tensor(op, "k", k, DType::kBF16, {-1, -1, -1});
  check_inner_contiguous(op, "k", k);
  const int64_t T = k.shape[0], Hkv = k.shape[1], D = k.shape[2];
  check_tensor(op, "v", v, DType::kBF16, {T, Hkv, D});
  check_inner_contiguous(op, "v", v);
  check_tensor_dtypes(op, "slot_mapping", slot_mapping, {DType::kI32, DType::kI64}, {T});
  check_cache(op, "k_cache", k_cache, D);
  check_tensor(op, "k_cache", k_cache, DType::kBF16, {-1, -1, Hkv, D});
  check_tensor(op, "v_cache", v_cache, DType::kBF16, {k_cache.shape[0], k_cache.shape[1], Hkv, D});
  check_inner_contiguous(op, "v_cache", v_cache);
  const int64_t NP = k_cache.shape[0], P = k_cache.shape[1], slots = NP * P;
  std::vector<int64_t> slot(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = slot_mapping.dtype == DType::kI32
                          ? int64_t(slot_mapping.ptr<const int32_t>()[t * slot_mapping.stride[0]])
                          : slot_mapping.ptr<const int64_t>()[t * slot_mapping.stride[0]];
    LS_CHECK(s == -1 || (s >= 0 && s < slots), op, "slot_mapping[", t, "] = ", s,
             " outside [0, NP * P = ", slots, ") (and not -1)");
    slot[size_t(t)] = s;
  }
  {
    std::vector<int64_t> sorted;
    sorted.reserve(size_t(T));
    for (int64_t s : slot) {
      if (s >= 0) sorted.push_back(s);
    }
    std::sort(sorted.begin(), sorted.end());
    const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
    LS_CHECK(dup == sorted.end(), op, "slot_mapping writes slot ", dup == sorted.end() ? 0 : *dup,
             " more than once");
  }
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