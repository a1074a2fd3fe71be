// The op-case table: every case of every op (GEMM incl. TP partial + combine, RMSNorm (+residual),
// RoPE, SiLU-and-mul, embedding (+ vocab-parallel combine), attention in every mode,
// kv_cache_write, linear log-prob (+ partial / combine), sampling), with the invariance relations
// of each. Sizes are the odd ones (1, 3, 17, 111, 989) next to real model widths; layouts are
// contiguous or strided (rows wider than the view, q/k inside a fused qkv buffer, column shards).
#include <algorithm>
#include <cstring>
#include <numeric>
#include <sstream>

#include "core/thread_pool.h"
#include "lockstep/error.h"
#include "ops/op_case.h"

namespace lockstep::cases {
namespace {

std::string S(int64_t v) { return std::to_string(v); }

// Copies a contiguous [R, E] tensor into a [R, E + pad] buffer (pad 0: a contiguous copy).
HostArg padded(const Tensor& t, int64_t pad) {
  const int64_t R = t.shape()[0], E = t.numel() / std::max<int64_t>(R, 1);
  const int64_t es = dtype_size(t.dtype());
  HostArg a = host_rows(t.dtype(), R, E, E + pad);
  for (int64_t r = 0; r < R; ++r)
    std::memcpy(static_cast<char*>(a.buf.data()) + r * (E + pad) * es,
                static_cast<const char*>(t.data()) + r * E * es, size_t(E * es));
  return a;
}

// A [T] view of a [T, 1] row input (stride `step` >= 1 puts the values in a wider buffer).
HostArg vector_arg(const Tensor& t, int64_t step) {
  const int64_t T = t.shape()[0];
  HostArg a = padded(t, step - 1);
  a.view.ndim = 1;
  a.view.shape[0] = T;
  a.view.stride[0] = step;
  return a;
}

// [T, heads·D] row input seen as [T, heads, D] (rows of the buffer may be wider).
TensorView heads_view(TensorView v, int64_t heads, int64_t D) {
  const int64_t ld = v.stride[0];
  v.ndim = 3;
  v.shape[1] = heads;
  v.shape[2] = D;
  v.stride[0] = ld;
  v.stride[1] = D;
  v.stride[2] = 1;
  return v;
}

Output not_by_row(Output o) {
  o.rows = 0;  // compared whole only (not a per-token buffer)
  return o;
}

// ---- Row-wise cases ----------------------------------------------------------------------------

// A per-token input of a row-wise case: [T, elems], dim 0 = tokens.
struct RowInput {
  DType dt = DType::kBF16;
  int64_t elems = 1;
  DataKind kind = DataKind::kNormal;
  float scale = 1.0f;
  int64_t index_lo = 0, index_hi = 0;  // index_hi > 0: integer values in [index_lo, index_hi)
  int64_t special_index = 0;           // with some probability this value (ignore_index, ...)
  bool has_special_index = false;
};

// A case whose every output row t depends only on input row t (and shared inputs): relations are
// "row alone / inside batches of 1, 3, 17, 256 at other positions with other rows' contents
// changed", "thread counts 1 and 3" and, for a strided case, "strided layout == contiguous".
class RowCase : public OpCase {
 public:
  void build(uint64_t seed) override {
    std::mt19937_64 g(seed);
    build_shared(g);
    rows_.clear();
    for (const RowInput& in : inputs_) {
      Tensor t(in.dt, {T_, in.elems});
      for (int64_t r = 0; r < T_; ++r) fill_row(in, t, r, g);
      rows_.push_back(std::move(t));
    }
  }
  Outputs run(Ops& ops, Mem& mem) const override { return compute(ops, mem, rows_, T_, strided_); }
  std::vector<Relation> relations() const override;

 protected:
  int64_t T_ = 1;
  std::vector<RowInput> inputs_;
  std::vector<Tensor> rows_;
  virtual void build_shared(std::mt19937_64& g) = 0;
  bool strided_ = false;  // the case's layout: strided / fused views (false: plain contiguous)
  // The op on T rows; `strided` picks the case's layout or the plain contiguous one.
  virtual Outputs compute(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T,
                          bool strided) const = 0;

