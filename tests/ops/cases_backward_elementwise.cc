// Op-case table, the elementwise backward (docs/contract.md §B.4-B.7): RMSNorm (+ residual, with
// and without the weight gradient, [T, H] and [T, heads, D] rows), RoPE, SiLU-and-mul, embedding.
// Relations: the weight gradients (dweight, dtable) identical for one micro-batch, consecutive
// runs of the canonical order, one sequence per call and shuffled packing with garbage padding
// rows; every token's dx identical wherever it is packed and inside batches of 1 / 3 / 17 (rows
// of garbage around it); in place; thread counts; strided == contiguous.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <sstream>

#include "lockstep/error.h"
#include "ops/cases.h"
#include "ops/row_case.h"

namespace lockstep::cases {
namespace {

// ---- Packed micro-batches of a token case -------------------------------------------------------

// One call's packed rows: src[r] = the global token (canonical index) at packed row r, -1 for a
// padding row (garbage), and the TokenOrder of the sequences it holds.
struct Batch {
  int64_t rows = 0;
  std::vector<int64_t> src;
  TokenOrder order;
};

// Sequences [s0, s1) of `lens` (global step indices s0 ..), packed in order without gaps, or in a
// shuffled order with 0-3 garbage rows before each sequence and after the last.
Batch pack(const std::vector<int64_t>& lens, size_t s0, size_t s1, bool shuffle, uint64_t seed) {
  std::vector<int64_t> start(lens.size() + 1, 0);
  for (size_t i = 0; i < lens.size(); ++i) start[i + 1] = start[i] + lens[i];
  std::vector<size_t> seqs(s1 - s0);
  std::iota(seqs.begin(), seqs.end(), s0);
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int> gap(0, 3);
  if (shuffle) std::shuffle(seqs.begin(), seqs.end(), g);
  Batch b;
  std::vector<TokenSeq> ts;
  for (size_t s : seqs) {
    if (shuffle)
      for (int i = gap(g); i > 0; --i) b.src.push_back(-1);
    ts.push_back({int64_t(s), int64_t(b.src.size()), lens[s]});
    for (int64_t t = 0; t < lens[s]; ++t) b.src.push_back(start[s] + t);
  }
  if (shuffle)
    for (int i = gap(g); i > 0; --i) b.src.push_back(-1);
  b.rows = int64_t(b.src.size());
  b.order = TokenOrder::make("pack", std::move(ts), b.rows);
  return b;
}

// A batch of B garbage rows holding the tokens `picks` at rows B-1, B/2, 0 (B == 1: one token).
Batch around(const std::vector<int64_t>& picks, int64_t B) {
  Batch b;
  b.rows = B;
  b.src.assign(size_t(B), -1);
  const int64_t dst[3] = {B - 1, B / 2, 0};
  for (size_t i = 0; i < picks.size() && i < 3; ++i) b.src[size_t(dst[i])] = picks[i];
  b.order = TokenOrder::make("around", {}, B);
  return b;
}

// The rows of a packed input: token rows of `tok` ([T, E]) where src >= 0, random bit patterns
// (NaNs and infs included) in padding rows; row stride ld >= E.
HostArg gather(const Tensor& tok, const Batch& b, int64_t ld, std::mt19937_64& g) {
  const int64_t E = tok.numel() / std::max<int64_t>(tok.shape()[0], 1);
  const int64_t es = dtype_size(tok.dtype());
  HostArg a = host_rows(tok.dtype(), b.rows, E, ld);
  std::uniform_int_distribution<uint32_t> u8(0, 255);
  for (int64_t r = 0; r < b.rows; ++r) {
    char* dst = static_cast<char*>(a.buf.data()) + r * ld * es;
    if (b.src[size_t(r)] >= 0)
      std::memcpy(dst, static_cast<const char*>(tok.data()) + b.src[size_t(r)] * E * es,
                  size_t(E * es));
    else
      for (int64_t i = 0; i < E * es; ++i) dst[i] = char(u8(g));
  }
  return a;
}

std::string lens_name(const std::vector<int64_t>& lens) {
  const int64_t T = std::accumulate(lens.begin(), lens.end(), int64_t(0));
  std::ostringstream os;
  if (lens.size() > 8) {
    os << "T" << T << "_seqs" << lens.size();
  } else {
    os << "lens";
    for (size_t i = 0; i < lens.size(); ++i) os << (i ? "-" : "") << lens[i];
  }
  return os.str();
}

// Splits of [0, n) sequences into consecutive runs: 3 runs (at most n), one per call.
std::vector<std::pair<std::string, std::vector<size_t>>> splits(size_t n) {
  std::vector<std::pair<std::string, std::vector<size_t>>> v;
  const size_t parts = std::min<size_t>(3, n);
  std::vector<size_t> cuts = {0};
  for (size_t p = 1; p < parts; ++p) cuts.push_back(n * p / parts);
  cuts.push_back(n);
  v.push_back({num(int64_t(parts)) + " consecutive runs", cuts});
  if (n <= 64) {
    std::vector<size_t> each(n + 1);
    std::iota(each.begin(), each.end(), 0);
    v.push_back({"one sequence per call", each});
  } else {
    std::vector<size_t> seven = {0};
    for (size_t p = 1; p < 7; ++p) seven.push_back(n * p / 7);
    seven.push_back(n);
    v.push_back({"7 consecutive runs", seven});
  }
  return v;
}

// ---- Token cases: per-token outputs and one weight-gradient buffer chained over the calls -------

class TokenCase : public OpCase {
 public:
  void build(uint64_t seed) override {
    std::mt19937_64 g(seed);
    build_inputs(g);
  }
  Outputs run(Ops& ops, Mem& mem) const override {
    const Batch b = pack(lens_, 0, lens_.size(), false, 0);
    std::mt19937_64 g(1);
    const TensorView acc = accumulator(mem);
    Outputs o;
    if (const Output tok = call(ops, mem, b, acc_ ? &acc : nullptr, false, g); tok.rows) o = {tok};
    if (acc_) o.push_back(not_by_row(mem.read(acc_name(), acc)));
    return o;
  }
  bool quick() const override { return quick_; }
  std::vector<Relation> relations() const override {
    std::vector<Relation> rel;
    for (const auto& [label, cuts] : splits(lens_.size()))
      for (bool shuffle : {false, true})
        rel.push_back(
            {label + (shuffle ? ", shuffled packing with garbage padding rows" : ""),
             [this, cuts, shuffle](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
               run_split(ops, mem, base, check, cuts, shuffle);
             }});
    rel.push_back({"one micro-batch, shuffled packing with garbage padding rows",
                   [this](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                     run_split(ops, mem, base, check, {0, lens_.size()}, true);
                   }});
    rel.push_back(
        thread_counts_relation([this](Ops& ops, Mem& mem) { return run(ops, mem); }, true));
    return rel;
  }

