// Op-case table, §B.8 linear log-prob backward: the layouts of tests/cpu/test_backward_logprob.cc
// (seg_len 8 mod 16, H not a multiple of 16, gemm_segments 1-8, vocab_segments 1/2/4/8) x T in
// {1, 17, 33} x with / without g_ent, τ cycling over {1, 0.7, 1.9}; ignored targets (their g_lp
// NaN: never used), padding rows no sequence covers, a nonzero incoming dw, specials in h (and W),
// i32 targets and strided views, and larger cases. The forward's lse / entropy come from
// Ops::linear_logprob on the same backend (the GPU case uses the GPU forward's bits). Relations:
// each sequence's dh alone == in the micro-batch; a sequence's dh inside micro-batches of 1/3/17
// others; dW (and dh) identical for one micro-batch per sequence applied in step order and for a
// shuffled packing with garbage padding rows.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <sstream>

#include "lockstep/error.h"
#include "ops/cases.h"
#include "ops/row_case.h"

namespace lockstep::cases {
namespace {

struct LpbShape {
  int64_t V, H;
  int tile, vseg, gseg;
};

Tensor clone(const Tensor& t) {
  Tensor c(t.dtype(), t.shape());
  std::memcpy(c.data(), t.data(), size_t(t.nbytes()));
  return c;
}

// One micro-batch: per row an h row, a target, g_lp and g_ent; sequences at row offsets.
struct Batch {
  int64_t T = 0;
  Tensor h, targets, g_lp, g_ent;
  std::vector<TokenSeq> seqs;
};

class LogprobBackwardCase : public OpCase {
 public:
  LogprobBackwardCase(LpbShape s, int64_t T, bool ent, float tau, DataKind h_kind, DataKind w_kind,
                      DType tgt_dt, bool strided, std::vector<int64_t> lens, bool quick)
      : s_(s),
        T_(T),
        ent_(ent),
        h_kind_(h_kind),
        w_kind_(w_kind),
        tgt_dt_(tgt_dt),
        strided_(strided),
        lens_(std::move(lens)),
        quick_(quick) {
    cfg_ = logprob_contract(s.tile, s.vseg, s.gseg);
    params_.temperature = tau;
    params_.ignore_index = -100;
  }
  std::string op() const override { return "linear_logprob_backward"; }
  std::string name() const override {
    std::ostringstream os;
    os << "linear_logprob_backward/T" << T_ << "_H" << s_.H << "_V" << s_.V << "_tile" << s_.tile
       << "_seg" << s_.vseg << "_gemmseg" << s_.gseg << "_temp" << params_.temperature
       << (ent_ ? "_g-ent" : "_no-g-ent") << "_targets-" << dtype_name(tgt_dt_)
       << (strided_ ? "/strided/" : "/contiguous/") << data_kind_name(h_kind_) << "-h_"
       << data_kind_name(w_kind_) << "-w";
    if (!lens_.empty()) {
      os << "/seqs";
      for (int64_t l : lens_) os << "-" << l;
    }
    return os.str();
  }
  bool quick() const override { return quick_; }

  void build(uint64_t seed) override {
    std::mt19937_64 g(seed);
    w_ = Tensor(DType::kBF16, {s_.V, s_.H});
    fill_bf16(w_.ptr<bf16>(), w_.numel(), w_kind_, g, 0.1f);
    dw0_ = Tensor(DType::kF32, {s_.V, s_.H});
    fill_f32(dw0_.ptr<float>(), dw0_.numel(), DataKind::kNormal, g, 0.1f);
    // The packing: T = 1: one token; lens_ empty: two sequences (step indices 6 and 5, the later
    // one packed first) with padding rows 0 and 9; else lens_ packed in step order, gaps 1-3.
    std::vector<TokenSeq> seqs;
    int64_t T = T_;
    if (!lens_.empty()) {
      int64_t row = 1;
      for (size_t i = 0; i < lens_.size(); ++i) {
        seqs.push_back({int64_t(i), row, lens_[i]});
        row += lens_[i] + 1 + int64_t(i % 3);
      }
      T = row;
    } else if (T_ == 1) {
      seqs = {{0, 0, 1}};
    } else {
      seqs = {{6, 1, 8}, {5, 10, T_ - 10}};
    }
    base_ = random_batch(T, g);
    base_.seqs = seqs;
    // The vocab's edges as targets.
    set_target(base_, 0, s_.V - 1);
    if (T > 1) set_target(base_, 1, 0);
  }

