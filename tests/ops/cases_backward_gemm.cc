// Op-case table, §B.3 GEMM backward:
//   gemm_dx     dx = dy·w through the public entry (every S, f32 / bf16 dx, odd T / N / K, strided
//               rows, every data kind); relations: rows alone / in batches (RowCase), threads,
//               layout, and every TP degree t <= S (partials + combine == dx).
//   gemm_dx_tp  the column-parallel TP entry points as the case's own outputs (partial per rank,
//               ranks owning only N padding included, + tree combine).
//   gemm_dw     dw += dyᵀ·x from a nonzero dw, several sequences packed at shuffled offsets with
//               garbage (NaN, inf, huge) in the padding rows and row gaps; relations: one
//               micro-batch == 3 consecutive micro-batches == one sequence per call (continuing the
//               same dw), another shuffled packing, the plain packed layout, and (large cases)
//               micro-batches of ~1k tokens == one micro-batch of ~4k.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "lockstep/error.h"
#include "ops/cases.h"
#include "ops/row_case.h"

namespace lockstep::cases {
namespace {

// ---- dX --------------------------------------------------------------------------------------

struct DxShape {
  int64_t T, N, K;
  int S;
  DType out;
  bool strided;
  DataKind kind;
};

class DxCase : public RowCase {
 public:
  DxCase(DxShape s, int tp) : s_(s), tp_(tp) {
    T_ = s.T;
    strided_ = s.strided;
    RowInput dy;
    dy.elems = s.N;
    dy.kind = s.kind;
    inputs_ = {dy};
  }
  std::string op() const override { return tp_ > 1 ? "gemm_dx_tp" : "gemm_dx"; }
  std::string name() const override {
    return std::string(tp_ > 1 ? "gemm_dx_tp" + num(tp_) : "gemm_dx") + "/T" + num(s_.T) + "_N" +
           num(s_.N) + "_K" + num(s_.K) + "_S" + num(s_.S) + "_out-" + dtype_name(s_.out) +
           (s_.strided ? "/strided/" : "/contiguous/") + data_kind_name(s_.kind);
  }
  bool quick() const override { return s_.T * s_.N * s_.K <= (1 << 22); }
  std::vector<Relation> relations() const override {
    std::vector<Relation> rel = RowCase::relations();
    // Column-parallel TP: every degree t <= S (partials per rank + tree combine) == TP = 1.
    for (int t = 1; t <= s_.S; t *= 2)
      rel.push_back({"TP=" + num(t) + " dx partials + combine == gemm_bf16_dx",
                     [this, t](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                       const Outputs one = full(ops, mem, rows_, T_, strided_);
                       const Outputs tp = tensor_parallel(ops, mem, rows_, T_, strided_, t);
                       const Output& dx = tp_ == 1 ? base[0] : one[0];
                       for (const Output& o : tp)
                         if (o.name == "dx")
                           for (int64_t m = 0; m < T_; ++m)
                             check("dx TP=" + num(t) + " row " + num(m),
                                   compare_bits(o.row(m), dx.row(m), s_.K, s_.out));
                     }});
    return rel;
  }