  static void fill_row(const RowInput& in, const Tensor& t, int64_t r, std::mt19937_64& g) {
    char* p = static_cast<char*>(t.data()) + r * in.elems * dtype_size(in.dt);
    if (in.index_hi > 0) {
      std::uniform_int_distribution<int64_t> d(in.index_lo, in.index_hi - 1);
      std::uniform_int_distribution<int> pick(0, 9);
      for (int64_t i = 0; i < in.elems; ++i) {
        const int64_t v = in.has_special_index && pick(g) == 0 ? in.special_index : d(g);
        if (in.dt == DType::kI32)
          reinterpret_cast<int32_t*>(p)[i] = int32_t(v);
        else
          reinterpret_cast<int64_t*>(p)[i] = v;
      }
    } else if (in.dt == DType::kBF16) {
      fill_bf16(reinterpret_cast<bf16*>(p), in.elems, in.kind, g, in.scale);
    } else {
      fill_f32(reinterpret_cast<float*>(p), in.elems, in.kind, g, in.scale);
    }
  }
};

std::vector<Relation> RowCase::relations() const {
  std::vector<Relation> rel;
  // Rows picked from the base batch, and where they go in each new batch.
  std::vector<int64_t> picks = {0, T_ / 2, T_ - 1};
  std::sort(picks.begin(), picks.end());
  picks.erase(std::unique(picks.begin(), picks.end()), picks.end());
  for (int64_t B : {int64_t(1), int64_t(3), int64_t(17), int64_t(256)}) {
    rel.push_back(
        {"rows in a batch of " + S(B),
         [this, B, picks](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
           std::mt19937_64 g(0x5eed0000u + uint64_t(B));
           // B == 1: each picked row alone; otherwise one batch holding the picked rows at
           // positions B-1, B/2, 0 (reversed order) among fresh rows.
           std::vector<std::vector<std::pair<int64_t, int64_t>>> batches;  // (src row, dst pos)
           if (B == 1) {
             for (int64_t r : picks) batches.push_back({{r, 0}});
           } else {
             std::vector<std::pair<int64_t, int64_t>> b;
             const int64_t dst[3] = {B - 1, B / 2, 0};
             for (size_t i = 0; i < picks.size(); ++i) b.push_back({picks[i], dst[i]});
             batches.push_back(b);
           }
           for (const auto& batch : batches) {
             std::vector<Tensor> rows;
             for (size_t i = 0; i < inputs_.size(); ++i) {
               const RowInput& in = inputs_[i];
               Tensor t(in.dt, {B, in.elems});
               for (int64_t r = 0; r < B; ++r) fill_row(in, t, r, g);
               const int64_t rb = in.elems * dtype_size(in.dt);
               for (auto [src, dst] : batch)
                 std::memcpy(static_cast<char*>(t.data()) + dst * rb,
                             static_cast<const char*>(rows_[i].data()) + src * rb, size_t(rb));
               rows.push_back(std::move(t));
             }
             const Outputs got = compute(ops, mem, rows, B, strided_);
             for (size_t o = 0; o < got.size(); ++o) {
               if (base[o].rows == 0) continue;
               for (auto [src, dst] : batch)
                 check(got[o].name + " row " + S(src) + " at " + S(dst) + " of " + S(B),
                       compare_bits(got[o].row(dst), base[o].row(src), base[o].row_elems,
                                    base[o].dtype));
             }
           }
         }});
  }
  rel.push_back({"thread counts 1 and 3",
                 [this](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                   const int saved = num_threads();
                   for (int n : {1, 3}) {
                     set_num_threads(n);
                     const Outputs got = compute(ops, mem, rows_, T_, strided_);
                     for (size_t o = 0; o < got.size(); ++o)
                       check(got[o].name + " threads=" + S(n), compare_outputs(got[o], base[o]));
                   }
                   set_num_threads(saved);
                 }});
  if (strided_)
    rel.push_back(
        {"strided layout == contiguous",
         [this](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
           const Outputs got = compute(ops, mem, rows_, T_, false);
           for (size_t o = 0; o < got.size(); ++o) {
             if (base[o].rows == 0) continue;
             for (int64_t t = 0; t < T_; ++t)
               check(got[o].name + " row " + S(t),
                     compare_bits(got[o].row(t), base[o].row(t), base[o].row_elems, base[o].dtype));
           }
         }});
  return rel;
}

// ---- GEMM --------------------------------------------------------------------------------------

enum class Bias { kNone, kBF16, kF32 };
const char* bias_name(Bias b) {
  return b == Bias::kNone ? "none" : b == Bias::kBF16 ? "bf16" : "f32";
}

struct GemmShape {
  int64_t M, N, K;
  int S;
  Bias bias;
  DType out;
  bool strided;
  DataKind kind;
};

class GemmCase : public RowCase {
 public:
  explicit GemmCase(GemmShape s, int tp = 1) : s_(s), tp_(tp) {
    T_ = s.M;
    strided_ = s.strided;
    RowInput x;
    x.elems = s.K;
    x.kind = s.kind;
    inputs_ = {x};
  }
  std::string op() const override { return tp_ > 1 ? "gemm_tp" : "gemm"; }
  std::string name() const override {
    return std::string(tp_ > 1 ? "gemm_tp" + S(tp_) : "gemm") + "/M" + S(s_.M) + "_N" + S(s_.N) +
           "_K" + S(s_.K) + "_S" + S(s_.S) + "_bias-" + bias_name(s_.bias) + "_out-" +
           dtype_name(s_.out) + (s_.strided ? "/strided/" : "/contiguous/") +
           data_kind_name(s_.kind);
  }
  bool has_scalar_spec() const override { return tp_ == 1; }
  bool quick() const override { return s_.M * s_.N * s_.K <= (1 << 22); }
  std::vector<Relation> relations() const override {
    std::vector<Relation> rel = RowCase::relations();
    // Row-parallel TP: every degree t <= S (partials per rank + tree combine) == TP = 1.
    for (int t = 1; t <= s_.S; t *= 2)
      rel.push_back({"TP=" + S(t) + " partials + combine == gemm_bf16_nt",
                     [this, t](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                       const Outputs one = full(ops, mem, rows_, T_, strided_);
                       const Outputs tp = tensor_parallel(ops, mem, rows_, T_, strided_, t);
                       // base: {y} for the public entry, {partials.., y[, y in place]} for TP.
                       const Output& y = tp_ == 1 ? base[0] : one[0];
                       for (const Output& o : tp)
                         if (o.name == "y" || o.name == "y in place")
                           for (int64_t m = 0; m < T_; ++m)
                             check(o.name + " TP=" + S(t) + " row " + S(m),
                                   compare_bits(o.row(m), y.row(m), s_.N, s_.out));
                     }});
    return rel;
  }