 protected:
  std::vector<int64_t> lens_;
  int64_t T_ = 0;
  bool acc_ = true;  // the op accumulates a weight gradient (dweight / dtable)
  bool quick_ = true;
  void set_lens(std::vector<int64_t> lens) {
    lens_ = std::move(lens);
    T_ = std::accumulate(lens_.begin(), lens_.end(), int64_t(0));
  }
  virtual void build_inputs(std::mt19937_64& g) = 0;
  virtual std::string acc_name() const = 0;
  // A fresh weight-gradient buffer holding the case's nonzero initial values (unused without).
  virtual TensorView accumulator(Mem& mem) const = 0;
  // The op on one packed batch; acc: the weight gradient to add to (nullptr: none). Returns the
  // per-token output (rows = b.rows; rows == 0: the op has none).
  virtual Output call(Ops& ops, Mem& mem, const Batch& b, const TensorView* acc, bool in_place,
                      std::mt19937_64& g) const = 0;

  // The micro-batches [cuts[i], cuts[i+1]) in order, chaining one weight-gradient buffer: its
  // final bits == base, and every token's output row == its base row.
  void run_split(Ops& ops, Mem& mem, const Outputs& base, const Check& check,
                 const std::vector<size_t>& cuts, bool shuffle) const {
    const TensorView acc = accumulator(mem);
    std::mt19937_64 g(0x5eed + cuts.size() * 2 + shuffle);
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      const Batch b = pack(lens_, cuts[i], cuts[i + 1], shuffle, 77 + i);
      const Output o = call(ops, mem, b, acc_ ? &acc : nullptr, false, g);
      if (o.rows) check_rows(o, b, base[0], check);
    }
    if (acc_)
      check(acc_name(), compare_outputs(not_by_row(mem.read(acc_name(), acc)), base.back()));
  }
  static void check_rows(const Output& got, const Batch& b, const Output& want,
                         const Check& check) {
    for (int64_t r = 0; r < b.rows; ++r) {
      const int64_t t = b.src[size_t(r)];
      if (t < 0) continue;
      check(got.name + " token " + num(t) + " at row " + num(r),
            compare_bits(got.row(r), want.row(t), want.row_elems, want.dtype));
    }
  }
};

// ---- B.4 RMSNorm backward ----------------------------------------------------------------------

class NormBwdCase : public TokenCase {
 public:
  NormBwdCase(std::vector<int64_t> lens, int64_t heads, int64_t D, bool residual, bool dweight,
              bool strided, DataKind kind, bool quick)
      : heads_(heads), D_(D), residual_(residual), strided_(strided), kind_(kind) {
    set_lens(std::move(lens));
    acc_ = dweight;
    quick_ = quick;
  }
  std::string op() const override {
    return residual_ ? "rmsnorm_residual_backward" : "rmsnorm_backward";
  }
  std::string name() const override {
    std::ostringstream os;
    os << op() << "/" << lens_name(lens_) << (heads_ > 1 ? "_heads" + num(heads_) + "_D" : "_H")
       << D_ << (acc_ ? "_dweight" : "") << (strided_ ? "/strided/" : "/contiguous/")
       << data_kind_name(kind_);
    return os.str();
  }
  std::vector<Relation> relations() const override {
    std::vector<Relation> rel = TokenCase::relations();
    std::vector<int64_t> picks = {0, T_ / 2, T_ - 1};
    picks.erase(std::unique(picks.begin(), picks.end()), picks.end());
    for (int64_t B : {int64_t(1), int64_t(3), int64_t(17)})
      rel.push_back({"dx of a row alone / inside a batch of " + num(B),
                     [this, picks, B](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                       std::mt19937_64 g(0xba7c + B);
                       std::vector<std::vector<int64_t>> sets;
                       if (B == 1)
                         for (int64_t p : picks) sets.push_back({p});
                       else
                         sets.push_back(picks);
                       for (const auto& s : sets) {
                         const Batch b = around(s, B);
                         check_rows(call(ops, mem, b, nullptr, false, g), b, base[0], check);
                       }
                     }});
    rel.push_back(
        {residual_ ? "in place: ds = gres" : "in place: dx = gy",
         [this](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
           const Batch b = pack(lens_, 0, lens_.size(), false, 0);
           std::mt19937_64 g(1);
           const TensorView acc = accumulator(mem);
           check_rows(call(ops, mem, b, acc_ ? &acc : nullptr, true, g), b, base[0], check);
           if (acc_)
             check(acc_name(), compare_outputs(not_by_row(mem.read(acc_name(), acc)), base.back()));
         }});
    return rel;
  }

