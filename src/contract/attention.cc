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

int32_t read_i32(const TensorView& t, int64_t i) { return t.ptr<const int32_t>()[i * t.stride[0]]; }

namespace {

QShape check_q(const char* op, Device dev, const TensorView& q) {
  LS_CHECK(q.ndim == 3, op, "argument 'q' expected shape [N, Hq, D], got ", q.shape_string());
  check_view(op, "q", q, DType::kBF16, {-1, -1, -1}, dev);
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
  check_view(op, arg, c, DType::kBF16, {-1, -1, -1, D}, dev);
}

void check_attn_outputs(const char* op, Device dev, const QShape& s, const TensorView& out,
                        const TensorView& lse) {
  check_view(op, "out", out, DType::kBF16, {s.N, s.Hq, s.D}, dev);
  if (lse.ndim != 0 || lse.data != nullptr)
    check_tensor(op, "lse", lse, DType::kF32, {s.N, s.Hq}, dev);
}

}  // namespace lockstep::contract

namespace lockstep {

PagedMeta PagedMeta::validate(const char* op, const PagedTables& t, int64_t NP, int64_t P,
                              const AttentionConfig& cfg, int64_t c_lo, int64_t c_hi) {
  using contract::check_host_view;
  using contract::host_or;
  cfg.validate();
  LS_CHECK(P >= 1 && NP >= 0, op,
           "cache geometry must have page size P >= 1 and NP >= 0 pages, got NP = ", NP,
           ", P = ", P);
  PagedMeta p;
  p.host_ = t;
  p.dev_ = t;
  p.NP_ = NP;
  p.P_ = P;
  p.chunk_begin_ = c_lo;
  p.chunk_end_ = c_hi;
  const TensorView& btab = t.block_table;
  LS_CHECK(btab.ndim == 2, op, "argument 'kv.block_table' expected shape [S, MP], got ",
           btab.shape_string());
  // Block tables: host tables are checked page by page; device tables only by shape (their
  // contents are trusted: the kernels read an entry outside the table or the cache as a zero key).
  const bool prefix = t.has_prefix();
  const bool dev_tables =
      btab.device != Device::kCPU || (prefix && t.prefix_block_table.device != Device::kCPU);
  p.tables_checked_ = !dev_tables;
  contract::check_view(op, "kv.block_table", btab, DType::kI32, {-1, -1}, btab.device);
  p.S_ = btab.shape[0];
  p.MP_ = btab.shape[1];
  check_host_view(op, "kv.seq_lens", t.seq_lens);
  check_host_view(op, "q_seq", t.q_seq);
  check_host_view(op, "q_pos", t.q_pos);
  check_tensor(op, "kv.seq_lens", t.seq_lens, DType::kI32, {p.S_});
  LS_CHECK(t.q_seq.ndim == 1, op, "argument 'q_seq' expected shape [N], got ",
           t.q_seq.shape_string());
  const int64_t N = t.q_seq.shape[0];
  check_tensor(op, "q_seq", t.q_seq, DType::kI32, {N});
  check_tensor(op, "q_pos", t.q_pos, DType::kI32, {N});

  // Prefix tables.
  const int32_t* ptab = nullptr;
  int64_t GR = 0, ptab_s0 = 0;
  p.group_.assign(size_t(p.S_), -1);
  if (prefix) {
    LS_CHECK(t.prefix_block_table.ndim == 2, op,
             "argument 'prefix.block_table' expected shape [GR, MPs], got ",
             t.prefix_block_table.shape_string());
    contract::check_view(op, "prefix.block_table", t.prefix_block_table, DType::kI32, {-1, -1},
                         t.prefix_block_table.device);
    GR = t.prefix_block_table.shape[0];
    p.MPs_ = t.prefix_block_table.shape[1];
    ptab = t.prefix_block_table.ptr<const int32_t>();
    ptab_s0 = t.prefix_block_table.stride[0];
    check_host_view(op, "prefix.shared_len", t.shared_len);
    check_host_view(op, "prefix.seq_group", t.seq_group);
    check_tensor(op, "prefix.shared_len", t.shared_len, DType::kI32, {GR});
    check_tensor(op, "prefix.seq_group", t.seq_group, DType::kI32, {p.S_});
    p.shared_len_.resize(size_t(GR));
    for (int64_t g = 0; g < GR; ++g) {
      const int64_t len = contract::read_i32(t.shared_len, g);
      LS_CHECK(len >= 0 && len <= p.MPs_ * P, op, "prefix.shared_len[", g, "] = ", len,
               " outside [0, MPs * P = ", p.MPs_ * P, "] (prefix block table too short)");
      p.shared_len_[size_t(g)] = len;
    }
    for (int64_t s = 0; s < p.S_; ++s) {
      const int64_t g = contract::read_i32(t.seq_group, s);
      LS_CHECK(g >= -1 && g < GR, op, "prefix.seq_group[", s, "] = ", g, " outside [-1, ", GR, ")");
      p.group_[size_t(s)] = g;
    }
  }

  const int32_t* bt = btab.ptr<const int32_t>();
  const int64_t bt_s0 = btab.stride[0];
  p.pos_.resize(size_t(N));
  p.seq_.resize(size_t(N));
  // Furthest position read per sequence (-1: not referenced).
  std::vector<int64_t> reach(size_t(p.S_), -1);
  for (int64_t r = 0; r < N; ++r) {
    const int64_t s = contract::read_i32(t.q_seq, r);
    LS_CHECK(s >= 0 && s < p.S_, op, "q_seq[", r, "] = ", s, " outside [0, S = ", p.S_, ")");
    const int64_t len = contract::read_i32(t.seq_lens, s);
    LS_CHECK(len >= 1, op, "kv.seq_lens[", s, "] = ", len,
             ": context length must be >= 1 for a sequence with queries (row ", r, ")");
    LS_CHECK(len <= p.MP_ * P, op, "kv.seq_lens[", s, "] = ", len,
             " needs more pages than kv.block_table has (MP = ", p.MP_, ", P = ", P, ")");
    const int64_t pos = contract::read_i32(t.q_pos, r);
    LS_CHECK(pos >= 0 && pos < len, op, "q_pos[", r, "] = ", pos, " outside [0, seq_len = ", len,
             ") of sequence ", s);
    const int64_t g = p.group_[size_t(s)];
    if (g >= 0) {
      LS_CHECK(len >= p.shared_len_[size_t(g)], op, "kv.seq_lens[", s, "] = ", len,
               " is shorter than the shared prefix of its group ", g, " (",
               p.shared_len_[size_t(g)], ")");
    }
    p.pos_[size_t(r)] = pos;
    p.seq_[size_t(r)] = s;
    if (reach[size_t(s)] < 0) ++p.num_seqs_;
    reach[size_t(s)] = std::max(reach[size_t(s)], pos);
  }
  // Page indices of every position that will be read: [c_lo * K, min(c_hi * K, reach + 1)).
  const int64_t K = cfg.kv_chunk;
  auto check_pages = [&](const int32_t* row, const char* what, int64_t which, int64_t j_lo,
                         int64_t j_hi) {
    if (j_hi <= j_lo) return;
    for (int64_t i = j_lo / P; i <= (j_hi - 1) / P; ++i) {
      const int64_t page = row[i];
      LS_CHECK(page >= 0 && page < NP, op, what, "[", which, "][", i, "] = ", page,
               " is not a page of the cache (NP = ", NP, ")");
    }
  };
  if (dev_tables) return p;
  const int64_t j_lo = c_lo * K;
  for (int64_t s = 0; s < p.S_; ++s) {
    if (reach[size_t(s)] < 0) continue;
    const int64_t j_hi = c_hi >= std::numeric_limits<int64_t>::max() / K
                             ? reach[size_t(s)] + 1
                             : std::min(c_hi * K, reach[size_t(s)] + 1);
    const int64_t g = p.group_[size_t(s)];
    const int64_t split = g >= 0 ? p.shared_len_[size_t(g)] : 0;
    check_pages(bt + s * bt_s0, "kv.block_table", s, std::max(j_lo, split), j_hi);
    if (g >= 0)
      check_pages(ptab + g * ptab_s0, "prefix.block_table", g, j_lo, std::min(j_hi, split));
  }
  return p;
}

PackedSeqs PackedSeqs::validate(const char* op, const TensorView& cu_seqlens, int64_t T) {
  using contract::read_i32;
  LS_CHECK(cu_seqlens.ndim == 1 && cu_seqlens.shape[0] >= 1, op,
           "argument 'cu_seqlens' expected shape [B+1] with B >= 0, got ",
           cu_seqlens.shape_string());
  contract::check_host_view(op, "cu_seqlens", cu_seqlens);
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
  PackedSeqs p;
  p.host_ = p.dev_ = cu_seqlens;
  p.cu_.resize(size_t(B + 1));
  for (int64_t b = 0; b <= B; ++b) p.cu_[size_t(b)] = read_i32(cu_seqlens, b);
  return p;
}

SharedPromptSeqs SharedPromptSeqs::validate(const char* op, const TensorView& cu_seqlens,
                                            const TensorView& prompt_of, int64_t T) {
  using contract::read_i32;
  SharedPromptSeqs s(PackedSeqs::validate(op, cu_seqlens, T));
  const int64_t B = s.B();
  LS_CHECK(prompt_of.ndim == 1, op, "argument 'prompt_of' expected shape [B] = [", B, "], got ",
           prompt_of.shape_string());
  contract::check_host_view(op, "prompt_of", prompt_of);
  check_tensor(op, "prompt_of", prompt_of, DType::kI32, {B});
  s.prompt_of_.resize(size_t(B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t p = read_i32(prompt_of, b);
    LS_CHECK(p >= -1 && p < B, op, "prompt_of[", b, "] = ", p, " is outside [-1, B = ", B,
             "): each segment is a prompt (-1) or names its prompt segment");
    LS_CHECK(p != b, op, "prompt_of[", b, "] = ", b, ": a segment cannot be its own prompt");
    s.prompt_of_[size_t(b)] = p;
  }
  std::vector<int64_t> count(size_t(B) + 1, 0);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t p = s.prompt_of_[size_t(b)];
    if (p < 0) continue;
    LS_CHECK(s.prompt_of_[size_t(p)] < 0, op, "prompt_of[", b, "] = ", p,
             " names a completion (prompt_of[", p, "] = ", s.prompt_of_[size_t(p)],
             "): a completion continues a prompt segment, not another completion");
    ++count[size_t(p) + 1];
  }
  s.child_begin_.assign(size_t(B) + 1, 0);
  for (int64_t b = 0; b < B; ++b)
    s.child_begin_[size_t(b) + 1] = s.child_begin_[size_t(b)] + count[size_t(b) + 1];
  s.children_.resize(size_t(s.child_begin_.back()));
  std::vector<int64_t> at(s.child_begin_.begin(), s.child_begin_.end() - 1);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t p = s.prompt_of_[size_t(b)];
    if (p >= 0) s.children_[size_t(at[size_t(p)]++)] = b;
  }
  return s;
}