 private:
  GemmShape s_;
  int tp_;
  Tensor w_, b_;
  // Row padding of x and w in the strided layout: 8 keeps 16-byte row strides where K allows (the
  // TMA paths on the GPU), 7 never does (the fallback paths).
  int64_t xw_pad(bool strided) const { return strided ? (s_.K % 8 == 0 ? 8 : 7) : 0; }
  void build_shared(std::mt19937_64& g) override {
    w_ = Tensor(DType::kBF16, {s_.N, s_.K});
    fill_bf16(w_.ptr<bf16>(), w_.numel(), s_.kind, g, 0.1f);
    if (s_.bias == Bias::kBF16) {
      b_ = Tensor(DType::kBF16, {s_.N});
      fill_bf16(b_.ptr<bf16>(), s_.N, s_.kind, g);
    } else if (s_.bias == Bias::kF32) {
      b_ = Tensor(DType::kF32, {s_.N});
      fill_f32(b_.ptr<float>(), s_.N, s_.kind, g);
    }
  }
  Outputs full(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T, bool strided) const {
    const int64_t pad = xw_pad(strided);
    const TensorView x = mem.in(padded(rows[0], pad)), w = mem.in(padded(w_, pad));
    TensorView bias;
    if (s_.bias != Bias::kNone) bias = mem.in(host_arg(b_));
    const TensorView y = mem.out(s_.out, {T, s_.N}, strided ? 5 : 0);
    ops.gemm(x, w, s_.bias != Bias::kNone ? &bias : nullptr, GemmConfig{s_.S}, y);
    return {mem.read("y", y)};
  }
  Outputs compute(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T,
                  bool strided) const override {
    if (tp_ == 1) return full(ops, mem, rows, T, strided);
    return tensor_parallel(ops, mem, rows, T, strided, tp_);
  }
  // Row-parallel TP: rank r takes the K columns of its segments (column views of x and w).
  Outputs tensor_parallel(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T,
                          bool strided, int tp) const {
    const GemmConfig cfg{s_.S};
    const int64_t pad = xw_pad(strided);
    const HostArg xa = padded(rows[0], pad), wa = padded(w_, pad);
    Outputs outs;
    std::vector<TensorView> partials;
    for (int r = 0; r < tp; ++r) {
      const GemmKRange kr = gemm_tp_k_range(cfg, s_.K, tp, r);
      HostArg xs = xa, ws = wa;
      xs.view.data = xa.view.ptr<bf16>() + kr.begin;
      xs.view.shape[1] = kr.end - kr.begin;
      ws.view.data = wa.view.ptr<bf16>() + kr.begin;
      ws.view.shape[1] = kr.end - kr.begin;
      const TensorView yp = mem.out(DType::kF32, {T, s_.N});
      ops.gemm_partial(mem.in(xs), mem.in(ws), s_.K, tp, r, cfg, yp);
      outs.push_back(mem.read("partial" + S(r), yp));
      partials.push_back(yp);
    }
    TensorView bias;
    if (s_.bias != Bias::kNone) bias = mem.in(host_arg(b_));
    const TensorView y = mem.out(s_.out, {T, s_.N}, strided ? 5 : 0);
    ops.gemm_combine(partials, s_.bias != Bias::kNone ? &bias : nullptr, y);
    outs.push_back(mem.read("y", y));
    if (s_.out == DType::kF32) {  // an f32 combine may run in place, into the last partial
      ops.gemm_combine(partials, s_.bias != Bias::kNone ? &bias : nullptr, partials.back());
      Output o = mem.read("y in place", partials.back());
      outs.push_back(o);
    }
    return outs;
  }
};

// ---- RMSNorm -----------------------------------------------------------------------------------

class RmsNormCase : public RowCase {
 public:
  RmsNormCase(int64_t T, int64_t H, bool residual, bool strided, DataKind kind, float scale = 1.0f)
      : H_(H), residual_(residual), kind_(kind), scale_(scale) {
    T_ = T;
    strided_ = strided;
    RowInput x;
    x.elems = H;
    x.kind = kind;
    x.scale = scale;
    inputs_ = {x};
    if (residual) inputs_.push_back(x);
  }
  std::string op() const override { return residual_ ? "rmsnorm_residual" : "rmsnorm"; }
  std::string name() const override {
    std::ostringstream os;
    os << op() << "/T" << T_ << "_H" << H_ << "_scale" << scale_
       << (strided_ ? "/strided/" : "/contiguous/") << data_kind_name(kind_);
    return os.str();
  }

 private:
  int64_t H_;
  bool residual_;
  DataKind kind_;
  float scale_;
  Tensor w_;
  void build_shared(std::mt19937_64& g) override {
    w_ = Tensor(DType::kBF16, {H_});
    fill_bf16(w_.ptr<bf16>(), H_, DataKind::kNormal, g);
  }
  Outputs compute(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T,
                  bool strided) const override {
    const int64_t pad = strided ? 9 : 0;
    const RmsNormConfig cfg{1e-6f};
    const TensorView x = mem.in(padded(rows[0], pad)), w = mem.in(host_arg(w_));
    const TensorView y = mem.out(DType::kBF16, {T, H_}, strided ? 3 : 0);
    if (!residual_) {
      ops.rmsnorm(x, w, cfg, y);
      return {mem.read("y", y)};
    }
    const TensorView res = mem.in(padded(rows[1], pad));
    const TensorView res_out = mem.out(DType::kBF16, {T, H_}, strided ? 5 : 0);
    ops.rmsnorm_residual(x, res, w, cfg, res_out, y);
    return {mem.read("y", y), mem.read("residual_out", res_out)};
  }
};

// ---- RoPE --------------------------------------------------------------------------------------

class RopeCase : public RowCase {
 public:
  // qkv: x is the q part of a fused [T, (heads + 2·4)·D] buffer (outer strides), y likewise.
  RopeCase(int64_t T, int64_t heads, int64_t D, DType pos_dt, bool qkv, DataKind kind)
      : heads_(heads), D_(D), pos_dt_(pos_dt), kind_(kind) {
    T_ = T;
    strided_ = qkv;
    RowInput x;
    x.elems = heads * D;
    x.kind = kind;
    RowInput p;
    p.dt = pos_dt;
    p.index_hi = kMaxPos;
    inputs_ = {x, p};
  }
  std::string op() const override { return "rope"; }
  std::string name() const override {
    return "rope/T" + S(T_) + "_heads" + S(heads_) + "_D" + S(D_) + "_pos-" + dtype_name(pos_dt_) +
           (strided_ ? "/inside-qkv/" : "/contiguous/") + data_kind_name(kind_);
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
  Outputs compute(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T,
                  bool strided) const override {
    const int64_t extra = strided ? 8 * D_ : 0;  // the k and v heads beside q
    const TensorView x = heads_view(mem.in(padded(rows[0], extra)), heads_, D_);
    const TensorView pos = mem.in(vector_arg(rows[1], 1));
    const TensorView y = heads_view(mem.out(DType::kBF16, {T, heads_ * D_}, extra), heads_, D_);
    ops.rope(x, pos, table_, y);
    Output o = mem.read("y", y);
    o.row_elems = heads_ * D_;
    return {o};
  }
};

// ---- SiLU-and-mul ------------------------------------------------------------------------------

class SiluCase : public RowCase {
 public:
  // fused: gate and up are the two halves of one [T, 2I] gate_up buffer.
  SiluCase(int64_t T, int64_t I, bool fused, DataKind kind) : I_(I), kind_(kind) {
    T_ = T;
    strided_ = fused;
    RowInput g;
    g.elems = 2 * I;  // [gate | up]
    g.kind = kind;
    g.scale = 4.0f;
    inputs_ = {g};
  }
  std::string op() const override { return "silu_mul"; }
  std::string name() const override {
    return "silu_mul/T" + S(T_) + "_I" + S(I_) + (strided_ ? "/fused-gate-up/" : "/separate/") +
           data_kind_name(kind_);
  }