  Outputs run(Ops& ops, Mem& mem) const override { return run_batch(ops, mem, base_, dw0_); }

  std::vector<Relation> relations() const override {
    std::vector<Relation> rel;
    rel.push_back({"each sequence alone == inside the micro-batch (dh)",
                   [this](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                     for (const TokenSeq& q : base_.seqs) {
                       const Batch b = repack({q}, {0}, q.len, 0);
                       const Outputs o = run_batch(ops, mem, b, zeros_dw());
                       check_rows(check, "seq " + num(q.step_index) + " alone", o[0], 0, base[0],
                                  q.row, q.len, s_.H);
                     }
                   }});
    if (!lens_.empty() || T_ > 1) {
      // The longest sequence inside micro-batches of 1/3/17 others (other contents, padding).
      rel.push_back({"a sequence inside micro-batches of 1/3/17 others == in the base (dh)",
                     [this](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                       const TokenSeq q = *std::max_element(
                           base_.seqs.begin(), base_.seqs.end(),
                           [](const TokenSeq& a, const TokenSeq& b) { return a.len < b.len; });
                       std::mt19937_64 g(q.len * 7919 + 1);
                       for (int others : {1, 3, 17}) {
                         const Batch b = with_others(q, others, g);
                         const Outputs o = run_batch(ops, mem, b, zeros_dw());
                         const TokenSeq& at = b.seqs[size_t(others / 2)];
                         check_rows(check, "inside " + num(others) + " others", o[0], at.row,
                                    base[0], q.row, q.len, s_.H);
                       }
                     }});
    }
    rel.push_back(
        {"the one pass (backward from the forward's lse, writing logp / lse / "
         "entropy) == forward + backward, rows in place",
         [this](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
           // The sequences in step order from row 0, then two padding rows: the
           // layout the CUDA one pass takes (rows in place).
           std::vector<TokenSeq> by_step(base_.seqs.begin(), base_.seqs.end());
           std::sort(by_step.begin(), by_step.end(), [](const TokenSeq& a, const TokenSeq& b) {
             return a.step_index < b.step_index;
           });
           std::vector<int64_t> at;
           int64_t row = 0;
           for (const TokenSeq& q : by_step) {
             at.push_back(row);
             row += q.len;
           }
           const Batch b = repack(by_step, at, row + 2, 7);
           const Outputs o = run_batch(ops, mem, b, dw0_, /*one_pass=*/true);
           for (size_t i = 0; i < by_step.size(); ++i)
             check_rows(check, "seq " + num(by_step[i].step_index) + " dh", o[0], at[i], base[0],
                        by_step[i].row, by_step[i].len, s_.H);
           check_rows(check, "dw", o[1], 0, base[1], 0, s_.V, s_.H);
           const char* what[] = {"logp", "lse", "entropy"};
           for (int k = 0; k < 3; ++k)
             check(
                 std::string(what[k]) + " (every row) == the forward's",
                 compare_bits(o[size_t(5 + k)].row(0), o[size_t(2 + k)].row(0), b.T, DType::kF32));
         }});
    if (base_.seqs.size() >= 2) {
      rel.push_back({"dW: one micro-batch per sequence, applied in step order == one micro-batch",
                     [this](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                       std::vector<TokenSeq> by_step(base_.seqs.begin(), base_.seqs.end());
                       std::sort(by_step.begin(), by_step.end(),
                                 [](const TokenSeq& a, const TokenSeq& b) {
                                   return a.step_index < b.step_index;
                                 });
                       Tensor dw = clone(dw0_);
                       GradStep gs;
                       for (const TokenSeq& q : by_step) {
                         const Batch b = repack({q}, {2}, q.len + 3, 3);
                         gs.accept(TokenOrder::make("case", b.seqs, b.T));
                         const Outputs o = run_batch(ops, mem, b, dw);
                         check_rows(check, "seq " + num(q.step_index) + " dh", o[0], 2, base[0],
                                    q.row, q.len, s_.H);
                         dw = to_tensor(o[1]);
                       }
                       Output got = base[1];
                       got.bytes.assign(static_cast<const uint8_t*>(dw.data()),
                                        static_cast<const uint8_t*>(dw.data()) + dw.nbytes());
                       got.ld = s_.H;
                       got.offset = 0;
                       check_rows(check, "dw", got, 0, base[1], 0, s_.V, s_.H);
                     }});
      rel.push_back({"dW: shuffled packing with garbage padding rows == the base",
                     [this](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                       std::vector<TokenSeq> seqs(base_.seqs.begin(), base_.seqs.end());
                       std::reverse(seqs.begin(), seqs.end());
                       std::vector<int64_t> at;
                       int64_t row = 2;
                       for (const TokenSeq& q : seqs) {
                         at.push_back(row);
                         row += q.len + 2;
                       }
                       const Batch b = repack(seqs, at, row + 1, 5);
                       const Outputs o = run_batch(ops, mem, b, dw0_);
                       for (size_t i = 0; i < seqs.size(); ++i)
                         check_rows(check, "seq " + num(seqs[i].step_index) + " dh", o[0], at[i],
                                    base[0], seqs[i].row, seqs[i].len, s_.H);
                       check_rows(check, "dw", o[1], 0, base[1], 0, s_.V, s_.H);
                     }});
    }
    return rel;
  }