std::span<const int64_t> SharedPromptSeqs::completions(int64_t b) const {
  const size_t b0 = size_t(child_begin_[size_t(b)]), b1 = size_t(child_begin_[size_t(b) + 1]);
  return std::span<const int64_t>(children_).subspan(b0, b1 - b0);
}

PackedSeqs PackedSeqs::with_device_copy(Device dev, const TensorView& copy) && {
  check_tensor("PackedSeqs::with_device_copy", "cu_seqlens", copy, DType::kI32, {B() + 1}, dev);
  dev_ = copy;
  device_ = dev;
  return std::move(*this);
}

PagedMeta PagedMeta::with_device_copies(Device dev, const PagedTables& c) && {
  const char* op = "PagedMeta::with_device_copies";
  auto same = [&](const char* arg, const TensorView& h, const TensorView& d) {
    if (h.ndim == 0 && h.data == nullptr) {
      LS_CHECK(d.ndim == 0 && d.data == nullptr, op, "argument '", arg,
               "' has a copy but no validated host view");
      return;
    }
    LS_CHECK(d.ndim == h.ndim, op, "argument '", arg, "' copy ", d.describe(),
             " differs from the host view ", h.describe());
    for (int i = 0; i < h.ndim; ++i)
      LS_CHECK(d.shape[i] == h.shape[i], op, "argument '", arg, "' copy ", d.describe(),
               " differs from the host view ", h.describe());
    if (h.ndim == 1) check_tensor(op, arg, d, h.dtype, {-1}, dev);
    if (h.ndim == 2) check_tensor(op, arg, d, h.dtype, {-1, -1}, dev);
  };
  same("q_seq", host_.q_seq, c.q_seq);
  same("q_pos", host_.q_pos, c.q_pos);
  same("block_table", host_.block_table, c.block_table);
  check_inner_contiguous(op, "block_table", c.block_table);
  same("seq_lens", host_.seq_lens, c.seq_lens);
  same("prefix_block_table", host_.prefix_block_table, c.prefix_block_table);
  if (host_.has_prefix()) check_inner_contiguous(op, "prefix_block_table", c.prefix_block_table);
  same("shared_len", host_.shared_len, c.shared_len);
  same("seq_group", host_.seq_group, c.seq_group);
  dev_ = c;
  device_ = dev;
  return std::move(*this);
}

}  // namespace lockstep