 private:
  int64_t I_;
  DataKind kind_;
  void build_shared(std::mt19937_64&) override {}
  Outputs compute(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T,
                  bool strided) const override {
    TensorView gate, up;
    if (strided) {
      HostArg gu = padded(rows[0], 0);
      HostArg u = gu;
      gu.view.shape[1] = I_;
      u.view.shape[1] = I_;
      u.view.data = gu.view.ptr<bf16>() + I_;
      gate = mem.in(gu);
      up = mem.in(u);
    } else {
      Tensor g(DType::kBF16, {T, I_}), u(DType::kBF16, {T, I_});
      for (int64_t t = 0; t < T; ++t) {
        std::memcpy(g.ptr<bf16>() + t * I_, rows[0].ptr<bf16>() + t * 2 * I_, size_t(I_) * 2);
        std::memcpy(u.ptr<bf16>() + t * I_, rows[0].ptr<bf16>() + t * 2 * I_ + I_, size_t(I_) * 2);
      }
      gate = mem.in(padded(g, 0));
      up = mem.in(padded(u, 0));
    }
    const TensorView out = mem.out(DType::kBF16, {T, I_}, strided ? 1 : 0);
    ops.silu_mul(gate, up, out);
    return {mem.read("out", out)};
  }
};

// ---- Embedding ---------------------------------------------------------------------------------

class EmbeddingCase : public RowCase {
 public:
  EmbeddingCase(int64_t T, int64_t V, int64_t H, DType ids_dt, bool strided, int world)
      : V_(V), H_(H), ids_dt_(ids_dt), world_(world) {
    T_ = T;
    strided_ = strided;
    RowInput ids;
    ids.dt = ids_dt;
    ids.index_hi = V;
    inputs_ = {ids};
  }
  std::string op() const override { return world_ > 1 ? "embedding_tp" : "embedding"; }
  std::string name() const override {
    return (world_ > 1 ? "embedding_tp" + S(world_) : std::string("embedding")) + "/T" + S(T_) +
           "_V" + S(V_) + "_H" + S(H_) + "_ids-" + dtype_name(ids_dt_) +
           (strided_ ? "/strided/" : "/contiguous/") + "bit-patterns";
  }
  std::vector<Relation> relations() const override {
    std::vector<Relation> rel = RowCase::relations();
    // Vocab-parallel: TP = 1, 2, 3, 4, 8 (ranks in order and reversed, combine also in place)
    // == the plain embedding; a partial holds -0.0 (0x8000) for ids outside its shard.
    for (int world : {1, 2, 3, 4, 8})
      for (bool reversed : {false, true})
        rel.push_back(
            {"TP=" + S(world) + (reversed ? " reversed" : "") + " == embedding",
             [this, world, reversed](Ops& ops, Mem& mem, const Outputs&, const Check& check) {
               const Outputs one = tensor_parallel(ops, mem, rows_, T_, false, 1, false);
               const Outputs tp = tensor_parallel(ops, mem, rows_, T_, false, world, reversed);
               for (const Output& o : tp) {
                 if (o.name == "out" || o.name == "out in place") {
                   for (int64_t t = 0; t < T_; ++t)
                     check(o.name + " row " + S(t),
                           compare_bits(o.row(t), one[0].row(t), H_, DType::kBF16));
                   continue;
                 }
                 const int r = std::stoi(o.name.substr(7));  // "partialR"
                 if (reversed || world == 1) continue;
                 const VocabShard sh = vocab_shard(V_, r, world);
                 for (int64_t t = 0; t < T_; ++t) {
                   const int64_t id = rows_[0].dtype() == DType::kI32 ? rows_[0].ptr<int32_t>()[t]
                                                                      : rows_[0].ptr<int64_t>()[t];
                   if (id >= sh.begin && id < sh.end) continue;
                   const std::vector<bf16> zeros(size_t(H_), bf16{0x8000});
                   check(o.name + " row " + S(t) + " is -0.0",
                         compare_bits(o.row(t), zeros.data(), H_, DType::kBF16));
                 }
               }
             }});
    return rel;
  }

