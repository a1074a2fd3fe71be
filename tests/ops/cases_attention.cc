// Op-case table, attention: packed varlen prefill, paged decode, chunked prefill, split-KV,
// cascade, chunk states + merge, kv_cache_write, over sequences in prefix-sharing groups stored in
// a paged cache with shuffled pages; relations: every mode == packed prefill, each sequence alone,
// page sizes, split counts, threads, kv_cache_write token order.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <sstream>

#include "lockstep/error.h"
#include "ops/cases.h"
#include "ops/row_case.h"

namespace lockstep::cases {
namespace {

// ---- Attention
// -----------------------------------------------------------------------------------

const char* mode_name(AttnMode m) {
  switch (m) {
    case AttnMode::kPrefill:
      return "attention_prefill_varlen";
    case AttnMode::kDecode:
      return "attention_paged_decode";
    case AttnMode::kChunked:
      return "attention_paged_chunked_prefill";
    case AttnMode::kSplitKv:
      return "attention_paged_split_kv";
    case AttnMode::kCascade:
      return "attention_paged_cascade";
    case AttnMode::kChunkStates:
      return "attention_chunk_states_merge";
    case AttnMode::kKvWrite:
      return "kv_cache_write";
  }
  return "?";
}

Tensor i32s(const std::vector<int32_t>& v) {
  Tensor t(DType::kI32, {int64_t(v.size())});
  if (!v.empty()) std::memcpy(t.data(), v.data(), v.size() * 4);
  return t;
}

// Sequences in groups of `group` that share a prompt prefix of `prefix` tokens (same k/v), each
// with its own continuation; packed for prefill, and stored in a paged cache with shuffled pages.
class AttentionCase : public OpCase {
 public:
  AttentionCase(AttnMode mode, AttnDims d, int kv_chunk, double scale, std::vector<int64_t> lens,
                int64_t page, int splits = 1, int64_t group = 1, int64_t prefix = 0,
                DataKind kind = DataKind::kNormal)
      : mode_(mode),
        d_(d),
        lens_(std::move(lens)),
        page_(page),
        splits_(splits),
        group_(group),
        prefix_(prefix),
        kind_(kind) {
    cfg_.kv_chunk = kv_chunk;
    cfg_.softmax_scale = scale;
  }
  std::string op() const override { return mode_name(mode_); }
  std::string name() const override {
    std::ostringstream os;
    os << mode_name(mode_) << "/Hq" << d_.Hq << "_Hkv" << d_.Hkv << "_D" << d_.D << "_chunk"
       << cfg_.kv_chunk << "_scale" << cfg_.softmax_scale << "_lens";
    for (int64_t l : lens_) os << "-" << l;
    os << "_page" << page_;
    if (mode_ == AttnMode::kSplitKv) os << "_splits" << splits_;
    if (group_ > 1) os << "_group" << group_ << "x" << prefix_;
    os << "/contiguous/" << data_kind_name(kind_);
    return os.str();
  }
  bool quick() const override {
    int64_t keys = 0;
    for (int64_t l : lens_) keys = std::max(keys, l);
    return keys <= 300 && d_.D <= 128;
  }

  void build(uint64_t seed) override {
    std::mt19937_64 g(seed);
    const int64_t B = int64_t(lens_.size());
    T_ = std::accumulate(lens_.begin(), lens_.end(), int64_t(0));
    q_ = Tensor(DType::kBF16, {T_, d_.Hq, d_.D});
    k_ = Tensor(DType::kBF16, {T_, d_.Hkv, d_.D});
    v_ = Tensor(DType::kBF16, {T_, d_.Hkv, d_.D});
    fill_bf16(q_.ptr<bf16>(), q_.numel(), kind_, g);
    fill_bf16(k_.ptr<bf16>(), k_.numel(), kind_, g);
    fill_bf16(v_.ptr<bf16>(), v_.numel(), kind_, g);
    cu_.assign(size_t(B + 1), 0);
    for (int64_t b = 0; b < B; ++b) cu_[size_t(b + 1)] = cu_[size_t(b)] + int32_t(lens_[size_t(b)]);
    // Group members share the first member's prefix keys and values.
    const int64_t kv_row = d_.Hkv * d_.D;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t lead = b / group_ * group_;
      if (lead == b) continue;
      const int64_t n = std::min({prefix_, lens_[size_t(b)], lens_[size_t(lead)]});
      for (Tensor* t : {&k_, &v_})
        std::memcpy(t->ptr<bf16>() + cu_[size_t(b)] * kv_row,
                    t->ptr<bf16>() + cu_[size_t(lead)] * kv_row, size_t(n * kv_row) * 2);
    }
    rng_seed_ = seed;
  }