 private:
  int64_t heads_, D_;
  bool residual_, strided_;
  DataKind kind_;
  Tensor s_, gy_, gres_, w_, dw0_;
  void build_inputs(std::mt19937_64& g) override {
    const int64_t E = heads_ * D_;
    s_ = Tensor(DType::kBF16, {T_, E});
    gy_ = Tensor(DType::kF32, {T_, E});
    gres_ = Tensor(DType::kF32, {T_, E});
    fill_bf16(s_.ptr<bf16>(), T_ * E, kind_, g);
    const DataKind gk = kind_ == DataKind::kSpecials ? kind_ : DataKind::kNormal;
    fill_f32(gy_.ptr<float>(), T_ * E, gk, g);
    fill_f32(gres_.ptr<float>(), T_ * E, gk, g);
    w_ = Tensor(DType::kBF16, {D_});
    fill_bf16(w_.ptr<bf16>(), D_, DataKind::kNormal, g);
    dw0_ = Tensor(DType::kF32, {D_});
    fill_f32(dw0_.ptr<float>(), D_, DataKind::kNormal, g);
  }
  std::string acc_name() const override { return "dweight"; }
  TensorView accumulator(Mem& mem) const override {
    return mem.in(host_arg(dw0_));  // a copy
  }
  // [R, E] rows as the op's view: [R, H], or [R, heads, D].
  TensorView rows_view(TensorView v) const { return heads_ > 1 ? heads_view(v, heads_, D_) : v; }
  Output call(Ops& ops, Mem& mem, const Batch& b, const TensorView* acc, bool in_place,
              std::mt19937_64& g) const override {
    const int64_t E = heads_ * D_;
    // strided: s inside a wider (qkv-like) buffer, gy / gres / dx rows with gaps.
    const TensorView s = rows_view(mem.in(gather(s_, b, E + (strided_ ? 2 * D_ + 3 : 0), g)));
    const TensorView gy = rows_view(mem.in(gather(gy_, b, E + (strided_ ? 5 : 0), g)));
    const TensorView w = mem.in(host_arg(w_));
    const RmsNormConfig cfg{1e-6f};
    const TokenOrder* order = acc ? &b.order : nullptr;
    if (!residual_) {
      const TensorView dx =
          in_place ? gy : rows_view(mem.out(DType::kF32, {b.rows, E}, strided_ ? 7 : 0));
      ops.rmsnorm_backward(s, w, cfg, gy, dx, order, acc);
      return mem.read("dx", dx);
    }
    const TensorView gres = rows_view(mem.in(gather(gres_, b, E + (strided_ ? 3 : 0), g)));
    const TensorView ds =
        in_place ? gres : rows_view(mem.out(DType::kF32, {b.rows, E}, strided_ ? 7 : 0));
    ops.rmsnorm_residual_backward(s, w, cfg, gy, gres, ds, order, acc);
    return mem.read("ds", ds);
  }
};

// ---- B.7 Embedding backward --------------------------------------------------------------------

class EmbedBwdCase : public TokenCase {
 public:
  EmbedBwdCase(std::vector<int64_t> lens, int64_t V, int64_t H, DType ids_dt, bool strided,
               DataKind kind, bool quick)
      : V_(V), H_(H), ids_dt_(ids_dt), strided_(strided), kind_(kind) {
    set_lens(std::move(lens));
    quick_ = quick;
  }
  std::string op() const override { return "embedding_backward"; }
  std::string name() const override {
    return "embedding_backward/" + lens_name(lens_) + "_V" + num(V_) + "_H" + num(H_) + "_ids-" +
           dtype_name(ids_dt_) + (strided_ ? "/strided/" : "/contiguous/") + data_kind_name(kind_);
  }