 private:
  int64_t V_, H_;
  DType ids_dt_;
  int world_;
  Tensor table_;
  void build_shared(std::mt19937_64& g) override {
    // Random bit patterns: every bf16 value incl. NaNs (stored canonical), infs, subnormals, ±0.
    table_ = Tensor(DType::kBF16, {V_, H_});
    std::uniform_int_distribution<uint32_t> u(0, 0xffff);
    for (int64_t i = 0; i < table_.numel(); ++i) table_.ptr<bf16>()[i] = bf16{uint16_t(u(g))};
  }
  Outputs compute(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T,
                  bool strided) const override {
    return tensor_parallel(ops, mem, rows, T, strided, world_, false);
  }
  // world == 1: the plain op. Otherwise the partials of every rank (in rank order or reversed)
  // and their combine, then the combine again in place into partials[0].
  Outputs tensor_parallel(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T,
                          bool strided, int world, bool reversed) const {
    const int64_t pad = strided ? 5 : 0;
    const HostArg table = padded(table_, pad);
    const TensorView ids = mem.in(vector_arg(rows[0], strided ? 3 : 1));
    if (world == 1) {
      const TensorView out = mem.out(DType::kBF16, {T, H_}, pad);
      ops.embedding(ids, mem.in(table), out);
      return {mem.read("out", out)};
    }
    Outputs outs;
    std::vector<TensorView> partials;
    for (int r = 0; r < world; ++r) {
      const VocabShard sh = vocab_shard(V_, r, world);
      HostArg part = table;
      part.view.data = table.view.ptr<bf16>() + sh.begin * (H_ + pad);
      part.view.shape[0] = sh.size();
      const TensorView p = mem.out(DType::kBF16, {T, H_}, pad);
      ops.embedding_vocab_parallel(ids, mem.in(part), sh, V_, p);
      outs.push_back(mem.read("partial" + S(r), p));
      partials.push_back(p);
    }
    if (reversed) std::reverse(partials.begin(), partials.end());
    const TensorView out = mem.out(DType::kBF16, {T, H_});
    ops.embedding_combine(partials, out);
    outs.push_back(mem.read("out", out));
    ops.embedding_combine(partials, partials[0]);
    outs.push_back(mem.read("out in place", partials[0]));
    return outs;
  }
};

// ---- Linear log-prob and sampling
// ----------------------------------------------------------------

ContractConfig logprob_contract(int vocab_tile, int vocab_segments, int gemm_segments = 1) {
  ContractConfig c;
  c.vocab_tile = vocab_tile;
  c.vocab_segments = vocab_segments;
  c.gemm_segments = gemm_segments;
  return c;
}

class LogprobCase : public RowCase {
 public:
  // world > 1: vocab-parallel (partial per rank + combine); world must divide vocab_segments.
  LogprobCase(int64_t T, int64_t H, int64_t V, ContractConfig cfg, float temperature, DType tgt_dt,
              bool strided, DataKind kind, int world)
      : H_(H), V_(V), cfg_(cfg), kind_(kind), world_(world), tgt_dt_(tgt_dt) {
    T_ = T;
    strided_ = strided;
    params_.temperature = temperature;
    params_.ignore_index = -100;
    RowInput h;
    h.elems = H;
    h.kind = kind;
    RowInput t;
    t.dt = tgt_dt;
    t.index_hi = V;
    t.has_special_index = true;
    t.special_index = params_.ignore_index;
    inputs_ = {h, t};
  }
  std::string op() const override { return world_ > 1 ? "linear_logprob_tp" : "linear_logprob"; }
  // The vocab's edges as targets: row 0 -> V-1 (the last real entry before the padding), row 1 ->
  // 0; the other rows random, one in ten ignored.
  void build(uint64_t seed) override {
    RowCase::build(seed);
    const Tensor& tg = rows_[1];
    for (int64_t r = 0; r < std::min<int64_t>(T_, 2); ++r) {
      const int64_t v = r == 0 ? V_ - 1 : 0;
      if (tg.dtype() == DType::kI32)
        tg.ptr<int32_t>()[r] = int32_t(v);
      else
        tg.ptr<int64_t>()[r] = v;
    }
  }
  std::string name() const override {
    std::ostringstream os;
    os << (world_ > 1 ? "linear_logprob_tp" + S(world_) : std::string("linear_logprob")) << "/T"
       << T_ << "_H" << H_ << "_V" << V_ << "_tile" << cfg_.vocab_tile << "_seg"
       << cfg_.vocab_segments << "_gemmseg" << cfg_.gemm_segments << "_temp" << params_.temperature
       << "_targets-" << dtype_name(tgt_dt_) << (strided_ ? "/strided/" : "/contiguous/")
       << data_kind_name(kind_);
    return os.str();
  }
  bool quick() const override { return T_ * V_ * H_ <= (1 << 24); }
  std::vector<Relation> relations() const override {
    std::vector<Relation> rel = RowCase::relations();
    // Vocab-parallel: every degree R <= vocab_segments (partials + combine) == the op.
    for (int R = 1; R <= cfg_.vocab_segments; R *= 2)
      rel.push_back({"TP=" + S(R) + " partials + combine == linear_logprob",
                     [this, R](Ops& ops, Mem& mem, const Outputs&, const Check& check) {
                       const Outputs one = single(ops, mem, rows_, T_, strided_);
                       const Outputs tp = vocab_parallel(ops, mem, rows_, T_, strided_, R);
                       for (size_t i = 0; i < one.size(); ++i) {
                         const Output& got = tp[tp.size() - one.size() + i];
                         for (int64_t t = 0; t < T_; ++t)
                           check(got.name + " R=" + S(R) + " row " + S(t),
                                 compare_bits(got.row(t), one[i].row(t), 1, DType::kF32));
                       }
                     }});
    return rel;
  }

