// Op-case table, attention backward (docs/contract.md §B.9): packed varlen causal GQA sequences,
// the forward's out / lse computed in the case by attention_prefill_varlen on the same backend
// (outputs too), then dq, dk, dv. Relations: each sequence alone == packed; one sequence inside
// micro-batches of 1 / 3 / 17 (and 256) other sequences at another offset; the sequences packed in
// reverse order with empty sequences between them (all contiguous, so a strided case is also
// checked against the contiguous layout); thread counts 1 and 3.
#include <algorithm>
#include <cstring>
#include <sstream>

#include "ops/attn_rows.h"
#include "ops/cases.h"
#include "ops/row_case.h"

namespace lockstep::cases {
namespace {

class AttentionBackwardCase : public OpCase {
 public:
  AttentionBackwardCase(AttnDims d, std::vector<int64_t> lens, double scale, bool strided,
                        DataKind kind, std::vector<int> others, bool quick)
      : d_(d),
        lens_(std::move(lens)),
        strided_(strided),
        kind_(kind),
        others_(std::move(others)),
        quick_(quick) {
    cfg_.softmax_scale = scale;
  }
  std::string op() const override { return "attention_backward_varlen"; }
  std::string name() const override {
    std::ostringstream os;
    os << op() << "/Hq" << d_.Hq << "_Hkv" << d_.Hkv << "_D" << d_.D << "_scale"
       << cfg_.softmax_scale << "_lens";
    for (int64_t l : lens_) os << "-" << l;
    os << "_others";
    for (int n : others_) os << "-" << n;
    os << (strided_ ? "/strided/" : "/contiguous/") << data_kind_name(kind_);
    return os.str();
  }
  bool quick() const override { return quick_; }

  void build(uint64_t seed) override {
    std::mt19937_64 g(seed);
    seqs_.clear();
    for (int64_t l : lens_) seqs_.push_back(make_seq(l, kind_, g));
    seed_ = seed;
  }

  Outputs run(Ops& ops, Mem& mem) const override {
    std::vector<const AttnRows*> pack;
    for (const AttnRows& s : seqs_) pack.push_back(&s);
    return run_packed(ops, mem, pack, strided_);
  }

  std::vector<Relation> relations() const override {
    std::vector<Relation> rel;
    rel.push_back({"each sequence alone == packed",
                   [this](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                     int64_t t0 = 0;
                     for (size_t b = 0; b < seqs_.size(); ++b) {
                       const int64_t n = seqs_[b].len;
                       if (n > 0) {
                         const Outputs one = run_packed(ops, mem, {&seqs_[b]}, false);
                         check_rows(check, "sequence " + num(int64_t(b)), one, 0, base, t0, n);
                       }
                       t0 += n;
                     }
                   }});
    for (int n : others_)
      rel.push_back({"longest sequence inside a micro-batch of " + num(n) + " others",
                     [this, n](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                       // Other sequences of varied short lengths, the case's longest sequence
                       // among them at position n / 2.
                       std::mt19937_64 g(seed_ ^ (0x9e3779b97f4a7c15ull * uint64_t(n + 1)));
                       const int64_t lens[] = {1, 5, 15, 16, 17, 31, 63, 64, 65, 0};
                       const int64_t short_lens[] = {1, 2, 3, 5, 8, 13, 16, 17, 0};
                       std::vector<AttnRows> other;
                       for (int i = 0; i < n; ++i) {
                         const int64_t l = n > 32 ? short_lens[g() % 9] : lens[g() % 10];
                         other.push_back(make_seq(l, DataKind::kNormal, g));
                       }
                       size_t best = 0;
                       int64_t t_base = 0, t_best = 0;
                       for (size_t b = 0; b < seqs_.size(); ++b) {
                         if (seqs_[b].len > seqs_[best].len) {
                           best = b;
                           t_best = t_base;
                         }
                         t_base += seqs_[b].len;
                       }
                       std::vector<const AttnRows*> pack;
                       int64_t t_got = 0;
                       for (int i = 0; i < n; ++i) {
                         if (i == n / 2) {
                           t_got = 0;
                           for (const AttnRows* s : pack) t_got += s->len;
                           pack.push_back(&seqs_[best]);
                         }
                         pack.push_back(&other[size_t(i)]);
                       }
                       const Outputs got = run_packed(ops, mem, pack, false);
                       check_rows(check, "sequence " + num(int64_t(best)), got, t_got, base, t_best,
                                  seqs_[best].len);
                     }});
    rel.push_back({"reverse packing order with empty sequences between",
                   [this](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                     AttnRows empty;
                     empty.len = 0;
                     std::vector<const AttnRows*> pack;
                     std::vector<int64_t> t_got(seqs_.size());
                     int64_t t = 0;
                     for (size_t b = seqs_.size(); b-- > 0;) {
                       pack.push_back(&empty);
                       t_got[b] = t;
                       pack.push_back(&seqs_[b]);
                       t += seqs_[b].len;
                     }
                     const Outputs got = run_packed(ops, mem, pack, false);
                     int64_t t0 = 0;
                     for (size_t b = 0; b < seqs_.size(); ++b) {
                       check_rows(check, "sequence " + num(int64_t(b)), got, t_got[b], base, t0,
                                  seqs_[b].len);
                       t0 += seqs_[b].len;
                     }
                   }});
    rel.push_back(thread_counts_relation([this](Ops& ops, Mem& mem) { return run(ops, mem); }));
    return rel;
  }

