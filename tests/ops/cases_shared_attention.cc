// Op-case table, attention over shared-prompt groups (docs/contract.md §B.11): GRPO groups (a
// prompt and G completions) and unshared sequences mixed, their segments packed in canonical,
// reversed or shuffled order; attention_prefill_shared, then attention_backward_shared on the
// forward's out / lse, on the same backend. Outputs {out, lse, dq, dk, dv}. Relations: each group
// alone (its segments in the same relative order) == packed; the unshared packing (prompt +
// completion as one sequence of the varlen ops): every row's out / lse, a standalone sequence's
// gradients, and for finite inputs a completion's dq / dk / dv and a prompt's dq (with G = 1 and a
// prompt of a multiple of 16 tokens, the prompt's dk / dv too); thread counts 1 and 3.
#include <algorithm>
#include <numeric>
#include <sstream>

#include "ops/attn_rows.h"
#include "ops/cases.h"
#include "ops/row_case.h"

namespace lockstep::cases {
namespace {

enum class Placement { kCanonical, kReversed, kShuffled };
const char* placement_name(Placement p) {
  switch (p) {
    case Placement::kCanonical:
      return "canonical";
    case Placement::kReversed:
      return "reversed";
    case Placement::kShuffled:
      return "shuffled";
  }
  return "?";
}

constexpr size_t kOut = 0, kLse = 1, kDq = 2, kDk = 3, kDv = 4;  // the outputs

class SharedAttentionCase : public OpCase {
 public:
  SharedAttentionCase(AttnDims d, int kv_chunk, std::vector<SharedGroup> groups, Placement place,
                      bool strided, DataKind kind, bool quick)
      : d_(d),
        groups_(std::move(groups)),
        place_(place),
        strided_(strided),
        kind_(kind),
        quick_(quick) {
    cfg_.kv_chunk = kv_chunk;
    // Segments: per group its prompt, then its completions (the canonical packing).
    for (size_t g = 0; g < groups_.size(); ++g) {
      seg_.push_back({g, -1, groups_[g].prompt});
      for (size_t c = 0; c < groups_[g].completions.size(); ++c)
        seg_.push_back({g, int64_t(c), groups_[g].completions[c]});
    }
    order_.resize(seg_.size());
    std::iota(order_.begin(), order_.end(), size_t(0));
    if (place_ == Placement::kReversed) std::reverse(order_.begin(), order_.end());
    if (place_ == Placement::kShuffled) {
      std::mt19937_64 g(0x5eed);  // fixed: the placement is part of the case
      std::shuffle(order_.begin(), order_.end(), g);
    }
  }
  std::string op() const override { return "attention_shared"; }
  std::string name() const override {
    std::ostringstream os;
    os << op() << "/Hq" << d_.Hq << "_Hkv" << d_.Hkv << "_D" << d_.D << "_chunk" << cfg_.kv_chunk;
    for (const SharedGroup& g : groups_) {
      os << "_P" << g.prompt;
      for (int64_t c : g.completions) os << "-" << c;
    }
    os << "_" << placement_name(place_) << (strided_ ? "/strided/" : "/contiguous/")
       << data_kind_name(kind_);
    return os.str();
  }
  bool quick() const override { return quick_; }

  void build(uint64_t seed) override {
    std::mt19937_64 g(seed);
    rows_.clear();
    for (const Seg& s : seg_) rows_.push_back(make_attn_rows(d_, s.len, kind_, g));
  }

  Outputs run(Ops& ops, Mem& mem) const override { return run_order(ops, mem, order_, strided_); }