  Outputs run(Ops& ops, Mem& mem) const override {
    return run_mode(ops, mem, mode_, page_, splits_);
  }

  std::vector<Relation> relations() const override {
    std::vector<Relation> rel;
    if (mode_ == AttnMode::kKvWrite) {
      rel.push_back({"slots written in reverse token order",
                     [this](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                       const Outputs got = kv_write(ops, mem, page_, true);
                       for (size_t i = 0; i < got.size(); ++i)
                         check(got[i].name, compare_outputs(got[i], base[i]));
                     }});
      return rel;
    }
    // Every mode's rows equal the packed prefill's rows of the same (sequence, position).
    if (mode_ != AttnMode::kPrefill)
      rel.push_back({"rows == packed prefill",
                     [this](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                       const Outputs pre = run_mode(ops, mem, AttnMode::kPrefill, page_, 1);
                       const std::vector<int64_t> tok = query_tokens(mode_);
                       for (size_t o = 0; o < 2; ++o) {
                         const Output& got = base[base.size() - 2 + o];
                         for (size_t r = 0; r < tok.size(); ++r)
                           check(got.name + " row " + num(int64_t(r)),
                                 compare_bits(got.row(int64_t(r)), pre[o].row(tok[r]),
                                              got.row_elems, got.dtype));
                       }
                     }});
    if (mode_ == AttnMode::kPrefill)
      rel.push_back({"each sequence alone == packed",
                     [this](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                       for (size_t b = 0; b < lens_.size(); ++b) {
                         const int64_t t0 = cu_[b], n = lens_[b];
                         const Outputs one = prefill_rows(ops, mem, t0, n);
                         for (size_t o = 0; o < 2; ++o)
                           check(one[o].name + " sequence " + num(int64_t(b)),
                                 compare_bits(one[o].row(0), base[o].row(t0), n * one[o].row_elems,
                                              one[o].dtype));
                       }
                     }});
    if (mode_ == AttnMode::kDecode || mode_ == AttnMode::kChunked)
      for (int64_t P : {int64_t(1), int64_t(16), int64_t(37)})
        if (P != page_)
          rel.push_back({"page size " + num(P),
                         [this, P](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                           const Outputs got = run_mode(ops, mem, mode_, P, 1);
                           for (size_t o = 0; o < got.size(); ++o)
                             check(got[o].name, compare_outputs(got[o], base[o]));
                         }});
    if (mode_ == AttnMode::kSplitKv)
      for (int n : {1, 2, 3, 5, 7, 10, 100})
        if (n != splits_)
          rel.push_back({"splits " + num(n),
                         [this, n](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                           const Outputs got = run_mode(ops, mem, mode_, page_, n);
                           for (size_t o = 0; o < got.size(); ++o)
                             check(got[o].name, compare_outputs(got[o], base[o]));
                         }});
    rel.push_back(thread_counts_relation(
        [this](Ops& ops, Mem& mem) { return run_mode(ops, mem, mode_, page_, splits_); }));
    return rel;
  }

 private:
  AttnMode mode_;
  AttnDims d_;
  AttentionConfig cfg_;
  std::vector<int64_t> lens_;
  int64_t page_;
  int splits_;
  int64_t group_, prefix_;
  DataKind kind_;
  int64_t T_ = 0;
  Tensor q_, k_, v_;
  std::vector<int32_t> cu_;
  uint64_t rng_seed_ = 0;