 private:
  DxShape s_;
  int tp_;
  Tensor w_;
  // Row padding of dy and w in the strided layout: 8 keeps 16-byte row strides where the width
  // allows (the TMA paths on the GPU), 7 never does (the fallback paths).
  static int64_t pad_of(int64_t width, bool strided) {
    return strided ? (width % 8 == 0 ? 8 : 7) : 0;
  }
  void build_shared(std::mt19937_64& g) override {
    w_ = Tensor(DType::kBF16, {s_.N, s_.K});
    fill_bf16(w_.ptr<bf16>(), w_.numel(), s_.kind, g, 0.1f);
  }
  Outputs full(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T, bool strided) const {
    const TensorView dy = mem.in(padded(rows[0], pad_of(s_.N, strided)));
    const TensorView w = mem.in(padded(w_, pad_of(s_.K, strided)));
    const TensorView dx = mem.out(s_.out, {T, s_.K}, strided ? 5 : 0);
    ops.gemm_dx(dy, w, GemmConfig{s_.S}, dx);
    return {mem.read("dx", dx)};
  }
  Outputs compute(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T,
                  bool strided) const override {
    if (tp_ == 1) return full(ops, mem, rows, T, strided);
    return tensor_parallel(ops, mem, rows, T, strided, tp_);
  }
  // Rank r takes the N range of its segments: columns of dy, rows of w.
  Outputs tensor_parallel(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T,
                          bool strided, int tp) const {
    const GemmConfig cfg{s_.S};
    const HostArg dya = padded(rows[0], pad_of(s_.N, strided));
    const HostArg wa = padded(w_, pad_of(s_.K, strided));
    Outputs outs;
    std::vector<TensorView> partials;
    for (int r = 0; r < tp; ++r) {
      const GemmKRange nr = gemm_tp_k_range(cfg, s_.N, tp, r);
      HostArg dys = dya, ws = wa;
      dys.view.data = dya.view.ptr<bf16>() + nr.begin;
      dys.view.shape[1] = nr.end - nr.begin;
      ws.view = wa.view.rows(nr.begin, nr.end);
      const TensorView dxp = mem.out(DType::kF32, {T, s_.K});
      ops.gemm_dx_partial(mem.in(dys), mem.in(ws), s_.N, tp, r, cfg, dxp);
      outs.push_back(mem.read("partial" + num(r), dxp));
      partials.push_back(dxp);
    }
    const TensorView dx = mem.out(s_.out, {T, s_.K}, strided ? 5 : 0);
    ops.gemm_combine(partials, nullptr, dx);
    outs.push_back(mem.read("dx", dx));
    return outs;
  }
};

// ---- dW --------------------------------------------------------------------------------------

struct DwShape {
  int64_t N, K;
  std::vector<int64_t> lens;  // the step's sequences, in step order
  bool strided;               // dy, x and dw rows wider than the views
  DataKind kind;              // dy, x and dw's initial value
  std::string label;
  int64_t mb_tokens = 0;  // > 0: a relation with micro-batches of about this many tokens
  bool quick = true;
};

// A step's sequences packed into one micro-batch buffer: the order, dy [rows, N], x [rows, K].
struct Packed {
  HostArg dy, x;
  std::vector<TokenSeq> seqs;
  int64_t rows = 0;
};

class DwCase : public OpCase {
 public:
  explicit DwCase(DwShape s) : s_(std::move(s)) {}
  std::string op() const override { return "gemm_dw"; }
  std::string name() const override {
    int64_t tokens = 0;
    for (int64_t l : s_.lens) tokens += l;
    return "gemm_dw/N" + num(s_.N) + "_K" + num(s_.K) + "_seqs" + num(int64_t(s_.lens.size())) +
           "_tokens" + num(tokens) + "/" + s_.label + (s_.strided ? "/strided/" : "/contiguous/") +
           data_kind_name(s_.kind);
  }
  bool quick() const override { return s_.quick; }

  void build(uint64_t seed) override {
    std::mt19937_64 g(seed);
    seed_ = seed;
    dy_.clear();
    x_.clear();
    int64_t tokens = 0;
    for (int64_t len : s_.lens) tokens += len;
    for (int64_t len : s_.lens) {
      Tensor dy(DType::kBF16, {len, s_.N}), x(DType::kBF16, {len, s_.K});
      const DataKind k = s_.kind == DataKind::kSpecials ? DataKind::kNormal : s_.kind;
      fill_bf16(dy.ptr<bf16>(), dy.numel(), k, g);
      fill_bf16(x.ptr<bf16>(), x.numel(), k, g);
      if (s_.kind == DataKind::kSpecials) {
        sprinkle(dy, tokens, g);
        sprinkle(x, tokens, g);
      }
      dy_.push_back(std::move(dy));
      x_.push_back(std::move(x));
    }
    // The incoming gradient: nonzero (the chain starts from it), rows padded with NaN bytes in
    // the strided layout (never written).
    const int64_t ld = s_.K + (s_.strided ? 3 : 0);
    dw0_ = host_rows(DType::kF32, s_.N, s_.K, ld);
    std::fill_n(static_cast<uint32_t*>(dw0_.buf.data()), dw0_.buf.numel(), 0x7FA00001u);
    for (int64_t n = 0; n < s_.N; ++n)
      fill_f32(dw0_.view.ptr<float>() + n * ld, s_.K, s_.kind, g, 0.5f);
  }