  std::vector<Relation> relations() const override {
    std::vector<Relation> rel;
    rel.push_back({"each group alone == packed",
                   [this](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                     const std::vector<int64_t> at = offsets(order_);
                     for (size_t g = 0; g < groups_.size(); ++g) {
                       std::vector<size_t> mine;
                       for (size_t s : order_)
                         if (seg_[s].group == g) mine.push_back(s);
                       const Outputs got = run_order(ops, mem, mine, false);
                       const std::vector<int64_t> got_at = offsets(mine);
                       for (size_t s : mine)
                         check_rows(check,
                                    "group " + num(int64_t(g)) + " segment " + num(int64_t(s)), got,
                                    got_at[s], base, at[s], seg_[s].len);
                     }
                   }});
    rel.push_back({"the unshared packing (prompt + completion as one sequence)",
                   [this](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                     check_unshared(ops, mem, base, check);
                   }});
    rel.push_back(thread_counts_relation([this](Ops& ops, Mem& mem) { return run(ops, mem); }));
    return rel;
  }

 private:
  struct Seg {
    size_t group;
    int64_t completion;  // -1: the group's prompt (or its sequence, without completions)
    int64_t len;
  };
  AttnDims d_;
  AttentionConfig cfg_;
  std::vector<SharedGroup> groups_;
  Placement place_;
  bool strided_;
  DataKind kind_;
  bool quick_;
  std::vector<Seg> seg_;
  std::vector<size_t> order_;   // segments in packing order
  std::vector<AttnRows> rows_;  // per segment

  // First packed row of each segment (indexed by segment) in a packing of `order`.
  std::vector<int64_t> offsets(const std::vector<size_t>& order) const {
    std::vector<int64_t> at(seg_.size(), 0);
    int64_t t = 0;
    for (size_t s : order) {
      at[s] = t;
      t += seg_[s].len;
    }
    return at;
  }

  // The segments `order` packed in that order (each completion's prompt among them).
  Outputs run_order(Ops& ops, Mem& mem, const std::vector<size_t>& order, bool strided) const {
    std::vector<int64_t> index(seg_.size(), -1);
    for (size_t i = 0; i < order.size(); ++i) index[order[i]] = int64_t(i);
    std::vector<const AttnRows*> pack;
    std::vector<int32_t> prompt_of;
    for (size_t s : order) {
      pack.push_back(&rows_[s]);
      const size_t prompt = prompt_segment(seg_[s].group);
      prompt_of.push_back(seg_[s].completion < 0 ? -1 : int32_t(index[prompt]));
    }
    return run_attention_pack(ops, mem, d_, cfg_, pack, prompt_of, strided);
  }
  size_t prompt_segment(size_t g) const {
    size_t s = 0;
    while (seg_[s].group != g) ++s;
    return s;
  }