  // Packed token index of each query row of a mode: decode = each sequence's last token;
  // the paged modes over all positions = every token.
  std::vector<int64_t> query_tokens(AttnMode m) const {
    std::vector<int64_t> tok;
    const bool last_only =
        m == AttnMode::kDecode || m == AttnMode::kSplitKv || m == AttnMode::kChunkStates;
    for (size_t b = 0; b < lens_.size(); ++b) {
      if (lens_[b] == 0) continue;
      if (last_only) {
        tok.push_back(cu_[b + 1] - 1);
      } else {
        for (int64_t t = cu_[b]; t < cu_[b + 1]; ++t) tok.push_back(t);
      }
    }
    return tok;
  }

  Outputs prefill_rows(Ops& ops, Mem& mem, int64_t t0, int64_t n) const {
    auto slice = [&](const Tensor& t, int64_t h) {
      Tensor s(DType::kBF16, {n, h, d_.D});
      std::memcpy(s.data(), t.ptr<bf16>() + t0 * h * d_.D, size_t(n * h * d_.D) * 2);
      return host_arg(std::move(s));
    };
    const TensorView out = mem.out(DType::kBF16, {n, d_.Hq, d_.D});
    const TensorView lse = mem.out(DType::kF32, {n, d_.Hq});
    ops.attention_prefill_varlen(mem.in(slice(q_, d_.Hq)), mem.in(slice(k_, d_.Hkv)),
                                 mem.in(slice(v_, d_.Hkv)),
                                 mem.host(host_arg(i32s({0, int32_t(n)}))), cfg_, out, lse);
    return {mem.read("out", out), mem.read("lse", lse)};
  }

  // The paged cache for page size P: pages of every sequence in a shuffled order (seeded), the
  // slots past a sequence's length filled with NaN garbage (never read).
  struct Cache {
    HostArg k, v, table, lens;
    int64_t pages = 0, max_pages = 0;
    std::vector<int32_t> slot;  // per packed token
  };
  Cache cache(int64_t P) const {
    Cache c;
    const int64_t B = int64_t(lens_.size());
    for (int64_t l : lens_) c.max_pages = std::max(c.max_pages, (l + P - 1) / P);
    c.max_pages = std::max<int64_t>(c.max_pages, 1);
    for (int64_t l : lens_) c.pages += (l + P - 1) / P;
    c.pages += 2;  // unused pages
    std::vector<int32_t> order(size_t(c.pages));
    std::iota(order.begin(), order.end(), 0);
    std::mt19937_64 g(rng_seed_ ^ uint64_t(P));
    std::shuffle(order.begin(), order.end(), g);
    const int64_t row = d_.Hkv * d_.D;
    Tensor kc(DType::kBF16, {c.pages, P, d_.Hkv, d_.D}),
        vc(DType::kBF16, {c.pages, P, d_.Hkv, d_.D});
    for (Tensor* t : {&kc, &vc})
      for (int64_t i = 0; i < t->numel(); ++i) t->ptr<bf16>()[i] = bf16{0x7fc1};
    Tensor table(DType::kI32, {B, c.max_pages});
    std::vector<int32_t> lens32;
    size_t next = 0;
    c.slot.assign(size_t(T_), -1);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t l = lens_[size_t(b)];
      lens32.push_back(int32_t(l));
      for (int64_t p = 0; p < c.max_pages; ++p)
        table.ptr<int32_t>()[b * c.max_pages + p] = p * P < l ? order[next++] : 0;
      for (int64_t j = 0; j < l; ++j) {
        const int64_t pg = table.ptr<int32_t>()[b * c.max_pages + j / P];
        const int64_t slot = pg * P + j % P, t = cu_[size_t(b)] + j;
        c.slot[size_t(t)] = int32_t(slot);
        std::memcpy(kc.ptr<bf16>() + slot * row, k_.ptr<bf16>() + t * row, size_t(row) * 2);
        std::memcpy(vc.ptr<bf16>() + slot * row, v_.ptr<bf16>() + t * row, size_t(row) * 2);
      }
    }
    c.k = host_arg(std::move(kc));
    c.v = host_arg(std::move(vc));
    c.table = host_arg(std::move(table));
    c.lens = host_arg(i32s(lens32));
    return c;
  }

