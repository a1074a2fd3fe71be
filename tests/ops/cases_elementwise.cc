// Op-case table, elementwise ops: RMSNorm (+ residual), RoPE, SiLU-and-mul, embedding (+ the
// vocab-parallel partials and combine); relations: rows, threads, layout, vocab-parallel degrees.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <sstream>

#include "core/thread_pool.h"
#include "lockstep/error.h"
#include "ops/cases.h"
#include "ops/row_case.h"

namespace lockstep::cases {
namespace {

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
    return "rope/T" + num(T_) + "_heads" + num(heads_) + "_D" + num(D_) + "_pos-" +
           dtype_name(pos_dt_) + (strided_ ? "/inside-qkv/" : "/contiguous/") +
           data_kind_name(kind_);
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
    return "silu_mul/T" + num(T_) + "_I" + num(I_) + (strided_ ? "/fused-gate-up/" : "/separate/") +
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
    return (world_ > 1 ? "embedding_tp" + num(world_) : std::string("embedding")) + "/T" + num(T_) +
           "_V" + num(V_) + "_H" + num(H_) + "_ids-" + dtype_name(ids_dt_) +
           (strided_ ? "/strided/" : "/contiguous/") + "bit-patterns";
  }
  std::vector<Relation> relations() const override {
    std::vector<Relation> rel = RowCase::relations();
    // Vocab-parallel: TP = 1, 2, 3, 4, 8 (ranks in order and reversed, combine also in place)
    // == the plain embedding; a partial holds -0.0 (0x8000) for ids outside its shard.
    for (int world : {1, 2, 3, 4, 8})
      for (bool reversed : {false, true})
        rel.push_back(
            {"TP=" + num(world) + (reversed ? " reversed" : "") + " == embedding",
             [this, world, reversed](Ops& ops, Mem& mem, const Outputs&, const Check& check) {
               const Outputs one = tensor_parallel(ops, mem, rows_, T_, false, 1, false);
               const Outputs tp = tensor_parallel(ops, mem, rows_, T_, false, world, reversed);
               for (const Output& o : tp) {
                 if (o.name == "out" || o.name == "out in place") {
                   for (int64_t t = 0; t < T_; ++t)
                     check(o.name + " row " + num(t),
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
                   check(o.name + " row " + num(t) + " is -0.0",
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
      outs.push_back(mem.read("partial" + num(r), p));
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

}  // namespace

std::unique_ptr<OpCase> rmsnorm_case(int64_t T, int64_t H, bool residual, bool strided,
                                     DataKind kind, float scale) {
  return std::make_unique<RmsNormCase>(T, H, residual, strided, kind, scale);
}
std::unique_ptr<OpCase> rope_case(int64_t T, int64_t heads, int64_t D, DType pos_dt, bool qkv,
                                  DataKind kind) {
  return std::make_unique<RopeCase>(T, heads, D, pos_dt, qkv, kind);
}
std::unique_ptr<OpCase> silu_case(int64_t T, int64_t I, bool fused, DataKind kind) {
  return std::make_unique<SiluCase>(T, I, fused, kind);
}
std::unique_ptr<OpCase> embedding_case(int64_t T, int64_t V, int64_t H, DType ids_dt, bool strided,
                                       int world) {
  return std::make_unique<EmbeddingCase>(T, V, H, ids_dt, strided, world);
}

}  // namespace lockstep::cases