  // Every group's unshared sequences (its prompt alone without completions, else prompt +
  // completion c for each c) packed in one varlen call, compared with the shared rows.
  void check_unshared(Ops& ops, Mem& mem, const Outputs& base, const Check& check) const {
    const std::vector<int64_t> at = offsets(order_);
    std::vector<AttnRows> seqs;
    struct Seq {
      size_t prompt, seg;  // segments: the prompt, the completion (== prompt: none)
    };
    std::vector<Seq> what;
    for (size_t s = 0; s < seg_.size(); ++s) {
      const size_t p = prompt_segment(seg_[s].group);
      if (seg_[s].completion >= 0) {
        seqs.push_back(join_rows(d_, rows_[p], rows_[s]));
        what.push_back({p, s});
      } else if (groups_[seg_[s].group].completions.empty()) {
        seqs.push_back(join_rows(d_, rows_[p], AttnRows{}));
        what.push_back({p, p});
      }
    }
    std::vector<const AttnRows*> pack;
    for (const AttnRows& r : seqs) pack.push_back(&r);
    const Outputs got = run_attention_pack(ops, mem, d_, cfg_, pack, {}, false);
    // §B.11: completions' gradients and prompts' dq are the unshared bits for finite inputs (the
    // masked entries the two forms take differently are then exact zeros).
    const bool finite = kind_ != DataKind::kSpecials;
    int64_t t = 0;
    for (const Seq& x : what) {
      const SharedGroup& g = groups_[seg_[x.prompt].group];
      const int64_t P = seg_[x.prompt].len, C = x.seg == x.prompt ? 0 : seg_[x.seg].len;
      const std::string name = "segment " + num(int64_t(x.seg));
      if (x.seg == x.prompt) {
        check_rows(check, name + " (unshared sequence)", got, t, base, at[x.prompt], P);
      } else {
        check_rows(check, name + " prompt rows", got, t, base, at[x.prompt], P, {kOut, kLse});
        check_rows(check, name + " completion rows", got, t + P, base, at[x.seg], C,
                   finite ? std::vector<size_t>{} : std::vector<size_t>{kOut, kLse});
        if (finite) check_rows(check, name + " prompt dq", got, t, base, at[x.prompt], P, {kDq});
        if (finite && g.completions.size() == 1 && P % 16 == 0)
          check_rows(check, name + " prompt dk / dv (G = 1)", got, t, base, at[x.prompt], P,
                     {kDk, kDv});
      }
      t += P + C;
    }
  }
};

void add(CaseList& t, AttnDims d, int kv_chunk, std::vector<SharedGroup> groups, Placement place,
         bool strided = false, DataKind kind = DataKind::kNormal, bool quick = true) {
  t.push_back(std::make_unique<SharedAttentionCase>(d, kv_chunk, std::move(groups), place, strided,
                                                    kind, quick));
}

}  // namespace

void add_shared_attention_cases(CaseList& t) {
  using P = Placement;
  using K = DataKind;
  // G = 1, 3, 5 completions of 1 … 130 rows after prompts of 100 (not a multiple of 16), 64 and
  // 128 (multiples of 64) rows, an unshared sequence among them; GQA 4 and 1; head dims 64, 128.
  add(t, {8, 2, 64}, 64, {{100, {1, 15, 70}}, {37, {}}, {64, {5}}, {128, {65, 64, 1, 130, 17}}},
      P::kShuffled);
  add(t, {4, 1, 128}, 128, {{130, {17, 64}}, {16, {80}}, {50, {}}, {3, {1, 2, 100, 66, 9}}},
      P::kReversed, true);
  add(t, {4, 4, 64}, 1024, {{64, {200}}, {17, {3, 45}}, {200, {}}, {80, {1}}}, P::kShuffled);
  add(t, {2, 2, 128}, 64, {{48, {16, 33}}, {0, {5, 70}}, {40, {7, 0, 19}}}, P::kCanonical, true);
  // A prompt past several 64-key blocks with completions across more of them.
  add(t, {8, 2, 128}, 128, {{300, {129, 64, 1, 200, 2}}, {65, {}}}, P::kShuffled, false, K::kNormal,
      false);
  // Head dims of the generic kernels (not a power of two; below the tuned tile).
  add(t, {4, 2, 32}, 64, {{77, {5, 64, 20}}, {16, {100}}, {9, {}}}, P::kShuffled);
  add(t, {2, 1, 48}, 64, {{33, {31, 1}}, {20, {}}, {64, {64}}}, P::kReversed, true);
  // Specials (±0, subnormals, ±inf, NaN), huge and tiny values, ties.
  add(t, {8, 2, 64}, 64, {{100, {1, 70}}, {30, {}}, {64, {65, 3}}}, P::kShuffled, false,
      K::kSpecials);
  add(t, {4, 1, 128}, 128, {{17, {40, 2}}, {80, {64}}}, P::kReversed, true, K::kSpecials);
  add(t, {2, 1, 32}, 64, {{40, {17, 65}}, {16, {}}}, P::kShuffled, false, K::kLarge);
  add(t, {2, 1, 32}, 64, {{40, {17, 65}}, {16, {}}}, P::kShuffled, false, K::kSmall);
  add(t, {4, 4, 16}, 64, {{65, {15, 64}}, {1, {1}}}, P::kReversed, false, K::kTies);
}

}  // namespace lockstep::cases