 private:
  LpbShape s_;
  int64_t T_;
  bool ent_;
  DataKind h_kind_, w_kind_;
  DType tgt_dt_;
  bool strided_;
  std::vector<int64_t> lens_;
  bool quick_;
  ContractConfig cfg_;
  LogprobParams params_;
  Tensor w_, dw0_;
  Batch base_;

  Tensor zeros_dw() const {
    Tensor z(DType::kF32, {s_.V, s_.H});
    std::memset(z.data(), 0, size_t(z.nbytes()));
    return z;
  }
  void set_target(Batch& b, int64_t r, int64_t v) const {
    if (b.targets.dtype() == DType::kI32)
      b.targets.ptr<int32_t>()[r] = int32_t(v);
    else
      b.targets.ptr<int64_t>()[r] = v;
  }
  int64_t target_at(const Batch& b, int64_t r) const {
    return b.targets.dtype() == DType::kI32 ? b.targets.ptr<int32_t>()[r]
                                            : b.targets.ptr<int64_t>()[r];
  }
  // T rows of fresh content: h of the case's kind, targets in [0, V) with one in eight ignored
  // (its g_lp NaN: an ignored target's g_lp is never used), g_lp, g_ent ~ N(0, 1).
  Batch random_batch(int64_t T, std::mt19937_64& g) const {
    Batch b;
    b.T = T;
    b.h = Tensor(DType::kBF16, {T, s_.H});
    fill_bf16(b.h.ptr<bf16>(), b.h.numel(), h_kind_, g, 1.0f);
    b.targets = Tensor(tgt_dt_, {T});
    b.g_lp = Tensor(DType::kF32, {T});
    b.g_ent = Tensor(DType::kF32, {T});
    fill_f32(b.g_lp.ptr<float>(), T, DataKind::kNormal, g);
    fill_f32(b.g_ent.ptr<float>(), T, DataKind::kNormal, g);
    for (int64_t r = 0; r < T; ++r) {
      const bool ignored = g() % 8 == 0;
      set_target(b, r, ignored ? params_.ignore_index : int64_t(g() % uint64_t(s_.V)));
      if (ignored) b.g_lp.ptr<float>()[r] = f32_from_bits(kCanonicalNanF32);
    }
    return b;
  }
  void copy_row(const Batch& from, int64_t fr, Batch& to, int64_t tr) const {
    std::memcpy(to.h.ptr<bf16>() + tr * s_.H, from.h.ptr<bf16>() + fr * s_.H,
                size_t(s_.H) * sizeof(bf16));
    set_target(to, tr, target_at(from, fr));
    to.g_lp.ptr<float>()[tr] = from.g_lp.ptr<float>()[fr];
    to.g_ent.ptr<float>()[tr] = from.g_ent.ptr<float>()[fr];
  }
  // The base's sequences `seqs` (same step indices) at rows `at` of a T-row batch whose other
  // rows are fresh content from `seed`.
  Batch repack(const std::vector<TokenSeq>& seqs, const std::vector<int64_t>& at, int64_t T,
               uint64_t seed) const {
    std::mt19937_64 g(seed * 104729 + uint64_t(T));
    Batch b = random_batch(T, g);
    for (size_t i = 0; i < seqs.size(); ++i) {
      for (int64_t p = 0; p < seqs[i].len; ++p) copy_row(base_, seqs[i].row + p, b, at[i] + p);
      b.seqs.push_back({seqs[i].step_index, at[i], seqs[i].len});
    }
    return b;
  }
  // Sequence q of the base at position others / 2 among `others` random sequences (lengths
  // 1-20), padding rows before and between them.
  Batch with_others(const TokenSeq& q, int others, std::mt19937_64& g) const {
    std::vector<int64_t> lens(size_t(others) + 1);
    for (auto& l : lens) l = 1 + int64_t(g() % 20);
    const size_t mid = size_t(others) / 2;
    lens[mid] = q.len;
    std::vector<TokenSeq> seqs;
    int64_t row = 3;
    for (size_t i = 0; i < lens.size(); ++i) {
      seqs.push_back({int64_t(i), row, lens[i]});
      row += lens[i] + int64_t(i % 2);
    }
    const int64_t T = row + 2;
    Batch b = random_batch(T, g);
    for (int64_t p = 0; p < q.len; ++p) copy_row(base_, q.row + p, b, seqs[mid].row + p);
    b.seqs = seqs;
    return b;
  }
  Tensor to_tensor(const Output& o) const {
    Tensor t(DType::kF32, {s_.V, s_.H});
    for (int64_t v = 0; v < s_.V; ++v)
      std::memcpy(t.ptr<float>() + v * s_.H, o.row(v), size_t(s_.H) * 4);
    return t;
  }
  static void check_rows(const Check& check, const std::string& what, const Output& got,
                         int64_t got_row, const Output& want, int64_t want_row, int64_t n,
                         int64_t elems) {
    for (int64_t r = 0; r < n; ++r)
      check(what + " row " + num(r),
            compare_bits(got.row(got_row + r), want.row(want_row + r), elems, DType::kF32));
  }