namespace lockstep::contract {

Paged paged_problem(const TensorView& q, const TensorView& k_cache, const PagedMeta& m) {
  Paged p;
  p.qs = {q.shape[0], q.shape[1], q.shape[2]};
  p.Hkv = k_cache.shape[2];
  p.NP = m.NP();
  p.P = m.P();
  p.S = m.S();
  p.MP = m.MP();
  p.pos = m.pos();
  p.seq = m.seq();
  p.group = m.group();
  p.shared_len = m.shared_len();
  p.num_seqs = m.num_seqs();
  return p;
}

Paged check_paged_call(const char* op, Device dev, const TensorView& q, const PagedMeta& m,
                       const TensorView& k_cache, const TensorView& v_cache,
                       const AttentionConfig& cfg, bool cascade, const TensorView& out,
                       const TensorView& lse) {
  cfg.validate();
  const QShape qs = check_q(op, dev, q);
  LS_CHECK(qs.N == m.N(), op, "argument 'q' has ", qs.N, " rows, the step's metadata ", m.N(),
           " (q_seq / q_pos)");
  check_cache(op, dev, "kv.k_cache", k_cache, qs.D);
  check_tensor(op, "kv.k_cache", k_cache, DType::kBF16, {m.NP(), m.P(), -1, qs.D}, dev);
  check_cache(op, dev, "kv.v_cache", v_cache, qs.D);
  check_tensor(op, "kv.v_cache", v_cache, DType::kBF16,
               {k_cache.shape[0], k_cache.shape[1], k_cache.shape[2], qs.D}, dev);
  check_heads(op, dev, qs.Hq, k_cache.shape[2]);
  LS_CHECK(m.all_chunks(), op, "the step's metadata was validated for kv chunks [", m.chunk_begin(),
           ", ", m.chunk_end(), ") only, this op reads every chunk");
  const PagedTables& d = m.device_copies();
  check_tensor(op, "kv.block_table", d.block_table, DType::kI32, {m.S(), m.MP()},
               host_or(dev, d.block_table));
  LS_CHECK(m.has_prefix() == cascade, op,
           cascade ? "the step's metadata has no prefix tables (cascade needs them)"
                   : "the step's metadata has prefix tables: only the cascade op reads them");
  if (cascade)
    check_tensor(op, "prefix.block_table", d.prefix_block_table, DType::kI32, {-1, m.MPs()},
                 host_or(dev, d.prefix_block_table));
  check_attn_outputs(op, dev, qs, out, lse);
  return paged_problem(q, k_cache, m);
}

PagedMeta check_paged(const char* op, Device dev, const TensorView& q, const TensorView& q_seq,
                      const TensorView& q_pos, const PagedKv& kv, const SharedPrefix* prefix,
                      const AttentionConfig& cfg, int64_t c_lo, int64_t c_hi) {
  cfg.validate();
  const QShape qs = check_q(op, dev, q);
  const int64_t N = qs.N, D = qs.D;
  check_cache(op, dev, "kv.k_cache", kv.k_cache, D);
  check_cache(op, dev, "kv.v_cache", kv.v_cache, D);
  check_tensor(op, "kv.v_cache", kv.v_cache, DType::kBF16,
               {kv.k_cache.shape[0], kv.k_cache.shape[1], kv.k_cache.shape[2], D}, dev);
  LS_CHECK(kv.k_cache.shape[1] >= 1, op, "argument 'kv.k_cache' page size must be >= 1, got ",
           kv.k_cache.shape_string());
  check_heads(op, dev, qs.Hq, kv.k_cache.shape[2]);
  LS_CHECK(kv.block_table.ndim == 2, op, "argument 'kv.block_table' expected shape [S, MP], got ",
           kv.block_table.shape_string());
  check_tensor(op, "kv.block_table", kv.block_table, DType::kI32, {-1, -1},
               host_or(dev, kv.block_table));
  if (prefix != nullptr && prefix->block_table.ndim == 2)
    check_tensor(op, "prefix.block_table", prefix->block_table, DType::kI32, {-1, -1},
                 host_or(dev, prefix->block_table));
  check_host_view(op, "q_seq", q_seq);
  check_host_view(op, "q_pos", q_pos);
  check_tensor(op, "q_seq", q_seq, DType::kI32, {N});
  check_tensor(op, "q_pos", q_pos, DType::kI32, {N});
  PagedTables t;
  t.q_seq = q_seq;
  t.q_pos = q_pos;
  t.block_table = kv.block_table;
  t.seq_lens = kv.seq_lens;
  if (prefix != nullptr) {
    t.prefix_block_table = prefix->block_table;
    t.shared_len = prefix->shared_len;
    t.seq_group = prefix->seq_group;
    LS_CHECK(t.has_prefix(), op, "argument 'prefix.block_table' expected shape [GR, MPs], got ",
             prefix->block_table.shape_string());
  }
  return PagedMeta::validate(op, t, kv.k_cache.shape[0], kv.k_cache.shape[1], cfg, c_lo, c_hi);
}

namespace {

// q, k, v of a packed prefill (cfg too); returns q's shape.
QShape check_qkv(const char* op, Device dev, const TensorView& q, const TensorView& k,
                 const TensorView& v, const AttentionConfig& cfg) {
  cfg.validate();
  const QShape qs = check_q(op, dev, q);
  const int64_t T = qs.N, D = qs.D;
  LS_CHECK(k.ndim == 3, op, "argument 'k' expected shape [T, Hkv, D], got ", k.shape_string());
  check_view(op, "k", k, DType::kBF16, {T, -1, D}, dev);
  const int64_t Hkv = k.shape[1];
  check_heads(op, dev, qs.Hq, Hkv);
  check_view(op, "v", v, DType::kBF16, {T, Hkv, D}, dev);
  return qs;
}

}  // namespace

QShape check_prefill_call(const char* op, Device dev, const TensorView& q, const TensorView& k,
                          const TensorView& v, const PackedSeqs& seqs, const AttentionConfig& cfg,
                          const TensorView& out, const TensorView& lse) {
  const QShape qs = check_qkv(op, dev, q, k, v, cfg);
  LS_CHECK(qs.N == seqs.T(), op, "argument 'q' has ", qs.N, " tokens, cu_seqlens packs ", seqs.T());
  check_attn_outputs(op, dev, qs, out, lse);
  return qs;
}

PackedSeqs check_prefill_varlen(const char* op, Device dev, const TensorView& q,
                                const TensorView& k, const TensorView& v,
                                const TensorView& cu_seqlens, const AttentionConfig& cfg,
                                const TensorView& out, const TensorView& lse) {
  const QShape qs = check_qkv(op, dev, q, k, v, cfg);
  PackedSeqs seqs = PackedSeqs::validate(op, cu_seqlens, qs.N);
  check_attn_outputs(op, dev, qs, out, lse);
  return seqs;
}

void check_chunk_states(const char* op, Device dev, const Paged& p, int64_t C,
                        const AttentionChunkStates& states) {
  check_tensor(op, "states.m", states.m, DType::kF32, {p.qs.N, p.qs.Hq, C}, dev);
  check_tensor(op, "states.l", states.l, DType::kF32, {p.qs.N, p.qs.Hq, C}, dev);
  check_view(op, "states.acc", states.acc, DType::kF32, {p.qs.N, p.qs.Hq, C, p.qs.D}, dev);
}

MergeShape check_merge_states(const char* op, Device dev, const AttentionChunkStates& states,
                              const TensorView& q_pos, const AttentionConfig& cfg,
                              const TensorView& out, const TensorView& lse) {
  cfg.validate();
  LS_CHECK(states.acc.ndim == 4, op, "argument 'states.acc' expected shape [N, Hq, C, D], got ",
           states.acc.shape_string());
  check_view(op, "states.acc", states.acc, DType::kF32, {-1, -1, -1, -1}, dev);
  MergeShape m;
  m.qs = QShape{states.acc.shape[0], states.acc.shape[1], states.acc.shape[3]};
  m.C = states.acc.shape[2];
  const int64_t N = m.qs.N, Hq = m.qs.Hq;
  check_tensor(op, "states.m", states.m, DType::kF32, {N, Hq, m.C}, dev);
  check_tensor(op, "states.l", states.l, DType::kF32, {N, Hq, m.C}, dev);
  check_host_view(op, "q_pos", q_pos);
  check_tensor(op, "q_pos", q_pos, DType::kI32, {N});
  LS_CHECK(m.qs.D >= 1 && m.qs.D <= kAttnMaxHeadDim, op, "head_dim must be in [1, ",
           kAttnMaxHeadDim, "], got ", m.qs.D);
  check_attn_outputs(op, dev, m.qs, out, lse);
  m.pos.resize(size_t(N));
  for (int64_t r = 0; r < N; ++r) {
    const int64_t ps = read_i32(q_pos, r);
    LS_CHECK(ps >= 0 && ps / cfg.kv_chunk < m.C, op, "q_pos[", r, "] = ", ps, " needs ",
             ps / cfg.kv_chunk + 1, " chunks, but states hold C = ", m.C);
    m.pos[size_t(r)] = ps;
  }
  return m;
}

KvWrite check_kv_write(const char* op, Device dev, const TensorView& k, const TensorView& v,
                       const TensorView& slot_mapping, const TensorView& k_cache,
                       const TensorView& v_cache) {
  LS_CHECK(k.ndim == 3, op, "argument 'k' expected shape [T, Hkv, D], got ", k.shape_string());
  check_view(op, "k", k, DType::kBF16, {-1, -1, -1}, dev);
  KvWrite w;
  w.T = k.shape[0];
  w.Hkv = k.shape[1];
  w.D = k.shape[2];
  check_view(op, "v", v, DType::kBF16, {w.T, w.Hkv, w.D}, dev);
  check_tensor_dtypes(op, "slot_mapping", slot_mapping, {DType::kI32, DType::kI64}, {w.T},
                      host_or(dev, slot_mapping));
  check_cache(op, dev, "k_cache", k_cache, w.D);
  check_tensor(op, "k_cache", k_cache, DType::kBF16, {-1, -1, w.Hkv, w.D}, dev);
  check_view(op, "v_cache", v_cache, DType::kBF16, {k_cache.shape[0], k_cache.shape[1], w.Hkv, w.D},
             dev);
  w.NP = k_cache.shape[0];
  w.P = k_cache.shape[1];
  if (slot_mapping.device != Device::kCPU) return w;
  const int64_t slots = w.NP * w.P;
  w.slots.resize(size_t(w.T));
  for (int64_t t = 0; t < w.T; ++t) {
    const int64_t sl = index_at(slot_mapping, t);
    LS_CHECK(sl == -1 || (sl >= 0 && sl < slots), op, "slot_mapping[", t, "] = ", sl,
             " outside [0, NP * P = ", slots, ") (and not -1)");
    w.slots[size_t(t)] = sl;
  }
  std::vector<int64_t> sorted;
  for (int64_t sl : w.slots)
    if (sl >= 0) sorted.push_back(sl);
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  LS_CHECK(dup == sorted.end(), op, "slot_mapping writes slot ", dup == sorted.end() ? 0 : *dup,
           " more than once");
  return w;
}

}  // namespace lockstep::contract