 private:
  int64_t V_, H_;
  DType ids_dt_;
  bool strided_;
  DataKind kind_;
  Tensor ids_, gh_, table0_;
  void build_inputs(std::mt19937_64& g) override {
    ids_ = Tensor(ids_dt_, {T_, 1});
    // Few hot ids (many repeats) and the rest uniform over the vocabulary.
    std::uniform_int_distribution<int64_t> any(0, V_ - 1), hot(0, std::min<int64_t>(V_, 4) - 1);
    std::uniform_int_distribution<int> pick(0, 3);
    for (int64_t t = 0; t < T_; ++t) {
      const int64_t id = pick(g) == 0 ? hot(g) : any(g);
      if (ids_dt_ == DType::kI32)
        ids_.ptr<int32_t>()[t] = int32_t(id);
      else
        ids_.ptr<int64_t>()[t] = id;
    }
    gh_ = Tensor(DType::kF32, {T_, H_});
    fill_f32(gh_.ptr<float>(), T_ * H_, kind_, g);
    table0_ = Tensor(DType::kF32, {V_, H_});
    fill_f32(table0_.ptr<float>(), V_ * H_, DataKind::kNormal, g);
  }
  std::string acc_name() const override { return "dtable"; }
  TensorView accumulator(Mem& mem) const override {
    const int64_t pad = strided_ ? 3 : 0;
    HostArg a = host_rows(DType::kF32, V_, H_, H_ + pad);
    for (int64_t v = 0; v < V_; ++v)
      std::memcpy(a.view.ptr<float>() + v * (H_ + pad), table0_.ptr<float>() + v * H_,
                  size_t(H_) * 4);
    return mem.in(a);
  }
  Output call(Ops& ops, Mem& mem, const Batch& b, const TensorView* acc, bool,
              std::mt19937_64& g) const override {
    // Padding rows: random id bytes (out of range too) and random gh bits; never read.
    const HostArg idrows = gather(ids_, b, 1, g);
    const TensorView ids = mem.in(vector_arg(idrows.buf, strided_ ? 3 : 1));
    const TensorView gh = mem.in(gather(gh_, b, H_ + (strided_ ? 5 : 0), g));
    ops.embedding_backward(ids, gh, b.order, *acc);
    return Output{};
  }
};

// ---- B.5 RoPE backward -------------------------------------------------------------------------

class RopeBwdCase : public RowCase {
 public:
  // strided: gy is the q part of a fused [T, (heads + 8)·D] buffer (outer strides), dx likewise.
  RopeBwdCase(int64_t T, int64_t heads, int64_t D, DType pos_dt, bool strided, DataKind kind)
      : heads_(heads), D_(D), pos_dt_(pos_dt), kind_(kind) {
    T_ = T;
    strided_ = strided;
    RowInput x;
    x.dt = DType::kF32;
    x.elems = heads * D;
    x.kind = kind;
    RowInput p;
    p.dt = pos_dt;
    p.index_hi = kMaxPos;
    inputs_ = {x, p};
  }
  std::string op() const override { return "rope_backward"; }
  std::string name() const override {
    return "rope_backward/T" + num(T_) + "_heads" + num(heads_) + "_D" + num(D_) + "_pos-" +
           dtype_name(pos_dt_) + (strided_ ? "/inside-qkv/" : "/contiguous/") +
           data_kind_name(kind_);
  }
  std::vector<Relation> relations() const override {
    std::vector<Relation> rel = RowCase::relations();
    rel.push_back(
        {"in place: dx = gy", [this](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
           const Output o = compute_in(ops, mem, rows_, T_, strided_, true);
           for (int64_t t = 0; t < T_; ++t)
             check("dx row " + num(t),
                   compare_bits(o.row(t), base[0].row(t), heads_ * D_, DType::kF32));
         }});
    return rel;
  }