 private:
  int64_t H_, V_;
  ContractConfig cfg_;
  DataKind kind_;
  int world_;
  DType tgt_dt_;
  LogprobParams params_;
  Tensor w_;
  void build_shared(std::mt19937_64& g) override {
    w_ = Tensor(DType::kBF16, {V_, H_});
    fill_bf16(w_.ptr<bf16>(), w_.numel(), kind_ == DataKind::kSpecials ? DataKind::kNormal : kind_,
              g, 0.5f);
  }
  Outputs single(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T,
                 bool strided) const {
    const int64_t pad = strided ? 3 : 0;
    const TensorView h = mem.in(padded(rows[0], pad)), w = mem.in(padded(w_, pad));
    const TensorView tg = mem.in(vector_arg(rows[1], strided ? 2 : 1));
    const int64_t step = strided ? 2 : 1;
    const TensorView logp = mem.out(DType::kF32, {T, step}), lse = mem.out(DType::kF32, {T, step}),
                     ent = mem.out(DType::kF32, {T, step});
    auto col = [&](TensorView v) {
      v.ndim = 1;
      v.stride[0] = step;
      return v;
    };
    ops.linear_logprob(h, w, tg, params_, cfg_, col(logp), col(lse), col(ent));
    return {mem.read("logp", col(logp)), mem.read("lse", col(lse)), mem.read("entropy", col(ent))};
  }
  Outputs compute(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T,
                  bool strided) const override {
    if (world_ == 1) return single(ops, mem, rows, T, strided);
    return vocab_parallel(ops, mem, rows, T, strided, world_);
  }
  Outputs vocab_parallel(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T,
                         bool strided, int world) const {
    const int64_t pad = strided ? 3 : 0;
    const LogprobVocabLayout lay = logprob_vocab_layout(cfg_, V_);
    const int per = cfg_.vocab_segments / world;
    const TensorView h = mem.in(padded(rows[0], pad));
    const TensorView tg = mem.in(vector_arg(rows[1], 1));
    const HostArg wa = padded(w_, pad);
    const TensorView states = mem.out(DType::kF32, {world, T, 4});
    for (int r = 0; r < world; ++r) {
      LogprobShard sh;
      sh.vocab_size = V_;
      sh.seg_begin = r * per;
      sh.seg_count = per;
      const int64_t v0 = std::min(V_, sh.seg_begin * lay.segment_len);
      const int64_t v1 = std::min(V_, (sh.seg_begin + per) * lay.segment_len);
      HostArg ws = wa;
      ws.view.data = wa.view.ptr<bf16>() + v0 * (H_ + pad);
      ws.view.shape[0] = v1 - v0;
      TensorView st = TensorView::contiguous(states.ptr<float>() + r * T * 4, DType::kF32, {T, 4},
                                             states.device);
      ops.linear_logprob_partial(h, mem.in(ws), tg, params_, cfg_, sh, st);
    }
    const TensorView logp = mem.out(DType::kF32, {T}), lse = mem.out(DType::kF32, {T}),
                     ent = mem.out(DType::kF32, {T});
    ops.linear_logprob_combine(states, tg, params_, cfg_, V_, logp, lse, ent);
    return {not_by_row(mem.read("states", states)), mem.read("logp", logp), mem.read("lse", lse),
            mem.read("entropy", ent)};
  }
};

class SampleCase : public RowCase {
 public:
  // dup_rows: every other w row repeats the one before it (exactly tied logits).
  SampleCase(int64_t T, int64_t H, int64_t V, SamplingParams p, bool dup_rows, DataKind kind,
             std::string label)
      : H_(H), V_(V), p_(p), dup_(dup_rows), kind_(kind), label_(std::move(label)) {
    T_ = T;
    RowInput h;
    h.elems = H;
    h.kind = kind;
    RowInput req;
    req.dt = DType::kI64;
    req.index_hi = int64_t(1) << 40;
    RowInput pos;
    pos.dt = DType::kI32;
    pos.index_hi = 1 << 20;
    inputs_ = {h, req, pos};
  }
  std::string op() const override { return "sample"; }
  std::string name() const override {
    return "sample/T" + S(T_) + "_H" + S(H_) + "_V" + S(V_) + "_" + label_ +
           (dup_ ? "/tied-rows/" : "/contiguous/") + data_kind_name(kind_);
  }

 private:
  int64_t H_, V_;
  SamplingParams p_;
  bool dup_;
  DataKind kind_;
  std::string label_;
  Tensor w_;
  void build_shared(std::mt19937_64& g) override {
    w_ = Tensor(DType::kBF16, {V_, H_});
    fill_bf16(w_.ptr<bf16>(), w_.numel(), kind_, g, 0.5f);
    if (dup_)
      for (int64_t v = 1; v < V_; v += 2)
        std::memcpy(w_.ptr<bf16>() + v * H_, w_.ptr<bf16>() + (v - 1) * H_, size_t(H_) * 2);
  }
  Outputs compute(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T,
                  bool strided) const override {
    const TensorView h = mem.in(padded(rows[0], 0)), w = mem.in(padded(w_, 0));
    // request ids and positions stay host views (every backend checks them on the host).
    const HostArg reqa = vector_arg(rows[1], 1), posa = vector_arg(rows[2], 1);
    const std::vector<SamplingParams> params(size_t(T), p_);
    const TensorView ids = mem.out(DType::kI64, {T}), logp = mem.out(DType::kF32, {T}),
                     lse = mem.out(DType::kF32, {T}), ent = mem.out(DType::kF32, {T});
    ops.sample(h, w, params, mem.host(reqa), mem.host(posa), ContractConfig{}, ids, logp, lse, ent);
    return {mem.read("token_ids", ids), mem.read("logp", logp), mem.read("lse", lse),
            mem.read("entropy", ent)};
  }
};

// ---- Attention
// -----------------------------------------------------------------------------------

struct AttnDims {
  int64_t Hq, Hkv, D;
};

enum class AttnMode { kPrefill, kDecode, kChunked, kSplitKv, kCascade, kChunkStates, kKvWrite };
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
                           check(got.name + " row " + S(int64_t(r)),
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
                           check(one[o].name + " sequence " + S(int64_t(b)),
                                 compare_bits(one[o].row(0), base[o].row(t0), n * one[o].row_elems,
                                              one[o].dtype));
                       }
                     }});
    if (mode_ == AttnMode::kDecode || mode_ == AttnMode::kChunked)
      for (int64_t P : {int64_t(1), int64_t(16), int64_t(37)})
        if (P != page_)
          rel.push_back({"page size " + S(P),
                         [this, P](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                           const Outputs got = run_mode(ops, mem, mode_, P, 1);
                           for (size_t o = 0; o < got.size(); ++o)
                             check(got[o].name, compare_outputs(got[o], base[o]));
                         }});
    if (mode_ == AttnMode::kSplitKv)
      for (int n : {1, 2, 3, 5, 7, 10, 100})
        if (n != splits_)
          rel.push_back({"splits " + S(n),
                         [this, n](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                           const Outputs got = run_mode(ops, mem, mode_, page_, n);
                           for (size_t o = 0; o < got.size(); ++o)
                             check(got[o].name, compare_outputs(got[o], base[o]));
                         }});
    rel.push_back({"thread counts 1 and 3",
                   [this](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                     const int saved = num_threads();
                     for (int n : {1, 3}) {
                       set_num_threads(n);
                       const Outputs got = run_mode(ops, mem, mode_, page_, splits_);
                       for (size_t o = 0; o < got.size(); ++o)
                         check(got[o].name + " threads=" + S(n), compare_outputs(got[o], base[o]));
                     }
                     set_num_threads(saved);
                   }});
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

// ---- The table ---------------------------------------------------------------------------------

template <typename C, typename... A>
void add(std::vector<std::unique_ptr<OpCase>>& t, A&&... a) {
  t.push_back(std::make_unique<C>(std::forward<A>(a)...));
}

}  // namespace