 private:
  AttnDims d_;
  AttentionConfig cfg_;
  std::vector<int64_t> lens_;
  bool strided_;
  DataKind kind_;
  std::vector<int> others_;
  bool quick_;
  std::vector<AttnRows> seqs_;
  uint64_t seed_ = 0;

  AttnRows make_seq(int64_t len, DataKind kind, std::mt19937_64& g) const {
    return make_attn_rows(d_, len, kind, g);
  }

  // Forward then backward of the packed sequences on one backend: {out, lse, dq, dk, dv}.
  Outputs run_packed(Ops& ops, Mem& mem, const std::vector<const AttnRows*>& pack,
                     bool strided) const {
    return run_attention_pack(ops, mem, d_, cfg_, pack, {}, strided);
  }
};

void add(CaseList& t, AttnDims d, std::vector<int64_t> lens, double scale, bool strided,
         DataKind kind, std::vector<int> others = {1, 3, 17}, bool quick = true) {
  t.push_back(std::make_unique<AttentionBackwardCase>(d, std::move(lens), scale, strided, kind,
                                                      std::move(others), quick));
}

}  // namespace

void add_backward_attention_cases(CaseList& t) {
  using K = DataKind;
  const std::vector<int64_t> all = {1, 15, 16, 17, 63, 64, 65, 130, 300};
  // Every length of the brief packed together (an empty sequence among them), GQA groups 1, 2, 4.
  add(t, {4, 2, 64}, {1, 15, 16, 0, 17, 63, 64, 65, 130, 300}, 0.0, false, K::kNormal);
  add(t, {8, 2, 128}, {0, 300, 17, 65, 1}, 0.0, true, K::kNormal);
  add(t, {1, 1, 16}, {15, 16, 17, 63, 64, 65, 130}, 0.0, false, K::kNormal);
  add(t, {2, 2, 32}, all, 0.3, true, K::kNormal);
  add(t, {8, 8, 64}, {63, 64, 65, 1}, 0.0, false, K::kNormal, {1, 3});
  add(t, {4, 1, 128}, {130, 16, 0, 65}, 0.0, false, K::kNormal, {3});
  // Contiguous head_dim 128: the Hopper wgmma kernels against the CPU (sequence ends inside and
  // on 64- and 128-row tiles, GQA 4 and 1, specials and large values).
  add(t, {8, 2, 128}, {0, 300, 17, 65, 1, 129, 128, 257}, 0.0, false, K::kNormal, {3});
  add(t, {8, 2, 128}, {63, 130, 200}, 0.0, false, K::kSpecials, {1});
  add(t, {4, 4, 128}, {200, 64, 1}, 0.0, false, K::kLarge, {1});
  // Head dims that are not a power of two (δ's tree padded with +0) or below the kernel tile.
  add(t, {2, 1, 48}, {17, 100, 64}, 0.0, false, K::kNormal, {3});
  add(t, {2, 2, 96}, {65, 1, 130}, 0.0, true, K::kNormal, {1});
  // Specials (±0, subnormals, ±inf, NaN in q, k, v, dout), huge and tiny values, ties.
  add(t, {4, 2, 64}, {1, 17, 64, 65, 130}, 0.0, false, K::kSpecials);
  add(t, {8, 2, 128}, {63, 130}, 0.0, true, K::kSpecials, {1});
  add(t, {2, 1, 32}, {16, 65, 1}, 0.0, false, K::kLarge, {3});
  add(t, {2, 1, 32}, {17, 64, 130}, 0.0, false, K::kSmall, {3});
  add(t, {4, 4, 16}, {15, 65, 300}, 0.0, false, K::kTies, {1});
  // One sequence inside a micro-batch of 256 short ones.
  add(t, {2, 1, 32}, {40, 7}, 0.0, false, K::kNormal, {256}, false);
}

}  // namespace lockstep::cases