 private:
  static constexpr int64_t kMaxPos = 4099;
  int64_t heads_, D_;
  DType pos_dt_;
  DataKind kind_;
  RopeTable table_;
  void build_shared(std::mt19937_64&) override {
    RopeConfig c;
    c.head_dim = D_;
    c.theta = 1e6;
    c.max_positions = kMaxPos;
    table_ = RopeTable::build(c);
  }
  Output compute_in(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T, bool strided,
                    bool in_place) const {
    const int64_t extra = strided ? 8 * D_ : 0;  // the k and v heads beside q
    const TensorView gy = heads_view(mem.in(padded(rows[0], extra)), heads_, D_);
    const TensorView pos = mem.in(vector_arg(rows[1], strided ? 2 : 1));
    const TensorView dx =
        in_place ? gy : heads_view(mem.out(DType::kF32, {T, heads_ * D_}, extra), heads_, D_);
    ops.rope_backward(gy, pos, table_, dx);
    return mem.read("dx", dx);
  }
  Outputs compute(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T,
                  bool strided) const override {
    return {compute_in(ops, mem, rows, T, strided, false)};
  }
};

// ---- B.6 SiLU-and-mul backward -----------------------------------------------------------------

class SiluBwdCase : public RowCase {
 public:
  // strided: gate_up, ga and dgu rows wider than the views.
  SiluBwdCase(int64_t T, int64_t I, bool strided, DataKind kind) : I_(I), kind_(kind) {
    T_ = T;
    strided_ = strided;
    RowInput gu;
    gu.elems = 2 * I;  // [gate | up]
    gu.kind = kind;
    gu.scale = 4.0f;
    RowInput ga;
    ga.dt = DType::kF32;
    ga.elems = I;
    ga.kind = kind == DataKind::kSpecials ? kind : DataKind::kNormal;
    inputs_ = {gu, ga};
  }
  std::string op() const override { return "silu_mul_backward"; }
  std::string name() const override {
    return "silu_mul_backward/T" + num(T_) + "_I" + num(I_) +
           (strided_ ? "/strided/" : "/contiguous/") + data_kind_name(kind_);
  }

 private:
  int64_t I_;
  DataKind kind_;
  void build_shared(std::mt19937_64&) override {}
  Outputs compute(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T,
                  bool strided) const override {
    const TensorView gu = mem.in(padded(rows[0], strided ? 2 * I_ + 1 : 0));
    const TensorView ga = mem.in(padded(rows[1], strided ? 3 : 0));
    const TensorView dgu = mem.out(DType::kF32, {T, 2 * I_}, strided ? 5 : 0);
    ops.silu_mul_backward(gu, ga, dgu);
    return {mem.read("dgu", dgu)};
  }
};

// Many short sequences: more token blocks than one pass of the GPU weight gradient holds.
std::vector<int64_t> many_short(int64_t n) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(1 + (i * 7) % 5);
  return v;
}

}  // namespace