  Outputs run(Ops& ops, Mem& mem) const override {
    return steps(ops, mem, {all()}, seed_ ^ 0x1234u, /*shuffle=*/true);
  }

  std::vector<Relation> relations() const override {
    std::vector<Relation> rel;
    auto same = [](const std::string& what, const Outputs& got, const Outputs& base,
                   const Check& check) { check(what, compare_outputs(got[0], base[0])); };
    const int64_t n = int64_t(s_.lens.size());
    rel.push_back({"3 consecutive micro-batches == one",
                   [this, n, same](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                     std::vector<std::vector<int64_t>> mbs(3);
                     for (int64_t i = 0; i < n; ++i)
                       mbs[size_t(std::min<int64_t>(2, i * 3 / n))].push_back(i);
                     same("dw", steps(ops, mem, mbs, seed_ ^ 0x77u, true), base, check);
                   }});
    rel.push_back({"one sequence per micro-batch == one",
                   [this, n, same](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                     std::vector<std::vector<int64_t>> mbs;
                     for (int64_t i = 0; i < n; ++i) mbs.push_back({i});
                     same("dw", steps(ops, mem, mbs, seed_ ^ 0x99u, true), base, check);
                   }});
    rel.push_back({"another shuffled packing == base",
                   [this, same](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                     same("dw", steps(ops, mem, {all()}, seed_ ^ 0xABCDu, true), base, check);
                   }});
    rel.push_back({"packed in step order, no gaps == base",
                   [this, same](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                     same("dw", steps(ops, mem, {all()}, seed_, false), base, check);
                   }});
    if (s_.mb_tokens > 0)
      rel.push_back({"micro-batches of ~" + num(s_.mb_tokens) + " tokens == one",
                     [this, n, same](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                       std::vector<std::vector<int64_t>> mbs(1);
                       int64_t tokens = 0;
                       for (int64_t i = 0; i < n; ++i) {
                         if (tokens >= s_.mb_tokens) {
                           mbs.emplace_back();
                           tokens = 0;
                         }
                         mbs.back().push_back(i);
                         tokens += s_.lens[size_t(i)];
                       }
                       same("dw", steps(ops, mem, mbs, seed_ ^ 0x5151u, true), base, check);
                     }});
    return rel;
  }

 private:
  DwShape s_;
  uint64_t seed_ = 0;
  std::vector<Tensor> dy_, x_;
  HostArg dw0_;

  // Specials for a token reduction: ±0 and ±subnormals in 4 % of the elements each, ±inf / NaN
  // rare enough (about 0.3 per column over the step's tokens) that most dw elements stay
  // finite and the chains see every kind of operand.
  static void sprinkle(Tensor& t, int64_t tokens, std::mt19937_64& g) {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::uniform_int_distribution<int> mant(1, 127);
    const double rare = 0.1 / double(std::max<int64_t>(tokens, 1));
    uint16_t* p = reinterpret_cast<uint16_t*>(t.ptr<bf16>());
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double r = u(g);
      if (r < 0.02)
        p[i] = 0x0000;
      else if (r < 0.04)
        p[i] = 0x8000;
      else if (r < 0.06)
        p[i] = uint16_t(mant(g));
      else if (r < 0.08)
        p[i] = uint16_t(0x8000 | mant(g));
      else if (r < 0.08 + rare)
        p[i] = 0x7F80;
      else if (r < 0.08 + 2 * rare)
        p[i] = 0xFF80;
      else if (r < 0.08 + 3 * rare)
        p[i] = 0x7FC0;
    }
  }

