// The attention contract (docs/contract.md §A): settings, the score scale, and the argument checks
// of every attention op (paged metadata is validated on the host, once).
#include "lockstep/contract/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "contract/checks.h"

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

}  // namespace lockstep

namespace lockstep::contract {
namespace {

int32_t read_i32(const TensorView& t, int64_t i) { return t.ptr<const int32_t>()[i * t.stride[0]]; }

QShape check_q(const char* op, Device dev, const TensorView& q) {
  LS_CHECK(q.ndim == 3, op, "argument 'q' expected shape [N, Hq, D], got ", q.shape_string());
  check_tensor(op, "q", q, DType::kBF16, {-1, -1, -1}, dev);
  check_inner_contiguous(op, "q", q);
  const int64_t D = q.shape[2];
  LS_CHECK(D >= kAttnMmaK && D <= kAttnMaxHeadDim && D % kAttnMmaK == 0, op,
           "argument 'q' head_dim must be a multiple of ", kAttnMmaK, " in [", kAttnMmaK, ", ",
           kAttnMaxHeadDim, "], got ", D);
  LS_CHECK(q.shape[1] >= 1, op, "argument 'q' expected at least one head, got ", q.shape_string());
  return {q.shape[0], q.shape[1], D};
}

void check_heads(const char* op, Device dev, int64_t Hq, int64_t Hkv) {
  LS_CHECK(Hkv >= 1 && Hq % Hkv == 0, op, "query heads Hq=", Hq,
           " must be a multiple of kv heads Hkv=", Hkv);
}

}  // namespace

void check_cache(const char* op, Device dev, const char* arg, const TensorView& c, int64_t D) {
  LS_CHECK(c.ndim == 4, op, "argument '", arg, "' expected shape [NP, P, Hkv, D], got ",
           c.shape_string());
  check_tensor(op, arg, c, DType::kBF16, {-1, -1, -1, D}, dev);
  check_inner_contiguous(op, arg, c);
}

void check_attn_outputs(const char* op, Device dev, const QShape& s, const TensorView& out,
                        const TensorView& lse) {
  check_tensor(op, "out", out, DType::kBF16, {s.N, s.Hq, s.D}, dev);
  check_inner_contiguous(op, "out", out);
  if (lse.ndim != 0 || lse.data != nullptr)
    check_tensor(op, "lse", lse, DType::kF32, {s.N, s.Hq}, dev);
}

Paged check_paged(const char* op, Device dev, const TensorView& q, const TensorView& q_seq,
                  const TensorView& q_pos, const PagedKv& kv, const SharedPrefix* prefix,
                  const AttentionConfig& cfg, int64_t c_lo, int64_t c_hi) {
  cfg.validate();
  Paged p;
  p.qs = check_q(op, dev, q);
  const int64_t N = p.qs.N, D = p.qs.D;
  check_cache(op, dev, "kv.k_cache", kv.k_cache, D);
  check_cache(op, dev, "kv.v_cache", kv.v_cache, D);
  check_tensor(op, "kv.v_cache", kv.v_cache, DType::kBF16,
               {kv.k_cache.shape[0], kv.k_cache.shape[1], kv.k_cache.shape[2], D}, dev);
  p.NP = kv.k_cache.shape[0];
  p.P = kv.k_cache.shape[1];
  p.Hkv = kv.k_cache.shape[2];
  LS_CHECK(p.P >= 1, op, "argument 'kv.k_cache' page size must be >= 1, got ",
           kv.k_cache.shape_string());
  check_heads(op, dev, p.qs.Hq, p.Hkv);
  LS_CHECK(kv.block_table.ndim == 2, op, "argument 'kv.block_table' expected shape [S, MP], got ",
           kv.block_table.shape_string());
  // Block tables: host tables are checked page by page; tables on `dev` only by shape (their
  // contents are trusted: the kernels read an entry outside the table or the cache as a zero key).
  const bool dev_tables = kv.block_table.device != Device::kCPU ||
                          (prefix != nullptr && prefix->block_table.device != Device::kCPU);
  check_tensor(op, "kv.block_table", kv.block_table, DType::kI32, {-1, -1},
               host_or(dev, kv.block_table));
  check_inner_contiguous(op, "kv.block_table", kv.block_table);
  p.S = kv.block_table.shape[0];
  p.MP = kv.block_table.shape[1];
  check_host_view(op, "kv.seq_lens", kv.seq_lens);
  check_host_view(op, "q_seq", q_seq);
  check_host_view(op, "q_pos", q_pos);
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
    check_tensor(op, "prefix.block_table", prefix->block_table, DType::kI32, {-1, -1},
                 host_or(dev, prefix->block_table));
    check_inner_contiguous(op, "prefix.block_table", prefix->block_table);
    GR = prefix->block_table.shape[0];
    MPs = prefix->block_table.shape[1];
    ptab = prefix->block_table.ptr<const int32_t>();
    ptab_s0 = prefix->block_table.stride[0];
    check_host_view(op, "prefix.shared_len", prefix->shared_len);
    check_host_view(op, "prefix.seq_group", prefix->seq_group);
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
  if (dev_tables) return p;
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

QShape check_prefill_varlen(const char* op, Device dev, const TensorView& q, const TensorView& k,
                            const TensorView& v, const TensorView& cu_seqlens,
                            const AttentionConfig& cfg, const TensorView& out,
                            const TensorView& lse) {
  cfg.validate();
  const QShape qs = check_q(op, dev, q);
  const int64_t T = qs.N, D = qs.D;
  LS_CHECK(k.ndim == 3, op, "argument 'k' expected shape [T, Hkv, D], got ", k.shape_string());
  check_tensor(op, "k", k, DType::kBF16, {T, -1, D}, dev);
  check_inner_contiguous(op, "k", k);
  const int64_t Hkv = k.shape[1];
  check_heads(op, dev, qs.Hq, Hkv);
  check_tensor(op, "v", v, DType::kBF16, {T, Hkv, D}, dev);
  check_inner_contiguous(op, "v", v);
  LS_CHECK(cu_seqlens.ndim == 1 && cu_seqlens.shape[0] >= 1, op,
           "argument 'cu_seqlens' expected shape [B+1] with B >= 0, got ",
           cu_seqlens.shape_string());
  check_host_view(op, "cu_seqlens", cu_seqlens);
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
  check_attn_outputs(op, dev, qs, out, lse);
  return qs;
}

}  // namespace lockstep::contract