  Outputs kv_write(Ops& ops, Mem& mem, int64_t P, bool reverse) const {
    const Cache c = cache(P);
    // Token order (optionally reversed) with a padding token (slot -1) after every 5th.
    std::vector<int64_t> toks;
    for (int64_t t = 0; t < T_; ++t) toks.push_back(reverse ? T_ - 1 - t : t);
    const int64_t row = d_.Hkv * d_.D;
    std::vector<int64_t> slots;
    Tensor k(DType::kBF16, {int64_t(toks.size() + toks.size() / 5), d_.Hkv, d_.D});
    Tensor v(DType::kBF16, {k.shape()[0], d_.Hkv, d_.D});
    int64_t n = 0;
    for (size_t i = 0; i < toks.size(); ++i) {
      std::memcpy(k.ptr<bf16>() + n * row, k_.ptr<bf16>() + toks[i] * row, size_t(row) * 2);
      std::memcpy(v.ptr<bf16>() + n * row, v_.ptr<bf16>() + toks[i] * row, size_t(row) * 2);
      slots.push_back(c.slot[size_t(toks[i])]);
      ++n;
      if (i % 5 == 4) {
        std::memset(k.ptr<bf16>() + n * row, 0x7f, size_t(row) * 2);
        std::memset(v.ptr<bf16>() + n * row, 0x7f, size_t(row) * 2);
        slots.push_back(-1);
        ++n;
      }
    }
    Tensor sm(DType::kI64, {n});
    std::memcpy(sm.data(), slots.data(), size_t(n) * 8);
    // The caches start as garbage (a fixed pattern), the written slots must hold k/v exactly.
    Tensor kc(DType::kBF16, {c.pages, P, d_.Hkv, d_.D}),
        vc(DType::kBF16, {c.pages, P, d_.Hkv, d_.D});
    std::memset(kc.data(), 0x3c, size_t(kc.nbytes()));
    std::memset(vc.data(), 0xc3, size_t(vc.nbytes()));
    const TensorView kcv = mem.in(host_arg(kc)), vcv = mem.in(host_arg(vc));
    ops.kv_cache_write(mem.in(host_arg(k)), mem.in(host_arg(v)), mem.host(host_arg(sm)), kcv, vcv);
    return {not_by_row(mem.read("k_cache", kcv)), not_by_row(mem.read("v_cache", vcv))};
  }