  std::vector<int64_t> all() const {
    std::vector<int64_t> v(s_.lens.size());
    std::iota(v.begin(), v.end(), int64_t(0));
    return v;
  }
  // Step index of sequence i: increasing, not consecutive (only their order matters).
  static int64_t step_index(int64_t i) { return 3 * i + 5; }

  // Sequences `ids` in one buffer: shuffle = rows in a random order with 0..3 garbage rows before
  // each (NaN, inf, huge values: never read), else in step order without gaps (one trailing
  // garbage row).
  Packed pack(const std::vector<int64_t>& ids, uint64_t seed, bool shuffle) const {
    std::mt19937_64 g(seed);
    std::vector<int64_t> order = ids;
    std::vector<int64_t> gap(ids.size(), 0);
    if (shuffle) {
      std::shuffle(order.begin(), order.end(), g);
      std::uniform_int_distribution<int64_t> d(0, 3);
      for (int64_t& v : gap) v = d(g);
    }
    int64_t rows = 1;
    for (size_t j = 0; j < order.size(); ++j) rows += gap[j] + s_.lens[size_t(order[j])];
    const int64_t pn = s_.strided ? 5 : 0, pk = s_.strided ? (s_.K % 8 == 0 ? 8 : 3) : 0;
    Packed p;
    p.rows = rows;
    p.dy = host_rows(DType::kBF16, rows, s_.N, s_.N + pn);
    p.x = host_rows(DType::kBF16, rows, s_.K, s_.K + pk);
    // Garbage everywhere first: non-canonical NaN, inf and 2^100 bf16 patterns.
    const uint16_t kGarbage[4] = {0x7FC1, 0x7F80, 0xFF80, 0x7180};
    auto garbage = [&](HostArg& a) {
      uint16_t* b = static_cast<uint16_t*>(a.buf.data());
      for (int64_t i = 0; i < a.buf.numel(); ++i) b[i] = kGarbage[(i * 7 + (i >> 3)) % 4];
    };
    garbage(p.dy);
    garbage(p.x);
    int64_t row = 0;
    for (size_t j = 0; j < order.size(); ++j) {
      row += gap[j];
      const int64_t i = order[j], len = s_.lens[size_t(i)];
      for (int64_t t = 0; t < len; ++t) {
        std::memcpy(p.dy.view.ptr<bf16>() + (row + t) * p.dy.view.stride[0],
                    dy_[size_t(i)].ptr<bf16>() + t * s_.N, size_t(s_.N) * 2);
        std::memcpy(p.x.view.ptr<bf16>() + (row + t) * p.x.view.stride[0],
                    x_[size_t(i)].ptr<bf16>() + t * s_.K, size_t(s_.K) * 2);
      }
      p.seqs.push_back(TokenSeq{step_index(i), row, len});
      row += len;
    }
    return p;
  }

  // dw (from dw0) after the micro-batches `mbs` (consecutive runs of the step order, applied in
  // order, each packed from its own seed), all through Ops::gemm_dw on the same dw buffer.
  Outputs steps(Ops& ops, Mem& mem, const std::vector<std::vector<int64_t>>& mbs, uint64_t seed,
                bool shuffle) const {
    const TensorView dw = mem.in(dw0_);
    GradStep step;
    for (size_t b = 0; b < mbs.size(); ++b) {
      const Packed p = pack(mbs[b], seed + b, shuffle);
      const TokenOrder order = TokenOrder::make("gemm_dw case", p.seqs, p.rows);
      if (!order.empty()) step.accept(order);
      ops.gemm_dw(mem.in(p.dy), mem.in(p.x), order, dw);
    }
    return {not_by_row(mem.read("dw", dw))};
  }
};

}  // namespace