std::vector<std::unique_ptr<OpCase>> op_cases() {
  std::vector<std::unique_ptr<OpCase>> t;
  using DK = DataKind;
  const DType bf = DType::kBF16, f32 = DType::kF32;

  // GEMM: public entry, every segment count, bias kinds, both outputs, odd sizes, data kinds.
  for (int S : {1, 2, 4, 8}) {
    add<GemmCase>(t, GemmShape{17, 111, 989, S, Bias::kNone, bf, false, DK::kNormal});
    add<GemmCase>(t, GemmShape{3, 64, 257, S, Bias::kF32, f32, true, DK::kNormal});
  }
  add<GemmCase>(t, GemmShape{1, 1, 1, 1, Bias::kBF16, bf, false, DK::kNormal});
  add<GemmCase>(t, GemmShape{111, 17, 3, 2, Bias::kBF16, f32, true, DK::kNormal});
  add<GemmCase>(t, GemmShape{64, 256, 512, 1, Bias::kNone, bf, false, DK::kNormal});
  add<GemmCase>(t, GemmShape{130, 136, 1000, 4, Bias::kF32, bf, true, DK::kNormal});
  add<GemmCase>(t, GemmShape{17, 64, 512, 2, Bias::kBF16, f32, true, DK::kNormal});
  for (DK k : {DK::kLarge, DK::kSmall, DK::kSpecials}) {
    add<GemmCase>(t, GemmShape{17, 40, 300, 2, Bias::kNone, f32, false, k});
    add<GemmCase>(t, GemmShape{3, 33, 111, 1, Bias::kBF16, bf, true, k});
  }
  // Shapes of the row / thread / rerun / stride checks (were tests in test_gemm.cc).
  for (int S : {1, 4})
    for (int64_t K : {64, 333})
      add<GemmCase>(t, GemmShape{17, 111, K, S, Bias::kNone, bf, false, DK::kNormal});
  add<GemmCase>(t, GemmShape{17, 33, 100, 2, Bias::kNone, bf, true, DK::kNormal});
  for (int64_t M : {1, 67})
    add<GemmCase>(t, GemmShape{M, 1029, 300, 4, Bias::kNone, f32, false, DK::kNormal});
  add<GemmCase>(t, GemmShape{40, 70, 200, 8, Bias::kF32, bf, false, DK::kNormal});
  // Every TP degree t <= S (a relation of every GEMM case): the decode (M = 1) and packed (13)
  // kernels, K with padding-only ranks (37), both outputs.
  for (int S : {1, 2, 4, 8})
    for (int64_t K : {128, 200, 1000, 37})
      for (int64_t M : {1, 13})
        for (DType out : {bf, f32})
          add<GemmCase>(t, GemmShape{M, 45, K, S, Bias::kBF16, out, false, DK::kNormal});
  // GEMM row-parallel TP entry points (partial per rank + tree combine) as cases of their own.
  for (int tp : {2, 4, 8})
    add<GemmCase>(t, GemmShape{17, 111, 989, 8, Bias::kF32, bf, false, DK::kNormal}, tp);
  add<GemmCase>(t, GemmShape{3, 64, 100, 4, Bias::kNone, f32, true, DK::kNormal}, 2);
  add<GemmCase>(t, GemmShape{5, 19, 17, 8, Bias::kBF16, bf, false, DK::kNormal}, 4);

  // RMSNorm (+ residual): odd widths, magnitudes from subnormal squares to overflow, specials.
  for (int64_t H : {1, 3, 17, 111, 128, 989, 4096}) {
    add<RmsNormCase>(t, 17, H, false, H % 2 == 1, DK::kNormal);
    add<RmsNormCase>(t, 3, H, true, H % 2 == 0, DK::kNormal);
  }
  for (DK k : {DK::kLarge, DK::kSmall, DK::kSpecials}) {
    add<RmsNormCase>(t, 17, 136, false, false, k);
    add<RmsNormCase>(t, 17, 136, true, true, k);
  }
  for (int64_t H : {64, 136, 1000}) {
    add<RmsNormCase>(t, 17, H, false, false, DK::kNormal);
    add<RmsNormCase>(t, 17, H, true, false, DK::kNormal);
  }
  add<RmsNormCase>(t, 300, 1000, true, false, DK::kNormal);
  add<RmsNormCase>(t, 5, 64, false, true, DK::kNormal, 1e-20f);
  add<RmsNormCase>(t, 5, 64, true, false, DK::kNormal, 1e19f);

  // RoPE: head dims 2 .. 128, i32 / i64 positions, q inside a fused qkv buffer.
  add<RopeCase>(t, 111, 8, 128, DType::kI64, false, DK::kNormal);
  add<RopeCase>(t, 17, 3, 2, DType::kI32, true, DK::kNormal);
  add<RopeCase>(t, 17, 5, 6, DType::kI32, false, DK::kNormal);
  add<RopeCase>(t, 3, 16, 64, DType::kI64, true, DK::kNormal);
  add<RopeCase>(t, 17, 4, 128, DType::kI64, false, DK::kNormal);
  add<RopeCase>(t, 257, 8, 128, DType::kI64, false, DK::kNormal);
  add<RopeCase>(t, 17, 4, 128, DType::kI32, true, DK::kSpecials);
  add<RopeCase>(t, 17, 4, 128, DType::kI64, false, DK::kLarge);

  // SiLU-and-mul: fused gate_up halves and separate strided views, odd widths, specials.
  for (int64_t I : {1, 3, 17, 111, 989, 3072}) add<SiluCase>(t, 17, I, I % 2 == 1, DK::kNormal);
  add<SiluCase>(t, 17, 136, true, DK::kNormal);
  add<SiluCase>(t, 300, 1000, true, DK::kNormal);
  for (DK k : {DK::kLarge, DK::kSmall, DK::kSpecials})
    add<SiluCase>(t, 17, 136, k != DK::kSmall, k);

  // Embedding (+ vocab-parallel partials and combine, TP = 2, 3, 4, 8).
  add<EmbeddingCase>(t, 111, 1000, 136, DType::kI32, true, 1);
  add<EmbeddingCase>(t, 17, 989, 17, DType::kI64, false, 1);
  add<EmbeddingCase>(t, 1, 3, 1, DType::kI64, false, 1);
  add<EmbeddingCase>(t, 500, 1000, 64, DType::kI64, false, 1);
  for (int64_t H : {3, 64, 136}) add<EmbeddingCase>(t, 257, 1000, H, DType::kI64, false, 1);
  for (int w : {2, 3, 4, 8}) add<EmbeddingCase>(t, 37, 1000, 136, DType::kI64, w % 2 == 1, w);

  // Linear log-prob (+ vocab-parallel partial / combine).
  add<LogprobCase>(t, 17, 64, 989, logprob_contract(256, 1), 1.0f, DType::kI64, false, DK::kNormal,
                   1);
  add<LogprobCase>(t, 3, 136, 1000, logprob_contract(128, 4), 0.7f, DType::kI32, true, DK::kNormal,
                   1);
  add<LogprobCase>(t, 111, 32, 3001, logprob_contract(256, 8), 1.3f, DType::kI64, false,
                   DK::kNormal, 1);
  add<LogprobCase>(t, 17, 64, 500, logprob_contract(64, 2), 1.0f, DType::kI64, true, DK::kSpecials,
                   1);
  add<LogprobCase>(t, 17, 64, 500, logprob_contract(64, 2), 0.5f, DType::kI32, false, DK::kLarge,
                   1);
  // Shapes of the token / TP / thread / rerun checks (were tests in test_logprob.cc).
  for (ContractConfig c : {logprob_contract(64, 1), logprob_contract(32, 2, 2)})
    add<LogprobCase>(t, 17, 40, 300, c, 0.8f, DType::kI64, false, DK::kNormal, 1);
  for (int S : {1, 2, 4, 8})
    add<LogprobCase>(t, 13, 32, 700, logprob_contract(64, S), 1.3f, DType::kI64, false, DK::kNormal,
                     1);
  for (int64_t T : {1, 40})
    add<LogprobCase>(t, T, 32, 777, logprob_contract(32, 2, 2), 0.9f, DType::kI64, false,
                     DK::kNormal, 1);
  add<LogprobCase>(t, 33, 48, 513, logprob_contract(128, 4, 2), 0.6f, DType::kI64, false,
                   DK::kNormal, 1);
  for (int w : {2, 4, 8})
    add<LogprobCase>(t, 17, 64, 3001, logprob_contract(128, 8), 0.9f, DType::kI64, false,
                     DK::kNormal, w);

  // Sampling: plain, filters, greedy; exactly tied logits (ties go to the lowest index).
  {
    SamplingParams plain;
    plain.seed = 7;
    plain.temperature = 0.8f;
    add<SampleCase>(t, 17, 64, 989, plain, false, DK::kNormal, "temp0.8");
    SamplingParams filt = plain;
    filt.top_k = 50;
    filt.top_p = 0.9f;
    filt.min_p = 0.05f;
    add<SampleCase>(t, 17, 64, 1000, filt, false, DK::kNormal, "topk50_topp0.9_minp0.05");
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    add<SampleCase>(t, 17, 64, 1000, greedy, true, DK::kTies, "greedy");
    add<SampleCase>(t, 3, 64, 111, plain, true, DK::kTies, "temp0.8");
    SamplingParams k1 = plain;
    k1.top_k = 1;
    add<SampleCase>(t, 17, 32, 300, k1, true, DK::kTies, "topk1");
  }

  // Attention: every mode, GQA ratios, head dims, kv_chunk 64 / 128 / 1024, page sizes.
  const std::vector<int64_t> lens = {1, 3, 17, 111, 65, 130};
  const AttnDims d64{8, 4, 64}, d128{4, 2, 128}, d32{8, 4, 32};
  for (AttnMode m : {AttnMode::kPrefill, AttnMode::kDecode, AttnMode::kChunked,
                     AttnMode::kChunkStates, AttnMode::kKvWrite}) {
    add<AttentionCase>(t, m, d64, 64, 0.0, lens, 16);
    add<AttentionCase>(t, m, d128, 128, 0.0, lens, 37);
  }
  add<AttentionCase>(t, AttnMode::kPrefill, d32, 64, 0.3, lens, 16);
  // GQA ratio 4 (the shapes of the former CPU test ThreadCountDeterminismAndPoison): threads,
  // rerun, poison, decode rows == prefill; one long row alone (its chunks split over threads).
  const AttnDims d82{8, 2, 64};
  add<AttentionCase>(t, AttnMode::kPrefill, d82, 64, 0.0, std::vector<int64_t>{333, 17, 3}, 64);
  add<AttentionCase>(t, AttnMode::kDecode, d82, 64, 0.0, std::vector<int64_t>{333, 17, 3}, 64);
  add<AttentionCase>(t, AttnMode::kDecode, d82, 64, 0.0, std::vector<int64_t>{333}, 64);
  add<AttentionCase>(t, AttnMode::kPrefill, AttnDims{2, 1, 512}, 64, 0.0,
                     std::vector<int64_t>{1, 17, 65}, 16);
  add<AttentionCase>(t, AttnMode::kPrefill, AttnDims{12, 4, 80}, 64, 0.0, lens, 16);
  add<AttentionCase>(t, AttnMode::kDecode, d64, 1024, 0.0, std::vector<int64_t>{1100, 17}, 64);
  add<AttentionCase>(t, AttnMode::kPrefill, d64, 64, 0.0, lens, 16, 1, 1, 0, DK::kSpecials);
  add<AttentionCase>(t, AttnMode::kDecode, d64, 64, 0.0, lens, 1, 1, 1, 0, DK::kLarge);
  for (int splits : {2, 3, 7})
    add<AttentionCase>(t, AttnMode::kSplitKv, d64, 64, 0.0, std::vector<int64_t>{300, 17, 129, 1},
                       16, splits);
  add<AttentionCase>(t, AttnMode::kSplitKv, d64, 256, 0.0, std::vector<int64_t>{1100, 700}, 64, 3);
  // Cascade: groups of 3 sharing 130 (not a multiple of kv_chunk) and 128 (a multiple) tokens.
  add<AttentionCase>(t, AttnMode::kCascade, d64, 64, 0.0,
                     std::vector<int64_t>{200, 131, 300, 150, 129, 140}, 16, 1, 3, 130);
  add<AttentionCase>(t, AttnMode::kCascade, d128, 128, 0.0,
                     std::vector<int64_t>{128, 300, 257, 200}, 37, 1, 2, 128);
  return t;
}

}  // namespace lockstep::cases