  Outputs run_mode(Ops& ops, Mem& mem, AttnMode m, int64_t P, int splits) const {
    if (m == AttnMode::kKvWrite) return kv_write(ops, mem, P, false);
    if (m == AttnMode::kPrefill) {
      const TensorView out = mem.out(DType::kBF16, {T_, d_.Hq, d_.D});
      const TensorView lse = mem.out(DType::kF32, {T_, d_.Hq});
      ops.attention_prefill_varlen(mem.in(host_arg(q_)), mem.in(host_arg(k_)), mem.in(host_arg(v_)),
                                   mem.host(host_arg(i32s(cu_))), cfg_, out, lse);
      return {mem.read("out", out), mem.read("lse", lse)};
    }
    const Cache c = cache(P);
    PagedKv kv;
    kv.k_cache = mem.in(c.k);
    kv.v_cache = mem.in(c.v);
    kv.block_table = mem.host(c.table);
    kv.seq_lens = mem.host(c.lens);
    // Query rows (packed tokens) with their sequence and position.
    const std::vector<int64_t> tok = query_tokens(m);
    const int64_t N = int64_t(tok.size()), qrow = d_.Hq * d_.D;
    Tensor q(DType::kBF16, {N, d_.Hq, d_.D});
    std::vector<int32_t> qs, qp;
    for (int64_t r = 0; r < N; ++r) {
      std::memcpy(q.ptr<bf16>() + r * qrow, q_.ptr<bf16>() + tok[size_t(r)] * qrow,
                  size_t(qrow) * 2);
      const int64_t b =
          std::upper_bound(cu_.begin(), cu_.end(), int32_t(tok[size_t(r)])) - cu_.begin() - 1;
      qs.push_back(int32_t(b));
      qp.push_back(int32_t(tok[size_t(r)] - cu_[size_t(b)]));
    }
    const TensorView qv = mem.in(host_arg(q));
    const HostArg qsa = host_arg(i32s(qs)), qpa = host_arg(i32s(qp));
    const TensorView out = mem.out(DType::kBF16, {N, d_.Hq, d_.D});
    const TensorView lse = mem.out(DType::kF32, {N, d_.Hq});
    Outputs extra;
    switch (m) {
      case AttnMode::kDecode:
      case AttnMode::kChunked:
        ops.attention_paged(qv, mem.host(qsa), mem.host(qpa), kv, cfg_, out, lse);
        break;
      case AttnMode::kSplitKv:
        ops.attention_paged_split_kv(qv, mem.host(qsa), mem.host(qpa), kv, cfg_, splits, out, lse);
        break;
      case AttnMode::kCascade: {
        // Group g's prefix is read from its first member's pages.
        const int64_t B = int64_t(lens_.size()), GR = (B + group_ - 1) / group_;
        Tensor pt(DType::kI32, {GR, c.max_pages});
        std::vector<int32_t> sl, sg;
        for (int64_t gi = 0; gi < GR; ++gi) {
          std::memcpy(pt.ptr<int32_t>() + gi * c.max_pages,
                      c.table.buf.ptr<int32_t>() + gi * group_ * c.max_pages,
                      size_t(c.max_pages) * 4);
          int64_t shared = prefix_;
          for (int64_t b = gi * group_; b < std::min(B, (gi + 1) * group_); ++b)
            shared = std::min(shared, lens_[size_t(b)]);
          sl.push_back(int32_t(shared));
        }
        for (int64_t b = 0; b < B; ++b) sg.push_back(int32_t(b / group_));
        const HostArg pta = host_arg(std::move(pt)), sla = host_arg(i32s(sl)),
                      sga = host_arg(i32s(sg));
        SharedPrefix pre{mem.host(pta), mem.host(sla), mem.host(sga)};
        ops.attention_paged_cascade(qv, mem.host(qsa), mem.host(qpa), kv, pre, cfg_, out, lse);
        break;
      }
      case AttnMode::kChunkStates: {
        int64_t C = 1;
        for (int32_t p : qp) C = std::max<int64_t>(C, p / cfg_.kv_chunk + 1);
        AttentionChunkStates st{mem.out(DType::kF32, {N, d_.Hq, C}),
                                mem.out(DType::kF32, {N, d_.Hq, C}),
                                mem.out(DType::kF32, {N, d_.Hq, C, d_.D})};
        ops.attention_paged_chunk_states(qv, mem.host(qsa), mem.host(qpa), kv, cfg_, 0, st);
        ops.attention_merge_chunk_states(st, mem.host(qpa), cfg_, out, lse);
        extra = {not_by_row(mem.read("state_m", st.m)), not_by_row(mem.read("state_l", st.l)),
                 not_by_row(mem.read("state_acc", st.acc))};
        break;
      }
      default:
        break;
    }
    extra.push_back(mem.read("out", out));
    extra.push_back(mem.read("lse", lse));
    return extra;
  }
};

}  // namespace

std::unique_ptr<OpCase> attention_case(AttnMode mode, AttnDims d, int kv_chunk, double scale,
                                       std::vector<int64_t> lens, int64_t page, int splits,
                                       int64_t group, int64_t prefix, DataKind kind) {
  return std::make_unique<AttentionCase>(mode, d, kv_chunk, scale, std::move(lens), page, splits,
                                         group, prefix, kind);
}

}  // namespace lockstep::cases