void add_backward_gemm_cases(CaseList& t) {
  const DataKind kKinds[4] = {DataKind::kNormal, DataKind::kLarge, DataKind::kSmall,
                              DataKind::kSpecials};
  // dX: odd and aligned shapes (T, N, K), every S, both dx dtypes, both layouts, every kind.
  const int64_t kDx[][3] = {{3, 17, 111}, {17, 111, 333}, {111, 333, 17}, {1, 989, 3},
                            {5, 1, 1},    {33, 64, 128},  {70, 256, 96},  {130, 96, 64}};
  int i = 0;
  for (const auto& sz : kDx)
    for (int S : {1, 2, 4, 8}) {
      const DType out = (i % 2 == 0) ? DType::kF32 : DType::kBF16;
      const bool strided = (i / 2) % 2 == 1;
      t.push_back(std::make_unique<DxCase>(
          DxShape{sz[0], sz[1], sz[2], S, out, strided, kKinds[i % 4]}, 1));
      ++i;
    }
  t.push_back(std::make_unique<DxCase>(
      DxShape{256, 989, 333, 4, DType::kBF16, true, DataKind::kNormal}, 1));
  // dX TP partials as outputs: odd N, ranks owning only padding (N = 17 at S = 8: 6 of 8).
  const int64_t kTp[][4] = {{17, 17, 33, 8}, {9, 333, 111, 4}, {40, 111, 64, 8}, {3, 989, 17, 2}};
  int j = 0;
  for (const auto& c : kTp)
    for (int tp = 2; tp <= int(c[3]); tp *= 2) {
      const DType out = (j % 2 == 0) ? DType::kBF16 : DType::kF32;
      t.push_back(std::make_unique<DxCase>(
          DxShape{c[0], c[1], c[2], int(c[3]), out, j % 3 == 1, kKinds[j % 4]}, tp));
      ++j;
    }

  // dW: several sequences (lengths off and on the 16-block grid), nonzero dw, every kind.
  t.push_back(std::make_unique<DwCase>(
      DwShape{17, 33, {5, 16, 1, 40, 3}, false, DataKind::kNormal, "mixed"}));
  t.push_back(std::make_unique<DwCase>(
      DwShape{64, 48, {100, 7, 33, 16, 64}, true, DataKind::kSpecials, "mixed"}));
  t.push_back(
      std::make_unique<DwCase>(DwShape{3, 111, {1, 2, 3, 17}, true, DataKind::kLarge, "short"}));
  t.push_back(
      std::make_unique<DwCase>(DwShape{111, 3, {31, 9, 1}, false, DataKind::kSmall, "short"}));
  t.push_back(std::make_unique<DwCase>(
      DwShape{1, 1, {3, 0, 20, 1}, false, DataKind::kSpecials, "one-element"}));
  t.push_back(std::make_unique<DwCase>(
      DwShape{128, 96, {37, 200, 5, 64, 91, 16, 1, 130}, true, DataKind::kNormal, "mixed"}));
  // No tokens: dw untouched.
  t.push_back(
      std::make_unique<DwCase>(DwShape{5, 7, {0, 0}, true, DataKind::kNormal, "no-tokens"}));
  // Large: ~1k tokens; ~4k tokens split into ~1k micro-batches (the GPU's micro-batch-size
  // invariance); more slots than one GPU gather chunk (8192), chained through the stored dw.
  {
    std::vector<int64_t> lens;
    std::mt19937_64 g(42);
    std::uniform_int_distribution<int64_t> d(1, 300);
    int64_t tok = 0;
    while (tok < 1024) tok += lens.emplace_back(d(g));
    t.push_back(std::make_unique<DwCase>(
        DwShape{256, 256, lens, false, DataKind::kNormal, "1k", 0, false}));
    while (tok < 4096) tok += lens.emplace_back(d(g));
    t.push_back(std::make_unique<DwCase>(
        DwShape{256, 256, lens, true, DataKind::kNormal, "4k-in-1k", 1024, false}));
    while (tok < 10000) tok += lens.emplace_back(d(g));
    t.push_back(std::make_unique<DwCase>(
        DwShape{64, 80, lens, false, DataKind::kNormal, "10k-chunks", 4096, false}));
  }
}

}  // namespace lockstep::cases