void add_backward_elementwise_cases(CaseList& t) {
  using DK = DataKind;
  auto norm = [&t](std::vector<int64_t> lens, int64_t heads, int64_t D, bool res, bool dw,
                   bool strided, DK kind, bool quick = true) {
    t.push_back(
        std::make_unique<NormBwdCase>(std::move(lens), heads, D, res, dw, strided, kind, quick));
  };
  const std::vector<int64_t> lens = {5, 17, 1, 33};  // blocks of 5, 16 + 1, 1, 32 + 1 positions
  // RMSNorm backward: widths, both forms, with and without the weight gradient.
  for (int64_t H : {1, 3, 17, 111, 128, 136, 1000, 4096}) {
    const std::vector<int64_t> l = H >= 1000 ? std::vector<int64_t>{3, 17, 9} : lens;
    norm(l, 1, H, false, true, H % 2 == 1, DK::kNormal);
    norm(l, 1, H, true, true, H % 2 == 0, DK::kNormal);
  }
  for (bool res : {false, true}) {
    norm(lens, 1, 136, res, false, res, DK::kNormal);
    norm({3, 1, 16}, 1, 17, res, false, !res, DK::kNormal);
  }
  // q/k norm rows [T, heads, D].
  norm(lens, 4, 64, false, true, true, DK::kNormal);
  norm(lens, 2, 128, false, true, false, DK::kNormal);
  norm({9, 20}, 8, 128, false, true, true, DK::kNormal);
  norm({4, 3}, 3, 17, true, true, false, DK::kNormal);
  norm({7}, 4, 64, false, false, true, DK::kNormal);
  // Data kinds: overflowing squares, subnormal products, specials, ties.
  for (DK k : {DK::kLarge, DK::kSmall, DK::kSpecials, DK::kTies}) {
    norm(lens, 1, 136, false, true, false, k);
    norm(lens, 1, 136, true, true, true, k);
    norm({6, 18}, 4, 64, false, true, k != DK::kTies, k);
  }
  // Micro-batch-size invariance at scale: ~4k tokens in 1500 sequences (1500 token blocks).
  norm(many_short(1500), 1, 256, false, true, false, DK::kNormal, false);
  norm({1000, 1, 17, 3000, 77}, 2, 128, true, true, true, DK::kNormal, false);

  // RoPE backward: head dims 2 .. 128, i32 / i64 positions, inside a fused qkv buffer, specials.
  auto rope = [&t](int64_t T, int64_t heads, int64_t D, DType pos, bool strided, DK kind) {
    t.push_back(std::make_unique<RopeBwdCase>(T, heads, D, pos, strided, kind));
  };
  rope(17, 3, 2, DType::kI32, true, DK::kNormal);
  rope(17, 5, 6, DType::kI64, false, DK::kNormal);
  rope(33, 4, 64, DType::kI32, true, DK::kNormal);
  rope(17, 8, 128, DType::kI64, false, DK::kNormal);
  rope(111, 2, 128, DType::kI32, true, DK::kNormal);
  rope(17, 4, 128, DType::kI64, true, DK::kSpecials);
  rope(17, 4, 64, DType::kI32, false, DK::kLarge);
  rope(3, 16, 128, DType::kI64, false, DK::kSmall);

  // SiLU-and-mul backward: I odd and even, strided rows, every data kind.
  auto silu = [&t](int64_t T, int64_t I, bool strided, DK kind) {
    t.push_back(std::make_unique<SiluBwdCase>(T, I, strided, kind));
  };
  for (int64_t I : {1, 3, 17, 111, 1000}) silu(17, I, I % 2 == 1, DK::kNormal);
  silu(300, 136, true, DK::kNormal);
  for (DK k : {DK::kLarge, DK::kSmall, DK::kSpecials, DK::kTies}) silu(17, 136, k != DK::kSmall, k);

  // Embedding backward: small vocabularies (many repeats) and larger ones, i32 / i64 ids,
  // strided ids / gh / dtable, nonzero initial dtable, specials in gh.
  auto embed = [&t](std::vector<int64_t> l, int64_t V, int64_t H, DType dt, bool strided, DK kind,
                    bool quick = true) {
    t.push_back(std::make_unique<EmbedBwdCase>(std::move(l), V, H, dt, strided, kind, quick));
  };
  embed(lens, 1, 1, DType::kI64, false, DK::kNormal);
  embed(lens, 3, 17, DType::kI64, false, DK::kNormal);
  embed(lens, 17, 64, DType::kI32, true, DK::kNormal);
  embed(lens, 1000, 136, DType::kI64, true, DK::kNormal);
  embed({40, 3, 90}, 5000, 64, DType::kI32, false, DK::kNormal);
  embed(lens, 17, 130, DType::kI32, false, DK::kSpecials);
  embed(many_short(1500), 300, 128, DType::kI64, true, DK::kNormal, false);
}

}  // namespace lockstep::cases