  // Forward (same backend) for lse / entropy, then the backward into a poisoned dh and a copy
  // of dw_in. Outputs {dh, dw}; one_pass: the backward that also writes the forward's outputs
  // (Ops::linear_logprob_backward_recompute), outputs {dh, dw, the forward's logp, lse, entropy,
  // the recomputed logp, lse, entropy}.
  Outputs run_batch(Ops& ops, Mem& mem, const Batch& b, const Tensor& dw_in,
                    bool one_pass = false) const {
    const int64_t T = b.T, H = s_.H;
    const TensorView h = mem.in(padded(b.h, strided_ ? 5 : 0));
    const TensorView w = mem.in(padded(w_, strided_ ? 3 : 0));
    const TensorView tg = mem.in(strided_ ? vector_arg(b.targets, 2) : host_arg(clone(b.targets)));
    const TensorView logp = mem.out(DType::kF32, {T}), lse = mem.out(DType::kF32, {T}),
                     ent = mem.out(DType::kF32, {T});
    ops.linear_logprob(h, w, tg, params_, cfg_, logp, lse, ent);
    const TensorView g_lp = mem.in(strided_ ? vector_arg(b.g_lp, 3) : host_arg(clone(b.g_lp)));
    const TensorView g_ent = mem.in(host_arg(clone(b.g_ent)));
    const TensorView dh = mem.out(DType::kF32, {T, H}, strided_ ? 3 : 0);
    const TensorView dw = mem.in(padded(dw_in, strided_ ? 2 : 0));
    const TokenOrder order = TokenOrder::make("linear_logprob_backward case", b.seqs, T);
    if (!one_pass) {
      ops.linear_logprob_backward(h, w, tg, params_, cfg_, lse, ent, g_lp, ent_ ? &g_ent : nullptr,
                                  dh, order, dw);
      return {mem.read("dh", dh), mem.read("dw", dw)};
    }
    const TensorView logp2 = mem.out(DType::kF32, {T}), lse2 = mem.out(DType::kF32, {T}),
                     ent2 = mem.out(DType::kF32, {T});
    ops.linear_logprob_backward_recompute(h, w, tg, params_, cfg_, lse, ent, g_lp,
                                          ent_ ? &g_ent : nullptr, dh, order, dw, logp2, lse2,
                                          ent2);
    return {mem.read("dh", dh),     mem.read("dw", dw),        mem.read("logp", logp),
            mem.read("lse", lse),   mem.read("entropy", ent),  mem.read("logp2", logp2),
            mem.read("lse2", lse2), mem.read("entropy2", ent2)};
  }
};

}  // namespace

void add_backward_logprob_cases(CaseList& t) {
  using DK = DataKind;
  const DType i64 = DType::kI64, i32 = DType::kI32;
  // The CPU test's layouts: seg_len 8 mod 16 (77 / 8 / 2, 1000 / 24 / 4, 77 / 40 / 2), 16,
  // multiples of 16, V a multiple of the unit, H not a multiple of 16, gemm_segments > 1.
  const std::vector<LpbShape> shapes = {
      {77, 17, 8, 2, 1},  {1000, 40, 24, 4, 2}, {77, 33, 40, 2, 1},
      {128, 16, 8, 8, 1}, {300, 24, 64, 1, 4},  {61, 9, 8, 4, 8},
  };
  int n = 0;
  for (const LpbShape& s : shapes)
    for (int64_t T : {1, 17, 33})
      for (bool ent : {true, false}) {
        const float tau = n % 3 == 0 ? 1.0f : (n % 3 == 1 ? 0.7f : 1.9f);
        ++n;
        t.push_back(std::make_unique<LogprobBackwardCase>(
            s, T, ent, tau, DK::kNormal, DK::kNormal, i64, false, std::vector<int64_t>{}, true));
      }
  // i32 targets and strided views (h, w, targets, g_lp, dh, dw rows wider than the views).
  t.push_back(std::make_unique<LogprobBackwardCase>(shapes[1], 33, true, 0.7f, DK::kNormal,
                                                    DK::kNormal, i32, true, std::vector<int64_t>{},
                                                    true));
  t.push_back(std::make_unique<LogprobBackwardCase>(shapes[4], 17, false, 1.9f, DK::kNormal,
                                                    DK::kNormal, i32, true, std::vector<int64_t>{},
                                                    true));
  // Specials: ±0, subnormals, ±inf, NaN in h (a token's dh NaN, every dw element of its block),
  // and in h and W (everything NaN).
  t.push_back(std::make_unique<LogprobBackwardCase>(shapes[0], 33, true, 1.0f, DK::kSpecials,
                                                    DK::kNormal, i64, false, std::vector<int64_t>{},
                                                    true));
  t.push_back(std::make_unique<LogprobBackwardCase>(shapes[1], 33, false, 0.7f, DK::kSpecials,
                                                    DK::kNormal, i64, false, std::vector<int64_t>{},
                                                    true));
  t.push_back(std::make_unique<LogprobBackwardCase>(shapes[5], 17, true, 1.9f, DK::kSpecials,
                                                    DK::kSpecials, i64, false,
                                                    std::vector<int64_t>{}, true));
  // vocab_tile a multiple of 16 with several segments (the CUDA one pass runs: the relation
  // "the one pass == forward + backward"), τ = 1 and not.
  t.push_back(std::make_unique<LogprobBackwardCase>(LpbShape{1000, 40, 48, 2, 1}, 33, true, 1.0f,
                                                    DK::kNormal, DK::kNormal, i64, false,
                                                    std::vector<int64_t>{}, true));
  t.push_back(std::make_unique<LogprobBackwardCase>(LpbShape{700, 24, 16, 4, 2}, 0, false, 0.7f,
                                                    DK::kNormal, DK::kNormal, i32, false,
                                                    std::vector<int64_t>{40, 3, 17}, true));
  // More sequences than one token block, several blocks per sequence (5, 16, 1, 17, 33, 2, 12).
  t.push_back(std::make_unique<LogprobBackwardCase>(
      LpbShape{150, 24, 8, 2, 1}, 0, true, 0.9f, DK::kNormal, DK::kNormal, i64, false,
      std::vector<int64_t>{5, 16, 1, 17, 33, 2, 12}, true));
  // Larger: ~1000 tokens in 4 sequences, V = 5000, H = 128 (vocab_tile 256, 8 segments,
  // gemm_segments 1: the GPU forward's fused producer), and seg_len 8 mod 16 at V = 5000.
  t.push_back(std::make_unique<LogprobBackwardCase>(
      LpbShape{5000, 128, 256, 8, 1}, 0, true, 1.0f, DK::kNormal, DK::kNormal, i64, false,
      std::vector<int64_t>{300, 17, 450, 200}, false));
  t.push_back(std::make_unique<LogprobBackwardCase>(LpbShape{5000, 72, 200, 4, 2}, 0, false, 0.7f,
                                                    DK::kNormal, DK::kNormal, i64, false,
                                                    std::vector<int64_t>{100, 64, 37}, false));
}

}  // namespace lockstep::cases
